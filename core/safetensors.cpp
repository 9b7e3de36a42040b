// The safetensors format (core/safetensors.h): a writer, and a reader that validates every byte of the
// header with a strict parser for exactly the JSON subset the format uses.
#include "dyngrad/core/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <fstream>
#include <limits>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "dyngrad/core/checked.h"
#include "dyngrad/core/error.h"

namespace dyngrad {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr std::string_view kMetadataKey = "__metadata__";

std::string_view format_name(DType dtype) {
    switch (dtype) {
        case DType::f32: return "F32";
        case DType::f64: return "F64";
        case DType::i64: return "I64";
        case DType::bf16: return "BF16";
        case DType::f16: return "F16";
    }
    throw DTypeError(str("safetensors: no format name for dtype ", static_cast<int>(dtype)));
}

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view text) {
    std::size_t i = 0;
    while (i < text.size()) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c < 0x80) {
            ++i;
            continue;
        }
        // Lead byte: the number of continuation bytes and the code point's top bits.
        std::size_t extra = 0;
        std::uint32_t code = 0;
        if ((c & 0xE0) == 0xC0) {
            extra = 1;
            code = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            extra = 2;
            code = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            extra = 3;
            code = c & 0x07;
        } else {
            return false;
        }
        if (i + extra >= text.size()) return false;
        for (std::size_t k = 1; k <= extra; ++k) {
            const auto next = static_cast<unsigned char>(text[i + k]);
            if ((next & 0xC0) != 0x80) return false;
            code = (code << 6) | (next & 0x3F);
        }
        constexpr std::array<std::uint32_t, 4> kMinimum = {0, 0x80, 0x800, 0x10000};
        if (code < kMinimum[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
        i += extra + 1;
    }
    return true;
}

void append_json_string(std::string& out, std::string_view text) {
    out += '"';
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += ch;
        } else if (c < 0x20) {
            constexpr char kHex[] = "0123456789abcdef";
            out += "\\u00";
            out += kHex[c >> 4];
            out += kHex[c & 0xF];
        } else {
            out += ch;
        }
    }
    out += '"';
}

struct Entry {
    std::string name;
    std::string dtype;
    Shape shape;
    std::int64_t begin = 0;
    std::int64_t end = 0;
};

struct Header {
    std::vector<Entry> entries;
    SafetensorsMetadata metadata;
};

// Parses the header: one object of tensor entries {"dtype": string, "shape": [uint...], "data_offsets":
// [uint, uint]} and an optional "__metadata__" object of strings. Nothing else is accepted: no other
// value types, no unknown or repeated keys, no signs, fractions or exponents, no trailing bytes but
// whitespace (the format pads with spaces).
class HeaderParser {
public:
    HeaderParser(std::string_view text, std::string context) : text_(text), context_(std::move(context)) {}

    Header parse() {
        Header header;
        std::set<std::string> keys;
        expect('{');
        if (!consume('}')) {
            do {
                std::string key = string();
                if (!keys.insert(key).second) fail(str("key '", key, "' appears twice"));
                expect(':');
                if (key == kMetadataKey) header.metadata = metadata();
                else header.entries.push_back(entry(std::move(key)));
            } while (consume(','));
            expect('}');
        }
        skip_whitespace();
        if (pos_ != text_.size()) fail("unexpected bytes after the header object");
        return header;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw IoError(str(context_, "header JSON: ", what, " at byte ", pos_));
    }

