// Elementwise kernels: unary math and activations, binary ops with NumPy broadcasting, and the engine's
// gradient accumulation. The scalar formulas are ops/elementwise_math.h, shared with the CPU kernels
// (ops/elementwise.cpp); this file only adds indexing and launches.
// Over 600 lines: the unary, binary and broadcast launches and, at the end, the softmax kernels (the activations
// along an axis); they share only the launch helpers, and the end keeps them clear of edits above.
//
// bf16/f16 natively (ops/reduced_precision.cuh): each kernel loads T, computes in acc_t<T> (float for them) and
// rounds once on store, so its result is the f32 formula's rounded once.
//
// Contiguous operands go through 16-byte vector accesses (float4 / double2 width) with a scalar tail.
// Pool allocations are 256-byte aligned and tensors are never offset views, so the vector path always
// applies; pack_count() still checks, and falls back to the scalar loop for anything unaligned.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduced_precision.cuh"
#include "dyngrad/ops/vector_pack.cuh"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;
constexpr int kMaxRank = 8;  // broadcast rank after merging dims (see broadcast_layout)

// Pack, load_pack, store_pack, pack_count: ops/vector_pack.cuh; thread_index, thread_count: cuda/context.h.
using namespace vector_pack;

unsigned vector_blocks(const DeviceContext& ctx, std::int64_t n, std::int64_t packs) {
    return vector_pack::vector_blocks(ctx, n, packs, kThreads);
}

// ---- unary: x, y, dy, dx all (n) ----

template <typename T, typename Op>
__global__ void unary_forward_kernel(const T* __restrict__ x, T* __restrict__ y, std::int64_t n, std::int64_t packs,
                                     math::UnaryScalars<acc_t<T>> s) {
    constexpr int W = Pack<T>::width;
    for (std::int64_t p = thread_index(); p < packs; p += thread_count()) {
        const Pack<T> xv = load_pack(x, p);
        Pack<T> yv;
#pragma unroll
        for (int k = 0; k < W; ++k) yv.v[k] = from_acc<T>(math::apply_forward<Op>(to_acc(xv.v[k]), s));
        store_pack(y, p, yv);
    }
    for (std::int64_t i = packs * W + thread_index(); i < n; i += thread_count())
        y[i] = from_acc<T>(math::apply_forward<Op>(to_acc(x[i]), s));
}

// dx = dy * Op'(x, y; s). kReadsY false: the formula reads x only (its PointwiseFormula says so), y is not loaded
// (x stands in for it): a third of GELU's backward traffic on GPT-2 (319 µs per call, ncu, H200, 2026-11-29).
template <typename T, typename Op, bool kReadsY>
__global__ void unary_backward_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy,
                                      T* __restrict__ dx, std::int64_t n, std::int64_t packs,
                                      math::UnaryScalars<acc_t<T>> s) {
    constexpr int W = Pack<T>::width;
    for (std::int64_t p = thread_index(); p < packs; p += thread_count()) {
        const Pack<T> xv = load_pack(x, p);
        const Pack<T> yv = kReadsY ? load_pack(y, p) : xv;
        const Pack<T> dyv = load_pack(dy, p);
        Pack<T> dxv;
#pragma unroll
        for (int k = 0; k < W; ++k)
            dxv.v[k] = from_acc<T>(to_acc(dyv.v[k]) *
                                   math::apply_derivative<Op>(to_acc(xv.v[k]), to_acc(yv.v[k]), s));
        store_pack(dx, p, dxv);
    }
    for (std::int64_t i = packs * W + thread_index(); i < n; i += thread_count())
        dx[i] = from_acc<T>(to_acc(dy[i]) *
                            math::apply_derivative<Op>(to_acc(x[i]), to_acc(kReadsY ? y[i] : x[i]), s));
}

// ---- binary, same shapes: a, b, y, dy, da, db all (n) ----

