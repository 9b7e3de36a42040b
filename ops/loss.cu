// Softmax family and losses on the GPU: fused row and column kernels, deterministic reductions, no
// host synchronisation (losses stay on the device; the upstream gradient is read on the device; a
// bad label is reported through the device error record). CPU reference: ops/loss.cpp.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/ops/kernels.h"

namespace dyngrad::cuda {

namespace {

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

// ---- softmax / log_softmax ----

// A tensor viewed as (outer, n, inner) around the softmax axis.
struct AxisSplit {
    std::int64_t outer = 1, n = 1, inner = 1;
};

AxisSplit split_at(const Shape& shape, std::int64_t axis) {
    const int a = normalize_axis(axis, shape.size());
    AxisSplit s;
    for (int i = 0; i < a; ++i) s.outer *= shape[i];
    s.n = shape[a];
    for (std::size_t i = a + 1; i < shape.size(); ++i) s.inner *= shape[i];
    return s;
}

// inner == 1: x, y (rows, n), normalised along each row. Three passes over the row (max, Σ exp,
// write); the max is subtracted first so exp never overflows.
template <typename T, bool kBlockPerRow>
__global__ void softmax_rows_forward_kernel(const T* __restrict__ x, T* __restrict__ y, std::int64_t rows,
                                            std::int64_t n, bool log_softmax) {
    using Rows = RowTiling<kBlockPerRow>;
    for (std::int64_t row = Rows::first_row(); row < rows; row += Rows::row_step()) {
        const T* xr = x + row * n;
        T* yr = y + row * n;
        T max = lowest<T>();
        for (std::int64_t i = Rows::lane(); i < n; i += Rows::width()) max = MaxOp{}(max, xr[i]);
        max = Rows::reduce(max, MaxOp{}, lowest<T>());
        T sum = 0;
        for (std::int64_t i = Rows::lane(); i < n; i += Rows::width()) sum += device_exp(xr[i] - max);
        sum = Rows::reduce(sum, SumOp{}, T(0));
        if (log_softmax) {
            const T shift = max + device_log(sum);
            for (std::int64_t i = Rows::lane(); i < n; i += Rows::width()) yr[i] = xr[i] - shift;
        } else {
            for (std::int64_t i = Rows::lane(); i < n; i += Rows::width()) yr[i] = device_exp(xr[i] - max) / sum;
        }
    }
}

// inner > 1: x, y (outer, n, inner), one thread per (outer, inner) column; neighbouring threads
// take neighbouring columns, so every step along n is a coalesced access.
template <typename T>
__global__ void softmax_columns_forward_kernel(const T* __restrict__ x, T* __restrict__ y, AxisSplit s,
                                               bool log_softmax) {
    const std::int64_t columns = s.outer * s.inner;
    for (std::int64_t col = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; col < columns;
         col += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t base = (col / s.inner) * s.n * s.inner + col % s.inner;
        const T* xc = x + base;
        T* yc = y + base;
        T max = lowest<T>();
        for (std::int64_t k = 0; k < s.n; ++k) max = MaxOp{}(max, xc[k * s.inner]);
        T sum = 0;
        for (std::int64_t k = 0; k < s.n; ++k) sum += device_exp(xc[k * s.inner] - max);
        if (log_softmax) {
            const T shift = max + device_log(sum);
            for (std::int64_t k = 0; k < s.n; ++k) yc[k * s.inner] = xc[k * s.inner] - shift;
        } else {
            for (std::int64_t k = 0; k < s.n; ++k) yc[k * s.inner] = device_exp(xc[k * s.inner] - max) / sum;
        }
    }
}

// inner == 1: y, dy, dx (rows, n)
//   softmax:     dx = y * (dy - Σ dy·y)
//   log_softmax: dx = dy - exp(y) * Σ dy
template <typename T, bool kBlockPerRow>
__global__ void softmax_rows_backward_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                             std::int64_t rows, std::int64_t n, bool log_softmax) {
    using Rows = RowTiling<kBlockPerRow>;
    for (std::int64_t row = Rows::first_row(); row < rows; row += Rows::row_step()) {
        const T* yr = y + row * n;
        const T* dyr = dy + row * n;
        T* dxr = dx + row * n;
        T sum = 0;
        for (std::int64_t i = Rows::lane(); i < n; i += Rows::width()) sum += log_softmax ? dyr[i] : dyr[i] * yr[i];
        sum = Rows::reduce(sum, SumOp{}, T(0));
        if (log_softmax) {
            for (std::int64_t i = Rows::lane(); i < n; i += Rows::width()) dxr[i] = dyr[i] - device_exp(yr[i]) * sum;
        } else {
            for (std::int64_t i = Rows::lane(); i < n; i += Rows::width()) dxr[i] = yr[i] * (dyr[i] - sum);
        }
    }
}

// inner > 1: y, dy, dx (outer, n, inner), one thread per column; formulas as above.
template <typename T>
__global__ void softmax_columns_backward_kernel(const T* __restrict__ y, const T* __restrict__ dy,
                                                T* __restrict__ dx, AxisSplit s, bool log_softmax) {
    const std::int64_t columns = s.outer * s.inner;
    for (std::int64_t col = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; col < columns;
         col += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t base = (col / s.inner) * s.n * s.inner + col % s.inner;
        const T* yc = y + base;
        const T* dyc = dy + base;
        T* dxc = dx + base;
        T sum = 0;
        for (std::int64_t k = 0; k < s.n; ++k) {
            const std::int64_t i = k * s.inner;
            sum += log_softmax ? dyc[i] : dyc[i] * yc[i];
        }
        for (std::int64_t k = 0; k < s.n; ++k) {
            const std::int64_t i = k * s.inner;
            dxc[i] = log_softmax ? dyc[i] - device_exp(yc[i]) * sum : yc[i] * (dyc[i] - sum);
        }
    }
}

// ---- losses ----

// The first failing kernel claims the record; the runtime raises it at the next host wait.
__device__ void report_label_out_of_range(DeviceErrorRecord* record, std::int64_t row, std::int64_t label,
                                          std::int64_t classes) {
    if (atomicCAS(&record->code, static_cast<int>(DeviceErrorCode::none),
                  static_cast<int>(DeviceErrorCode::label_out_of_range)) == static_cast<int>(DeviceErrorCode::none)) {
        record->index = row;
        record->value = label;
        record->bound = classes;
    }
}

// logits (N,C)  labels (N)  ->  lse (N) = log Σ_c exp(logits_ic),  row_loss (N) = lse - logits_i,label_i
// (0 for a label outside [0,C), which is reported). The row losses are kept in double so that the
// mean over the batch loses nothing to the order of the sum.
template <typename T, bool kBlockPerRow>
__global__ void cross_entropy_rows_kernel(const T* __restrict__ logits, const std::int64_t* __restrict__ labels,
                                          std::int64_t rows, std::int64_t classes, T* __restrict__ lse,
                                          double* __restrict__ row_loss, DeviceErrorRecord* record) {
    using Rows = RowTiling<kBlockPerRow>;
    for (std::int64_t row = Rows::first_row(); row < rows; row += Rows::row_step()) {
        const T* xr = logits + row * classes;
        T max = lowest<T>();
        for (std::int64_t i = Rows::lane(); i < classes; i += Rows::width()) max = MaxOp{}(max, xr[i]);
        max = Rows::reduce(max, MaxOp{}, lowest<T>());
        T sum = 0;
        for (std::int64_t i = Rows::lane(); i < classes; i += Rows::width()) sum += device_exp(xr[i] - max);
        sum = Rows::reduce(sum, SumOp{}, T(0));
        if (Rows::lane() == 0) {
            const T log_sum = device_log(sum);
            lse[row] = max + log_sum;
            const std::int64_t label = labels[row];
            if (label < 0 || label >= classes) {
                report_label_out_of_range(record, row, label, classes);
                row_loss[row] = 0.0;
            } else {
                row_loss[row] = static_cast<double>((max - xr[label]) + log_sum);
            }
        }
    }
}

// out () = scale · Σ values; one block, a fixed order of additions: the same result on every run.
template <typename T>
__global__ void scaled_sum_kernel(const double* __restrict__ values, std::int64_t count, double scale,
                                  T* __restrict__ out) {
    double sum = 0.0;
    for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += values[i];
    sum = block_reduce(sum, SumOp{}, 0.0);
    if (threadIdx.x == 0) *out = static_cast<T>(sum * scale);
}

// dy ()  ->  dlogits (N,C) = (exp(logits - lse) - onehot(label)) · dy / N; a row with a bad label
// (reported again: the labels may have changed since the forward) gets 0.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ logits, const std::int64_t* __restrict__ labels,
                                              const T* __restrict__ lse, std::int64_t rows, std::int64_t classes,
                                              const T* __restrict__ dy, T* __restrict__ dlogits,
                                              DeviceErrorRecord* record) {
    const T scale = *dy / static_cast<T>(rows);
    const std::int64_t n = rows * classes;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t row = i / classes;
        const std::int64_t c = i - row * classes;
        const std::int64_t label = labels[row];
        if (label < 0 || label >= classes) {
            if (c == 0) report_label_out_of_range(record, row, label, classes);
            dlogits[i] = T(0);
            continue;
        }
        const T p = device_exp(logits[i] - lse[row]);
        dlogits[i] = (c == label ? p - T(1) : p) * scale;
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

// x (outer, n, inner) -> y same shape, normalised over n (attrs.axis)
Tensor softmax_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    if (y.numel() == 0) return y;
    DeviceContext& ctx = context_for(x);
    const AxisSplit s = split_at(x.shape(), args.attrs.axis);
    const bool log = args.op == OpType::LogSoftmax;
    dispatch_floating(x.dtype(), "softmax", [&]<typename T>() {
        const T* px = x.data<T>();
        T* py = y.data<T>();
        if (s.inner == 1) {
            launch_rows(ctx, s.outer, s.n, [&]<bool kBlockPerRow>(unsigned blocks) {
                softmax_rows_forward_kernel<T, kBlockPerRow><<<blocks, kThreads, 0, ctx.stream>>>(px, py, s.outer, s.n, log);
            });
        } else {
            softmax_columns_forward_kernel<T><<<grid_size(ctx, s.outer * s.inner, kThreads), kThreads, 0, ctx.stream>>>(
                px, py, s, log);
            DG_CUDA_CHECK_LAUNCH();
        }
    });
    return y;
}

