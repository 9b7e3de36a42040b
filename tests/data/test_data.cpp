// Data: the IDX reader (plain and gzip, every malformed-file error naming the file), the MNIST-format
// loader on a small synthetic directory and on the real Fashion-MNIST when it is installed, and the
// batch loader's epoch orders.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system's temp directory, removed at the end of the test case.
class TempDir {
public:
    TempDir() : path_(fs::temp_directory_path() / ("dyngrad_test_data_" + std::to_string(::getpid()))) {
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ignored;
        fs::remove_all(path_, ignored);
    }
    std::string file(const std::string& name) const { return (path_ / name).string(); }
    const fs::path& path() const { return path_; }

private:
    fs::path path_;
};

std::vector<std::uint8_t> be32(std::uint32_t v) {
    return {std::uint8_t(v >> 24), std::uint8_t(v >> 16), std::uint8_t(v >> 8), std::uint8_t(v)};
}

// The bytes of an unsigned-byte IDX file with these dims and values.
std::vector<std::uint8_t> idx_bytes(const std::vector<std::uint32_t>& dims, const std::vector<std::uint8_t>& values) {
    std::vector<std::uint8_t> out = be32(0x0800u | static_cast<std::uint32_t>(dims.size()));
    for (const std::uint32_t d : dims) {
        const auto word = be32(d);
        out.insert(out.end(), word.begin(), word.end());
    }
    out.insert(out.end(), values.begin(), values.end());
    return out;
}

void write_plain(const std::string& path, const std::vector<std::uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_gzip(const std::string& path, const std::vector<std::uint8_t>& bytes) {
    gzFile file = gzopen(path.c_str(), "wb");
    REQUIRE(file != nullptr);
    REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
    REQUIRE(gzclose(file) == Z_OK);
}

std::vector<std::uint8_t> read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::uint8_t> iota_bytes(std::size_t n, int modulo = 256) {
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 7 + 3) % static_cast<std::size_t>(modulo));
    return v;
}

// An MNIST-format directory with `train` and `test` samples of 4×3 pixels; labels i % 10.
void write_mnist_dir(const TempDir& dir, std::uint32_t train, std::uint32_t test, bool gzip) {
    auto write = gzip ? write_gzip : write_plain;
    const std::string suffix = gzip ? ".gz" : "";
    for (const auto& [prefix, n] : {std::pair{std::string("train"), train}, std::pair{std::string("t10k"), test}}) {
        std::vector<std::uint8_t> labels(n);
        for (std::uint32_t i = 0; i < n; ++i) labels[i] = static_cast<std::uint8_t>(i % 10);
        write(dir.file(prefix + "-images-idx3-ubyte" + suffix), idx_bytes({n, 4, 3}, iota_bytes(n * 12u)));
        write(dir.file(prefix + "-labels-idx1-ubyte" + suffix), idx_bytes({n}, labels));
    }
}

Dataset numbered_dataset(std::int64_t n) {
    // Sample i: image filled with i, label i % 10, so a batch row tells which sample it holds.
    Dataset data{Tensor::empty({n, 1, 2, 2}, DType::f32), Tensor::empty({n}, DType::i64)};
    for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t p = 0; p < 4; ++p) data.images.data<float>()[i * 4 + p] = static_cast<float>(i);
        data.labels.data<std::int64_t>()[i] = i % 10;
    }
    return data;
}

// Every batch of one epoch: the sample ids it holds (from the image values), checked against labels.
std::vector<std::int64_t> epoch_ids(BatchLoader& loader, std::vector<std::int64_t>* batch_sizes = nullptr) {
    std::vector<std::int64_t> ids;
    Batch batch;
    std::int64_t expected_index = 0;
    while (loader.next(batch)) {
        CHECK(batch.index == expected_index++);
        if (batch_sizes) batch_sizes->push_back(batch.size());
        REQUIRE(batch.images.shape() == Shape{batch.size(), 1, 2, 2});
        for (std::int64_t r = 0; r < batch.size(); ++r) {
            const auto id = static_cast<std::int64_t>(batch.images.at({r, 0, 1, 1}));
            CHECK(batch.labels.at({r}) == static_cast<double>(id % 10));
            ids.push_back(id);
        }
    }
    return ids;
}

}  // namespace

