// Dropout on the GPU: one elementwise kernel drawing the mask from ops/dropout_mask.h, the formula the CPU
// kernel uses (ops/dropout.cpp), so both backends drop the same elements; the backward (ops/dropout.cpp, every
// backend) runs this forward on dy. And the device-side draw of a DropoutSeeds stream.
#include <cstdint>

#include "dyngrad/cuda/context.h"
#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/kernels.h"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;

// out = in · mask, mask = 1/(1 − p) or 0 per element (dropout forward: x -> y, backward: dy -> dx)
// The seed is read from `seed_input` (device memory) when given, so a captured step draws the seed its replay
// wrote there.
template <typename T>
__global__ void dropout_kernel(const T* __restrict__ in, std::int64_t n, std::uint64_t attr_seed,
                               const std::int64_t* __restrict__ seed_input, double p, T scale, T* __restrict__ out) {
    const std::uint64_t seed = seed_input != nullptr ? static_cast<std::uint64_t>(*seed_input) : attr_seed;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        out[i] = in[i] * (math::dropout_keep(seed, static_cast<std::uint64_t>(i), p) ? scale : T(0));
}

template <typename T>
void launch_dropout(const Tensor& in, std::span<const Tensor> inputs, const OpAttrs& attrs, Tensor& out) {
    const std::int64_t n = in.numel();
    if (n == 0) return;
    DeviceContext& ctx = context_for(in);
    const T scale = static_cast<T>(1.0 / (1.0 - attrs.scalar));
    const std::int64_t* seed_input = inputs.size() > 1 ? inputs[1].data<std::int64_t>() : nullptr;
    dropout_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
        in.data<T>(), n, attrs.seed, seed_input, attrs.scalar, scale, out.data<T>());
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
    dispatch_floating(x.dtype(), "dropout", [&]<typename T>() { launch_dropout<T>(x, args.inputs, args.attrs, y); });
    return y;
}

void next_dropout_seed(Tensor& counter, std::uint64_t seed, Tensor& out) {
    DeviceContext& ctx = context_for(counter);
    next_dropout_seed_kernel<<<1, 1, 0, ctx.stream>>>(counter.data<std::int64_t>(), seed, out.data<std::int64_t>());
    DG_CUDA_CHECK_LAUNCH();
}

}  // namespace dyngrad::cuda
