// scaled_dot_product_attention on the GPU: fused flash-attention kernels, two sets: SIMT kernels in exact FMA
// arithmetic (float32 and float64; described here) and, on sm_80+, tensor-core kernels on mma.sync (namespace mma
// below): float32 in 3xTF32 (chosen by attention_gpu_path()), bfloat16 and float16 natively with f32 softmax and
// accumulators. CPU reference: ops/attention.cpp; the contract (mask, dropout, empty rows): ops/attention.h.
// Over 600 lines: one fused op's SIMT and tensor-core kernel sets, sharing its parameters, masking, dropout and launches.
//
// Forward (one block per TILE queries of one (b, h) slice): the queries stay in shared memory, key/value tiles
// stream through it, each row keeps a running max m and sum l (online softmax) and rescales its output
// accumulator when m grows. Only the output and the log-sum-exp m + log l per row reach global memory: memory
// is linear in T and S. Causal blocks stop at their last query's key tile.
// Backward, by recomputation from the saved log-sum-exp: a pre-pass D_t = rowsum(dO∘O), then one kernel per key
// tile accumulating dK, dV over the query tiles and one per query tile accumulating dQ over the key tiles. The
// second recomputes the scores once more instead of adding into dQ with atomics, so gradients are
// deterministic (the same bits on every run). The float32 tensor-core path outside deterministic mode
// (cuda::deterministic() false, the default) fuses the two instead: the key-tile kernel also adds dS·K into dQ
// with float atomics (mma::attention_backward_kv_kernel's kFuseDq).
//
// Tiles: TILE×TILE scores per block, 2·TILE threads as (TILE/4) row groups × 8 lanes; a thread owns 4 rows and
// the columns 4·lane + k + 32·j, so the 8 lanes of a row group hold a whole row (shuffle reductions) and the
// shared-memory reads of a warp hit distinct banks or broadcast. Every operand sits in shared memory transposed,
// [reduction index][row] with TILE + 1 floats per line: the coalesced global loads then store without bank
// conflicts. The head dim is padded with zeros to DP = 32, 64 or 128. float32: TILE 64 (128 threads);
// float64 (correctness, not speed): TILE 32, to fit shared memory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/attention.h"
#include "dyngrad/ops/attention_cudnn.h"
#include "dyngrad/ops/attention_geometry.h"
#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda {

namespace {

// The sizes and options every kernel reads, passed by value.
struct Params {
    std::int64_t heads, queries, keys, head_dim;
    float scale_f;  // the scale in the kernels' arithmetic type is taken from these two
    double scale_d;
    bool causal;
    double dropout_p;
    double kept_factor;  // 1/(1 − p)
    std::uint64_t seed;
    const void* mask;  // null: none
    std::int64_t mask_stride[4];
    bool vector_rows;  // tensor-core kernels: every input row starts 16-byte aligned and D % 4 == 0 (float4 loads)
};

template <typename Real> __device__ __forceinline__ Real scale_of(const Params& p);
template <> __device__ __forceinline__ float scale_of<float>(const Params& p) { return p.scale_f; }
template <> __device__ __forceinline__ double scale_of<double>(const Params& p) { return p.scale_d; }

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }

template <typename Real> __device__ __forceinline__ Real minus_infinity() {
    return -std::numeric_limits<Real>::infinity();
}

// Whether key s takes part in query t of slice `slice` (= b·H + h): in range, causal, the keep mask.
template <typename Real>
__device__ __forceinline__ bool takes_part(const Params& p, std::int64_t slice, std::int64_t t, std::int64_t s) {
    if (t >= p.queries || s >= p.keys) return false;
    if (p.causal && s > t) return false;
    if (p.mask) {
        const std::int64_t b = slice / p.heads, h = slice - b * p.heads;
        const auto keep = to_acc(static_cast<const Real*>(p.mask)[b * p.mask_stride[0] + h * p.mask_stride[1] +
                                                                  t * p.mask_stride[2] + s * p.mask_stride[3]]);
        if (keep == 0) return false;
    }
    return true;
}

// Dropout's factor for probability (slice, t, s): 1/(1 − p) kept, 0 dropped (ops/dropout_mask.h, as the CPU).
template <typename Real>
__device__ __forceinline__ Real dropout_factor(const Params& p, std::int64_t slice, std::int64_t t, std::int64_t s) {
    if (p.dropout_p == 0.0) return Real(1);
    const auto index = static_cast<std::uint64_t>((slice * p.queries + t) * p.keys + s);
    return math::dropout_keep(p.seed, index, p.dropout_p) ? static_cast<Real>(p.kept_factor) : Real(0);
}

template <int TILE> struct Layout {
    static constexpr int kThreads = 2 * TILE;
    static constexpr int kLine = TILE + 1;      // floats per line of a transposed operand
    static constexpr int kCols = TILE / 8;      // score columns per thread
    __device__ static int group() { return threadIdx.x / 8; }  // the thread's rows: 4·group() .. + 3
    __device__ static int lane() { return threadIdx.x % 8; }
    __device__ static int col(int j) { return 4 * lane() + (j % 4) + 32 * (j / 4); }  // j-th column it owns
};

// dst[d·kLine + r] = src row (row0 + r), element d, for r < TILE, d < DP; zero past `rows` rows or D columns.
template <typename Real, int TILE, int DP>
__device__ void load_transposed(Real* dst, const Real* __restrict__ src, std::int64_t row0, std::int64_t rows,
                                std::int64_t head_dim) {
    using L = Layout<TILE>;
    for (int idx = threadIdx.x; idx < TILE * DP; idx += L::kThreads) {
        const int r = idx / DP, d = idx % DP;
        dst[d * L::kLine + r] = (r < rows && d < head_dim) ? src[(row0 + r) * head_dim + d] : Real(0);
    }
}

// acc[i][j] += Σ_{c < n} a[c·kLine + 4·group + i] · b[c·kLine + col(j)]: scores of the thread's rows and columns.
template <typename Real, int TILE, int COLS>
__device__ __forceinline__ void multiply_rows_cols(Real (&acc)[4][COLS], const Real* a, const Real* b, int n) {
    using L = Layout<TILE>;
    const int row = 4 * L::group();
#pragma unroll 4
    for (int c = 0; c < n; ++c) {
        Real x[4], y[COLS];
#pragma unroll
        for (int i = 0; i < 4; ++i) x[i] = a[c * L::kLine + row + i];
#pragma unroll
        for (int j = 0; j < COLS; ++j) y[j] = b[c * L::kLine + L::col(j)];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < COLS; ++j) acc[i][j] = fma(x[i], y[j], acc[i][j]);
    }
}

// acc[i][j] += Σ_{c < TILE} w[c·kLine + 4·group + i] · v[col(j)·kLine + c]: a (rows × TILE) weight tile in
// shared memory ([c][row]) times a transposed operand ([d][c]) into the thread's head-dim columns.
template <typename Real, int TILE, int DCOLS>
__device__ __forceinline__ void multiply_weights(Real (&acc)[4][DCOLS], const Real* w, const Real* v) {
    using L = Layout<TILE>;
    const int row = 4 * L::group();
#pragma unroll 4
    for (int c = 0; c < TILE; ++c) {
        Real x[4], y[DCOLS];
#pragma unroll
        for (int i = 0; i < 4; ++i) x[i] = w[c * L::kLine + row + i];
#pragma unroll
        for (int j = 0; j < DCOLS; ++j) y[j] = v[L::col(j) * L::kLine + c];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < DCOLS; ++j) acc[i][j] = fma(x[i], y[j], acc[i][j]);
    }
}

