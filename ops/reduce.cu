// Reductions on the GPU: sum and mean over a set of axes, max over one axis, and the engine's sum_over
// (broadcast gradients). Same semantics as the CPU kernels in ops/reduce.cpp.
//
// A sum first sees x as runs (size-1 axes dropped, neighbouring axes of the same kind merged), then:
//  - nothing reduced          -> a device copy;
//  - everything reduced       -> cub::DeviceReduce::Sum;
//  - one reduced run with kept axes after it, x (outer, rows, inner) -> column sums, coalesced along inner;
//  - anything else (rows of a matrix, NCHW per-channel sums) -> one warp or block per output, reading the
//    reduced elements through strides.
// Accumulation is in acc_t of the input type (ops/reduced_precision.cuh: float for float32, bf16 and f16, no
// double arithmetic for them on the GPU); partial sums stay in it, and only the final store rounds to bf16/f16. To keep float32
// sums accurate (16M elements well within 1e-5 relative of a float64 reference), no thread adds more than
// kMaxChain elements in sequence: longer reductions are cut into partial sums that a second pass reduces,
// and everything above a thread is a tree (warp shuffles, cub::BlockReduce, shared memory, CUB's device
// reduction).
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduce_geometry.h"
#include "dyngrad/ops/vector_pack.cuh"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kWarp = 32;
constexpr int kMaxRank = 8;
constexpr std::int64_t kMaxChain = 256;        // most elements one thread adds in sequence
constexpr std::int64_t kMinChain = 16;         // fewest, when splitting only to occupy the GPU
constexpr std::int64_t kWarpReduceMax = 1024;  // reductions up to this length: one warp per output
constexpr unsigned kColumnWidth = 32;          // column sums: block of 32 columns x 8 row lanes
constexpr unsigned kColumnRows = 8;
constexpr std::int64_t kMaxGridYZ = 65535;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// A strided view of some of x's dims, innermost first, passed by value to kernels.
struct StridedDims {
    int rank;
    std::int64_t dims[kMaxRank];
    std::int64_t strides[kMaxRank];
};

// Element offset of the i-th index (row-major over dims). Constant-index loop: the struct stays in
// registers instead of being copied to local memory.
__device__ __forceinline__ std::int64_t offset_of(const StridedDims& sd, std::int64_t i) {
    std::int64_t offset = 0;
#pragma unroll
    for (int d = 0; d < kMaxRank; ++d) {
        if (d + 1 >= sd.rank) {  // the outermost dim takes what is left of i
            offset += i * sd.strides[d];
            break;
        }
        offset += (i % sd.dims[d]) * sd.strides[d];
        i /= sd.dims[d];
    }
    return offset;
}

// ---- the shape of a reduction: ops/reduce_geometry.h ----

void push_dim(StridedDims& sd, std::int64_t dim, std::int64_t stride) {
    if (sd.rank == kMaxRank)
        throw ShapeError(
            str("reduction needs more than ", kMaxRank, " strided dims; the CUDA kernels support ", kMaxRank));
    sd.dims[sd.rank] = dim;
    sd.strides[sd.rank] = stride;
    ++sd.rank;
}

// The kept and the reduced runs with their strides in x (contiguous), innermost first.
void split_runs(const std::vector<Run>& runs, StridedDims& kept, StridedDims& red) {
    kept = StridedDims{};
    red = StridedDims{};
    std::int64_t stride = 1;
    for (std::size_t k = runs.size(); k-- > 0;) {
        push_dim(runs[k].reduced ? red : kept, runs[k].size, stride);
        stride *= runs[k].size;
    }
}

StridedDims row_dims(std::int64_t dim, std::int64_t stride) {
    StridedDims sd{};
    push_dim(sd, dim, stride);
    return sd;
}

// y[o] = (sum over j < n_red of x[kept(o) + red(j)]) / divisor; one warp per output (short reductions).
// In: x's element type; Out: y's (acc_t<In> for partial sums); the sum in A = acc_t<In>.
template <typename In, typename Out, typename A = acc_t<In>>
__global__ void warp_sum_kernel(const In* __restrict__ x, Out* __restrict__ y, StridedDims kept, StridedDims red,
                                std::int64_t n_out, std::int64_t n_red, A divisor) {
    using WarpReduce = cub::WarpReduce<A>;
    constexpr unsigned kWarps = kThreads / kWarp;
    __shared__ typename WarpReduce::TempStorage temp[kWarps];
    const unsigned warp = threadIdx.x / kWarp;
    const unsigned lane = threadIdx.x % kWarp;
    for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp; o < n_out;
         o += static_cast<std::int64_t>(gridDim.x) * kWarps) {
        const In* base = x + offset_of(kept, o);
        A acc = A(0);
        for (std::int64_t j = lane; j < n_red; j += kWarp) acc += to_acc(base[offset_of(red, j)]);
        const A total = WarpReduce(temp[warp]).Sum(acc);
        if (lane == 0) y[o] = from_acc<Out>(total / divisor);
        __syncwarp();  // temp[warp] is reused by the next output
    }
}

