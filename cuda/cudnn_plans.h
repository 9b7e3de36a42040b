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
        default: break;
    }
    throw DTypeError(str(what, ": expects float32 or float64, got ", dtype_name(dtype)));
}

// cuDNN takes int dimensions.
inline int cudnn_dim(std::int64_t value, const char* what) {
    if (value > INT32_MAX) throw ValueError(str(what, ": dimension ", value, " exceeds the int range of cuDNN"));
    return static_cast<int>(value);
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

}  // namespace dyngrad::cuda