// Reductions over the 8 lanes of a row group (adjacent lanes of one warp).
template <typename Real> __device__ __forceinline__ Real group_max(Real v) {
#pragma unroll
    for (int offset = 1; offset < 8; offset *= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
template <typename Real> __device__ __forceinline__ Real group_sum(Real v) {
#pragma unroll
    for (int offset = 1; offset < 8; offset *= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Which tile of `tiles` and which slice block `blockIdx.x` works on; with `reverse`, the last tiles first (causal:
// they have the most work, so they start first).
struct TileOf {
    std::int64_t tile, slice;
};
__device__ __forceinline__ TileOf tile_of_block(std::int64_t tiles, bool reverse) {
    const std::int64_t x = blockIdx.x;
    const std::int64_t slice = x / tiles;
    const std::int64_t t = x - slice * tiles;
    return {reverse ? tiles - 1 - t : t, slice};
}

// ---- forward ----
// q (B,H,T,D), k, v (B,H,S,D) -> y (B,H,T,D), lse (B,H,T) (−inf for a query with no key; its y is 0).
template <typename Real, int TILE, int DP>
__global__ void __launch_bounds__(2 * TILE) attention_forward_kernel(const Real* __restrict__ q,
                                                                     const Real* __restrict__ k,
                                                                     const Real* __restrict__ v,
                                                                     Real* __restrict__ y, Real* __restrict__ lse,
                                                                     Params p) {
    using L = Layout<TILE>;
    constexpr int kCols = L::kCols, kDCols = DP / 8;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    Real* qt = reinterpret_cast<Real*>(shared_bytes);  // [DP][kLine]
    Real* kt = qt + DP * L::kLine;                      // [DP][kLine]
    Real* vt = kt + DP * L::kLine;                      // [DP][kLine]
    Real* pt = vt + DP * L::kLine;                      // [TILE keys][kLine]: dropped-out probabilities

    const std::int64_t tiles = (p.queries + TILE - 1) / TILE;
    const TileOf at = tile_of_block(tiles, p.causal);
    const std::int64_t slice = at.slice, row0 = at.tile * TILE;
    const std::int64_t D = p.head_dim;
    const Real scale = scale_of<Real>(p);
    const int row = 4 * L::group();

    load_transposed<Real, TILE, DP>(qt, q + slice * p.queries * D, row0, p.queries - row0, D);
    Real m[4], l[4], acc[4][kDCols];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = minus_infinity<Real>();
        l[i] = Real(0);
#pragma unroll
        for (int j = 0; j < kDCols; ++j) acc[i][j] = Real(0);
    }
    // Causal: keys beyond the block's last query take no part.
    const std::int64_t key_end = p.causal ? std::min<std::int64_t>(p.keys, row0 + TILE) : p.keys;
    for (std::int64_t n0 = 0; n0 < key_end; n0 += TILE) {
        __syncthreads();  // the previous tile's readers of kt, vt, pt are done
        load_transposed<Real, TILE, DP>(kt, k + slice * p.keys * D, n0, p.keys - n0, D);
        load_transposed<Real, TILE, DP>(vt, v + slice * p.keys * D, n0, p.keys - n0, D);
        __syncthreads();
        Real s[4][kCols];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < kCols; ++j) s[i][j] = Real(0);
        multiply_rows_cols<Real, TILE, kCols>(s, qt, kt, DP);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const std::int64_t t = row0 + row + i;
            Real top = minus_infinity<Real>();
#pragma unroll
            for (int j = 0; j < kCols; ++j) {
                s[i][j] = takes_part<Real>(p, slice, t, n0 + L::col(j)) ? s[i][j] * scale : minus_infinity<Real>();
                top = max(top, s[i][j]);
            }
            const Real m_new = max(m[i], group_max(top));
            // No key of this row so far: keep everything at 0 (exp(−inf − 0) = 0), never exp(−inf + inf).
            const Real base = m_new == minus_infinity<Real>() ? Real(0) : m_new;
            const Real alpha = exp_of(m[i] - base);
            Real sum = Real(0);
#pragma unroll
            for (int j = 0; j < kCols; ++j) {
                const Real prob = exp_of(s[i][j] - base);
                sum += prob;
                pt[L::col(j) * L::kLine + row + i] = prob * dropout_factor<Real>(p, slice, t, n0 + L::col(j));
            }
            l[i] = l[i] * alpha + group_sum(sum);
            m[i] = m_new;
#pragma unroll
            for (int j = 0; j < kDCols; ++j) acc[i][j] *= alpha;
        }
        __syncthreads();
        multiply_weights<Real, TILE, kDCols>(acc, pt, vt);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const std::int64_t t = row0 + row + i;
        if (t >= p.queries) continue;
        const bool empty = l[i] == Real(0);
        const Real inverse = empty ? Real(0) : Real(1) / l[i];
        Real* out = y + (slice * p.queries + t) * D;
#pragma unroll
        for (int j = 0; j < kDCols; ++j)
            if (L::col(j) < D) out[L::col(j)] = acc[i][j] * inverse;
        if (L::lane() == 0) lse[slice * p.queries + t] = empty ? minus_infinity<Real>() : m[i] + log_of(l[i]);
    }
}

// ---- backward ----
// delta (B·H·T) = rowsum(dy ∘ y): one warp per row.
// bf16/f16: products and sums in f32, delta in f32 (the rounded y and dy, read exactly).
template <typename Real>
__global__ void attention_delta_kernel(const Real* __restrict__ dy, const Real* __restrict__ y,
                                       acc_t<Real>* __restrict__ delta, std::int64_t rows, std::int64_t head_dim) {
    const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32; r < rows;
         r += warps) {
        acc_t<Real> sum = 0;
        for (std::int64_t d = lane; d < head_dim; d += 32)
            sum += to_acc(dy[r * head_dim + d]) * to_acc(y[r * head_dim + d]);
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (lane == 0) delta[r] = sum;
    }
}

// One block per key tile: dk, dv (B,H,S,D) for its keys, over every query tile that sees them. The thread's rows
// are keys; its score columns queries (the transposed scores Sᵀ = k·qᵀ).
template <typename Real, int TILE, int DP>
__global__ void __launch_bounds__(2 * TILE) attention_backward_kv_kernel(
    const Real* __restrict__ q, const Real* __restrict__ k, const Real* __restrict__ v,
    const Real* __restrict__ dy, const Real* __restrict__ lse, const Real* __restrict__ delta,
    Real* __restrict__ dk, Real* __restrict__ dv, Params p) {
    using L = Layout<TILE>;
    constexpr int kCols = L::kCols, kDCols = DP / 8;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    Real* kt = reinterpret_cast<Real*>(shared_bytes);  // [DP][kLine] (keys)
    Real* vt = kt + DP * L::kLine;                      // [DP][kLine] (keys)
    Real* qt = vt + DP * L::kLine;                      // [DP][kLine] (queries)
    Real* dyt = qt + DP * L::kLine;                     // [DP][kLine] (queries)
    Real* pf = dyt + DP * L::kLine;                     // [TILE queries][kLine]: P∘F, keys along a line
    Real* ds = pf + TILE * L::kLine;                    // [TILE queries][kLine]: dS
    Real* lse_tile = ds + TILE * L::kLine;              // [TILE]
    Real* delta_tile = lse_tile + TILE;                 // [TILE]

    const std::int64_t tiles = (p.keys + TILE - 1) / TILE;
    const TileOf at = tile_of_block(tiles, false);
    const std::int64_t slice = at.slice, n0 = at.tile * TILE;
    const std::int64_t D = p.head_dim;
    const Real scale = scale_of<Real>(p);
    const int row = 4 * L::group();

    load_transposed<Real, TILE, DP>(kt, k + slice * p.keys * D, n0, p.keys - n0, D);
    load_transposed<Real, TILE, DP>(vt, v + slice * p.keys * D, n0, p.keys - n0, D);
    Real dk_acc[4][kDCols], dv_acc[4][kDCols];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < kDCols; ++j) dk_acc[i][j] = dv_acc[i][j] = Real(0);
    // Causal: queries before the tile's first key see none of its keys.
    const std::int64_t query_begin = p.causal ? (n0 / TILE) * TILE : 0;
    for (std::int64_t m0 = query_begin; m0 < p.queries; m0 += TILE) {
        __syncthreads();  // the previous tile's readers of qt, dyt, pf, ds are done
        load_transposed<Real, TILE, DP>(qt, q + slice * p.queries * D, m0, p.queries - m0, D);
        load_transposed<Real, TILE, DP>(dyt, dy + slice * p.queries * D, m0, p.queries - m0, D);
        for (int r = threadIdx.x; r < TILE; r += L::kThreads) {
            const bool inside = m0 + r < p.queries;
            lse_tile[r] = inside ? lse[slice * p.queries + m0 + r] : minus_infinity<Real>();
            delta_tile[r] = inside ? delta[slice * p.queries + m0 + r] : Real(0);
        }
        __syncthreads();
        Real s[4][kCols], dp[4][kCols];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < kCols; ++j) s[i][j] = dp[i][j] = Real(0);
        multiply_rows_cols<Real, TILE, kCols>(s, kt, qt, DP);
        multiply_rows_cols<Real, TILE, kCols>(dp, vt, dyt, DP);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const std::int64_t key = n0 + row + i;
#pragma unroll
            for (int j = 0; j < kCols; ++j) {
                const int c = L::col(j);
                const std::int64_t t = m0 + c;
                const bool part = takes_part<Real>(p, slice, t, key) && lse_tile[c] != minus_infinity<Real>();
                const Real prob = part ? exp_of(s[i][j] * scale - lse_tile[c]) : Real(0);
                const Real factor = part ? dropout_factor<Real>(p, slice, t, key) : Real(0);
                pf[c * L::kLine + row + i] = prob * factor;
                ds[c * L::kLine + row + i] = prob * (dp[i][j] * factor - delta_tile[c]);
            }
        }
        __syncthreads();
        multiply_weights<Real, TILE, kDCols>(dv_acc, pf, dyt);
        multiply_weights<Real, TILE, kDCols>(dk_acc, ds, qt);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const std::int64_t key = n0 + row + i;
        if (key >= p.keys) continue;
        Real* dk_row = dk + (slice * p.keys + key) * D;
        Real* dv_row = dv + (slice * p.keys + key) * D;
#pragma unroll
        for (int j = 0; j < kDCols; ++j)
            if (L::col(j) < D) {
                dk_row[L::col(j)] = dk_acc[i][j] * scale;
                dv_row[L::col(j)] = dv_acc[i][j];
            }
    }
}

// One block per query tile: dq (B,H,T,D) for its queries, over every key tile they see.
template <typename Real, int TILE, int DP>
__global__ void __launch_bounds__(2 * TILE) attention_backward_q_kernel(
    const Real* __restrict__ q, const Real* __restrict__ k, const Real* __restrict__ v,
    const Real* __restrict__ dy, const Real* __restrict__ lse, const Real* __restrict__ delta,
    Real* __restrict__ dq, Params p) {
    using L = Layout<TILE>;
    constexpr int kCols = L::kCols, kDCols = DP / 8;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    Real* qt = reinterpret_cast<Real*>(shared_bytes);  // [DP][kLine] (queries)
    Real* dyt = qt + DP * L::kLine;                     // [DP][kLine] (queries)
    Real* kt = dyt + DP * L::kLine;                     // [DP][kLine] (keys)
    Real* vt = kt + DP * L::kLine;                      // [DP][kLine] (keys)
    Real* ds = vt + DP * L::kLine;                      // [TILE keys][kLine]: dS, queries along a line

    const std::int64_t tiles = (p.queries + TILE - 1) / TILE;
    const TileOf at = tile_of_block(tiles, p.causal);
    const std::int64_t slice = at.slice, m0 = at.tile * TILE;
    const std::int64_t D = p.head_dim;
    const Real scale = scale_of<Real>(p);
    const int row = 4 * L::group();

    load_transposed<Real, TILE, DP>(qt, q + slice * p.queries * D, m0, p.queries - m0, D);
    load_transposed<Real, TILE, DP>(dyt, dy + slice * p.queries * D, m0, p.queries - m0, D);
    Real row_lse[4], row_delta[4], dq_acc[4][kDCols];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const std::int64_t t = m0 + row + i;
        row_lse[i] = t < p.queries ? lse[slice * p.queries + t] : minus_infinity<Real>();
        row_delta[i] = t < p.queries ? delta[slice * p.queries + t] : Real(0);
#pragma unroll
        for (int j = 0; j < kDCols; ++j) dq_acc[i][j] = Real(0);
    }
    const std::int64_t key_end = p.causal ? std::min<std::int64_t>(p.keys, m0 + TILE) : p.keys;
    for (std::int64_t n0 = 0; n0 < key_end; n0 += TILE) {
        __syncthreads();  // the previous tile's readers of kt, vt, ds are done
        load_transposed<Real, TILE, DP>(kt, k + slice * p.keys * D, n0, p.keys - n0, D);
        load_transposed<Real, TILE, DP>(vt, v + slice * p.keys * D, n0, p.keys - n0, D);
        __syncthreads();
        Real s[4][kCols], dp[4][kCols];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < kCols; ++j) s[i][j] = dp[i][j] = Real(0);
        multiply_rows_cols<Real, TILE, kCols>(s, qt, kt, DP);
        multiply_rows_cols<Real, TILE, kCols>(dp, dyt, vt, DP);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const std::int64_t t = m0 + row + i;
#pragma unroll
            for (int j = 0; j < kCols; ++j) {
                const int c = L::col(j);
                const std::int64_t key = n0 + c;
                const bool part = takes_part<Real>(p, slice, t, key) && row_lse[i] != minus_infinity<Real>();
                const Real prob = part ? exp_of(s[i][j] * scale - row_lse[i]) : Real(0);
                const Real factor = part ? dropout_factor<Real>(p, slice, t, key) : Real(0);
                ds[c * L::kLine + row + i] = prob * (dp[i][j] * factor - row_delta[i]);
            }
        }
        __syncthreads();
        multiply_weights<Real, TILE, kDCols>(dq_acc, ds, kt);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const std::int64_t t = m0 + row + i;
        if (t >= p.queries) continue;
        Real* dq_row = dq + (slice * p.queries + t) * D;
