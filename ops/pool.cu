// 2-D max and average pooling on the GPU. CPU reference: ops/pool.cpp (same names in namespace cpu).
//
// Max: kernels of ours, the CPU's rule exactly — each window's first maximal element in row-major order, a NaN
// counting as maximal — forward (one thread per output) and backward (one thread per input element, which
// gathers dy from every window whose maximum it is, in the windows' order, and writes dx with '=': no memset,
// no atomics, deterministic, ties resolved as on the CPU). cuDNN's CUDNN_POOLING_MAX_DETERMINISTIC, used
// before, chose among tied maxima its own way and its backward took 31.5 µs on lenet b256's first pooling on
// an H200 where PyTorch's generated kernel took 2.6 µs (docs/performance/kernel-times-h200.md).
//
// Average stays on cuDNN: CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING (divides by kernel height·width, like
// the CPU path and PyTorch's default). Its descriptors are built once per shape key (x shape, window, stride,
// padding, dtype, device). The legacy pooling API is marked deprecated in cuDNN 9 (the graph API succeeds it)
// but is supported.
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/cudnn_plans.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduced_precision.cuh"

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
    const char* what = "avg_pool2d";
    auto plan = std::make_shared<PoolPlan>();
    const cudnnDataType_t type = cudnn_dtype(key.dtype, what);
    const auto set_4d = [&](cudnnTensorDescriptor_t desc, const auto& dims) {
        DG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, type, cudnn_dim(dims[0], what),
                                                  cudnn_dim(dims[1], what), cudnn_dim(dims[2], what),
                                                  cudnn_dim(dims[3], what)));
    };
    set_4d(plan->x.get(), key.x);
    set_4d(plan->y.get(), y_shape);
    DG_CUDNN_CHECK(cudnnSetPooling2dDescriptor(plan->pool.get(), CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                               CUDNN_PROPAGATE_NAN,
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

// ---- max pooling ----

constexpr unsigned kThreads = 256;

struct PoolDims {
    std::int64_t h, w, p, q;  // input and output planes
    std::int64_t kh, kw, sh, sw, ph, pw;
};

PoolDims pool_dims(const Shape& x, const Shape& y, const OpAttrs& a) {
    return {.h = x[2], .w = x[3], .p = y[2], .q = y[3], .kh = a.kernel[0], .kw = a.kernel[1], .sh = a.stride[0],
            .sw = a.stride[1], .ph = a.padding[0], .pw = a.padding[1]};
}

// Index within the (H,W) plane of output (p,q)'s first maximal element, row-major, over the part of the window
// inside the input (ops/pool.cpp window_argmax: the same scan, the same comparison; bf16/f16 compare as float,
// exactly). The shape rule keeps padding ≤ kernel/2, so every window holds an input element.
template <typename T>
__device__ __forceinline__ std::int64_t window_argmax(const T* plane, const PoolDims& d, std::int64_t p,
                                                      std::int64_t q) {
    const std::int64_t top = p * d.sh - d.ph, left = q * d.sw - d.pw;
    const std::int64_t h0 = top > 0 ? top : 0, h1 = top + d.kh < d.h ? top + d.kh : d.h;
    const std::int64_t w0 = left > 0 ? left : 0, w1 = left + d.kw < d.w ? left + d.kw : d.w;
    std::int64_t best = h0 * d.w + w0;
    acc_t<T> best_value = to_acc(plane[best]);
    for (std::int64_t h = h0; h < h1; ++h)
        for (std::int64_t w = w0; w < w1; ++w) {
            const acc_t<T> v = to_acc(plane[h * d.w + w]);
            if (v > best_value || (v != v && best_value == best_value)) {  // v != v: NaN
                best = h * d.w + w;
                best_value = v;
            }
        }
    return best;
}

// y (planes, P, Q) = x's element at each window's argmax.
template <typename T>
__global__ void max_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, PoolDims d, std::int64_t n) {
    const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
        const std::int64_t plane = i / (d.p * d.q), pq = i % (d.p * d.q);
        const T* x_plane = x + plane * d.h * d.w;
        y[i] = x_plane[window_argmax(x_plane, d, pq / d.q, pq % d.q)];
    }
}