TEST_CASE("IDX files read back, plain and gzip", "[data][idx]") {
    TempDir dir;
    const std::vector<std::uint8_t> pixels = iota_bytes(5 * 4 * 3);
    const std::vector<std::uint8_t> labels = {0, 9, 3, 3, 7};
    write_plain(dir.file("images"), idx_bytes({5, 4, 3}, pixels));
    write_gzip(dir.file("images.gz"), idx_bytes({5, 4, 3}, pixels));
    write_plain(dir.file("labels"), idx_bytes({5}, labels));
    write_gzip(dir.file("labels.gz"), idx_bytes({5}, labels));
    for (const std::string name : {"images", "images.gz"}) {
        const IdxArray a = read_idx(dir.file(name), 3);
        CHECK(a.dims == std::vector<std::int64_t>{5, 4, 3});
        CHECK(a.data == pixels);
    }
    for (const std::string name : {"labels", "labels.gz"}) {
        const IdxArray a = read_idx(dir.file(name), 1);
        CHECK(a.dims == std::vector<std::int64_t>{5});
        CHECK(a.data == labels);
    }
}

TEST_CASE("malformed IDX files throw IoError naming the file and the problem", "[data][idx][errors]") {
    TempDir dir;
    const auto good = idx_bytes({6, 2, 2}, iota_bytes(24));

    SECTION("missing file") {
        const std::string path = dir.file("nowhere-idx3-ubyte");
        CHECK_THROWS_MATCHES(read_idx(path, 3), IoError, MessageHas({path, "cannot open", "No such file"}));
    }
    SECTION("empty file and truncated header") {
        write_plain(dir.file("empty"), {});
        CHECK_THROWS_MATCHES(read_idx(dir.file("empty"), 3), IoError, MessageHas({dir.file("empty"), "truncated header"}));
        write_plain(dir.file("short"), std::vector<std::uint8_t>(good.begin(), good.begin() + 9));
        CHECK_THROWS_MATCHES(read_idx(dir.file("short"), 3), IoError,
                             MessageHas({dir.file("short"), "truncated header", "dimension 1"}));
    }
    SECTION("truncated payload, plain and gzip") {
        const std::vector<std::uint8_t> cut(good.begin(), good.end() - 5);
        write_plain(dir.file("cut"), cut);
        write_gzip(dir.file("cut.gz"), cut);
        for (const std::string name : {"cut", "cut.gz"})
            CHECK_THROWS_MATCHES(read_idx(dir.file(name), 3), IoError,
                                 MessageHas({dir.file(name), "truncated payload", "(6,2,2)", "24 bytes", "holds 19"}));
    }
    SECTION("a gzip file cut short") {
        write_gzip(dir.file("whole.gz"), good);
        const auto compressed = read_all(dir.file("whole.gz"));
        write_plain(dir.file("half.gz"), std::vector<std::uint8_t>(compressed.begin(), compressed.begin() + 20));
        CHECK_THROWS_MATCHES(read_idx(dir.file("half.gz"), 3), IoError, MessageHas({dir.file("half.gz"), "truncated"}));
    }
    SECTION("corrupt gzip data") {
        write_gzip(dir.file("whole.gz"), idx_bytes({64, 8, 8}, iota_bytes(64 * 64)));
        auto compressed = read_all(dir.file("whole.gz"));
        for (std::size_t i = 12; i < compressed.size() - 8; ++i) compressed[i] ^= 0x5a;
        write_plain(dir.file("bad.gz"), compressed);
        CHECK_THROWS_MATCHES(read_idx(dir.file("bad.gz"), 3), IoError, MessageHas({dir.file("bad.gz")}));
    }
    SECTION("trailing bytes") {
        auto longer = good;
        longer.insert(longer.end(), {1, 2, 3});
        write_plain(dir.file("long"), longer);
        CHECK_THROWS_MATCHES(read_idx(dir.file("long"), 3), IoError, MessageHas({dir.file("long"), "3 unexpected bytes"}));
    }
    SECTION("wrong magic: not IDX, another element type, another rank") {
        auto text = good;
        text[0] = 'P';
        text[1] = 'K';
        write_plain(dir.file("zip"), text);
        CHECK_THROWS_MATCHES(read_idx(dir.file("zip"), 3), IoError, MessageHas({dir.file("zip"), "not an IDX file"}));
        auto floats = good;
        floats[2] = 0x0d;
        write_plain(dir.file("floats"), floats);
        CHECK_THROWS_MATCHES(read_idx(dir.file("floats"), 3), IoError,
                             MessageHas({dir.file("floats"), "0x00000d03", "element type"}));
        write_plain(dir.file("labels"), idx_bytes({24}, iota_bytes(24)));
        CHECK_THROWS_MATCHES(read_idx(dir.file("labels"), 3), IoError,
                             MessageHas({dir.file("labels"), "0x00000801", "expected 0x00000803", "rank 1 instead of 3"}));
    }
    SECTION("wrong dims: zero, absurdly large") {
        write_plain(dir.file("zero"), idx_bytes({6, 0, 2}, {}));
        CHECK_THROWS_MATCHES(read_idx(dir.file("zero"), 3), IoError, MessageHas({dir.file("zero"), "dimension 1 is 0"}));
        write_plain(dir.file("huge"), idx_bytes({60000, 0xffffffu, 0xffffu}, iota_bytes(16)));
        CHECK_THROWS_MATCHES(read_idx(dir.file("huge"), 3), IoError, MessageHas({dir.file("huge"), "announce more than"}));
    }
}