// One block per item = (output o, split s): y[item] = (sum over j in [s*chunk, (s+1)*chunk) ∩ [0, n_red)
// of x[kept(o) + red(j)]) / divisor, item = o*splits + s. With splits > 1, y holds partial sums.
template <typename In, typename Out, typename A = acc_t<In>>
__global__ void block_sum_kernel(const In* __restrict__ x, Out* __restrict__ y, StridedDims kept, StridedDims red,
                                 std::int64_t items, std::int64_t splits, std::int64_t chunk, std::int64_t n_red,
                                 A divisor) {
    using BlockReduce = cub::BlockReduce<A, kThreads>;
    __shared__ typename BlockReduce::TempStorage temp;
    for (std::int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const std::int64_t o = item / splits;
        const std::int64_t begin = (item - o * splits) * chunk;
        const std::int64_t end = begin + chunk < n_red ? begin + chunk : n_red;
        const In* base = x + offset_of(kept, o);
        A acc = A(0);
        for (std::int64_t j = begin + threadIdx.x; j < end; j += kThreads) acc += to_acc(base[offset_of(red, j)]);
        const A total = BlockReduce(temp).Sum(acc);
        if (threadIdx.x == 0) y[item] = from_acc<Out>(total / divisor);
        __syncthreads();  // temp is reused by the next item
    }
}

