// Internal: every kernel entry point the op table (ops/op_table.cpp) and the engine dispatch to.
// CPU kernels (Eigen) live in ops/<family>.cpp, CUDA kernels in cuda/<family>.cu, with the same
// names in namespaces dyngrad::cpu and dyngrad::cuda. Contract: graph/op_def.h.
#pragma once
#include <span>

#include "dyngrad/graph/anomaly.h"
#include "dyngrad/graph/backend.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

// Shape rules' dtype check: DTypeError "<role> must be float32 or float64, got int64".
inline void require_float(const Tensor& t, const char* role) {
    if (!is_floating(t.dtype()))
        throw DTypeError(str(role, " must be float32 or float64, got ", dtype_name(t.dtype())));
}

// Shape/dtype rules (ops/<family>.cpp). They throw ShapeError/DTypeError with a short message; the
// engine adds the op, node and input descriptions.
namespace infer {
OutputSpec same_as_first(OpType, std::span<const Tensor>, const OpAttrs&);  // unary elementwise
OutputSpec broadcast(OpType, std::span<const Tensor>, const OpAttrs&);      // binary elementwise
OutputSpec matmul(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec linear(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec transpose(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec reshape(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec reduce_axes(OpType, std::span<const Tensor>, const OpAttrs&);  // sum, mean
OutputSpec reduce_axis(OpType, std::span<const Tensor>, const OpAttrs&);  // max
OutputSpec along_axis(OpType, std::span<const Tensor>, const OpAttrs&);   // softmax, log_softmax
OutputSpec cross_entropy(OpType, std::span<const Tensor>, const OpAttrs&);    // cross_entropy, nll_loss
OutputSpec bce_with_logits(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec pointwise_loss(OpType, std::span<const Tensor>, const OpAttrs&);   // l1_loss, smooth_l1_loss
OutputSpec mse_loss(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec conv2d(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec pool2d(OpType, std::span<const Tensor>, const OpAttrs&);      // max_pool2d, avg_pool2d
OutputSpec batch_norm(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec dropout(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec narrow(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec concat(OpType, std::span<const Tensor>, const OpAttrs&);
OutputSpec rnn(OpType, std::span<const Tensor>, const OpAttrs&);
}  // namespace infer

// Reshape is metadata only: the same functions serve every backend.
Tensor reshape_forward(const ForwardArgs& args);
std::vector<Tensor> reshape_backward(const BackwardArgs& args);

// A tensor seen around one axis as (outer, size, inner): narrow and concat move runs of `inner`
// contiguous elements (ops/layout.cpp).
struct AxisSplit {
    std::int64_t outer = 1, size = 1, inner = 1;
};
AxisSplit split_at_axis(const Shape& shape, int axis);

// Axes of `from` that must be summed to reach `to` under broadcasting (leading extra axes and
// axes where `to` has 1). Shared by the broadcast-gradient reductions of every backend.
std::vector<int> broadcast_reduction_axes(const Shape& from, const Shape& to);

// The same entry points per backend (keep the two lists identical).
namespace cpu {
Tensor unary_forward(const ForwardArgs&);
std::vector<Tensor> unary_backward(const BackwardArgs&);
Tensor binary_forward(const ForwardArgs&);
std::vector<Tensor> binary_backward(const BackwardArgs&);
Tensor matmul_forward(const ForwardArgs&);
std::vector<Tensor> matmul_backward(const BackwardArgs&);
Tensor linear_forward(const ForwardArgs&);
std::vector<Tensor> linear_backward(const BackwardArgs&);
Tensor transpose_forward(const ForwardArgs&);
std::vector<Tensor> transpose_backward(const BackwardArgs&);
Tensor reduce_forward(const ForwardArgs&); /* sum, mean */
std::vector<Tensor> reduce_backward(const BackwardArgs&);
Tensor max_forward(const ForwardArgs&);
std::vector<Tensor> max_backward(const BackwardArgs&);
Tensor softmax_forward(const ForwardArgs&); /* softmax, log_softmax */
std::vector<Tensor> softmax_backward(const BackwardArgs&);
Tensor cross_entropy_forward(const ForwardArgs&); /* cross_entropy, nll_loss */
std::vector<Tensor> cross_entropy_backward(const BackwardArgs&);
Tensor pointwise_loss_forward(const ForwardArgs&); /* bce_with_logits, l1_loss, smooth_l1_loss */
std::vector<Tensor> pointwise_loss_backward(const BackwardArgs&);
Tensor mse_loss_forward(const ForwardArgs&);
std::vector<Tensor> mse_loss_backward(const BackwardArgs&);
Tensor conv2d_forward(const ForwardArgs&);
std::vector<Tensor> conv2d_backward(const BackwardArgs&);
Tensor pool2d_forward(const ForwardArgs&); /* max_pool2d, avg_pool2d */
std::vector<Tensor> pool2d_backward(const BackwardArgs&);
Tensor batch_norm_forward(const ForwardArgs&);
std::vector<Tensor> batch_norm_backward(const BackwardArgs&);
Tensor dropout_forward(const ForwardArgs&);
std::vector<Tensor> dropout_backward(const BackwardArgs&);
Tensor narrow_forward(const ForwardArgs&);
std::vector<Tensor> narrow_backward(const BackwardArgs&);
Tensor concat_forward(const ForwardArgs&);
std::vector<Tensor> concat_backward(const BackwardArgs&);
Tensor rnn_forward(const ForwardArgs&);
std::vector<Tensor> rnn_backward(const BackwardArgs&);
// engine helpers: x summed over `axes` (kept as size 1); dst += src (same shape)
Tensor sum_over(const Tensor& x, std::span<const int> axes);
void accumulate_into(Tensor& dst, const Tensor& src);
// anomaly mode (graph/anomaly.h): min/max/NaN/Inf counts of any tensor (ops/tensor_stats.cpp)
TensorStats tensor_stats(const Tensor& x);
}  // namespace cpu

#if DYNGRAD_WITH_CUDA
namespace cuda {
Tensor unary_forward(const ForwardArgs&);
std::vector<Tensor> unary_backward(const BackwardArgs&);
Tensor binary_forward(const ForwardArgs&);
std::vector<Tensor> binary_backward(const BackwardArgs&);
Tensor matmul_forward(const ForwardArgs&);
std::vector<Tensor> matmul_backward(const BackwardArgs&);
Tensor linear_forward(const ForwardArgs&);
std::vector<Tensor> linear_backward(const BackwardArgs&);
Tensor transpose_forward(const ForwardArgs&);
std::vector<Tensor> transpose_backward(const BackwardArgs&);
Tensor reduce_forward(const ForwardArgs&); /* sum, mean */
std::vector<Tensor> reduce_backward(const BackwardArgs&);
Tensor max_forward(const ForwardArgs&);
std::vector<Tensor> max_backward(const BackwardArgs&);
Tensor softmax_forward(const ForwardArgs&); /* softmax, log_softmax */
std::vector<Tensor> softmax_backward(const BackwardArgs&);
Tensor cross_entropy_forward(const ForwardArgs&); /* cross_entropy, nll_loss */
std::vector<Tensor> cross_entropy_backward(const BackwardArgs&);
Tensor pointwise_loss_forward(const ForwardArgs&); /* bce_with_logits, l1_loss, smooth_l1_loss */
std::vector<Tensor> pointwise_loss_backward(const BackwardArgs&);
Tensor mse_loss_forward(const ForwardArgs&);
std::vector<Tensor> mse_loss_backward(const BackwardArgs&);
Tensor conv2d_forward(const ForwardArgs&);
std::vector<Tensor> conv2d_backward(const BackwardArgs&);
Tensor pool2d_forward(const ForwardArgs&); /* max_pool2d, avg_pool2d */
std::vector<Tensor> pool2d_backward(const BackwardArgs&);
Tensor batch_norm_forward(const ForwardArgs&);
std::vector<Tensor> batch_norm_backward(const BackwardArgs&);
Tensor dropout_forward(const ForwardArgs&);
std::vector<Tensor> dropout_backward(const BackwardArgs&);
Tensor narrow_forward(const ForwardArgs&);
std::vector<Tensor> narrow_backward(const BackwardArgs&);
Tensor concat_forward(const ForwardArgs&);
std::vector<Tensor> concat_backward(const BackwardArgs&);
Tensor rnn_forward(const ForwardArgs&);
std::vector<Tensor> rnn_backward(const BackwardArgs&);
// engine helpers: x summed over `axes` (kept as size 1); dst += src (same shape)
Tensor sum_over(const Tensor& x, std::span<const int> axes);
void accumulate_into(Tensor& dst, const Tensor& src);
// anomaly mode (graph/anomaly.h): min/max/NaN/Inf counts of any tensor, read back to the host (ops/tensor_stats.cu)
TensorStats tensor_stats(const Tensor& x);
}  // namespace cuda
#endif

// The backend dispatch of the engine's helpers (sum_to, accumulate_into) is declared in graph/backend.h.

}  // namespace dyngrad