    void skip_whitespace() {
        while (pos_ < text_.size() &&
               (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
            ++pos_;
    }
    // Skips whitespace, then takes `c` if it comes next.
    bool consume(char c) {
        skip_whitespace();
        if (pos_ < text_.size() && text_[pos_] == c) {
            ++pos_;
            return true;
        }
        return false;
    }
    void expect(char c) {
        if (!consume(c)) fail(pos_ < text_.size() ? str("expected '", c, "'") : str("expected '", c, "', found the end"));
    }

    std::string string() {
        expect('"');
        std::string out;
        while (true) {
            if (pos_ >= text_.size()) fail("unterminated string");
            const char c = text_[pos_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (pos_ >= text_.size()) fail("unterminated escape");
            switch (const char e = text_[pos_++]) {
                case '"': case '\\': case '/': out += e; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': append_utf8(out, code_point()); break;
                default: fail(str("invalid escape '\\", e, "'"));
            }
        }
    }

    std::uint32_t hex4() {
        if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
        std::uint32_t value = 0;
        for (int k = 0; k < 4; ++k) {
            const char h = text_[pos_++];
            value <<= 4;
            if (h >= '0' && h <= '9') value |= static_cast<std::uint32_t>(h - '0');
            else if (h >= 'a' && h <= 'f') value |= static_cast<std::uint32_t>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') value |= static_cast<std::uint32_t>(h - 'A' + 10);
            else fail("invalid hex digit in a \\u escape");
        }
        return value;
    }
    // After "\u": one code point, joining a UTF-16 surrogate pair.
    std::uint32_t code_point() {
        const std::uint32_t high = hex4();
        if (high >= 0xDC00 && high <= 0xDFFF) fail("unpaired low surrogate");
        if (high < 0xD800 || high > 0xDBFF) return high;
        if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') fail("unpaired high surrogate");
        pos_ += 2;
        const std::uint32_t low = hex4();
        if (low < 0xDC00 || low > 0xDFFF) fail("unpaired high surrogate");
        return 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
    }
    static void append_utf8(std::string& out, std::uint32_t code) {
        if (code < 0x80) {
            out += static_cast<char>(code);
        } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
        } else if (code < 0x10000) {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (code >> 18));
            out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
        }
    }

    // A non-negative integer that fits in int64, without sign, fraction, exponent or leading zeros.
    std::int64_t integer() {
        skip_whitespace();
        const std::size_t start = pos_;
        std::int64_t value = 0;
        while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
            const int digit = text_[pos_] - '0';
            if (value > (std::numeric_limits<std::int64_t>::max() - digit) / 10) fail("integer out of range");
            value = value * 10 + digit;
            ++pos_;
        }
        if (pos_ == start) fail("expected a non-negative integer");
        if (text_[start] == '0' && pos_ - start > 1) fail("integer with a leading zero");
        if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
            fail("expected an integer, found a fraction or exponent");
        return value;
    }

    std::vector<std::int64_t> integers() {
        std::vector<std::int64_t> out;
        expect('[');
        if (consume(']')) return out;
        do out.push_back(integer());
        while (consume(','));
        expect(']');
        return out;
    }

