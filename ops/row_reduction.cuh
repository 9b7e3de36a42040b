// Row reductions for CUDA kernels that reduce along rows (a warp or a block per row, grid-stride over
// rows; deterministic: no atomics): the warp and block reductions, the row tilings and the launch that
// picks one by row length. Shared by the softmax kernels (ops/elementwise.cu) and the fused losses
// (ops/loss.cu). Device code: include it from .cu files only.
#pragma once
#include <cmath>
#include <cstdint>

#include "dyngrad/cuda/context.h"

namespace dyngrad::cuda::row_reduction {

constexpr unsigned kThreads = 256;  // a multiple of the warp size: the reductions rely on full warps
constexpr int kWarp = 32;
// Rows up to this length get one warp each, longer rows one block each.
constexpr std::int64_t kWarpRowLimit = 512;

__device__ __forceinline__ float device_exp(float v) { return expf(v); }
__device__ __forceinline__ double device_exp(double v) { return exp(v); }
__device__ __forceinline__ float device_log(float v) { return logf(v); }
__device__ __forceinline__ double device_log(double v) { return log(v); }

template <typename T> __device__ __forceinline__ T lowest() { return static_cast<T>(-INFINITY); }

struct MaxOp {
    template <typename T> __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct SumOp {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};

// Every lane gets the warp's result. All 32 lanes must call it.
template <typename T, typename Op>
__device__ T warp_reduce(T v, Op op) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Every thread gets the block's result. All threads of the block must call it; blockDim.x is a
// multiple of 32. Safe to call repeatedly: the first barrier waits for readers of the last result.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
    __shared__ T partial[kWarp];
    const unsigned lane = threadIdx.x % kWarp;
    const unsigned warp = threadIdx.x / kWarp;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < blockDim.x / kWarp ? partial[lane] : identity;
        v = warp_reduce(v, op);
        if (lane == 0) partial[0] = v;
    }
    __syncthreads();
    return partial[0];
}

// How the threads of a launch share out rows: one warp per row (kBlockPerRow false) or one block
// per row; rows are visited grid-stride. A row index is uniform over its warp or block, so the
// whole group enters and leaves each row together, as the reductions require.
template <bool kBlockPerRow> struct RowTiling;
template <> struct RowTiling<false> {
    __device__ static std::int64_t first_row() {
        return (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
    }
    __device__ static std::int64_t row_step() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x / kWarp; }
    __device__ static int lane() { return static_cast<int>(threadIdx.x % kWarp); }
    __device__ static int width() { return kWarp; }
    template <typename T, typename Op> __device__ static T reduce(T v, Op op, T) { return warp_reduce(v, op); }
};
template <> struct RowTiling<true> {
    __device__ static std::int64_t first_row() { return blockIdx.x; }
    __device__ static std::int64_t row_step() { return gridDim.x; }
    __device__ static int lane() { return static_cast<int>(threadIdx.x); }
    __device__ static int width() { return static_cast<int>(blockDim.x); }
    template <typename T, typename Op> __device__ static T reduce(T v, Op op, T identity) {
        return block_reduce(v, op, identity);
    }
};

// Launches `launch.template operator()<kBlockPerRow>(blocks)` with the tiling that suits `rows` rows
// of length `len`, then checks the launch.
template <typename Launch>
void launch_rows(const DeviceContext& ctx, std::int64_t rows, std::int64_t len, Launch&& launch) {
    if (len > kWarpRowLimit)
        launch.template operator()<true>(grid_size(ctx, rows * kThreads, kThreads));
    else
        launch.template operator()<false>(grid_size(ctx, rows * kWarp, kThreads));
    DG_CUDA_CHECK_LAUNCH();
}

}  // namespace dyngrad::cuda::row_reduction
