// Batch norm, layer norm and RMS norm on the GPU. CPU reference: ops/norm.cpp.
//
// Batch norm views x as (N, C, HW) and reduces each channel's M = N·HW values in chunks: a grid of
// (C, chunks) blocks, each reducing its chunk with cub::BlockReduce into a workspace, then one thread
// per channel combining its chunks in a fixed order. Small C with large M still fills the GPU, and
// the result does not depend on scheduling (no atomics). Statistics are accumulated in the tensor's
// dtype: float with tree reductions for float32, double for float64. No host synchronisation: the
// running statistics are updated on the device, in place.
//
// Over 600 lines: the three normalisations (batch, layer, RMS) share the row/column reduction helpers.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <cub/block/block_reduce.cuh>

#include "dyngrad/cuda/context.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/norm_geometry.h"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda {

namespace {

constexpr unsigned kThreads = 256;
// Splitting a channel into more chunks than this many values each costs more in partials than it gains.
constexpr std::int64_t kMinChunk = 4096;
// Target for the reduction grid: enough blocks to keep every SM busy.
constexpr std::int64_t kBlocksPerSm = 8;
constexpr std::int64_t kMaxChunks = 65535;  // gridDim.y limit

__device__ __forceinline__ float device_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double device_sqrt(double v) { return sqrt(v); }

// ChannelLayout: ops/norm_geometry.h.

// How each channel's M values are split over blockIdx.y: `chunks` chunks of `chunk` values (the last
// may be shorter, none is empty).
struct Chunking {
    std::int64_t chunk = 1, chunks = 1;
};

Chunking chunking(const DeviceContext& ctx, const ChannelLayout& l) {
    const std::int64_t m = std::max<std::int64_t>(l.per_channel(), 1);
    const std::int64_t target_blocks = static_cast<std::int64_t>(std::max(ctx.multiprocessors, 1)) * kBlocksPerSm;
    std::int64_t chunks = (target_blocks + l.c - 1) / std::max<std::int64_t>(l.c, 1);
    chunks = std::clamp<std::int64_t>(std::min(chunks, (m + kMinChunk - 1) / kMinChunk), 1, kMaxChunks);
    Chunking k;
    k.chunk = (m + chunks - 1) / chunks;
    k.chunks = (m + k.chunk - 1) / k.chunk;
    return k;
}

// Visits positions j, j + step, ... of channel c's values (j = n·HW + s) with one division up front
// instead of one per element.
class ChannelWalk {
public:
    __device__ ChannelWalk(const ChannelLayout& l, std::int64_t c, std::int64_t j, std::int64_t step)
        : l_(l), c_(c), n_(j / l.hw), s_(j % l.hw), step_n_(step / l.hw), step_s_(step % l.hw) {}
    __device__ std::int64_t offset() const { return (n_ * l_.c + c_) * l_.hw + s_; }
    __device__ void advance() {
        n_ += step_n_;
        s_ += step_s_;
        if (s_ >= l_.hw) {
            s_ -= l_.hw;
            ++n_;
        }
    }

private:
    ChannelLayout l_;
    std::int64_t c_, n_, s_, step_n_, step_s_;
};

// The moments of one chunk of a channel: count, mean and Σ(x − mean)².
template <typename T>
struct Moments {
    std::int64_t count;
    T mean;
    T m2;
};

// x (N,C,HW) -> partials (C, chunks): each block takes chunk blockIdx.y of channel blockIdx.x, two
// passes over it (the second about the chunk's own mean, which does not cancel like Σx² − M·mean²).
template <typename T>
__global__ void batch_norm_moments_kernel(const T* __restrict__ x, ChannelLayout l, std::int64_t chunk,
                                          Moments<T>* __restrict__ partials) {
    using BlockReduce = cub::BlockReduce<T, kThreads>;
    __shared__ typename BlockReduce::TempStorage temp;
    __shared__ T chunk_mean;
    const std::int64_t c = blockIdx.x;
    const std::int64_t begin = blockIdx.y * chunk;
    const std::int64_t end = std::min(begin + chunk, l.per_channel());
    T sum = 0;
    ChannelWalk walk(l, c, begin + threadIdx.x, blockDim.x);
    for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x, walk.advance()) sum += x[walk.offset()];
    sum = BlockReduce(temp).Sum(sum);
    if (threadIdx.x == 0) chunk_mean = sum / static_cast<T>(end - begin);
    __syncthreads();  // publishes chunk_mean; temp may be reused
    const T mean = chunk_mean;
    T m2 = 0;
    ChannelWalk again(l, c, begin + threadIdx.x, blockDim.x);
    for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x, again.advance()) {
        const T d = x[again.offset()] - mean;
        m2 += d * d;
    }
    m2 = BlockReduce(temp).Sum(m2);
    if (threadIdx.x == 0) partials[c * gridDim.y + blockIdx.y] = Moments<T>{end - begin, mean, m2};
}