// dx (planes, H, W): for input element (h, w) the sum of dy over the windows containing it whose argmax it is,
// in the windows' row-major order (the CPU's order of '+='), accumulated in acc_t<T>.
template <typename T>
__global__ void max_pool_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                                         PoolDims d, std::int64_t n) {
    const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
        const std::int64_t plane = i / (d.h * d.w), hw = i % (d.h * d.w);
        const std::int64_t h = hw / d.w, w = hw % d.w;
        // Windows p with p·sh − ph ≤ h < p·sh − ph + kh, clipped to [0, P): the first is ⌈(h + ph − kh + 1)/sh⌉.
        const std::int64_t p_num = h + d.ph - d.kh + 1, q_num = w + d.pw - d.kw + 1;
        const std::int64_t p0 = p_num > 0 ? (p_num + d.sh - 1) / d.sh : 0;
        const std::int64_t q0 = q_num > 0 ? (q_num + d.sw - 1) / d.sw : 0;
        const std::int64_t p1 = (h + d.ph) / d.sh < d.p - 1 ? (h + d.ph) / d.sh : d.p - 1;
        const std::int64_t q1 = (w + d.pw) / d.sw < d.q - 1 ? (w + d.pw) / d.sw : d.q - 1;
        const T* x_plane = x + plane * d.h * d.w;
        const T* dy_plane = dy + plane * d.p * d.q;
        acc_t<T> sum = 0;
        for (std::int64_t p = p0; p <= p1; ++p)
            for (std::int64_t q = q0; q <= q1; ++q)
                if (window_argmax(x_plane, d, p, q) == hw) sum += to_acc(dy_plane[p * d.q + q]);
        dx[i] = from_acc<T>(sum);
    }
}

Tensor max_pool_forward(const Tensor& x, const OpAttrs& attrs, Tensor y) {
    DeviceContext& ctx = context_for(x);
    const PoolDims d = pool_dims(x.shape(), y.shape(), attrs);
    const std::int64_t n = y.numel();
    dispatch_gpu_floating(x.dtype(), "max_pool2d", [&]<typename T>() {
        max_pool_forward_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(x.data<T>(), y.data<T>(),
                                                                                           d, n);
        DG_CUDA_CHECK_LAUNCH();
    });
    return y;
}

Tensor max_pool_backward(const Tensor& x, const Tensor& dy, const OpAttrs& attrs) {
    DeviceContext& ctx = context_for(x);
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    const PoolDims d = pool_dims(x.shape(), dy.shape(), attrs);
    const std::int64_t n = dx.numel();
    dispatch_gpu_floating(x.dtype(), "max_pool2d backward", [&]<typename T>() {
        max_pool_backward_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            x.data<T>(), dy.data<T>(), dx.data<T>(), d, n);
        DG_CUDA_CHECK_LAUNCH();
    });
    return dx;
}

}  // namespace

// x (N,C,H,W) -> y (N,C,P,Q): max or mean of each window
Tensor pool2d_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    if (y.numel() == 0) return y;  // cuDNN rejects zero-sized descriptors
    if (args.op == OpType::MaxPool2d) return max_pool_forward(x, args.attrs, std::move(y));
    DeviceContext& ctx = context_for(x);
    const std::shared_ptr<PoolPlan> plan = plan_for(args.op, x, args.attrs, y.shape());
    const Scaling scaling(x.dtype());
    DG_CUDNN_CHECK(cudnnPoolingForward(ctx.cudnn, plan->pool.get(), scaling.one(), plan->x.get(), x.raw_data(),
                                       scaling.zero(), plan->y.get(), y.raw_data()));
    release_contexts_before_new_libraries();  // cuDNN may have loaded its engines for this call
    return y;
}

// dy (N,C,P,Q) -> dx (N,C,H,W): max recomputes each window's argmax from x (no index tensor saved); average
// through cuDNN
std::vector<Tensor> pool2d_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& dy = args.grad_output;
    if (!args.needs_grad[0]) return {Tensor()};
    if (dy.numel() == 0) return {Tensor::zeros(x.shape(), x.dtype(), x.device())};
    if (args.op == OpType::MaxPool2d) return {max_pool_backward(x, dy, args.attrs)};
    DeviceContext& ctx = context_for(x);
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
