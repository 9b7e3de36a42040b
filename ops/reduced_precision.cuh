// The GPU element types of every dyngrad dtype, for CUDA kernels that compute in bf16/f16 with f32 accumulation.
//
// A kernel templated on T loads T, converts once to acc_t<T> (float for __nv_bfloat16 and __half, T itself for float
// and double), computes there, and rounds once on store with from_acc<T> (round to nearest even). So a native
// reduced-precision kernel differs from its f32 kernel only in the load and the store, and its result is the f32
// result rounded once, never a chain of bf16 roundings.
//
// Interface shared with the GEMM/conv/attention kernels (branch amp-tc): keep it stable.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string_view>
#include <type_traits>

#include "dyngrad/core/dtype.h"
#include "dyngrad/core/error.h"
#include "dyngrad/cuda/element_convert.cuh"  // convert_element<To>(From), dispatch_gpu_floating
#include "dyngrad/ops/host_device.h"

namespace dyngrad {

template <typename T>
inline constexpr bool is_reduced_gpu_type_v = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// Tensor::data<T>() with the GPU element types.
template <> constexpr DType dtype_of<__nv_bfloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<__half>() { return DType::f16; }

// The type a kernel of element type T computes and accumulates in.
template <typename T>
using acc_t = std::conditional_t<is_reduced_gpu_type_v<T>, float, T>;

// T -> acc_t<T>: exact (every bf16/f16 value is a float).
template <typename T>
DG_HOST_DEVICE acc_t<T> to_acc(T x) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __bfloat162float(x);
    else if constexpr (std::is_same_v<T, __half>)
        return __half2float(x);
    else
        return x;
}

// acc_t<T> -> T, rounding to nearest even (beyond the largest finite value: infinity, as IEEE).
template <typename T>
DG_HOST_DEVICE T from_acc(acc_t<T> x) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __float2bfloat16_rn(x);
    else if constexpr (std::is_same_v<T, __half>)
        return __float2half_rn(x);
    else
        return x;
}

// The CUDA element type of a dyngrad dtype (cuBLAS/cuDNN descriptors).
template <typename T>
constexpr cudaDataType_t cuda_data_type() {
    if constexpr (std::is_same_v<T, float>)
        return CUDA_R_32F;
    else if constexpr (std::is_same_v<T, double>)
        return CUDA_R_64F;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return CUDA_R_16BF;
    else {
        static_assert(std::is_same_v<T, __half>, "cuda_data_type: not a floating GPU element type");
        return CUDA_R_16F;
    }
}

}  // namespace dyngrad