// partials (C, chunks) -> mean, invstd (C); running_mean, running_var (C) updated in place with the
// unbiased variance. One thread per channel combines its chunks in order (Chan, Golub, LeVeque).
template <typename T>
__global__ void batch_norm_train_stats_kernel(const Moments<T>* __restrict__ partials, std::int64_t channels,
                                              std::int64_t chunks, double momentum, T eps,
                                              T* __restrict__ running_mean, T* __restrict__ running_var,
                                              T* __restrict__ mean, T* __restrict__ invstd) {
    for (std::int64_t c = thread_index(); c < channels; c += thread_count()) {
        const Moments<T>* part = partials + c * chunks;
        Moments<T> total = part[0];
        for (std::int64_t p = 1; p < chunks; ++p) {
            const Moments<T> b = part[p];
            const std::int64_t count = total.count + b.count;
            const T delta = b.mean - total.mean;
            const T weight = static_cast<T>(b.count) / static_cast<T>(count);
            total.mean += delta * weight;
            total.m2 += b.m2 + delta * delta * static_cast<T>(total.count) * weight;
            total.count = count;
        }
        const T var = total.m2 / static_cast<T>(total.count);
        mean[c] = total.mean;
        invstd[c] = T(1) / device_sqrt(var + eps);
        const double unbiased = static_cast<double>(total.count) / static_cast<double>(total.count - 1);
        running_mean[c] = static_cast<T>((1 - momentum) * static_cast<double>(running_mean[c]) +
                                         momentum * static_cast<double>(total.mean));
        running_var[c] = static_cast<T>((1 - momentum) * static_cast<double>(running_var[c]) +
                                        momentum * static_cast<double>(var) * unbiased);
    }
}

// running_mean, running_var (C) -> mean, invstd (C), the statistics of eval mode
template <typename T>
__global__ void batch_norm_eval_stats_kernel(const T* __restrict__ running_mean, const T* __restrict__ running_var,
                                             std::int64_t channels, T eps, T* __restrict__ mean,
                                             T* __restrict__ invstd) {
    for (std::int64_t c = thread_index(); c < channels; c += thread_count()) {
        mean[c] = running_mean[c];
        invstd[c] = T(1) / device_sqrt(running_var[c] + eps);
    }
}

// x, y (N,C,HW): y = (x − mean)·(gamma·invstd) + beta
template <typename T>
__global__ void batch_norm_normalize_kernel(const T* __restrict__ x, const T* __restrict__ mean,
                                            const T* __restrict__ invstd, const T* __restrict__ gamma,
                                            const T* __restrict__ beta, ChannelLayout l, std::int64_t n,
                                            T* __restrict__ y) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
        const std::int64_t c = (i / l.hw) % l.c;
        y[i] = (x[i] - mean[c]) * (gamma[c] * invstd[c]) + beta[c];
    }
}

// x, dy (N,C,HW) -> partial_dy, partial_dy_xhat (C, chunks): Σ dy and Σ dy·x̂ over each chunk,
// x̂ = (x − mean)·invstd.
template <typename T>
__global__ void batch_norm_backward_partials_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                                    const T* __restrict__ mean, const T* __restrict__ invstd,
                                                    ChannelLayout l, std::int64_t chunk, T* __restrict__ partial_dy,
                                                    T* __restrict__ partial_dy_xhat) {
    using BlockReduce = cub::BlockReduce<T, kThreads>;
    __shared__ typename BlockReduce::TempStorage temp;
    const std::int64_t c = blockIdx.x;
    const std::int64_t begin = blockIdx.y * chunk;
    const std::int64_t end = std::min(begin + chunk, l.per_channel());
    const T mu = mean[c];
    const T inv = invstd[c];
    T sum_dy = 0, sum_dy_xhat = 0;
    ChannelWalk walk(l, c, begin + threadIdx.x, blockDim.x);
    for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x, walk.advance()) {
        const std::int64_t i = walk.offset();
        sum_dy += dy[i];
        sum_dy_xhat += dy[i] * ((x[i] - mu) * inv);
    }
    sum_dy = BlockReduce(temp).Sum(sum_dy);
    __syncthreads();  // temp is reused
    sum_dy_xhat = BlockReduce(temp).Sum(sum_dy_xhat);
    if (threadIdx.x == 0) {
        partial_dy[c * gridDim.y + blockIdx.y] = sum_dy;
        partial_dy_xhat[c * gridDim.y + blockIdx.y] = sum_dy_xhat;
    }
}

// partials (C, chunks) -> sum_dy = dbeta, sum_dy_xhat = dgamma (C); chunks summed in order.
template <typename T>
__global__ void batch_norm_backward_sums_kernel(const T* __restrict__ partial_dy, const T* __restrict__ partial_dy_xhat,
                                                std::int64_t channels, std::int64_t chunks, T* __restrict__ sum_dy,
                                                T* __restrict__ sum_dy_xhat) {
    for (std::int64_t c = thread_index(); c < channels; c += thread_count()) {
        T a = 0, b = 0;
        for (std::int64_t p = 0; p < chunks; ++p) {
            a += partial_dy[c * chunks + p];
            b += partial_dy_xhat[c * chunks + p];
        }
        sum_dy[c] = a;
        sum_dy_xhat[c] = b;
    }
}

