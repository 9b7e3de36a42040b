// Classification data in memory, and shuffled mini-batches from it on the CPU or a GPU; and a general
// DataLoader over any data set of tensors (user data sets, regression targets, sequences), with a collate
// step and background prefetch (bottom of this file).
//
// load_mnist() reads an MNIST-format directory (MNIST, Fashion-MNIST and their kin) into two Datasets.
// BatchLoader walks one Dataset in an order drawn from (seed, epoch): every sample exactly once per epoch,
// the same order for the same seed and epoch, a different one each epoch; batches of a fixed size with a
// last partial batch.
//
// How batches reach a GPU (LoaderOptions::resident picks one of the two):
// - streamed (default): the host gathers each batch's rows into one of two pinned buffers and queues an
//   asynchronous copy into new device tensors on the device's stream. next() returns as soon as the copy
//   is queued; while the GPU trains on batch k, the host gathers batch k+1 into the other buffer. A buffer
//   is rewritten only after the copy that last read it has run (an event per buffer), so the host may run
//   up to two batches ahead of the GPU without waiting.
// - resident: the split lives on the device. At each epoch's start the host writes the samples in that
//   epoch's order and uploads them in one copy, so every batch is a contiguous range of rows: one
//   device-to-device copy, no per-batch host work and no index-gather kernel. The price is one upload
//   per epoch (188 MB for Fashion-MNIST's training images, milliseconds against an epoch of seconds);
//   without shuffling the split is uploaded once. Needs the split's size in device memory.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dyngrad/core/device.h"
#include "dyngrad/core/tensor.h"

namespace dyngrad {

// One split of a classification data set, on the CPU.
struct Dataset {
    Tensor images;  // (N,C,H,W) float32
    Tensor labels;  // (N) int64

    std::int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
    // A copy of the first min(n, size()) samples.
    Dataset head(std::int64_t n) const;
};

// Pixels become (byte / 255 - mean) / stddev.
struct Normalization {
    double mean = 0.0;
    double stddev = 1.0;
};

constexpr const char* kDefaultMnistDirectory = "/usr/share/datasets/fashion-mnist";  // Debian's dataset-fashion-mnist
constexpr std::int64_t kMnistClasses = 10;

struct MnistData {
    Dataset train;  // images (N,1,H,W), e.g. 60000 of 28×28
    Dataset test;
    Normalization normalization;  // of the training pixels, applied to both splits
};

// Reads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte
// from `directory`, each plain or gzip-compressed (the name with ".gz"). Throws IoError naming the file:
// a missing file, any read_idx() problem, image and label counts that differ, test images of another size
// than the training ones, a label outside 0..9.
MnistData load_mnist(const std::string& directory = kDefaultMnistDirectory);

struct LoaderOptions {
    std::int64_t batch_size = 64;
    bool shuffle = true;         // false: the data set's own order every epoch (evaluation)
    std::uint64_t seed = 0;
    Device device = Device::cpu();
    bool resident = false;       // CUDA devices: keep the split on the device (see the top of this file)
    // Data parallelism (distributed/ddp.h): this loader serves positions shard, shard + num_shards, ... of each epoch's
    // order, n / num_shards samples each (the last n mod num_shards positions sit that epoch out), so every rank
    // gets a disjoint part of the same permutation and runs the same number of batches.
    std::int64_t num_shards = 1;
    std::int64_t shard = 0;
};

struct Batch {
    Tensor images;  // (B,C,H,W) on the loader's device; B = batch_size except for an epoch's last batch
    Tensor labels;  // (B) int64
    std::int64_t index = 0;  // position of the batch within its epoch

    std::int64_t size() const { return labels.size(0); }
};

class BatchLoader {
public:
    // Starts epoch 0. Throws ValueError for a batch size below 1, ShapeError/DTypeError for a Dataset
    // whose tensors do not fit together, DeviceError for a CUDA device this build or machine lacks.
    BatchLoader(const Dataset& data, const LoaderOptions& options);
    ~BatchLoader();
    BatchLoader(const BatchLoader&) = delete;
    BatchLoader& operator=(const BatchLoader&) = delete;

    // Rewinds to the first batch of `epoch`, whose order is the permutation drawn from (seed, epoch).
    void start_epoch(std::int64_t epoch);
    // Fills `batch` with the next batch of the current epoch; false (and `batch` untouched) after the last.
    bool next(Batch& batch);

    std::int64_t batches_per_epoch() const;
    // Samples this loader serves per epoch (the data set's size, or this shard's part of it).
    std::int64_t size() const { return static_cast<std::int64_t>(order_.size()); }
    // The current epoch's sample order (indices into the data set).
    const std::vector<std::int64_t>& order() const { return order_; }

private:
    struct Staging;  // pinned buffers and their events (streamed CUDA batches)

