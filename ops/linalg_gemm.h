// Internal (CUDA builds, ops/*.cu): the row-major cuBLAS GEMM of ops/linalg.cu, for the families that run GEMMs
// of their own on raw buffers (the fused LM-head loss, ops/loss.cu).
#pragma once
#include <cstdint>

#include "dyngrad/core/dtype.h"

namespace dyngrad::cuda {

struct DeviceContext;

// One row-major GEMM operand: `transposed` when the buffer holds op(X)ᵀ rather than op(X); `stride` is the
// distance in elements between consecutive matrices of a batch.
struct GemmOperand {
    const void* data;
    bool transposed;
    std::int64_t stride;
};

// Row-major c (m,n) = op(a) (m,k) · op(b) (k,n), plus c itself when `accumulate` ('=' otherwise), for `batch`
// matrices m·n apart in c; f32 (TF32 where allowed), f64, bf16/f16 with f32 accumulation; on ctx's stream.
void row_major_gemm(DeviceContext& ctx, DType dtype, const char* what, std::int64_t batch, std::int64_t m,
                    std::int64_t n, std::int64_t k, GemmOperand a, GemmOperand b, void* c, bool accumulate);

}  // namespace dyngrad::cuda