// x (outer, rows, inner) -> y (outer, inner) = column sums / divisor. Block (32, 8): threadIdx.x walks
// inner (coalesced), threadIdx.y strides over the rows, a shared-memory tree adds the 8 row lanes.
// Split over gridDim.z: slice z sums rows [z*rows_per_split, ...) into the partials y + z*outer*inner.
template <typename In, typename Out, typename A = acc_t<In>>
__global__ void column_sum_kernel(const In* __restrict__ x, Out* __restrict__ y, std::int64_t outer, std::int64_t rows,
                                  std::int64_t inner, std::int64_t rows_per_split, A divisor) {
    __shared__ A lanes[kColumnRows][kColumnWidth];
    const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kColumnWidth + threadIdx.x;
    const std::int64_t row_begin = static_cast<std::int64_t>(blockIdx.z) * rows_per_split;
    const std::int64_t row_end = row_begin + rows_per_split < rows ? row_begin + rows_per_split : rows;
    Out* out = y + static_cast<std::int64_t>(blockIdx.z) * outer * inner;
    for (std::int64_t o = blockIdx.y; o < outer; o += gridDim.y) {  // uniform per block: barriers are safe
        A acc = A(0);
        if (i < inner) {
            const In* column = x + o * rows * inner + i;
            for (std::int64_t r = row_begin + threadIdx.y; r < row_end; r += kColumnRows)
                acc += to_acc(column[r * inner]);
        }
        lanes[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
#pragma unroll
        for (unsigned half = kColumnRows / 2; half > 0; half /= 2) {
            if (threadIdx.y < half) lanes[threadIdx.y][threadIdx.x] += lanes[threadIdx.y + half][threadIdx.x];
            __syncthreads();
        }
        if (threadIdx.y == 0 && i < inner) out[o * inner + i] = from_acc<Out>(lanes[0][threadIdx.x] / divisor);
        __syncthreads();  // lanes is reused by the next o
    }
}

template <typename T>
__global__ void divide_kernel(T* y, T divisor) {
    y[0] /= divisor;
}

// How many pieces to cut each of `items` reductions of `length` elements into, when `lanes` threads share
// a piece: enough that no thread adds more than kMaxChain elements in sequence, and more while the GPU
// would be short of blocks (down to kMinChain elements per thread).
std::int64_t choose_splits(DeviceContext& ctx, std::int64_t items, std::int64_t length, std::int64_t lanes) {
    std::int64_t splits = ceil_div(length, lanes * kMaxChain);
    const std::int64_t wanted_blocks = 4 * static_cast<std::int64_t>(std::max(ctx.multiprocessors, 1));
    if (items * splits < wanted_blocks)
        splits = std::max(splits, std::min(ceil_div(wanted_blocks, items), ceil_div(length, lanes * kMinChain)));
    return splits;
}

// y (kept dims) = sums of x over the reduced dims / divisor, one warp or block per output; long
// reductions go through partial sums and a second pass over them.
template <typename In, typename Out, typename A = acc_t<In>>
void strided_sums(DeviceContext& ctx, const In* x, Out* y, const StridedDims& kept, const StridedDims& red,
                  std::int64_t n_out, std::int64_t n_red, A divisor) {
    if (n_red <= kWarpReduceMax) {
        const unsigned blocks = grid_size(ctx, n_out * kWarp, kThreads);  // a warp per output
        warp_sum_kernel<In, Out><<<blocks, kThreads, 0, ctx.stream>>>(x, y, kept, red, n_out, n_red, divisor);
        DG_CUDA_CHECK_LAUNCH();
        return;
    }
    const std::int64_t chunk = ceil_div(n_red, choose_splits(ctx, n_out, n_red, kThreads));
    const std::int64_t splits = ceil_div(n_red, chunk);  // no empty pieces
    const std::int64_t items = n_out * splits;
    const unsigned blocks = grid_size(ctx, items * kThreads, kThreads);  // a block per item
    if (splits == 1) {
        block_sum_kernel<In, Out>
            <<<blocks, kThreads, 0, ctx.stream>>>(x, y, kept, red, items, 1, chunk, n_red, divisor);
        DG_CUDA_CHECK_LAUNCH();
        return;
    }
    Workspace partial(ctx, static_cast<std::size_t>(items) * sizeof(A));  // (n_out, splits), in A: no rounding
    A* partial_sums = static_cast<A*>(partial.data());
    block_sum_kernel<In, A>
        <<<blocks, kThreads, 0, ctx.stream>>>(x, partial_sums, kept, red, items, splits, chunk, n_red, A(1));
    DG_CUDA_CHECK_LAUNCH();
    strided_sums<A, Out>(ctx, static_cast<const A*>(partial_sums), y, row_dims(n_out, splits), row_dims(splits, 1),
                         n_out, splits, divisor);
}

// x (outer, rows, inner) -> y (outer, inner) = column sums / divisor, with partial sums over row
// slices and a second pass when the rows are long.
template <typename In, typename Out, typename A = acc_t<In>>
void column_sums(DeviceContext& ctx, const In* x, Out* y, std::int64_t outer, std::int64_t rows, std::int64_t inner,
                 A divisor) {
    const std::int64_t column_blocks = ceil_div(inner, kColumnWidth);
    const std::int64_t splits_wanted =
        std::min(choose_splits(ctx, column_blocks * outer, rows, kColumnRows), kMaxGridYZ);
    const std::int64_t rows_per_split = ceil_div(rows, splits_wanted);
    const std::int64_t splits = ceil_div(rows, rows_per_split);  // no empty slices
    const dim3 block(kColumnWidth, kColumnRows);
    const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(std::min(outer, kMaxGridYZ)),
                    static_cast<unsigned>(splits));
    if (splits == 1) {
        column_sum_kernel<In, Out>
            <<<grid, block, 0, ctx.stream>>>(x, y, outer, rows, inner, rows_per_split, divisor);
        DG_CUDA_CHECK_LAUNCH();
        return;
    }
    // (splits, outer*inner), in A: no rounding
    Workspace partial(ctx, static_cast<std::size_t>(splits * outer * inner) * sizeof(A));
    A* partial_sums = static_cast<A*>(partial.data());
    column_sum_kernel<In, A>
        <<<grid, block, 0, ctx.stream>>>(x, partial_sums, outer, rows, inner, rows_per_split, A(1));
    DG_CUDA_CHECK_LAUNCH();
    column_sums<A, Out>(ctx, static_cast<const A*>(partial_sums), y, 1, splits, outer * inner, divisor);
}

// y = sum of all n elements of x / divisor
template <typename T>
void full_sum(DeviceContext& ctx, const T* x, T* y, std::int64_t n, T divisor) {
    std::size_t temp_bytes = 0;
    DG_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, temp_bytes, x, y, n, ctx.stream));
    Workspace temp(ctx, temp_bytes);
    DG_CUDA_CHECK(cub::DeviceReduce::Sum(temp.data(), temp_bytes, x, y, n, ctx.stream));
    DG_CUDA_CHECK_LAUNCH();
    if (divisor != T(1)) {
        divide_kernel<T><<<1, 1, 0, ctx.stream>>>(y, divisor);
        DG_CUDA_CHECK_LAUNCH();
    }
}

