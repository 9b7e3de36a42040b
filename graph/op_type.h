// OpType: the tag every ComputeNode carries. Each value has exactly one row in the op table
// (ops/op_table.cpp), which static_asserts that rows and tags line up.
#pragma once
#include <cstdint>

namespace dyngrad {

// The plain unary elementwise ops (one operand, no attribute), X(name, Tag): each is its tag here (in this
// order, at the end of the unary group), its front door `name(x)` (ops/elementwise.h) and its functor TagOp's case
// in math::visit_unary (ops/elementwise_math.h). A new one is a line here, its row (ops/op_table.cpp, in the same
// order), its functor and formula (ops/elementwise_math.h) and its derivative (ops/elementwise.cpp).
#define DG_PLAIN_UNARY_OPS(X)                                                                        \
    X(neg, Neg) X(exp, Exp) X(log, Log) X(sqrt, Sqrt) X(abs, Abs) X(sin, Sin) X(cos, Cos)              \
    X(relu, Relu) X(sigmoid, Sigmoid) X(tanh, Tanh) X(softplus, Softplus)                              \
    X(silu, Silu)                /* x·σ(x) (swish) */                                                 \
    X(log_sigmoid, LogSigmoid)   /* log σ(x), without overflow or cancellation for any |x| */          \
    X(softsign, Softsign)        /* x / (1 + |x|) */

enum class OpType : std::uint16_t {
    Leaf,  // inputs, parameters and constants: no forward, no backward
    // binary elementwise with NumPy broadcasting (ops/elementwise)
    Add, Sub, Mul, Div,
    Minimum, Maximum,
    // comparisons with NumPy broadcasting (ops/elementwise): 1 where true, 0 where false, in the inputs' dtype;
    // not differentiable (OpDef::differentiable)
    Eq, Ne, Lt, Le, Gt, Ge,
    // unary elementwise with an attribute (ops/elementwise): the scalar operand in OpAttrs::scalar, clamp's bounds
    AddScalar, MulScalar, PowScalar, Clamp,
    // conversion to another floating dtype (OpAttrs::dtype), elementwise; the gradient goes back to x's dtype
    Cast,
    // activations with an attribute (ops/elementwise)
    LeakyRelu, Elu, ClippedRelu, Gelu,
    // the plain unary ops, math functions and activations (DG_PLAIN_UNARY_OPS above)
#define DG_PLAIN_UNARY_TAG(name, tag) tag,
    DG_PLAIN_UNARY_OPS(DG_PLAIN_UNARY_TAG)
#undef DG_PLAIN_UNARY_TAG
    // the activations along an axis, normalised exponentials (ops/elementwise)
    Softmax, LogSoftmax,
    // linear algebra and layout (ops/linalg)
    Matmul, Linear, Transpose, Reshape,
    // reductions (ops/reduce)
    Sum, Mean, Max,
    // log Σ exp over axes, without overflow (ops/reduce)
    LogSumExp,
    // the int64 index of the first maximum / minimum along one axis (ops/reduce); not differentiable
    ArgMax, ArgMin,
    // losses (ops/loss)
    CrossEntropy, MseLoss, NllLoss, BceWithLogits, L1Loss, SmoothL1Loss,
    // the LM head and cross_entropy fused in row chunks, no (N,V) logits (ops/linear_cross_entropy)
    LinearCrossEntropy,
    // convolution and pooling, NCHW (ops/conv, ops/pool)
    Conv2d, MaxPool2d, AvgPool2d,
    // normalisation (ops/norm)
    BatchNorm,
    LayerNorm, RmsNorm,
    // regularisation (ops/dropout)
    Dropout,
    // user-defined ops registered at run time (graph/custom_op.h); OpAttrs::custom_id picks one
    Custom,
    // (Narrow, Concat and Rnn were appended after Custom when the tests seeded by table index; they now
    // seed by op name (seed_for_name, graph/gradcheck.h), so a new tag goes with its family.)
    // layout (ops/layout): a slice along one axis, and the joining of several tensors along one axis;
    // an axis permutation, and a broadcast to a larger shape
    Narrow, Concat, Permute, Expand,
    // indexing (ops/indexing): rows by index (embedding, index_select), elements by index along an axis
    // (gather, scatter_add), selection by a 0/1 condition (where, masked_fill)
    Embedding, Gather, IndexSelect, ScatterAdd, Where, MaskedFill,
    // attention (ops/attention): softmax(q·kᵀ·scale, masked) · v with optional dropout, fused on the GPU; the same
    // self-attention over a packed (B,T,3·E) projection, heads merged into (B,T,E) (no layout copies on cuDNN)
    ScaledDotProductAttention, QkvAttention,
    // the transformer's MLP in one op, linear(gelu(linear(x))) (ops/linalg.h): GELU in cuBLASLt's GEMM epilogues
    GeluMlp,
    // recurrent networks, cuDNN's four cell modes (ops/rnn)
    Rnn,
    // sorting and sampling (ops/sampling): the running sum along an axis (differentiable); the int64 indices that
    // sort an axis (stable), those of its k largest / smallest entries, and int64 draws from rows of weights (these
    // three not differentiable: sort's and topk's values are gathers at the indices, their gradients gather's)
    Cumsum, ArgSort, TopKIndices, Multinomial,
    Count_  // number of tags; keep last
};

constexpr std::size_t kOpTypeCount = static_cast<std::size_t>(OpType::Count_);

}  // namespace dyngrad