#pragma unroll
        for (int j = 0; j < kDCols; ++j)
            if (L::col(j) < D) dq_row[L::col(j)] = dq_acc[i][j] * scale;
    }
}

// The tensor-core kernels (namespace mma) need compute capability 8.0 (mma.sync on TF32 and bf16, cp.async,
// ldmatrix); compiled for an older architecture they are empty, and the host never launches them there.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define DG_ATTENTION_TENSOR_CORES 1
#else
#define DG_ATTENTION_TENSOR_CORES 0
#endif

// ---- mma.sync path (float32 in 3xTF32, bfloat16 and float16; compute capability 8.0 and newer) ----
// One kernel set templated on the element type E, FlashAttention-2 style: every score tile and accumulator lives in
// registers as m16n8 C fragments, the online softmax runs there (a row's 8 columns of a fragment tile sit in the 4
// lanes of a quad: reductions are two __shfl_xor), and P (or dS) feeds the next product straight from those
// registers. Operand tiles stream through shared memory by cp.async (16-byte copies when rows are 16-byte aligned).
// Arithmetic: E = float runs mma.m16n8k8 TF32 in 3xTF32 (each operand x = big + small, both TF32; acc += small·big
// + big·small + big·big, ~float32 accuracy); E = __nv_bfloat16 / __half runs mma.m16n8k16 with f32 accumulators,
// P and dS rounded to E only where they feed a product. Softmax, masks, dropout, lse and delta stay f32.
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k8 / mma.m16n8k16"), with g = lane / 4, c = lane % 4:
//   C (16×8, f32):  c0, c1 = (row g, cols 2c, 2c + 1); c2, c3 = (row g + 8, same cols).
//   A 16-bit (16×16): a0 = (g, 2c..2c+1), a1 = (g + 8, 2c..), a2 = (g, 2c + 8..), a3 = (g + 8, 2c + 8..).
//   B 16-bit (16×8):  b0 = (k 2c..2c+1, n g), b1 = (k 2c + 8.., n g).
//   A tf32 (16×8):  a0 = (g, c), a1 = (g + 8, c), a2 = (g, c + 4), a3 = (g + 8, c + 4).  B tf32 (8×8): b0 = (k c, n g),
//   b1 = (k c + 4, n g).
// C → A (P·V and the gradient products): 16-bit: two adjacent n8 C tiles form one k16 A fragment (a0 = pack(c0, c1)
// of the first, a1 = pack(c2, c3), a2, a3 likewise of the second). TF32: the C columns 2c, 2c + 1 of a lane are not
// A's columns c, c + 4, so the k index of those products is permuted instead: A position c holds key 2c and position
// c + 4 key 2c + 1 (a = c0, c2, c1, c3), and the B fragment reads its rows in the same order (b0 = row 2c, b1 = row
// 2c + 1); a sum over k does not depend on its order, and no value moves between lanes.
// Tiles: warps each owning 16 rows of the block's rows: 64 rows, 4 warps for the dq kernel (queries), the dk/dv
// kernel (keys) and the f32 forward; 128 rows, 8 warps for the 16-bit forward (kForwardWarps). Shared-memory lines: DP + 4 floats (f32) or DP + 8 elements (16-bit): a 4-bank offset per
// line keeps every fragment load of a warp on 32 distinct banks (and 16-byte aligned for cp.async / ldmatrix).
namespace mma {

constexpr int kTile = 64, kWarps = 4, kThreads = 32 * kWarps, kWarpRows = 16;

template <typename E> inline constexpr bool kTf32 = std::is_same_v<E, float>;
template <typename E> inline constexpr int kStep = kTf32<E> ? 8 : 16;  // the MMA's k
template <typename E, int DP> constexpr int line() { return kTf32<E> ? DP + 4 : DP + 8; }
// Rows of the tiles the backward kernels stream (queries for dk/dv, keys for dq): 32 at DP 128 keeps the two
// streamed operands, the two resident ones and the score registers (2 × 16 per thread) within budget.
template <int DP> constexpr int stream_rows() { return DP == 128 ? 32 : 64; }
template <typename E, int DP> constexpr std::size_t tile_bytes(int rows) {
    return sizeof(E) * static_cast<std::size_t>(rows) * line<E, DP>();
}
// Whether the forward holds its Q fragments in registers (through the K tile) or reads them from a Q tile of their
// own: at DP 128 in f32, Q's 64 registers per thread on top of O's 64 and S's 32 would spill.
template <typename E, int DP> inline constexpr bool kQInRegisters = !(kTf32<E> && DP == 128);
// Warps of a forward block (16 query rows each). 16-bit: 8, so every K/V tile copied serves 128 queries (their
// copies would otherwise weigh against the 16-bit MMAs); f32: 4 (64 queries), where 3xTF32's products dominate and
// Q at DP 128 needs a tile of its own.
template <typename E> inline constexpr int kForwardWarps = kTf32<E> ? 4 : 8;
template <typename E> inline constexpr int kForwardRows = 16 * kForwardWarps<E>;
static_assert(kForwardRows<float> == kTile, "mma: the f32 forward's Q tile is one K tile");
static_assert(kForwardRows<__nv_bfloat16> <= 2 * kTile, "mma: Q passes through the K and V tiles");
// Forward: one K and one V tile (and a Q tile where Q is not held in registers).
template <typename E, int DP> constexpr std::size_t forward_shared() {
    return (kQInRegisters<E, DP> ? 2 : 3) * tile_bytes<E, DP>(kTile);
}
// dk/dv: K, V of the block (64 keys), Q, dY of a streamed query tile, and its lse and delta.
template <typename E, int DP> constexpr std::size_t backward_kv_stage_bytes() {
    return 2 * tile_bytes<E, DP>(stream_rows<DP>()) + 2 * sizeof(float) * stream_rows<DP>();
}
// dq: Q, dY of the block (64 queries), K, V of a streamed key tile.
template <typename E, int DP> constexpr std::size_t backward_q_stage_bytes() {
    return 2 * tile_bytes<E, DP>(stream_rows<DP>());
}
// The backward kernels double-buffer their streamed tiles (copying tile i + 1 while computing tile i) where two
// stages stay under 100 KiB of shared memory per block (bf16/f16 at every DP, f32 at DP 32); one stage elsewhere,
// where 3xTF32's products take long enough for the other block on the SM to hide the copies.
template <typename E, int DP> constexpr int backward_stages() {
    return 2 * tile_bytes<E, DP>(kTile) + 2 * std::max(backward_kv_stage_bytes<E, DP>(), backward_q_stage_bytes<E, DP>()) <
                   100 * 1024
               ? 2
               : 1;
}
template <typename E, int DP> constexpr std::size_t backward_kv_shared() {
    return 2 * tile_bytes<E, DP>(kTile) + backward_stages<E, DP>() * backward_kv_stage_bytes<E, DP>();
}
template <typename E, int DP> constexpr std::size_t backward_q_shared() {
    return 2 * tile_bytes<E, DP>(kTile) + backward_stages<E, DP>() * backward_q_stage_bytes<E, DP>();
}
static_assert(backward_kv_shared<float, 128>() < 100 * 1024 && backward_q_shared<float, 128>() < 100 * 1024 &&
                  forward_shared<float, 128>() < 100 * 1024,
              "mma: the f32 DP 128 kernels must stay under 100 KiB of shared memory");
// The fused f32 backward (dk, dv and dq in one kernel, non-deterministic mode) adds one dS tile: the streamed
// queries × the block's 64 keys, f32, lines of 64 + 4 floats (conflict-free fragment loads, as line<float, DP>).
constexpr int kDsLine = kTile + 4;
template <int DP> constexpr std::size_t fused_ds_bytes() {
    return sizeof(float) * static_cast<std::size_t>(stream_rows<DP>()) * kDsLine;
}
template <int DP> constexpr std::size_t backward_fused_shared() {
    return backward_kv_shared<float, DP>() + fused_ds_bytes<DP>();
}
// Two blocks per SM on sm_90 (228 KiB, 1 KiB reserved per block): at most 113 KiB each.
static_assert(backward_fused_shared<32>() <= 113 * 1024 && backward_fused_shared<64>() <= 113 * 1024 &&
                  backward_fused_shared<128>() <= 113 * 1024,
              "mma: the fused f32 backward must leave room for two blocks per SM");

#if DG_ATTENTION_TENSOR_CORES
__device__ __forceinline__ unsigned shared_address(const void* pointer) {
    return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's most recent copy groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(address)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(address)));
}

// The operands of one MMA as the arithmetic wants them: 16-bit, the packed pairs as loaded; TF32, the split
// x = big + small of every element (raw float bits on load).
template <typename E> struct FragA {
    std::uint32_t x[4];
};
template <> struct FragA<float> {
    std::uint32_t big[4], small[4];
};
template <typename E> struct FragB {
    std::uint32_t x[2];
};
template <> struct FragB<float> {
    std::uint32_t big[2], small[2];
};

// x = big + small as the TF32 MMA reads them (it ignores the low 13 mantissa bits of an operand, i.e. truncates):
// big is x rounded to TF32 (to nearest, ties away: cvt.rna's value for finite x) by adding half a TF32 unit to the
// bits and clearing the low 13; x − big is exact in float32, and the MMA truncates it (as CUTLASS's 3xTF32 "fast
// f32" does its small part): ~21 of x's 24 bits, the error of the omitted small·small term's order. Three integer
// and float instructions where cvt.rna.tf32.f32, which sm_90 emulates with an inf/NaN test and a select, took about
// seven per element (two conversions) — on every operand element of every product, the backward's largest
// instruction count. inf: big = inf (the carry stays in the cleared bits), small = NaN, as with cvt.rna; NaN (any
// bits; big may wrap to ±0): small is NaN, so every product with it is NaN.
__device__ __forceinline__ void split_tf32(std::uint32_t raw, std::uint32_t& big, std::uint32_t& small) {
    big = (raw + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(__uint_as_float(raw) - __uint_as_float(big));
}

template <typename E> __device__ __forceinline__ FragA<E> make_a(const std::uint32_t (&raw)[4]) {
    FragA<E> a;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (kTf32<E>)
            split_tf32(raw[i], a.big[i], a.small[i]);
        else
            a.x[i] = raw[i];
    }
    return a;
}
template <typename E> __device__ __forceinline__ FragB<E> make_b(std::uint32_t raw0, std::uint32_t raw1) {
    FragB<E> b;
    if constexpr (kTf32<E>) {
        split_tf32(raw0, b.big[0], b.small[0]);
        split_tf32(raw1, b.big[1], b.small[1]);
    } else {
        b.x[0] = raw0;
        b.x[1] = raw1;
    }
    return b;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a · b (16 × 8 += 16 × k · k × 8).
template <typename E> __device__ __forceinline__ void mma(float (&d)[4], const FragA<E>& a, const FragB<E>& b) {
    if constexpr (kTf32<E>) {
        // The small terms first: they reach the accumulator before the large one.
        mma_tf32(d, a.small, b.big);
        mma_tf32(d, a.big, b.small);
        mma_tf32(d, a.big, b.big);
    } else if constexpr (std::is_same_v<E, __nv_bfloat16>) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
    } else {
        static_assert(std::is_same_v<E, __half>, "mma: float, __nv_bfloat16 or __half");
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
    }
}

// The softmax's exponentials, in base 2 for every E: scores scaled by scale·log2(e), one multiply-add and the
// hardware exp2 per score, where expf's range reduction costs about twice the instructions (float32 used it until the
// 3xTF32 products got cheaper, and the exponentials became a tenth of the forward's instructions). The argument
// carries one rounding either way (s·scale − lse in natural units, or the fused multiply-add in base-2 units): the
// same relative error of the probabilities, ~|argument|·2⁻²⁴.
template <typename E> inline constexpr float kExpUnit = 1.4426950408889634f;  // base-2 units per natural unit
template <typename E> __device__ __forceinline__ float exp_in_units(float x) { return exp2f(x); }

// Two f32 values rounded to E and packed, the first in the low half (the lower column index).
template <typename E> __device__ __forceinline__ std::uint32_t pack_pair(float first, float second) {
    if constexpr (std::is_same_v<E, __nv_bfloat16>) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
        return *reinterpret_cast<const std::uint32_t*>(&pair);
    } else {
        const __half2 pair = __floats2half2_rn(first, second);
        return *reinterpret_cast<const std::uint32_t*>(&pair);
    }
}