// x, dy, dx (N,C,HW); per channel k = gamma·invstd:
//   training: dx = k·(dy − Σdy/M − x̂·Σ(dy·x̂)/M)     eval (sums null): dx = k·dy
template <typename T>
__global__ void batch_norm_dx_kernel(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ mean,
                                     const T* __restrict__ invstd, const T* __restrict__ gamma,
                                     const T* __restrict__ sum_dy, const T* __restrict__ sum_dy_xhat, T inv_count,
                                     ChannelLayout l, std::int64_t n, T* __restrict__ dx) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
        const std::int64_t c = (i / l.hw) % l.c;
        const T k = gamma[c] * invstd[c];
        if (sum_dy == nullptr) {
            dx[i] = dy[i] * k;
        } else {
            const T xhat = (x[i] - mean[c]) * invstd[c];
            dx[i] = (dy[i] - sum_dy[c] * inv_count - xhat * (sum_dy_xhat[c] * inv_count)) * k;
        }
    }
}

// ---- layer_norm and rms_norm: x seen as (rows, n) ----
//
// Forward and dx: a group of kThreadsPerRow threads per row, 32 (one warp; 8 rows per block) for rows of up to
// 32·kCacheUnits vector units, else 256 (one block per row). Each thread keeps its first kCache units of the
// row in registers, so rows of up to 8192 floats (4096 doubles) are read from memory once; longer rows re-read
// the rest from L2 in each pass, so any length works. A one-warp row takes the fewest cache slots that hold it
// (2, 3, 4 or 8 vector units a lane) and no loop past them: the registers of unused slots kept GPT-2's bf16
// LayerNorms (768 wide: 3 units a lane) at one block per SM (160 and 198 registers, forward and dx; 63 and 80 now,
// with kMinBlocks). The statistics take two passes over the registers (mean,
// then Σ(x − mean)², which does not cancel like Σx² − n·mean²). Accumulation in the tensor's dtype: float32 sums
// each thread's few values in order and combines the threads by a fixed butterfly/tree, relative error about
// (n/threads + log2 threads)·2⁻²⁴ — far inside what the float64 replay (verify) and GPU-vs-CPU checks allow.
// Loads are 16 bytes (float4 / double2) when every row starts 16-byte aligned (n a multiple of the width and
// aligned pointers), else scalar.
// dweight/dbias: column sums over rows, a (columns/32, row chunks) grid of 32x8 blocks writing per-chunk partial
// sums that one more kernel adds in chunk order: coalesced, and no atomics, so the result is deterministic.

constexpr int kNormBlockThreads = 256;
constexpr int kCacheUnits = 8;
// Blocks per SM the compiler must leave room for (__launch_bounds__), by cache slots: no spills at these counts
// (ptxas -v, sm_90, every dtype).
template <int kCache> constexpr int kMinBlocks = kCache <= 3 ? 3 : (kCache == 4 ? 2 : 1);
// A row of one warp is cached whole (with_row_config launches it only then): no loop over the rest.
template <int kThreadsPerRow> constexpr bool kAllCached = kThreadsPerRow == 32;
constexpr int kColumnTile = 32;
constexpr int kColumnRows = 8;
// A chunk of rows for the dweight/dbias partials is never shorter than this.
constexpr std::int64_t kMinRowsPerChunk = 64;

// W values of T as one access (W = 1: a scalar).
template <typename T, int W>
struct alignas(sizeof(T) * W) Vec {
    T v[W];
};

template <typename T, int W>
__device__ __forceinline__ Vec<T, W> load_vec(const T* p, std::int64_t unit) {
    return reinterpret_cast<const Vec<T, W>*>(p)[unit];
}
template <typename T, int W>
__device__ __forceinline__ void store_vec(T* p, std::int64_t unit, const Vec<T, W>& value) {
    reinterpret_cast<Vec<T, W>*>(p)[unit] = value;
}
template <typename T, int W>
__device__ __forceinline__ Vec<T, W> load_vec_or(const T* p, std::int64_t unit, T fallback) {
    if (p != nullptr) return load_vec<T, W>(p, unit);
    Vec<T, W> v;
#pragma unroll
    for (int j = 0; j < W; ++j) v.v[j] = fallback;
    return v;
}

// The sum of v over the kThreadsPerRow threads of a row (threadIdx.x), the same value on each of them:
// a butterfly within the warp (partners add the same two numbers), then for a block-wide row the warps'
// sums through shared memory, added in warp order by every thread.
template <int kThreadsPerRow, typename T>
__device__ __forceinline__ T row_sum(T v, T* shared) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if constexpr (kThreadsPerRow == 32) {
        return v;
    } else {
        __syncthreads();  // the previous call's readers are done with `shared`
        if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
        __syncthreads();
        T total = 0;
#pragma unroll
        for (int k = 0; k < kThreadsPerRow / 32; ++k) total += shared[k];
        return total;
    }
}