template <typename T, typename Op>
__global__ void binary_forward_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                                      std::int64_t n, std::int64_t packs) {
    constexpr int W = Pack<T>::width;
    for (std::int64_t p = thread_index(); p < packs; p += thread_count()) {
        const Pack<T> av = load_pack(a, p);
        const Pack<T> bv = load_pack(b, p);
        Pack<T> yv;
#pragma unroll
        for (int k = 0; k < W; ++k) yv.v[k] = from_acc<T>(Op::forward(to_acc(av.v[k]), to_acc(bv.v[k])));
        store_pack(y, p, yv);
    }
    for (std::int64_t i = packs * W + thread_index(); i < n; i += thread_count())
        y[i] = from_acc<T>(Op::forward(to_acc(a[i]), to_acc(b[i])));
}

// da = dy * dOp/da, db = dy * dOp/db; a null da or db is not computed
template <typename T, typename Op>
__global__ void binary_backward_kernel(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ dy,
                                       T* __restrict__ da, T* __restrict__ db, std::int64_t n, std::int64_t packs) {
    constexpr int W = Pack<T>::width;
    for (std::int64_t p = thread_index(); p < packs; p += thread_count()) {
        const Pack<T> av = load_pack(a, p);
        const Pack<T> bv = load_pack(b, p);
        const Pack<T> dyv = load_pack(dy, p);
        Pack<T> g;
        if (da != nullptr) {
#pragma unroll
            for (int k = 0; k < W; ++k)
                g.v[k] = from_acc<T>(to_acc(dyv.v[k]) * Op::d_a(to_acc(av.v[k]), to_acc(bv.v[k])));
            store_pack(da, p, g);
        }
        if (db != nullptr) {
#pragma unroll
            for (int k = 0; k < W; ++k)
                g.v[k] = from_acc<T>(to_acc(dyv.v[k]) * Op::d_b(to_acc(av.v[k]), to_acc(bv.v[k])));
            store_pack(db, p, g);
        }
    }
    for (std::int64_t i = packs * W + thread_index(); i < n; i += thread_count()) {
        const acc_t<T> av = to_acc(a[i]);
        const acc_t<T> bv = to_acc(b[i]);
        if (da != nullptr) da[i] = from_acc<T>(to_acc(dy[i]) * Op::d_a(av, bv));
        if (db != nullptr) db[i] = from_acc<T>(to_acc(dy[i]) * Op::d_b(av, bv));
    }
}

// ---- binary with broadcasting ----

// Output dims with the element strides of a and b (0 along broadcast dims), innermost dim first,
// passed by value to the kernels. 32-bit Index when every offset fits (fast division).
template <typename Index>
struct BroadcastIndex {
    int rank;
    Index dims[kMaxRank];
    Index a_strides[kMaxRank];
    Index b_strides[kMaxRank];
};

// Offsets into a and b of output element i. Constant-index loop so the struct stays in registers.
template <typename Index>
__device__ __forceinline__ void broadcast_offsets(const BroadcastIndex<Index>& bi, Index i, Index& ia, Index& ib) {
    ia = 0;
    ib = 0;
#pragma unroll
    for (int d = 0; d < kMaxRank; ++d) {
        if (d + 1 >= bi.rank) {  // the outermost dim takes what is left of i
            ia += i * bi.a_strides[d];
            ib += i * bi.b_strides[d];
            break;
        }
        const Index coord = i % bi.dims[d];
        i /= bi.dims[d];
        ia += coord * bi.a_strides[d];
        ib += coord * bi.b_strides[d];
    }
}

// y (out) = Op(a, b) with a, b read through broadcast strides
template <typename T, typename Op, typename Index>
__global__ void binary_forward_broadcast_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                                                Index n, BroadcastIndex<Index> bi) {
    const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
    for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        Index ia, ib;
        broadcast_offsets(bi, i, ia, ib);
        y[i] = from_acc<T>(Op::forward(to_acc(a[ia]), to_acc(b[ib])));
    }
}

// da, db, dy (out): da = dy * dOp/da, db = dy * dOp/db (the engine sums them to the input shapes)
template <typename T, typename Op, typename Index>
__global__ void binary_backward_broadcast_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                                 const T* __restrict__ dy, T* __restrict__ da, T* __restrict__ db,
                                                 Index n, BroadcastIndex<Index> bi) {
    const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
    for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        Index ia, ib;
        broadcast_offsets(bi, i, ia, ib);
        const acc_t<T> av = to_acc(a[ia]);
        const acc_t<T> bv = to_acc(b[ib]);
        if (da != nullptr) da[i] = from_acc<T>(to_acc(dy[i]) * Op::d_a(av, bv));
        if (db != nullptr) db[i] = from_acc<T>(to_acc(dy[i]) * Op::d_b(av, bv));
    }
}

