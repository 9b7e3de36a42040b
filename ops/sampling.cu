// Sorting and sampling on the GPU (ops/sampling.h): cumsum, argsort / topk_indices, multinomial. CPU reference:
// ops/sampling.cpp; the order keys and the multinomial draw are ops/sampling_math.h, shared with it, so both
// backends return the same indices for the same input (and seed). No op waits for the device or allocates outside
// the pool (Workspace); bad multinomial rows go to the device error record, raised at the next host wait.
//
//  - cumsum: contiguous lines (the last axis) take one block each, scanned tile by tile with cub::BlockScan in
//    double and a carry between tiles; other axes one thread per line, walking it in double (coalesced across the
//    lines' inner index). The backward is the same scan from the end of each line.
//  - argsort, topk_indices: each line's (order key, position) pairs are sorted by CUB's segmented radix sort (one
//    segment per line), stable as every CUB radix sort (an LSD sort), so ties keep their positions' order, as the
//    CPU's (key, index) sort. topk keeps the first k (the whole line is sorted: simple, O(size) work per line; the
//    sampling loops' rows of a vocabulary sort in one call). Not cub::DeviceSegmentedSort: above 500 segments it
//    copies group sizes to the host and synchronises the stream (no capture, a host wait per op). CUB counts
//    items in int: above 2^31 - 1 elements a ValueError.
//  - multinomial: one thread per row checks its weights and writes their running sums (in double) to a workspace;
//    with replacement one thread per sample then searches its row's sums; without, the row's thread draws its
//    samples in turn (O(num_samples · C) per row, the same arithmetic as the CPU).
#include <array>
#include <climits>
#include <cstdint>
#include <string>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "dyngrad/core/checked.h"
#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/sampling_math.h"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;

std::size_t align_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// One block per contiguous line of `size`; reverse: the running sum from the line's end.
template <typename T>
__global__ void scan_rows_kernel(const T* __restrict__ src, T* __restrict__ dst, std::int64_t lines, std::int64_t size,
                                 bool reverse) {
    using Scan = cub::BlockScan<double, kThreads>;
    __shared__ typename Scan::TempStorage temp;
    for (std::int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
        const T* in = src + line * size;
        T* out = dst + line * size;
        double carry = 0;
        for (std::int64_t start = 0; start < size; start += kThreads) {
            const std::int64_t j = start + threadIdx.x;
            const std::int64_t at = reverse ? size - 1 - j : j;
            double value = j < size ? static_cast<double>(in[at]) : 0.0;
            double tile_total = 0;
            Scan(temp).InclusiveSum(value, value, tile_total);
            if (j < size) out[at] = static_cast<T>(carry + value);
            carry += tile_total;
            __syncthreads();  // the next tile reuses `temp`
        }
    }
}

// One thread per line (o, c) of a (outer, size, inner) tensor with inner > 1: neighbouring threads read
// neighbouring elements.
template <typename T>
__global__ void scan_columns_kernel(const T* __restrict__ src, T* __restrict__ dst, AxisSplit s, bool reverse) {
    const std::int64_t lines = s.outer * s.inner;
    for (std::int64_t i = thread_index(); i < lines; i += thread_count()) {
        const std::int64_t o = i / s.inner;
        const std::int64_t base = o * s.size * s.inner + (i - o * s.inner);
        double sum = 0;
        for (std::int64_t j = 0; j < s.size; ++j) {
            const std::int64_t at = base + (reverse ? s.size - 1 - j : j) * s.inner;
            sum += static_cast<double>(src[at]);
            dst[at] = static_cast<T>(sum);
        }
    }
}

}  // namespace

void running_sums(const Tensor& src, Tensor& dst, const AxisSplit& s, bool reverse) {
    if (src.numel() == 0) return;
    DeviceContext& ctx = context_for(src);
    dispatch_floating(src.dtype(), "cumsum", [&]<typename T>() {
        if (s.inner == 1) {
            const std::int64_t lines = s.outer;
            scan_rows_kernel<T><<<grid_size(ctx, lines * kThreads, kThreads), kThreads, 0, ctx.stream>>>(
                src.data<T>(), dst.data<T>(), lines, s.size, reverse);
        } else {
            scan_columns_kernel<T><<<grid_size(ctx, s.outer * s.inner, kThreads), kThreads, 0, ctx.stream>>>(
                src.data<T>(), dst.data<T>(), s, reverse);
        }
        DG_CUDA_CHECK_LAUNCH();
    });
}