// x (rows, n), w, b (n) or null -> y (rows, n), mean (rows; kCenter only), rstd (rows).
// Block (kThreadsPerRow, 256 / kThreadsPerRow): threadIdx.y picks the row within the block.
// bf16/f16 (T) natively: values load as T and compute in A = acc_t<T> (float), the statistics are kept in A, y is
// rounded to T once; the GPT's reduced residual stream (nn/transformer.h) runs its LayerNorms so, with no pass
// through f32 copies (four conversion kernels a LayerNorm and its backward, ncu, H200, 2026-11-29).
template <typename T, bool kCenter, int kThreadsPerRow, int W, int kCache, typename A = acc_t<T>>
__global__ void __launch_bounds__(kNormBlockThreads, kMinBlocks<kCache>)
    row_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                            std::int64_t rows, std::int64_t n, A eps, T* __restrict__ y, A* __restrict__ mean_out,
                            A* __restrict__ rstd_out) {
    constexpr int kRowsPerBlock = kNormBlockThreads / kThreadsPerRow;
    using V = Vec<T, W>;
    __shared__ A shared[kThreadsPerRow / 32];
    const std::int64_t units = n / W;
    const std::int64_t lane = threadIdx.x;
    const A inv_n = A(1) / static_cast<A>(n);
    for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y; row < rows;
         row += static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock) {
        const T* xr = x + row * n;
        V cache[kCache];
        A sum = 0;
#pragma unroll
        for (int k = 0; k < kCache; ++k) {
            const std::int64_t u = lane + k * kThreadsPerRow;
            if (u < units) {
                cache[k] = load_vec<T, W>(xr, u);
#pragma unroll
                for (int j = 0; j < W; ++j) sum += to_acc(cache[k].v[j]);
            }
        }
        if constexpr (!kAllCached<kThreadsPerRow>)
            for (std::int64_t u = lane + kCache * kThreadsPerRow; u < units; u += kThreadsPerRow) {
                const V v = load_vec<T, W>(xr, u);
#pragma unroll
                for (int j = 0; j < W; ++j) sum += to_acc(v.v[j]);
            }
        A mean = 0;
        if constexpr (kCenter) mean = row_sum<kThreadsPerRow>(sum, shared) * inv_n;

        A squares = 0;
        const auto add_squares = [&](const V& v) {
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const A d = to_acc(v.v[j]) - mean;
                squares += d * d;
            }
        };
#pragma unroll
        for (int k = 0; k < kCache; ++k)
            if (lane + k * kThreadsPerRow < units) add_squares(cache[k]);
        if constexpr (!kAllCached<kThreadsPerRow>)
            for (std::int64_t u = lane + kCache * kThreadsPerRow; u < units; u += kThreadsPerRow)
                add_squares(load_vec<T, W>(xr, u));
        const A rstd = A(1) / device_sqrt(row_sum<kThreadsPerRow>(squares, shared) * inv_n + eps);
        if (lane == 0) {
            if constexpr (kCenter) mean_out[row] = mean;
            rstd_out[row] = rstd;
        }

        T* yr = y + row * n;
        const auto normalize = [&](const V& v, std::int64_t u) {
            const V wv = load_vec_or<T, W>(w, u, from_acc<T>(A(1)));
            const V bv = load_vec_or<T, W>(b, u, from_acc<T>(A(0)));
            V out;
#pragma unroll
            for (int j = 0; j < W; ++j)
                out.v[j] = from_acc<T>((to_acc(v.v[j]) - mean) * rstd * to_acc(wv.v[j]) + to_acc(bv.v[j]));
            store_vec<T, W>(yr, u, out);
        };
#pragma unroll
        for (int k = 0; k < kCache; ++k) {
            const std::int64_t u = lane + k * kThreadsPerRow;
            if (u < units) normalize(cache[k], u);
        }
        if constexpr (!kAllCached<kThreadsPerRow>)
            for (std::int64_t u = lane + kCache * kThreadsPerRow; u < units; u += kThreadsPerRow)
                normalize(load_vec<T, W>(xr, u), u);
    }
}

// x, dy (rows, n), w (n) or null, mean (rows; kCenter only), rstd (rows) -> dx (rows, n):
//   x̂ = (x − mean)·rstd, g = dy·w:  dx = rstd·(g − Σg/n − x̂·Σ(g·x̂)/n)   (no Σg/n term without kCenter)
template <typename T, bool kCenter, int kThreadsPerRow, int W, int kCache, typename A = acc_t<T>>
__global__ void __launch_bounds__(kNormBlockThreads, kMinBlocks<kCache>)
    row_norm_dx_kernel(const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ w,
                       const A* __restrict__ mean, const A* __restrict__ rstd, std::int64_t rows, std::int64_t n,
                       T* __restrict__ dx) {
    constexpr int kRowsPerBlock = kNormBlockThreads / kThreadsPerRow;
    using V = Vec<T, W>;
    __shared__ A shared[kThreadsPerRow / 32];
    const std::int64_t units = n / W;
    const std::int64_t lane = threadIdx.x;
    const A inv_n = A(1) / static_cast<A>(n);
    for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y; row < rows;
         row += static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock) {
        const T* xr = x + row * n;
        const T* dyr = dy + row * n;
        const A mu = kCenter ? mean[row] : A(0);
        const A r = rstd[row];
        V x_cache[kCache], dy_cache[kCache];
        A sum_g = 0, sum_g_xhat = 0;
        const auto accumulate = [&](const V& xv, const V& dyv, std::int64_t u) {
            const V wv = load_vec_or<T, W>(w, u, from_acc<T>(A(1)));
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const A g = to_acc(dyv.v[j]) * to_acc(wv.v[j]);
                sum_g += g;
                sum_g_xhat += g * ((to_acc(xv.v[j]) - mu) * r);
            }
        };
