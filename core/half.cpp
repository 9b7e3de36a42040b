#include "dyngrad/core/half.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>

namespace dyngrad {

std::uint16_t round_to_half_bits(double value, HalfFormat f) {
    const int p = f.mantissa_bits;
    const std::uint16_t sign = std::signbit(value) ? static_cast<std::uint16_t>(1u << 15) : 0;
    const std::uint16_t exponent_all_ones = static_cast<std::uint16_t>(((1u << f.exponent_bits) - 1) << p);
    if (std::isnan(value)) return static_cast<std::uint16_t>(sign | exponent_all_ones | (1u << (p - 1)));
    const double magnitude = std::fabs(value);
    if (magnitude == 0) return sign;
    if (std::isinf(magnitude)) return static_cast<std::uint16_t>(sign | exponent_all_ones);
    // The spacing of representable values around `magnitude` (constant below the smallest normal): scaling by
    // a power of two is exact, so nearbyint's ties-to-even rounding is the format's rounding.
    const int exponent = std::max(std::ilogb(magnitude), f.min_exponent());
    const double ulp = std::ldexp(1.0, exponent - p);
    const double rounded = std::nearbyint(magnitude / ulp) * ulp;
    const double largest = std::ldexp(2.0 - std::ldexp(1.0, -p), f.max_exponent());
    if (rounded > largest) return static_cast<std::uint16_t>(sign | exponent_all_ones);
    const int e = std::ilogb(rounded);  // rounding may carry into the next binade
    if (e < f.min_exponent())            // subnormal: exponent field 0
        return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::ldexp(rounded, -(f.min_exponent() - p))));
    const auto mantissa = static_cast<std::uint16_t>(std::ldexp(rounded, p - e) - std::ldexp(1.0, p));
    const auto biased = static_cast<std::uint16_t>((e + f.bias()) << p);
    return static_cast<std::uint16_t>(sign | biased | mantissa);
}

double half_bits_to_double(std::uint16_t bits, HalfFormat f) {
    const int p = f.mantissa_bits;
    const bool negative = (bits >> 15) != 0;
    const unsigned exponent_field = (bits >> p) & ((1u << f.exponent_bits) - 1);
    const unsigned mantissa = bits & ((1u << p) - 1);
    double magnitude;
    if (exponent_field == (1u << f.exponent_bits) - 1)
        magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
    else if (exponent_field == 0)
        magnitude = std::ldexp(static_cast<double>(mantissa), f.min_exponent() - p);
    else
        magnitude = std::ldexp(static_cast<double>(mantissa + (1u << p)), static_cast<int>(exponent_field) - f.bias() - p);
    return negative ? -magnitude : magnitude;
}

namespace {
bool is_format(HalfFormat f, HalfFormat g) {
    return f.mantissa_bits == g.mantissa_bits && f.exponent_bits == g.exponent_bits;
}
}  // namespace

void floats_to_half_bits(const float* in, std::uint16_t* out, std::size_t n, HalfFormat f) {
    const bool bf16 = is_format(f, kBFloat16Format);
    [[maybe_unused]] const bool fp16 = is_format(f, kFloat16Format);
    for (std::size_t i = 0; i < n; ++i) {
        const float x = in[i];
        if (std::isnan(x)) {  // the quiet NaN round_to_half_bits gives, whatever the payload
            out[i] = round_to_half_bits(x, f);
        } else if (bf16) {
            // float's upper half, rounded to nearest even: adding 0x7FFF plus the kept half's lowest bit carries
            // exactly when the dropped half is above the midpoint, or at it with an odd kept half (overflow
            // carries into the infinity pattern, as IEEE rounding does).
            const auto u = std::bit_cast<std::uint32_t>(x);
            out[i] = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        }
#if defined(__FLT16_MAX__)
        else if (fp16) {
            out[i] = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));  // IEEE conversion: one rounding
        }
#endif
        else {
            out[i] = round_to_half_bits(x, f);
        }
    }
}

void half_bits_to_floats(const std::uint16_t* in, float* out, std::size_t n, HalfFormat f) {
    if (is_format(f, kBFloat16Format)) {
        for (std::size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16);
        return;
    }
    // Every value of a 16-bit format is a float: one table of all 65536, built once per format used.
    static const auto fp16_table = [] {
        auto table = std::make_unique<std::array<float, 65536>>();
        for (std::uint32_t b = 0; b < 65536; ++b)
            (*table)[b] = static_cast<float>(half_bits_to_double(static_cast<std::uint16_t>(b), kFloat16Format));
        return table;
    }();
    if (is_format(f, kFloat16Format)) {
        for (std::size_t i = 0; i < n; ++i) out[i] = (*fp16_table)[in[i]];
        return;
    }
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(half_bits_to_double(in[i], f));
}

}  // namespace dyngrad
