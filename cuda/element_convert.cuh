// The GPU element types of the floating dtypes (float, double, __nv_bfloat16, __half): the dispatch on a dtype, and
// conversion between them rounding once to nearest even. Used by the device runtime's dtype conversion (cuda/copy.cu:
// Tensor::to(DType) on a GPU and the cast op) and re-exported to the kernels by ops/reduced_precision.cuh.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string_view>
#include <type_traits>

#include "dyngrad/core/dtype.h"
#include "dyngrad/core/error.h"

namespace dyngrad {

// Calls fn.template operator()<T>() with T = float, double, __nv_bfloat16 or __half (the GPU element type of a
// floating dtype); `what` names the caller in the DTypeError for any other dtype.
template <typename Fn>
decltype(auto) dispatch_gpu_floating(DType dtype, std::string_view what, Fn&& fn) {
    switch (dtype) {
        case DType::f32: return fn.template operator()<float>();
        case DType::f64: return fn.template operator()<double>();
        case DType::bf16: return fn.template operator()<__nv_bfloat16>();
        case DType::f16: return fn.template operator()<__half>();
        default: break;
    }
    throw DTypeError(str(what, ": expects float32, float64, bfloat16 or float16, got ", dtype_name(dtype)));
}
// From any GPU floating type to any other: double -> bf16/f16 directly (never through float, which would round
// twice); bf16/f16 -> float is exact, so anything else goes through float with the one rounding at the end.
template <typename To, typename From>
__host__ __device__ __forceinline__ To convert_element(From x) {
    if constexpr (std::is_same_v<To, From>) {
        return x;
    } else if constexpr (std::is_same_v<From, double>) {
        if constexpr (std::is_same_v<To, __nv_bfloat16>)
            return __double2bfloat16(x);
        else if constexpr (std::is_same_v<To, __half>)
            return __double2half(x);
        else
            return static_cast<To>(x);
    } else {
        float wide;
        if constexpr (std::is_same_v<From, __nv_bfloat16>)
            wide = __bfloat162float(x);
        else if constexpr (std::is_same_v<From, __half>)
            wide = __half2float(x);
        else
            wide = x;
        if constexpr (std::is_same_v<To, __nv_bfloat16>)
            return __float2bfloat16_rn(wide);
        else if constexpr (std::is_same_v<To, __half>)
            return __float2half_rn(wide);
        else
            return static_cast<To>(wide);
    }
}

}  // namespace dyngrad
