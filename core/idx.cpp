#include "dyngrad/core/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string_view>

#include "dyngrad/core/error.h"
#include "dyngrad/core/shape.h"

namespace dyngrad {

namespace {

constexpr std::uint32_t kUnsignedByte = 0x08;
// Far above any MNIST-format file (Fashion-MNIST's training images hold 47 MB); keeps a corrupt header
// from asking for an absurd allocation before the payload check could catch it.
constexpr std::int64_t kMaxPayloadBytes = std::int64_t{1} << 32;
// gzread takes an unsigned count and returns an int: read in pieces far below INT_MAX.
constexpr std::size_t kReadChunk = std::size_t{1} << 26;
// The payload buffer's first size; it doubles from there as the data comes in.
constexpr std::size_t kFirstChunk = std::size_t{1} << 20;

std::string hex(std::uint32_t value, int digits) {
    std::ostringstream out;
    out << "0x" << std::hex << std::setw(digits) << std::setfill('0') << value;
    return out.str();
}

std::uint32_t big_endian32(const std::uint8_t* bytes) {
    return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) | (std::uint32_t{bytes[2]} << 8) |
           std::uint32_t{bytes[3]};
}

struct GzClose {
    void operator()(gzFile file) const noexcept { gzclose(file); }
};

// A file read through zlib; every failure is an IoError naming the file.
class GzReader {
public:
    explicit GzReader(const std::string& path) : path_(path) {
        errno = 0;
        file_.reset(gzopen(path.c_str(), "rb"));
        if (!file_) fail(str("cannot open: ", errno != 0 ? std::strerror(errno) : "out of memory"));
    }

    // Reads up to `bytes`; fewer only at the end of the data. A corrupt gzip stream throws.
    std::size_t read(void* dst, std::size_t bytes) {
        std::size_t total = 0;
        while (total < bytes) {
            const auto want = static_cast<unsigned>(std::min(bytes - total, kReadChunk));
            const int got = gzread(file_.get(), static_cast<char*>(dst) + total, want);
            if (got < 0) fail(str("read failed: ", stream_error()));
            if (got == 0) break;
            total += static_cast<std::size_t>(got);
        }
        return total;
    }

    // Why the stream stopped early, when zlib knows ("unexpected end of file" for a cut gzip file).
    std::string stream_error() const {
        int code = Z_OK;
        std::string_view message = gzerror(file_.get(), &code);
        if (code == Z_OK) return {};
        if (code == Z_ERRNO) return std::strerror(errno);
        // zlib prefixes the path, which our message already names.
        if (message.starts_with(path_ + ": ")) message.remove_prefix(path_.size() + 2);
        return str(code == Z_DATA_ERROR ? "corrupt gzip data: " : "", message);
    }

    // Fails for data that ends early, with zlib's reason when it has one (a cut gzip stream).
    [[noreturn]] void fail_truncated(const std::string& problem) const {
        const std::string why = stream_error();
        fail(why.empty() ? problem : str(problem, " (", why, ")"));
    }

    [[noreturn]] void fail(const std::string& problem) const {
        throw IoError(str("IDX file '", path_, "': ", problem));
    }

private:
    std::string path_;
    std::unique_ptr<gzFile_s, GzClose> file_;
};

// What is wrong with a magic number that is not the expected one.
std::string magic_problem(std::uint32_t magic, int rank) {
    const std::string found = str("magic ", hex(magic, 8), ", expected ", hex((kUnsignedByte << 8) | unsigned(rank), 8));
    if ((magic >> 16) != 0) return str(found, ": not an IDX file");
    if (((magic >> 8) & 0xff) != kUnsignedByte)
        return str(found, ": element type ", hex((magic >> 8) & 0xff, 2), ", only unsigned byte (0x08) is read");
    return str(found, ": rank ", magic & 0xff, " instead of ", rank);
}

}  // namespace

IdxArray read_idx(const std::string& path, int rank) {
    // The header stores the rank in one byte: any other value is a caller's mistake, not the file's.
    if (rank < 1 || rank > 255)
        throw ValueError(str("read_idx('", path, "'): rank ", rank, " is outside 1 to 255 (one header byte)"));
    GzReader in(path);
    std::array<std::uint8_t, 4> word{};
    if (const std::size_t got = in.read(word.data(), word.size()); got < word.size())
        in.fail_truncated(str("truncated header: ", got, " of the 4 magic bytes"));
    const std::uint32_t magic = big_endian32(word.data());
    if (magic != ((kUnsignedByte << 8) | unsigned(rank))) in.fail(magic_problem(magic, rank));

    IdxArray array;
    std::int64_t payload = 1;
    for (int axis = 0; axis < rank; ++axis) {
        if (in.read(word.data(), word.size()) < word.size())
            in.fail_truncated(str("truncated header: the file ends inside dimension ", axis, " of ", rank));
        const std::int64_t dim = big_endian32(word.data());
        if (dim == 0) in.fail(str("dimension ", axis, " is 0"));
        array.dims.push_back(dim);
        if (dim > kMaxPayloadBytes / payload)  // checked before multiplying, so it cannot overflow
            in.fail(str("dims ", to_string(array.dims), "... announce more than ", kMaxPayloadBytes, " bytes"));
        payload *= dim;
    }

    // The buffer grows with the bytes actually read (doubling), so a corrupt 16-byte header announcing
    // gigabytes fails as truncated instead of allocating what the file does not hold.
    const auto wanted = static_cast<std::size_t>(payload);
    std::size_t got = 0;
    while (got < wanted) {
        array.data.resize(std::min(wanted, std::max(2 * got, kFirstChunk)));
        const std::size_t asked = array.data.size() - got;
        const std::size_t read = in.read(array.data.data() + got, asked);
        got += read;
        if (read < asked)
            in.fail_truncated(str("truncated payload: dims ", to_string(array.dims), " announce ", payload,
                                  " bytes, the file holds ", got));
    }
    std::array<std::uint8_t, 4096> rest{};
    std::size_t trailing = 0;
    while (const std::size_t got = in.read(rest.data(), rest.size())) trailing += got;
    if (trailing > 0)
        in.fail(str(trailing, " unexpected bytes after the payload of dims ", to_string(array.dims)));
    return array;
}

}  // namespace dyngrad
