// Gradient clipping on the GPU (nn/optim_internal.h): the norm of all gradients in one pass per batch whose last
// block reduces the partial sums to the norm and clip coefficient, the scaling pass, and clip_value's clamp.
// The host side and the CPU rules: nn/clip.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "dyngrad/cuda/context.h"
#include "dyngrad/nn/optim_internal.h"

namespace dyngrad::cuda {

namespace {

enum class NormKind { One, Two, Infinity, Other };

template <typename T>
__device__ double norm_term(T value, NormKind kind, double p) {
    const double a = fabs(static_cast<double>(value));
    switch (kind) {
        case NormKind::One: return a;
        case NormKind::Two: return a * a;
        case NormKind::Infinity: return a;
        default: return pow(a, p);
    }
}

__device__ double combine(double a, double b, NormKind kind) {
    if (kind != NormKind::Infinity) return a + b;
    return (b > a || isnan(b)) ? b : a;  // max with NaN propagation
}

// Reduces the block's `value` in a fixed order (deterministic); thread 0 gets the result.
__device__ double block_reduce(double value, NormKind kind) {
    __shared__ double lanes[kBatchThreads];
    lanes[threadIdx.x] = value;
    __syncthreads();
    for (unsigned stride = kBatchThreads / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) lanes[threadIdx.x] = combine(lanes[threadIdx.x], lanes[threadIdx.x + stride], kind);
        __syncthreads();
    }
    return lanes[0];
}

// The norm and clip coefficient from the partial sums: their total in a fixed order (deterministic),
// norm = total^(1/p) (into `norm`, of type N) and min(1, max_norm / (norm + eps)) (NaN propagates) into
// *coefficient. Run by one whole block.
template <typename N>
__device__ void finish_norm(const double* partials, std::int64_t count, NormKind kind, double p, double max_norm,
                            double eps, N* norm, double* coefficient) {
    double acc = 0;
    // ld.cg: the other blocks' partials, past this SM's L1.
    for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) acc = combine(acc, __ldcg(partials + i), kind);
    acc = block_reduce(acc, kind);
    if (threadIdx.x != 0) return;
    const double total = kind == NormKind::Infinity || kind == NormKind::One ? acc
                         : kind == NormKind::Two                           ? sqrt(acc)
                                                                           : pow(acc, 1 / p);
    *norm = static_cast<N>(total);
    const double c = max_norm / (total + eps);
    *coefficient = (c < 1 || isnan(c)) ? c : 1.0;
}

// Block b: Σ|g|^p (or max |g|) over its slice into partials[first_partial + b]. A fixed number of elements per
// thread, unrolled, so that the loads are all in flight before the (ordered, deterministic) accumulation.
// The last block to finish, over all of the norm's launches (`total_blocks`, counted in `finished`, which
// it resets to 0), reduces the partials to the norm and coefficient (finish_norm): no separate launch.
template <typename T, typename N>
__global__ void norm_partials_kernel(GradBatch batch, NormKind kind, double p, double* __restrict__ partials,
                                     std::int64_t total_blocks, unsigned* __restrict__ finished, double max_norm,
                                     double eps, N* __restrict__ norm, double* __restrict__ coefficient) {
    const BlockSlice slice = block_slice(batch);
    const T* __restrict__ g = static_cast<const T*>(batch.data[slice.tensor]);
    T values[kBatchPerThread];
#pragma unroll
    for (int k = 0; k < kBatchPerThread; ++k) {
        const std::int64_t i = slice.begin + k * static_cast<std::int64_t>(kBatchThreads);
        values[k] = i < slice.end ? g[i] : T(0);
    }
    double acc = 0;
#pragma unroll
    for (int k = 0; k < kBatchPerThread; ++k)
        if (slice.begin + k * static_cast<std::int64_t>(kBatchThreads) < slice.end)
            acc = combine(acc, norm_term(values[k], kind, p), kind);
    acc = block_reduce(acc, kind);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        partials[batch.first_partial + blockIdx.x] = acc;
        __threadfence();  // the partial is visible device-wide before this block counts as finished
        last = static_cast<std::int64_t>(atomicAdd(finished, 1u)) + 1 == total_blocks;
    }
    __syncthreads();  // also: every thread is done with block_reduce's lanes before finish_norm reuses them
    if (!last) return;
    __threadfence();
    finish_norm(partials, total_blocks, kind, p, max_norm, eps, norm, coefficient);
    if (threadIdx.x == 0) *finished = 0;
}

