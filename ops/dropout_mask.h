// Dropout's keep mask as a pure function of (seed, element index), shared by the Eigen kernels
// (ops/dropout.cpp), the CUDA kernels (ops/dropout.cu) and the fusion compiler's generated kernels (the region
// below is embedded in the library: cmake/embed_source.cmake, ops/fusion_source.cpp): every backend and every
// fused kernel drops exactly the same elements, the backward recomputes the mask instead of saving it, and no
// generator state is carried between calls. Element i draws the (i+1)-th output of a SplitMix64 stream seeded
// with `seed` (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014); only integer
// operations and one exact conversion are involved, so host and device agree bit for bit.
#pragma once
#include <cstdint>

#include "dyngrad/ops/host_device.h"

namespace dyngrad::math {

// The region compiled by NVRTC too has no std:: types: unsigned long long is std::uint64_t on every platform built.
static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));

// fusion-source-begin: from here to fusion-source-end, the text is also compiled by NVRTC into the fusion compiler's
// generated kernels (after ops/elementwise_math.h's region). Only DG_HOST_DEVICE functions: no std::, no dyngrad types.

constexpr unsigned long long kSplitMixGamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd

// SplitMix64's output function: a bijective 64-bit mix.
DG_HOST_DEVICE unsigned long long splitmix64_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) on the 2^-53 grid: the top 53 bits of the mixed counter.
DG_HOST_DEVICE double dropout_uniform(unsigned long long seed, unsigned long long index) {
    const unsigned long long bits = splitmix64_mix(seed + (index + 1) * kSplitMixGamma);
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// The mask seed of the n-th draw (n from 1) of a seed stream seeded with `seed` (DropoutSeeds, nn's Dropout):
// the n-th output of a SplitMix64 stream, so distinct draws get unrelated masks.
DG_HOST_DEVICE unsigned long long dropout_draw_seed(unsigned long long seed, unsigned long long n) {
    return splitmix64_mix(seed + n * kSplitMixGamma);
}

// Element `index` survives dropout with drop probability p (probability 1 - p).
DG_HOST_DEVICE bool dropout_keep(unsigned long long seed, unsigned long long index, double p) {
    return dropout_uniform(seed, index) >= p;
}

// Eval, or p = 0: dropout is the identity (its backward returns dy itself).
DG_HOST_DEVICE bool dropout_is_identity(bool training, double p) { return !training || p == 0.0; }

// A fused dropout's arguments (ops/fusion_launch.cpp): p, and the mask seed when the node has no seed input.
struct DropoutScalars {
    double p;
    unsigned long long seed;
};

// y = x · mask in the compute type T (float for f32/bf16/f16, double for f64), as the dropout kernels compute it
// before rounding to the element type: the kept elements times 1/(1 − p), the dropped ones times 0.
template <typename T>
DG_HOST_DEVICE T dropout_apply(T x, unsigned long long seed, unsigned long long index, double p) {
    return x * (dropout_keep(seed, index, p) ? static_cast<T>(1.0 / (1.0 - p)) : T(0));
}

// fusion-source-end

}  // namespace dyngrad::math
