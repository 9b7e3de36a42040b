// Internal: every kernel entry point the op table (ops/op_table.cpp) and the engine dispatch to.
// CPU kernels (Eigen) live in ops/<family>.cpp, CUDA kernels in cuda/<family>.cu, with the same
// names in namespaces dyngrad::cpu and dyngrad::cuda. Contract: graph/op_def.h.
#pragma once
#include <span>

#include "dyngrad/graph/anomaly.h"
#include "dyngrad/graph/backend.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/ops/axis_geometry.h"
#include "dyngrad/ops/layout_geometry.h"
#include "dyngrad/ops/strided.h"

namespace dyngrad {

// Shape rules' dtype check: DTypeError "<role> must be float32 or float64, got int64".
inline void require_float(const Tensor& t, const char* role) {
    if (!is_floating(t.dtype()))
        throw DTypeError(str(role, " must be float32 or float64, got ", dtype_name(t.dtype())));
}
// An index or label operand: DTypeError "<role> must be int64, got float32".
inline void require_int64(const Tensor& t, const char* role) {
    if (t.dtype() != DType::i64) throw DTypeError(str(role, " must be int64, got ", dtype_name(t.dtype())));
}
// The operands' agreement: DTypeError "<role> is float64 but <reference_role> is float32".
inline void require_same_dtype(const Tensor& t, const char* role, const Tensor& reference, const char* reference_role) {
    if (t.dtype() != reference.dtype())
        throw DTypeError(str(role, " is ", dtype_name(t.dtype()), " but ", reference_role, " is ",
                             dtype_name(reference.dtype())));
}

// Calls fn.template operator()<Word>() with the unsigned word of an element size (2, 4 or 8 bytes): the kernels that
// move elements without computing on them take every dtype so (bf16/f16 as 2-byte words).
template <typename Fn>
void with_element_word(std::size_t element_size, Fn&& fn) {
    switch (element_size) {
        case 2: return fn.template operator()<std::uint16_t>();
        case 4: return fn.template operator()<std::uint32_t>();
        case 8: return fn.template operator()<std::uint64_t>();
        default: break;
    }
    throw DTypeError(str("elements of ", element_size, " bytes are not supported"));
}

// Shape/dtype rules (ops/<family>.cpp). They throw ShapeError/DTypeError with a short message; the
// engine adds the op, node and input descriptions.
namespace infer {
OutputSpec same_as_first(OpType, std::span<const Tensor>, const OpAttrs&);  // unary elementwise
OutputSpec cast(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec broadcast(OpType, std::span<const Tensor>, const OpAttrs&);      // binary elementwise
OutputSpec matmul(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec linear(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec transpose(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec reshape(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec reduce_axes(OpType, std::span<const Tensor>, const OpAttrs&);  // sum, mean
OutputSpec reduce_axis(OpType, std::span<const Tensor>, const OpAttrs&);  // max
OutputSpec arg_reduce(OpType, std::span<const Tensor>, const OpAttrs&);   // argmax, argmin (int64)
OutputSpec along_axis(OpType, std::span<const Tensor>, const OpAttrs&);   // softmax, log_softmax
OutputSpec cross_entropy(OpType, std::span<const Tensor>, const OpAttrs&);    // cross_entropy, nll_loss
OutputSpec linear_cross_entropy(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec bce_with_logits(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec pointwise_loss(OpType, std::span<const Tensor>, const OpAttrs&);   // l1_loss, smooth_l1_loss
OutputSpec mse_loss(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec conv2d(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec pool2d(OpType, std::span<const Tensor>, const OpAttrs&);      // max_pool2d, avg_pool2d
OutputSpec batch_norm(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec dropout(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec row_norm(OpType, std::span<const Tensor>, const OpAttrs&);  // layer_norm, rms_norm
OutputSpec scaled_dot_product_attention(OpType, std::span<const Tensor>, const OpAttrs&);  // ops/attention.cpp
OutputSpec qkv_attention(OpType, std::span<const Tensor>, const OpAttrs&);                 // ops/attention.cpp
OutputSpec gelu_mlp(OpType, std::span<const Tensor>, const OpAttrs&);                      // ops/gelu_mlp.cpp
OutputSpec narrow(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec concat(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec permute(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec expand(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec embedding(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec gather(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec index_select(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec scatter_add(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec where(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec masked_fill(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec rnn(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec cumsum(OpType, std::span<const Tensor>, const OpAttrs&);        // ops/sampling.cpp
OutputSpec sort_indices(OpType, std::span<const Tensor>, const OpAttrs&);  // argsort, topk_indices (int64)
OutputSpec multinomial(OpType, std::span<const Tensor>, const OpAttrs&);
}  // namespace infer

// Reshape is metadata only: the same functions serve every backend.
Tensor reshape_forward(const ForwardArgs& args);
std::vector<Tensor> reshape_backward(const BackwardArgs& args);

// cast: Tensor::to(DType) on every backend (core/half.h's rounding on the CPU, one conversion kernel on a GPU),
// for every floating dtype natively; the backward converts dy back to x's dtype.
Tensor cast_forward(const ForwardArgs& args);
std::vector<Tensor> cast_backward(const BackwardArgs& args);

// argmax, argmin: every backend, through the max op's kernels (ops/reduce.cpp).
Tensor arg_reduce_forward(const ForwardArgs& args);
// logsumexp: every backend, through its max, sum and elementwise kernels (ops/reduce.cpp).
Tensor logsumexp_forward(const ForwardArgs& args);
std::vector<Tensor> logsumexp_backward(const BackwardArgs& args);

// permute and expand: strided copies (strided_copy) on the inputs' backend. expand's backward returns dy (y's
// shape); the engine sums it to x's shape. Every backend.
Tensor permute_forward(const ForwardArgs& args);
std::vector<Tensor> permute_backward(const BackwardArgs& args);
Tensor expand_forward(const ForwardArgs& args);
std::vector<Tensor> expand_backward(const BackwardArgs& args);
// transpose: one swap of two axes (swap_axes) on the inputs' backend, forward and backward. Every backend.
Tensor transpose_forward(const ForwardArgs& args);
std::vector<Tensor> transpose_backward(const BackwardArgs& args);
// narrow and concat: row copies (ops/layout_geometry.h) on the inputs' backend. Every backend.
Tensor narrow_forward(const ForwardArgs& args);
std::vector<Tensor> narrow_backward(const BackwardArgs& args);
Tensor concat_forward(const ForwardArgs& args);
std::vector<Tensor> concat_backward(const BackwardArgs& args);
// `op`'s forward kernel of inputs[0]'s backend, run directly (no checks, nothing saved): for a backward that is
// another (or its own) op's forward (ops/op_table.cpp).
Tensor backend_forward(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs, const OutputSpec& out);
// gelu_mlp as linear's and gelu's kernels of the inputs' backend in turn (ops/gelu_mlp.cpp): the CPU's, and the
// GPU's where cuBLASLt's epilogues do not apply. Saves pre = x·w1ᵀ + b1 and h = gelu(pre).
Tensor gelu_mlp_unfused_forward(const ForwardArgs& args);
std::vector<Tensor> gelu_mlp_unfused_backward(const BackwardArgs& args);
// dropout's backward: dropout's forward on dy with the node's seed (ops/dropout.cpp). Every backend.
std::vector<Tensor> dropout_backward(const BackwardArgs& args);
// embedding and index_select: row copies and additions (select_rows, add_selected_rows) on the inputs' backend.
// Every backend (ops/indexing.cpp).
Tensor embedding_forward(const ForwardArgs& args);
std::vector<Tensor> embedding_backward(const BackwardArgs& args);
Tensor index_select_forward(const ForwardArgs& args);
std::vector<Tensor> index_select_backward(const BackwardArgs& args);

// softmax / log_softmax around their axis (ops/elementwise.cpp), shared by both backends. The backward's dx is
// allocated like x, undefined when x needs no gradient; nothing to compute when it is undefined or empty.
struct SoftmaxGeometry {
    AxisSplit split;
    bool log = false;  // log_softmax
};
SoftmaxGeometry softmax_geometry(OpType op, const Shape& x, std::int64_t axis);
struct SoftmaxBackward {
    SoftmaxGeometry geometry;
    Tensor dx;
    bool nothing_to_compute() const { return !dx.defined() || dx.numel() == 0; }
};
SoftmaxBackward softmax_backward_setup(const BackwardArgs& args);

// Indexing geometry (ops/indexing.cpp), shared by both backends. gather and scatter_add read index-shaped
// operands: `element` walks the index's shape with the strides of the indexed tensor (0 along `axis`, where
// the index supplies the coordinate), and `axis_stride` is that tensor's stride along `axis`.
struct IndexedWalk {
    StridedWalk<1> element;
    std::int64_t axis_stride = 1;
    std::int64_t axis_size = 1;  // valid indices: [0, axis_size)
};
IndexedWalk indexed_walk(const Shape& indexed, const Shape& index, int axis);
// gather and scatter_add: element copies and additions (gather_elements, add_elements) on the inputs' backend;
// scatter_add's backward is gather's forward on dy. Every backend.
Tensor gather_forward(const ForwardArgs& args);
std::vector<Tensor> gather_backward(const BackwardArgs& args);
Tensor scatter_add_forward(const ForwardArgs& args);
std::vector<Tensor> scatter_add_backward(const BackwardArgs& args);

// Sorting and sampling (ops/sampling.cpp), shared by both backends: x seen around `axis` (a rank-0 x as one line
// of one element), and the words for a multinomial row's problem (math::WeightProblem, ops/sampling_math.h).
AxisSplit sampling_split(const Tensor& x, std::int64_t axis);
// cumsum and argsort/topk_indices: running_sums and sort_lines on the input's backend. Every backend.
Tensor cumsum_forward(const ForwardArgs& args);
std::vector<Tensor> cumsum_backward(const BackwardArgs& args);
Tensor sort_indices_forward(const ForwardArgs& args);
struct WeightRows {  // multinomial's probs, (C) or (N, C), as rows of categories
    std::int64_t rows = 1, categories = 1;
};
WeightRows weight_rows(const Tensor& probs);
const char* weight_problem_text(int problem);

// Axes of `from` that must be summed to reach `to` under broadcasting (leading extra axes and
// axes where `to` has 1). Shared by the broadcast-gradient reductions of every backend.
std::vector<int> broadcast_reduction_axes(const Shape& from, const Shape& to);

// The unfused compositions of the fused ops (ops/unfused.cpp), named by their rows (OpDef::unfused).
namespace unfused {
extern const UnfusedComposition linear, conv2d, cross_entropy, linear_cross_entropy, qkv_attention, gelu_mlp;
}  // namespace unfused

// The same entry points per backend, written once (ops/kernel_entry_points.inc).
namespace cpu {
#include "dyngrad/ops/kernel_entry_points.inc"
}  // namespace cpu

#if DYNGRAD_WITH_CUDA
namespace cuda {
#include "dyngrad/ops/kernel_entry_points.inc"
// gelu_mlp with cuBLASLt's GELU epilogues where they apply, else gelu_mlp_unfused_forward/backward (ops/linalg.cu).
Tensor gelu_mlp_forward(const ForwardArgs& args);
std::vector<Tensor> gelu_mlp_backward(const BackwardArgs& args);
// DropoutSeeds::next on a GPU (ops/dropout.h): ++counter and out = the draw's seed, one kernel.
void next_dropout_seed(Tensor& counter, std::uint64_t seed, Tensor& out);
// A DropoutSeeds draw fused into the dropout forward kernel (the Dropout layer's path, ops/dropout.cpp): while
// a FusedSeedDraw is alive on this thread, the first dropout forward kernel whose seed input is `slot` draws
// the seed itself (every block from *counter + 1; its last block stores the advanced counter and the seed in
// `slot`, which the node keeps as its seed input for the backward and the CPU replay). No launch of its own.
struct FusedSeedDraw {
    std::int64_t* counter;
    std::uint64_t stream_seed;
    std::int64_t* slot;
    bool consumed = false;  // set by the kernel launch that took it
};
// Installs `draw` for this thread's next dropout forward (null: none); returns the previous one.
FusedSeedDraw* set_fused_seed_draw(FusedSeedDraw* draw);
// A dropout node whose kernel does not run (a member of a fused group, graph/fusion_replay.h) with `slot` as its
// seed input: when this thread's pending draw writes `slot`, draws it now with the one-thread kernel (consumed),
// so the seed is in `slot` before the group's kernel reads it, in the order the unfused kernels draw. Returns
// whether it drew.
bool draw_pending_seed(const Tensor& slot);
}  // namespace cuda
#endif

// `call`, a primitive both backends declare (ops/kernel_entry_points.inc), on `tensor`'s backend: what the ops
// written once for every backend (transpose, narrow, embedding, …) are made of.
#if DYNGRAD_WITH_CUDA
#define DG_ON_BACKEND_OF(tensor, call) ((tensor).device().is_cuda() ? cuda::call : cpu::call)
#else
#define DG_ON_BACKEND_OF(tensor, call) cpu::call
#endif

// The backend dispatch of the engine's helpers (sum_to, accumulate_into) is declared in graph/backend.h.

}  // namespace dyngrad