#pragma unroll
        for (int k = 0; k < kCache; ++k) {
            const std::int64_t u = lane + k * kThreadsPerRow;
            if (u < units) {
                x_cache[k] = load_vec<T, W>(xr, u);
                dy_cache[k] = load_vec<T, W>(dyr, u);
                accumulate(x_cache[k], dy_cache[k], u);
            }
        }
        if constexpr (!kAllCached<kThreadsPerRow>)
            for (std::int64_t u = lane + kCache * kThreadsPerRow; u < units; u += kThreadsPerRow)
                accumulate(load_vec<T, W>(xr, u), load_vec<T, W>(dyr, u), u);
        const A mean_g = kCenter ? row_sum<kThreadsPerRow>(sum_g, shared) * inv_n : A(0);
        const A mean_g_xhat = row_sum<kThreadsPerRow>(sum_g_xhat, shared) * inv_n;

        T* dxr = dx + row * n;
        const auto write = [&](const V& xv, const V& dyv, std::int64_t u) {
            const V wv = load_vec_or<T, W>(w, u, from_acc<T>(A(1)));
            V out;
#pragma unroll
            for (int j = 0; j < W; ++j) {
                const A xhat = (to_acc(xv.v[j]) - mu) * r;
                out.v[j] = from_acc<T>(r * (to_acc(dyv.v[j]) * to_acc(wv.v[j]) - mean_g - xhat * mean_g_xhat));
            }
            store_vec<T, W>(dxr, u, out);
        };
#pragma unroll
        for (int k = 0; k < kCache; ++k) {
            const std::int64_t u = lane + k * kThreadsPerRow;
            if (u < units) write(x_cache[k], dy_cache[k], u);
        }
        if constexpr (!kAllCached<kThreadsPerRow>)
            for (std::int64_t u = lane + kCache * kThreadsPerRow; u < units; u += kThreadsPerRow)
                write(load_vec<T, W>(xr, u), load_vec<T, W>(dyr, u), u);
    }
}

// x, dy (rows, n) -> partial_dw, partial_db (chunks, n): Σ dy·x̂ and Σ dy over chunk blockIdx.y's rows for the
// 32 columns of blockIdx.x. Block (32, 8): a warp reads 32 consecutive columns of a row. A null output is skipped.
// In A = acc_t<T>: bf16/f16 sums are float32 partials, rounded once when sum_chunks_kernel writes dw and db.
template <typename T, bool kCenter, typename A = acc_t<T>>
__global__ void row_norm_param_partials_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                               const A* __restrict__ mean, const A* __restrict__ rstd,
                                               std::int64_t rows, std::int64_t n, std::int64_t rows_per_chunk,
                                               A* __restrict__ partial_dw, A* __restrict__ partial_db) {
    __shared__ A dw_part[kColumnRows][kColumnTile + 1];
    __shared__ A db_part[kColumnRows][kColumnTile + 1];
    const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
    const std::int64_t begin = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
    const std::int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
    A sum_dw = 0, sum_db = 0;
    if (column < n) {
        for (std::int64_t r = begin + threadIdx.y; r < end; r += kColumnRows) {
            const std::int64_t i = r * n + column;
            const A g = to_acc(dy[i]);
            sum_dw += g * ((to_acc(x[i]) - (kCenter ? mean[r] : A(0))) * rstd[r]);
            sum_db += g;
        }
    }
    dw_part[threadIdx.y][threadIdx.x] = sum_dw;
    db_part[threadIdx.y][threadIdx.x] = sum_db;
    __syncthreads();
    if (threadIdx.y != 0 || column >= n) return;
    A total_dw = 0, total_db = 0;
#pragma unroll
    for (int k = 0; k < kColumnRows; ++k) {
        total_dw += dw_part[k][threadIdx.x];
        total_db += db_part[k][threadIdx.x];
    }
    const std::int64_t out = static_cast<std::int64_t>(blockIdx.y) * n + column;
    if (partial_dw != nullptr) partial_dw[out] = total_dw;
    if (partial_db != nullptr) partial_db[out] = total_db;
}

