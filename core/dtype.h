// Element types. f32/f64 are differentiable; bf16/f16 are differentiable storage types for mixed precision (GPU
// compute with f32 accumulation; the CPU stores and converts them); i64 holds indices such as class labels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dyngrad/core/error.h"
#include "dyngrad/core/half.h"

namespace dyngrad {

enum class DType : std::uint8_t { f32, f64, i64, bf16, f16 };

constexpr std::string_view dtype_name(DType dtype) {
    switch (dtype) {
        case DType::f32: return "float32";
        case DType::f64: return "float64";
        case DType::i64: return "int64";
        case DType::bf16: return "bfloat16";
        case DType::f16: return "float16";
    }
    return "unknown";
}

inline std::size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::f32: return 4;
        case DType::f64: return 8;
        case DType::i64: return 8;
        case DType::bf16: return 2;
        case DType::f16: return 2;
    }
    throw DTypeError(str("unknown dtype code ", static_cast<int>(dtype)));
}

constexpr bool is_reduced_precision(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }
constexpr bool is_floating(DType dtype) {
    return dtype == DType::f32 || dtype == DType::f64 || is_reduced_precision(dtype);
}
// The bit layout of a 16-bit dtype (core/half.h): bf16's, else f16's (callers check is_reduced_precision first).
constexpr HalfFormat half_format(DType dtype) { return dtype == DType::bf16 ? kBFloat16Format : kFloat16Format; }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<float16>() { return DType::f16; }

// Calls fn.template operator()<T>() with T = float or double (the CPU kernels' types; bf16/f16 compute on the GPU
// only); `what` names the caller in the error.
template <typename Fn>
decltype(auto) dispatch_floating(DType dtype, std::string_view what, Fn&& fn) {
    switch (dtype) {
        case DType::f32: return fn.template operator()<float>();
        case DType::f64: return fn.template operator()<double>();
        default: break;
    }
    throw DTypeError(str(what, ": expects float32 or float64, got ", dtype_name(dtype)));
}

}  // namespace dyngrad
