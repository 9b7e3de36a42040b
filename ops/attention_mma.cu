// scaled_dot_product_attention on the GPU, the tensor-core kernel family (compute capability 8.0+): one set of
// flash-attention kernels on mma.sync, templated on the element type E: float32 in 3xTF32, bfloat16 and float16
// natively with f32 softmax and accumulators; and their launchers. The building blocks (fragments, the MMA per E,
// tile copies): ops/attention_mma.cuh. Which family runs when: ops/attention.cu.
//
// Forward and backward follow the SIMT kernels' design (ops/attention_simt.cu): online softmax over streamed key
// tiles, the log-sum-exp saved, the backward by recomputation from it with dK/dV per key tile and dQ per query
// tile (deterministic). The float32 path outside deterministic mode (cuda::deterministic() false, the default)
// fuses the two instead: the key-tile kernel also adds dS·K into dQ with float atomics
// (attention_backward_kv_kernel's kFuseDq).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/attention_common.cuh"
#include "dyngrad/ops/attention_launch.h"
#include "dyngrad/ops/attention_mma.cuh"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda::attention {

namespace mma {
namespace {

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

}  // namespace
}  // namespace mma

namespace {

// 16-byte loads of (rows, D) operands of `element_bytes` each: every row a whole number of 16-byte vectors and
// every base 16-byte aligned.
bool rows_are_aligned(std::int64_t head_dim, std::size_t element_bytes, std::initializer_list<const void*> bases) {
    if (head_dim * static_cast<std::int64_t>(element_bytes) % 16 != 0) return false;
    for (const void* base : bases)
        if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
    return true;
}

}  // namespace

bool mma_compiled() {
    static const bool compiled = [] {
        cudaFuncAttributes attributes{};
        DG_CUDA_CHECK(cudaFuncGetAttributes(&attributes, mma::attention_forward_kernel<float, 64>));
        return attributes.ptxVersion >= 80;
    }();
    return compiled;
}

template <typename E>
void launch_mma_forward(std::span<const Tensor> inputs, const AttentionGeometry& g, Params p, Tensor& y, Tensor& lse,
                        DeviceContext& ctx) {
    const E* q = inputs[0].data<E>();
    const E* k = inputs[1].data<E>();
    const E* v = inputs[2].data<E>();
    p.vector_rows = rows_are_aligned(g.head_dim, sizeof(E), {q, k, v});
    constexpr int rows = mma::kForwardRows<E>;
    with_padded_head_dim(g.head_dim, [&]<int DP>() {
        launch_with_shared<mma::attention_forward_kernel<E, DP>, mma::forward_shared<E, DP>()>(
            blocks_for((g.queries + rows - 1) / rows, g.slices()), 32 * mma::kForwardWarps<E>, ctx, q, k, v,
            y.data<E>(), lse.data<float>(), p);
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
                constexpr auto kFused = mma::attention_backward_kv_kernel<float, DP, true>;
                launch_with_shared<kFused, mma::backward_fused_shared<DP>()>(
                    key_blocks, mma::kThreads, ctx, q, k, v, dy, lse.data<float>(), delta.data<float>(),
                    dk.data<float>(), dv.data<float>(), dq.data<float>(), p);
            });
            return;
        }
    }
    with_padded_head_dim(g.head_dim, [&]<int DP>() {
        if (dk.defined())
            launch_with_shared<mma::attention_backward_kv_kernel<E, DP>, mma::backward_kv_shared<E, DP>()>(
                key_blocks, mma::kThreads, ctx, q, k, v, dy, lse.data<float>(), delta.data<float>(), dk.data<E>(),
                dv.data<E>(), static_cast<float*>(nullptr), p);
        if (dq.defined())
            launch_with_shared<mma::attention_backward_q_kernel<E, DP>, mma::backward_q_shared<E, DP>()>(
                blocks_for((g.queries + mma::kTile - 1) / mma::kTile, g.slices()), mma::kThreads, ctx, q, k, v, dy,
                lse.data<float>(), delta.data<float>(), dq.data<E>(), p);
    });
}

template void launch_mma_forward<float>(std::span<const Tensor>, const AttentionGeometry&, Params, Tensor&, Tensor&,
                                        DeviceContext&);
template void launch_mma_forward<__nv_bfloat16>(std::span<const Tensor>, const AttentionGeometry&, Params, Tensor&,
                                                Tensor&, DeviceContext&);
template void launch_mma_forward<__half>(std::span<const Tensor>, const AttentionGeometry&, Params, Tensor&, Tensor&,
                                         DeviceContext&);
template void launch_mma_backward<float>(const BackwardArgs&, const AttentionGeometry&, Params, const Tensor&,
                                         const Tensor&, Tensor&, Tensor&, Tensor&, DeviceContext&);
template void launch_mma_backward<__nv_bfloat16>(const BackwardArgs&, const AttentionGeometry&, Params,
                                                 const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&,
                                                 DeviceContext&);
template void launch_mma_backward<__half>(const BackwardArgs&, const AttentionGeometry&, Params, const Tensor&,
                                          const Tensor&, Tensor&, Tensor&, Tensor&, DeviceContext&);

}  // namespace dyngrad::cuda::attention
