// Internal (the CUDA translation units of attention only): the launchers that the dispatch (ops/attention.cu)
// calls, one set per kernel family, and the parameters every kernel reads. SIMT kernels: ops/attention_simt.cu;
// mma.sync kernels: ops/attention_mma.cu; cuDNN: ops/attention_cudnn.h. Which launcher runs when: the header of
// ops/attention.cu.
#pragma once
#include <cstdint>
#include <span>

#include "dyngrad/cuda/context.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/ops/attention_geometry.h"

namespace dyngrad::cuda::attention {

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

// ---- ops/attention_simt.cu ----
// A mask value other than 0 or 1 is reported (ValueError at the next synchronisation), as the CPU throws.
void check_mask(const Tensor& mask, DeviceContext& ctx);
// delta (B·H·T, acc_t<T>: f32 for bf16/f16) = rowsum(dy ∘ y), the backward's pre-pass; T float, double,
// __nv_bfloat16 or __half.
template <typename T>
void launch_delta(const Tensor& dy, const Tensor& y, Tensor& delta, const AttentionGeometry& g, DeviceContext& ctx);
// The SIMT kernels (exact FMA), Real float or double: y and lse (Real); dk, dv (when dk is defined) and dq (when
// defined) from delta (deterministic: no atomics).
template <typename Real>
void launch_simt_forward(std::span<const Tensor> inputs, const AttentionGeometry& g, const Params& p, Tensor& y,
                         Tensor& lse, DeviceContext& ctx);
template <typename Real>
void launch_simt_backward(const BackwardArgs& args, const AttentionGeometry& g, const Params& p, const Tensor& lse,
                          const Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext& ctx);

// ---- ops/attention_mma.cu ----
// Whether the mma.sync kernels were compiled for this device's architecture (8.0 and newer; below it they are
// empty). Checked once per process: every device dyngrad runs on is the same build target.
bool mma_compiled();
// The mma.sync kernels, E float (3xTF32), __nv_bfloat16 or __half: y (E) and lse (f32); dq (when defined) and
// dk, dv (when dk is defined) from lse and delta (f32). f32 with dq and dk wanted outside deterministic mode: one
// fused kernel adds dq with float atomics; otherwise the deterministic pair of kernels.
template <typename E>
void launch_mma_forward(std::span<const Tensor> inputs, const AttentionGeometry& g, Params p, Tensor& y, Tensor& lse,
                        DeviceContext& ctx);
template <typename E>
void launch_mma_backward(const BackwardArgs& args, const AttentionGeometry& g, Params p, const Tensor& lse,
                         const Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext& ctx);

}  // namespace dyngrad::cuda::attention
