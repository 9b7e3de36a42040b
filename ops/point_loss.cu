// Pointwise losses on the GPU (l1, smooth_l1, bce_with_logits: ops/loss_math.h) and mse_loss: per-block partial
// sums in double, then a one-block sum (a fixed order of additions: deterministic), no host synchronisation. The
// class losses (cross_entropy, nll_loss) and linear_cross_entropy: ops/loss.cu. CPU reference: ops/loss.cpp.
#include <cstdint>
#include <limits>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/loss_math.h"
#include "dyngrad/ops/row_reduction.cuh"

namespace dyngrad::cuda {

namespace {

using namespace row_reduction;  // ops/row_reduction.cuh

// out () = scale · Σ values; one block, a fixed order of additions: the same result on every run.
template <typename T>
__global__ void scaled_sum_kernel(const double* __restrict__ values, std::int64_t count, double scale,
                                  T* __restrict__ out) {
    double sum = 0.0;
    for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += values[i];
    sum = block_reduce(sum, SumOp{}, 0.0);
    if (threadIdx.x == 0) *out = static_cast<T>(sum * scale);
}

// Pointwise losses (ops/loss_math.h): None writes each element's loss to out_elements; otherwise
// partials[block] = Σ of the block's losses in double (the grid size depends only on n: a fixed order).
template <typename T>
__global__ void point_loss_kernel(OpType op, math::PointLossInputs<T> in, std::int64_t n, T* __restrict__ out_elements,
                                  double* __restrict__ partials) {
    double sum = 0.0;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const T loss = math::point_loss(op, in, i);
        if (out_elements)
            out_elements[i] = loss;
        else
            sum += static_cast<double>(loss);
    }
    if (out_elements) return;  // uniform over the launch: no thread is left waiting in the reduction
    sum = block_reduce(sum, SumOp{}, 0.0);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// dloss  ->  da, db (each may be null) = d loss_i / d a_i, d b_i (ops/loss_math.h) · reduction_scale (D = n)
template <typename T>
__global__ void point_loss_backward_kernel(OpType op, math::PointLossInputs<T> in, std::int64_t n, Reduction reduction,
                                           const T* __restrict__ dy, T* __restrict__ da, T* __restrict__ db) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        T ga, gb;
        math::point_loss_grads(op, in, i, ga, gb);
        const T s = math::reduction_scale(reduction, dy, static_cast<double>(n), i);
        if (da) da[i] = ga * s;
        if (db) db[i] = gb * s;
    }
}

// prediction, target (n)  ->  partials[block] = Σ (prediction - target)² over the block's elements,
// accumulated in double; the grid size depends only on n, so the sum order is fixed.
template <typename T>
__global__ void squared_error_partials_kernel(const T* __restrict__ prediction, const T* __restrict__ target,
                                              std::int64_t n, double* __restrict__ partials) {
    double sum = 0.0;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const double d = static_cast<double>(prediction[i]) - static_cast<double>(target[i]);
        sum += d * d;
    }
    sum = block_reduce(sum, SumOp{}, 0.0);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// dy ()  ->  dprediction = 2 (prediction - target) / n · dy,  dtarget = -dprediction (each may be null)
template <typename T>
__global__ void mse_backward_kernel(const T* __restrict__ prediction, const T* __restrict__ target, std::int64_t n,
                                    const T* __restrict__ dy, T* __restrict__ dprediction, T* __restrict__ dtarget) {
    const T scale = T(2) * *dy / static_cast<T>(n);
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const T g = scale * (prediction[i] - target[i]);
        if (dprediction) dprediction[i] = g;
        if (dtarget) dtarget[i] = -g;
    }
}

}  // namespace

