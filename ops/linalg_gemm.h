// Internal (CUDA builds, ops/*.cu): the row-major cuBLAS GEMM of ops/linalg.cu, for the families that run GEMMs
// of their own on raw buffers (the fused LM-head loss, ops/loss.cu).
#pragma once
#include <cstdint>
#include <optional>

#include "dyngrad/core/dtype.h"

namespace dyngrad::cuda {

struct DeviceContext;

// One row-major GEMM operand: `transposed` when the buffer holds op(X)ᵀ rather than op(X); `stride` is the
// distance in elements between consecutive matrices of a batch; `row_stride` the distance between the stored
// buffer's rows (0: its number of columns, a dense matrix).
struct GemmOperand {
    const void* data;
    bool transposed;
    std::int64_t stride;
    std::int64_t row_stride = 0;
};

// Row-major c (m,n) = op(a) (m,k) · op(b) (k,n), plus c itself when `accumulate` ('=' otherwise), for `batch`
// matrices m·n apart in c; f32 (TF32 where allowed), f64, bf16/f16 with f32 accumulation; on ctx's stream.
// a and b are in `dtype`; c is too unless `c_dtype` says float32 for bf16/f16 operands: the f32 accumulator
// written (or, with `accumulate`, added to an f32 c) without rounding to 16 bits (DTypeError for other pairs).
// c's rows are `c_row_stride` elements apart (0: n). Row strides that are multiples of 8 elements let cuBLAS
// take its 16-byte-aligned kernels: GPT-2's 50257 classes as the dense stride gave sm75 "align1" kernels
// at a fifth of the speed (ncu, H200, 2026-11-29).
void row_major_gemm(DeviceContext& ctx, DType dtype, const char* what, std::int64_t batch, std::int64_t m,
                    std::int64_t n, std::int64_t k, GemmOperand a, GemmOperand b, void* c, bool accumulate,
                    std::optional<DType> c_dtype = std::nullopt, std::int64_t c_row_stride = 0);

}  // namespace dyngrad::cuda