// The broadcast of a and b to `out`, innermost dim first: size-1 output dims dropped, and neighbouring
// dims merged wherever both inputs step through them as one dim (e.g. (N,C,H,W) + (1,C,1,1) becomes
// HW x C x N), which keeps the per-element index arithmetic short.
struct BroadcastLayout {
    std::vector<std::int64_t> dims, a_strides, b_strides;
};

BroadcastLayout broadcast_layout(const Shape& out, const Shape& a, const Shape& b) {
    const std::size_t rank = out.size();
    // Element strides of an input aligned to the output's axes; 0 where it is broadcast.
    auto aligned_strides = [rank](const Shape& in) {
        std::vector<std::int64_t> strides(rank, 0);
        std::int64_t stride = 1;
        for (std::size_t k = 0; k < in.size(); ++k) {
            const std::size_t in_axis = in.size() - 1 - k;
            if (in[in_axis] != 1) strides[rank - 1 - k] = stride;
            stride *= in[in_axis];
        }
        return strides;
    };
    const std::vector<std::int64_t> sa = aligned_strides(a);
    const std::vector<std::int64_t> sb = aligned_strides(b);
    BroadcastLayout layout;
    for (std::size_t k = 0; k < rank; ++k) {
        const std::size_t axis = rank - 1 - k;
        if (out[axis] == 1) continue;
        if (!layout.dims.empty()) {
            const std::int64_t inner = layout.dims.back();
            if (sa[axis] == layout.a_strides.back() * inner && sb[axis] == layout.b_strides.back() * inner) {
                layout.dims.back() *= out[axis];
                continue;
            }
        }
        layout.dims.push_back(out[axis]);
        layout.a_strides.push_back(sa[axis]);
        layout.b_strides.push_back(sb[axis]);
    }
    if (layout.dims.empty()) {  // every dim is 1: one element
        layout.dims.push_back(1);
        layout.a_strides.push_back(0);
        layout.b_strides.push_back(0);
    }
    if (layout.dims.size() > static_cast<std::size_t>(kMaxRank))
        throw ShapeError(str("broadcast of ", to_string(a), " and ", to_string(b), " needs ", layout.dims.size(),
                             " distinct dims; the CUDA kernels support ", kMaxRank));
    return layout;
}

template <typename Index>
BroadcastIndex<Index> to_index(const BroadcastLayout& layout) {
    BroadcastIndex<Index> bi{};
    bi.rank = static_cast<int>(layout.dims.size());
    for (std::size_t d = 0; d < layout.dims.size(); ++d) {
        bi.dims[d] = static_cast<Index>(layout.dims[d]);
        bi.a_strides[d] = static_cast<Index>(layout.a_strides[d]);
        bi.b_strides[d] = static_cast<Index>(layout.b_strides[d]);
    }
    return bi;
}

// Calls launch.template operator()<Index>() with Index 32-bit when every index and offset (all bounded by n, as
// inputs are never larger than the output) fits with room for the grid-stride increment, else 64-bit.
template <typename Launch>
void with_index_type(std::int64_t n, Launch&& launch) {
    if (n <= (std::int64_t{1} << 30)) return launch.template operator()<std::uint32_t>();
    launch.template operator()<std::int64_t>();
}

// ---- accumulation: dst, src (n) ----

// dst += src (no __restrict__: the engine may pass a src that shares storage with dst)
template <typename T>
__global__ void add_into_kernel(T* dst, const T* src, std::int64_t n, std::int64_t packs) {
    constexpr int W = Pack<T>::width;
    for (std::int64_t p = thread_index(); p < packs; p += thread_count()) {
        Pack<T> d = load_pack(static_cast<const T*>(dst), p);
        const Pack<T> s = load_pack(src, p);
#pragma unroll
        for (int k = 0; k < W; ++k) d.v[k] = from_acc<T>(to_acc(d.v[k]) + to_acc(s.v[k]));
        store_pack(dst, p, d);
    }
    for (std::int64_t i = packs * W + thread_index(); i < n; i += thread_count())
        dst[i] = from_acc<T>(to_acc(dst[i]) + to_acc(src[i]));
}

}  // namespace

