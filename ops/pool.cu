// 2-D max and average pooling on the GPU. CPU reference: ops/pool.cpp (same names in namespace cpu).
//
// Max: kernels of ours, the CPU's rule exactly — each window's first maximal element in row-major order, a NaN
// counting as maximal — forward (one thread per output) and backward (windows that tile the plane, the usual
// 2x2 stride 2: one thread per window writes its block of dx; any other windows: one thread per input element
// gathers dy from every window whose maximum it is, in the windows' order); dx written with '=': no memset,
// no atomics, deterministic, ties resolved as on the CPU. cuDNN's CUDNN_POOLING_MAX_DETERMINISTIC, used
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

// Indices are 32-bit where they fit (cuda::fits_int32_indices; with int64 division the first version of these kernels
// was 5x slower than cuDNN's), 64-bit otherwise.

constexpr unsigned kThreads = 256;

template <typename I>
struct PoolDims {
    I h, w, p, q;  // input and output planes
    I kh, kw, sh, sw, ph, pw;
};

template <typename I>
PoolDims<I> pool_dims(const Shape& x, const Shape& y, const OpAttrs& a) {
    return {.h = static_cast<I>(x[2]), .w = static_cast<I>(x[3]), .p = static_cast<I>(y[2]),
            .q = static_cast<I>(y[3]), .kh = static_cast<I>(a.kernel[0]), .kw = static_cast<I>(a.kernel[1]),
            .sh = static_cast<I>(a.stride[0]), .sw = static_cast<I>(a.stride[1]), .ph = static_cast<I>(a.padding[0]),
            .pw = static_cast<I>(a.padding[1])};
}

// Index within the (H,W) plane of output (p,q)'s first maximal element, row-major, over the part of the window
// inside the input (ops/pool.cpp window_argmax: the same scan, the same comparison; bf16/f16 compare as float,
// exactly). The shape rule keeps padding ≤ kernel/2, so every window holds an input element.
template <typename T, typename I>
__device__ __forceinline__ I window_argmax(const T* plane, const PoolDims<I>& d, I p, I q) {
    const I top = p * d.sh - d.ph, left = q * d.sw - d.pw;
    const I h0 = top > 0 ? top : 0, h1 = top + d.kh < d.h ? top + d.kh : d.h;
    const I w0 = left > 0 ? left : 0, w1 = left + d.kw < d.w ? left + d.kw : d.w;
    I best = h0 * d.w + w0;
    acc_t<T> best_value = to_acc(plane[best]);
    for (I h = h0; h < h1; ++h)
        for (I w = w0; w < w1; ++w) {
            const acc_t<T> v = to_acc(plane[h * d.w + w]);
            if (v > best_value || (v != v && best_value == best_value)) {  // v != v: NaN
                best = h * d.w + w;
                best_value = v;
            }
        }
    return best;
}

// y (planes, P, Q) = x's element at each window's argmax.
template <typename T, typename I>
__global__ void max_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, PoolDims<I> d, I n) {
    const I step = static_cast<I>(gridDim.x) * blockDim.x, per_plane = d.p * d.q;
    for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
        const I plane = i / per_plane, pq = i - plane * per_plane;
        const I p = pq / d.q;
        const T* x_plane = x + static_cast<std::int64_t>(plane) * d.h * d.w;
        y[i] = x_plane[window_argmax(x_plane, d, p, pq - p * d.q)];
    }
}

// Windows that tile the plane (stride = kernel, no padding): one thread per window writes its whole dx block, dy
// at the argmax and 0 elsewhere; the last row and column of windows also take the rows and columns no window
// covers (0). Every dx element is written once.
template <typename T, typename I>
__global__ void max_pool_backward_tiled_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                               T* __restrict__ dx, PoolDims<I> d, I windows) {
    const I step = static_cast<I>(gridDim.x) * blockDim.x, per_plane = d.p * d.q;
    const T zero = from_acc<T>(acc_t<T>(0));
    for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < windows; i += step) {
        const I plane = i / per_plane, pq = i - plane * per_plane;
        const I p = pq / d.q, q = pq - p * d.q;
        const std::int64_t offset = static_cast<std::int64_t>(plane) * d.h * d.w;
        const I best = window_argmax(x + offset, d, p, q);
        const T g = dy[i];
        const I h_end = p == d.p - 1 ? d.h : (p + 1) * d.kh, w_end = q == d.q - 1 ? d.w : (q + 1) * d.kw;
        for (I h = p * d.kh; h < h_end; ++h)
            for (I w = q * d.kw; w < w_end; ++w) dx[offset + h * d.w + w] = h * d.w + w == best ? g : zero;
    }
}

