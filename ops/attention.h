// Attention: scaled_dot_product_attention, as PyTorch's F.scaled_dot_product_attention. CPU: ops/attention.cpp
// (Eigen, the reference). GPU: ops/attention.cu picks among fused flash-attention kernels (tiled, online softmax,
// no T×S matrix in memory, backward by recomputation): ops/attention_mma.cu, ops/attention_simt.cu, and cuDNN's
// (ops/attention_cudnn.cu); its header comment and docs/ops.md give the selection policy.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>
#include <string>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

struct AttentionOptions {
    bool is_causal = false;        // key s takes part only when s <= t (top-left aligned, as PyTorch is_causal)
    double dropout_p = 0.0;        // dropout on the attention probabilities (training); in [0, 1)
    std::optional<double> scale = std::nullopt;  // default 1/sqrt(D); must be finite
    std::uint64_t seed = 0;        // dropout seed; masks are a pure function of (seed, b, h, t, s)
};

// The largest head dimension D the GPU kernel takes (the CPU takes any D >= 1).
inline constexpr std::int64_t kAttentionMaxGpuHeadDim = 128;

// Which GPU kernels run float32 attention (process-wide): tensor cores (3xTF32 mma.sync: each operand split into a
// TF32 part and a TF32 residual, three MMAs per product, ~float32 accuracy; the default on compute capability 8.0
// and newer) or the SIMT kernels (exact float32 FMA; float64 and devices before 8.0 always use them). A debugging
// override, for comparing the paths (the default is the selection policy of ops/attention.cu and docs/ops.md): the
// environment variable DYNGRAD_ATTENTION_SIMT=1 selects simt at start; set_attention_gpu_path overrides it.
enum class AttentionGpuPath { tensor_cores, simt };
void set_attention_gpu_path(AttentionGpuPath path);
AttentionGpuPath attention_gpu_path();
// Whether float32 attention on the GPU runs on tensor cores now: the path is tensor_cores and this build's
// kernels target the device's architecture (8.0+). False in a build without CUDA.
bool attention_uses_tensor_cores();

// bfloat16/float16 attention on the GPU runs on cuDNN's fused flash attention (its backend graph API; a plan per
// shape, built on the first call and cached) where cuDNN takes the case: no dropout (cuDNN's masks are not the
// ones the CPU replays), no keep mask, D a multiple of 8 up to 128, compute capability 8.0+, 16-byte aligned
// operands, and an engine of cuDNN finalizing for the shape (in deterministic mode, cuda::set_deterministic, only
// an engine without cuDNN's nondeterministic note). Elsewhere dyngrad's own kernels run. Both save the same
// log-sum-exp (f32), so a forward on one and a backward on the other agree. On by default; as a debugging override
// the environment variable DYNGRAD_ATTENTION_CUDNN=0 disables it at start, set_attention_cudnn overrides
// (process-wide).
void set_attention_cudnn(bool enabled);
bool attention_cudnn_enabled();
// Which implementation ran this thread's last bf16/f16 GPU attention forward and backward (none: no such call
// yet), and why cuDNN did not when the kernels ran (the precondition that failed, or cuDNN's refusal of the
// shape, which is remembered per shape). For tests and benchmarks; a build without CUDA always says none.
enum class AttentionImpl { none, cudnn, kernels };
struct AttentionRunInfo {
    AttentionImpl forward = AttentionImpl::none, backward = AttentionImpl::none;
    std::string forward_reason, backward_reason;
};
AttentionRunInfo attention_last_run();
// One line on cuDNN attention in this process: the cuDNN version and whether it is enabled.
std::string attention_cudnn_status();

// q (B,H,T,D), k (B,H,S,D), v (B,H,S,D) -> (B,H,T,D), one dtype, one device. float32 or float64; on the GPU also
// bfloat16 and float16, natively (16-bit tensor-core products, softmax and accumulation in f32; on the CPU those
// run through f32):
//   y = dropout(softmax(q·kᵀ·scale + bias)) · v      along s, per (b, h, t)
// bias is 0 where key s takes part in query t and −inf where it does not (is_causal, mask). A query whose keys
// all drop out this way gets y = 0 and no gradient (PyTorch does the same).
// Dropout (dropout_p > 0; the caller passes 0 outside training, as with PyTorch) zeroes probability (b,h,t,s)
// when math::dropout_keep(seed, ((b·H + h)·T + t)·S + s, p) says so (ops/dropout_mask.h) and scales the rest by
// 1/(1 − p): every backend drops the same elements, and the backward recomputes the mask.
// mask: a keep mask, broadcastable to (B,H,T,S), in q's dtype, every value 0 or 1 (ValueError otherwise; on the
// GPU raised at the next synchronisation): 1 = key s takes part in query t (PyTorch's bool attn_mask, True),
// 0 = it does not. A PyTorch additive float mask (0 / −inf) must be converted: keep = (additive == 0).
// The output is flat in the mask: it gets a zero gradient.
// One front door over Var (recorded) and Tensor (eager: no gradient); graph/front_door.h. A mask given undefined is
// the engine's error, as any undefined input (the form without a mask is the one for none).
namespace detail {
inline OpAttrs attention_attrs(const AttentionOptions& options) {
    return op_attrs(&OpAttrs::scalar, options.dropout_p, &OpAttrs::seed, options.seed, &OpAttrs::is_causal,
                    options.is_causal, &OpAttrs::attention_scale, options.scale);
}
}  // namespace detail
template <Operand T>
T scaled_dot_product_attention(const T& q, const T& k, const T& v, const T& mask, const AttentionOptions& options = {},
                               Loc where = Loc::current()) {
    const OpAttrs attrs = detail::attention_attrs(options);
    if (!mask.defined()) return apply_exact(OpType::ScaledDotProductAttention, {q, k, v, mask}, attrs, where);
    return apply_op(OpType::ScaledDotProductAttention, {q, k, v, mask}, attrs, where);
}
template <Operand T>
T scaled_dot_product_attention(const T& q, const T& k, const T& v, const AttentionOptions& options = {},
                               Loc where = Loc::current()) {
    return apply_op(OpType::ScaledDotProductAttention, {q, k, v}, detail::attention_attrs(options), where);
}

// Self-attention over a packed projection, as a transformer block computes it: qkv (B,T,3·E) holds, per position,
// q, k and v of every head ((3, H, D) in its last axis, E = H·D; nn.MultiheadAttention's in_proj order), and the
// heads' outputs come back merged, (B,T,E):
//   q, k, v = qkv.view(B,T,3,H,D).permute(2,0,3,1,4);  y = sdpa(q, k, v).transpose(1,2).reshape(B,T,E)
// with scaled_dot_product_attention's options and semantics (no mask; dropout masks over the (B,H,T,T) index).
// Why an op of its own: on cuDNN (bf16/f16, the cases scaled_dot_product_attention runs there) the kernels read
// q, k, v in place and write y and dqkv in their packed layouts, where the composition copies q, k, v into
// (B,H,T,D) and back, y out of it, and their gradients the same way (llm.c's layout). Elsewhere it runs that
// composition's kernels.
template <Operand T>
T qkv_attention(const T& qkv, std::int64_t num_heads, const AttentionOptions& options = {}, Loc where = Loc::current()) {
    OpAttrs attrs = detail::attention_attrs(options);
    attrs.num_heads = num_heads;
    return apply_op(OpType::QkvAttention, {qkv}, attrs, where);
}

}  // namespace dyngrad
