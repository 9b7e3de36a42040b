// Indexing ops on the GPU (ops/indexing.h): row and element gathers, the additions of many values into one
// destination (embedding / index_select / gather backward, scatter_add), and where / masked_fill.
// CPU reference: ops/indexing.cpp. Grid-stride loops throughout; no op allocates outside the pool or waits.
//
// Additions into shared destinations go through one mechanism, scatter_rows_add: source row r (`width`
// contiguous elements) is added into destination row keys[r]; keys[r] == skip (padding, a bad index) adds
// nothing. Two ways, chosen by cuda::deterministic():
//  - fast (default): one atomicAdd per element. The order of additions into one destination, hence its last
//    bits, may change from run to run.
//  - deterministic: a stable CUB radix sort of (key, r) pairs brings each destination's rows together in
//    index order; the thread of a run's first element (per column) sums the run in that order and adds it
//    once. Bitwise-identical across runs, at the price of the sort and of one thread per destination and
//    column (a destination named very often is summed by one thread).
// Out-of-range indices are reported through the device error record (raised at the next host wait) and
// read or add nothing.
#include <bit>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduced_precision.cuh"
#include "dyngrad/ops/select_gradients.h"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;

// The first failing kernel claims the record; `what` is a host string literal naming the op.
__device__ void report_index_out_of_range(DeviceErrorRecord* record, const char* what, std::int64_t position,
                                          std::int64_t index, std::int64_t bound) {
    if (atomicCAS(&record->code, static_cast<int>(DeviceErrorCode::none),
                  static_cast<int>(DeviceErrorCode::index_out_of_range)) == static_cast<int>(DeviceErrorCode::none)) {
        record->index = position;
        record->value = index;
        record->bound = bound;
        record->what = what;
    }
}

// Where a bad index is reported and what its op is called.
struct IndexCheck {
    DeviceErrorRecord* record;
    const char* what;
};

// x (outer, n, inner), index (L) -> y (outer, L, inner); a bad index gives a zero row. E moves the bytes.
template <typename E>
__global__ void select_rows_kernel(const E* __restrict__ x, const std::int64_t* __restrict__ index,
                                   E* __restrict__ y, std::int64_t outer, std::int64_t n, std::int64_t count,
                                   std::int64_t inner, IndexCheck check) {
    const std::int64_t total = outer * count * inner;
    for (std::int64_t i = thread_index(); i < total; i += thread_count()) {
        const std::int64_t row = i / inner;  // o·count + l
        const std::int64_t c = i - row * inner;
        const std::int64_t o = row / count;
        const std::int64_t l = row - o * count;
        const std::int64_t v = index[l];
        if (v < 0 || v >= n) {
            if (o == 0 && c == 0) report_index_out_of_range(check.record, check.what, l, v, n);
            y[i] = E(0);
            continue;
        }
        y[i] = x[(o * n + v) * inner + c];
    }
}

// keys[r] for dy's row r = o·count + l: destination row o·n + index[l]; `skip` (= outer·n) for padding
// and bad indices. rows[r] = r (the sort's values) when rows is not null.
__global__ void row_keys_kernel(const std::int64_t* __restrict__ index, std::int64_t outer, std::int64_t n,
                                std::int64_t count, std::int64_t padding_idx, std::uint64_t* __restrict__ keys,
                                std::uint64_t* __restrict__ rows, IndexCheck check) {
    const std::int64_t total = outer * count;
    const auto skip = static_cast<std::uint64_t>(outer * n);
    for (std::int64_t r = thread_index(); r < total; r += thread_count()) {
        const std::int64_t o = r / count;
        const std::int64_t l = r - o * count;
        const std::int64_t v = index[l];
        if (v < 0 || v >= n) {
            if (o == 0) report_index_out_of_range(check.record, check.what, l, v, n);
            keys[r] = skip;
        } else {
            keys[r] = v == padding_idx ? skip : static_cast<std::uint64_t>(o * n + v);
        }
        if (rows) rows[r] = static_cast<std::uint64_t>(r);
    }
}