// y (the kept axes, in order) = x summed over the `reduced` axes, divided by `divisor` ('=').
template <typename T, typename A = acc_t<T>>
void reduce_sum(DeviceContext& ctx, const Tensor& x, Tensor& y, const std::vector<bool>& reduced, A divisor) {
    if (y.numel() == 0) return;
    if (x.numel() == 0) {  // a reduced axis is empty: sums are 0, means 0/0
        y.fill(static_cast<double>(A(0) / divisor));
        return;
    }
    const std::vector<Run> runs = reduction_runs(x.shape(), reduced);
    std::int64_t n_out = 1;
    std::int64_t n_red = 1;
    for (const Run& run : runs) (run.reduced ? n_red : n_out) *= run.size;
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    if (n_red == 1) {  // every reduced axis has size 1, so the divisor is 1 as well
        DG_CUDA_CHECK(
            cudaMemcpyAsync(yp, xp, static_cast<std::size_t>(n_out) * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream));
        return;
    }
    // CUB's device reduction accumulates in its input type: bf16/f16 take the block sums below (f32 partials).
    if (n_out == 1) {
        if constexpr (is_reduced_gpu_type_v<T>)
            return strided_sums<T, T>(ctx, xp, yp, StridedDims{}, row_dims(n_red, 1), 1, n_red, divisor);
        else
            return full_sum(ctx, xp, yp, n_red, divisor);
    }
    const auto reduced_runs = std::count_if(runs.begin(), runs.end(), [](const Run& r) { return r.reduced; });
    if (reduced_runs == 1 && !runs.back().reduced) {
        std::int64_t outer = 1;
        std::size_t k = 0;
        for (; !runs[k].reduced; ++k) outer *= runs[k].size;
        return column_sums<T, T>(ctx, xp, yp, outer, runs[k].size, n_out / outer, divisor);
    }
    StridedDims kept;
    StridedDims red;
    split_runs(runs, kept, red);
    strided_sums<T, T>(ctx, xp, yp, kept, red, n_out, n_red, divisor);
}

// dx[i] = dy[src(i)] * scale: dy broadcast back over the reduced axes (src has stride 0 along them)
template <typename T, typename A = acc_t<T>>
__global__ void expand_kernel(const T* __restrict__ dy, T* __restrict__ dx, std::int64_t n, StridedDims src, A scale) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count())
        dx[i] = from_acc<T>(to_acc(dy[offset_of(src, i)]) * scale);
}

// x's runs, innermost first, with the stride each steps through dy (the kept axes, contiguous).
StridedDims expand_dims(const std::vector<Run>& runs) {
    StridedDims sd{};
    std::int64_t stride = 1;
    for (std::size_t k = runs.size(); k-- > 0;) {
        push_dim(sd, runs[k].size, runs[k].reduced ? 0 : stride);
        if (!runs[k].reduced) stride *= runs[k].size;
    }
    if (sd.rank == 0) push_dim(sd, 1, 0);  // one element
    return sd;
}

// ---- max over one axis: x (outer, len, inner) ----

// The CPU kernels' rule (ops/reduce.cpp): NaN counts as the maximum (NumPy, PyTorch) and ties go to the first
// index, so the first NaN wins if there is one, else the first maximal element. The parallel scans below
// reproduce it. (They once skipped every NaN but one at index 0, the CPU's old rule: max and argmax of a row
// holding a NaN then differed between the backends.)
template <typename T>
struct ArgMax {
    T value;
    std::int64_t index;  // < 0: no candidate yet
};

template <typename T>
__device__ __forceinline__ ArgMax<T> better_of(const ArgMax<T>& a, const ArgMax<T>& b) {
    if (b.index < 0) return a;
    if (a.index < 0) return b;
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan != b_nan) return b_nan ? b : a;
    if (a_nan) return b.index < a.index ? b : a;
    return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