// partials (chunks, n) in A -> out (n) in T: the chunks added in order, rounded to T once
template <typename T, typename A = acc_t<T>>
__global__ void sum_chunks_kernel(const A* __restrict__ partials, std::int64_t chunks, std::int64_t n,
                                  T* __restrict__ out) {
    for (std::int64_t j = thread_index(); j < n; j += thread_count()) {
        A total = 0;
        for (std::int64_t c = 0; c < chunks; ++c) total += partials[c * n + j];
        out[j] = from_acc<T>(total);
    }
}

bool aligned_16(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
        if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
    return true;
}

// Calls launch.template operator()<kThreadsPerRow, W, kCache>() for the row kernels' configuration (see above).
template <typename T, typename Launch>
void with_row_config(std::int64_t n, std::initializer_list<const void*> pointers, Launch&& launch) {
    constexpr int kWidth = 16 / static_cast<int>(sizeof(T));
    const bool vector = n % kWidth == 0 && aligned_16(pointers);
    const std::int64_t units = vector ? n / kWidth : n;
    if (units > 32 * kCacheUnits) {
        if (vector) launch.template operator()<kNormBlockThreads, kWidth, kCacheUnits>();
        else launch.template operator()<kNormBlockThreads, 1, kCacheUnits>();
    } else if (!vector) {
        launch.template operator()<32, 1, kCacheUnits>();
    } else if (units <= 32 * 2) {
        launch.template operator()<32, kWidth, 2>();
    } else if (units <= 32 * 3) {
        launch.template operator()<32, kWidth, 3>();
    } else if (units <= 32 * 4) {
        launch.template operator()<32, kWidth, 4>();
    } else {
        launch.template operator()<32, kWidth, kCacheUnits>();
    }
}

}  // namespace

// Saves mean and invstd = 1/sqrt(var + eps) (C) as used: the batch's in training (the running ones
// updated in place on the device), the running ones in eval.
Tensor batch_norm_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& running_mean = args.inputs[3];
    const Tensor& running_var = args.inputs[4];
    const BatchNormForward f = batch_norm_forward_outputs(args);
    const ChannelLayout l = f.layout;
    const Tensor &y = f.y, &mean = f.mean, &invstd = f.invstd;
    if (l.c == 0) return y;
    DeviceContext& ctx = context_for(x);
    const OpAttrs& a = args.attrs;
    const std::int64_t n = x.numel();
    dispatch_floating(x.dtype(), "batch_norm", [&]<typename T>() {
        const T eps = static_cast<T>(a.eps);
        const unsigned channel_blocks = grid_size(ctx, l.c, kThreads);
        if (a.training) {
            const Chunking k = chunking(ctx, l);
            Workspace partials(ctx, static_cast<std::size_t>(l.c * k.chunks) * sizeof(Moments<T>));
            auto* partials_data = static_cast<Moments<T>*>(partials.data());
            batch_norm_moments_kernel<T><<<dim3(static_cast<unsigned>(l.c), static_cast<unsigned>(k.chunks)),
                                          kThreads, 0, ctx.stream>>>(x.data<T>(), l, k.chunk, partials_data);
            DG_CUDA_CHECK_LAUNCH();
            batch_norm_train_stats_kernel<T><<<channel_blocks, kThreads, 0, ctx.stream>>>(
                partials_data, l.c, k.chunks, a.momentum, eps, running_mean.data<T>(), running_var.data<T>(),
                mean.data<T>(), invstd.data<T>());
            DG_CUDA_CHECK_LAUNCH();
        } else {
            batch_norm_eval_stats_kernel<T><<<channel_blocks, kThreads, 0, ctx.stream>>>(
                running_mean.data<T>(), running_var.data<T>(), l.c, eps, mean.data<T>(), invstd.data<T>());
            DG_CUDA_CHECK_LAUNCH();
        }
        if (n == 0) return;
        batch_norm_normalize_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            x.data<T>(), mean.data<T>(), invstd.data<T>(), args.inputs[1].data<T>(), args.inputs[2].data<T>(), l, n,
            y.data<T>());
        DG_CUDA_CHECK_LAUNCH();
    });
    return y;
}

