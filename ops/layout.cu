// Layout ops on the GPU (ops/layout.h): tiled and strided axis swaps, strided copies of row blocks for
// narrow and concat, strided copies for permute and expand. CPU: ops/layout.cpp.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;

// A tensor around the two swapped axes lo < hi: x (outer, d0, mid, d1, inner) -> y (outer, d1, mid, d0, inner).
struct SwapSplit {
    std::int64_t outer = 1, d0 = 1, mid = 1, d1 = 1, inner = 1;
};

SwapSplit split_for_swap(const Shape& shape, const std::vector<std::int64_t>& axes) {
    if (axes.size() != 2) throw ValueError(str("transpose: expects 2 axes to swap, got ", axes.size()));
    int lo = normalize_axis(axes[0], shape.size());
    int hi = normalize_axis(axes[1], shape.size());
    if (lo > hi) std::swap(lo, hi);
    SwapSplit s;
    if (lo == hi) {  // nothing moves: one block of contiguous elements
        s.inner = numel(shape);
        return s;
    }
    for (int i = 0; i < lo; ++i) s.outer *= shape[i];
    s.d0 = shape[lo];
    for (int i = lo + 1; i < hi; ++i) s.mid *= shape[i];
    s.d1 = shape[hi];
    for (std::size_t i = hi + 1; i < shape.size(); ++i) s.inner *= shape[i];
    return s;
}

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a 32×8 block moves a 32×32 tile, 4 elements per thread

// inner == 1: for each of the outer·mid pairs (o, m), x holds a d0×d1 matrix with row stride mid·d1
// and y its d1×d0 transpose with row stride mid·d0. Tiles go through shared memory so that both the
// reads and the writes are coalesced; the +1 column keeps the transposed reads off a single bank.
// E is an unsigned integer of the element's size: the kernel only moves bytes.
template <typename E>
__global__ void transpose_tiled_kernel(const E* __restrict__ x, E* __restrict__ y, std::int64_t batches,
                                       std::int64_t mid, std::int64_t d0, std::int64_t d1) {
    __shared__ E tile[kTile][kTile + 1];
    const std::int64_t tiles_d0 = (d0 + kTile - 1) / kTile;
    const std::int64_t tiles_d1 = (d1 + kTile - 1) / kTile;
    const std::int64_t x_row_stride = mid * d1;
    const std::int64_t y_row_stride = mid * d0;
    for (std::int64_t z = blockIdx.z; z < batches; z += gridDim.z) {
        const std::int64_t o = z / mid;
        const std::int64_t m = z % mid;
        const E* xz = x + (o * d0 * mid + m) * d1;
        E* yz = y + (o * d1 * mid + m) * d0;
        for (std::int64_t ti = blockIdx.y; ti < tiles_d0; ti += gridDim.y) {
            for (std::int64_t tj = blockIdx.x; tj < tiles_d1; tj += gridDim.x) {
                const std::int64_t j = tj * kTile + threadIdx.x;
                for (int r = threadIdx.y; r < kTile; r += kTileRows) {
                    const std::int64_t i = ti * kTile + r;
                    if (i < d0 && j < d1) tile[r][threadIdx.x] = xz[i * x_row_stride + j];
                }
                __syncthreads();
                const std::int64_t i = ti * kTile + threadIdx.x;
                for (int r = threadIdx.y; r < kTile; r += kTileRows) {
                    const std::int64_t jj = tj * kTile + r;
                    if (jj < d1 && i < d0) yz[jj * y_row_stride + i] = tile[threadIdx.x][r];
                }
                __syncthreads();  // the tile is refilled by the next iteration
            }
        }
    }
}

// inner > 1: one thread per output element; runs of `inner` elements stay contiguous on both sides,
// so neighbouring threads read and write neighbouring addresses.
template <typename E>
__global__ void transpose_strided_kernel(const E* __restrict__ x, E* __restrict__ y, std::int64_t n, SwapSplit s) {
    for (std::int64_t idx = thread_index(); idx < n; idx += thread_count()) {
        // idx = (((o·d1 + j)·mid + m)·d0 + i)·inner + c
        std::int64_t rest = idx;
        const std::int64_t c = rest % s.inner;
        rest /= s.inner;
        const std::int64_t i = rest % s.d0;
        rest /= s.d0;
        const std::int64_t m = rest % s.mid;
        rest /= s.mid;
        const std::int64_t j = rest % s.d1;
        const std::int64_t o = rest / s.d1;
        y[idx] = x[(((o * s.d0 + i) * s.mid + m) * s.d1 + j) * s.inner + c];
    }
}