// Per-block partial sums, then a one-block sum: deterministic, no host synchronisation.
Tensor mse_loss_forward(const ForwardArgs& args) {
    const Tensor& prediction = args.inputs[0];
    const Tensor& target = args.inputs[1];
    Tensor loss = Tensor::empty(args.out.shape, args.out.dtype, prediction.device());
    const std::int64_t n = prediction.numel();
    if (n == 0) {  // infer::mse_loss rejects empty inputs; the mean of nothing is NaN
        loss.fill(std::numeric_limits<double>::quiet_NaN());
        return loss;
    }
    DeviceContext& ctx = context_for(prediction);
    const unsigned blocks = grid_size(ctx, n, kThreads);
    Workspace partials(ctx, blocks * sizeof(double));
    auto* partials_data = static_cast<double*>(partials.data());
    dispatch_floating(prediction.dtype(), "mse_loss", [&]<typename T>() {
        squared_error_partials_kernel<T><<<blocks, kThreads, 0, ctx.stream>>>(prediction.data<T>(), target.data<T>(), n,
                                                                             partials_data);
        DG_CUDA_CHECK_LAUNCH();
        scaled_sum_kernel<T><<<1, kThreads, 0, ctx.stream>>>(partials_data, blocks, 1.0 / static_cast<double>(n),
                                                             loss.data<T>());
        DG_CUDA_CHECK_LAUNCH();
    });
    return loss;
}

std::vector<Tensor> mse_loss_backward(const BackwardArgs& args) {
    const Tensor& prediction = args.inputs[0];
    const Tensor& target = args.inputs[1];
    std::vector<Tensor> grads = math::point_loss_gradients(args);  // d prediction, d target where needed
    const std::int64_t n = prediction.numel();
    if (n == 0 || (!grads[0].defined() && !grads[1].defined())) return grads;
    DeviceContext& ctx = context_for(prediction);
    dispatch_floating(prediction.dtype(), "mse_loss backward", [&]<typename T>() {
        mse_backward_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            prediction.data<T>(), target.data<T>(), n, args.grad_output.data<T>(),
            grads[0].defined() ? grads[0].data<T>() : nullptr, grads[1].defined() ? grads[1].data<T>() : nullptr);
        DG_CUDA_CHECK_LAUNCH();
    });
    return grads;
}

// Per-block partial sums in double, then a one-block sum: deterministic, no host synchronisation. Formulas:
// ops/loss_math.h.
Tensor pointwise_loss_forward(const ForwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Reduction reduction = args.attrs.reduction;
    Tensor loss = Tensor::empty(args.out.shape, args.out.dtype, a.device());
    const std::int64_t n = a.numel();
    if (n == 0) {  // the shape rule rejects an empty Mean; an empty Sum is 0, an empty None has nothing
        if (reduction == Reduction::Sum) loss.fill(0.0);
        return loss;
    }
    DeviceContext& ctx = context_for(a);
    const unsigned blocks = grid_size(ctx, n, kThreads);
    dispatch_floating(a.dtype(), "pointwise loss", [&]<typename T>() {
        const math::PointLossInputs<T> in = math::point_loss_inputs<T>(args.inputs, args.attrs);
        if (reduction == Reduction::None) {
            point_loss_kernel<T><<<blocks, kThreads, 0, ctx.stream>>>(args.op, in, n, loss.data<T>(), nullptr);
            DG_CUDA_CHECK_LAUNCH();
            return;
        }
        Workspace partials(ctx, blocks * sizeof(double));
        auto* partials_data = static_cast<double*>(partials.data());
        point_loss_kernel<T><<<blocks, kThreads, 0, ctx.stream>>>(args.op, in, n, nullptr, partials_data);
        DG_CUDA_CHECK_LAUNCH();
        const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(n) : 1.0;
        scaled_sum_kernel<T><<<1, kThreads, 0, ctx.stream>>>(partials_data, blocks, scale, loss.data<T>());
        DG_CUDA_CHECK_LAUNCH();
    });
    return loss;
}

// dloss () or (shape) -> d input 0, d target; bce's weight and pos_weight get no gradient (as in PyTorch).
std::vector<Tensor> pointwise_loss_backward(const BackwardArgs& args) {
    const Tensor& a = args.inputs[0];
    std::vector<Tensor> grads = math::point_loss_gradients(args);
    const std::int64_t n = a.numel();
    if (n == 0 || (!grads[0].defined() && !grads[1].defined())) return grads;
    DeviceContext& ctx = context_for(a);
    dispatch_floating(a.dtype(), "pointwise loss backward", [&]<typename T>() {
        point_loss_backward_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            args.op, math::point_loss_inputs<T>(args.inputs, args.attrs), n, args.attrs.reduction,
            args.grad_output.data<T>(), grads[0].defined() ? grads[0].data<T>() : nullptr,
            grads[1].defined() ? grads[1].data<T>() : nullptr);
        DG_CUDA_CHECK_LAUNCH();
    });
    return grads;
}

}  // namespace dyngrad::cuda
