// Dropout's keep mask as a pure function of (seed, element index), shared by the Eigen kernels
// (ops/dropout.cpp) and the CUDA kernels (ops/dropout.cu): both backends drop exactly the same elements,
// the backward recomputes the mask instead of saving it, and no generator state is carried between
// calls. Element i draws the (i+1)-th output of a SplitMix64 stream seeded with `seed`
// (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014); only integer
// operations and one exact conversion are involved, so host and device agree bit for bit.
#pragma once
#include <cstdint>

#include "dyngrad/ops/host_device.h"

namespace dyngrad::math {

constexpr std::uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd

// SplitMix64's output function: a bijective 64-bit mix.
DG_HOST_DEVICE std::uint64_t splitmix64_mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) on the 2^-53 grid: the top 53 bits of the mixed counter.
DG_HOST_DEVICE double dropout_uniform(std::uint64_t seed, std::uint64_t index) {
    const std::uint64_t bits = splitmix64_mix(seed + (index + 1) * kSplitMixGamma);
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// The mask seed of the n-th draw (n from 1) of a seed stream seeded with `seed` (DropoutSeeds, nn's Dropout):
// the n-th output of a SplitMix64 stream, so distinct draws get unrelated masks.
DG_HOST_DEVICE std::uint64_t dropout_draw_seed(std::uint64_t seed, std::uint64_t n) {
    return splitmix64_mix(seed + n * kSplitMixGamma);
}

// Element `index` survives dropout with drop probability p (probability 1 - p).
DG_HOST_DEVICE bool dropout_keep(std::uint64_t seed, std::uint64_t index, double p) {
    return dropout_uniform(seed, index) >= p;
}

// Eval, or p = 0: dropout is the identity (its backward returns dy itself).
DG_HOST_DEVICE bool dropout_is_identity(bool training, double p) { return !training || p == 0.0; }

}  // namespace dyngrad::math
