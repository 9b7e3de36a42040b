#include "dyngrad/core/half.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

}  // namespace dyngrad