// A fragment (16 rows × kStep) of a row-major shared tile: rows row0 .. row0 + 15, columns k0 .. k0 + kStep − 1.
template <typename E>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const E* tile, int line, int row0, int k0) {
    const int lane = threadIdx.x % 32;
    if constexpr (kTf32<E>) {
        const float* at = tile + (row0 + lane / 4) * line + k0 + lane % 4;
        a[0] = __float_as_uint(at[0]);
        a[1] = __float_as_uint(at[8 * line]);
        a[2] = __float_as_uint(at[4]);
        a[3] = __float_as_uint(at[8 * line + 4]);
    } else {
        // Matrix i = lane / 8 of the four: rows + 8·(i % 2), columns + 8·(i / 2) (a0 .. a3 in order).
        const int i = lane / 8, r = lane % 8;
        ldmatrix_x4(a, tile + (row0 + r + 8 * (i % 2)) * line + k0 + 8 * (i / 2));
    }
}

// B fragments of the n tiles n0 .. n0 + 7 and n0 + 8 .. n0 + 15 for B[k][n] = tile[n0 + n][k0 + k] (a row-major
// tile read transposed: Kᵀ in Q·Kᵀ, Qᵀ, dYᵀ, Vᵀ).
template <typename E>
__device__ __forceinline__ void load_b_transposed(FragB<E> (&b)[2], const E* tile, int line, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    if constexpr (kTf32<E>) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const float* at = tile + (n0 + 8 * j + lane / 4) * line + k0 + lane % 4;
            b[j] = make_b<E>(__float_as_uint(at[0]), __float_as_uint(at[4]));
        }
    } else {
        // Matrix i: rows (n) + 8·(i / 2), columns (k) + 8·(i % 2): b0, b1 of the first n tile, then of the second.
        const int i = lane / 8, r = lane % 8;
        std::uint32_t x[4];
        ldmatrix_x4(x, tile + (n0 + r + 8 * (i / 2)) * line + k0 + 8 * (i % 2));
        b[0] = make_b<E>(x[0], x[1]);
        b[1] = make_b<E>(x[2], x[3]);
    }
}

// B fragments of the n tiles n0 .. n0 + 7 and n0 + 8 .. n0 + 15 for B[k][n] = tile[k0 + k][n0 + n] (a row-major
// tile as it stands: V in P·V, dY, Q, K in the gradient products). TF32: rows in the permuted k order of a_from_c.
template <typename E>
__device__ __forceinline__ void load_b(FragB<E> (&b)[2], const E* tile, int line, int k0, int n0) {
    const int lane = threadIdx.x % 32;
    if constexpr (kTf32<E>) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const float* at = tile + (k0 + 2 * (lane % 4)) * line + n0 + 8 * j + lane / 4;
            b[j] = make_b<E>(__float_as_uint(at[0]), __float_as_uint(at[line]));
        }
    } else {
        // Matrix i: rows (k) + 8·(i % 2), columns (n) + 8·(i / 2), transposed on load.
        const int i = lane / 8, r = lane % 8;
        std::uint32_t x[4];
        ldmatrix_x4_trans(x, tile + (k0 + r + 8 * (i % 2)) * line + n0 + 8 * (i / 2));
        b[0] = make_b<E>(x[0], x[1]);
        b[1] = make_b<E>(x[2], x[3]);
    }
}

// The A fragment of k step `step` from C fragments c (16 × 8·NT, f32): 16-bit, tiles 2·step and 2·step + 1 rounded
// to E; TF32, tile `step` in the permuted k order (see the top of this namespace).
template <typename E, int NT>
__device__ __forceinline__ FragA<E> a_from_c(const float (&c)[NT][4], int step) {
    std::uint32_t raw[4];
    if constexpr (kTf32<E>) {
        raw[0] = __float_as_uint(c[step][0]);
        raw[1] = __float_as_uint(c[step][2]);
        raw[2] = __float_as_uint(c[step][1]);
        raw[3] = __float_as_uint(c[step][3]);
    } else {
        raw[0] = pack_pair<E>(c[2 * step][0], c[2 * step][1]);
        raw[1] = pack_pair<E>(c[2 * step][2], c[2 * step][3]);
        raw[2] = pack_pair<E>(c[2 * step + 1][0], c[2 * step + 1][1]);
        raw[3] = pack_pair<E>(c[2 * step + 1][2], c[2 * step + 1][3]);
    }
    return make_a<E>(raw);
}

// acc (16 × 8·NT) += A (16 × DP, fragments from a_of(step)) · B, B[k][n] = tile[n][k] (load_b_transposed).
template <typename E, int DP, int NT, typename AOf>
__device__ __forceinline__ void multiply_transposed(float (&acc)[NT][4], AOf&& a_of, const E* tile, int line) {
#pragma unroll
    for (int step = 0; step < DP / kStep<E>; ++step) {
        const FragA<E> a = a_of(step);
#pragma unroll
        for (int pair = 0; pair < NT / 2; ++pair) {
            FragB<E> b[2];
            load_b_transposed<E>(b, tile, line, 16 * pair, step * kStep<E>);
            mma<E>(acc[2 * pair], a, b[0]);
            mma<E>(acc[2 * pair + 1], a, b[1]);
        }
    }
}

// acc (16 × 8·NT) += A · B, A the warp's 16 rows (from wrow) of a shared tile, B[k][n] = b_tile[n][k].
template <typename E, int DP, int NT>
__device__ __forceinline__ void multiply_tiles_transposed(float (&acc)[NT][4], const E* a_tile, int wrow,
                                                          const E* b_tile, int line) {
    multiply_transposed<E, DP, NT>(
        acc,
        [&](int step) {
            std::uint32_t raw[4];
            load_a<E>(raw, a_tile, line, wrow, step * kStep<E>);
            return make_a<E>(raw);
        },
        b_tile, line);
}

// acc (16 × DP) += C (16 × 8·NT in registers) · tile (8·NT rows × DP).
template <typename E, int DP, int NT>
__device__ __forceinline__ void multiply_from_c(float (&acc)[DP / 8][4], const float (&c)[NT][4], const E* tile,
                                                int line) {
#pragma unroll
    for (int step = 0; step < NT * 8 / kStep<E>; ++step) {
        const FragA<E> a = a_from_c<E, NT>(c, step);
#pragma unroll
        for (int pair = 0; pair < DP / 16; ++pair) {
            FragB<E> b[2];
            load_b<E>(b, tile, line, step * kStep<E>, 16 * pair);
            mma<E>(acc[2 * pair], a, b[0]);
            mma<E>(acc[2 * pair + 1], a, b[1]);
        }
    }
}

// dst[r·line + d] = src[(row0 + r)·D + d] for r < kRows, d < DP; zero past `rows` rows and D columns. cp.async
// 16-byte copies when every row starts 16-byte aligned and D·sizeof(E) % 16 == 0 (vector_rows; the caller commits
// and waits), plain loads otherwise.
template <typename E, int DP, int kRows, int kBlockThreads = kThreads>
__device__ __forceinline__ void load_tile(E* dst, const E* __restrict__ src, std::int64_t row0, std::int64_t rows,
                                          std::int64_t D, bool vector_rows) {
    constexpr int kLine = line<E, DP>();
    if (vector_rows) {
        constexpr int kPerCopy = 16 / static_cast<int>(sizeof(E)), kCopies = DP / kPerCopy;
        for (int idx = threadIdx.x; idx < kRows * kCopies; idx += kBlockThreads) {
            const int r = idx / kCopies, d = kPerCopy * (idx % kCopies);
            E* to = dst + r * kLine + d;
            if (r < rows && d < D)
                cp_async_16(to, src + (row0 + r) * D + d);
            else
                *reinterpret_cast<uint4*>(to) = make_uint4(0u, 0u, 0u, 0u);  // all-zero bits: +0 in every E
        }
    } else {
        const E zero_value = from_acc<E>(0.0f);
        for (int idx = threadIdx.x; idx < kRows * DP; idx += kBlockThreads) {
            const int r = idx / DP, d = idx % DP;
            dst[r * kLine + d] = (r < rows && d < D) ? src[(row0 + r) * D + d] : zero_value;
        }
    }
}

// Runs body(stage, row0) for row0 = begin, begin + rows, ... below end, after copy(stage, row0) has brought that
// tile into shared stage `stage` and every thread's copies are in. Two stages: tile i + 1 is copied while the body
// runs on tile i (a stage is copied into only after the __syncthreads that ends its last body).
template <int kStages, typename Copy, typename Body>
__device__ __forceinline__ void stream_tiles(std::int64_t begin, std::int64_t end, int rows, Copy&& copy, Body&& body) {
    if (kStages == 2 && begin < end) {
        copy(0, begin);
        cp_async_commit();
    }
    int stage = 0;
    for (std::int64_t row0 = begin; row0 < end; row0 += rows, stage ^= kStages - 1) {
        if constexpr (kStages == 1)
            copy(0, row0);
        else if (row0 + rows < end)
            copy(stage ^ 1, row0 + rows);
        cp_async_commit();             // possibly empty: the wait counts groups
        cp_async_wait<kStages - 1>();  // this tile's copies are in (the next tile's may still be in flight)
        __syncthreads();
        body(stage, row0);
        __syncthreads();  // every warp is done with this stage: a later tile may copy into it
    }
}