// index (index's shape) -> y[e] = x[walk(e) + index[e]·axis_stride]; a bad index gives 0.
template <typename E>
__global__ void gather_kernel(const E* __restrict__ x, const std::int64_t* __restrict__ index, E* __restrict__ y,
                              std::int64_t count, IndexedWalk walk, IndexCheck check) {
    for (std::int64_t e = thread_index(); e < count; e += thread_count()) {
        const std::int64_t v = index[e];
        if (v < 0 || v >= walk.axis_size) {
            report_index_out_of_range(check.record, check.what, e, v, walk.axis_size);
            y[e] = E(0);
            continue;
        }
        std::int64_t base[1];
        walk.element.offsets(e, base);
        y[e] = x[base[0] + v * walk.axis_stride];
    }
}

// keys[e] = the flat destination of index element e in the indexed tensor (`skip` for a bad index).
__global__ void element_keys_kernel(const std::int64_t* __restrict__ index, std::int64_t count, IndexedWalk walk,
                                    std::uint64_t skip, std::uint64_t* __restrict__ keys,
                                    std::uint64_t* __restrict__ rows, IndexCheck check) {
    for (std::int64_t e = thread_index(); e < count; e += thread_count()) {
        const std::int64_t v = index[e];
        if (v < 0 || v >= walk.axis_size) {
            report_index_out_of_range(check.record, check.what, e, v, walk.axis_size);
            keys[e] = skip;
        } else {
            std::int64_t base[1];
            walk.element.offsets(e, base);
            keys[e] = static_cast<std::uint64_t>(base[0] + v * walk.axis_stride);
        }
        if (rows) rows[e] = static_cast<std::uint64_t>(e);
    }
}

// ---- scatter_rows_add: dst[keys[r]·width + c] += src[r·width + c] ----

template <typename T>
__global__ void scatter_rows_atomic_kernel(const std::uint64_t* __restrict__ keys, std::uint64_t skip,
                                           const T* __restrict__ src, T* __restrict__ dst, std::int64_t rows,
                                           std::int64_t width) {
    const std::int64_t total = rows * width;
    for (std::int64_t i = thread_index(); i < total; i += thread_count()) {
        const std::int64_t r = i / width;
        const std::uint64_t key = keys[r];
        if (key == skip) continue;
        atomicAdd(dst + static_cast<std::int64_t>(key) * width + (i - r * width), src[i]);
    }
}

// sorted_keys / sorted_rows: the pairs after a stable sort by key. The thread of (first row of a run of equal
// keys, column c) adds the run's values in row order, then adds the sum into dst once: no other thread
// writes that destination element.
template <typename T>
__global__ void scatter_rows_sorted_kernel(const std::uint64_t* __restrict__ sorted_keys,
                                           const std::uint64_t* __restrict__ sorted_rows, std::uint64_t skip,
                                           const T* __restrict__ src, T* __restrict__ dst, std::int64_t rows,
                                           std::int64_t width) {
    const std::int64_t total = rows * width;
    for (std::int64_t i = thread_index(); i < total; i += thread_count()) {
        const std::int64_t r = i / width;
        const std::int64_t c = i - r * width;
        const std::uint64_t key = sorted_keys[r];
        if (key == skip || (r > 0 && sorted_keys[r - 1] == key)) continue;
        T sum = T(0);
        for (std::int64_t j = r; j < rows && sorted_keys[j] == key; ++j)
            sum += src[static_cast<std::int64_t>(sorted_rows[j]) * width + c];
        dst[static_cast<std::int64_t>(key) * width + c] += sum;
    }
}