namespace {

// Element i of the sort's layout is position j of line l = o·inner + c: (key, j) for x[o, j, c].
template <typename T>
__global__ void sort_keys_kernel(const T* __restrict__ x, AxisSplit s, bool descending,
                                 math::sort_key_t<T>* __restrict__ keys, int* __restrict__ positions) {
    const std::int64_t total = s.outer * s.size * s.inner;
    for (std::int64_t i = thread_index(); i < total; i += thread_count()) {
        const std::int64_t line = i / s.size;
        const std::int64_t j = i - line * s.size;
        const std::int64_t o = line / s.inner;
        const std::int64_t c = line - o * s.inner;
        keys[i] = math::sort_key(x[(o * s.size + j) * s.inner + c], descending);
        positions[i] = static_cast<int>(j);
    }
}

__global__ void segment_offsets_kernel(std::int64_t* __restrict__ offsets, std::int64_t lines, std::int64_t size) {
    for (std::int64_t i = thread_index(); i <= lines; i += thread_count()) offsets[i] = i * size;
}

// out (outer, keep, inner) = the first `keep` sorted positions of each line.
__global__ void write_indices_kernel(const int* __restrict__ sorted, AxisSplit s, std::int64_t keep,
                                     std::int64_t* __restrict__ out) {
    const std::int64_t total = s.outer * keep * s.inner;
    for (std::int64_t i = thread_index(); i < total; i += thread_count()) {
        const std::int64_t o = i / (keep * s.inner);
        const std::int64_t rest = i - o * keep * s.inner;
        const std::int64_t j = rest / s.inner;
        const std::int64_t c = rest - j * s.inner;
        out[i] = sorted[(o * s.inner + c) * s.size + j];
    }
}

template <typename T>
void sort_lines_of(DeviceContext& ctx, const Tensor& x, const AxisSplit& s, bool descending, std::int64_t keep,
                   Tensor& out) {
    using Key = math::sort_key_t<T>;
    const std::int64_t total = s.outer * s.size * s.inner;
    const std::int64_t lines = s.outer * s.inner;
    if (total > INT_MAX)
        throw ValueError(str("sorting ", total, " elements on a GPU: CUB's segmented sort counts at most ", INT_MAX));
    const auto n = static_cast<std::size_t>(total);
    std::size_t sort_bytes = 0;
    constexpr int kKeyBits = static_cast<int>(sizeof(Key) * 8);
    DG_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<const Key*>(nullptr), static_cast<Key*>(nullptr),
        static_cast<const int*>(nullptr), static_cast<int*>(nullptr), static_cast<int>(total), static_cast<int>(lines),
        static_cast<const std::int64_t*>(nullptr), static_cast<const std::int64_t*>(nullptr), 0, kKeyBits, ctx.stream));
    // One workspace: keys, sorted keys, positions, sorted positions, segment offsets, CUB's scratch.
    const std::size_t key_bytes = align_up(n * sizeof(Key)), position_bytes = align_up(n * sizeof(int));
    const std::size_t offset_bytes = align_up((static_cast<std::size_t>(lines) + 1) * sizeof(std::int64_t));
    Workspace workspace(ctx, 2 * key_bytes + 2 * position_bytes + offset_bytes + sort_bytes);
    auto* base = static_cast<char*>(workspace.data());
    auto* keys = reinterpret_cast<Key*>(base);
    auto* sorted_keys = reinterpret_cast<Key*>(base + key_bytes);
    auto* positions = reinterpret_cast<int*>(base + 2 * key_bytes);
    auto* sorted_positions = reinterpret_cast<int*>(base + 2 * key_bytes + position_bytes);
    auto* offsets = reinterpret_cast<std::int64_t*>(base + 2 * key_bytes + 2 * position_bytes);
    void* scratch = base + 2 * key_bytes + 2 * position_bytes + offset_bytes;
    sort_keys_kernel<T><<<grid_size(ctx, total, kThreads), kThreads, 0, ctx.stream>>>(x.data<T>(), s, descending, keys,
                                                                                    positions);
    DG_CUDA_CHECK_LAUNCH();
    segment_offsets_kernel<<<grid_size(ctx, lines + 1, kThreads), kThreads, 0, ctx.stream>>>(offsets, lines, s.size);
    DG_CUDA_CHECK_LAUNCH();
    const std::int64_t* segment_offsets = offsets;  // the same iterator type as the size query's
    DG_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairs(
        scratch, sort_bytes, keys, sorted_keys, positions, sorted_positions, static_cast<int>(total),
        static_cast<int>(lines), segment_offsets, segment_offsets + 1, 0, kKeyBits, ctx.stream));
    write_indices_kernel<<<grid_size(ctx, s.outer * keep * s.inner, kThreads), kThreads, 0, ctx.stream>>>(
        sorted_positions, s, keep, out.data<std::int64_t>());
    DG_CUDA_CHECK_LAUNCH();
}

// The device error record's sentence for each math::WeightProblem (host string literals, read back by the host).
struct WeightReport {
    DeviceErrorRecord* record;
    const char* what[6];
};

__device__ void report_weights(const WeightReport& report, math::WeightProblem problem, std::int64_t row,
                               std::int64_t column) {
    DeviceErrorRecord* record = report.record;
    if (atomicCAS(&record->code, static_cast<int>(DeviceErrorCode::none),
                  static_cast<int>(DeviceErrorCode::invalid_value)) == static_cast<int>(DeviceErrorCode::none)) {
        record->index = row;
        record->value = column;
        record->bound = 0;
        record->what = report.what[static_cast<int>(problem)];
    }
}

