// The int64 boundaries the size and overflow tests probe (test_trust_sizes, the hostile catalogue's sizes area).
#pragma once
#include <cstdint>
#include <limits>

namespace dgtest::size_limits {

inline constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
inline constexpr std::int64_t k2p31 = std::int64_t{1} << 31;
inline constexpr std::int64_t k2p32 = std::int64_t{1} << 32;
inline constexpr std::int64_t k2p40 = std::int64_t{1} << 40;
inline constexpr std::int64_t k2p61 = std::int64_t{1} << 61;
inline constexpr std::int64_t k2p62 = std::int64_t{1} << 62;
// 7 · kInverseOf7 = 3·2^64 + 1: a product that wraps to exactly 1 in int64 arithmetic.
inline constexpr std::int64_t kInverseOf7 = 0x6DB6DB6DB6DB6DB7;

}  // namespace dgtest::size_limits