Tensor unary_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const DeviceContext& ctx = context_for(x);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    const std::int64_t n = x.numel();
    if (n == 0) return y;
    dispatch_gpu_floating(x.dtype(), "unary_forward", [&]<typename T>() {
        math::visit_unary(args.op, args.attrs, [&](auto op) {
            const T* xp = x.data<T>();
            T* yp = y.data<T>();
            const std::int64_t packs = pack_count<T>(n, {xp, yp});
            unary_forward_kernel<T, decltype(op)><<<vector_blocks(ctx, n, packs), kThreads, 0, ctx.stream>>>(
                xp, yp, n, packs, math::unary_scalars<acc_t<T>>(args.attrs));
            DG_CUDA_CHECK_LAUNCH();
        });
    });
    return y;
}

std::vector<Tensor> unary_backward(const BackwardArgs& args) {
    std::vector<Tensor> grads(1);
    if (!args.needs_grad[0]) return grads;
    const Tensor& x = args.inputs[0];
    const Tensor& dy = args.grad_output;
    const DeviceContext& ctx = context_for(x);
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    const std::int64_t n = x.numel();
    if (n > 0) {
        dispatch_gpu_floating(x.dtype(), "unary_backward", [&]<typename T>() {
            math::visit_unary(args.op, args.attrs, [&](auto op) {
                const T* xp = x.data<T>();
                const T* yp = args.output.data<T>();
                const T* dyp = dy.data<T>();
                T* dxp = dx.data<T>();
                const PointwiseFormula* formula = op_def(args.op).pointwise;
                const bool reads_y = formula == nullptr || formula->derivative_reads_output;
                const std::int64_t packs = pack_count<T>(n, {xp, reads_y ? yp : nullptr, dyp, dxp});
                const unsigned blocks = vector_blocks(ctx, n, packs);
                const auto scalars = math::unary_scalars<acc_t<T>>(args.attrs);
                if (reads_y)
                    unary_backward_kernel<T, decltype(op), true>
                        <<<blocks, kThreads, 0, ctx.stream>>>(xp, yp, dyp, dxp, n, packs, scalars);
                else
                    unary_backward_kernel<T, decltype(op), false>
                        <<<blocks, kThreads, 0, ctx.stream>>>(xp, nullptr, dyp, dxp, n, packs, scalars);
                DG_CUDA_CHECK_LAUNCH();
            });
        });
    }
    grads[0] = std::move(dx);
    return grads;
}

Tensor binary_forward(const ForwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Tensor& b = args.inputs[1];
    const DeviceContext& ctx = context_for(a);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, a.device());
    const std::int64_t n = y.numel();
    if (n == 0) return y;
    dispatch_gpu_floating(a.dtype(), "binary_forward", [&]<typename T>() {
        math::visit_binary(args.op, [&](auto op) {
            using Op = decltype(op);
            const T* ap = a.data<T>();
            const T* bp = b.data<T>();
            T* yp = y.data<T>();
            if (a.shape() == b.shape()) {
                const std::int64_t packs = pack_count<T>(n, {ap, bp, yp});
                binary_forward_kernel<T, Op>
                    <<<vector_blocks(ctx, n, packs), kThreads, 0, ctx.stream>>>(ap, bp, yp, n, packs);
                DG_CUDA_CHECK_LAUNCH();
            } else {
                const BroadcastLayout layout = broadcast_layout(y.shape(), a.shape(), b.shape());
                const unsigned blocks = grid_size(ctx, n, kThreads);
                with_index_type(n, [&]<typename Index>() {
                    binary_forward_broadcast_kernel<T, Op, Index><<<blocks, kThreads, 0, ctx.stream>>>(
                        ap, bp, yp, static_cast<Index>(n), to_index<Index>(layout));
                });
                DG_CUDA_CHECK_LAUNCH();
            }
        });
    });
    return y;
}

