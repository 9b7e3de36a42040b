// 2-D max and average pooling on the GPU through cuDNN. CPU reference: ops/pool.cpp (same names in
// namespace cpu).
//
// Modes: max is CUDNN_POOLING_MAX_DETERMINISTIC, so ties send the gradient the same way on every run;
// average is CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING (divides by kernel height·width, like the CPU
// path and PyTorch's default). cuDNN's choice among tied maxima need not be the CPU's "first maximal
// element": gradients can differ from the CPU only on inputs with exact ties inside a window, which the
// random inputs of the GPU-vs-CPU checks do not have.
//
// Descriptors are built once per shape key (x shape, window, stride, padding, mode, dtype, device).
// The legacy pooling API is marked deprecated in cuDNN 9 (the graph API succeeds it) but is supported.
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/cudnn_plans.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"

namespace dyngrad::cuda {

namespace {

struct PoolKey {
    std::array<std::int64_t, 4> x;
    std::array<std::int64_t, 2> kernel, stride, padding;
    OpType op;
    DType dtype;
    int device;
    auto operator<=>(const PoolKey&) const = default;
};

struct PoolPlan {
    TensorDescriptor x, y;
    PoolingDescriptor pool;
};

std::shared_ptr<PoolPlan> make_plan(const PoolKey& key, const Shape& y_shape) {
    const char* what = key.op == OpType::MaxPool2d ? "max_pool2d" : "avg_pool2d";
    auto plan = std::make_shared<PoolPlan>();
    const cudnnDataType_t type = cudnn_dtype(key.dtype, what);
    const auto set_4d = [&](cudnnTensorDescriptor_t desc, const auto& dims) {
        DG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, type, cudnn_dim(dims[0], what),
                                                  cudnn_dim(dims[1], what), cudnn_dim(dims[2], what),
                                                  cudnn_dim(dims[3], what)));
    };
    set_4d(plan->x.get(), key.x);
    set_4d(plan->y.get(), y_shape);
    const cudnnPoolingMode_t mode =
        key.op == OpType::MaxPool2d ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    DG_CUDNN_CHECK(cudnnSetPooling2dDescriptor(plan->pool.get(), mode, CUDNN_PROPAGATE_NAN,
                                               cudnn_dim(key.kernel[0], what), cudnn_dim(key.kernel[1], what),
                                               cudnn_dim(key.padding[0], what), cudnn_dim(key.padding[1], what),
                                               cudnn_dim(key.stride[0], what), cudnn_dim(key.stride[1], what)));
    return plan;
}

// The plan for this call's shapes, built on first use.
std::shared_ptr<PoolPlan> plan_for(OpType op, const Tensor& x, const OpAttrs& attrs, const Shape& y_shape) {
    PoolKey key{};
    for (int i = 0; i < 4; ++i) key.x[i] = x.shape()[i];
    key.kernel = attrs.kernel;
    key.stride = attrs.stride;
    key.padding = attrs.padding;
    for (int i = 0; i < 2; ++i) {
        std::int64_t no_dilation = 1;
        cudnn_window_args(key.x[2 + i], key.kernel[i], key.padding[i], key.stride[i], no_dilation);
    }
    key.op = op;
    key.dtype = x.dtype();
    key.device = x.device().index;
    return plan_cache<PoolKey, PoolPlan>().get(key, [&] { return make_plan(key, y_shape); });
}

}  // namespace

// x (N,C,H,W) -> y (N,C,P,Q): max or mean of each window
Tensor pool2d_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    DeviceContext& ctx = context_for(x);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    if (y.numel() == 0) return y;  // cuDNN rejects zero-sized descriptors
    const std::shared_ptr<PoolPlan> plan = plan_for(args.op, x, args.attrs, y.shape());
    const Scaling scaling(x.dtype());
    DG_CUDNN_CHECK(cudnnPoolingForward(ctx.cudnn, plan->pool.get(), scaling.one(), plan->x.get(), x.raw_data(),
                                       scaling.zero(), plan->y.get(), y.raw_data()));
    release_contexts_before_new_libraries();  // cuDNN may have loaded its engines for this call
    return y;
}

// dy (N,C,P,Q) -> dx (N,C,H,W); cuDNN finds each window's maximum again from x and y
std::vector<Tensor> pool2d_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& dy = args.grad_output;
    if (!args.needs_grad[0]) return {Tensor()};
    DeviceContext& ctx = context_for(x);
    if (dy.numel() == 0) return {Tensor::zeros(x.shape(), x.dtype(), x.device())};
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    const std::shared_ptr<PoolPlan> plan = plan_for(args.op, x, args.attrs, dy.shape());
    const Scaling scaling(x.dtype());
    DG_CUDNN_CHECK(cudnnPoolingBackward(ctx.cudnn, plan->pool.get(), scaling.one(), plan->y.get(),
                                        args.output.raw_data(), plan->y.get(), dy.raw_data(), plan->x.get(),
                                        x.raw_data(), scaling.zero(), plan->x.get(), dx.raw_data()));
    release_contexts_before_new_libraries();
    return {dx};
}

}  // namespace dyngrad::cuda