template <typename E>
void launch_swap_axes(DeviceContext& ctx, const void* x, void* y, const SwapSplit& s, std::int64_t n) {
    const E* src = static_cast<const E*>(x);
    E* dst = static_cast<E*>(y);
    if (s.inner == 1) {
        const std::int64_t batches = s.outer * s.mid;
        const dim3 block(kTile, kTileRows);
        // The kernel strides over tiles and batches, so the grid is capped at the hardware limits.
        const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((s.d1 + kTile - 1) / kTile, INT_MAX)),
                        static_cast<unsigned>(std::min<std::int64_t>((s.d0 + kTile - 1) / kTile, 65535)),
                        static_cast<unsigned>(std::min<std::int64_t>(batches, 65535)));
        transpose_tiled_kernel<E><<<grid, block, 0, ctx.stream>>>(src, dst, batches, s.mid, s.d0, s.d1);
    } else {
        transpose_strided_kernel<E><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(src, dst, n, s);
    }
    DG_CUDA_CHECK_LAUNCH();
}

// y = x with two axes swapped; `s` describes x around the axes.
void swap_axes(DeviceContext& ctx, const Tensor& x, Tensor& y, const SwapSplit& s) {
    const std::int64_t n = x.numel();
    if (n == 0) return;
    // When at most one of d0, mid, d1 exceeds 1 the swap leaves the memory order unchanged.
    const int moved = (s.d0 > 1) + (s.mid > 1) + (s.d1 > 1);
    if (moved <= 1) {
        DG_CUDA_CHECK(cudaMemcpyAsync(y.raw_data(), x.raw_data(), x.nbytes(), cudaMemcpyDeviceToDevice, ctx.stream));
        return;
    }
    with_element_word(dtype_size(x.dtype()),
                      [&]<typename E>() { launch_swap_axes<E>(ctx, x.raw_data(), y.raw_data(), s, n); });
}

// ---- narrow and concat: strided copies of row blocks ----

// For each of `rows` rows: `block` elements of src + row·src_stride into dst + row·dst_stride through
// `apply(dst element, src element)`. One thread per element; neighbouring threads take neighbouring elements of a
// row. One contiguous run (rows == 1, the slices of a fused QKV tensor) needs no division per element.
template <typename E, typename Apply>
__global__ void rows_kernel(const E* __restrict__ src, std::int64_t src_stride, E* __restrict__ dst,
                            std::int64_t dst_stride, std::int64_t rows, std::int64_t block, Apply apply) {
    const std::int64_t n = rows * block;
    for (std::int64_t idx = thread_index(); idx < n; idx += thread_count()) {
        const std::int64_t r = rows == 1 ? 0 : idx / block;
        const std::int64_t j = idx - r * block;
        apply(dst[r * dst_stride + j], src[r * src_stride + j]);
    }
}

// narrow's and concat's copies.
struct CopyElement {
    template <typename E>
    __device__ void operator()(E& d, const E& s) const {
        d = s;
    }
};

// narrow's backward into the gradient so far: summed in acc_t<T> and rounded once.
struct AddElement {
    template <typename T>
    __device__ void operator()(T& d, const T& s) const {
        d = from_acc<T>(to_acc(d) + to_acc(s));
    }
};

unsigned char* bytes_at(const Tensor& t, std::int64_t element) {
    return static_cast<unsigned char*>(t.raw_data()) + static_cast<std::size_t>(element) * dtype_size(t.dtype());
}

// ---- permute and expand: y[i] = x[walk offset of i] ----
//
// The walk is collapsed first (ops/strided.h), then copied by one of three kernels:
// - a contiguous innermost run in x: words of up to 16 bytes (several elements each) when the run length, every
//   run start and both pointers allow, with 32-bit index math when the sizes fit (the GPT's head permutes);
// - an innermost dim read with a stride while another dim reads x contiguously (a transpose): 32×32 tiles
//   through shared memory, so both the reads and the writes are coalesced;
// - anything else (broadcasts along the innermost dim): one element per thread.