// Gradients come back in the output's shape; the engine sums each to its input's shape (sum_to).
std::vector<Tensor> binary_backward(const BackwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Tensor& b = args.inputs[1];
    const Tensor& dy = args.grad_output;
    std::vector<Tensor> grads(2);
    bool need_a = args.needs_grad[0];
    bool need_b = args.needs_grad[1];
    // dy itself is the gradient of a for add and sub, and of b for add: alias it (allowed by the
    // contract, graph/op_def.h) instead of launching a copy.
    if (need_a && (args.op == OpType::Add || args.op == OpType::Sub)) {
        grads[0] = dy;
        need_a = false;
    }
    if (need_b && args.op == OpType::Add) {
        grads[1] = dy;
        need_b = false;
    }
    if (!need_a && !need_b) return grads;

    const DeviceContext& ctx = context_for(a);
    Tensor da = need_a ? Tensor::empty(dy.shape(), dy.dtype(), dy.device()) : Tensor();
    Tensor db = need_b ? Tensor::empty(dy.shape(), dy.dtype(), dy.device()) : Tensor();
    const std::int64_t n = dy.numel();
    if (n > 0) {
        dispatch_gpu_floating(a.dtype(), "binary_backward", [&]<typename T>() {
            math::visit_binary(args.op, [&](auto op) {
                using Op = decltype(op);
                const T* ap = a.data<T>();
                const T* bp = b.data<T>();
                const T* dyp = dy.data<T>();
                T* dap = need_a ? da.data<T>() : nullptr;
                T* dbp = need_b ? db.data<T>() : nullptr;
                if (a.shape() == b.shape()) {
                    const std::int64_t packs = pack_count<T>(n, {ap, bp, dyp, dap, dbp});
                    binary_backward_kernel<T, Op>
                        <<<vector_blocks(ctx, n, packs), kThreads, 0, ctx.stream>>>(ap, bp, dyp, dap, dbp, n, packs);
                    DG_CUDA_CHECK_LAUNCH();
                } else {
                    const BroadcastLayout layout = broadcast_layout(dy.shape(), a.shape(), b.shape());
                    const unsigned blocks = grid_size(ctx, n, kThreads);
                    with_index_type(n, [&]<typename Index>() {
                        binary_backward_broadcast_kernel<T, Op, Index><<<blocks, kThreads, 0, ctx.stream>>>(
                            ap, bp, dyp, dap, dbp, static_cast<Index>(n), to_index<Index>(layout));
                    });
                    DG_CUDA_CHECK_LAUNCH();
                }
            });
        });
    }
    if (need_a) grads[0] = std::move(da);
    if (need_b) grads[1] = std::move(db);
    return grads;
}

void accumulate_into(Tensor& dst, const Tensor& src) {
    if (dst.dtype() != src.dtype() || dst.device() != src.device()) {
        const std::string message = str("accumulate ", describe(src), " into ", describe(dst));
        if (dst.dtype() != src.dtype()) throw DTypeError(message);
        throw DeviceError(message);
    }
    if (dst.shape() != src.shape())
        throw ShapeError(str("accumulate ", to_string(src.shape()), " into ", to_string(dst.shape())));
    const DeviceContext& ctx = context_for(dst);
    const std::int64_t n = dst.numel();
    if (n == 0) return;
    dispatch_gpu_floating(dst.dtype(), "accumulate_into", [&]<typename T>() {
        T* d = dst.data<T>();
        const T* s = src.data<T>();
        const std::int64_t packs = pack_count<T>(n, {d, s});
        add_into_kernel<T><<<vector_blocks(ctx, n, packs), kThreads, 0, ctx.stream>>>(d, s, n, packs);
        DG_CUDA_CHECK_LAUNCH();
    });
}

}  // namespace dyngrad::cuda

// ---- softmax, log_softmax: the activations along an axis, x seen as (outer, n, inner) ----
// Kept at the end of the file, with their include, so they stay apart from the elementwise kernels above. The
// row reductions are shared with the fused losses (ops/loss.cu).
#include "dyngrad/ops/row_reduction.cuh"

