#include "dyngrad/nn/dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "dyngrad/core/error.h"
#include "dyngrad/core/idx.h"
#include "dyngrad/cuda/runtime.h"

namespace dyngrad {

namespace {

// ---- loading ----

// `stem` or `stem.gz` inside `directory`, whichever exists (the plain file first).
std::string find_idx_file(const std::filesystem::path& directory, const std::string& stem) {
    for (const std::string& name : {stem, stem + ".gz"}) {
        const std::filesystem::path path = directory / name;
        if (std::filesystem::exists(path)) return path.string();
    }
    throw IoError(str("MNIST directory '", directory.string(), "': missing ", stem, " (or ", stem, ".gz)"));
}

struct RawSplit {
    IdxArray images;  // (N,H,W) bytes
    IdxArray labels;  // (N) bytes
};

RawSplit read_split(const std::filesystem::path& directory, const std::string& prefix) {
    const std::string images_path = find_idx_file(directory, prefix + "-images-idx3-ubyte");
    const std::string labels_path = find_idx_file(directory, prefix + "-labels-idx1-ubyte");
    RawSplit split{read_idx(images_path, 3), read_idx(labels_path, 1)};
    if (split.images.dims[0] != split.labels.dims[0])
        throw IoError(str("'", images_path, "' holds ", split.images.dims[0], " images but '", labels_path, "' holds ",
                          split.labels.dims[0], " labels"));
    for (std::size_t i = 0; i < split.labels.data.size(); ++i)
        if (split.labels.data[i] >= kMnistClasses)
            throw IoError(str("'", labels_path, "': label ", int(split.labels.data[i]), " at index ", i,
                              " is outside 0..", kMnistClasses - 1));
    return split;
}

// Mean and standard deviation of byte / 255 over every pixel, from a histogram of the byte values.
Normalization pixel_statistics(const std::vector<std::uint8_t>& pixels) {
    std::array<std::int64_t, 256> counts{};
    for (const std::uint8_t p : pixels) ++counts[p];
    double sum = 0, sum_squares = 0;
    for (int v = 0; v < 256; ++v) {
        const double x = v / 255.0;
        sum += static_cast<double>(counts[v]) * x;
        sum_squares += static_cast<double>(counts[v]) * x * x;
    }
    const auto n = static_cast<double>(pixels.size());
    const double mean = sum / n;
    const double variance = std::max(sum_squares / n - mean * mean, 0.0);
    // A constant image set has no spread to divide by: only centre it.
    return {mean, variance > 0 ? std::sqrt(variance) : 1.0};
}

Dataset to_dataset(const RawSplit& raw, const Normalization& normalization) {
    const std::int64_t n = raw.images.dims[0], height = raw.images.dims[1], width = raw.images.dims[2];
    Dataset out{Tensor::empty({n, 1, height, width}, DType::f32), Tensor::empty({n}, DType::i64)};
    std::array<float, 256> value{};
    for (int v = 0; v < 256; ++v)
        value[v] = static_cast<float>((v / 255.0 - normalization.mean) / normalization.stddev);
    float* images = out.images.data<float>();
    for (std::size_t i = 0; i < raw.images.data.size(); ++i) images[i] = value[raw.images.data[i]];
    std::int64_t* labels = out.labels.data<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) labels[i] = raw.labels.data[static_cast<std::size_t>(i)];
    return out;
}

// ---- batching ----

std::size_t row_bytes(const Tensor& t) { return t.size(0) == 0 ? 0 : t.nbytes() / static_cast<std::size_t>(t.size(0)); }

// dst row r = src row index[r], for `count` rows; `dst` is host memory.
void gather_rows(const Tensor& src, const std::int64_t* index, std::int64_t count, void* dst) {
    const std::size_t bytes = row_bytes(src);
    const auto* from = static_cast<const char*>(src.raw_data());
    auto* to = static_cast<char*>(dst);
    for (std::int64_t r = 0; r < count; ++r)
        std::memcpy(to + static_cast<std::size_t>(r) * bytes, from + static_cast<std::size_t>(index[r]) * bytes, bytes);
}

Shape with_rows(const Tensor& t, std::int64_t rows) {
    Shape shape = t.shape();
    shape[0] = rows;
    return shape;
}

// A new CPU tensor holding rows index[0..count) of the CPU tensor `src`.
Tensor gather(const Tensor& src, const std::int64_t* index, std::int64_t count) {
    Tensor out = Tensor::empty(with_rows(src, count), src.dtype());
    gather_rows(src, index, count, out.raw_data());
    return out;
}

// A new tensor on src's device holding rows [begin, begin + count) of `src`.
Tensor slice_rows(const Tensor& src, std::int64_t begin, std::int64_t count) {
    Tensor out = Tensor::empty(with_rows(src, count), src.dtype(), src.device());
    const std::size_t bytes = row_bytes(src);
    const char* from = static_cast<const char*>(src.raw_data()) + static_cast<std::size_t>(begin) * bytes;
    const std::size_t total = static_cast<std::size_t>(count) * bytes;
    if (src.device().is_cpu())
        std::memcpy(out.raw_data(), from, total);
    else
        cuda::copy(out.raw_data(), out.device(), from, src.device(), total);  // device to device, stream-ordered
    return out;
}

// Uniform in [0, n) without modulo bias: rejects the low 2^64 mod n draws.
std::uint64_t bounded(std::mt19937_64& engine, std::uint64_t n) {
    const std::uint64_t threshold = (0 - n) % n;
    std::uint64_t draw = engine();
    while (draw < threshold) draw = engine();
    return draw % n;
}

}  // namespace

