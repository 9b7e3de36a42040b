// Tensor statistics for anomaly mode (graph/anomaly.h) on the GPU: min/max over the finite elements and
// NaN/Inf counts, as the CPU kernel in ops/tensor_stats.cpp computes them. Per-block partials, then one
// block combines them (no atomics); the host reads the result, which waits for the stream: anomaly mode
// is a debugging mode and synchronises on purpose.
#include <cub/block/block_reduce.cuh>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;

// Statistics of some elements: min/max over the finite ones (the identities while there are none).
template <typename T>
struct Partial {
    T min, max;
    long long nan_count, inf_count;
};

template <typename T>
__host__ __device__ Partial<T> identity_partial() {
    if constexpr (std::is_floating_point_v<T>)
        return {std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(), 0, 0};
    else
        return {std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest(), 0, 0};
}

struct Combine {
    template <typename T>
    __device__ Partial<T> operator()(const Partial<T>& a, const Partial<T>& b) const {
        return {b.min < a.min ? b.min : a.min, b.max > a.max ? b.max : a.max, a.nan_count + b.nan_count,
                a.inf_count + b.inf_count};
    }
};

// x (n) -> partials (gridDim.x): each block's statistics of its grid-stride share of x
template <typename T>
__global__ void stats_partials_kernel(const T* x, std::int64_t n, Partial<T>* partials) {
    Partial<T> p = identity_partial<T>();
    for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
        const T v = x[i];
        if constexpr (std::is_floating_point_v<T>) {
            if (isnan(v)) {
                ++p.nan_count;
                continue;
            }
            if (isinf(v)) {
                ++p.inf_count;
                continue;
            }
        }
        p.min = v < p.min ? v : p.min;
        p.max = v > p.max ? v : p.max;
    }
    using BlockReduce = cub::BlockReduce<Partial<T>, kThreads>;
    __shared__ typename BlockReduce::TempStorage temp;
    const Partial<T> total = BlockReduce(temp).Reduce(p, Combine{});
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// partials (count) -> out (1), one block
template <typename T>
__global__ void stats_combine_kernel(const Partial<T>* partials, unsigned count, Partial<T>* out) {
    Partial<T> p = identity_partial<T>();
    for (unsigned i = threadIdx.x; i < count; i += blockDim.x) p = Combine{}(p, partials[i]);
    using BlockReduce = cub::BlockReduce<Partial<T>, kThreads>;
    __shared__ typename BlockReduce::TempStorage temp;
    const Partial<T> total = BlockReduce(temp).Reduce(p, Combine{});
    if (threadIdx.x == 0) *out = total;
}

template <typename T>
TensorStats stats_of(const Tensor& x) {
    TensorStats stats;
    stats.numel = x.numel();
    if (x.numel() == 0) return stats;
    DeviceContext& ctx = context_for(x);
    const unsigned blocks = grid_size(ctx, x.numel(), kThreads);
    Workspace partials(ctx, (blocks + 1) * sizeof(Partial<T>));
    auto* partials_data = static_cast<Partial<T>*>(partials.data());
    stats_partials_kernel<T><<<blocks, kThreads, 0, ctx.stream>>>(x.data<T>(), x.numel(), partials_data);
    DG_CUDA_CHECK_LAUNCH();
    stats_combine_kernel<T><<<1, kThreads, 0, ctx.stream>>>(partials_data, blocks, partials_data + blocks);
    DG_CUDA_CHECK_LAUNCH();
    Partial<T> total{};
    copy(&total, Device::cpu(), partials_data + blocks, x.device(), sizeof(total));  // waits for the stream
    stats.nan_count = total.nan_count;
    stats.inf_count = total.inf_count;
    if (total.nan_count + total.inf_count < x.numel()) {  // some element is finite
        stats.min = static_cast<double>(total.min);
        stats.max = static_cast<double>(total.max);
    }
    return stats;
}

}  // namespace

// x (any shape, any dtype) -> its statistics, on the host
TensorStats tensor_stats(const Tensor& x) {
    switch (x.dtype()) {
        case DType::f32: return stats_of<float>(x);
        case DType::f64: return stats_of<double>(x);
        case DType::i64: return stats_of<std::int64_t>(x);
        // bf16/f16 -> f32 is exact (one conversion kernel): the f32 statistics are the tensor's.
        case DType::bf16:
        case DType::f16: return stats_of<float>(x.to(DType::f32));
    }
    throw DTypeError(str("tensor_stats: unknown dtype code ", static_cast<int>(x.dtype())));
}

}  // namespace dyngrad::cuda
