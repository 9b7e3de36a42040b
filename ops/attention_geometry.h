// Internal (ops/attention.cpp, ops/attention*.cu): scaled_dot_product_attention's sizes and options as both
// backends read them, resolved once from the inputs and attributes (the shape rule has checked them).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "dyngrad/graph/op_def.h"
#include "dyngrad/ops/attention.h"

namespace dyngrad {

struct AttentionGeometry {
    std::int64_t batch = 0, heads = 0, queries = 0, keys = 0, head_dim = 0;  // B, H, T, S, D
    double scale = 1.0;      // the resolved scale: attrs.attention_scale or 1/sqrt(D)
    bool causal = false;
    double dropout_p = 0.0;  // 0: no dropout
    std::uint64_t seed = 0;
    bool has_mask = false;
    // Element strides of the mask broadcast to (B,H,T,S): 0 along the axes it broadcasts over.
    std::array<std::int64_t, 4> mask_stride{0, 0, 0, 0};

    std::int64_t slices() const { return batch * heads; }
    // The dropout counter of probability (b,h,t,s): its flat index in (B,H,T,S); `slice` = b·H + h.
    std::uint64_t dropout_index(std::int64_t slice, std::int64_t t, std::int64_t s) const {
        return static_cast<std::uint64_t>((slice * queries + t) * keys + s);
    }
};

// inputs: q, k, v[, mask]
AttentionGeometry attention_geometry(std::span<const Tensor> inputs, const OpAttrs& attrs);
// qkv_attention's qkv (B,T,3·H·D): the geometry of its (B,H,T,D) operands (S = T, no mask).
AttentionGeometry qkv_attention_geometry(const Tensor& qkv, const OpAttrs& attrs);

// qkv_attention's layouts, moved by eager layout ops (a copy each) where a backend does not read them in place.
namespace qkv_layout {
std::array<Tensor, 3> unpack(const Tensor& qkv, std::int64_t heads);  // (B,T,3·H·D) -> q, k, v (B,H,T,D)
Tensor merge_heads(const Tensor& y);                                   // (B,H,T,D) -> (B,T,H·D)
Tensor split_heads(const Tensor& y, std::int64_t heads);               // (B,T,H·D) -> (B,H,T,D)
Tensor pack(const Tensor& dq, const Tensor& dk, const Tensor& dv);     // q, k, v (B,H,T,D) -> (B,T,3·H·D)
// qkv_attention by a backend's scaled_dot_product_attention kernels on the unpacked operands (its lse saved as
// that forward saves it): the CPU's path, and the GPU's where cuDNN does not read the packed layouts.
Tensor forward_through(const ForwardArgs& args, ForwardFn sdpa_forward);
std::vector<Tensor> backward_through(const BackwardArgs& args, BackwardFn sdpa_backward);
}  // namespace qkv_layout

namespace cuda {
// Whether the tensor-core kernels (ops/attention_mma.cu) were compiled for the current device's architecture.
bool attention_tensor_cores_compiled();
// attention_last_run() and attention_cudnn_status() of ops/attention.h (ops/attention_cudnn.cu).
AttentionRunInfo attention_last_run_record();
std::string attention_cudnn_status_line();
}  // namespace cuda

}  // namespace dyngrad