// A collapsed walk in the index type of the kernel (32-bit divisions are several times cheaper than 64-bit ones).
template <typename Index>
struct CompactWalk {
    int rank = 0;
    Index sizes[kMaxStridedRank] = {};
    Index strides[kMaxStridedRank] = {};
};

template <typename Index>
CompactWalk<Index> compact(const StridedWalk<1>& walk) {
    CompactWalk<Index> out;
    out.rank = walk.rank;
    for (int d = 0; d < walk.rank; ++d) {
        out.sizes[d] = static_cast<Index>(walk.sizes[d]);
        out.strides[d] = static_cast<Index>(walk.strides[0][d]);
    }
    return out;
}

// One thread per output word (an element, or a 16/8/4-byte group of contiguous ones): writes are coalesced,
// reads follow x's strides (permuted or broadcast), in words.
template <typename Word, typename Index>
__global__ void strided_copy_kernel(const Word* __restrict__ x, Word* __restrict__ y, Index n,
                                    CompactWalk<Index> walk) {
    for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<Index>(gridDim.x) * blockDim.x) {
        Index rest = i;
        Index offset = 0;
        for (int d = walk.rank - 1; d >= 0; --d) {
            const Index q = rest / walk.sizes[d];
            offset += (rest - q * walk.sizes[d]) * walk.strides[d];
            rest = q;
        }
        y[i] = x[offset];
    }
}

// A transposing walk: dim `k` of y reads x contiguously, y's innermost dim (size L) reads x with stride
// x_stride_l; the other dims are batches, each with its offset into x and into y.
struct TransposeWalk {
    std::int64_t K = 1, L = 1, x_stride_l = 0, y_stride_k = 0;
    std::int64_t batches = 1;
    int batch_rank = 0;
    std::int64_t batch_sizes[kMaxStridedRank] = {};
    std::int64_t batch_x[kMaxStridedRank] = {};
    std::int64_t batch_y[kMaxStridedRank] = {};
};

template <typename E>
__global__ void strided_transpose_kernel(const E* __restrict__ x, E* __restrict__ y, TransposeWalk w) {
    __shared__ E tile[kTile][kTile + 1];
    const std::int64_t tiles_k = (w.K + kTile - 1) / kTile;
    const std::int64_t tiles_l = (w.L + kTile - 1) / kTile;
    for (std::int64_t z = blockIdx.z; z < w.batches; z += gridDim.z) {
        std::int64_t rest = z, xb = 0, yb = 0;
        for (int d = w.batch_rank - 1; d >= 0; --d) {
            const std::int64_t q = rest / w.batch_sizes[d];
            const std::int64_t r = rest - q * w.batch_sizes[d];
            xb += r * w.batch_x[d];
            yb += r * w.batch_y[d];
            rest = q;
        }
        for (std::int64_t tk = blockIdx.y; tk < tiles_k; tk += gridDim.y) {
            for (std::int64_t tl = blockIdx.x; tl < tiles_l; tl += gridDim.x) {
                const std::int64_t k = tk * kTile + threadIdx.x;  // neighbouring threads read neighbours of x
                for (int r = threadIdx.y; r < kTile; r += kTileRows) {
                    const std::int64_t l = tl * kTile + r;
                    if (k < w.K && l < w.L) tile[r][threadIdx.x] = x[xb + l * w.x_stride_l + k];
                }
                __syncthreads();
                const std::int64_t l = tl * kTile + threadIdx.x;  // and write neighbours of y
                for (int r = threadIdx.y; r < kTile; r += kTileRows) {
                    const std::int64_t kk = tk * kTile + r;
                    if (kk < w.K && l < w.L) y[yb + kk * w.y_stride_k + l] = tile[threadIdx.x][r];
                }
                __syncthreads();  // the tile is refilled by the next iteration
            }
        }
    }
}