// Source row r of `width` elements goes into destination row key(r); make_keys(keys, rows) fills the keys
// (and rows[r] = r when rows is not null) for the `rows` source rows, with `skip` for those adding nothing.
template <typename T, typename MakeKeys>
void scatter_rows_add(DeviceContext& ctx, std::int64_t rows, std::int64_t width, std::uint64_t skip, const T* src,
                      T* dst, MakeKeys make_keys) {
    if (rows == 0 || width == 0) return;
    const auto count = static_cast<std::size_t>(rows);
    if (!deterministic()) {
        Workspace keys(ctx, count * sizeof(std::uint64_t));
        auto* k = static_cast<std::uint64_t*>(keys.data());
        make_keys(k, nullptr);
        scatter_rows_atomic_kernel<T><<<grid_size(ctx, rows * width, kThreads), kThreads, 0, ctx.stream>>>(
            k, skip, src, dst, rows, width);
        DG_CUDA_CHECK_LAUNCH();
        return;
    }
    // Keys lie in [0, skip]: sorting only their low bits saves radix passes.
    const int end_bit = std::max(1, static_cast<int>(std::bit_width(skip)));
    std::size_t sort_bytes = 0;
    DG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const std::uint64_t*>(nullptr),
                                                  static_cast<std::uint64_t*>(nullptr),
                                                  static_cast<const std::uint64_t*>(nullptr),
                                                  static_cast<std::uint64_t*>(nullptr), rows, 0, end_bit, ctx.stream));
    // One workspace: keys, rows, sorted keys, sorted rows, then CUB's scratch (offsets stay 8-byte aligned;
    // CUB aligns its own allocations inside its scratch).
    Workspace workspace(ctx, 4 * count * sizeof(std::uint64_t) + sort_bytes);
    auto* keys = static_cast<std::uint64_t*>(workspace.data());
    std::uint64_t* row_ids = keys + count;
    std::uint64_t* sorted_keys = row_ids + count;
    std::uint64_t* sorted_rows = sorted_keys + count;
    void* sort_scratch = sorted_rows + count;
    make_keys(keys, row_ids);
    DG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_scratch, sort_bytes, keys, sorted_keys, row_ids, sorted_rows,
                                                  rows, 0, end_bit, ctx.stream));
    scatter_rows_sorted_kernel<T><<<grid_size(ctx, rows * width, kThreads), kThreads, 0, ctx.stream>>>(
        sorted_keys, sorted_rows, skip, src, dst, rows, width);
    DG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_selected_rows(const Tensor& dy, const Tensor& index, const AxisSplit& s, std::int64_t skip_row,
                       const char* what, Tensor& dx) {
    DeviceContext& ctx = context_for(dx);
    const std::int64_t count = index.numel();
    const std::int64_t src_rows = s.outer * count;
    const auto skip = static_cast<std::uint64_t>(s.outer * s.size);
    const IndexCheck check{ctx.error_record_device, what};
    const std::int64_t* idx = index.data<std::int64_t>();
    dispatch_floating(dx.dtype(), what, [&]<typename T>() {
        scatter_rows_add<T>(ctx, src_rows, s.inner, skip, dy.data<T>(), dx.data<T>(),
                            [&](std::uint64_t* keys, std::uint64_t* rows) {
                                row_keys_kernel<<<grid_size(ctx, src_rows, kThreads), kThreads, 0, ctx.stream>>>(
                                    idx, s.outer, s.size, count, skip_row, keys, rows, check);
                                DG_CUDA_CHECK_LAUNCH();
                            });
    });
}

void add_elements(const Tensor& src, const Tensor& index, const IndexedWalk& walk, const char* what, Tensor& dst) {
    DeviceContext& ctx = context_for(dst);
    const std::int64_t count = index.numel();
    const auto skip = static_cast<std::uint64_t>(dst.numel());
    const IndexCheck check{ctx.error_record_device, what};
    const std::int64_t* idx = index.data<std::int64_t>();
    dispatch_floating(dst.dtype(), what, [&]<typename T>() {
        scatter_rows_add<T>(ctx, count, 1, skip, src.data<T>(), dst.data<T>(),
                            [&](std::uint64_t* keys, std::uint64_t* rows) {
                                element_keys_kernel<<<grid_size(ctx, count, kThreads), kThreads, 0, ctx.stream>>>(
                                    idx, count, walk, skip, keys, rows, check);
                                DG_CUDA_CHECK_LAUNCH();
                            });
    });
}

void select_rows(const Tensor& x, const Tensor& index, const AxisSplit& s, const char* what, Tensor& y) {
    const std::int64_t total = y.numel();
    if (total == 0) return;
    DeviceContext& ctx = context_for(x);
    const unsigned grid = grid_size(ctx, total, kThreads);
    const IndexCheck check{ctx.error_record_device, what};
    const std::int64_t* idx = index.data<std::int64_t>();
    with_element_word(dtype_size(x.dtype()), [&]<typename E>() {
        select_rows_kernel<E><<<grid, kThreads, 0, ctx.stream>>>(static_cast<const E*>(x.raw_data()), idx,
                                                                 static_cast<E*>(y.raw_data()), s.outer, s.size,
                                                                 index.numel(), s.inner, check);
    });
    DG_CUDA_CHECK_LAUNCH();
}