// Formulas: ops/norm_geometry.h (BatchNormBackward). The per-channel sums: partial sums per chunk, then one
// pass per channel; dx: one thread per element.
std::vector<Tensor> batch_norm_backward(const BackwardArgs& args) {
    std::vector<Tensor> grads(args.inputs.size());
    const std::optional<BatchNormBackward> plan = batch_norm_backward_plan(args);
    if (!plan) return grads;
    const BatchNormBackward& p = *plan;
    const bool need_sums = p.need_sums();
    const ChannelLayout l = p.layout;
    // The sums are dbeta and dgamma: computed into the gradients themselves (the dx kernel reads them).
    Tensor sum_dy, sum_dy_xhat;
    if (need_sums) {
        sum_dy = Tensor::empty({l.c}, p.x.dtype(), p.x.device());
        sum_dy_xhat = Tensor::empty({l.c}, p.x.dtype(), p.x.device());
    }
    if (p.need_dx) grads[0] = Tensor::empty(p.x.shape(), p.x.dtype(), p.x.device());
    if (p.need_dgamma) grads[1] = sum_dy_xhat;
    if (p.need_dbeta) grads[2] = sum_dy;
    if (l.c == 0) return grads;
    DeviceContext& ctx = context_for(p.x);
    const std::int64_t n = p.x.numel();
    dispatch_floating(p.x.dtype(), "batch_norm backward", [&]<typename T>() {
        if (need_sums) {
            if (n == 0) {  // eval on an empty batch: nothing to sum
                sum_dy.fill(0.0);
                sum_dy_xhat.fill(0.0);
            } else {
                const Chunking k = chunking(ctx, l);
                Workspace partials(ctx, 2 * static_cast<std::size_t>(l.c * k.chunks) * sizeof(T));
                T* partial_dy = static_cast<T*>(partials.data());
                T* partial_dy_xhat = partial_dy + l.c * k.chunks;
                batch_norm_backward_partials_kernel<T>
                    <<<dim3(static_cast<unsigned>(l.c), static_cast<unsigned>(k.chunks)), kThreads, 0, ctx.stream>>>(
                        p.x.data<T>(), p.dy.data<T>(), p.mean.data<T>(), p.invstd.data<T>(), l, k.chunk, partial_dy,
                        partial_dy_xhat);
                DG_CUDA_CHECK_LAUNCH();
                batch_norm_backward_sums_kernel<T><<<grid_size(ctx, l.c, kThreads), kThreads, 0, ctx.stream>>>(
                    partial_dy, partial_dy_xhat, l.c, k.chunks, sum_dy.data<T>(), sum_dy_xhat.data<T>());
                DG_CUDA_CHECK_LAUNCH();
            }
        }
        if (!p.need_dx || n == 0) return;
        batch_norm_dx_kernel<T><<<grid_size(ctx, n, kThreads), kThreads, 0, ctx.stream>>>(
            p.x.data<T>(), p.dy.data<T>(), p.mean.data<T>(), p.invstd.data<T>(), args.inputs[1].data<T>(),
            p.training ? sum_dy.data<T>() : nullptr, p.training ? sum_dy_xhat.data<T>() : nullptr,
            static_cast<T>(1.0 / static_cast<double>(std::max<std::int64_t>(l.per_channel(), 1))), l, n,
            grads[0].data<T>());
        DG_CUDA_CHECK_LAUNCH();
    });
    return grads;
}

Tensor row_norm_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const bool center = args.op == OpType::LayerNorm;
    const RowNormLayout l = row_norm_layout(x.shape(), args.attrs.shape);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    // The statistics in the kernels' compute type: float32 for bf16/f16 x (as the CPU's run through f32 saves them).
    const DType stats = is_reduced_precision(x.dtype()) ? DType::f32 : x.dtype();
    Tensor mean = center ? Tensor::empty({l.rows}, stats, x.device()) : Tensor();
    Tensor rstd = Tensor::empty({l.rows}, stats, x.device());
    if (center) args.saved.push_back(mean);
    args.saved.push_back(rstd);
    if (l.rows == 0) return y;
    if (l.n == 0) {  // no values to normalise: the statistics are defined as the CPU kernels leave them
        if (center) mean.fill(0.0);
        rstd.fill(0.0);
        return y;
    }
    DeviceContext& ctx = context_for(x);
    dispatch_gpu_floating(x.dtype(), "row_norm", [&]<typename T>() {
        using A = acc_t<T>;
        const T* xp = x.data<T>();
        const T* wp = args.inputs.size() > 1 ? args.inputs[1].data<T>() : nullptr;
        const T* bp = args.inputs.size() > 2 ? args.inputs[2].data<T>() : nullptr;
        T* yp = y.data<T>();
        A* mp = center ? mean.data<A>() : nullptr;
        A* rp = rstd.data<A>();
        const A eps = static_cast<A>(args.attrs.eps);
        with_row_config<T>(l.n, {xp, wp, bp, yp}, [&]<int kThreadsPerRow, int W, int kCache>() {
            const dim3 block(kThreadsPerRow, kNormBlockThreads / kThreadsPerRow);
            const unsigned blocks = grid_size(ctx, l.rows * kThreadsPerRow, kNormBlockThreads);
            if (center)
                row_norm_forward_kernel<T, true, kThreadsPerRow, W, kCache>
                    <<<blocks, block, 0, ctx.stream>>>(xp, wp, bp, l.rows, l.n, eps, yp, mp, rp);
            else
                row_norm_forward_kernel<T, false, kThreadsPerRow, W, kCache>
                    <<<blocks, block, 0, ctx.stream>>>(xp, wp, bp, l.rows, l.n, eps, yp, mp, rp);
            DG_CUDA_CHECK_LAUNCH();
        });
    });
    return y;
}