    Entry entry(std::string name) {
        Entry e;
        e.name = std::move(name);
        bool has_dtype = false, has_shape = false, has_offsets = false;
        const auto once = [&](bool& seen, const std::string& key) {
            if (seen) fail(str("tensor '", e.name, "': key '", key, "' appears twice"));
            seen = true;
        };
        expect('{');
        if (!consume('}')) {
            do {
                const std::string key = string();
                expect(':');
                if (key == "dtype") {
                    once(has_dtype, key);
                    e.dtype = string();
                } else if (key == "shape") {
                    once(has_shape, key);
                    e.shape = integers();
                } else if (key == "data_offsets") {
                    once(has_offsets, key);
                    const std::vector<std::int64_t> offsets = integers();
                    if (offsets.size() != 2) fail(str("tensor '", e.name, "': data_offsets needs 2 integers"));
                    e.begin = offsets[0];
                    e.end = offsets[1];
                } else {
                    fail(str("tensor '", e.name, "': unknown key '", key, "'"));
                }
            } while (consume(','));
            expect('}');
        }
        if (!has_dtype || !has_shape || !has_offsets)
            fail(str("tensor '", e.name, "' lacks ", !has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets"));
        return e;
    }

    SafetensorsMetadata metadata() {
        SafetensorsMetadata out;
        expect('{');
        if (consume('}')) return out;
        do {
            std::string key = string();
            expect(':');
            if (!out.emplace(std::move(key), string()).second) fail("a __metadata__ key appears twice");
        } while (consume(','));
        expect('}');
        return out;
    }

    std::string_view text_;
    std::string context_;
    std::size_t pos_ = 0;
};

DType parse_dtype(const Entry& e, const std::string& context) {
    if (e.dtype == "F32") return DType::f32;
    if (e.dtype == "F64") return DType::f64;
    if (e.dtype == "I64") return DType::i64;
    if (e.dtype == "BF16") return DType::bf16;
    if (e.dtype == "F16") return DType::f16;
    throw IoError(str(context, "tensor '", e.name, "' has dtype '", e.dtype, "'; supported: F32, F64, I64, BF16, F16"));
}

// Bytes of a tensor; IoError when the element count or byte size overflows (core/checked.h's rule: the
// product of the non-zero dims must fit, so a (0, 2^62, 4) shape is refused too).
std::int64_t entry_bytes(const Entry& e, DType dtype, const std::string& context) {
    const std::int64_t n = try_numel(e.shape);
    std::int64_t bytes = 0;
    if (n < 0 || __builtin_mul_overflow(n, static_cast<std::int64_t>(dtype_size(dtype)), &bytes))
        throw IoError(str(context, "tensor '", e.name, "': shape ", to_string(e.shape), " is too large"));
    return bytes;
}

// Offsets within the data section: each tensor's range has its exact byte size, and the ranges tile
// [0, data_bytes) with no gap and no overlap (the format forbids both).
void check_offsets(const std::vector<Entry>& entries, const std::vector<DType>& dtypes, std::int64_t data_bytes,
                   const std::string& context) {
    std::vector<std::size_t> order(entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const Entry& e = entries[i];
        order[i] = i;
        const std::int64_t bytes = entry_bytes(e, dtypes[i], context);
        if (e.begin > e.end)
            throw IoError(str(context, "tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end, "] are reversed"));
        if (e.end > data_bytes)
            throw IoError(str(context, "tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
                              "] run past the data section (", data_bytes, " bytes)"));
        if (e.end - e.begin != bytes)
            throw IoError(str(context, "tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end, "] hold ",
                              e.end - e.begin, " bytes, shape ", to_string(e.shape), " of ", e.dtype, " needs ", bytes));
    }
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return std::pair(entries[a].begin, entries[a].end) < std::pair(entries[b].begin, entries[b].end);
    });
    std::int64_t covered = 0;
    for (const std::size_t i : order) {
        const Entry& e = entries[i];
        if (e.begin < covered)
            throw IoError(str(context, "tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
                              "] overlap another tensor"));
        if (e.begin > covered)
            throw IoError(str(context, "bytes [", covered, ", ", e.begin, ") of the data section belong to no tensor"));
        covered = e.end;
    }
    if (covered != data_bytes)
        throw IoError(str(context, "bytes [", covered, ", ", data_bytes, ") of the data section belong to no tensor"));
}

}  // namespace