template <typename T>
__global__ void scale_kernel(GradBatch batch, const double* __restrict__ coefficient) {
    const double c = *coefficient;
    if (c == 1.0) return;
    const BlockSlice slice = block_slice(batch);
    T* __restrict__ g = static_cast<T*>(batch.data[slice.tensor]);
    const T scale = static_cast<T>(c);
    for (std::int64_t i = slice.begin; i < slice.end; i += blockDim.x) g[i] = g[i] * scale;
}

template <typename T>
__global__ void clamp_kernel(GradBatch batch, T bound) {
    const BlockSlice slice = block_slice(batch);
    T* __restrict__ g = static_cast<T*>(batch.data[slice.tensor]);
    for (std::int64_t i = slice.begin; i < slice.end; i += blockDim.x) {
        const T v = g[i];
        g[i] = v < -bound ? -bound : (v > bound ? bound : v);  // NaN stays NaN, as torch.clamp
    }
}

}  // namespace

void clip_norm(int device, std::span<const GradOperand> grads, double max_norm, double norm_type, double eps,
               Tensor& norm, Tensor* coefficient_out) {
    DeviceContext& ctx = context(device);
    const NormKind kind = std::isinf(norm_type) ? NormKind::Infinity
                          : norm_type == 1      ? NormKind::One
                          : norm_type == 2      ? NormKind::Two
                                                : NormKind::Other;
    std::int64_t blocks = 0;  // one partial sum per block of norm_partials_kernel
    for (const GradOperand& g : grads) blocks += (g.numel + kBatchSlice - 1) / kBatchSlice;
    if (blocks == 0) {  // only empty gradients: the norm is 0 and nothing is scaled
        DG_CUDA_CHECK(cudaMemsetAsync(norm.raw_data(), 0, dtype_size(norm.dtype()), ctx.stream));
        if (coefficient_out != nullptr) coefficient_out->fill(1.0);
        return;
    }
    // Pool memory, stream-ordered: freed when these tensors go, after the kernels queued below.
    const Tensor partials = Tensor::empty({std::max<std::int64_t>(blocks, 1)}, DType::f64, Device::cuda(device));
    const Tensor coefficient =
        coefficient_out != nullptr ? *coefficient_out : Tensor::empty({}, DType::f64, Device::cuda(device));
    auto* partial_sums = static_cast<double*>(partials.raw_data());
    auto* c = static_cast<double*>(coefficient.raw_data());
    dispatch_floating(norm.dtype(), "clip_grad_norm", [&]<typename N>() {
        for_each_batch(grads, "clip_grad_norm", [&](DType dtype, const GradBatch& batch, unsigned grid) {
            dispatch_floating(dtype, "clip_grad_norm", [&]<typename T>() {
                norm_partials_kernel<T, N><<<grid, kBatchThreads, 0, ctx.stream>>>(
                    batch, kind, norm_type, partial_sums, blocks, ctx.block_counter, max_norm, eps,
                    static_cast<N*>(norm.raw_data()), c);
                DG_CUDA_CHECK_LAUNCH();
            });
        });
    });
    if (coefficient_out != nullptr) return;  // a fused step applies it
    for_each_batch(grads, "clip_grad_norm", [&](DType dtype, const GradBatch& batch, unsigned grid) {
        dispatch_floating(dtype, "clip_grad_norm", [&]<typename T>() {
            scale_kernel<T><<<grid, kBatchThreads, 0, ctx.stream>>>(batch, c);
            DG_CUDA_CHECK_LAUNCH();
        });
    });
}

void clip_value(int device, std::span<const GradOperand> grads, double clip_value) {
    DeviceContext& ctx = context(device);
    for_each_batch(grads, "clip_grad_value", [&](DType dtype, const GradBatch& batch, unsigned grid) {
        dispatch_floating(dtype, "clip_grad_value", [&]<typename T>() {
            clamp_kernel<T><<<grid, kBatchThreads, 0, ctx.stream>>>(batch, static_cast<T>(clip_value));
            DG_CUDA_CHECK_LAUNCH();
        });
    });
}

}  // namespace dyngrad::cuda