// Calls put(half, row, d, c0, c1) for the value pairs of the warp's 16 × 8·NT C fragments: rows row0 + g (half 0)
// and row0 + g + 8 (half 1) below `rows`, c0 at column d = col0 + 8·tile + 2·(lane % 4), c1 at d + 1.
template <int NT, typename Put>
__device__ __forceinline__ void for_each_pair(const float (&acc)[NT][4], std::int64_t row0, int col0,
                                              std::int64_t rows, Put&& put) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const std::int64_t row = row0 + lane / 4 + 8 * half;
        if (row >= rows) continue;
#pragma unroll
        for (int tile = 0; tile < NT; ++tile)
            put(half, row, col0 + 8 * tile + 2 * (lane % 4), acc[tile][2 * half], acc[tile][2 * half + 1]);
    }
}

// Stores the warp's 16 × DP accumulator times `factor` as rows row0 + (g, g + 8) of a (rows, D) matrix, d < D.
template <typename E, int DP>
__device__ __forceinline__ void store_rows(E* __restrict__ dst, const float (&acc)[DP / 8][4], std::int64_t row0,
                                           std::int64_t rows, std::int64_t D, const float (&factor)[2]) {
    for_each_pair(acc, row0, 0, rows, [&](int half, std::int64_t row, int d, float c0, float c1) {
        E* out = dst + row * D;
        if (d < D) out[d] = from_acc<E>(c0 * factor[half]);
        if (d + 1 < D) out[d + 1] = from_acc<E>(c1 * factor[half]);
    });
}

__device__ __forceinline__ void red_add(float* at, float x) {
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(at), "f"(x) : "memory");
}

// Adds the warp's 16 × 8·NT accumulator times `factor` into rows row0 + (g, g + 8), columns col0 + .., of a
// (rows, D) f32 matrix, d < D, without a return value (red.global: the SM does not wait for the old values; float
// atomics, so the order of the additions depends on scheduling).
template <int NT>
__device__ __forceinline__ void add_rows(float* __restrict__ dst, const float (&acc)[NT][4], std::int64_t row0,
                                         int col0, std::int64_t rows, std::int64_t D, float factor) {
    // Even D: every pair (d, d + 1), d even, of a row of a 16-byte-aligned allocation is 8-byte aligned, and sm_90
    // adds it in one vector reduction.
    const bool even = D % 2 == 0;
    for_each_pair(acc, row0, col0, rows, [&](int, std::int64_t row, int d, float c0, float c1) {
        float* out = dst + row * D + d;
        const float x = c0 * factor, y = c1 * factor;
        if (d + 1 < D) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (even)
                asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(out), "f"(x), "f"(y) : "memory");
            else
#endif
            {
                red_add(out, x);
                red_add(out + 1, y);
            }
        } else if (d < D) {
            red_add(out, x);
        }
    });
}
#endif  // DG_ATTENTION_TENSOR_CORES

// Forward: y (E), lse (f32); kForwardRows<E> queries per block. The K and V tiles take turns: V_j is copied while
// S_j = Q·K_jᵀ and its softmax are computed, K_{j+1} while O += P_j·V_j is; Q is read once into registers (through
// the K and V tiles), or, where kQInRegisters is false, stays in a tile of its own.
template <typename E, int DP>
__global__ void __launch_bounds__(32 * kForwardWarps<E>) attention_forward_kernel(const E* __restrict__ q, const E* __restrict__ k,
                                                                     const E* __restrict__ v, E* __restrict__ y,
                                                                     float* __restrict__ lse, Params p) {
#if DG_ATTENTION_TENSOR_CORES
    constexpr int kLine = line<E, DP>(), kSteps = DP / kStep<E>, kKeyTiles = kTile / 8;
    constexpr int kRows = kForwardRows<E>, kBlockThreads = 32 * kForwardWarps<E>;
    extern __shared__ __align__(128) unsigned char mma_shared[];
    constexpr bool kQRegisters = kQInRegisters<E, DP>;
    E* ks = reinterpret_cast<E*>(mma_shared);  // [64][kLine]: K_j (and Q at first, with vs, where kQRegisters)
    E* vs = ks + kTile * kLine;                 // [64][kLine]: V_j
    E* qs = kQRegisters ? ks : vs + kTile * kLine;  // [kRows][kLine]: Q

    const std::int64_t tiles = (p.queries + kRows - 1) / kRows;
    const TileOf at = tile_of_block(tiles, p.causal);
    const std::int64_t slice = at.slice, row0 = at.tile * kRows;
    const std::int64_t D = p.head_dim;
    const float scale = p.scale_f * kExpUnit<E>;  // scores in exp_in_units' units: m and base are too
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wrow = warp * kWarpRows;
    const std::int64_t t_of[2] = {row0 + wrow + lane / 4, row0 + wrow + lane / 4 + 8};
    const E* k_slice = k + slice * p.keys * D;
    const E* v_slice = v + slice * p.keys * D;

    load_tile<E, DP, kRows, kBlockThreads>(qs, q + slice * p.queries * D, row0, p.queries - row0, D, p.vector_rows);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    std::uint32_t q_frag[kQRegisters ? kSteps : 1][4];
    if constexpr (kQRegisters) {
#pragma unroll
        for (int step = 0; step < kSteps; ++step) load_a<E>(q_frag[step], qs, kLine, wrow, step * kStep<E>);
        __syncthreads();  // every warp holds its Q: the tile takes K_0
    }

    const std::int64_t key_end = p.causal ? std::min<std::int64_t>(p.keys, row0 + kRows) : p.keys;
    load_tile<E, DP, kTile, kBlockThreads>(ks, k_slice, 0, p.keys, D, p.vector_rows);
    cp_async_commit();
    float o[DP / 8][4] = {};
    float m[2] = {minus_infinity<float>(), minus_infinity<float>()}, l[2] = {0.0f, 0.0f};
    for (std::int64_t n0 = 0; n0 < key_end; n0 += kTile) {
        load_tile<E, DP, kTile, kBlockThreads>(vs, v_slice, n0, p.keys - n0, D, p.vector_rows);
        cp_async_commit();
        cp_async_wait<1>();  // K_j is in (V_j may still be in flight)
        __syncthreads();
        float s[kKeyTiles][4] = {};
        if constexpr (kQRegisters)
            multiply_transposed<E, DP, kKeyTiles>(s, [&](int step) { return make_a<E>(q_frag[step]); }, ks, kLine);
        else
            multiply_tiles_transposed<E, DP, kKeyTiles>(s, qs, wrow, ks, kLine);
        __syncthreads();  // every warp is done with K_j
        if (n0 + kTile < key_end)
            load_tile<E, DP, kTile, kBlockThreads>(ks, k_slice, n0 + kTile, p.keys - n0 - kTile, D, p.vector_rows);
        cp_async_commit();  // possibly empty: the waits below count groups

        // Every key of the tile takes part in every row of the warp: no per-element test.
        const bool whole = !p.mask && n0 + kTile <= p.keys && (!p.causal || n0 + kTile - 1 <= row0 + wrow);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const std::int64_t t = t_of[half];
            float top = minus_infinity<float>();
#pragma unroll
            for (int tile = 0; tile < kKeyTiles; ++tile)
#pragma unroll
                for (int e = 2 * half; e < 2 * half + 2; ++e) {
                    const std::int64_t key = n0 + 8 * tile + 2 * (lane % 4) + (e & 1);
                    s[tile][e] = (whole || takes_part<E>(p, slice, t, key)) ? s[tile][e] * scale
                                                                              : minus_infinity<float>();
                    top = fmaxf(top, s[tile][e]);
                }
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
            const float m_new = fmaxf(m[half], top);
            // No key of this row so far: keep everything at 0 (exp(−inf − 0) = 0), never exp(−inf + inf).
            const float base = m_new == minus_infinity<float>() ? 0.0f : m_new;
            const float alpha = exp_in_units<E>(m[half] - base);
            float sum = 0.0f;
#pragma unroll
            for (int tile = 0; tile < kKeyTiles; ++tile)
#pragma unroll
                for (int e = 2 * half; e < 2 * half + 2; ++e) {
                    const float prob = exp_in_units<E>(s[tile][e] - base);
                    sum += prob;
                    const std::int64_t key = n0 + 8 * tile + 2 * (lane % 4) + (e & 1);
                    s[tile][e] = p.dropout_p == 0.0 ? prob : prob * dropout_factor<float>(p, slice, t, key);
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[half] = l[half] * alpha + sum;
            m[half] = m_new;
#pragma unroll
            for (int tile = 0; tile < DP / 8; ++tile) {
                o[tile][2 * half] *= alpha;
                o[tile][2 * half + 1] *= alpha;
            }
        }
        cp_async_wait<1>();  // V_j is in (K_{j+1} may still be in flight)
        __syncthreads();
        multiply_from_c<E, DP, kKeyTiles>(o, s, vs, kLine);
        __syncthreads();  // every warp is done with V_j
    }
    cp_async_wait<0>();
    float inverse[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const bool empty = l[half] == 0.0f;
        inverse[half] = empty ? 0.0f : 1.0f / l[half];
        if (lane % 4 == 0 && t_of[half] < p.queries)
            lse[slice * p.queries + t_of[half]] =
                empty ? minus_infinity<float>() : m[half] / kExpUnit<E> + logf(l[half]);
    }
    store_rows<E, DP>(y + slice * p.queries * D, o, row0 + wrow, p.queries, D, inverse);
#endif
}