void gather_elements(const Tensor& x, const Tensor& index, const IndexedWalk& walk, const char* what, Tensor& y) {
    const std::int64_t count = index.numel();
    if (count == 0) return;
    DeviceContext& ctx = context_for(x);
    const unsigned grid = grid_size(ctx, count, kThreads);
    const IndexCheck check{ctx.error_record_device, what};
    const std::int64_t* idx = index.data<std::int64_t>();
    with_element_word(dtype_size(x.dtype()), [&]<typename E>() {
        gather_kernel<E><<<grid, kThreads, 0, ctx.stream>>>(static_cast<const E*>(x.raw_data()), idx,
                                                            static_cast<E*>(y.raw_data()), count, walk, check);
    });
    DG_CUDA_CHECK_LAUNCH();
}

namespace {

// where: y[i] = c != 0 ? a : b, operands (c, a, b) read through the walk.
template <typename T>
__global__ void where_kernel(const T* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                             T* __restrict__ y, std::int64_t n, StridedWalk<3> walk) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
        std::int64_t at[3];
        walk.offsets(i, at);
        y[i] = to_acc(c[at[0]]) != acc_t<T>(0) ? a[at[1]] : b[at[2]];
    }
}

// masked_fill: y[i] = m != 0 ? value : x[i], the mask read through the walk.
template <typename T>
__global__ void masked_fill_kernel(const T* __restrict__ x, const T* __restrict__ m, T value, T* __restrict__ y,
                                   std::int64_t n, StridedWalk<1> walk) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
        std::int64_t at[1];
        walk.offsets(i, at);
        y[i] = to_acc(m[at[0]]) != acc_t<T>(0) ? value : x[i];
    }
}

// out[i] = dy[i] where (condition != 0) == when_true, else 0; dy's shape (the engine sums it down).
template <typename T>
__global__ void routed_kernel(const T* __restrict__ dy, const T* __restrict__ c, bool when_true, T* __restrict__ out,
                              std::int64_t n, StridedWalk<1> walk) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
        std::int64_t at[1];
        walk.offsets(i, at);
        out[i] = (to_acc(c[at[0]]) != acc_t<T>(0)) == when_true ? dy[i] : from_acc<T>(0);
    }
}

template <typename T>
Tensor routed(DeviceContext& ctx, const Tensor& dy, const Tensor& condition, bool when_true) {
    Tensor out = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    if (dy.numel() == 0) return out;
    const Shape shapes[1] = {condition.shape()};
    routed_kernel<T><<<grid_size(ctx, dy.numel(), kThreads), kThreads, 0, ctx.stream>>>(
        dy.data<T>(), condition.data<T>(), when_true, out.data<T>(), dy.numel(), broadcast_walk(dy.shape(), shapes));
    DG_CUDA_CHECK_LAUNCH();
    return out;
}

}  // namespace

Tensor select_forward(const ForwardArgs& args) {
    DeviceContext& ctx = context_for(args.inputs[0]);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, args.inputs[0].device());
    const std::int64_t n = y.numel();
    if (n == 0) return y;
    const unsigned grid = grid_size(ctx, n, kThreads);
    dispatch_gpu_floating(args.out.dtype, "where / masked_fill", [&]<typename T>() {
        if (args.op == OpType::Where) {
            const Shape shapes[3] = {args.inputs[0].shape(), args.inputs[1].shape(), args.inputs[2].shape()};
            where_kernel<T><<<grid, kThreads, 0, ctx.stream>>>(args.inputs[0].data<T>(), args.inputs[1].data<T>(),
                                                               args.inputs[2].data<T>(), y.data<T>(), n,
                                                               broadcast_walk(args.out.shape, shapes));
        } else {
            const Shape shapes[1] = {args.inputs[1].shape()};
            masked_fill_kernel<T><<<grid, kThreads, 0, ctx.stream>>>(
                args.inputs[0].data<T>(), args.inputs[1].data<T>(), convert_element<T>(args.attrs.scalar), y.data<T>(), n,
                broadcast_walk(args.out.shape, shapes));
        }
        DG_CUDA_CHECK_LAUNCH();
    });
    return y;
}

std::vector<Tensor> select_backward(const BackwardArgs& args) {
    DeviceContext& ctx = context_for(args.grad_output);
    return select_gradients(args, [&](const Tensor& dy, const Tensor& condition, bool when_true) {
        return dispatch_gpu_floating(dy.dtype(), "where / masked_fill backward",
                                 [&]<typename T>() { return routed<T>(ctx, dy, condition, when_true); });
    });
}

}  // namespace dyngrad::cuda
