// Internal (CUDA translation units only): RAII cuDNN descriptors and the shape-keyed plan cache that
// cuda/conv.cu and cuda/pool.cu keep their descriptors (and chosen algorithms) in, so an op builds them
// once per shape and its later calls only look them up.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <cudnn.h>

#include "dyngrad/cuda/context.h"

namespace dyngrad::cuda {

// Owns one cuDNN descriptor. Non-copyable; a move nulls the source; the destructor ignores the status
// because it must not throw and has no one to report to.
template <typename T, cudnnStatus_t (*create)(T*), cudnnStatus_t (*destroy)(T)>
class CudnnDescriptor {
public:
    CudnnDescriptor() { DG_CUDNN_CHECK(create(&desc_)); }
    ~CudnnDescriptor() {
        if (desc_) static_cast<void>(destroy(desc_));
    }
    CudnnDescriptor(CudnnDescriptor&& other) noexcept : desc_(std::exchange(other.desc_, nullptr)) {}
    CudnnDescriptor& operator=(CudnnDescriptor&& other) noexcept {
        if (this != &other) {
            if (desc_) static_cast<void>(destroy(desc_));
            desc_ = std::exchange(other.desc_, nullptr);
        }
        return *this;
    }
    CudnnDescriptor(const CudnnDescriptor&) = delete;
    CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

    T get() const { return desc_; }

private:
    T desc_ = nullptr;
};

using TensorDescriptor =
    CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor =
    CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor = CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                              cudnnDestroyConvolutionDescriptor>;
using PoolingDescriptor =
    CudnnDescriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

// cuDNN's data type for a float dtype (DTypeError otherwise; `what` names the op).
inline cudnnDataType_t cudnn_dtype(DType dtype, const char* what) {
    switch (dtype) {
        case DType::f32: return CUDNN_DATA_FLOAT;
        case DType::f64: return CUDNN_DATA_DOUBLE;
        default: break;
    }
    throw DTypeError(str(what, ": expects float32 or float64, got ", dtype_name(dtype)));
}

// cuDNN takes int dimensions.
inline int cudnn_dim(std::int64_t value, const char* what) {
    if (value > INT32_MAX) throw ValueError(str(what, ": dimension ", value, " exceeds the int range of cuDNN"));
    return static_cast<int>(value);
}

// cuDNN takes int strides and dilations, but valid extremes exceed that range: an axis with one output
// position reads one window whatever the stride (stride INT64_MAX on a small input gives output size 1, as
// the shape rule computes), and a kernel of extent 1 spans one element whatever the dilation. Both become
// the smallest value with the same result, so such a key also shares the plan of its ordinary twin.
inline void cudnn_window_args(std::int64_t size, std::int64_t kernel, std::int64_t padding, std::int64_t& stride,
                              std::int64_t& dilation) {
    if (kernel == 1) dilation = 1;
    // (size + 2·padding) − window, exact in 128 bits (the shape rule already checked it is >= 0).
    const __int128 span = static_cast<__int128>(size) + 2 * static_cast<__int128>(padding) -
                          (static_cast<__int128>(dilation) * (kernel - 1) + 1);
    if (span < stride) stride = static_cast<std::int64_t>(span) + 1;
}

// cuDNN's alpha/beta scaling factors: float for float data, double for double data.
class Scaling {
public:
    explicit Scaling(DType dtype) : f64_(dtype == DType::f64) {}
    const void* one() const { return f64_ ? static_cast<const void*>(&one64_) : &one32_; }
    const void* zero() const { return f64_ ? static_cast<const void*>(&zero64_) : &zero32_; }

private:
    bool f64_;
    float one32_ = 1.0f, zero32_ = 0.0f;
    double one64_ = 1.0, zero64_ = 0.0;
};

// Plans (descriptors, chosen algorithms) by shape key. A plan is immutable once built, or guards its own
// lazily filled parts; callers hold a shared_ptr, so eviction never frees a plan in use. When the cache is
// full it is emptied: workloads cycle through few shapes, and a rebuild costs one first call.
template <typename Key, typename Plan>
class PlanCache {
public:
    static constexpr std::size_t kCapacity = 256;

    // The plan for `key`; on a miss `make()` builds it (host-side descriptor setup, under the lock).
    template <typename Make>
    std::shared_ptr<Plan> get(const Key& key, Make&& make) {
        const std::lock_guard lock(mutex_);
        if (const auto found = plans_.find(key); found != plans_.end()) return found->second;
        if (plans_.size() >= kCapacity) plans_.clear();
        std::shared_ptr<Plan> plan = make();
        plans_.emplace(key, plan);
        return plan;
    }

private:
    std::mutex mutex_;
    std::map<Key, std::shared_ptr<Plan>> plans_;
};

}  // namespace dyngrad::cuda
