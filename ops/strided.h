// Strided walks shared by the CPU and GPU kernels of permute, expand, where, masked_fill, gather and
// scatter_add (host geometry written once, as the style guide asks): an output of up to kMaxStridedRank
// dims visited in row-major order, with each operand read through its own element strides (0 along an
// axis it is broadcast on, permuted strides for permute). The struct is passed to kernels by value.
#pragma once
#include <cstdint>

#include "dyngrad/core/error.h"
#include "dyngrad/core/shape.h"

#if defined(__CUDACC__)
#define DG_STRIDED_FN __host__ __device__ __forceinline__
#else
#define DG_STRIDED_FN inline
#endif

namespace dyngrad {

// The highest rank these ops take, on every backend alike (their shape rules check it): the walk's sizes
// and strides travel as kernel arguments, so no op uploads geometry to the device.
inline constexpr int kMaxStridedRank = 16;

template <int Operands>
struct StridedWalk {
    int rank = 0;
    std::int64_t sizes[kMaxStridedRank] = {};                 // output dims
    std::int64_t strides[Operands][kMaxStridedRank] = {};     // element strides of each operand per output dim

    // Offsets into each operand of output element i (row-major over `sizes`).
    DG_STRIDED_FN void offsets(std::int64_t i, std::int64_t (&out)[Operands]) const {
        for (int k = 0; k < Operands; ++k) out[k] = 0;
        for (int d = rank - 1; d >= 0; --d) {
            const std::int64_t q = i / sizes[d];
            const std::int64_t r = i - q * sizes[d];
            i = q;
            for (int k = 0; k < Operands; ++k) out[k] += r * strides[k][d];
        }
    }
};

// The same walk over fewer dims: size-1 dims dropped, and each dim merged into the one before it where every
// operand's stride there equals this dim's stride times its size (so they visit one run; a broadcast dim of
// stride 0 merges with a broadcast neighbour). Elements are visited in the same order at the same offsets, so a
// permute of (B,T,3,H,D) copies runs of D and an expand of (N,1) along its last axis a run of N per row.
template <int Operands>
StridedWalk<Operands> collapsed(const StridedWalk<Operands>& walk) {
    StridedWalk<Operands> out;
    for (int d = 0; d < walk.rank; ++d) {
        if (walk.sizes[d] == 1) continue;
        bool merges = out.rank > 0;
        for (int k = 0; merges && k < Operands; ++k)
            merges = out.strides[k][out.rank - 1] == walk.strides[k][d] * walk.sizes[d];
        const int at = merges ? out.rank - 1 : out.rank++;
        out.sizes[at] = merges ? out.sizes[at] * walk.sizes[d] : walk.sizes[d];
        for (int k = 0; k < Operands; ++k) out.strides[k][at] = walk.strides[k][d];
    }
    return out;
}

// ShapeError "<role> has rank 17; at most 16 dims are supported" for ranks the walk cannot hold.
inline void require_strided_rank(const Shape& shape, const char* role) {
    if (shape.size() > static_cast<std::size_t>(kMaxStridedRank))
        throw ShapeError(str(role, " ", to_string(shape), " has rank ", shape.size(), "; at most ", kMaxStridedRank,
                             " dims are supported"));
}

// Strides of a contiguous tensor of `shape` aligned to the trailing axes of `out` (NumPy broadcasting):
// 0 along the leading axes it lacks and along axes where it has size 1.
inline void broadcast_strides(const Shape& shape, const Shape& out, std::int64_t* strides) {
    const std::size_t lead = out.size() - shape.size();
    std::int64_t stride = 1;
    for (std::size_t d = out.size(); d-- > 0;) {
        if (d < lead) {
            strides[d] = 0;
            continue;
        }
        const std::int64_t size = shape[d - lead];
        strides[d] = size == 1 ? 0 : stride;
        stride *= size;
    }
}

// A walk over `out` reading each of `operands` (shapes that broadcast to `out`).
template <int Operands>
StridedWalk<Operands> broadcast_walk(const Shape& out, const Shape (&operands)[Operands]) {
    StridedWalk<Operands> walk;
    walk.rank = static_cast<int>(out.size());
    for (std::size_t d = 0; d < out.size(); ++d) walk.sizes[d] = out[d];
    for (int k = 0; k < Operands; ++k) broadcast_strides(operands[k], out, walk.strides[k]);
    return walk;
}

}  // namespace dyngrad