// inner == 1: y[o], argmax[o] over the row x[o, :]; one warp per row, in blocks of two warps (a few hundred rows
// still spread over the SMs: with 256-thread blocks 256 rows of 1024 ran on 32 SMs, 11.4 µs on an H200), each
// lane with four loads in flight, 16-byte ones when every row starts 16-byte aligned (`packed`; better_of picks by
// value, then index: the order of the candidates is free).
constexpr unsigned kMaxRowThreads = 64;
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads) max_rows_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                  std::int64_t* __restrict__ argmax,
                                                                  std::int64_t outer, std::int64_t len, bool packed) {
    using vector_pack::Pack;
    constexpr unsigned kWarps = kMaxRowThreads / kWarp;
    constexpr int kWidth = Pack<T>::width;
    const unsigned lane = threadIdx.x % kWarp;
    for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp; o < outer;
         o += static_cast<std::int64_t>(gridDim.x) * kWarps) {
        using A = acc_t<T>;  // exact for every T: compares as T would, shuffles as float
        const T* row = x + o * len;
        ArgMax<A> best{A(0), -1};
        const auto take = [&](const Pack<T>& pack, std::int64_t p) {
#pragma unroll
            for (int e = 0; e < kWidth; ++e) best = better_of(best, ArgMax<A>{to_acc(pack.v[e]), p * kWidth + e});
        };
        if (packed) {  // len is a whole number of packs
            const std::int64_t packs = len / kWidth;
            std::int64_t p = lane;
            for (; p + 3 * kWarp < packs; p += 4 * kWarp) {
                const Pack<T> a = vector_pack::load_pack(row, p), b = vector_pack::load_pack(row, p + kWarp),
                              c = vector_pack::load_pack(row, p + 2 * kWarp), d = vector_pack::load_pack(row, p + 3 * kWarp);
                take(a, p);
                take(b, p + kWarp);
                take(c, p + 2 * kWarp);
                take(d, p + 3 * kWarp);
            }
            for (; p < packs; p += kWarp) take(vector_pack::load_pack(row, p), p);
        } else {
            std::int64_t r = lane;
            for (; r + 3 * kWarp < len; r += 4 * kWarp) {
                const T a = row[r], b = row[r + kWarp], c = row[r + 2 * kWarp], d = row[r + 3 * kWarp];
                best = better_of(best, better_of(better_of(ArgMax<A>{to_acc(a), r}, ArgMax<A>{to_acc(b), r + kWarp}),
                                                 better_of(ArgMax<A>{to_acc(c), r + 2 * kWarp},
                                                           ArgMax<A>{to_acc(d), r + 3 * kWarp})));
            }
            for (; r < len; r += kWarp) best = better_of(best, ArgMax<A>{to_acc(row[r]), r});
        }
#pragma unroll
        for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
            const ArgMax<A> other{__shfl_down_sync(0xffffffffu, best.value, offset),
                                  __shfl_down_sync(0xffffffffu, best.index, offset)};
            best = better_of(best, other);
        }
        if (lane == 0) {
            y[o] = from_acc<T>(best.value);
            argmax[o] = best.index;
        }
    }
}

// inner > 1: y[o, i], argmax[o, i] over x[o, :, i]; one thread per (o, i), coalesced along i
template <typename T>
__global__ void max_columns_kernel(const T* __restrict__ x, T* __restrict__ y, std::int64_t* __restrict__ argmax,
                                   std::int64_t outer, std::int64_t len, std::int64_t inner) {
    for (std::int64_t k = thread_index(); k < outer * inner; k += thread_count()) {
        const std::int64_t o = k / inner;
        const T* column = x + o * len * inner + (k - o * inner);
        acc_t<T> best = to_acc(column[0]);
        std::int64_t best_r = 0;
        for (std::int64_t r = 1; r < len; ++r) {
            const acc_t<T> v = to_acc(column[r * inner]);
            if (v > best || (v != v && best == best)) {  // the first NaN wins (see ArgMax)
                best = v;
                best_r = r;
            }
        }
        y[k] = from_acc<T>(best);
        argmax[k] = best_r;
    }
}

// dx[o, r, i] = r == argmax[o, i] ? dy[o, i] : 0    dy, argmax (outer, inner)  dx (outer, len, inner)
template <typename T>
__global__ void max_backward_kernel(const T* __restrict__ dy, const std::int64_t* __restrict__ argmax,
                                    T* __restrict__ dx, std::int64_t n, std::int64_t len, std::int64_t inner) {
    for (std::int64_t k = thread_index(); k < n; k += thread_count()) {
        const std::int64_t t = k / inner;
        const std::int64_t o = t / len;
        const std::int64_t j = o * inner + (k - t * inner);
        dx[k] = argmax[j] == t - o * len ? dy[j] : from_acc<T>(0);
    }
}

}  // namespace