TEST_CASE("an MNIST-format directory loads, plain or gzip, normalised", "[data][mnist]") {
    for (const bool gzip : {false, true}) {
        TempDir dir;
        write_mnist_dir(dir, 30, 12, gzip);
        const MnistData data = load_mnist(dir.path().string());
        CHECK(data.train.size() == 30);
        CHECK(data.test.size() == 12);
        CHECK(data.train.images.shape() == Shape{30, 1, 4, 3});
        CHECK(data.test.images.shape() == Shape{12, 1, 4, 3});
        CHECK(data.train.images.dtype() == DType::f32);
        CHECK(data.train.labels.dtype() == DType::i64);
        CHECK(data.train.labels.at({17}) == 7);
        // Normalised with the training pixels' own statistics: mean 0, standard deviation 1.
        const std::vector<double> pixels = data.train.images.to_vector();
        double sum = 0, sum_squares = 0;
        for (const double p : pixels) sum += p;
        const double mean = sum / static_cast<double>(pixels.size());
        for (const double p : pixels) sum_squares += (p - mean) * (p - mean);
        CHECK(std::abs(mean) < 1e-5);
        CHECK(std::sqrt(sum_squares / static_cast<double>(pixels.size())) == dgtest::Approx(1.0).epsilon(1e-5));
        // Pixel 0 of image 0 is byte 3.
        CHECK(data.train.images.at({0, 0, 0, 0}) ==
              dgtest::Approx((3 / 255.0 - data.normalization.mean) / data.normalization.stddev).epsilon(1e-6));

        const Dataset first = data.train.head(8);
        CHECK(first.size() == 8);
        CHECK(first.images.to_vector() == std::vector<double>(pixels.begin(), pixels.begin() + 8 * 12));
        CHECK(data.train.head(1000).size() == 30);
    }
}

