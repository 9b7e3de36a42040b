// Internal (CUDA translation units only): scaled_dot_product_attention on cuDNN's fused flash attention
// (ops/attention_cudnn.cu), for bfloat16/float16 where cuDNN takes the case; ops/attention.cu's launches call
// these first and run dyngrad's own kernels when they return false.
#pragma once
#include <span>

#include "dyngrad/cuda/context.h"
#include "dyngrad/ops/attention_geometry.h"

namespace dyngrad::cuda {

// q, k, v[, mask] -> y (B,H,T,D) and lse (f32 (B,H,T): m + log l of the scaled, masked scores, as the kernels
// save it) when cuDNN runs this case; false, with nothing written, when it does not (the reason is recorded for
// attention_last_run()). CudaError when cuDNN fails on a case it accepted.
bool cudnn_attention_forward(std::span<const Tensor> inputs, const AttentionGeometry& g, Tensor& y, Tensor& lse,
                             DeviceContext& ctx);

// dq, dk, dv from q, k, v, the forward's y and lse, and dy, when cuDNN runs this case (it computes all three: the
// undefined ones among dq, dk, dv are allocated); false, with nothing written, when it does not.
bool cudnn_attention_backward(std::span<const Tensor> inputs, const Tensor& y, const Tensor& dy,
                              const AttentionGeometry& g, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                              DeviceContext& ctx);

// qkv_attention's layouts: q, k, v read in place from qkv (B,T,3·H·D), y (B,T,H·D) written with its heads
// merged, and dqkv (B,T,3·H·D; allocated here when undefined) written packed; g describes the (B,H,T,D) operands.
// The same cases and contract as above.
bool cudnn_qkv_attention_forward(const Tensor& qkv, const AttentionGeometry& g, Tensor& y, Tensor& lse,
                                 DeviceContext& ctx);
bool cudnn_qkv_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy, const AttentionGeometry& g,
                                  const Tensor& lse, Tensor& dqkv, DeviceContext& ctx);

// Records which implementation ran a bf16/f16 attention call of this thread (attention_last_run()).
void record_attention_run(bool forward, bool on_cudnn, std::string reason);

}  // namespace dyngrad::cuda