// ---- Dataset, load_mnist ----

Dataset Dataset::head(std::int64_t n) const {
    const std::int64_t count = std::clamp<std::int64_t>(n, 0, size());
    return {slice_rows(images, 0, count), slice_rows(labels, 0, count)};
}

MnistData load_mnist(const std::string& directory) {
    const std::filesystem::path dir(directory);
    if (!std::filesystem::is_directory(dir))
        throw IoError(str("MNIST directory '", directory, "' does not exist",
                          directory == kDefaultMnistDirectory ? " (Debian/Ubuntu: apt-get install dataset-fashion-mnist)"
                                                              : ""));
    const RawSplit train = read_split(dir, "train");
    const RawSplit test = read_split(dir, "t10k");
    if (test.images.dims[1] != train.images.dims[1] || test.images.dims[2] != train.images.dims[2])
        throw IoError(str("MNIST directory '", directory, "': test images are ", test.images.dims[1], "x",
                          test.images.dims[2], ", training images ", train.images.dims[1], "x", train.images.dims[2]));
    MnistData data;
    data.normalization = pixel_statistics(train.images.data);
    data.train = to_dataset(train, data.normalization);
    data.test = to_dataset(test, data.normalization);
    return data;
}

// ---- BatchLoader ----

struct BatchLoader::Staging {
    struct Slot {
        std::unique_ptr<void, decltype(&cuda::free_pinned)> buffer{nullptr, &cuda::free_pinned};
        cuda::StreamEvent copied;  // recorded after the copies that read `buffer`
    };
    std::vector<Slot> slots;  // two: one being filled while the other's copy may still run
    std::size_t label_bytes = 0;  // labels first in a slot (8-byte aligned), then the images
};

std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
    if (n < 0) throw ValueError(str("epoch_permutation: sample count ", n, " is negative"));
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), std::int64_t{0});
    const auto e = static_cast<std::uint64_t>(epoch);
    std::seed_seq sequence{std::uint32_t(seed), std::uint32_t(seed >> 32), std::uint32_t(e), std::uint32_t(e >> 32)};
    std::mt19937_64 engine(sequence);
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[bounded(engine, i)]);
    return order;
}

