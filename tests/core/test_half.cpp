// bfloat16 / float16 storage: the host conversions (core/half.h) against independent references, and the
// tensor-level paths that use them (construction, fill, to(DType), safetensors).
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {
// bfloat16 is float's upper half: round-to-nearest-even on float's bits (the usual bit trick; NaN aside).
std::uint16_t bf16_reference(float x) {
    const auto u = std::bit_cast<std::uint32_t>(x);
    return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
}  // namespace

TEST_CASE("half: every finite bit pattern round-trips exactly", "[half]") {
    for (const HalfFormat format : {kBFloat16Format, kFloat16Format}) {
        for (std::uint32_t b = 0; b < 65536; ++b) {
            const auto bits = static_cast<std::uint16_t>(b);
            const double value = half_bits_to_double(bits, format);
            if (std::isnan(value)) {
                REQUIRE(std::isnan(half_bits_to_double(round_to_half_bits(value, format), format)));
                continue;
            }
            REQUIRE(round_to_half_bits(value, format) == bits);
        }
    }
}

TEST_CASE("half: bfloat16 rounding matches the float bit trick", "[half]") {
    std::mt19937 gen(std::random_device{}());
    std::uniform_int_distribution<std::uint32_t> any_bits;
    int checked = 0;
    for (int i = 0; i < 200000; ++i) {
        const float x = std::bit_cast<float>(any_bits(gen));
        if (std::isnan(x)) continue;
        REQUIRE(to_bfloat16(x).bits == bf16_reference(x));
        ++checked;
    }
    REQUIRE(checked > 100000);
}

TEST_CASE("half: float16 known values, ties to even, overflow and subnormals", "[half]") {
    CHECK(to_float16(1.0).bits == 0x3C00);
    CHECK(to_float16(-2.0).bits == 0xC000);
    CHECK(to_float16(65504.0).bits == 0x7BFF);                     // largest finite
    CHECK(to_float16(65519.99).bits == 0x7BFF);                    // below the halfway point to 2^16
    CHECK(to_float16(65520.0).bits == 0x7C00);                     // halfway rounds to even: infinity
    CHECK(to_float16(1.0 + std::ldexp(1.0, -11)).bits == 0x3C00);  // tie between 1 and 1 + 2^-10: even
    CHECK(to_float16(1.0 + 3 * std::ldexp(1.0, -11)).bits == 0x3C02);
    CHECK(to_float16(std::ldexp(1.0, -24)).bits == 0x0001);        // smallest subnormal
    CHECK(to_float16(std::ldexp(1.0, -25)).bits == 0x0000);        // its half ties to even zero
    CHECK(to_float16(std::ldexp(1.5, -25)).bits == 0x0001);
    CHECK(to_float16(-0.0).bits == 0x8000);
    CHECK(to_bfloat16(std::numeric_limits<double>::infinity()).bits == 0x7F80);
    CHECK(std::isnan(to_double(to_float16(std::nan("")))));
#if defined(__FLT16_MAX__)
    // The compiler's own double → _Float16 conversion as the reference, on random doubles across the range.
    std::mt19937_64 gen(std::random_device{}());
    std::uniform_real_distribution<double> exponent(-27.0, 17.0);
    for (int i = 0; i < 200000; ++i) {
        const double x = std::ldexp(std::uniform_real_distribution<double>(-1, 1)(gen), static_cast<int>(exponent(gen)));
        const auto reference = static_cast<_Float16>(x);
        std::uint16_t bits;
        std::memcpy(&bits, &reference, 2);
        REQUIRE(to_float16(x).bits == bits);
    }
#endif
}

TEST_CASE("half: tensors store, fill and convert bf16 and f16", "[half]") {
    Generator gen(static_cast<std::uint64_t>(std::random_device{}()));
    const Tensor x = Tensor::normal({7, 5}, 0.0, 3.0, gen, DType::f64);
    for (const DType reduced : {DType::bf16, DType::f16}) {
        const Tensor r = x.to(reduced);
        REQUIRE(r.dtype() == reduced);
        REQUIRE(r.nbytes() == 70);
        const double tolerance = reduced == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
        const std::vector<double> back = r.to(DType::f64).to_vector();
        const std::vector<double> original = x.to_vector();
        for (std::size_t i = 0; i < back.size(); ++i)
            REQUIRE(std::fabs(back[i] - original[i]) <= tolerance * std::fabs(original[i]));
        // Converting the rounded values again changes nothing.
        REQUIRE(r.to(DType::f32).to(reduced).to(DType::f64).to_vector() == back);
        const Tensor filled = Tensor::full({3}, 0.1, reduced);
        const double expected = reduced == DType::bf16 ? to_double(to_bfloat16(0.1)) : to_double(to_float16(0.1));
        for (double v : filled.to_vector()) REQUIRE(v == expected);
    }
}
