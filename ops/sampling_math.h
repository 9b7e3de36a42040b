// The formulas both backends of ops/sampling share (ops/sampling.cpp, ops/sampling.cu), so that the CPU and the GPU
// sort into the same order and draw the same multinomial samples, bit for bit.
//
// Sort order: each value becomes an unsigned key whose integer order is the sort order (NaN above +inf, -0.0 equal
// to +0.0; descending: the complement), and ties go to the lower index. The CPU sorts (key, index) pairs, the GPU
// runs a stable CUB radix sort of keys with the indices as values: the same permutation.
//
// Multinomial: sample s of row r reads the uniform u = math::dropout_uniform(seed, r·num_samples + s)
// (ops/dropout_mask.h: SplitMix64, integer operations and one exact conversion) and takes the first category whose
// running sum of weights (in double, left to right) exceeds u·total. Without replacement a drawn category's weight
// becomes 0 and the next sample sums the rest again. Only additions, one product and comparisons, each in one fixed
// order: no fused multiply-add can change a result, and the host and the device agree.
#pragma once
#include <cstdint>
#include <cstring>

#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/host_device.h"

namespace dyngrad::math {

// Unsigned keys in sort order: float -> uint32, double -> uint64.
template <typename Real> struct SortKeyOf;
template <> struct SortKeyOf<float> { using type = std::uint32_t; };
template <> struct SortKeyOf<double> { using type = std::uint64_t; };
template <typename Real> using sort_key_t = typename SortKeyOf<Real>::type;

template <typename Real>
DG_HOST_DEVICE sort_key_t<Real> sort_key(Real value, bool descending) {
    using Key = sort_key_t<Real>;
    constexpr Key sign = Key(1) << (sizeof(Key) * 8 - 1);
    Key bits = 0;
    if (value != value) {
        bits = ~Key(0) >> 1;  // every NaN as the largest positive NaN: after +inf, equal to each other
    } else if (value != Real(0)) {
        std::memcpy(&bits, &value, sizeof bits);
    }  // else both zeros are +0.0
    // IEEE order to unsigned order: negatives reversed below the positives.
    const Key key = (bits & sign) ? ~bits : (bits | sign);
    return descending ? ~key : key;
}

// Why a row of multinomial weights is refused (0: it is fine); the device error record's value.
enum class WeightProblem : int { none = 0, negative = 1, not_a_number = 2, infinite = 3, zero_sum = 4, too_few = 5 };

// Running sums of one row's weights (in double, left to right) into cdf[0..count); the first bad weight's problem
// and column in *column. The total is cdf[count - 1].
template <typename T>
DG_HOST_DEVICE WeightProblem weight_running_sums(const T* weights, std::int64_t count, double* cdf,
                                                 std::int64_t* column) {
    double total = 0;
    for (std::int64_t i = 0; i < count; ++i) {
        const double w = static_cast<double>(weights[i]);
        *column = i;
        if (w != w) return WeightProblem::not_a_number;
        if (w < 0) return WeightProblem::negative;
        if (w - w != 0) return WeightProblem::infinite;  // inf - inf is NaN
        total += w;
        cdf[i] = total;
    }
    *column = count;
    return count > 0 && total > 0 ? WeightProblem::none : WeightProblem::zero_sum;
}

// The uniform of sample `sample` of row `row`.
DG_HOST_DEVICE double multinomial_uniform(std::uint64_t seed, std::int64_t row, std::int64_t sample,
                                          std::int64_t num_samples) {
    return dropout_uniform(seed, static_cast<std::uint64_t>(row) * static_cast<std::uint64_t>(num_samples) +
                                     static_cast<std::uint64_t>(sample));
}

// With replacement: the first category whose running sum exceeds u·total (a binary search of the running sums).
// u < 1 keeps u·total below the total; the last category with weight is the guard all the same.
DG_HOST_DEVICE std::int64_t draw_from_running_sums(const double* cdf, std::int64_t count, double u) {
    const double target = u * cdf[count - 1];
    std::int64_t low = 0, high = count;  // the answer lies in [low, high]
    while (low < high) {
        const std::int64_t mid = low + (high - low) / 2;
        if (cdf[mid] > target) high = mid;
        else low = mid + 1;
    }
    if (low < count) return low;
    while (low > 0 && cdf[low - 1] == (low > 1 ? cdf[low - 2] : 0.0)) --low;  // the last category with weight
    return low - 1;
}

// Without replacement: `remaining` holds the row's weights in double (drawn ones become 0); draws num_samples
// categories into out. The caller has checked that the row has num_samples non-zero weights.
DG_HOST_DEVICE void draw_without_replacement(double* remaining, std::int64_t count, std::uint64_t seed,
                                             std::int64_t row, std::int64_t num_samples, std::int64_t* out) {
    for (std::int64_t s = 0; s < num_samples; ++s) {
        double total = 0;
        for (std::int64_t i = 0; i < count; ++i) total += remaining[i];
        const double target = multinomial_uniform(seed, row, s, num_samples) * total;
        std::int64_t chosen = -1, last_positive = -1;
        double sum = 0;
        for (std::int64_t i = 0; i < count && chosen < 0; ++i) {
            if (remaining[i] == 0) continue;
            last_positive = i;
            sum += remaining[i];
            if (sum > target) chosen = i;
        }
        if (chosen < 0) chosen = last_positive;  // not reached: target < total (see draw_from_running_sums)
        out[s] = chosen;
        remaining[chosen] = 0;
    }
}

}  // namespace dyngrad::math