// dy (rows, n) -> dx (rows, n), dw = Σ_rows dy·x̂, db = Σ_rows dy (n); formulas: ops/norm_geometry.h, kernels above.
std::vector<Tensor> row_norm_backward(const BackwardArgs& args) {
    const RowNormBackward p = row_norm_backward_plan(args);
    const RowNormLayout l = p.layout;
    std::vector<Tensor> grads(args.inputs.size());
    if (p.need_dx) grads[0] = Tensor::empty(p.x.shape(), p.x.dtype(), p.x.device());
    if (p.need_dw) grads[1] = Tensor::empty(args.attrs.shape, p.x.dtype(), p.x.device());
    if (p.need_db) grads[2] = Tensor::empty(args.attrs.shape, p.x.dtype(), p.x.device());
    if (l.n == 0) return grads;
    if (l.rows == 0) {  // no rows: the parameters' gradients are empty sums
        if (p.need_dw) grads[1].fill(0.0);
        if (p.need_db) grads[2].fill(0.0);
        return grads;
    }
    DeviceContext& ctx = context_for(p.x);
    dispatch_gpu_floating(p.x.dtype(), "row_norm backward", [&]<typename T>() {
        using A = acc_t<T>;
        const T* xp = p.x.data<T>();
        const T* dyp = p.dy.data<T>();
        const T* wp = args.inputs.size() > 1 ? args.inputs[1].data<T>() : nullptr;
        const A* mp = p.center ? args.saved[0].data<A>() : nullptr;
        const A* rp = args.saved.back().data<A>();
        if (p.need_dx) {
            T* dxp = grads[0].data<T>();
            with_row_config<T>(l.n, {xp, dyp, wp, dxp}, [&]<int kThreadsPerRow, int W, int kCache>() {
                const dim3 block(kThreadsPerRow, kNormBlockThreads / kThreadsPerRow);
                const unsigned blocks = grid_size(ctx, l.rows * kThreadsPerRow, kNormBlockThreads);
                if (p.center)
                    row_norm_dx_kernel<T, true, kThreadsPerRow, W, kCache>
                        <<<blocks, block, 0, ctx.stream>>>(xp, dyp, wp, mp, rp, l.rows, l.n, dxp);
                else
                    row_norm_dx_kernel<T, false, kThreadsPerRow, W, kCache>
                        <<<blocks, block, 0, ctx.stream>>>(xp, dyp, wp, mp, rp, l.rows, l.n, dxp);
                DG_CUDA_CHECK_LAUNCH();
            });
        }
        if (!p.need_dw && !p.need_db) return;
        // Enough (column tile, row chunk) blocks to fill the GPU, each chunk at least kMinRowsPerChunk rows.
        const std::int64_t tiles = (l.n + kColumnTile - 1) / kColumnTile;
        const std::int64_t target = static_cast<std::int64_t>(std::max(ctx.multiprocessors, 1)) * kBlocksPerSm;
        std::int64_t chunks = std::clamp<std::int64_t>((target + tiles - 1) / tiles, 1,
                                                       (l.rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk);
        chunks = std::min(chunks, kMaxChunks);
        const std::int64_t rows_per_chunk = (l.rows + chunks - 1) / chunks;
        chunks = (l.rows + rows_per_chunk - 1) / rows_per_chunk;
        // One chunk of f32/f64 writes the gradients directly; otherwise partials in A, which sum_chunks_kernel adds in
        // order and rounds to T.
        constexpr bool kSameType = std::is_same_v<A, T>;
        std::optional<Workspace> partials;
        if (chunks > 1 || !kSameType) partials.emplace(ctx, 2 * static_cast<std::size_t>(chunks * l.n) * sizeof(A));
        T* dwp = p.need_dw ? grads[1].data<T>() : nullptr;
        T* dbp = p.need_db ? grads[2].data<T>() : nullptr;
        A* partial_base = partials ? static_cast<A*>(partials->data()) : nullptr;
        // Without partials (f32/f64, one chunk) the kernel writes the gradients themselves.
        const auto direct = [](T* out) -> A* {
            if constexpr (kSameType) return out;
            else return nullptr;
        };
        A* partial_dw = p.need_dw ? (partials ? partial_base : direct(dwp)) : nullptr;
        A* partial_db = p.need_db ? (partials ? partial_base + chunks * l.n : direct(dbp)) : nullptr;
        const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
        const dim3 block(kColumnTile, kColumnRows);
        if (p.center)
            row_norm_param_partials_kernel<T, true>
                <<<grid, block, 0, ctx.stream>>>(xp, dyp, mp, rp, l.rows, l.n, rows_per_chunk, partial_dw, partial_db);
        else
            row_norm_param_partials_kernel<T, false>
                <<<grid, block, 0, ctx.stream>>>(xp, dyp, mp, rp, l.rows, l.n, rows_per_chunk, partial_dw, partial_db);
        DG_CUDA_CHECK_LAUNCH();
        if (!partials) return;
        const unsigned blocks = grid_size(ctx, l.n, kThreads);
        for (const auto& [partial, out] : {std::pair{partial_dw, dwp}, std::pair{partial_db, dbp}}) {
            if (out == nullptr) continue;
            sum_chunks_kernel<T><<<blocks, kThreads, 0, ctx.stream>>>(partial, chunks, l.n, out);
            DG_CUDA_CHECK_LAUNCH();
        }
    });
    return grads;
}

}  // namespace dyngrad::cuda
