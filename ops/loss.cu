// Losses on the GPU: fused row kernels, deterministic reductions, no host synchronisation (losses stay on the
// device; the upstream gradient is read on the device; a bad label is reported through the device error
// record). CPU reference: ops/loss.cpp. The pointwise losses and mse_loss: ops/point_loss.cu. Row reductions:
// ops/row_reduction.cuh (shared with softmax, ops/elementwise.cu).
// Over 600 lines: linear_cross_entropy's GPU kernels (the LM head fused with the loss, ops/linear_cross_entropy.h)
// are here because they run cross_entropy's own row kernels on each chunk of logits.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/linalg_gemm.h"
#include "dyngrad/ops/linear_cross_entropy.h"
#include "dyngrad/ops/loss_math.h"
#include "dyngrad/ops/reduced_precision.cuh"
#include "dyngrad/ops/row_reduction.cuh"
#include "dyngrad/ops/vector_pack.cuh"

namespace dyngrad::cuda {

namespace {

using namespace row_reduction;  // ops/row_reduction.cuh
using vector_pack::Pack;         // ops/vector_pack.cuh

// ---- losses ----

using math::reduction_scale;  // ops/loss_math.h

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

// Whether row `row`'s label counts: not ignore_index and inside [0,C); one outside is reported (the host
// throws at its next wait) and counts as ignored.
__device__ __forceinline__ bool label_counts(std::int64_t label, std::int64_t row, std::int64_t classes,
                                             std::int64_t ignore_index, DeviceErrorRecord* record) {
    if (label == ignore_index) return false;
    if (label >= 0 && label < classes) return true;
    report_label_out_of_range(record, row, label, classes);
    return false;
}

// Whole 16-byte packs of T a row kernel may read at the start of each row of (rows, C) values whose rows are
// `row_stride` elements apart: C / width when every row starts aligned (the buffers are, and row_stride is a
// whole number of packs), else 0 (scalar loads only).
template <typename T>
std::int64_t row_packs_of(std::int64_t classes, std::int64_t row_stride, std::initializer_list<const void*> buffers) {
    return row_stride % Pack<T>::width == 0 ? vector_pack::pack_count<T>(classes, buffers) : 0;
}

// Where a class loss's rows kernel leaves the batch sums (finish_class_loss_in_last_block): the reduced loss
// `out` (Mean, Sum), sums = [D, W], and the block counter that finds the last block.
template <typename T>
struct BatchSums {
    Reduction reduction;
    T* out;
    double* sums;
    unsigned* counter;
};

// A class loss's outputs for one row: its loss and weight in double for the batch sums, the loss itself for
// a None reduction.
template <typename T>
__device__ __forceinline__ void store_row_loss(std::int64_t row, T loss, T label_weight, double* row_loss,
                                               double* row_weight, T* out_rows) {
    row_loss[row] = static_cast<double>(loss);
    row_weight[row] = static_cast<double>(label_weight);
    if (out_rows) out_rows[row] = loss;
}

// The batch sums of a class loss, by threads 0 to kThreads - 1 of one block in a fixed order of additions (any
// more threads of the block take part in its reductions with 0s: the same bits): sums = [D = Σ row_weight,
// W = Σ_c class_weight (C without)], out () = Σ row_loss / D (Mean) or Σ row_loss (Sum); nothing written to out for
// None. row_value(i) gives row i's loss and weight.
template <typename T, typename RowValue>
__device__ void reduce_class_loss_batch(RowValue row_value, std::int64_t rows, const T* __restrict__ weight,
                                        std::int64_t classes, Reduction reduction, T* __restrict__ out,
                                        double* __restrict__ sums) {
    double loss = 0.0, denominator = 0.0, weight_sum = 0.0;
    if (threadIdx.x < kThreads) {
        for (std::int64_t i = threadIdx.x; i < rows; i += kThreads) {
            const auto [row_loss, row_weight] = row_value(i);
            loss += row_loss;
            denominator += row_weight;
        }
        for (std::int64_t c = threadIdx.x; c < classes; c += kThreads)
            weight_sum += weight ? static_cast<double>(weight[c]) : 1.0;
    }
    loss = block_reduce(loss, SumOp{}, 0.0);
    denominator = block_reduce(denominator, SumOp{}, 0.0);
    weight_sum = block_reduce(weight_sum, SumOp{}, 0.0);
    if (threadIdx.x == 0) {
        sums[0] = denominator;
        sums[1] = weight_sum;
        if (reduction == Reduction::Mean) *out = static_cast<T>(loss / denominator);
        if (reduction == Reduction::Sum) *out = static_cast<T>(loss);
    }
}

// reduce_class_loss_batch over row values in global memory. They come from L2 (__ldcg): other blocks wrote them
// (and the rows kernels' row_loss / row_weight are not __restrict__: this block reads what it wrote through them).
template <typename T>
__device__ void class_loss_batch_sums(const double* row_loss, const double* row_weight,
                                      std::int64_t rows, const T* __restrict__ weight, std::int64_t classes,
                                      Reduction reduction, T* __restrict__ out, double* __restrict__ sums) {
    reduce_class_loss_batch(
        [&](std::int64_t i) { return std::pair{__ldcg(row_loss + i), __ldcg(row_weight + i)}; }, rows, weight,
        classes, reduction, out, sums);
}

// Where the rows kernels end: every block counts itself finished on `counter` (DeviceContext::block_counter),
// and the last one computes the batch sums, then leaves the counter at 0 again. This replaces a one-block
// finish kernel (3.2 µs of a launch-bound captured lenet5/MLP step) with the same additions in the same
// order (the rows kernels run kThreads threads per block, as that kernel did): the same bits. Every thread
// of the block must call it.
template <typename T>
__device__ void finish_class_loss_in_last_block(const BatchSums<T>& batch, const double* row_loss,
                                                const double* row_weight, std::int64_t rows,
                                                const T* __restrict__ weight, std::int64_t classes) {
    __shared__ bool last;
    __threadfence();  // this thread's row values are visible device-wide before its block counts as finished
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(batch.counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    class_loss_batch_sums(row_loss, row_weight, rows, weight, classes, batch.reduction, batch.out, batch.sums);
    if (threadIdx.x == 0) *batch.counter = 0;
}

// cross_entropy rows. logits (N,C) with rows `row_stride` elements apart (C, or more: linear_cross_entropy's aligned
// chunks; the first row_packs·width columns of each row are read by 16-byte packs: row_packs_of)  labels (N)
// class_weight (C) or null  ->  per row i:
//   lse (N) = log Σ_c exp(logits_ic),
//   row_loss (N) = (1 - ε)·w[y]·(lse - logits_i,y) + (ε/C)·Σ_c w[c]·(lse - logits_ic)   (0 when ignored),
//   row_weight (N) = w[y] (0 when ignored): the mean's denominator is their sum,
//   out_rows (N) = row_loss where the reduction is None (null otherwise).
// A label outside [0,C) that is not ignore_index is reported and counts as ignored. Row losses are kept
// in double so that the sum over the batch loses nothing to its order. With ε = 0 and no weights this is
// the plain fused log-sum-exp of two reductions per row; smoothing adds a third.
template <typename T, bool kBlockPerRow, typename X = T>
__global__ void cross_entropy_rows_kernel(const X* __restrict__ logits, const std::int64_t* __restrict__ labels,
                                          const T* __restrict__ weight, std::int64_t rows, std::int64_t classes,
                                          std::int64_t ignore_index, T smoothing, T* __restrict__ lse,
                                          double* row_loss, double* row_weight, T* __restrict__ out_rows,
                                          BatchSums<T> batch, DeviceErrorRecord* record, std::int64_t row_stride,
                                          std::int64_t row_packs) {
    using Rows = RowTiling<kBlockPerRow>;
    constexpr int W = Pack<X>::width;
    // A logit in T (X: T, or linear_cross_entropy's bf16/f16 logits of a 16-bit GEMM, computed in float32).
    const auto logit = [](X v) { return static_cast<T>(to_acc(v)); };
    for (std::int64_t row = Rows::first_row(); row < rows; row += Rows::row_step()) {
        const X* xr = logits + row * row_stride;
        // One read of the row (GPT-2's rows are 50257 long): each lane keeps its running max and its sum of
        // exp(x - that max), rescaled when the max grows; the lanes' sums are then rescaled to the row's max.
        T lane_max = lowest<T>(), lane_sum = 0;
        auto visit = [&](T v) {
            if (v > lane_max) {
                lane_sum = lane_sum * device_exp(lane_max - v) + T(1);
                lane_max = v;
            } else if (v != lowest<T>()) {  // -inf adds nothing (and exp(-inf - -inf) would be NaN)
                lane_sum += device_exp(v - lane_max);
            }
        };
        // 16-byte packs where every row starts aligned (row_packs = C / width, else 0), unrolled so that several
        // loads are in flight per thread. A pack joins the lane's sum once, from its own max: its exps are
        // independent of each other, where visiting value by value chains every exp on the last (GPT-2's bf16
        // logits read at 1.3 TB/s, 52 µs per 667-row chunk, ncu, H200, 2026-11-29).
#pragma unroll 4
        for (std::int64_t p = Rows::lane(); p < row_packs; p += Rows::width()) {
            const Pack<X> v = vector_pack::load_pack(xr, p);
            T values[W];
            T pack_max = lowest<T>();
#pragma unroll
            for (int k = 0; k < W; ++k) {
                values[k] = logit(v.v[k]);
                pack_max = values[k] > pack_max ? values[k] : pack_max;
            }
            if (!isfinite(pack_max)) {  // ±inf (or NaN only): value by value, as the tail
#pragma unroll
                for (int k = 0; k < W; ++k) visit(values[k]);
                continue;
            }
            if (pack_max > lane_max) {
                lane_sum *= device_exp(lane_max - pack_max);  // 0 while lane_max is -inf (and lane_sum 0)
                lane_max = pack_max;
            }
            T pack_sum = 0;  // a NaN logit makes it NaN, as visit does
#pragma unroll
            for (int k = 0; k < W; ++k) pack_sum += device_exp(values[k] - lane_max);
            lane_sum += pack_sum;
        }
        for (std::int64_t i = row_packs * W + Rows::lane(); i < classes; i += Rows::width()) visit(logit(xr[i]));
        const T max = Rows::reduce(lane_max, MaxOp{}, lowest<T>());
        const T sum = Rows::reduce(lane_max == max ? lane_sum : lane_sum * device_exp(lane_max - max), SumOp{}, T(0));
        const T log_sum = device_log(sum);
        T smooth = 0;
        if (smoothing != T(0)) {  // uniform over the launch, so the whole group reduces together
            const T row_lse = max + log_sum;
            for (std::int64_t i = Rows::lane(); i < classes; i += Rows::width())
                smooth += (weight ? weight[i] : T(1)) * (row_lse - logit(xr[i]));
            smooth = Rows::reduce(smooth, SumOp{}, T(0));
        }
        if (Rows::lane() == 0) {
            lse[row] = max + log_sum;
            const std::int64_t label = labels[row];
            T loss = 0, label_weight = 0;
            if (label_counts(label, row, classes, ignore_index, record)) {
                label_weight = weight ? weight[label] : T(1);
                loss = (T(1) - smoothing) * label_weight * ((max - logit(xr[label])) + log_sum);
                if (smoothing != T(0)) loss += smoothing / static_cast<T>(classes) * smooth;
            }
            store_row_loss(row, loss, label_weight, row_loss, row_weight, out_rows);
        }
    }
    finish_class_loss_in_last_block(batch, row_loss, row_weight, rows, weight, classes);
}

// cross_entropy of at most kSmallClasses classes (LeNet's and the MLPs' 10) and few rows: one block of
// kSmallThreads threads, `group` lanes per row (C rounded up to a power of two: 16 for 10 classes), every lane one
// class, every row in the one round (rows·group <= kSmallThreads: 64 rows of 10 classes). The row values wait in
// shared memory for reduce_class_loss_batch: the batch sums of the rows kernels, bit for bit. Measured against the rows kernel (CUPTI, H200, 2026-11-30): lenet5 b1's one
// row 4.0 µs (5.1), 64 rows 4.2 (4.1); with more rounds slower (256 rows in 4: 7.3 against 4.5), hence the limit;
// a thread per row was slower still (5.6 µs for one row: ~800 dependent instructions while the other warps wait).
constexpr std::int64_t kSmallClasses = 32;
constexpr unsigned kSmallThreads = 1024;
constexpr std::int64_t kSmallRows = kSmallThreads;  // rows·group <= kSmallThreads and group >= 1

template <typename T>
__global__ void __launch_bounds__(kSmallThreads)
    cross_entropy_small_kernel(const T* __restrict__ logits, const std::int64_t* __restrict__ labels,
                               const T* __restrict__ weight, std::int64_t rows, std::int64_t classes, int group,
                               std::int64_t ignore_index, T smoothing, T* __restrict__ lse, T* __restrict__ out_rows,
                               Reduction reduction, T* __restrict__ out, double* __restrict__ sums,
                               DeviceErrorRecord* record) {
    __shared__ double shared_loss[kSmallRows], shared_weight[kSmallRows];
    const auto group_reduce = [group](T v, auto op) {
        for (int offset = group / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
        return v;
    };
    const int lane = static_cast<int>(threadIdx.x) % group;  // the class this lane holds
    const std::int64_t groups = blockDim.x / group;
    // Every lane runs every round (the shuffles need the whole warp); rows past the end compute on -inf.
    for (std::int64_t first = 0; first < rows; first += groups) {
        const std::int64_t row = first + threadIdx.x / group;
        const bool active = row < rows;
        const T* xr = logits + row * classes;
        const std::int64_t label = active ? labels[row] : ignore_index;
        const T x = active && lane < classes ? xr[lane] : lowest<T>();
        const T max = group_reduce(x, MaxOp{});
        // -inf adds nothing; the max adds exactly 1 (also where it is +inf: inf - inf would be NaN); a NaN
        // logit makes the sum NaN (the max skips it, its exp does not).
        const T e = x == lowest<T>() ? T(0) : (x == max ? T(1) : device_exp(x - max));
        const T log_sum = device_log(group_reduce(e, SumOp{}));
        const T row_lse = max + log_sum;
        const bool counts = active && lane == 0 && label_counts(label, row, classes, ignore_index, record);
        const int label_lane = label >= 0 && label < classes ? static_cast<int>(label) : 0;
        const T label_x = __shfl_sync(0xffffffffu, x, label_lane, group);
        T smooth = 0;
        if (smoothing != T(0))  // uniform over the launch
            smooth = group_reduce(lane < classes ? (weight ? weight[lane] : T(1)) * (row_lse - x) : T(0), SumOp{});
        if (active && lane == 0) {
            T loss = 0, label_weight = 0;
            if (counts) {
                label_weight = weight ? weight[label] : T(1);
                loss = (T(1) - smoothing) * label_weight * ((max - label_x) + log_sum);
                if (smoothing != T(0)) loss += smoothing / static_cast<T>(classes) * smooth;
            }
            lse[row] = row_lse;
            if (out_rows) out_rows[row] = loss;
            shared_loss[row] = static_cast<double>(loss);
            shared_weight[row] = static_cast<double>(label_weight);
        }
    }
    __syncthreads();
    reduce_class_loss_batch([&](std::int64_t i) { return std::pair{shared_loss[i], shared_weight[i]}; }, rows,
                            weight, classes, reduction, out, sums);
}

// nll_loss rows, one thread each. log_probs (N,C)  labels (N)  class_weight (C) or null  ->
//   row_loss = -w[y]·log_probs_i,y, row_weight = w[y] (both 0 when ignored or reported), out_rows as above.
template <typename T>
__global__ void nll_rows_kernel(const T* __restrict__ log_probs, const std::int64_t* __restrict__ labels,
                                const T* __restrict__ weight, std::int64_t rows, std::int64_t classes,
                                std::int64_t ignore_index, double* row_loss, double* row_weight,
                                T* __restrict__ out_rows, BatchSums<T> batch,
                                DeviceErrorRecord* record) {
    for (std::int64_t row = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; row < rows;
         row += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t label = labels[row];
        T loss = 0, label_weight = 0;
        if (label_counts(label, row, classes, ignore_index, record)) {
            label_weight = weight ? weight[label] : T(1);
            loss = -label_weight * log_probs[row * classes + label];
        }
        store_row_loss(row, loss, label_weight, row_loss, row_weight, out_rows);
    }
    finish_class_loss_in_last_block(batch, row_loss, row_weight, rows, weight, classes);
}

// The batch sums over all rows of a chunked loss (linear_cross_entropy): one block, class_loss_batch_sums.
template <typename T>
__global__ void class_loss_batch_sums_kernel(const double* row_loss, const double* row_weight, std::int64_t rows,
                                             std::int64_t classes, Reduction reduction, T* __restrict__ out,
                                             double* __restrict__ sums) {
    class_loss_batch_sums<T>(row_loss, row_weight, rows, nullptr, classes, reduction, out, sums);
}

// out = unit · reduction_scale(dy): the backward of a Mean or Sum linear_cross_entropy from the forward's gradients.
// unit and dy in acc_t<T> (float32 for bf16/f16 inputs: the f32 sums of the forward, and the loss's dtype); the
// product in it, rounded once to T.
template <typename T>
__global__ void scale_by_upstream_kernel(const acc_t<T>* __restrict__ unit, T* __restrict__ out, std::int64_t n,
                                         Reduction reduction, const acc_t<T>* __restrict__ dy,
                                         const double* __restrict__ sums) {
    const acc_t<T> s = reduction_scale(reduction, dy, sums[0], 0);
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        out[i] = from_acc<T>(unit[i] * s);
}

// dloss () or (N)  ->  dlogits (N,C); s = reduction_scale, p = exp(logits - lse), W = sums[1]:
//   cross_entropy: s·[p·((1 - ε)·w[y] + (ε/C)·W) - (1 - ε)·w[y]·[c = y] - (ε/C)·w[c]]
//   nll_loss (lse null): -s·w[y]·[c = y]
// 0 in ignored rows and in rows with a bad label (reported again: the labels may have changed since the forward).
// A warp or a block per row (RowTiling, as the forward): the row's label, weight, lse and s are read and
// computed once per row, not per element (one element per thread over the flat N·C paid a 64-bit division
// and a double division per element: 117 µs for 4096×4096 float32 on the H100, ~2.5× the memory time), and
// rows whose start is 16-byte aligned (row_packs = C / width, else 0) go by 16-byte packs. The formula per
// element is the one the flat kernel had; without label smoothing every product with the row's values is exact
// ((1 - 0)·w[y], 0·W), so the bits are the same whatever the compiler contracts; with smoothing the row-invariant
// (1 - ε)·w[y] is now computed out of the column loop, and its subtraction at c = y may round once where an FMA
// did (or the reverse): one ulp of that one element at most.
template <typename T>
__device__ __forceinline__ T class_loss_gradient(bool nll, T logit, T lse, std::int64_t c, std::int64_t label,
                                                 T label_weight, const T* __restrict__ weight, T smoothing,
                                                 T smooth_per_class, T weight_sum, T s) {
    if (nll) return c == label ? -label_weight * s : T(0);
    const T p = device_exp(logit - lse);
    T g = p * ((T(1) - smoothing) * label_weight + smooth_per_class * weight_sum);
    if (c == label) g -= (T(1) - smoothing) * label_weight;
    if (smoothing != T(0)) g -= smooth_per_class * (weight ? weight[c] : T(1));
    return g * s;
}

// dlogits in Out: T, or bf16/f16 (linear_cross_entropy's 16-bit chunks, whose logits X are 16-bit too), rounded
// once per element. Rows are `row_stride` elements apart in logits and dlogits (C, or more: linear_cross_entropy's aligned
// chunks); the first row_packs·width columns go by packs (16 bytes of logits in, width elements of Out out:
// row_packs_of), the rest one element per thread; logits' columns from C on are not read, dlogits' are written 0
// (no class: linear_cross_entropy's GEMMs may run over them).
template <typename T, bool kBlockPerRow, typename Out = T, typename X = T>
__global__ void class_loss_backward_kernel(const X* __restrict__ logits, const std::int64_t* __restrict__ labels,
                                           const T* __restrict__ weight, const T* __restrict__ lse,
                                           const double* __restrict__ sums, std::int64_t rows, std::int64_t classes,
                                           std::int64_t row_packs, std::int64_t ignore_index, T smoothing,
                                           Reduction reduction, const T* __restrict__ dy, Out* __restrict__ dlogits,
                                           DeviceErrorRecord* record, std::int64_t row_stride) {
    static_assert(std::is_same_v<Out, T> || std::is_same_v<acc_t<Out>, T>, "dlogits: T or a 16-bit type of T");
    static_assert(std::is_same_v<X, T> || std::is_same_v<acc_t<X>, T>, "logits: T or a 16-bit type of T");
    using Rows = RowTiling<kBlockPerRow>;
    constexpr int W = Pack<X>::width;
    struct alignas(sizeof(Out) * W) OutPack {
        Out v[W];
    };
    const T smooth_per_class = smoothing / static_cast<T>(classes);
    const T weight_sum = static_cast<T>(sums[1]);
    for (std::int64_t row = Rows::first_row(); row < rows; row += Rows::row_step()) {
        const X* xr = logits + row * row_stride;
        Out* out = dlogits + row * row_stride;
        // Every load that does not need the label is issued before its test (the row's scale, lse and logits:
        // valid addresses in every row), so that they wait on memory together rather than after the label.
        const std::int64_t label = labels[row];
        const T row_scale = reduction_scale(reduction, dy, sums[0], row);
        const bool nll = lse == nullptr;
        const T row_lse = nll ? T(0) : lse[row];
        const bool counted = !(label == ignore_index || label < 0 || label >= classes);
        if (!counted && label != ignore_index && Rows::lane() == 0)
            report_label_out_of_range(record, row, label, classes);
        const T s = counted ? row_scale : T(0);
        const T label_weight = counted ? (weight ? weight[label] : T(1)) : T(0);
        // The gradient of logit c of this row (0 for a row that does not count).
        auto gradient = [&](T logit, std::int64_t c) {
            return counted ? class_loss_gradient(nll, logit, row_lse, c, label, label_weight, weight, smoothing,
                                                 smooth_per_class, weight_sum, s)
                           : T(0);
        };
        const bool read_logits = !nll;
#pragma unroll 4
        for (std::int64_t p = Rows::lane(); p < row_packs; p += Rows::width()) {
            Pack<X> v{};
            if (read_logits) v = vector_pack::load_pack(xr, p);
            OutPack g;
#pragma unroll
            for (int k = 0; k < W; ++k) g.v[k] = from_acc<Out>(gradient(static_cast<T>(to_acc(v.v[k])), p * W + k));
            reinterpret_cast<OutPack*>(out)[p] = g;
        }
        for (std::int64_t c = row_packs * W + Rows::lane(); c < classes; c += Rows::width())
            out[c] = from_acc<Out>(gradient(read_logits ? static_cast<T>(to_acc(xr[c])) : T(0), c));
        for (std::int64_t c = classes + Rows::lane(); c < row_stride; c += Rows::width()) out[c] = Out(0);
    }
}

// The backward of a class loss with at most kSmallClasses classes: a thread per element, `group` threads per row (C
// rounded up to a power of two, 2^group_shift), no loop and no pack path: class_loss_backward_kernel's warp per row
// ran ~300 instructions per warp for 10 classes (2.2 µs a launch against Inductor's 1.1; ncu, H200, 2026-11-30).
// The same formula per element (class_loss_gradient): the same bits.
template <typename T>
__global__ void class_loss_backward_small_kernel(const T* __restrict__ logits, const std::int64_t* __restrict__ labels,
                                                 const T* __restrict__ weight, const T* __restrict__ lse,
                                                 const double* __restrict__ sums, std::int64_t rows,
                                                 std::int64_t classes, int group_shift, std::int64_t ignore_index,
                                                 T smoothing, Reduction reduction, const T* __restrict__ dy,
                                                 T* __restrict__ dlogits, DeviceErrorRecord* record) {
    const bool nll = lse == nullptr;
    const std::int64_t total = rows << group_shift;
    for (std::int64_t thread = thread_index(); thread < total; thread += thread_count()) {
        const std::int64_t row = thread >> group_shift;
        const std::int64_t c = thread & ((std::int64_t{1} << group_shift) - 1);
        if (c >= classes) continue;
        // Every load that does not need the label is issued before its test.
        const std::int64_t label = labels[row];
        const T row_scale = reduction_scale(reduction, dy, sums[0], row);
        const T row_lse = nll ? T(0) : lse[row];
        const T logit = nll ? T(0) : logits[row * classes + c];
        const bool counted = !(label == ignore_index || label < 0 || label >= classes);
        if (!counted && label != ignore_index && c == 0) report_label_out_of_range(record, row, label, classes);
        T g = 0;
        if (counted)
            g = class_loss_gradient(nll, logit, row_lse, c, label, weight ? weight[label] : T(1), weight, smoothing,
                                    smoothing / static_cast<T>(classes), static_cast<T>(sums[1]), row_scale);
        dlogits[row * classes + c] = g;
    }
}

}  // namespace

// cross_entropy: logits (N,C), nll_loss: log_probs (N,C); labels (N) int64; class_weight (C) optional
//   -> loss () (Mean, Sum) or (N) (None); formulas in ops/loss.cpp. One rows kernel (per-row log-sum-exp and
// loss) whose last block to finish adds up the batch, or for few rows of at most 32 classes one block that does
// both (cross_entropy_small_kernel): one launch, no host synchronisation. Saves
// sums = [D, W] (f64, on the device) and cross_entropy's lse (N), so the backward rebuilds the softmax
// without another pass of reductions.
Tensor cross_entropy_forward(const ForwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    const Tensor& labels = args.inputs[1];
    const Tensor* weight = args.inputs.size() > 2 ? &args.inputs[2] : nullptr;
    const bool nll = args.op == OpType::NllLoss;
    const Reduction reduction = args.attrs.reduction;
    const std::int64_t rows = logits.size(0);
    const std::int64_t classes = logits.size(1);
    math::ClassLossForward f = math::class_loss_forward_outputs(args);
    Tensor &loss = f.loss, &lse = f.lse, &sums = f.sums;
    if (rows == 0 || classes == 0) {  // infer::cross_entropy rejects empty logits
        loss.fill(std::numeric_limits<double>::quiet_NaN());
        sums.fill(0.0);
        return loss;
    }
    DeviceContext& ctx = context_for(logits);
    // Lanes per row of the one-block kernel (classes capped: the power of two of a huge C is of no use).
    const auto group =
        static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(std::min(classes, kSmallClasses))));
    if (!nll && classes <= kSmallClasses && rows <= kSmallRows / group) {
        dispatch_floating(logits.dtype(), "cross_entropy", [&]<typename T>() {
            cross_entropy_small_kernel<T><<<1, kSmallThreads, 0, ctx.stream>>>(
                logits.data<T>(), labels.data<std::int64_t>(), weight ? weight->data<T>() : nullptr, rows, classes,
                static_cast<int>(group), args.attrs.ignore_index, static_cast<T>(args.attrs.label_smoothing),
                lse.data<T>(), reduction == Reduction::None ? loss.data<T>() : nullptr, reduction, loss.data<T>(),
                sums.data<double>(), ctx.error_record_device);
            DG_CUDA_CHECK_LAUNCH();
        });
        return loss;
    }
    Workspace row_loss(ctx, static_cast<std::size_t>(rows) * sizeof(double));
    Workspace row_weight(ctx, static_cast<std::size_t>(rows) * sizeof(double));
    auto* row_loss_data = static_cast<double*>(row_loss.data());
    auto* row_weight_data = static_cast<double*>(row_weight.data());
    dispatch_floating(logits.dtype(), nll ? "nll_loss" : "cross_entropy", [&]<typename T>() {
        const T* px = logits.data<T>();
        const std::int64_t* plabels = labels.data<std::int64_t>();
        const T* pweight = weight ? weight->data<T>() : nullptr;
        T* out_rows = reduction == Reduction::None ? loss.data<T>() : nullptr;
        const BatchSums<T> batch{reduction, loss.data<T>(), sums.data<double>(), ctx.block_counter};
        if (nll) {
            nll_rows_kernel<T><<<grid_size(ctx, rows, kThreads), kThreads, 0, ctx.stream>>>(
                px, plabels, pweight, rows, classes, args.attrs.ignore_index, row_loss_data, row_weight_data,
                out_rows, batch, ctx.error_record_device);
            DG_CUDA_CHECK_LAUNCH();
        } else {
            const T smoothing = static_cast<T>(args.attrs.label_smoothing);
            T* plse = lse.data<T>();
            launch_rows(ctx, rows, classes, [&]<bool kBlockPerRow>(unsigned blocks) {
                cross_entropy_rows_kernel<T, kBlockPerRow><<<blocks, kThreads, 0, ctx.stream>>>(
                    px, plabels, pweight, rows, classes, args.attrs.ignore_index, smoothing, plse, row_loss_data,
                    row_weight_data, out_rows, batch, ctx.error_record_device, classes,
                    row_packs_of<T>(classes, classes, {px}));
            });
        }
    });
    return loss;
}

// dloss () or (N) -> dlogits (N,C); labels and class weights get no gradient (as in PyTorch). At most 32 classes:
// a thread per element (class_loss_backward_small_kernel), else the row tilings; the same formula either way.
std::vector<Tensor> cross_entropy_backward(const BackwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    const Tensor& labels = args.inputs[1];
    const Tensor* weight = args.inputs.size() > 2 ? &args.inputs[2] : nullptr;
    const bool nll = args.op == OpType::NllLoss;
    std::vector<Tensor> grads(args.inputs.size());
    if (!math::class_loss_needs_dlogits(args)) return grads;
    const std::int64_t rows = logits.size(0);
    const std::int64_t classes = logits.size(1);
    grads[0] = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    const std::int64_t n = logits.numel();
    if (n == 0) return grads;
    DeviceContext& ctx = context_for(logits);
    dispatch_floating(logits.dtype(), nll ? "nll_loss backward" : "cross_entropy backward", [&]<typename T>() {
        if (classes <= kSmallClasses) {
            const int group_shift = std::countr_zero(std::bit_ceil(static_cast<std::uint64_t>(classes)));
            class_loss_backward_small_kernel<T><<<grid_size(ctx, rows << group_shift, kThreads), kThreads, 0,
                                                  ctx.stream>>>(
                logits.data<T>(), labels.data<std::int64_t>(), weight ? weight->data<T>() : nullptr,
                nll ? nullptr : args.saved[1].data<T>(), args.saved[0].data<double>(), rows, classes, group_shift,
                args.attrs.ignore_index, static_cast<T>(args.attrs.label_smoothing), args.attrs.reduction,
                args.grad_output.data<T>(), grads[0].data<T>(), ctx.error_record_device);
            DG_CUDA_CHECK_LAUNCH();
            return;
        }
        const std::int64_t row_packs = row_packs_of<T>(classes, classes, {logits.raw_data(), grads[0].raw_data()});
        launch_rows(ctx, rows, classes, [&]<bool kBlockPerRow>(unsigned blocks) {
            class_loss_backward_kernel<T, kBlockPerRow><<<blocks, kThreads, 0, ctx.stream>>>(
                logits.data<T>(), labels.data<std::int64_t>(), weight ? weight->data<T>() : nullptr,
                nll ? nullptr : args.saved[1].data<T>(), args.saved[0].data<double>(), rows, classes, row_packs,
                args.attrs.ignore_index, static_cast<T>(args.attrs.label_smoothing), args.attrs.reduction,
                args.grad_output.data<T>(), grads[0].data<T>(), ctx.error_record_device, classes);
        });
    });
    return grads;
}

// ---- linear_cross_entropy (ops/linear_cross_entropy.h): the LM head and cross_entropy in chunks of rows ----

namespace {

// Bytes of logits per chunk (and as many of dlogits): 512 MiB, 5,336 rows of GPT-2's 50304 padded bf16 classes.
// Every chunk after the first adds its dW into an f32 sum of the whole head (GPT-2: 155 MB read and written again
// per chunk), and few rows make a thin dx GEMM: with 32M-element chunks (667 such rows, 49 a step) GPT-2 trained at
// 460K tokens/s, with 256 MiB 493K, 512 MiB 502K and 505K, 1 GiB 502K (char_gpt --model gpt2 --reduced-residual,
// batch 32, H200, 2026-11-30, one process each, alternated in two calls). The cost: at most 1 GiB of workspace.
constexpr std::int64_t kGpuChunkBytes = std::int64_t{512} << 20;

// One pass over the rows of x (N,E) in chunks, everything on ctx's stream (no host synchronisation). Per chunk of r
// rows from `start`, with C = attrs.length (W[:C] is the first C rows of the weight's buffer, no copy):
//   logits (r,C) = x_c·W[:C]ᵀ (cuBLAS, into a workspace; over all of W's rows where they are a multiple of 8);
//   cross_entropy_rows_kernel: lse, the row losses and weights (row_loss, row_weight at `start`), out_rows for None;
//   where dx or dW is wanted, class_loss_backward_kernel writes dlogits (r,C) (a second workspace) with the
//   reduction and upstream gradient given (`dy`, `sums`), then dx_c = dlogits·W[:C] and dW[:C] += dlogitsᵀ·x_c.
// dW's padded rows beyond the GEMMs' are zeroed once. A bad label is reported with its row index within its chunk.
// bf16/f16 x and W (autocast's; as PyTorch's autocast runs F.linear in bf16 and F.cross_entropy in f32): the
// GEMMs take T with f32 accumulation and the logits GEMM writes T (PyTorch's bf16 logits: half the bytes of f32 ones
// to write and to read twice, GPT-2's 50304 columns), the row kernels read them into float32: lse, the losses
// (out_rows) and dy are float32 (S = acc_t<T>); dlogits is rounded to T (as the gradient of PyTorch's bf16
// logits), and dx and dW come out in G: T (the backward's recomputation: dx_c written in T, dW summed over the
// chunks in an f32 workspace and rounded to T once at the end, never a running sum rounded to 8 bits per chunk)
// or S (the forward's unit gradients: dW summed in place in f32, rounded once when the backward scales them).
// f32 and f64: S = G = T, everything in T as before.
template <typename T, typename G>
void chunked_pass(DeviceContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& labels,
                  const OpAttrs& attrs, double* row_loss, double* row_weight, acc_t<T>* out_rows,
                  Reduction grad_reduction, const acc_t<T>* dy, const double* sums, G* dx, G* dw) {
    using S = acc_t<T>;
    static_assert(std::is_same_v<G, T> || std::is_same_v<G, S>, "dx, dW: in x's dtype or its sum type");
    constexpr bool kSumDwApart = !std::is_same_v<G, S>;  // 16-bit dW out: an f32 sum, rounded at the end
    const std::int64_t n = x.size(0), width = x.size(1), classes = attrs.length, padded = weight.size(0);
    const std::int64_t chunk = dyngrad::detail::linear_cross_entropy_chunk_rows(n, classes,
                                                                                       kGpuChunkBytes / sizeof(T));
    const bool grads = dx != nullptr || dw != nullptr;
    // cuBLAS runs its 16-byte-vector kernels only when the extent along which a matrix is contiguous is a multiple
    // of 8 elements: GPT-2's 50257 classes (the logits' columns, dx's inner dimension, dW's rows) gave sm75 "align1"
    // kernels, half of the step (ncu, H200, 2026-11-29). A weight padded to a multiple of 8 rows (GPT's 50304) lets
    // the GEMMs run over all of its rows: the logits' extra columns are never read, dlogits' are 0, so dx gets 0 times
    // the padded rows (finite: GPT's stay 0, their gradient is 0) and dW's padded rows get 0. Otherwise the GEMMs
    // take C, in workspaces whose rows are C rounded up to 8 elements apart.
    const std::int64_t gemm_classes = padded % 8 == 0 ? padded : classes;
    const std::int64_t row_stride = padded % 8 == 0 ? padded : (classes + 7) / 8 * 8;
    const std::size_t chunk_elements = static_cast<std::size_t>(chunk) * static_cast<std::size_t>(row_stride);
    const std::size_t head_elements = static_cast<std::size_t>(gemm_classes) * static_cast<std::size_t>(width);
    Workspace logits(ctx, chunk_elements * sizeof(T));
    Workspace dlogits(ctx, grads ? chunk_elements * sizeof(T) : sizeof(T));
    Workspace lse(ctx, static_cast<std::size_t>(chunk) * sizeof(S));
    Workspace chunk_sums(ctx, 2 * sizeof(double));  // the rows kernel's chunk sums: [D_chunk, C]
    Workspace dw_apart(ctx, kSumDwApart && dw != nullptr ? head_elements * sizeof(S) : sizeof(S));
    if (dw != nullptr && padded > gemm_classes)
        DG_CUDA_CHECK(cudaMemsetAsync(dw + gemm_classes * width, 0,
                                      static_cast<std::size_t>((padded - gemm_classes) * width) * sizeof(G), ctx.stream));
    const T* px = x.data<T>();
    const T* pw = weight.data<T>();
    auto* plogits = static_cast<T*>(logits.data());
    auto* pdlogits = static_cast<T*>(dlogits.data());
    auto* plse = static_cast<S*>(lse.data());
    void* dw_sum = kSumDwApart ? dw_apart.data() : static_cast<void*>(dw);
    const S smoothing = static_cast<S>(attrs.label_smoothing);
    for (std::int64_t start = 0; start < n; start += chunk) {
        const std::int64_t rows = std::min(chunk, n - start);
        const std::int64_t* plabels = labels.data<std::int64_t>() + start;
        row_major_gemm(ctx, x.dtype(), "linear_cross_entropy logits", 1, rows, gemm_classes, width,
                       {px + start * width, false, 0}, {pw, true, 0}, plogits, false, dtype_of<T>(), row_stride);
        const BatchSums<S> batch{Reduction::None, nullptr, static_cast<double*>(chunk_sums.data()), ctx.block_counter};
        launch_rows(ctx, rows, classes, [&]<bool kBlockPerRow>(unsigned blocks) {
            cross_entropy_rows_kernel<S, kBlockPerRow, T><<<blocks, kThreads, 0, ctx.stream>>>(
                plogits, plabels, nullptr, rows, classes, attrs.ignore_index, smoothing, plse, row_loss + start,
                row_weight + start, out_rows ? out_rows + start : nullptr, batch, ctx.error_record_device, row_stride,
                row_packs_of<T>(classes, row_stride, {plogits}));
        });
        if (!grads) continue;
        // sums[1] = C in both: the unweighted loss's Σ_c w[c]; sums[0] is D where the reduction is Mean.
        const double* grad_sums = sums ? sums : static_cast<const double*>(chunk_sums.data());
        const S* row_dy = grad_reduction == Reduction::None ? dy + start : dy;
        launch_rows(ctx, rows, classes, [&]<bool kBlockPerRow>(unsigned blocks) {
            class_loss_backward_kernel<S, kBlockPerRow, T, T><<<blocks, kThreads, 0, ctx.stream>>>(
                plogits, plabels, nullptr, plse, grad_sums, rows, classes,
                row_packs_of<T>(classes, row_stride, {plogits, pdlogits}), attrs.ignore_index,
                smoothing, grad_reduction, row_dy, pdlogits, ctx.error_record_device, row_stride);
        });
        if (dx != nullptr)
            row_major_gemm(ctx, x.dtype(), "linear_cross_entropy dx", 1, rows, width, gemm_classes,
                           {pdlogits, false, 0, row_stride}, {pw, false, 0}, dx + start * width, false, dtype_of<G>());
        if (dw != nullptr)
            row_major_gemm(ctx, x.dtype(), "linear_cross_entropy dW", 1, gemm_classes, width, rows,
                           {pdlogits, true, 0, row_stride}, {px + start * width, false, 0}, dw_sum, start > 0,
                           dtype_of<S>());
    }
    if (kSumDwApart && dw != nullptr)
        convert(dw, x.dtype(), dw_sum, dtype_of<S>(), static_cast<std::int64_t>(head_elements), ctx.device);
}

}  // namespace

// Saves what the CPU's forward saves (ops/linear_cross_entropy.cpp), [D, C] from the batch sums kernel.
Tensor linear_cross_entropy_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Reduction reduction = args.attrs.reduction;
    const std::int64_t n = x.size(0);
    math::LinearCrossEntropyForward f = math::linear_cross_entropy_outputs(args);
    DeviceContext& ctx = context_for(x);
    Workspace row_loss(ctx, static_cast<std::size_t>(n) * sizeof(double));
    Workspace row_weight(ctx, static_cast<std::size_t>(n) * sizeof(double));
    auto* row_loss_data = static_cast<double*>(row_loss.data());
    auto* row_weight_data = static_cast<double*>(row_weight.data());
    dispatch_gpu_floating(x.dtype(), "linear_cross_entropy", [&]<typename T>() {
        // The loss's type, and the unit gradients' (math::linear_cross_entropy_outputs): float32 for bf16/f16 x.
        using L = acc_t<T>;
        const Tensor one = Tensor::ones({}, f.loss.dtype(), x.device());  // the unit upstream gradient of the sum
        chunked_pass<T, L>(ctx, x, args.inputs[1], args.inputs[2], args.attrs, row_loss_data, row_weight_data,
                           reduction == Reduction::None ? f.loss.data<L>() : nullptr, Reduction::Sum, one.data<L>(),
                           nullptr, f.grads ? f.dx.data<L>() : nullptr, f.grads ? f.dw.data<L>() : nullptr);
        class_loss_batch_sums_kernel<L><<<1, kThreads, 0, ctx.stream>>>(
            row_loss_data, row_weight_data, n, args.attrs.length, reduction,
            reduction == Reduction::None ? nullptr : f.loss.data<L>(), f.sums.data<double>());
        DG_CUDA_CHECK_LAUNCH();
    });
    return f.loss;
}

