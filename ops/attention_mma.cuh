// Internal (ops/attention_mma.cu): the building blocks of the mma.sync attention kernels. Tile geometry and shared
// memory per element type, the operand fragments and the one MMA per element type (3xTF32 for float, m16n8k16 for
// bf16/f16), fragment loads from shared tiles, the products over a tile, cp.async tile copies and their streaming,
// and the stores of accumulators. Device code: include it from .cu files only.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda::attention {

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

}  // namespace mma

}  // namespace dyngrad::cuda::attention