TEST_CASE("broken MNIST-format directories name the file", "[data][mnist][errors]") {
    TempDir dir;
    SECTION("no such directory") {
        const std::string missing = dir.file("nothing-here");
        CHECK_THROWS_MATCHES(load_mnist(missing), IoError, MessageHas({missing, "does not exist"}));
    }
    SECTION("a missing file") {
        write_mnist_dir(dir, 10, 10, true);
        fs::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
        CHECK_THROWS_MATCHES(load_mnist(dir.path().string()), IoError,
                             MessageHas({dir.path().string(), "missing t10k-labels-idx1-ubyte"}));
    }
    SECTION("image and label counts differ") {
        write_mnist_dir(dir, 10, 10, false);
        write_plain(dir.file("train-labels-idx1-ubyte"), idx_bytes({9}, iota_bytes(9, 10)));
        CHECK_THROWS_MATCHES(load_mnist(dir.path().string()), IoError,
                             MessageHas({dir.file("train-images-idx3-ubyte"), dir.file("train-labels-idx1-ubyte"),
                                         "10 images", "9 labels"}));
    }
    SECTION("a label outside 0..9") {
        write_mnist_dir(dir, 10, 10, false);
        auto labels = iota_bytes(10, 10);
        labels[4] = 12;
        write_plain(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({10}, labels));
        CHECK_THROWS_MATCHES(load_mnist(dir.path().string()), IoError,
                             MessageHas({dir.file("t10k-labels-idx1-ubyte"), "label 12 at index 4"}));
    }
    SECTION("test images of another size") {
        write_mnist_dir(dir, 10, 10, false);
        write_plain(dir.file("t10k-images-idx3-ubyte"), idx_bytes({10, 3, 3}, iota_bytes(90)));
        CHECK_THROWS_MATCHES(load_mnist(dir.path().string()), IoError, MessageHas({"test images are 3x3", "4x3"}));
    }
    SECTION("a corrupt file inside the directory") {
        write_mnist_dir(dir, 10, 10, false);
        write_plain(dir.file("train-images-idx3-ubyte"), idx_bytes({10, 4, 3}, iota_bytes(100)));
        CHECK_THROWS_MATCHES(load_mnist(dir.path().string()), IoError,
                             MessageHas({dir.file("train-images-idx3-ubyte"), "truncated payload"}));
    }
}

TEST_CASE("the installed Fashion-MNIST loads", "[data][mnist][fashion]") {
    if (!fs::exists(kDefaultMnistDirectory)) {
        DG_SKIP(kDefaultMnistDirectory << " is not installed (apt-get install dataset-fashion-mnist)");
    }
    const MnistData data = load_mnist();
    CHECK(data.train.images.shape() == Shape{60000, 1, 28, 28});
    CHECK(data.test.images.shape() == Shape{10000, 1, 28, 28});
    CHECK(data.train.labels.shape() == Shape{60000});
    CHECK(data.test.labels.shape() == Shape{10000});
    // Fashion-MNIST's pixel statistics; every class appears, 6000 times in training and 1000 in test.
    CHECK(data.normalization.mean == dgtest::Approx(0.2860).margin(1e-3));
    CHECK(data.normalization.stddev == dgtest::Approx(0.3530).margin(1e-3));
    for (const Dataset* split : {&data.train, &data.test}) {
        const std::int64_t* labels = split->labels.data<std::int64_t>();
        const auto [lowest, highest] = std::minmax_element(labels, labels + split->size());
        REQUIRE(*lowest == 0);
        REQUIRE(*highest == 9);
        std::vector<std::int64_t> counts(10, 0);
        for (std::int64_t i = 0; i < split->size(); ++i) ++counts[static_cast<std::size_t>(labels[i])];
        CHECK(counts == std::vector<std::int64_t>(10, split->size() / 10));
    }
}

TEST_CASE("batches cover every sample once per epoch, by seed, differently each epoch", "[data][loader]") {
    const Dataset data = numbered_dataset(103);
    std::vector<std::int64_t> all(103);
    std::iota(all.begin(), all.end(), std::int64_t{0});

    BatchLoader loader(data, {.batch_size = 10, .seed = 7});
    CHECK(loader.batches_per_epoch() == 11);
    std::vector<std::int64_t> sizes;
    const auto epoch0 = epoch_ids(loader, &sizes);
    CHECK(sizes == std::vector<std::int64_t>{10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3});
    CHECK(epoch0 == loader.order());
    auto sorted = epoch0;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == all);
    CHECK(epoch0 != all);  // shuffled
    Batch untouched;
    CHECK_FALSE(loader.next(untouched));
    CHECK_FALSE(untouched.images.defined());

    loader.start_epoch(1);
    const auto epoch1 = epoch_ids(loader);
    CHECK(epoch1 != epoch0);
    sorted = epoch1;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == all);

    // Same seed and epoch: the same order, from a new loader or by rewinding this one.
    BatchLoader again(data, {.batch_size = 32, .seed = 7});
    CHECK(epoch_ids(again) == epoch0);
    loader.start_epoch(0);
    CHECK(epoch_ids(loader) == epoch0);
    CHECK(epoch_permutation(103, 7, 1) == epoch1);

    BatchLoader other_seed(data, {.batch_size = 10, .seed = 8});
    CHECK(epoch_ids(other_seed) != epoch0);

    BatchLoader in_order(data, {.batch_size = 50, .shuffle = false});
    CHECK(epoch_ids(in_order) == all);
    in_order.start_epoch(3);
    CHECK(epoch_ids(in_order) == all);

    BatchLoader limited(data.head(20), {.batch_size = 64});
    sizes.clear();
    sorted = epoch_ids(limited, &sizes);
    CHECK(sizes == std::vector<std::int64_t>{20});
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == std::vector<std::int64_t>(all.begin(), all.begin() + 20));
}