// One thread per row: checks the weights and writes their running sums to sums (rows, C); without replacement it
// then draws the row's samples. A bad row is reported, its samples are 0 and its total NaN (the sampling kernel's
// sign to skip it).
template <typename T>
__global__ void multinomial_rows_kernel(const T* __restrict__ probs, std::int64_t rows, std::int64_t categories,
                                        std::int64_t num_samples, bool replacement, std::uint64_t seed,
                                        double* __restrict__ sums, std::int64_t* __restrict__ out, WeightReport report) {
    for (std::int64_t r = thread_index(); r < rows; r += thread_count()) {
        const T* weights = probs + r * categories;
        double* row_sums = sums + r * categories;
        std::int64_t column = 0;
        math::WeightProblem problem = math::weight_running_sums(weights, categories, row_sums, &column);
        if (problem == math::WeightProblem::zero_sum) column = -1;
        if (problem == math::WeightProblem::none && !replacement) {
            std::int64_t nonzero = 0;
            for (std::int64_t c = 0; c < categories; ++c) nonzero += weights[c] != T(0) ? 1 : 0;
            if (nonzero < num_samples) problem = math::WeightProblem::too_few, column = -1;
        }
        std::int64_t* row_out = out + r * num_samples;
        if (problem != math::WeightProblem::none) {
            report_weights(report, problem, r, column);
            row_sums[categories - 1] = __longlong_as_double(0x7FF8000000000000LL);  // NaN
            for (std::int64_t s = 0; s < num_samples; ++s) row_out[s] = 0;
            continue;
        }
        if (replacement) continue;
        for (std::int64_t c = 0; c < categories; ++c) row_sums[c] = static_cast<double>(weights[c]);
        math::draw_without_replacement(row_sums, categories, seed, r, num_samples, row_out);
    }
}

__global__ void multinomial_samples_kernel(const double* __restrict__ sums, std::int64_t rows,
                                           std::int64_t categories, std::int64_t num_samples, std::uint64_t seed,
                                           std::int64_t* __restrict__ out) {
    const std::int64_t total = rows * num_samples;
    for (std::int64_t i = thread_index(); i < total; i += thread_count()) {
        const std::int64_t r = i / num_samples;
        const std::int64_t s = i - r * num_samples;
        const double* row_sums = sums + r * categories;
        out[i] = row_sums[categories - 1] > 0
                     ? math::draw_from_running_sums(row_sums, categories,
                                                    math::multinomial_uniform(seed, r, s, num_samples))
                     : 0;
    }
}

}  // namespace

void sort_lines(const Tensor& x, const AxisSplit& s, bool descending, std::int64_t keep, Tensor& out) {
    DeviceContext& ctx = context_for(x);
    dispatch_floating(x.dtype(), "sort_indices_forward",
                      [&]<typename T>() { sort_lines_of<T>(ctx, x, s, descending, keep, out); });
}

Tensor multinomial_forward(const ForwardArgs& args) {
    const Tensor& probs = args.inputs[0];
    Tensor out = Tensor::empty(args.out.shape, DType::i64, probs.device());
    if (out.numel() == 0) return out;
    const WeightRows shape = weight_rows(probs);
    const std::int64_t rows = shape.rows, categories = shape.categories;
    DeviceContext& ctx = context_for(probs);
    // The CPU's words (weight_problem_text) after the op's name; the record keeps the pointers, so they are static.
    static const std::array<std::string, 6> kWhat = [] {
        std::array<std::string, 6> texts;
        for (int i = 0; i < 6; ++i) texts[i] = str("multinomial: probs has ", weight_problem_text(i));
        return texts;
    }();
    WeightReport report{ctx.error_record_device, {}};
    for (int i = 0; i < 6; ++i) report.what[i] = kWhat[i].c_str();
    const std::size_t bytes = checked_bytes(checked_mul(rows, categories, "multinomial sums"), sizeof(double),
                                            "multinomial sums");
    Workspace sums(ctx, bytes);
    auto* row_sums = static_cast<double*>(sums.data());
    const OpAttrs& a = args.attrs;
    dispatch_floating(probs.dtype(), "multinomial_forward", [&]<typename T>() {
        multinomial_rows_kernel<T><<<grid_size(ctx, rows, kThreads), kThreads, 0, ctx.stream>>>(
            probs.data<T>(), rows, categories, a.length, a.replacement, a.seed, row_sums,
            out.data<std::int64_t>(), report);
        DG_CUDA_CHECK_LAUNCH();
    });
    if (a.replacement) {
        multinomial_samples_kernel<<<grid_size(ctx, rows * a.length, kThreads), kThreads, 0, ctx.stream>>>(
            row_sums, rows, categories, a.length, a.seed, out.data<std::int64_t>());
        DG_CUDA_CHECK_LAUNCH();
    }
    return out;
}

}  // namespace dyngrad::cuda
