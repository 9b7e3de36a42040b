// Dropout on the GPU: one elementwise kernel drawing the mask from ops/dropout_mask.h, the formula the CPU
// kernel uses (ops/dropout.cpp), so both backends drop the same elements; the backward (ops/dropout.cpp, every
// backend) runs this forward on dy. f32, f64, and bf16/f16 natively (ops/reduced_precision.cuh: no conversion
// through f32 under autocast). And the device-side draw of a DropoutSeeds stream: its own one-thread kernel
// (DropoutSeeds::next), or fused into the dropout kernel (the Dropout layer: cuda::FusedSeedDraw).
#include <cstdint>
#include <utility>

#include "dyngrad/cuda/context.h"
#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduced_precision.cuh"
#include "dyngrad/ops/vector_pack.cuh"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;

// out = in · mask, mask = 1/(1 − p) or 0 per element (dropout forward: x -> y, backward: dy -> dx), computed in
// acc_t<T> by math::dropout_apply (the fusion compiler's generated kernels call the same) and rounded once on
// store: bf16/f16 give the f32 kernel's result rounded, and every dtype keeps exactly the elements the CPU keeps
// (the keep decision depends on (seed, index) alone, never on T).
// The seed is read from `seed_input` (device memory) when given, so a captured step draws the seed its replay
// wrote there. With `draw` (cuda::FusedSeedDraw) the kernel draws that seed itself from the stream's counter:
// every block reads *draw.counter (before its arrival), the last block to finish stores counter + 1 and the
// seed (into the seed input). Whole 16-byte packs first (`packs` of them), then the scalar tail.
struct KernelDraw {
    std::int64_t* counter = nullptr;  // null: no draw
    std::uint64_t stream_seed = 0;
    std::int64_t* slot = nullptr;
    unsigned* block_counter = nullptr;  // the device's "last block" counter (DeviceContext), 0 between kernels
};

template <typename T>
__global__ void dropout_kernel(const T* __restrict__ in, std::int64_t n, std::int64_t packs, std::uint64_t attr_seed,
                               const std::int64_t* __restrict__ seed_input, double p, T* __restrict__ out,
                               KernelDraw draw) {
    using vector_pack::Pack;
    constexpr int W = Pack<T>::width;
    const std::int64_t draw_number = draw.counter != nullptr ? *draw.counter + 1 : 0;
    const std::uint64_t seed =
        draw.counter != nullptr ? math::dropout_draw_seed(draw.stream_seed, static_cast<std::uint64_t>(draw_number))
        : seed_input != nullptr ? static_cast<std::uint64_t>(*seed_input)
                                : attr_seed;
    const auto masked = [&](T v, std::int64_t i) {
        return from_acc<T>(math::dropout_apply(to_acc(v), seed, static_cast<std::uint64_t>(i), p));
    };
    for (std::int64_t k = thread_index(); k < packs; k += thread_count()) {
        const Pack<T> iv = vector_pack::load_pack(in, k);
        Pack<T> ov;
#pragma unroll
        for (int j = 0; j < W; ++j) ov.v[j] = masked(iv.v[j], k * W + j);
        vector_pack::store_pack(out, k, ov);
    }
    for (std::int64_t i = packs * W + thread_index(); i < n; i += thread_count())
        out[i] = masked(in[i], i);
    if (draw.counter == nullptr) return;
    __syncthreads();  // every thread of this block has read the counter
    if (threadIdx.x != 0) return;
    __threadfence();
    if (atomicAdd(draw.block_counter, 1u) + 1 == gridDim.x) {
        *draw.counter = draw_number;
        *draw.slot = static_cast<std::int64_t>(seed);
        *draw.block_counter = 0;
    }
}

thread_local FusedSeedDraw* tls_fused_draw = nullptr;

template <typename T>
void launch_dropout(const Tensor& in, std::span<const Tensor> inputs, const OpAttrs& attrs, Tensor& out) {
    const std::int64_t n = in.numel();
    if (n == 0) return;
    DeviceContext& ctx = context_for(in);
    const std::int64_t* seed_input = inputs.size() > 1 ? inputs[1].data<std::int64_t>() : nullptr;
    KernelDraw draw;
    if (FusedSeedDraw* fused = tls_fused_draw; fused != nullptr && !fused->consumed && seed_input == fused->slot) {
        draw = {fused->counter, fused->stream_seed, fused->slot, ctx.block_counter};
        fused->consumed = true;
        seed_input = nullptr;  // the kernel writes it (through draw.slot) and never reads it
    }
    const T* x = in.data<T>();
    T* y = out.data<T>();
    const std::int64_t packs = vector_pack::pack_count<T>(n, {x, y});
    dropout_kernel<T><<<vector_pack::vector_blocks(ctx, n, packs, kThreads), kThreads, 0, ctx.stream>>>(
        x, n, packs, attrs.seed, seed_input, attrs.scalar, y, draw);
    DG_CUDA_CHECK_LAUNCH();
}

// One thread: the next draw of a DropoutSeeds stream (ops/dropout.h), advanced on the device.
__global__ void next_dropout_seed_kernel(std::int64_t* __restrict__ counter, std::uint64_t seed,
                                         std::int64_t* __restrict__ out) {
    const std::int64_t n = *counter + 1;
    *counter = n;
    *out = static_cast<std::int64_t>(math::dropout_draw_seed(seed, static_cast<std::uint64_t>(n)));
}

}  // namespace

// x (any shape) [seed] -> y like x: x · mask, mask = 1/(1 − p) or 0 per element (identity in eval or at p = 0)
Tensor dropout_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    if (math::dropout_is_identity(args.attrs.training, args.attrs.scalar)) {
        y.copy_from(x);
        return y;
    }
    dispatch_gpu_floating(x.dtype(), "dropout",
                          [&]<typename T>() { launch_dropout<T>(x, args.inputs, args.attrs, y); });
    return y;
}

FusedSeedDraw* set_fused_seed_draw(FusedSeedDraw* draw) { return std::exchange(tls_fused_draw, draw); }

bool draw_pending_seed(const Tensor& slot) {
    FusedSeedDraw* fused = tls_fused_draw;
    if (fused == nullptr || fused->consumed || !slot.defined() || slot.dtype() != DType::i64 ||
        fused->slot != slot.data<std::int64_t>())
        return false;
    DeviceContext& ctx = context_for(slot);
    next_dropout_seed_kernel<<<1, 1, 0, ctx.stream>>>(fused->counter, fused->stream_seed, fused->slot);
    DG_CUDA_CHECK_LAUNCH();
    fused->consumed = true;
    return true;
}

void next_dropout_seed(Tensor& counter, std::uint64_t seed, Tensor& out) {
    DeviceContext& ctx = context_for(counter);
    next_dropout_seed_kernel<<<1, 1, 0, ctx.stream>>>(counter.data<std::int64_t>(), seed, out.data<std::int64_t>());
    DG_CUDA_CHECK_LAUNCH();
}

}  // namespace dyngrad::cuda
