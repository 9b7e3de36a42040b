// Tensor: a cheap-to-copy handle to contiguous row-major storage on one device.
// Copies of a Tensor share storage; clone() makes an independent copy.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <random>
#include <source_location>
#include <string>
#include <vector>

#include "dyngrad/core/device.h"
#include "dyngrad/core/dtype.h"
#include "dyngrad/core/shape.h"

namespace dyngrad {

// A block of bytes on one device; freed through that device's allocator.
class Storage {
public:
    Storage(std::size_t bytes, Device device);
    // Memory owned by someone else (a NumPy array, a PyTorch tensor through DLPack): dyngrad reads and writes
    // it in place and calls `release` once when the last handle goes, instead of freeing it.
    Storage(void* data, std::size_t bytes, Device device, std::function<void()> release);
    // A window: `bytes` bytes at byte `offset` of `base`'s memory (a window of a window refers to the first base).
    // It keeps `base` alive, reads and writes base's memory wherever that is now, and follows its release and
    // restore (below); its version counter is its own. ValueError when the range exceeds `base`.
    Storage(std::shared_ptr<Storage> base, std::size_t offset, std::size_t bytes);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    // nullptr while released (below). A window asks its base each time: its memory may have moved.
    void* data() const { return base_ ? base_->at(offset_) : data_; }
    std::size_t bytes() const { return bytes_; }
    Device device() const { return device_; }
    bool external() const { return base_ ? base_->external() : static_cast<bool>(release_); }

    // Freeing the memory while handles remain (ZeRO-3 frees a unit's gathered parameters between its forward and
    // its backward while its recorded graph still holds them: PyTorch FSDP's storage resize to 0). Owned memory only
    // (ValueError for external memory and windows). release_memory() hands the bytes back to the device's allocator
    // (no synchronisation: the device allocator is stream-ordered) and data() becomes nullptr; restore_memory()
    // allocates as many bytes on the same device again, contents undefined (the caller refills them). Reading or
    // writing through Tensor::raw_data() / data<T>() in between throws ReleasedMemoryError, for the storage and
    // its windows. Neither bumps the version; each does nothing when the storage is already in that state.
    void release_memory();
    void restore_memory();
    bool resident() const { return base_ ? base_->resident() : !released_; }

    // How many in-place writes this storage has had (Tensor::bump_version). The graph remembers it for the
    // values a backward will read and refuses to run on a value changed since (docs/architecture.md,
    // "In-place writes and the version counter"). Relaxed: it orders nothing, it only has to count.
    std::uint32_t version() const { return version_.load(std::memory_order_relaxed); }
    void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

private:
    void* at(std::size_t offset) const { return data_ ? static_cast<char*>(data_) + offset : nullptr; }

    void* data_ = nullptr;
    std::size_t bytes_ = 0;
    Device device_;
    std::atomic<std::uint32_t> version_{0};
    std::function<void()> release_;  // set for external memory
    std::shared_ptr<Storage> base_;  // set for a window
    std::size_t offset_ = 0;         // a window's first byte in base_
    bool released_ = false;          // release_memory() ran, restore_memory() not yet
};

// Explicit, seeded source of randomness for the random factories.
class Generator {
public:
    explicit Generator(std::uint64_t seed) : engine_(seed) {}
    std::mt19937_64& engine() { return engine_; }

private:
    std::mt19937_64 engine_;
};

class Tensor {
public:
    Tensor() = default;  // undefined: defined() is false

