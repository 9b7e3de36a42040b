// Checked size arithmetic: the one place where element counts, strides, byte sizes, output-size formulas
// and double -> integer conversions are computed, so that a huge or extreme dimension, attribute or value
// becomes a typed error naming what was being computed instead of a wrapped number (a 0-element tensor,
// a heap overflow, INT64_MIN).
//
// The invariant it protects: every Tensor's shape has non-negative dims, the product of its non-zero dims
// fits int64 and so does its byte size (Tensor::empty checks both through checked_numel/checked_bytes).
// Any product of some of ONE valid tensor's dims therefore fits too; arithmetic that combines dims of
// several tensors, or dims with attributes (padding, stride, start + length, sums over inputs), goes
// through the functions below. Plain host functions: callable from .cpp files and the host code of .cu files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "dyngrad/core/shape.h"

namespace dyngrad {

namespace detail {
// Out of line, so that the checks inline to an overflow test and a branch.
[[noreturn]] void throw_overflow(std::string_view what, std::int64_t a, char op, std::int64_t b);
[[noreturn]] void throw_not_integral(std::string_view what, double value, std::string_view target);
[[noreturn]] void throw_narrowing(std::string_view what, std::int64_t value, std::int64_t low, std::int64_t high);
}  // namespace detail

// a + b, a - b, a·b in int64; ShapeError "<what>: a * b overflows int64" when the result does not fit.
// `what` names the op and the quantity, e.g. "conv2d: padded height".
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
    std::int64_t out;
    if (__builtin_add_overflow(a, b, &out)) [[unlikely]] detail::throw_overflow(what, a, '+', b);
    return out;
}
inline std::int64_t checked_sub(std::int64_t a, std::int64_t b, std::string_view what) {
    std::int64_t out;
    if (__builtin_sub_overflow(a, b, &out)) [[unlikely]] detail::throw_overflow(what, a, '-', b);
    return out;
}
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
    std::int64_t out;
    if (__builtin_mul_overflow(a, b, &out)) [[unlikely]] detail::throw_overflow(what, a, '*', b);
    return out;
}

// The element count of `shape`, or -1 when a dim is negative or the count does not fit (see below); for
// callers that compose their message only on failure.
std::int64_t try_numel(const Shape& shape) noexcept;
// The element count of `shape`: ValueError for a negative dimension, ShapeError when the product of its
// non-zero dimensions does not fit int64 (so a (0, 2^40, 2^40) shape, whose strides overflow, is refused
// like a (2^40, 2^40, 2^40) one). Messages start with `what`.
std::int64_t checked_numel(const Shape& shape, std::string_view what);

// A reshape target with at most one -1 resolved against `numel` elements of shape `from` (reshape's and
// Tensor::reshaped's one rule): ValueError for two -1s or another negative dim, ShapeError when the known dims
// do not divide `numel` (or multiply to another count). Messages start with `what` when it is not empty.
Shape resolve_reshape(const Shape& from, std::int64_t numel, const Shape& target, std::string_view what = {});

// Bytes of `numel` elements of `width` bytes each; ShapeError when they do not fit int64.
std::size_t checked_bytes(std::int64_t numel, std::size_t width, std::string_view what);

// A double that must be an integer-valued int64 (a count, an index, an int64 tensor element): ValueError
// naming `what` and the value for NaN, ±inf and values outside int64's range. The fractional part is
// dropped (C++'s conversion toward zero), as PyTorch does for float -> int64.
std::int64_t checked_to_int64(double value, std::string_view what);

// Output length of a sliding window along one axis (convolution, pooling):
// floor((size + 2·padding − window) / stride) + 1 with window = dilation·(kernel − 1) + 1, exact for every
// size, padding >= 0 and kernel, stride, dilation >= 1 (stride INT64_MAX gives 1; a kernel of extent 1 makes
// any dilation harmless). ShapeError starting with `axis` ("height") when the window is larger than the
// padded input, when size + padding does not fit int64 (the kernels index within it), or when the output
// length does not.
std::int64_t sliding_window_output(std::int64_t size, std::int64_t kernel, std::int64_t stride, std::int64_t padding,
                                   std::int64_t dilation, std::string_view axis);

// `value` as the narrower integer type To (e.g. int for cuBLAS and cuDNN arguments); ShapeError when it
// does not fit.
template <typename To>
To checked_narrow(std::int64_t value, std::string_view what) {
    constexpr auto low = static_cast<std::int64_t>(std::numeric_limits<To>::min());
    constexpr auto high = static_cast<std::int64_t>(std::numeric_limits<To>::max());
    if (value < low || value > high) [[unlikely]] detail::throw_narrowing(what, value, low, high);
    return static_cast<To>(value);
}

}  // namespace dyngrad