void save_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                      const SafetensorsMetadata& metadata) {
    const std::string context = str("save_safetensors '", path.string(), "': ");
    std::vector<std::pair<const std::string*, Tensor>> host;  // name, CPU tensor
    for (const auto& [name, tensor] : tensors) {
        if (name == kMetadataKey) throw ValueError(str(context, "'", kMetadataKey, "' is reserved, not a tensor name"));
        if (!valid_utf8(name)) throw ValueError(str(context, "tensor name '", name, "' is not valid UTF-8"));
        if (!tensor.defined()) throw ValueError(str(context, "tensor '", name, "' is undefined"));
        host.emplace_back(&name, tensor.to(Device::cpu()));
    }
    for (const auto& [key, value] : metadata)
        if (!valid_utf8(key) || !valid_utf8(value))
            throw ValueError(str(context, "metadata entry '", key, "' is not valid UTF-8"));

    // Data layout: widest elements first, then by name, so every tensor is aligned to its element size.
    std::vector<std::size_t> layout(host.size());
    for (std::size_t i = 0; i < layout.size(); ++i) layout[i] = i;
    std::stable_sort(layout.begin(), layout.end(), [&](std::size_t a, std::size_t b) {
        return dtype_size(host[a].second.dtype()) > dtype_size(host[b].second.dtype());
    });
    std::vector<std::int64_t> begin(host.size());
    std::int64_t offset = 0;
    for (const std::size_t i : layout) {
        begin[i] = offset;
        offset += static_cast<std::int64_t>(host[i].second.nbytes());
    }

    std::string header = "{";
    if (!metadata.empty()) {
        append_json_string(header, kMetadataKey);
        header += ":{";
        bool first = true;
        for (const auto& [key, value] : metadata) {
            if (!std::exchange(first, false)) header += ',';
            append_json_string(header, key);
            header += ':';
            append_json_string(header, value);
        }
        header += '}';
    }
    for (std::size_t i = 0; i < host.size(); ++i) {
        const Tensor& t = host[i].second;
        if (header.size() > 1) header += ',';
        append_json_string(header, *host[i].first);
        header += str(":{\"dtype\":\"", format_name(t.dtype()), "\",\"shape\":[");
        for (std::size_t d = 0; d < t.rank(); ++d) header += str(d ? "," : "", t.shape()[d]);
        header += str("],\"data_offsets\":[", begin[i], ",", begin[i] + static_cast<std::int64_t>(t.nbytes()), "]}");
    }
    header += '}';
    header.append((8 - header.size() % 8) % 8, ' ');

    // Written beside the destination, then renamed over it: readers never see a half-written file.
    std::filesystem::path temporary = path;
    temporary += ".tmp";
    {
        std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
        if (!out) throw IoError(str(context, "cannot open '", temporary.string(), "' for writing"));
        const std::uint64_t length = header.size();
        out.write(reinterpret_cast<const char*>(&length), sizeof length);
        out.write(header.data(), static_cast<std::streamsize>(header.size()));
        for (const std::size_t i : layout)
            out.write(static_cast<const char*>(host[i].second.raw_data()),
                      static_cast<std::streamsize>(host[i].second.nbytes()));
        out.close();
        if (!out) {
            std::error_code ignored;
            std::filesystem::remove(temporary, ignored);
            throw IoError(str(context, "writing '", temporary.string(), "' failed"));
        }
    }
    std::error_code error;
    std::filesystem::rename(temporary, path, error);
    if (error) {
        std::error_code ignored;
        std::filesystem::remove(temporary, ignored);
        throw IoError(str(context, "cannot rename '", temporary.string(), "' into place: ", error.message()));
    }
}

TensorMap load_safetensors(const std::filesystem::path& path, SafetensorsMetadata* metadata) {
    const std::string context = str("safetensors '", path.string(), "': ");
    std::error_code error;
    const std::uintmax_t file_bytes = std::filesystem::file_size(path, error);
    if (error) throw IoError(str(context, "cannot read: ", error.message()));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(str(context, "cannot open"));
    const auto read = [&](void* dst, std::uint64_t bytes, const char* what) {
        in.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
        if (!in) throw IoError(str(context, "reading ", what, " failed"));
    };

    if (file_bytes < 8) throw IoError(str(context, "file has ", file_bytes, " bytes, fewer than the 8-byte header length"));
    std::uint64_t header_bytes = 0;
    read(&header_bytes, sizeof header_bytes, "the header length");
    if (header_bytes > file_bytes - 8)
        throw IoError(str(context, "header length ", header_bytes, " runs past the end of the file (", file_bytes - 8,
                          " bytes follow the length)"));
    if (header_bytes > kMaxHeaderBytes)
        throw IoError(str(context, "header length ", header_bytes, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
    std::string text(header_bytes, '\0');
    read(text.data(), header_bytes, "the header");
    if (!valid_utf8(text)) throw IoError(str(context, "header is not valid UTF-8"));

    Header header = HeaderParser(text, context).parse();
    std::vector<DType> dtypes;
    for (const Entry& e : header.entries) dtypes.push_back(parse_dtype(e, context));
    const auto data_bytes = static_cast<std::int64_t>(file_bytes - 8 - header_bytes);
    check_offsets(header.entries, dtypes, data_bytes, context);

    TensorMap tensors;
    const auto data_start = static_cast<std::streamoff>(8 + header_bytes);
    for (std::size_t i = 0; i < header.entries.size(); ++i) {
        const Entry& e = header.entries[i];
        Tensor t = Tensor::empty(e.shape, dtypes[i]);
        in.seekg(data_start + static_cast<std::streamoff>(e.begin));
        read(t.raw_data(), t.nbytes(), "tensor data");
        tensors.emplace(e.name, std::move(t));
    }
    if (metadata) *metadata = std::move(header.metadata);
    return tensors;
}

}  // namespace dyngrad