Tensor reduce_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    DeviceContext& ctx = context_for(x);
    const std::vector<bool> reduced = reduced_axes(x.shape(), args.attrs.axes);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    dispatch_gpu_floating(x.dtype(), "reduce_forward", [&]<typename T>() {
        using A = acc_t<T>;
        const A divisor = args.op == OpType::Mean ? static_cast<A>(reduced_count(x.shape(), reduced)) : A(1);
        reduce_sum<T>(ctx, x, y, reduced, divisor);
    });
    return y;
}

std::vector<Tensor> reduce_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    if (!args.needs_grad[0]) return {Tensor()};
    DeviceContext& ctx = context_for(x);
    const std::vector<bool> reduced = reduced_axes(x.shape(), args.attrs.axes);
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    const std::int64_t n = x.numel();
    if (n == 0) return {dx};
    dispatch_gpu_floating(x.dtype(), "reduce_backward", [&]<typename T>() {
        // scale = 1/count as on the CPU, so both backends round alike
        using A = acc_t<T>;
        const A scale = args.op == OpType::Mean ? A(1) / static_cast<A>(reduced_count(x.shape(), reduced)) : A(1);
        expand_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            args.grad_output.data<T>(), dx.data<T>(), n, expand_dims(reduction_runs(x.shape(), reduced)), scale);
        DG_CUDA_CHECK_LAUNCH();
    });
    return {dx};
}

// x (outer, len, inner) -> y (outer, inner); saved[0]: argmax (outer, inner) int64, the first maximal index
Tensor max_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    DeviceContext& ctx = context_for(x);
    const MaxForward f = max_forward_outputs(args);
    const AxisSplit v = f.split;
    const Tensor &y = f.y, &argmax = f.argmax;
    const std::int64_t n_out = v.outer * v.inner;
    if (n_out > 0) {
        dispatch_gpu_floating(x.dtype(), "max_forward", [&]<typename T>() {
            if (v.inner == 1)
                max_rows_kernel<T><<<grid_size(ctx, n_out * kWarp, kMaxRowThreads), kMaxRowThreads, 0, ctx.stream>>>(
                    x.data<T>(), y.data<T>(), argmax.data<std::int64_t>(), v.outer, v.size,
                    (v.size * static_cast<std::int64_t>(sizeof(T))) % 16 == 0 &&
                        vector_pack::pack_count<T>(v.size, {x.data<T>()}) > 0);
            else
                max_columns_kernel<T><<<grid_size(ctx, n_out, kThreads), kThreads, 0, ctx.stream>>>(
                    x.data<T>(), y.data<T>(), argmax.data<std::int64_t>(), v.outer, v.size, v.inner);
            DG_CUDA_CHECK_LAUNCH();
        });
    }
    return y;
}

// dy (outer, inner) -> dx (outer, len, inner): dy at each slice's argmax, zero elsewhere
std::vector<Tensor> max_backward(const BackwardArgs& args) {
    const std::optional<MaxBackward> plan = max_backward_plan(args);
    if (!plan) return {Tensor()};
    const MaxBackward& p = *plan;
    DeviceContext& ctx = context_for(p.x);
    Tensor dx = Tensor::empty(p.x.shape(), p.x.dtype(), p.x.device());
    const std::int64_t n = p.x.numel();
    if (n == 0) return {dx};
    dispatch_gpu_floating(p.x.dtype(), "max_backward", [&]<typename T>() {
        max_backward_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            p.dy.data<T>(), p.argmax.data<std::int64_t>(), dx.data<T>(), n, p.split.size, p.split.inner);
        DG_CUDA_CHECK_LAUNCH();
    });
    return {dx};
}

Tensor sum_over(const Tensor& x, std::span<const int> axes) {
    DeviceContext& ctx = context_for(x);
    std::vector<bool> reduced(x.rank(), false);
    Shape shape = x.shape();
    for (const int axis : axes) {
        const int a = normalize_axis(axis, x.rank());
        reduced[a] = true;
        shape[a] = 1;
    }
    Tensor y = Tensor::empty(shape, x.dtype(), x.device());
    dispatch_gpu_floating(x.dtype(), "sum_over",
                          [&]<typename T>() { reduce_sum<T>(ctx, x, y, reduced, acc_t<T>(1)); });
    return y;
}

}  // namespace dyngrad::cuda