// dk, dv for one key tile (the warp's rows are keys), over the query tiles that see it, streamed by
// stream_rows<DP>() queries: Sᵀ = K·Qᵀ and dPᵀ = V·dYᵀ in registers, then dV += (P∘F)ᵀ·dY and dK += dSᵀ·Q with
// A from those registers. dk, dv accumulate in registers to the end.
// kFuseDq (f32, non-deterministic mode): also dQ, the one-kernel backward (5 products instead of the two-kernel
// design's 7). The warps' dSᵀ fragments go to a shared dS tile [queries][keys]; after one __syncthreads every warp
// multiplies its share of dS·K (16 queries × DP / (4·16 / kRows) columns) and adds it into dq_accum (f32, zeroed by
// the caller) with red.global.add: each query's dq is the sum over the key blocks, in the order they finish.
template <typename E, int DP, bool kFuseDq = false>
__global__ void __launch_bounds__(kThreads) attention_backward_kv_kernel(
    const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, const E* __restrict__ dy,
    const float* __restrict__ lse, const float* __restrict__ delta, E* __restrict__ dk, E* __restrict__ dv,
    float* __restrict__ dq_accum, Params p) {
#if DG_ATTENTION_TENSOR_CORES
    static_assert(!kFuseDq || kTf32<E>, "mma: the fused backward is the f32 (3xTF32) kernel");
    constexpr int kLine = line<E, DP>(), kRows = stream_rows<DP>(), kQueryTiles = kRows / 8;
    constexpr int kStages = backward_stages<E, DP>();
    constexpr std::size_t kStageBytes = backward_kv_stage_bytes<E, DP>();
    extern __shared__ __align__(128) unsigned char mma_shared[];
    E* ks = reinterpret_cast<E*>(mma_shared);  // [64 keys][kLine]
    E* vs = ks + kTile * kLine;                 // [64 keys][kLine]
    unsigned char* stages = reinterpret_cast<unsigned char*>(vs + kTile * kLine);
    // kFuseDq: dS [kRows queries][kDsLine], the keys of each group of 8 in a_from_c's permuted order (key 2c at
    // position c, key 2c + 1 at c + 4), so that load_a's natural fragments pair with load_b's rows.
    float* ds_shared = reinterpret_cast<float*>(stages + kStages * kStageBytes);
    // Stage b: Q, dY [kRows queries][kLine] each, lse (in exp_in_units' units) and delta [kRows] each.
    const auto qs_of = [&](int b) { return reinterpret_cast<E*>(stages + b * kStageBytes); };
    const auto dys_of = [&](int b) { return qs_of(b) + kRows * kLine; };
    const auto lse_of = [&](int b) { return reinterpret_cast<float*>(dys_of(b) + kRows * kLine); };
    const auto delta_of = [&](int b) { return lse_of(b) + kRows; };

    const std::int64_t tiles = (p.keys + kTile - 1) / kTile;
    const TileOf at = tile_of_block(tiles, false);
    const std::int64_t slice = at.slice, n0 = at.tile * kTile;
    const std::int64_t D = p.head_dim;
    const float scale = p.scale_f;
    const float scale_units = scale * kExpUnit<E>;  // the scores, and lse below, in exp_in_units' units
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wrow = warp * kWarpRows;
    const std::int64_t key_of[2] = {n0 + wrow + lane / 4, n0 + wrow + lane / 4 + 8};
    const E* q_slice = q + slice * p.queries * D;
    const E* dy_slice = dy + slice * p.queries * D;

    load_tile<E, DP, kTile>(ks, k + slice * p.keys * D, n0, p.keys - n0, D, p.vector_rows);
    load_tile<E, DP, kTile>(vs, v + slice * p.keys * D, n0, p.keys - n0, D, p.vector_rows);
    cp_async_commit();
    float dk_acc[DP / 8][4] = {}, dv_acc[DP / 8][4] = {};
    // Copies query tile m0 into stage b (the caller commits).
    const auto copy_stage = [&](int b, std::int64_t m0) {
        load_tile<E, DP, kRows>(qs_of(b), q_slice, m0, p.queries - m0, D, p.vector_rows);
        load_tile<E, DP, kRows>(dys_of(b), dy_slice, m0, p.queries - m0, D, p.vector_rows);
        float* lse_tile = lse_of(b);
        float* delta_tile = delta_of(b);
        for (int c = threadIdx.x; c < kRows; c += kThreads) {
            const bool inside = m0 + c < p.queries;
            lse_tile[c] = inside ? lse[slice * p.queries + m0 + c] * kExpUnit<E> : minus_infinity<float>();
            delta_tile[c] = inside ? delta[slice * p.queries + m0 + c] : 0.0f;
        }
    };
    // Causal: queries before the tile's first key see none of its keys.
    const std::int64_t query_begin = p.causal ? n0 : 0;
    const bool no_dropout = p.dropout_p == 0.0;
    // dV and dK from query tile m0 in stage `stage`; kFuseDq: dSᵀ to ds_shared too.
    const auto products = [&](int stage, std::int64_t m0) {
        const E* qs = qs_of(stage);
        const E* dys = dys_of(stage);
        const float* lse_tile = lse_of(stage);
        const float* delta_tile = delta_of(stage);
        float s[kQueryTiles][4] = {}, dp[kQueryTiles][4] = {};
        multiply_tiles_transposed<E, DP, kQueryTiles>(s, ks, wrow, qs, kLine);    // Sᵀ = K·Qᵀ
        multiply_tiles_transposed<E, DP, kQueryTiles>(dp, vs, wrow, dys, kLine);  // dPᵀ = V·dYᵀ
        // Every query of the tile sees every key of the block (and has a finite lse): no per-element test.
        const bool whole = !p.mask && m0 + kRows <= p.queries && n0 + kTile <= p.keys &&
                           (!p.causal || m0 >= n0 + kTile - 1);
#pragma unroll
        for (int tile = 0; tile < kQueryTiles; ++tile)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * tile + 2 * (lane % 4) + (e & 1);
                const std::int64_t t = m0 + c, key = key_of[e / 2];
                const float row_lse = lse_tile[c];
                const bool part =
                    whole || (takes_part<E>(p, slice, t, key) && row_lse != minus_infinity<float>());
                const float prob = part ? exp_in_units<E>(s[tile][e] * scale_units - row_lse) : 0.0f;
                const float factor = no_dropout ? 1.0f : dropout_factor<float>(p, slice, t, key);
                dp[tile][e] = prob * (dp[tile][e] * factor - delta_tile[c]);  // dSᵀ
                s[tile][e] = prob * factor;                                    // (P∘F)ᵀ
            }
        if constexpr (kFuseDq) {
#pragma unroll
            for (int tile = 0; tile < kQueryTiles; ++tile)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = 8 * tile + 2 * (lane % 4) + (e & 1);
                    const int key = wrow + lane / 4 + 8 * (e / 2);  // within the block; key % 8 = lane / 4
                    ds_shared[c * kDsLine + (key & ~7) + (key & 7) / 2 + 4 * (key & 1)] = dp[tile][e];
                }
        }
        __syncwarp();  // the lanes took their own mask branches: converged again before the mma.sync below
        multiply_from_c<E, DP, kQueryTiles>(dv_acc, s, dys, kLine);
        multiply_from_c<E, DP, kQueryTiles>(dk_acc, dp, qs, kLine);
    };
    if constexpr (!kFuseDq) {
        stream_tiles<kStages>(query_begin, p.queries, kRows, copy_stage, products);
    } else {
        // dQ (kRows × DP) = dS (kRows × 64 keys) · K (64 × DP) from ds_shared: warp w takes 16 query rows and kCols
        // columns, and adds them into dq_accum.
        constexpr int kRowGroups = kRows / kWarpRows, kCols = DP / (kWarps / kRowGroups);
        const int query0 = kWarpRows * (warp % kRowGroups), col0 = kCols * (warp / kRowGroups);
        const auto add_dq = [&](std::int64_t m0) {
            float dq_acc[kCols / 8][4] = {};
#pragma unroll
            for (int step = 0; step < kTile / 8; ++step) {
                std::uint32_t raw[4];
                load_a<E>(raw, ds_shared, kDsLine, query0, 8 * step);
                const FragA<E> a = make_a<E>(raw);
#pragma unroll
                for (int pair = 0; pair < kCols / 16; ++pair) {
                    FragB<E> b[2];
                    load_b<E>(b, ks, kLine, 8 * step, col0 + 16 * pair);
                    mma<E>(dq_acc[2 * pair], a, b[0]);
                    mma<E>(dq_acc[2 * pair + 1], a, b[1]);
                }
            }
            add_rows<kCols / 8>(dq_accum + slice * p.queries * D, dq_acc, m0 + query0, col0, p.queries, D, scale);
        };
        // stream_tiles with the dQ product after a second __syncthreads (every warp's dS is in, and no warp reads
        // the stage any more). One stage: the next tile's copy starts there, under the dQ product, where
        // stream_tiles would issue it after the body and wait for it at once. Two stages: it starts at the top,
        // into the stage the previous tile's products finished with. The top __syncthreads keeps the next dS
        // writes after every warp's dQ reads.
        if (query_begin < p.queries) {
            copy_stage(0, query_begin);
            cp_async_commit();
        }
        int stage = 0;
        for (std::int64_t m0 = query_begin; m0 < p.queries; m0 += kRows, stage ^= kStages - 1) {
            const bool more = m0 + kRows < p.queries;
            if (kStages == 2 && more) copy_stage(stage ^ 1, m0 + kRows);
            cp_async_commit();             // possibly empty: the wait counts groups
            cp_async_wait<kStages - 1>();  // this tile's copies are in
            __syncthreads();
            products(stage, m0);
            __syncthreads();
            if (kStages == 1 && more) {
                copy_stage(0, m0 + kRows);
                cp_async_commit();
            }
            add_dq(m0);
        }
    }
    cp_async_wait<0>();  // the loop may not have run (causal: keys past the last query)
    const float scales[2] = {scale, scale}, ones[2] = {1.0f, 1.0f};
    store_rows<E, DP>(dk + slice * p.keys * D, dk_acc, n0 + wrow, p.keys, D, scales);
    store_rows<E, DP>(dv + slice * p.keys * D, dv_acc, n0 + wrow, p.keys, D, ones);
#endif
}