    // Factories. Uninitialised contents for empty(); everything else is filled.
    static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
    static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
    static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
    static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                       Device device = Device::cpu());
    // [start, stop) in steps of `step` (rank 1); an integer range needs DType::i64 (no int overload: ambiguous).
    static Tensor arange(double start, double stop, double step = 1.0, DType dtype = DType::f32,
                         Device device = Device::cpu());
    // `values.size()` must equal numel(shape) (ValueError otherwise).
    static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                              DType dtype = DType::f32, Device device = Device::cpu());
    static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                              Device device = Device::cpu());
    static Tensor from_vector(const std::vector<std::int64_t>& values, const Shape& shape,
                              Device device = Device::cpu());
    // Rank-1 tensor from a list, e.g. Tensor::of({1, 2, 3}).
    static Tensor of(std::initializer_list<double> values, DType dtype = DType::f32);
    static Tensor uniform(const Shape& shape, double low, double high, Generator& gen,
                          DType dtype = DType::f32, Device device = Device::cpu());
    static Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen,
                         DType dtype = DType::f32, Device device = Device::cpu());
    // A tensor over contiguous row-major memory that dyngrad does not own (zero-copy interop, DLPack):
    // `release` runs once when the last handle is gone. ValueError for a null pointer with elements or
    // a pointer not aligned to the element size; `release` runs also when it throws.
    static Tensor from_external(void* data, const Shape& shape, DType dtype, Device device,
                                std::function<void()> release);

    bool defined() const { return storage_ != nullptr; }
    const Shape& shape() const { return shape_; }
    std::size_t rank() const { return shape_.size(); }
    std::int64_t size(std::int64_t axis) const;  // negative axes count from the end
    std::int64_t numel() const { return numel_; }
    DType dtype() const { return dtype_; }
    Device device() const;
    std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }

    // Typed pointer to the first element (on the tensor's device); DTypeError if T does not match.
    // Raw access does not count as an in-place write (kernels write fresh outputs through it); code that
    // writes into an existing tensor's storage through it calls bump_version() (as the optimizers do).
    template <typename T> T* data() const {
        check_dtype(dtype_of<T>());
        return static_cast<T*>(raw_data());
    }
    void* raw_data() const;

    // Element access on CPU tensors (DeviceError otherwise); IndexError when out of range.
    double at(const std::vector<std::int64_t>& index) const;
    void set(const std::vector<std::int64_t>& index, double value);
    double item() const;  // the value of a one-element tensor
    std::vector<double> to_vector() const;  // copies through the CPU when needed

    Tensor to(Device device) const;  // shares storage when already there
    Tensor to(DType dtype) const;    // shares storage when already that dtype
    Tensor to(Device device, DType dtype) const;  // both (PyTorch's x.to(device, dtype)); shares when nothing changes
    Tensor clone() const;
    // Same storage, new shape of the same numel (ShapeError otherwise); one dim may be -1, inferred as reshape
    // infers it (ValueError for two).
    Tensor reshaped(const Shape& shape) const;
    // Indexing, eager (no graph; core/tensor_indexing.cpp: ops/layout.h's rules and errors, no anomaly check). squeeze,
    // unsqueeze and flatten return views (same storage); select and narrow return copies. select(0, -1): the last row.
    Tensor select(std::int64_t axis, std::int64_t index,
                  std::source_location where = std::source_location::current()) const;
    Tensor narrow(std::int64_t axis, std::int64_t start, std::int64_t length,
                  std::source_location where = std::source_location::current()) const;
    Tensor squeeze(std::int64_t axis, std::source_location where = std::source_location::current()) const;
    Tensor unsqueeze(std::int64_t axis, std::source_location where = std::source_location::current()) const;
    // Axes start_axis..end_axis merged into one (torch.Tensor.flatten; the default flattens everything).
    Tensor flatten(std::int64_t start_axis = 0, std::int64_t end_axis = -1,
                   std::source_location where = std::source_location::current()) const;
    // True when both handles point at the same storage.
    bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }
    // A reference to this storage that does not keep it alive, and whether a tensor uses the storage it names:
    // never true of a new storage that took a freed one's address (the reference keeps its control block).
    std::weak_ptr<const Storage> storage_reference() const { return storage_; }
    bool uses_storage(const std::weak_ptr<const Storage>& reference) const {
        return storage_ && !reference.owner_before(storage_) && !storage_.owner_before(reference);
    }
    // True when no other handle holds this storage, so it may be updated in place safely.
    bool owns_storage_exclusively() const { return storage_.use_count() == 1; }
    // True when the storage is external memory (from_external).
    bool external() const { return storage_ && storage_->external(); }
    // Elements [offset, offset + numel(shape)) of this tensor's storage as a tensor of `shape` and this dtype over
    // the same memory: a window of the storage (Storage above), which keeps it alive and follows its
    // release_memory / restore_memory. ValueError when the range is outside the storage.
    Tensor window(std::int64_t offset, const Shape& shape) const;
    // Storage::release_memory / restore_memory / resident of this tensor's storage (ValueError when undefined).
    void release_memory() const;
    void restore_memory() const;
    bool resident() const { return storage_ && storage_->resident(); }

    // In-place writes. Each bumps the storage's version, so a recorded graph whose backward still needs the
    // old contents throws GraphError instead of using the new ones.
    // Copies `src` (same shape; any device; same dtype) into this tensor's storage.
    void copy_from(const Tensor& src);
    void fill(double value);
    // PyTorch's in-place arithmetic on the data (no graph: a Tensor has no history; ops/masked.cpp runs the
    // eager op and copies its result in, so each bumps the version as copy_from does and the engine refuses a
    // backward that needs the old values). The other operand broadcasts to this shape (ShapeError when the
    // result would be larger); a result of another dtype is converted to this one.
    Tensor& add_(const Tensor& other, double alpha = 1.0);
    Tensor& sub_(const Tensor& other, double alpha = 1.0);
    Tensor& mul_(const Tensor& other);
    Tensor& div_(const Tensor& other);
    Tensor& add_(double value);
    Tensor& mul_(double value);
    Tensor& clamp_(std::optional<double> min, std::optional<double> max);
    Tensor& zero_();
    // mask != 0 ? value : this (mask broadcast to this shape, any float or int64 dtype).
    Tensor& masked_fill_(const Tensor& mask, double value);
    // The storage's in-place write count (0 for an undefined tensor), and its bump for writers that go
    // through data<T>() / raw_data(); shared by every handle of the storage.
    std::uint32_t version() const { return storage_ ? storage_->version() : 0; }
    void bump_version() const {
        if (storage_) storage_->bump_version();
    }

private:
    void check_dtype(DType expected) const;
    // ValueError "<what>: tensor is undefined" (rather than describing it as a shape-() tensor).
    void require_defined(const char* what) const;
    std::size_t flat_index(const std::vector<std::int64_t>& index) const;

    std::shared_ptr<Storage> storage_;
    Shape shape_;
    std::int64_t numel_ = 0;
    DType dtype_ = DType::f32;
};

// PyTorch's repr, nested and summarised as torch prints it (core/tensor_print.cpp): "tensor([[1., 2.],\n
// [3., 4.]], dtype=dyngrad.float64)"; the device and a non-default dtype as suffixes, then `extra` ones
// (Python adds requires_grad/grad_fn). A device tensor is copied to the host first (a synchronisation).
std::string format_tensor(const Tensor& tensor, const std::vector<std::string>& extra = {});
std::ostream& operator<<(std::ostream& out, const Tensor& tensor);
// "(64,784) float32 cuda:0"
std::string describe(const Tensor& tensor);

}  // namespace dyngrad