namespace dyngrad::cuda {

namespace {

using row_reduction::device_exp;
using row_reduction::device_log;
using row_reduction::launch_rows;
using row_reduction::lowest;
using row_reduction::MaxOp;
using row_reduction::RowTiling;
using row_reduction::SumOp;
// The block size launch_rows sizes its grid for.
constexpr unsigned kRowThreads = row_reduction::kThreads;

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
    for (std::int64_t col = thread_index(); col < columns; col += thread_count()) {
        const std::int64_t base = (col / s.inner) * s.size * s.inner + col % s.inner;
        const T* xc = x + base;
        T* yc = y + base;
        T max = lowest<T>();
        for (std::int64_t k = 0; k < s.size; ++k) max = MaxOp{}(max, xc[k * s.inner]);
        T sum = 0;
        for (std::int64_t k = 0; k < s.size; ++k) sum += device_exp(xc[k * s.inner] - max);
        if (log_softmax) {
            const T shift = max + device_log(sum);
            for (std::int64_t k = 0; k < s.size; ++k) yc[k * s.inner] = xc[k * s.inner] - shift;
        } else {
            for (std::int64_t k = 0; k < s.size; ++k) yc[k * s.inner] = device_exp(xc[k * s.inner] - max) / sum;
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
    for (std::int64_t col = thread_index(); col < columns; col += thread_count()) {
        const std::int64_t base = (col / s.inner) * s.size * s.inner + col % s.inner;
        const T* yc = y + base;
        const T* dyc = dy + base;
        T* dxc = dx + base;
        T sum = 0;
        for (std::int64_t k = 0; k < s.size; ++k) {
            const std::int64_t i = k * s.inner;
            sum += log_softmax ? dyc[i] : dyc[i] * yc[i];
        }
        for (std::int64_t k = 0; k < s.size; ++k) {
            const std::int64_t i = k * s.inner;
            dxc[i] = log_softmax ? dyc[i] - device_exp(yc[i]) * sum : yc[i] * (dyc[i] - sum);
        }
    }
}

}  // namespace

// x (outer, n, inner) -> y same shape, normalised over n (attrs.axis)
Tensor softmax_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    if (y.numel() == 0) return y;
    DeviceContext& ctx = context_for(x);
    const SoftmaxGeometry g = softmax_geometry(args.op, x.shape(), args.attrs.axis);
    const AxisSplit s = g.split;
    const bool log = g.log;
    dispatch_floating(x.dtype(), "softmax", [&]<typename T>() {
        const T* px = x.data<T>();
        T* py = y.data<T>();
        if (s.inner == 1) {
            launch_rows(ctx, s.outer, s.size, [&]<bool kBlockPerRow>(unsigned blocks) {
                softmax_rows_forward_kernel<T, kBlockPerRow>
                    <<<blocks, kRowThreads, 0, ctx.stream>>>(px, py, s.outer, s.size, log);
            });
        } else {
            softmax_columns_forward_kernel<T>
                <<<grid_size(ctx, s.outer * s.inner, kRowThreads), kRowThreads, 0, ctx.stream>>>(px, py, s, log);
            DG_CUDA_CHECK_LAUNCH();
        }
    });
    return y;
}

std::vector<Tensor> softmax_backward(const BackwardArgs& args) {
    const SoftmaxBackward b = softmax_backward_setup(args);
    if (b.nothing_to_compute()) return {b.dx};
    DeviceContext& ctx = context_for(b.dx);
    const AxisSplit s = b.geometry.split;
    const bool log = b.geometry.log;
    dispatch_floating(b.dx.dtype(), "softmax backward", [&]<typename T>() {
        const T* py = args.output.data<T>();
        const T* pdy = args.grad_output.data<T>();
        T* pdx = b.dx.data<T>();
        if (s.inner == 1) {
            launch_rows(ctx, s.outer, s.size, [&]<bool kBlockPerRow>(unsigned blocks) {
                softmax_rows_backward_kernel<T, kBlockPerRow>
                    <<<blocks, kRowThreads, 0, ctx.stream>>>(py, pdy, pdx, s.outer, s.size, log);
            });
        } else {
            softmax_columns_backward_kernel<T>
                <<<grid_size(ctx, s.outer * s.inner, kRowThreads), kRowThreads, 0, ctx.stream>>>(py, pdy, pdx, s, log);
            DG_CUDA_CHECK_LAUNCH();
        }
    });
    return {b.dx};
}

}  // namespace dyngrad::cuda
