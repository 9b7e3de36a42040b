// Classification data in memory, and shuffled mini-batches from it on the CPU or a GPU.
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
    std::int64_t size() const { return data_.size(); }
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

}  // namespace dyngrad