// Any windows: for input element (h, w) the sum of dy over the windows containing it whose argmax it is, in the
// windows' row-major order (the CPU's order of '+='), accumulated in acc_t<T>.
template <typename T, typename I>
__global__ void max_pool_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                                         PoolDims<I> d, I n) {
    const I step = static_cast<I>(gridDim.x) * blockDim.x, per_plane = d.h * d.w;
    for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
        const I plane = i / per_plane, hw = i - plane * per_plane;
        const I h = hw / d.w, w = hw - h * d.w;
        // Windows p with p·sh − ph ≤ h < p·sh − ph + kh, clipped to [0, P): the first is ⌈(h + ph − kh + 1)/sh⌉.
        const I p_num = h + d.ph - d.kh + 1, q_num = w + d.pw - d.kw + 1;
        const I p0 = p_num > 0 ? (p_num + d.sh - 1) / d.sh : 0;
        const I q0 = q_num > 0 ? (q_num + d.sw - 1) / d.sw : 0;
        const I p1 = (h + d.ph) / d.sh < d.p - 1 ? (h + d.ph) / d.sh : d.p - 1;
        const I q1 = (w + d.pw) / d.sw < d.q - 1 ? (w + d.pw) / d.sw : d.q - 1;
        const T* x_plane = x + static_cast<std::int64_t>(plane) * per_plane;
        const T* dy_plane = dy + static_cast<std::int64_t>(plane) * d.p * d.q;
        acc_t<T> sum = 0;
        for (I p = p0; p <= p1; ++p)
            for (I q = q0; q <= q1; ++q)
                if (window_argmax(x_plane, d, p, q) == hw) sum += to_acc(dy_plane[p * d.q + q]);
        dx[i] = from_acc<T>(sum);
    }
}

Tensor max_pool_forward(const Tensor& x, const OpAttrs& attrs, Tensor y) {
    DeviceContext& ctx = context_for(x);
    const std::int64_t n = y.numel();
    const unsigned blocks = grid_size(ctx, n, kThreads);
    dispatch_gpu_floating(x.dtype(), "max_pool2d", [&]<typename T>() {
        if (fits_int32_indices(x.numel(), blocks, kThreads))
            max_pool_forward_kernel<T, std::int32_t><<<blocks, kThreads, 0, ctx.stream>>>(
                x.data<T>(), y.data<T>(), pool_dims<std::int32_t>(x.shape(), y.shape(), attrs),
                static_cast<std::int32_t>(n));
        else
            max_pool_forward_kernel<T, std::int64_t><<<blocks, kThreads, 0, ctx.stream>>>(
                x.data<T>(), y.data<T>(), pool_dims<std::int64_t>(x.shape(), y.shape(), attrs), n);
        DG_CUDA_CHECK_LAUNCH();
    });
    return y;
}

Tensor max_pool_backward(const Tensor& x, const Tensor& dy, const OpAttrs& attrs) {
    DeviceContext& ctx = context_for(x);
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    const bool tiled = attrs.stride == attrs.kernel && attrs.padding[0] == 0 && attrs.padding[1] == 0;
    const std::int64_t n = tiled ? dy.numel() : dx.numel();  // threads: one per window, or one per element
    const unsigned blocks = grid_size(ctx, n, kThreads);
    const auto launch = [&]<typename T, typename I>() {
        const PoolDims<I> d = pool_dims<I>(x.shape(), dy.shape(), attrs);
        if (tiled)
            max_pool_backward_tiled_kernel<T, I><<<blocks, kThreads, 0, ctx.stream>>>(
                x.data<T>(), dy.data<T>(), dx.data<T>(), d, static_cast<I>(n));
        else
            max_pool_backward_kernel<T, I><<<blocks, kThreads, 0, ctx.stream>>>(x.data<T>(), dy.data<T>(),
                                                                                dx.data<T>(), d, static_cast<I>(n));
        DG_CUDA_CHECK_LAUNCH();
    };
    dispatch_gpu_floating(x.dtype(), "max_pool2d backward", [&]<typename T>() {
        if (fits_int32_indices(x.numel(), blocks, kThreads)) launch.template operator()<T, std::int32_t>();
        else launch.template operator()<T, std::int64_t>();
    });
    return dx;
}

}  // namespace

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
