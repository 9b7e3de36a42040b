// Host-side bfloat16 and float16: 2-byte storage types and their exact conversions. The CPU never computes in
// them (the CPU backend and the verification replay compute in f32/f64 from the rounded values); kernels on the
// GPU use CUDA's __nv_bfloat16 / __half, which have the same bit layout.
#pragma once
#include <cstddef>
#include <cstdint>

namespace dyngrad {

struct bfloat16 {
    std::uint16_t bits = 0;
};
struct float16 {
    std::uint16_t bits = 0;
};

// Binary layout of a 16-bit IEEE-style format: mantissa bits, bias and smallest normal exponent.
struct HalfFormat {
    int mantissa_bits;
    int exponent_bits;
    int bias() const { return (1 << (exponent_bits - 1)) - 1; }
    int min_exponent() const { return 1 - bias(); }
    int max_exponent() const { return bias(); }
};
inline constexpr HalfFormat kBFloat16Format{7, 8};
inline constexpr HalfFormat kFloat16Format{10, 5};

// Round `value` to the nearest representable value of `format` (ties to even; beyond the largest finite value
// rounds to infinity as IEEE does; NaN stays a quiet NaN) and return its bits. Exact from double: no double
// rounding through float.
std::uint16_t round_to_half_bits(double value, HalfFormat format);
// The exact value of `bits` in `format`.
double half_bits_to_double(std::uint16_t bits, HalfFormat format);

// The same conversions for n floats at once (Tensor::to between float32 and bf16/f16 on the CPU, which the
// engine's path through f32 runs for every op): bit for bit what the functions above give, faster.
void floats_to_half_bits(const float* in, std::uint16_t* out, std::size_t n, HalfFormat format);
void half_bits_to_floats(const std::uint16_t* in, float* out, std::size_t n, HalfFormat format);

inline bfloat16 to_bfloat16(double value) { return {round_to_half_bits(value, kBFloat16Format)}; }
inline float16 to_float16(double value) { return {round_to_half_bits(value, kFloat16Format)}; }
inline double to_double(bfloat16 x) { return half_bits_to_double(x.bits, kBFloat16Format); }
inline double to_double(float16 x) { return half_bits_to_double(x.bits, kFloat16Format); }

}  // namespace dyngrad
