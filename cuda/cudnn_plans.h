// Internal (CUDA translation units only): RAII cuDNN descriptors and helpers for the cuDNN plans that
// ops/conv.cu, ops/pool.cu and ops/rnn.cu keep in plan caches (cuda/plan_cache.h).
#pragma once
#include <cstdint>

#include <cudnn.h>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/handle.h"
#include "dyngrad/cuda/plan_cache.h"

namespace dyngrad::cuda {

// Owns one cuDNN descriptor, created on construction (CudaError when cuDNN cannot); UniqueHandle's
// ownership rules otherwise.
template <typename T, cudnnStatus_t (*create)(T*), cudnnStatus_t (*destroy)(T)>
class CudnnDescriptor : public UniqueHandle<T, destroy> {
public:
    CudnnDescriptor() : UniqueHandle<T, destroy>(created()) {}

private:
    static T created() {
        T desc = nullptr;
        DG_CUDNN_CHECK(create(&desc));
        return desc;
    }
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
        case DType::bf16: return CUDNN_DATA_BFLOAT16;
        case DType::f16: return CUDNN_DATA_HALF;
        default: break;
    }
    throw DTypeError(str(what, ": expects float32, float64, bfloat16 or float16, got ", dtype_name(dtype)));
}

// The type cuDNN computes (accumulates) in for data of `dtype`: float for bfloat16/float16 (tensor cores with
// float accumulation, as the GEMMs), the data's own type otherwise.
inline cudnnDataType_t cudnn_compute_dtype(DType dtype, const char* what) {
    return is_reduced_precision(dtype) ? CUDNN_DATA_FLOAT : cudnn_dtype(dtype, what);
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

// cuDNN's alpha/beta scaling factors: double for double data, float for every other (float, bfloat16, float16).
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

}  // namespace dyngrad::cuda