BatchLoader::BatchLoader(const Dataset& data, const LoaderOptions& options) : data_(data), options_(options) {
    if (options.batch_size < 1) throw ValueError(str("BatchLoader: batch size ", options.batch_size, " is below 1"));
    if (!data.images.defined() || !data.labels.defined()) throw ValueError("BatchLoader: the data set is empty");
    if (!data.images.device().is_cpu() || !data.labels.device().is_cpu())
        throw DeviceError(str("BatchLoader: the data set must be on the CPU, got images ", describe(data.images),
                              " and labels ", describe(data.labels)));
    if (data.labels.dtype() != DType::i64)
        throw DTypeError(str("BatchLoader: labels must be int64, got ", describe(data.labels)));
    if (data.labels.rank() != 1 || data.images.rank() < 1 || data.images.size(0) != data.labels.size(0))
        throw ShapeError(str("BatchLoader: images ", describe(data.images), " and labels ", describe(data.labels),
                             " do not pair up (need labels (N) and images (N,...))"));
    if (options.device.is_cuda() && (options.device.index < 0 || options.device.index >= cuda_device_count()))
        throw DeviceError(str("BatchLoader: ", options.device.to_string(), " does not exist (",
                              cuda_compiled() ? str(cuda_device_count(), " CUDA devices")
                                              : std::string("this build of dyngrad has no CUDA backend"),
                              ")"));
    if (options.device.is_cuda() && !options.resident) {
        staging_ = std::make_unique<Staging>();
        const auto batch = static_cast<std::size_t>(options.batch_size);
        staging_->label_bytes = batch * row_bytes(data.labels);
        const std::size_t slot_bytes = staging_->label_bytes + batch * row_bytes(data.images);
        for (int i = 0; i < 2; ++i) {
            Staging::Slot slot{.buffer = {cuda::allocate_pinned(slot_bytes), &cuda::free_pinned},
                               .copied = cuda::StreamEvent(options.device.index)};
            staging_->slots.push_back(std::move(slot));
        }
    }
    if (options.device.is_cuda() && options.resident && !options.shuffle)
        resident_ = {data.images.to(options.device), data.labels.to(options.device)};
    start_epoch(0);
}

BatchLoader::~BatchLoader() = default;

void BatchLoader::start_epoch(std::int64_t epoch) {
    if (options_.shuffle) {
        order_ = epoch_permutation(data_.size(), options_.seed, epoch);
    } else if (order_.empty()) {
        order_.resize(static_cast<std::size_t>(data_.size()));
        std::iota(order_.begin(), order_.end(), std::int64_t{0});
    }
    cursor_ = 0;
    batch_index_ = 0;
    if (options_.device.is_cuda() && options_.resident && options_.shuffle) {
        resident_ = {};  // freed first (stream-ordered), so the pool can reuse its memory for this epoch's copy
        resident_ = {gather(data_.images, order_.data(), size()).to(options_.device),
                     gather(data_.labels, order_.data(), size()).to(options_.device)};
    }
}

std::int64_t BatchLoader::batches_per_epoch() const {
    return (size() + options_.batch_size - 1) / options_.batch_size;
}

bool BatchLoader::next(Batch& batch) {
    if (cursor_ >= size()) return false;
    const std::int64_t count = std::min(options_.batch_size, size() - cursor_);
    const std::int64_t* index = order_.data() + cursor_;
    if (options_.device.is_cpu()) {
        batch.images = gather(data_.images, index, count);
        batch.labels = gather(data_.labels, index, count);
    } else if (options_.resident) {
        batch.images = slice_rows(resident_.images, cursor_, count);
        batch.labels = slice_rows(resident_.labels, cursor_, count);
    } else {
        Staging::Slot& slot = staging_->slots[static_cast<std::size_t>(batch_index_ % 2)];
        slot.copied.wait();  // the copy that last read this buffer (two batches ago) has run
        char* labels_host = static_cast<char*>(slot.buffer.get());
        char* images_host = labels_host + staging_->label_bytes;
        gather_rows(data_.labels, index, count, labels_host);
        gather_rows(data_.images, index, count, images_host);
        batch.images = Tensor::empty(with_rows(data_.images, count), data_.images.dtype(), options_.device);
        batch.labels = Tensor::empty(with_rows(data_.labels, count), DType::i64, options_.device);
        cuda::copy_to_device_async(batch.labels.raw_data(), options_.device.index, labels_host, batch.labels.nbytes());
        cuda::copy_to_device_async(batch.images.raw_data(), options_.device.index, images_host, batch.images.nbytes());
        slot.copied.record();
    }
    batch.index = batch_index_++;
    cursor_ += count;
    return true;
}

}  // namespace dyngrad