TEST_CASE("batch loader arguments are checked", "[data][loader][errors]") {
    const Dataset data = numbered_dataset(5);
    CHECK_THROWS_MATCHES(BatchLoader(data, {.batch_size = 0}), ValueError, MessageHas({"batch size 0"}));
    const Dataset mismatched{data.images, Tensor::zeros({4}, DType::i64)};
    CHECK_THROWS_MATCHES(BatchLoader(mismatched, {}), ShapeError, MessageHas({"(5,1,2,2)", "(4)"}));
    const Dataset float_labels{data.images, Tensor::zeros({5})};
    CHECK_THROWS_AS(BatchLoader(float_labels, {}), DTypeError);
    const int missing = cuda_device_count();
    CHECK_THROWS_MATCHES(BatchLoader(data, {.device = Device::cuda(missing)}), DeviceError,
                         MessageHas({Device::cuda(missing).to_string(), "does not exist"}));
    CHECK_THROWS_MATCHES(BatchLoader(data, {.device = Device::cuda(missing), .resident = true}), DeviceError,
                         MessageHas({"does not exist"}));
}

TEST_CASE("GPU batches, streamed and resident, equal the CPU ones", "[data][loader][gpu]") {
    if (cuda_device_count() == 0) DG_SKIP("no CUDA device: the GPU batch loader test");
    const Dataset data = numbered_dataset(1000);
    BatchLoader on_cpu(data, {.batch_size = 64, .seed = 3});
    BatchLoader streamed(data, {.batch_size = 64, .seed = 3, .device = Device::cuda(0)});
    BatchLoader resident(data, {.batch_size = 64, .seed = 3, .device = Device::cuda(0), .resident = true});
    for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
        for (BatchLoader* loader : {&on_cpu, &streamed, &resident}) loader->start_epoch(epoch);
        // Hold every batch of the epoch before reading any back: the staging buffers are reused while
        // earlier batches' copies may still be queued.
        std::vector<Batch> expected, from_stream, from_resident;
        for (Batch b; on_cpu.next(b);) expected.push_back(b);
        for (Batch b; streamed.next(b);) from_stream.push_back(b);
        for (Batch b; resident.next(b);) from_resident.push_back(b);
        REQUIRE(from_stream.size() == expected.size());
        REQUIRE(from_resident.size() == expected.size());
        for (std::size_t i = 0; i < expected.size(); ++i) {
            CHECK(from_stream[i].images.device() == Device::cuda(0));
            CHECK(from_resident[i].labels.device() == Device::cuda(0));
            CHECK(from_stream[i].images.to_vector() == expected[i].images.to_vector());
            CHECK(from_stream[i].labels.to_vector() == expected[i].labels.to_vector());
            CHECK(from_resident[i].images.to_vector() == expected[i].images.to_vector());
            CHECK(from_resident[i].labels.to_vector() == expected[i].labels.to_vector());
        }
    }
    // Evaluation order (no shuffle): the resident split is uploaded once.
    BatchLoader in_order(data, {.batch_size = 300, .shuffle = false, .device = Device::cuda(0), .resident = true});
    std::vector<double> labels;
    for (Batch b; in_order.next(b);) {
        const auto values = b.labels.to_vector();
        labels.insert(labels.end(), values.begin(), values.end());
    }
    CHECK(labels == data.labels.to_vector());
}
