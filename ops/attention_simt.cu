// scaled_dot_product_attention on the GPU, the SIMT kernel family: fused flash-attention kernels in exact FMA
// arithmetic (float32 and float64), their launchers, the backward's delta pre-pass (every dtype) and the mask
// check. Which family runs when: ops/attention.cu; the tensor-core family: ops/attention_mma.cu.
//
// Forward (one block per TILE queries of one (b, h) slice): the queries stay in shared memory, key/value tiles
// stream through it, each row keeps a running max m and sum l (online softmax) and rescales its output
// accumulator when m grows. Only the output and the log-sum-exp m + log l per row reach global memory: memory
// is linear in T and S. Causal blocks stop at their last query's key tile.
// Backward, by recomputation from the saved log-sum-exp: a pre-pass D_t = rowsum(dO∘O), then one kernel per key
// tile accumulating dK, dV over the query tiles and one per query tile accumulating dQ over the key tiles. The
// second recomputes the scores once more instead of adding into dQ with atomics, so gradients are
// deterministic (the same bits on every run).
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

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/attention_common.cuh"
#include "dyngrad/ops/attention_launch.h"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda::attention {

namespace {

template <typename Real> __device__ __forceinline__ Real scale_of(const Params& p);
template <> __device__ __forceinline__ float scale_of<float>(const Params& p) { return p.scale_f; }
template <> __device__ __forceinline__ double scale_of<double>(const Params& p) { return p.scale_d; }

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }

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

// The backward's recomputed products of the thread's rows and columns, from zero: s = S (or Sᵀ) from s_rows and
// s_cols, dp = dP (or dPᵀ) from dp_rows and dp_cols, over the padded head dim.
template <typename Real, int TILE, int DP, int COLS>
__device__ __forceinline__ void recompute_products(Real (&s)[4][COLS], Real (&dp)[4][COLS], const Real* s_rows,
                                                   const Real* s_cols, const Real* dp_rows, const Real* dp_cols) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < COLS; ++j) s[i][j] = dp[i][j] = Real(0);
    multiply_rows_cols<Real, TILE, COLS>(s, s_rows, s_cols, DP);
    multiply_rows_cols<Real, TILE, COLS>(dp, dp_rows, dp_cols, DP);
}

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
        recompute_products<Real, TILE, DP>(s, dp, kt, qt, vt, dyt);  // Sᵀ = K·Qᵀ, dPᵀ = V·dYᵀ
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
        recompute_products<Real, TILE, DP>(s, dp, qt, kt, dyt, vt);  // S = Q·Kᵀ, dP = dY·Vᵀ
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
// check_mask's kernel (ops/attention_launch.h).
template <typename Real>
__global__ void check_binary_mask_kernel(const Real* __restrict__ mask, std::int64_t n, DeviceErrorRecord* record,
                                         const char* what) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
        const auto value = to_acc(mask[i]);
        if (value != 0 && value != 1 &&
            atomicCAS(&record->code, static_cast<int>(DeviceErrorCode::none),
                      static_cast<int>(DeviceErrorCode::value_not_binary)) == static_cast<int>(DeviceErrorCode::none)) {
            record->index = i;
            record->what = what;
        }
    }
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

constexpr const char* kOpName = "scaled_dot_product_attention mask";

}  // namespace

void check_mask(const Tensor& mask, DeviceContext& ctx) {
    dispatch_gpu_floating(mask.dtype(), "scaled_dot_product_attention mask check", [&]<typename Real>() {
        check_binary_mask_kernel<Real><<<grid_size(ctx, mask.numel(), 256), 256, 0, ctx.stream>>>(
            mask.data<Real>(), mask.numel(), ctx.error_record_device, kOpName);
        DG_CUDA_CHECK_LAUNCH();
    });
}

template <typename T>
void launch_delta(const Tensor& dy, const Tensor& y, Tensor& delta, const AttentionGeometry& g, DeviceContext& ctx) {
    const std::int64_t rows = g.slices() * g.queries;
    constexpr unsigned kDeltaThreads = 256;
    attention_delta_kernel<T><<<grid_size(ctx, rows * 32, kDeltaThreads), kDeltaThreads, 0, ctx.stream>>>(
        dy.data<T>(), y.data<T>(), delta.data<acc_t<T>>(), rows, g.head_dim);
    DG_CUDA_CHECK_LAUNCH();
}

template <typename Real>
void launch_simt_forward(std::span<const Tensor> inputs, const AttentionGeometry& g, const Params& p, Tensor& y,
                         Tensor& lse, DeviceContext& ctx) {
    constexpr int TILE = tile_for<Real>();
    with_padded_head_dim(g.head_dim, [&]<int DP>() {
        launch_with_shared<attention_forward_kernel<Real, TILE, DP>, forward_shared<Real, TILE, DP>()>(
            blocks_for((g.queries + TILE - 1) / TILE, g.slices()), 2 * TILE, ctx, inputs[0].data<Real>(),
            inputs[1].data<Real>(), inputs[2].data<Real>(), y.data<Real>(), lse.data<Real>(), p);
    });
}

template <typename Real>
void launch_simt_backward(const BackwardArgs& args, const AttentionGeometry& g, const Params& p, const Tensor& lse,
                          const Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext& ctx) {
    constexpr int TILE = tile_for<Real>();
    const Real* q = args.inputs[0].data<Real>();
    const Real* k = args.inputs[1].data<Real>();
    const Real* v = args.inputs[2].data<Real>();
    const Real* dy = args.grad_output.data<Real>();
    with_padded_head_dim(g.head_dim, [&]<int DP>() {
        if (dk.defined())
            launch_with_shared<attention_backward_kv_kernel<Real, TILE, DP>, backward_kv_shared<Real, TILE, DP>()>(
                blocks_for((g.keys + TILE - 1) / TILE, g.slices()), 2 * TILE, ctx, q, k, v, dy, lse.data<Real>(),
                delta.data<Real>(), dk.data<Real>(), dv.data<Real>(), p);
        if (dq.defined())
            launch_with_shared<attention_backward_q_kernel<Real, TILE, DP>, backward_q_shared<Real, TILE, DP>()>(
                blocks_for((g.queries + TILE - 1) / TILE, g.slices()), 2 * TILE, ctx, q, k, v, dy, lse.data<Real>(),
                delta.data<Real>(), dq.data<Real>(), p);
    });
}

template void launch_delta<float>(const Tensor&, const Tensor&, Tensor&, const AttentionGeometry&, DeviceContext&);
template void launch_delta<double>(const Tensor&, const Tensor&, Tensor&, const AttentionGeometry&, DeviceContext&);
template void launch_delta<__nv_bfloat16>(const Tensor&, const Tensor&, Tensor&, const AttentionGeometry&,
                                          DeviceContext&);
template void launch_delta<__half>(const Tensor&, const Tensor&, Tensor&, const AttentionGeometry&, DeviceContext&);
template void launch_simt_forward<float>(std::span<const Tensor>, const AttentionGeometry&, const Params&, Tensor&,
                                         Tensor&, DeviceContext&);
template void launch_simt_forward<double>(std::span<const Tensor>, const AttentionGeometry&, const Params&, Tensor&,
                                          Tensor&, DeviceContext&);
template void launch_simt_backward<float>(const BackwardArgs&, const AttentionGeometry&, const Params&,
                                          const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&, DeviceContext&);
template void launch_simt_backward<double>(const BackwardArgs&, const AttentionGeometry&, const Params&,
                                           const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&, DeviceContext&);

}  // namespace dyngrad::cuda::attention
