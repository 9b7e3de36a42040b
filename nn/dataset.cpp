#include "dyngrad/nn/dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "dyngrad/core/error.h"
#include "dyngrad/core/idx.h"
#include "dyngrad/cuda/runtime.h"

namespace dyngrad {

namespace {

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

// DeviceError for a CUDA device this build or machine lacks.
void check_loader_device(const char* loader, const Device& device) {
    if (device.is_cuda() && (device.index < 0 || device.index >= cuda_device_count()))
        throw DeviceError(str(loader, ": ", device.to_string(), " does not exist (",
                              cuda_compiled() ? str(cuda_device_count(), " CUDA devices")
                                              : std::string("this build of dyngrad has no CUDA backend"),
                              ")"));
}

// Uniform in [0, n) without modulo bias: rejects the low 2^64 mod n draws.
std::uint64_t bounded(std::mt19937_64& engine, std::uint64_t n) {
    const std::uint64_t threshold = (0 - n) % n;
    std::uint64_t draw = engine();
    while (draw < threshold) draw = engine();
    return draw % n;
}

}  // namespace

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
    check_loader_device("BatchLoader", options.device);
    if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards)
        throw ValueError(str("BatchLoader: shard ", options.shard, " of ", options.num_shards,
                             " shards (need 0 <= shard < num_shards)"));
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
    if (options.device.is_cuda() && options.resident && !options.shuffle && options.num_shards == 1)
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
    if (options_.num_shards > 1 && static_cast<std::int64_t>(order_.size()) == data_.size()) {
        // This rank's part: positions shard, shard + num_shards, ... of the first n / num_shards · num_shards.
        const auto shards = static_cast<std::size_t>(options_.num_shards);
        std::vector<std::int64_t> mine;
        for (std::size_t i = static_cast<std::size_t>(options_.shard); i < order_.size() / shards * shards; i += shards)
            mine.push_back(order_[i]);
        order_ = std::move(mine);
    }
    cursor_ = 0;
    batch_index_ = 0;
    if (options_.device.is_cuda() && options_.resident && (options_.shuffle || options_.num_shards > 1)) {
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

TensorDataset::TensorDataset(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
    if (tensors_.empty()) throw ValueError("TensorDataset: no tensors");
    for (std::size_t f = 0; f < tensors_.size(); ++f) {
        const Tensor& t = tensors_[f];
        if (!t.defined()) throw ValueError(str("TensorDataset: tensor ", f, " is undefined"));
        if (!t.device().is_cpu())
            throw DeviceError(str("TensorDataset: tensor ", f, " ", describe(t), " must be on the CPU"));
        if (t.rank() == 0 || t.size(0) != tensors_[0].size(0))
            throw ShapeError(str("TensorDataset: tensor ", f, " ", describe(t), " does not share the first (sample) ",
                                 "dimension of tensor 0 ", describe(tensors_[0])));
    }
}

std::int64_t TensorDataset::size() const { return tensors_[0].size(0); }

std::vector<Tensor> TensorDataset::get(std::int64_t index) const {
    if (index < 0 || index >= size())
        throw IndexError(str("TensorDataset: sample ", index, " is outside 0..", size() - 1));
    std::vector<Tensor> sample;
    for (const Tensor& t : tensors_) {
        const Shape shape(t.shape().begin() + 1, t.shape().end());
        sample.push_back(slice_rows(t, index, 1).reshaped(shape));
    }
    return sample;
}

std::vector<Tensor> stack_samples(const std::vector<std::vector<Tensor>>& samples) {
    if (samples.empty()) throw ValueError("stack_samples: no samples");
    const std::vector<Tensor>& first = samples[0];
    for (std::size_t s = 0; s < samples.size(); ++s) {
        if (samples[s].size() != first.size())
            throw ValueError(str("stack_samples: sample ", s, " has ", samples[s].size(), " tensors, sample 0 has ",
                                 first.size()));
        for (std::size_t f = 0; f < first.size(); ++f) {
            const Tensor& t = samples[s][f];
            if (!t.defined()) throw ValueError(str("stack_samples: tensor ", f, " of sample ", s, " is undefined"));
            if (!t.device().is_cpu())
                throw DeviceError(str("stack_samples: tensor ", f, " of sample ", s, " ", describe(t),
                                      " must be on the CPU"));
            if (t.dtype() != first[f].dtype())
                throw DTypeError(str("stack_samples: tensor ", f, " of sample ", s, " is ", dtype_name(t.dtype()),
                                     ", of sample 0 ", dtype_name(first[f].dtype())));
            if (t.shape() != first[f].shape())
                throw ShapeError(str("stack_samples: tensor ", f, " of sample ", s, " has shape ", to_string(t.shape()),
                                     ", of sample 0 ", to_string(first[f].shape()),
                                     " (pass a collate function to batch samples of different shapes)"));
        }
    }
    std::vector<Tensor> batch;
    for (std::size_t f = 0; f < first.size(); ++f) {
        Shape shape = first[f].shape();
        shape.insert(shape.begin(), static_cast<std::int64_t>(samples.size()));
        Tensor out = Tensor::empty(shape, first[f].dtype());
        const std::size_t bytes = first[f].nbytes();
        auto* to = static_cast<char*>(out.raw_data());
        for (std::size_t s = 0; s < samples.size(); ++s) std::memcpy(to + s * bytes, samples[s][f].raw_data(), bytes);
        batch.push_back(std::move(out));
    }
    return batch;
}

struct DataLoader::Worker {
    // A pinned buffer a prepared GPU batch waits in; reused after the copy that read it has run.
    struct Staging {
        void* pinned = nullptr;
        std::size_t capacity = 0;
        cuda::StreamEvent copied;
    };
    struct Ready {
        std::vector<Tensor> host;          // the collated batch
        int staging = -1;                  // GPU: its buffer, fields at `offsets`
        std::vector<std::size_t> offsets;
        std::exception_ptr error;          // get() or collate threw
    };

    std::mutex mutex;
    std::condition_variable changed;
    std::deque<Ready> queue;
    std::vector<Staging> staging;
    std::vector<int> free_staging;
    bool stop = false;
    std::thread thread;

    ~Worker() {
        halt();
        for (Staging& s : staging) {
            // A queued copy may still read the buffer; a failed wait means the device is lost, and a
            // destructor must not throw.
            try {
                s.copied.wait();
            } catch (const Error&) {
            }
            cuda::free_pinned(s.pinned);
        }
    }

    // Stops the thread and drops what it prepared.
    void halt() {
        {
            const std::lock_guard lock(mutex);
            stop = true;
        }
        changed.notify_all();
        if (thread.joinable()) thread.join();
        stop = false;
        queue.clear();
        free_staging.clear();
        for (std::size_t i = 0; i < staging.size(); ++i) free_staging.push_back(static_cast<int>(i));
    }

    // Copies a collated batch into a free pinned buffer (growing it when too small); false when stopped.
    bool stage(Ready& ready) {
        {
            std::unique_lock lock(mutex);
            changed.wait(lock, [&] { return stop || !free_staging.empty(); });
            if (stop) return false;
            ready.staging = free_staging.back();
            free_staging.pop_back();
        }
        Staging& s = staging[static_cast<std::size_t>(ready.staging)];
        s.copied.wait();  // the copy that last read this buffer has run
        std::size_t bytes = 0;
        for (const Tensor& t : ready.host) {
            ready.offsets.push_back(bytes);
            bytes += (t.nbytes() + 255) / 256 * 256;  // each field aligned for the copy engine
        }
        if (bytes > s.capacity) {
            cuda::free_pinned(std::exchange(s.pinned, nullptr));
            s.capacity = 0;
            s.pinned = cuda::allocate_pinned(bytes);
            s.capacity = bytes;
        }
        for (std::size_t f = 0; f < ready.host.size(); ++f)
            std::memcpy(static_cast<char*>(s.pinned) + ready.offsets[f], ready.host[f].raw_data(),
                        ready.host[f].nbytes());
        return true;
    }

    void start(const DataLoader& loader) {
        thread = std::thread([this, &loader] {
            const std::int64_t batches = loader.batches_per_epoch();
            const auto ahead = static_cast<std::size_t>(loader.options_.prefetch);
            for (std::int64_t b = 0; b < batches; ++b) {
                {
                    std::unique_lock lock(mutex);
                    changed.wait(lock, [&] { return stop || queue.size() < ahead; });
                    if (stop) return;
                }
                Ready ready;
                try {
                    ready.host = loader.make_batch(b);
                    if (loader.options_.device.is_cuda() && !stage(ready)) return;
                } catch (...) {
                    ready.error = std::current_exception();
                }
                const bool failed = ready.error != nullptr;
                {
                    const std::lock_guard lock(mutex);
                    queue.push_back(std::move(ready));
                }
                changed.notify_all();
                if (failed) return;
            }
        });
    }
};

DataLoader::DataLoader(std::shared_ptr<const SampleDataset> data, DataLoaderOptions options)
    : data_(std::move(data)), options_(std::move(options)) {
    if (!data_) throw ValueError("DataLoader: the data set is null");
    if (data_->size() < 0) throw ValueError(str("DataLoader: the data set's size ", data_->size(), " is negative"));
    if (options_.batch_size < 1) throw ValueError(str("DataLoader: batch size ", options_.batch_size, " is below 1"));
    if (options_.num_shards < 1 || options_.shard < 0 || options_.shard >= options_.num_shards)
        throw ValueError(str("DataLoader: shard ", options_.shard, " of ", options_.num_shards,
                             " shards (need 0 <= shard < num_shards)"));
    if (options_.prefetch < 0) throw ValueError(str("DataLoader: prefetch ", options_.prefetch, " is negative"));
    check_loader_device("DataLoader", options_.device);
    if (!options_.collate) options_.collate = stack_samples;
    if (options_.prefetch > 0) {
        worker_ = std::make_unique<Worker>();
        if (options_.device.is_cuda())
            for (std::int64_t i = 0; i <= options_.prefetch; ++i)
                worker_->staging.push_back({nullptr, 0, cuda::StreamEvent(options_.device.index)});
    }
    start_epoch(0);
}

DataLoader::~DataLoader() = default;

void DataLoader::start_epoch(std::int64_t epoch) {
    if (worker_) worker_->halt();
    const std::int64_t n = data_->size();
    std::vector<std::int64_t> all;
    if (options_.shuffle) {
        all = epoch_permutation(n, options_.seed, epoch);
    } else {
        all.resize(static_cast<std::size_t>(n));
        std::iota(all.begin(), all.end(), std::int64_t{0});
    }
    if (options_.even_shards) all.resize(all.size() / static_cast<std::size_t>(options_.num_shards) *
                                         static_cast<std::size_t>(options_.num_shards));
    order_.clear();
    for (std::size_t i = static_cast<std::size_t>(options_.shard); i < all.size();
         i += static_cast<std::size_t>(options_.num_shards))
        order_.push_back(all[i]);
    next_batch_ = 0;
    if (worker_) worker_->start(*this);
}

std::int64_t DataLoader::batches_per_epoch() const {
    const auto n = static_cast<std::int64_t>(order_.size());
    return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

std::vector<Tensor> DataLoader::make_batch(std::int64_t batch_index) const {
    const std::int64_t begin = batch_index * options_.batch_size;
    const std::int64_t end = std::min(begin + options_.batch_size, static_cast<std::int64_t>(order_.size()));
    std::vector<std::vector<Tensor>> samples;
    for (std::int64_t k = begin; k < end; ++k) samples.push_back(data_->get(order_[static_cast<std::size_t>(k)]));
    std::vector<Tensor> batch = options_.collate(samples);
    for (std::size_t f = 0; f < batch.size(); ++f) {
        if (!batch[f].defined()) throw ValueError(str("DataLoader: collate returned an undefined tensor ", f));
        if (!batch[f].device().is_cpu())
            throw DeviceError(str("DataLoader: collate returned tensor ", f, " ", describe(batch[f]),
                                  "; it must return CPU tensors (the loader moves them)"));
    }
    return batch;
}

bool DataLoader::next(std::vector<Tensor>& batch) {
    if (next_batch_ >= batches_per_epoch()) return false;
    if (!worker_) {
        std::vector<Tensor> host = make_batch(next_batch_);
        ++next_batch_;
        batch.clear();
        for (Tensor& t : host) batch.push_back(t.to(options_.device));
        return true;
    }
    Worker::Ready ready;
    {
        std::unique_lock lock(worker_->mutex);
        worker_->changed.wait(lock, [&] { return !worker_->queue.empty(); });
        ready = std::move(worker_->queue.front());
        worker_->queue.pop_front();
    }
    worker_->changed.notify_all();
    if (ready.error) {
        next_batch_ = batches_per_epoch();  // the worker has stopped: this epoch ends here
        std::rethrow_exception(ready.error);
    }
    ++next_batch_;
    batch.clear();
    if (ready.staging < 0) {
        batch = std::move(ready.host);
        return true;
    }
    Worker::Staging& staging = worker_->staging[static_cast<std::size_t>(ready.staging)];
    for (std::size_t f = 0; f < ready.host.size(); ++f) {
        const Tensor& host = ready.host[f];
        Tensor t = Tensor::empty(host.shape(), host.dtype(), options_.device);
        cuda::copy_to_device_async(t.raw_data(), options_.device.index,
                                   static_cast<const char*>(staging.pinned) + ready.offsets[f], host.nbytes());
        batch.push_back(std::move(t));
    }
    staging.copied.record();
    {
        const std::lock_guard lock(worker_->mutex);
        worker_->free_staging.push_back(ready.staging);
    }
    worker_->changed.notify_all();
    return true;
}

}  // namespace dyngrad