// dloss () or (N) -> dx, dW. Mean/Sum with the forward's gradients: those times dy (or dy / D), one elementwise
// pass each; otherwise the chunks are recomputed with the reduction's per-row factor (None: dy_i).
std::vector<Tensor> linear_cross_entropy_backward(const BackwardArgs& args) {
    math::LinearCrossEntropyBackward b = math::linear_cross_entropy_gradients(args);
    if (!b.any()) return std::move(b.grads);
    const Tensor& x = args.inputs[0];
    const double* sums = args.saved[0].data<double>();
    DeviceContext& ctx = context_for(x);
    dispatch_gpu_floating(x.dtype(), "linear_cross_entropy backward", [&]<typename T>() {
        const acc_t<T>* dy = args.grad_output.data<acc_t<T>>();  // the loss's dtype: float32 for bf16/f16 x
        if (b.from_saved) {
            for (std::size_t i = 0; i < 2; ++i) {
                if (!b.grads[i].defined()) continue;
                const Tensor& unit = args.saved[1 + i];
                scale_by_upstream_kernel<T><<<grid_size(ctx, unit.numel(), kThreads), kThreads, 0, ctx.stream>>>(
                    unit.data<acc_t<T>>(), b.grads[i].data<T>(), unit.numel(), args.attrs.reduction, dy, sums);
                DG_CUDA_CHECK_LAUNCH();
            }
            return;
        }
        const std::int64_t n = x.size(0);
        Workspace row_loss(ctx, static_cast<std::size_t>(n) * sizeof(double));  // recomputed, unused
        Workspace row_weight(ctx, static_cast<std::size_t>(n) * sizeof(double));
        chunked_pass<T, T>(ctx, x, args.inputs[1], args.inputs[2], args.attrs, static_cast<double*>(row_loss.data()),
                        static_cast<double*>(row_weight.data()), nullptr, args.attrs.reduction, dy, sums,
                        b.grads[0].defined() ? b.grads[0].data<T>() : nullptr,
                        b.grads[1].defined() ? b.grads[1].data<T>() : nullptr);
    });
    return std::move(b.grads);
}

}  // namespace dyngrad::cuda
