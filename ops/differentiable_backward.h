// The differentiable backwards of the op families (graph/higher_order.h): each op's derivative written with the
// op functions over Var, defined beside its first-order backward in ops/<family>.cpp and referenced from its row
// (OpDef::differentiable_backward). Masks of piecewise-constant derivatives (relu, clamp, max, the selections)
// are constants of the graph: their derivative is 0 wherever it exists.
#pragma once
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/higher_order.h"

namespace dyngrad {

// ops/elementwise.cpp: every unary op and activation, clamp, cast; every binary op; softmax, log_softmax
std::vector<Var> unary_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> binary_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> softmax_differentiable_backward(const DiffBackwardArgs& args);
// ops/linalg.cpp: matmul, linear (with its fused ReLU), transpose, reshape
std::vector<Var> matmul_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> linear_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> transpose_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> reshape_differentiable_backward(const DiffBackwardArgs& args);
// ops/reduce.cpp: sum, mean, max
std::vector<Var> reduce_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> max_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> logsumexp_differentiable_backward(const DiffBackwardArgs& args);
// ops/layout.cpp: narrow, concat, permute, expand
std::vector<Var> narrow_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> concat_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> permute_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> expand_differentiable_backward(const DiffBackwardArgs& args);
// ops/indexing.cpp: embedding, gather, index_select, scatter_add, where, masked_fill
std::vector<Var> embedding_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> gather_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> index_select_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> scatter_add_differentiable_backward(const DiffBackwardArgs& args);
std::vector<Var> select_differentiable_backward(const DiffBackwardArgs& args);
// ops/loss.cpp: every loss, as the composition of its formula
Var loss_composition(OpType op, std::span<const Var> in, const OpAttrs& attrs);
// ops/norm.cpp: layer_norm, rms_norm, batch_norm (training and eval), as compositions
Var norm_composition(OpType op, std::span<const Var> in, const OpAttrs& attrs);
// ops/attention.cpp: scaled_dot_product_attention's math composition (masks and dropout as constants)
Var attention_composition(std::span<const Var> in, const OpAttrs& attrs);
// The fused ops whose unfused composition is their math (OpDef::unfused): qkv_attention (the layout ops around
// scaled_dot_product_attention), gelu_mlp (linear, gelu, linear), linear_cross_entropy (linear, narrow,
// cross_entropy) through that composition.
template <const UnfusedComposition& unfused>
std::vector<Var> unfused_differentiable_backward(const DiffBackwardArgs& args) {
    return differentiate_composition(args, [&](std::span<const Var> in) { return unfused.compose(in, args.attrs); });
}
// The ops written as a composition declared here (attention, conv2d, rnn; the losses, norms and pools, whose
// compositions also take the op): `compose` differentiated.
template <auto compose>
std::vector<Var> composition_differentiable_backward(const DiffBackwardArgs& args) {
    return differentiate_composition(args, [&](std::span<const Var> in) {
        if constexpr (std::is_invocable_v<decltype(compose), OpType, std::span<const Var>, const OpAttrs&>)
            return compose(args.op, in, args.attrs);
        else
            return compose(in, args.attrs);
    });
}
// ops/pool.cpp: max_pool2d, avg_pool2d as compositions (index_select of the windows, then max / a masked mean)
Var pool_composition(OpType op, std::span<const Var> in, const OpAttrs& attrs);
// ops/conv.cpp: conv2d as a composition (the windows, then one batched matmul per group, bias, ReLU)
Var conv2d_composition(std::span<const Var> in, const OpAttrs& attrs);
// ops/pool.cpp, shared by the pooling and convolution compositions: x (N,C,H,W) -> its windows (N,C,P,Q,kh·kw), as
// recorded ops; inside (P,Q,kh·kw) is 1 where a window slot lies in the input, 0 in the padding.
Var sliding_windows(const Var& x, std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride,
                    std::array<std::int64_t, 2> padding, std::array<std::int64_t, 2> dilation,
                    std::vector<double>& inside);
// ops/sampling.cpp: cumsum (sort, topk and multinomial give indices, not differentiable)
std::vector<Var> cumsum_differentiable_backward(const DiffBackwardArgs& args);
// ops/rnn.cpp: lstm, gru, rnn_tanh, rnn_relu as compositions (the recurrence unrolled over the time steps)
Var rnn_composition(std::span<const Var> in, const OpAttrs& attrs);
// ops/dropout.cpp: the same mask applied to the output gradient
std::vector<Var> dropout_differentiable_backward(const DiffBackwardArgs& args);

// A constant of `like`'s graph holding `value` (a mask, a zero block): no gradient flows into it.
inline Var constant_of(const Var& like, const Tensor& value) { return like.graph().constant(value); }

}  // namespace dyngrad