// From the output y and dy (outer, n, inner):
//   softmax:     dx = y * (dy - Σ dy·y)
//   log_softmax: dx = dy - exp(y) * Σ dy
std::vector<Tensor> softmax_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& y = args.output;
    const Tensor& dy = args.grad_output;
    if (!args.needs_grad[0]) return {Tensor()};
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (dx.numel() == 0) return {dx};
    DeviceContext& ctx = context_for(x);
    const AxisSplit s = split_at(x.shape(), args.attrs.axis);
    const bool log = args.op == OpType::LogSoftmax;
    dispatch_floating(x.dtype(), "softmax backward", [&]<typename T>() {
        const T* py = y.data<T>();
        const T* pdy = dy.data<T>();
        T* pdx = dx.data<T>();
        if (s.inner == 1) {
            launch_rows(ctx, s.outer, s.n, [&]<bool kBlockPerRow>(unsigned blocks) {
                softmax_rows_backward_kernel<T, kBlockPerRow><<<blocks, kThreads, 0, ctx.stream>>>(py, pdy, pdx, s.outer,
                                                                                                  s.n, log);
            });
        } else {
            softmax_columns_backward_kernel<T>
                <<<grid_size(ctx, s.outer * s.inner, kThreads), kThreads, 0, ctx.stream>>>(py, pdy, pdx, s, log);
            DG_CUDA_CHECK_LAUNCH();
        }
    });
    return {dx};
}

