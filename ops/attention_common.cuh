// Internal (ops/attention_simt.cu, ops/attention_mma.cu): what both attention kernel families share. Device: which
// keys take part in a query (range, causal, keep mask), dropout's factor, which tile a block works on. Host: the
// launch with its shared-memory opt-in, the padded head dim and the launch grid. Include it from .cu files only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>

#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/attention_launch.h"
#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda::attention {

template <typename Real> __device__ __forceinline__ Real minus_infinity() {
    return -std::numeric_limits<Real>::infinity();
}

// Whether key s takes part in query t of slice `slice` (= b·H + h): in range, causal, the keep mask.
template <typename Real>
__device__ __forceinline__ bool takes_part(const Params& p, std::int64_t slice, std::int64_t t, std::int64_t s) {
    if (t >= p.queries || s >= p.keys) return false;
    if (p.causal && s > t) return false;
    if (p.mask) {
        const std::int64_t b = slice / p.heads, h = slice - b * p.heads;
        const auto keep = to_acc(static_cast<const Real*>(p.mask)[b * p.mask_stride[0] + h * p.mask_stride[1] +
                                                                  t * p.mask_stride[2] + s * p.mask_stride[3]]);
        if (keep == 0) return false;
    }
    return true;
}

// Dropout's factor for probability (slice, t, s): 1/(1 − p) kept, 0 dropped (ops/dropout_mask.h, as the CPU).
template <typename Real>
__device__ __forceinline__ Real dropout_factor(const Params& p, std::int64_t slice, std::int64_t t, std::int64_t s) {
    if (p.dropout_p == 0.0) return Real(1);
    const auto index = static_cast<std::uint64_t>((slice * p.queries + t) * p.keys + s);
    return math::dropout_keep(p.seed, index, p.dropout_p) ? static_cast<Real>(p.kept_factor) : Real(0);
}

// Which tile of `tiles` and which slice block `blockIdx.x` works on; with `reverse`, the last tiles first (causal:
// they have the most work, so they start first).
struct TileOf {
    std::int64_t tile, slice;
};
__device__ __forceinline__ TileOf tile_of_block(std::int64_t tiles, bool reverse) {
    const std::int64_t x = blockIdx.x;
    const std::int64_t slice = x / tiles;
    const std::int64_t t = x - slice * tiles;
    return {reverse ? tiles - 1 - t : t, slice};
}

// Launches kKernel(args...) on `blocks` blocks of `threads` with kShared bytes of dynamic shared memory on the
// context's stream. Kernels above 48 KiB of dynamic shared memory must opt in, once per kernel (thread-safe; per
// device in principle, but every device dyngrad runs on is the same sm_90 build).
template <auto kKernel, std::size_t kShared, typename... Args>
void launch_with_shared(unsigned blocks, unsigned threads, DeviceContext& ctx, const Args&... args) {
    static std::once_flag once;
    std::call_once(once, [] {
        DG_CUDA_CHECK(
            cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kShared)));
    });
    kKernel<<<blocks, threads, kShared, ctx.stream>>>(args...);
    DG_CUDA_CHECK_LAUNCH();
}

// Calls fn.template operator()<DP>() with the padded head dim for D.
template <typename Fn> void with_padded_head_dim(std::int64_t head_dim, Fn&& fn) {
    if (head_dim <= 32)
        fn.template operator()<32>();
    else if (head_dim <= 64)
        fn.template operator()<64>();
    else
        fn.template operator()<128>();  // the shape rule refuses D > kAttentionMaxGpuHeadDim = 128
}

// Launch grid: one block per tile per slice, flat (a slice count beyond gridDim.y's 65535 is fine).
inline unsigned blocks_for(std::int64_t tiles, std::int64_t slices) {
    const std::int64_t blocks = tiles * slices;
    if (blocks > std::numeric_limits<int>::max())
        throw ShapeError(str("scaled_dot_product_attention: ", blocks, " blocks exceed the GPU grid"));
    return static_cast<unsigned>(blocks);
}

}  // namespace dyngrad::cuda::attention