    Dataset data_;
    LoaderOptions options_;
    std::vector<std::int64_t> order_;
    std::int64_t cursor_ = 0;       // position in order_ of the next batch's first sample
    std::int64_t batch_index_ = 0;  // within the epoch
    Dataset resident_;              // resident mode: the epoch's samples in order_, on the device
    std::unique_ptr<Staging> staging_;
};

// Row order of epoch `epoch` for `n` samples: a Fisher-Yates shuffle driven by a mt19937_64 seeded from
// (seed, epoch) through std::seed_seq; both are fully specified by the standard, so the order is the same
// with every compiler and standard library. ValueError for a negative n.
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

// ---- any tensors: a user data set, a collate step, background prefetch ----

// A data set of `size()` samples; get(i) returns sample i as CPU tensors (e.g. {features, target}), the same
// number of them with the same shapes and dtypes for every i under the default collate. get() is called
// from the loader's worker thread (one at a time), so it must not touch state the training thread changes.
class SampleDataset {
public:
    virtual ~SampleDataset() = default;
    virtual std::int64_t size() const = 0;
    virtual std::vector<Tensor> get(std::int64_t index) const = 0;
};

// Tensors sharing a first (sample) dimension, on the CPU: sample i is row i of each (a (N) tensor gives a 0-d
// row). ValueError for no or undefined tensors, ShapeError for first dimensions that differ (or rank 0),
// DeviceError for a tensor that is not on the CPU.
class TensorDataset : public SampleDataset {
public:
    explicit TensorDataset(std::vector<Tensor> tensors);
    std::int64_t size() const override;
    std::vector<Tensor> get(std::int64_t index) const override;  // copies; IndexError out of range
    const std::vector<Tensor>& tensors() const { return tensors_; }

private:
    std::vector<Tensor> tensors_;
};

// Makes one batch from its samples (in batch order). The default, stack_samples, stacks field f of every
// sample along a new first dimension: samples of shape S give a batch (B, S...). ShapeError/DTypeError/
// DeviceError name the sample and field that differ from sample 0 or is not on the CPU.
using Collate = std::function<std::vector<Tensor>(const std::vector<std::vector<Tensor>>& samples)>;
std::vector<Tensor> stack_samples(const std::vector<std::vector<Tensor>>& samples);

struct DataLoaderOptions {
    std::int64_t batch_size = 1;  // PyTorch's defaults: batches of one, in the data set's order
    bool shuffle = false;         // true: the order of epoch e is epoch_permutation(size, seed, e); false: 0, 1, 2, ...
    std::uint64_t seed = 0;
    bool drop_last = false;  // leave out an epoch's last batch when it is partial
    // This loader sees positions shard, shard + num_shards, ... of each epoch's order (one loader per
    // process or device; together the shards cover every sample once).
    std::int64_t num_shards = 1;
    std::int64_t shard = 0;
    // Every shard takes n / num_shards samples (rounded down): the last n mod num_shards positions of each
    // epoch's order are left out of that epoch (a different few each epoch), so that every rank of a
    // data-parallel job (distributed/ddp.h: shard = rank, num_shards = world size) runs the same number of steps.
    bool even_shards = false;
    // Batches a worker thread prepares ahead of next() (get, collate and, for a GPU, the copy into pinned host
    // memory); 0: everything on the caller's thread.
    std::int64_t prefetch = 2;
    Device device = Device::cpu();  // a CUDA device: batches are copied there on dyngrad's stream
    Collate collate = {};           // empty: stack_samples
};

// Walks a SampleDataset in batches. On a CUDA device next() only queues the copies of a batch the worker
// already staged in pinned memory and returns: the GPU never waits on the host's get() and collate, and a
// staging buffer is reused only after the copy that read it has run (an event per buffer). An exception
// thrown by get() or collate on the worker reaches the caller from next(), unchanged.
class DataLoader {
public:
    // ValueError for a null data set or bad options; DeviceError for a CUDA device this build or machine lacks.
    DataLoader(std::shared_ptr<const SampleDataset> data, DataLoaderOptions options);
    ~DataLoader();
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    // Rewinds to the first batch of `epoch` (the constructor starts epoch 0).
    void start_epoch(std::int64_t epoch);
    // Fills `batch` with the next batch of the current epoch (on the loader's device); false after the last.
    bool next(std::vector<Tensor>& batch);

    std::int64_t batches_per_epoch() const;
    // This shard's sample order in the current epoch (indices into the data set).
    const std::vector<std::int64_t>& order() const { return order_; }

private:
    struct Worker;  // the prefetch thread, its queue and the pinned staging buffers (nn/dataset.cpp)

    std::vector<Tensor> make_batch(std::int64_t batch_index) const;

    std::shared_ptr<const SampleDataset> data_;
    DataLoaderOptions options_;
    std::vector<std::int64_t> order_;
    std::int64_t next_batch_ = 0;
    std::unique_ptr<Worker> worker_;
};

}  // namespace dyngrad
