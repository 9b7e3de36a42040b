// linear_cross_entropy: an LM head and its cross-entropy in one op, computed in chunks of rows so the (N, V) logits
// are never materialised. CPU kernels: ops/linear_cross_entropy.cpp; GPU: ops/linear_cross_entropy.cu.
#pragma once
#include <cstdint>
#include <source_location>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// PyTorch's arguments of the same names, plus `classes`: the number of real classes, the rows [0, classes) of the
// weight; rows from `classes` on (a padded vocabulary, GPTConfig::padded_vocab_size) never enter the softmax and
// get a zero gradient. 0: every row of the weight.
struct LinearCrossEntropyOptions {
    Reduction reduction = Reduction::Mean;
    std::int64_t ignore_index = -100;
    double label_smoothing = 0.0;  // in [0, 1], as cross_entropy's
    std::int64_t classes = 0;
};

// x (*, E), weight (V_padded, E), labels (*) int64 (x's shape without its last axis) -> loss () (Mean, Sum) or
// the labels' shape (None). Exactly PyTorch's
//   F.cross_entropy(F.linear(x, weight[:classes]), labels, ignore_index=..., reduction=..., label_smoothing=...)
// (the row's `length` attribute is `classes`). Labels outside [0, classes) other than ignore_index: IndexError.
//
// The forward computes the loss in chunks of rows: per chunk the logits x_c·Wᵀ go into a workspace of at most
// chunk·V elements, and where the gradient is wanted (save_for_backward, set from grad_enabled() and whether x or
// the weight requires grad) that workspace is overwritten with dlogits = softmax − target and dx_c = dlogits·W,
// dW += dlogitsᵀ·x_c are computed at once: the backward of a Mean or Sum loss only scales the saved dx and dW by
// the upstream scalar. That is why the gradients are computed in the forward: the logits of a chunk are then
// produced and consumed while they are in the workspace, never written out for a later pass (Liger-Kernel's and
// Cut Cross-Entropy's trick). A None reduction (per-row upstream gradients) recomputes the chunks in its backward.
// Memory: O(chunk·V) workspace plus dx and dW. create_graph differentiates linear + narrow + cross_entropy.
template <Operand T>
T linear_cross_entropy(const T& x, const T& weight, const T& labels, const LinearCrossEntropyOptions& options = {},
                       std::source_location where = std::source_location::current());

namespace detail {
// The chunk budget in logits elements per chunk (rows per chunk = max(1, budget / classes)); 0 restores each
// backend's default. Returns the previous setting. For tests that exercise chunk boundaries on small inputs.
std::int64_t set_linear_cross_entropy_chunk_elements(std::int64_t elements);
// Rows per chunk for `rows` rows of `classes` classes under the setting above or `backend_default`.
std::int64_t linear_cross_entropy_chunk_rows(std::int64_t rows, std::int64_t classes, std::int64_t backend_default);
}  // namespace detail

}  // namespace dyngrad