// dq for one query tile (the warp's rows are queries), over the key tiles it sees, streamed by stream_rows<DP>()
// keys: S = Q·Kᵀ and dP = dY·Vᵀ in registers, then dQ += dS·K with A from those registers.
template <typename E, int DP>
__global__ void __launch_bounds__(kThreads) attention_backward_q_kernel(
    const E* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v, const E* __restrict__ dy,
    const float* __restrict__ lse, const float* __restrict__ delta, E* __restrict__ dq, Params p) {
#if DG_ATTENTION_TENSOR_CORES
    constexpr int kLine = line<E, DP>(), kRows = stream_rows<DP>(), kKeyTiles = kRows / 8;
    constexpr int kStages = backward_stages<E, DP>();
    extern __shared__ __align__(128) unsigned char mma_shared[];
    E* qs = reinterpret_cast<E*>(mma_shared);  // [64 queries][kLine]
    E* dys = qs + kTile * kLine;                // [64 queries][kLine]
    // Stage b: K, V [kRows keys][kLine] each.
    const auto ks_of = [&](int b) { return dys + kTile * kLine + 2 * b * kRows * kLine; };
    const auto vs_of = [&](int b) { return ks_of(b) + kRows * kLine; };

    const std::int64_t tiles = (p.queries + kTile - 1) / kTile;
    const TileOf at = tile_of_block(tiles, p.causal);
    const std::int64_t slice = at.slice, m0 = at.tile * kTile;
    const std::int64_t D = p.head_dim;
    const float scale = p.scale_f;
    const float scale_units = scale * kExpUnit<E>;  // the scores, and lse below, in exp_in_units' units
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wrow = warp * kWarpRows;
    const std::int64_t t_of[2] = {m0 + wrow + lane / 4, m0 + wrow + lane / 4 + 8};
    const E* k_slice = k + slice * p.keys * D;
    const E* v_slice = v + slice * p.keys * D;

    load_tile<E, DP, kTile>(qs, q + slice * p.queries * D, m0, p.queries - m0, D, p.vector_rows);
    load_tile<E, DP, kTile>(dys, dy + slice * p.queries * D, m0, p.queries - m0, D, p.vector_rows);
    cp_async_commit();
    float row_lse[2], row_delta[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const bool inside = t_of[half] < p.queries;
        row_lse[half] = inside ? lse[slice * p.queries + t_of[half]] * kExpUnit<E> : minus_infinity<float>();
        row_delta[half] = inside ? delta[slice * p.queries + t_of[half]] : 0.0f;
    }
    float dq_acc[DP / 8][4] = {};
    const std::int64_t key_end = p.causal ? std::min<std::int64_t>(p.keys, m0 + kTile) : p.keys;
    // Copies key tile n0 into stage b (the caller commits).
    const auto copy_stage = [&](int b, std::int64_t n0) {
        load_tile<E, DP, kRows>(ks_of(b), k_slice, n0, p.keys - n0, D, p.vector_rows);
        load_tile<E, DP, kRows>(vs_of(b), v_slice, n0, p.keys - n0, D, p.vector_rows);
    };
    stream_tiles<kStages>(0, key_end, kRows, copy_stage, [&](int stage, std::int64_t n0) {
        const E* ks = ks_of(stage);
        const E* vs = vs_of(stage);
        float s[kKeyTiles][4] = {}, dp[kKeyTiles][4] = {};
        multiply_tiles_transposed<E, DP, kKeyTiles>(s, qs, wrow, ks, kLine);    // S = Q·Kᵀ
        multiply_tiles_transposed<E, DP, kKeyTiles>(dp, dys, wrow, vs, kLine);  // dP = dY·Vᵀ
        // Every key of the tile takes part in every row of the warp, and those rows exist: no per-element test.
        const bool whole = !p.mask && n0 + kRows <= p.keys && m0 + kTile <= p.queries &&
                           (!p.causal || n0 + kRows - 1 <= m0 + wrow);
#pragma unroll
        for (int tile = 0; tile < kKeyTiles; ++tile)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int half = e / 2;
                const std::int64_t t = t_of[half], key = n0 + 8 * tile + 2 * (lane % 4) + (e & 1);
                const bool part =
                    whole || (takes_part<E>(p, slice, t, key) && row_lse[half] != minus_infinity<float>());
                const float prob = part ? exp_in_units<E>(s[tile][e] * scale_units - row_lse[half]) : 0.0f;
                const float factor = p.dropout_p == 0.0 ? 1.0f : dropout_factor<float>(p, slice, t, key);
                dp[tile][e] = prob * (dp[tile][e] * factor - row_delta[half]);  // dS
            }
        __syncwarp();  // the lanes took their own mask branches: converged again before the mma.sync below
        multiply_from_c<E, DP, kKeyTiles>(dq_acc, dp, ks, kLine);
    });
    cp_async_wait<0>();
    const float scales[2] = {scale, scale};
    store_rows<E, DP>(dq + slice * p.queries * D, dq_acc, m0 + wrow, p.queries, D, scales);
#endif
}

}  // namespace mma

// A mask value other than 0 or 1 is reported (ValueError at the next synchronisation), as the CPU throws.
template <typename Real>
__global__ void check_binary_mask_kernel(const Real* __restrict__ mask, std::int64_t n, DeviceErrorRecord* record,
                                         const char* what) {
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const auto value = to_acc(mask[i]);
        if (value != 0 && value != 1 &&
            atomicCAS(&record->code, static_cast<int>(DeviceErrorCode::none),
                      static_cast<int>(DeviceErrorCode::value_not_binary)) == static_cast<int>(DeviceErrorCode::none)) {
            record->index = i;
            record->what = what;
        }
    }
}

// ---- host side ----
Params params_of(std::span<const Tensor> inputs, const AttentionGeometry& g) {
    Params p{};
    p.heads = g.heads;
    p.queries = g.queries;
    p.keys = g.keys;
    p.head_dim = g.head_dim;
    p.scale_f = static_cast<float>(g.scale);
    p.scale_d = g.scale;
    p.causal = g.causal;
    p.dropout_p = g.dropout_p;
    p.kept_factor = 1.0 / (1.0 - g.dropout_p);
    p.seed = g.seed;
    p.mask = g.has_mask ? inputs[3].raw_data() : nullptr;
    for (int i = 0; i < 4; ++i) p.mask_stride[i] = g.mask_stride[i];
    return p;
}

template <typename Real> constexpr int tile_for() { return sizeof(Real) == 4 ? 64 : 32; }

// Shared memory of each kernel (bytes).
template <typename Real, int TILE, int DP> constexpr std::size_t forward_shared() {
    return sizeof(Real) * (3 * DP + TILE) * (TILE + 1);
}
template <typename Real, int TILE, int DP> constexpr std::size_t backward_kv_shared() {
    return sizeof(Real) * ((4 * DP + 2 * TILE) * (TILE + 1) + 2 * TILE);
}
template <typename Real, int TILE, int DP> constexpr std::size_t backward_q_shared() {
    return sizeof(Real) * (4 * DP + TILE) * (TILE + 1);
}

// Kernels above 48 KiB of dynamic shared memory must opt in, once per kernel (thread-safe; per device in
// principle, but every device dyngrad runs on is the same sm_90 build).
template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes, std::once_flag& once) {
    std::call_once(once, [&] {
        DG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    });
}

// Calls fn.template operator()<DP>() with the padded head dim for D.
template <typename Fn> void with_padded_head_dim(std::int64_t head_dim, Fn&& fn) {
    if (head_dim <= 32)
        fn.template operator()<32>();
    else if (head_dim <= 64)
        fn.template operator()<64>();
    else
        fn.template operator()<128>();  // the shape rule refuses D > kAttentionMaxGpuHeadDim = 128
}

// Launch grid: one block per tile per slice, flat (a slice count beyond gridDim.y's 65535 is fine).
unsigned blocks_for(std::int64_t tiles, std::int64_t slices) {
    const std::int64_t blocks = tiles * slices;
    if (blocks > std::numeric_limits<int>::max())
        throw ShapeError(str("scaled_dot_product_attention: ", blocks, " blocks exceed the GPU grid"));
    return static_cast<unsigned>(blocks);
}

constexpr const char* kOpName = "scaled_dot_product_attention mask";

// Whether the tensor-core kernels were compiled for this device's architecture (8.0 and newer; below it they
// are empty). Checked once per process: every device dyngrad runs on is the same build target.
bool tensor_cores_compiled() {
    static const bool compiled = [] {
        cudaFuncAttributes attributes{};
        DG_CUDA_CHECK(cudaFuncGetAttributes(&attributes, mma::attention_forward_kernel<float, 64>));
        return attributes.ptxVersion >= 80;
    }();
    return compiled;
}

// float32 runs on tensor cores unless attention_gpu_path() says simt (ops/attention.h).
bool use_tensor_cores(DType dtype) {
    return dtype == DType::f32 && attention_gpu_path() == AttentionGpuPath::tensor_cores && tensor_cores_compiled();
}

// 16-byte loads of (rows, D) operands of `element_bytes` each: every row a whole number of 16-byte vectors and
// every base 16-byte aligned.
bool rows_are_aligned(std::int64_t head_dim, std::size_t element_bytes, std::initializer_list<const void*> bases) {
    if (head_dim * static_cast<std::int64_t>(element_bytes) % 16 != 0) return false;
    for (const void* base : bases)
        if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
    return true;
}

// y and lse (f32) by the mma.sync forward.
template <typename E>
void launch_mma_forward(const E* q, const E* k, const E* v, E* y, float* lse, const AttentionGeometry& g, Params p,
                        DeviceContext& ctx) {
    p.vector_rows = rows_are_aligned(g.head_dim, sizeof(E), {q, k, v});
    with_padded_head_dim(g.head_dim, [&]<int DP>() {
        constexpr std::size_t shared = mma::forward_shared<E, DP>();
        static std::once_flag once;
        allow_shared(mma::attention_forward_kernel<E, DP>, shared, once);
        constexpr int rows = mma::kForwardRows<E>;
        const unsigned blocks = blocks_for((g.queries + rows - 1) / rows, g.slices());
        mma::attention_forward_kernel<E, DP><<<blocks, 32 * mma::kForwardWarps<E>, shared, ctx.stream>>>(q, k, v, y,
                                                                                                      lse, p);
        DG_CUDA_CHECK_LAUNCH();
    });
}

// dq (when defined) and dk, dv (when defined) by the mma.sync backward kernels, from lse and delta (f32).
// f32 with all three wanted, outside deterministic mode: one fused kernel adds dq with float atomics (see
// attention_backward_kv_kernel's kFuseDq); otherwise the deterministic pair of kernels.
template <typename E>
void launch_mma_backward(const BackwardArgs& args, const AttentionGeometry& g, Params p, const Tensor& lse,
                         const Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext& ctx) {
    const E* q = args.inputs[0].data<E>();
    const E* k = args.inputs[1].data<E>();
    const E* v = args.inputs[2].data<E>();
    const E* dy = args.grad_output.data<E>();
    p.vector_rows = rows_are_aligned(g.head_dim, sizeof(E), {q, k, v, dy});
    const unsigned key_blocks = blocks_for((g.keys + mma::kTile - 1) / mma::kTile, g.slices());
    if constexpr (std::is_same_v<E, float>) {
        if (dq.defined() && dk.defined() && !deterministic()) {
            // The key blocks add into dq: it starts at zero (a memset node under capture, no allocation).
            DG_CUDA_CHECK(cudaMemsetAsync(dq.raw_data(), 0, static_cast<std::size_t>(dq.numel()) * sizeof(float),
                                          ctx.stream));
            with_padded_head_dim(g.head_dim, [&]<int DP>() {
                constexpr std::size_t shared = mma::backward_fused_shared<DP>();
                static std::once_flag once;
                allow_shared(mma::attention_backward_kv_kernel<float, DP, true>, shared, once);
                mma::attention_backward_kv_kernel<float, DP, true><<<key_blocks, mma::kThreads, shared, ctx.stream>>>(
                    q, k, v, dy, lse.data<float>(), delta.data<float>(), dk.data<float>(), dv.data<float>(),
                    dq.data<float>(), p);
                DG_CUDA_CHECK_LAUNCH();
            });
            return;
        }
    }
    with_padded_head_dim(g.head_dim, [&]<int DP>() {
        if (dk.defined()) {
            constexpr std::size_t shared = mma::backward_kv_shared<E, DP>();
            static std::once_flag once;
            allow_shared(mma::attention_backward_kv_kernel<E, DP>, shared, once);
            mma::attention_backward_kv_kernel<E, DP><<<key_blocks, mma::kThreads, shared, ctx.stream>>>(
                q, k, v, dy, lse.data<float>(), delta.data<float>(), dk.data<E>(), dv.data<E>(), nullptr, p);
            DG_CUDA_CHECK_LAUNCH();
        }
        if (dq.defined()) {
            constexpr std::size_t shared = mma::backward_q_shared<E, DP>();
            static std::once_flag once;
            allow_shared(mma::attention_backward_q_kernel<E, DP>, shared, once);
            const unsigned blocks = blocks_for((g.queries + mma::kTile - 1) / mma::kTile, g.slices());
            mma::attention_backward_q_kernel<E, DP><<<blocks, mma::kThreads, shared, ctx.stream>>>(
                q, k, v, dy, lse.data<float>(), delta.data<float>(), dq.data<E>(), p);
            DG_CUDA_CHECK_LAUNCH();
        }
    });
}