// logits (N,C)  labels (N) int64  loss () = mean_i [log Σ_c exp(logits_ic) - logits_i,label_i]
// Per-row log-sum-exp and loss in one kernel, then a one-block sum: no host synchronisation. Saves
// lse (N) so the backward rebuilds the softmax without another pass of reductions.
Tensor cross_entropy_forward(const ForwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    const Tensor& labels = args.inputs[1];
    const std::int64_t rows = logits.size(0);
    const std::int64_t classes = logits.size(1);
    Tensor loss = Tensor::empty(args.out.shape, args.out.dtype, logits.device());
    Tensor lse = Tensor::empty({rows}, logits.dtype(), logits.device());
    if (rows == 0) {  // infer::cross_entropy rejects empty logits; the mean of nothing is NaN
        loss.fill(std::numeric_limits<double>::quiet_NaN());
        args.saved.push_back(lse);
        return loss;
    }
    DeviceContext& ctx = context_for(logits);
    Workspace row_loss(ctx, static_cast<std::size_t>(rows) * sizeof(double));
    auto* row_loss_data = static_cast<double*>(row_loss.data());
    dispatch_floating(logits.dtype(), "cross_entropy", [&]<typename T>() {
        const T* px = logits.data<T>();
        const std::int64_t* plabels = labels.data<std::int64_t>();
        T* plse = lse.data<T>();
        launch_rows(ctx, rows, classes, [&]<bool kBlockPerRow>(unsigned blocks) {
            cross_entropy_rows_kernel<T, kBlockPerRow><<<blocks, kThreads, 0, ctx.stream>>>(
                px, plabels, rows, classes, plse, row_loss_data, ctx.error_record_device);
        });
        scaled_sum_kernel<T><<<1, kThreads, 0, ctx.stream>>>(row_loss_data, rows, 1.0 / static_cast<double>(rows),
                                                             loss.data<T>());
        DG_CUDA_CHECK_LAUNCH();
    });
    args.saved.push_back(lse);
    return loss;
}