// The transposing split of a collapsed walk, or none: y's innermost dim must read x with a stride other than 0
// and 1 while some other dim reads it with stride 1, both long enough for tiles to pay.
std::optional<TransposeWalk> transpose_split(const StridedWalk<1>& walk) {
    const int last = walk.rank - 1;
    if (last < 1 || walk.strides[0][last] == 0 || walk.strides[0][last] == 1 || walk.sizes[last] < kTileRows)
        return std::nullopt;
    int k = -1;
    for (int d = 0; d < last; ++d)
        if (walk.strides[0][d] == 1 && walk.sizes[d] >= kTileRows) k = d;
    if (k < 0) return std::nullopt;
    TransposeWalk w;
    w.K = walk.sizes[k];
    w.L = walk.sizes[last];
    w.x_stride_l = walk.strides[0][last];
    std::int64_t y_strides[kMaxStridedRank] = {};  // y is contiguous: the suffix products of the sizes
    std::int64_t y_stride = 1;
    for (int d = last; d >= 0; --d) {
        y_strides[d] = y_stride;
        y_stride *= walk.sizes[d];
    }
    w.y_stride_k = y_strides[k];
    for (int d = 0; d < last; ++d) {
        if (d == k) continue;
        w.batch_sizes[w.batch_rank] = walk.sizes[d];
        w.batch_x[w.batch_rank] = walk.strides[0][d];
        w.batch_y[w.batch_rank] = y_strides[d];
        w.batches *= walk.sizes[d];
        ++w.batch_rank;
    }
    return w;
}

// The widest word (16, 8 or 4 bytes, at most `max_bytes`) that moves a contiguous innermost run of the collapsed
// walk whole: the run's length and every run start (the outer strides) are multiples of it, and both pointers are
// aligned to it. The element size when none is.
std::size_t copy_word_bytes(const StridedWalk<1>& walk, std::size_t element_size, const void* x, const void* y) {
    const int last = walk.rank - 1;
    if (last < 0 || walk.strides[0][last] != 1) return element_size;
    for (std::size_t word = 16; word > element_size; word /= 2) {
        const auto per_word = static_cast<std::int64_t>(word / element_size);
        bool fits = walk.sizes[last] % per_word == 0 && reinterpret_cast<std::uintptr_t>(x) % word == 0 &&
                    reinterpret_cast<std::uintptr_t>(y) % word == 0;
        for (int d = 0; fits && d < last; ++d) fits = walk.strides[0][d] % per_word == 0;
        if (fits) return word;
    }
    return element_size;
}

// The walk in words of `per_word` elements (copy_word_bytes checked that they divide).
StridedWalk<1> in_words(StridedWalk<1> walk, std::int64_t per_word) {
    if (per_word == 1) return walk;
    const int last = walk.rank - 1;
    walk.sizes[last] /= per_word;
    for (int d = 0; d < last; ++d) walk.strides[0][d] /= per_word;
    return walk;
}

// Calls fn.template operator()<Word>() with an unsigned word of `bytes` bytes (uint4 for 16).
template <typename Fn>
void with_word(std::size_t bytes, Fn&& fn) {
    if (bytes == 16) return fn.template operator()<uint4>();
    with_element_word(bytes, std::forward<Fn>(fn));
}