// bf16/f16 run only on the tensor-core kernels (there is no 16-bit SIMT set; attention_gpu_path() chooses for
// float32).
void require_reduced_kernels(DType dtype) {
    if (!tensor_cores_compiled())
        throw DeviceError(str("scaled_dot_product_attention: ", dtype_name(dtype), " needs the tensor-core kernels, ",
                              "which this build does not compile for the device (compute capability 8.0 or newer); ",
                              "convert the inputs to float32"));
}

// Calls fn.template operator()<T>() with the 16-bit GPU element type of a bf16/f16 dtype.
template <typename Fn> void dispatch_reduced(DType dtype, Fn&& fn) {
    if (dtype == DType::bf16)
        fn.template operator()<__nv_bfloat16>();
    else
        fn.template operator()<__half>();
}

// y (T) and lse (f32): by cuDNN's fused attention where it takes the case (ops/attention_cudnn.cu), else by
// the tensor-core (mma.sync) forward.
void launch_reduced_forward(std::span<const Tensor> inputs, const AttentionGeometry& g, Params p, Tensor& y,
                            Tensor& lse, DeviceContext& ctx) {
    if (cudnn_attention_forward(inputs, g, y, lse, ctx)) return;
    require_reduced_kernels(y.dtype());
    dispatch_reduced(y.dtype(), [&]<typename T>() {
        launch_mma_forward<T>(inputs[0].data<T>(), inputs[1].data<T>(), inputs[2].data<T>(), y.data<T>(),
                              lse.data<float>(), g, p, ctx);
    });
}

// dq, dk, dv by cuDNN's fused attention where it takes the case (all three), else delta (f32), then dq (when
// defined) and dk, dv (when defined) by the tensor-core backward kernels. Both read the same saved lse.
void launch_reduced_backward(const BackwardArgs& args, const AttentionGeometry& g, Params p, const Tensor& lse,
                             Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext& ctx) {
    const Tensor& grad_output = args.grad_output;
    if (cudnn_attention_backward(args.inputs, args.output, grad_output, g, lse, dq, dk, dv, ctx)) return;
    require_reduced_kernels(grad_output.dtype());
    dispatch_reduced(grad_output.dtype(), [&]<typename T>() {
        const std::int64_t rows = g.slices() * g.queries;
        constexpr unsigned kDeltaThreads = 256;
        attention_delta_kernel<T><<<grid_size(ctx, rows * 32, kDeltaThreads), kDeltaThreads, 0, ctx.stream>>>(
            grad_output.data<T>(), args.output.data<T>(), delta.data<float>(), rows, g.head_dim);
        DG_CUDA_CHECK_LAUNCH();
        launch_mma_backward<T>(args, g, p, lse, delta, dq, dk, dv, ctx);
    });
}

}  // namespace

bool attention_tensor_cores_compiled() { return tensor_cores_compiled(); }

Tensor scaled_dot_product_attention_forward(const ForwardArgs& args) {
    const AttentionGeometry g = attention_geometry(args.inputs, args.attrs);
    const Tensor& q = args.inputs[0];
    DeviceContext& ctx = context_for(q);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, q.device());
    // bf16/f16: the log-sum-exp is saved in f32 (the backward's probabilities are exp(s − lse)).
    const bool reduced = is_reduced_precision(q.dtype());
    Tensor lse = Tensor::empty({g.batch, g.heads, g.queries}, reduced ? DType::f32 : args.out.dtype, q.device());
    args.saved.push_back(lse);
    if (g.has_mask && args.inputs[3].numel() > 0) {
        const Tensor& mask = args.inputs[3];
        dispatch_gpu_floating(mask.dtype(), "scaled_dot_product_attention mask check", [&]<typename Real>() {
            check_binary_mask_kernel<Real><<<grid_size(ctx, mask.numel(), 256), 256, 0, ctx.stream>>>(
                mask.data<Real>(), mask.numel(), ctx.error_record_device, kOpName);
            DG_CUDA_CHECK_LAUNCH();
        });
    }
    if (g.slices() == 0 || g.queries == 0) return y;
    Params p = params_of(args.inputs, g);
    if (reduced) {
        launch_reduced_forward(args.inputs, g, p, y, lse, ctx);
        return y;
    }
    if (use_tensor_cores(q.dtype())) {
        launch_mma_forward<float>(q.data<float>(), args.inputs[1].data<float>(), args.inputs[2].data<float>(),
                                  y.data<float>(), lse.data<float>(), g, p, ctx);
        return y;
    }
    dispatch_floating(q.dtype(), "scaled_dot_product_attention", [&]<typename Real>() {
        constexpr int TILE = tile_for<Real>();
        with_padded_head_dim(g.head_dim, [&]<int DP>() {
            constexpr std::size_t shared = forward_shared<Real, TILE, DP>();
            static std::once_flag once;
            allow_shared(attention_forward_kernel<Real, TILE, DP>, shared, once);
            const unsigned blocks = blocks_for((g.queries + TILE - 1) / TILE, g.slices());
            attention_forward_kernel<Real, TILE, DP><<<blocks, 2 * TILE, shared, ctx.stream>>>(
                q.data<Real>(), args.inputs[1].data<Real>(), args.inputs[2].data<Real>(), y.data<Real>(),
                lse.data<Real>(), p);
            DG_CUDA_CHECK_LAUNCH();
        });
    });
    return y;
}

std::vector<Tensor> scaled_dot_product_attention_backward(const BackwardArgs& args) {
    const AttentionGeometry g = attention_geometry(args.inputs, args.attrs);
    const Tensor& dy = args.grad_output;
    DeviceContext& ctx = context_for(dy);
    std::vector<Tensor> grads(args.inputs.size());
    if (g.has_mask && args.needs_grad[3]) grads[3] = Tensor::zeros(args.inputs[3].shape(), dy.dtype(), dy.device());
    const bool want_q = args.needs_grad[0], want_kv = args.needs_grad[1] || args.needs_grad[2];
    if (!want_q && !want_kv) return grads;
    Tensor dq = want_q ? Tensor::empty(args.inputs[0].shape(), dy.dtype(), dy.device()) : Tensor();
    // dk and dv come from one kernel: both are computed when either is needed.
    Tensor dk = want_kv ? Tensor::empty(args.inputs[1].shape(), dy.dtype(), dy.device()) : Tensor();
    Tensor dv = want_kv ? Tensor::empty(args.inputs[2].shape(), dy.dtype(), dy.device()) : Tensor();
    const std::int64_t rows = g.slices() * g.queries;
    if (rows > 0 && g.keys > 0) {
        Params p = params_of(args.inputs, g);
        const Tensor& lse = args.saved[0];
        const bool reduced = is_reduced_precision(dy.dtype());
        Tensor delta = Tensor::empty({rows}, reduced ? DType::f32 : dy.dtype(), dy.device());
        const bool tensor_cores = use_tensor_cores(dy.dtype());
        if (reduced) {
            launch_reduced_backward(args, g, p, lse, delta, dq, dk, dv, ctx);
        } else {
            dispatch_floating(dy.dtype(), "scaled_dot_product_attention backward", [&]<typename Real>() {
                constexpr unsigned kDeltaThreads = 256;
                const unsigned delta_blocks = grid_size(ctx, rows * 32, kDeltaThreads);
                attention_delta_kernel<Real><<<delta_blocks, kDeltaThreads, 0, ctx.stream>>>(
                    dy.data<Real>(), args.output.data<Real>(), delta.data<Real>(), rows, g.head_dim);
                DG_CUDA_CHECK_LAUNCH();
                if constexpr (std::is_same_v<Real, float>) {
                    if (tensor_cores) {
                        launch_mma_backward<float>(args, g, p, lse, delta, dq, dk, dv, ctx);
                        return;
                    }
                }
                constexpr int TILE = tile_for<Real>();
                const Real* q = args.inputs[0].data<Real>();
                const Real* k = args.inputs[1].data<Real>();
                const Real* v = args.inputs[2].data<Real>();
                with_padded_head_dim(g.head_dim, [&]<int DP>() {
                    if (want_kv) {
                        constexpr std::size_t shared = backward_kv_shared<Real, TILE, DP>();
                        static std::once_flag once;
                        allow_shared(attention_backward_kv_kernel<Real, TILE, DP>, shared, once);
                        const unsigned blocks = blocks_for((g.keys + TILE - 1) / TILE, g.slices());
                        attention_backward_kv_kernel<Real, TILE, DP><<<blocks, 2 * TILE, shared, ctx.stream>>>(
                            q, k, v, dy.data<Real>(), lse.data<Real>(), delta.data<Real>(), dk.data<Real>(),
                            dv.data<Real>(), p);
                        DG_CUDA_CHECK_LAUNCH();
                    }
                    if (want_q) {
                        constexpr std::size_t shared = backward_q_shared<Real, TILE, DP>();
                        static std::once_flag once;
                        allow_shared(attention_backward_q_kernel<Real, TILE, DP>, shared, once);
                        const unsigned blocks = blocks_for((g.queries + TILE - 1) / TILE, g.slices());
                        attention_backward_q_kernel<Real, TILE, DP><<<blocks, 2 * TILE, shared, ctx.stream>>>(
                            q, k, v, dy.data<Real>(), lse.data<Real>(), delta.data<Real>(), dq.data<Real>(), p);
                        DG_CUDA_CHECK_LAUNCH();
                    }
                });
            });
        }
    } else {
        // No query or no key: every gradient is zero (and possibly empty).
        if (want_q) dq = Tensor::zeros(args.inputs[0].shape(), dy.dtype(), dy.device());
        if (want_kv) {
            dk = Tensor::zeros(args.inputs[1].shape(), dy.dtype(), dy.device());
            dv = Tensor::zeros(args.inputs[2].shape(), dy.dtype(), dy.device());
        }
    }
    if (args.needs_grad[0]) grads[0] = dq;
    if (args.needs_grad[1]) grads[1] = dk;
    if (args.needs_grad[2]) grads[2] = dv;
    return grads;
}

}  // namespace dyngrad::cuda