// dloss () -> dlogits (N,C) = (softmax(logits) - onehot(labels)) * dloss / N; labels get no gradient.
std::vector<Tensor> cross_entropy_backward(const BackwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    const Tensor& labels = args.inputs[1];
    std::vector<Tensor> grads(2);
    if (!args.needs_grad[0]) return grads;
    if (args.saved.size() != 1) throw Error("internal: cross_entropy backward needs the forward's log-sum-exp");
    const Tensor& lse = args.saved[0];
    const std::int64_t rows = logits.size(0);
    const std::int64_t classes = logits.size(1);
    grads[0] = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    const std::int64_t n = logits.numel();
    if (n == 0) return grads;
    DeviceContext& ctx = context_for(logits);
    dispatch_floating(logits.dtype(), "cross_entropy backward", [&]<typename T>() {
        cross_entropy_backward_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            logits.data<T>(), labels.data<std::int64_t>(), lse.data<T>(), rows, classes, args.grad_output.data<T>(),
            grads[0].data<T>(), ctx.error_record_device);
        DG_CUDA_CHECK_LAUNCH();
    });
    return grads;
}

// prediction, target (any shape, the same)  loss () = mean((prediction - target)²)
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

// dloss () -> dprediction = 2 (prediction - target) / n * dloss, dtarget = -dprediction
std::vector<Tensor> mse_loss_backward(const BackwardArgs& args) {
    const Tensor& prediction = args.inputs[0];
    const Tensor& target = args.inputs[1];
    std::vector<Tensor> grads(2);
    for (std::size_t i = 0; i < 2; ++i)
        if (args.needs_grad[i]) grads[i] = Tensor::empty(prediction.shape(), prediction.dtype(), prediction.device());
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

}  // namespace dyngrad::cuda