void strided_copy(DeviceContext& ctx, const Tensor& x, Tensor& y, const StridedWalk<1>& walk_as_given) {
    const std::int64_t n = y.numel();
    if (n == 0) return;
    const std::size_t element_size = dtype_size(x.dtype());
    const StridedWalk<1> walk = collapsed(walk_as_given);
    if (walk.rank == 0 || (walk.rank == 1 && walk.strides[0][0] == 1)) {  // x in y's order: one block copy
        DG_CUDA_CHECK(cudaMemcpyAsync(y.raw_data(), x.raw_data(), static_cast<std::size_t>(n) * element_size,
                                      cudaMemcpyDeviceToDevice, ctx.stream));
        return;
    }
    if (const std::optional<TransposeWalk> w = transpose_split(walk)) {
        const dim3 block(kTile, kTileRows);
        const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((w->L + kTile - 1) / kTile, INT_MAX)),
                        static_cast<unsigned>(std::min<std::int64_t>((w->K + kTile - 1) / kTile, 65535)),
                        static_cast<unsigned>(std::min<std::int64_t>(w->batches, 65535)));
        with_element_word(element_size, [&]<typename E>() {
            strided_transpose_kernel<E><<<grid, block, 0, ctx.stream>>>(static_cast<const E*>(x.raw_data()),
                                                                        static_cast<E*>(y.raw_data()), *w);
        });
        DG_CUDA_CHECK_LAUNCH();
        return;
    }
    const std::size_t word_bytes = copy_word_bytes(walk, element_size, x.raw_data(), y.raw_data());
    const auto per_word = static_cast<std::int64_t>(word_bytes / element_size);
    const StridedWalk<1> words = in_words(walk, per_word);
    const std::int64_t word_count = n / per_word;
    std::int64_t last_offset = 0;  // the largest word offset read from x
    for (int d = 0; d < words.rank; ++d) last_offset += (words.sizes[d] - 1) * words.strides[0][d];
    // 32-bit indices when every index and offset (and a grid stride past the end) stays below 2^31
    const bool narrow_index = word_count <= INT_MAX && last_offset <= INT_MAX;
    const unsigned grid = grid_size(ctx, word_count, kThreads);
    with_word(word_bytes, [&]<typename Word>() {
        const auto* from = static_cast<const Word*>(x.raw_data());
        auto* to = static_cast<Word*>(y.raw_data());
        if (narrow_index)
            strided_copy_kernel<Word, std::uint32_t><<<grid, kThreads, 0, ctx.stream>>>(
                from, to, static_cast<std::uint32_t>(word_count), compact<std::uint32_t>(words));
        else
            strided_copy_kernel<Word, std::int64_t>
                <<<grid, kThreads, 0, ctx.stream>>>(from, to, word_count, compact<std::int64_t>(words));
    });
    DG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swap_axes(const Tensor& x, const std::vector<std::int64_t>& axes, Tensor& y) {
    swap_axes(context_for(x), x, y, split_for_swap(x.shape(), axes));
}

// narrow's and concat's row copies (ops/layout_geometry.h; the ops themselves: ops/layout.cpp). A copy of
// one contiguous run is one cudaMemcpyAsync; otherwise a kernel moves elements of 2, 4 or 8 bytes.
void copy_rows(const Tensor& src, Tensor& dst, const RowCopy& copy) {
    const std::int64_t n = copy.rows * copy.block;
    if (n == 0) return;
    DeviceContext& ctx = context_for(src);
    const std::size_t element_size = dtype_size(src.dtype());
    const unsigned char* from = bytes_at(src, copy.src_offset);
    unsigned char* to = bytes_at(dst, copy.dst_offset);
    if (copy.rows == 1 || (copy.src_stride == copy.block && copy.dst_stride == copy.block)) {
        DG_CUDA_CHECK(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n) * element_size, cudaMemcpyDeviceToDevice,
                                      ctx.stream));
        return;
    }
    const unsigned grid = grid_size(ctx, n, kThreads);
    with_element_word(element_size, [&]<typename E>() {
        rows_kernel<E><<<grid, kThreads, 0, ctx.stream>>>(reinterpret_cast<const E*>(from), copy.src_stride,
                                                          reinterpret_cast<E*>(to), copy.dst_stride, copy.rows,
                                                          copy.block, CopyElement{});
    });
    DG_CUDA_CHECK_LAUNCH();
}

void add_rows(const Tensor& src, Tensor& dst, const RowCopy& copy) {
    if (src.dtype() != dst.dtype() || src.device() != dst.device())
        throw DTypeError(str("add_rows: ", describe(src), " into ", describe(dst)));
    const std::int64_t n = copy.rows * copy.block;
    if (n == 0) return;
    const DeviceContext& ctx = context_for(dst);
    dispatch_gpu_floating(src.dtype(), "add_rows", [&]<typename T>() {
        rows_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            src.data<T>() + copy.src_offset, copy.src_stride, dst.data<T>() + copy.dst_offset, copy.dst_stride,
            copy.rows, copy.block, AddElement{});
    });
    DG_CUDA_CHECK_LAUNCH();
}

void strided_copy(const Tensor& x, Tensor& y, const StridedWalk<1>& walk) { strided_copy(context_for(x), x, y, walk); }

}  // namespace dyngrad::cuda
