// Losses. CPU: ops/loss.cpp. GPU: ops/loss.cu. softmax and log_softmax: ops/elementwise.h (activations).
#pragma once
#include <source_location>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

// PyTorch's arguments of the same names. A target equal to ignore_index adds nothing to the loss, nor to
// the count (or weight sum) the mean divides by; any other target outside [0,C) throws IndexError.
struct CrossEntropyOptions {
    Reduction reduction = Reduction::Mean;
    std::int64_t ignore_index = -100;
    double label_smoothing = 0.0;  // in [0, 1]: the target is (1 - ε)·onehot + ε/C
};
struct NllLossOptions {
    Reduction reduction = Reduction::Mean;
    std::int64_t ignore_index = -100;
};

// logits (N,C), labels (N) int64; class_weight (C) where given (a constant: it gets no gradient). As PyTorch,
// also logits (N,C,d1,...,dk) with labels (N,d1,...,dk) (class axis 1; None gives (N,d1,...,dk)) and logits (C)
// with a 0-d label: each position is one row of the (N,C) op below (the same for nll_loss).
// Per row i (0 where labels_i == ignore_index), with w = class_weight (or 1) and lp = log_softmax(logits_i):
//   loss_i = (1 - ε)·(-w[labels_i]·lp[labels_i]) + (ε/C)·(-Σ_c w[c]·lp[c])
// Mean: Σ_i loss_i / Σ_{i not ignored} w[labels_i]; Sum: Σ_i loss_i; None: (N). Fused and stable.
Var cross_entropy(const Var& logits, const Var& labels, const CrossEntropyOptions& options = {},
                  std::source_location where = std::source_location::current());
Var cross_entropy(const Var& logits, const Var& labels, const Var& class_weight,
                  const CrossEntropyOptions& options = {}, std::source_location where = std::source_location::current());
// log_probs (N,C) (e.g. log_softmax), labels (N) int64; class_weight (C) where given (a constant).
//   loss_i = -w[labels_i]·log_probs[i, labels_i] (0 where ignored); Mean divides by Σ_{i not ignored} w[labels_i].
Var nll_loss(const Var& log_probs, const Var& labels, const NllLossOptions& options = {},
             std::source_location where = std::source_location::current());
Var nll_loss(const Var& log_probs, const Var& labels, const Var& class_weight, const NllLossOptions& options = {},
             std::source_location where = std::source_location::current());
// logits, target (the same shape); weight and pos_weight (constants; an undefined Var() for none) with a
// shape that is a suffix of the logits' (e.g. pos_weight (C) for logits (N,C)):
//   loss = weight · [(1 - target)·logits + (1 + (pos_weight - 1)·target) · softplus(-logits)]
// (= -weight·[pos_weight·target·log σ(logits) + (1 - target)·log(1 - σ(logits))], without overflow).
// Mean over all elements, Sum, or None (the logits' shape).
Var binary_cross_entropy_with_logits(const Var& logits, const Var& target, Reduction reduction = Reduction::Mean,
                                     std::source_location where = std::source_location::current());
Var binary_cross_entropy_with_logits(const Var& logits, const Var& target, const Var& weight, const Var& pos_weight,
                                     Reduction reduction = Reduction::Mean,
                                     std::source_location where = std::source_location::current());
// mean((prediction - target)^2) over all elements; shapes must match.
Var mse_loss(const Var& prediction, const Var& target, std::source_location where = std::source_location::current());
// |prediction - target|, reduced; shapes must match.
Var l1_loss(const Var& prediction, const Var& target, Reduction reduction = Reduction::Mean,
            std::source_location where = std::source_location::current());
// Huber-like, PyTorch's smooth_l1: d = prediction - target; 0.5·d²/beta where |d| < beta, else |d| - 0.5·beta
// (beta >= 0; beta = 0 is l1_loss). Reduced; shapes must match.
Var smooth_l1_loss(const Var& prediction, const Var& target, Reduction reduction = Reduction::Mean, double beta = 1.0,
                   std::source_location where = std::source_location::current());

// Eager: the same ops on Tensors, no graph and no gradient (graph/eager.h).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const CrossEntropyOptions& options = {},
                     std::source_location where = std::source_location::current());
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& class_weight,
                     const CrossEntropyOptions& options = {},
                     std::source_location where = std::source_location::current());
Tensor nll_loss(const Tensor& log_probs, const Tensor& labels, const NllLossOptions& options = {},
                std::source_location where = std::source_location::current());
Tensor nll_loss(const Tensor& log_probs, const Tensor& labels, const Tensor& class_weight,
                const NllLossOptions& options = {}, std::source_location where = std::source_location::current());
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean,
                                        std::source_location where = std::source_location::current());
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                        const Tensor& pos_weight, Reduction reduction = Reduction::Mean,
                                        std::source_location where = std::source_location::current());
Tensor mse_loss(const Tensor& prediction, const Tensor& target,
                std::source_location where = std::source_location::current());
Tensor l1_loss(const Tensor& prediction, const Tensor& target, Reduction reduction = Reduction::Mean,
               std::source_location where = std::source_location::current());
Tensor smooth_l1_loss(const Tensor& prediction, const Tensor& target, Reduction reduction = Reduction::Mean,
                      double beta = 1.0, std::source_location where = std::source_location::current());

}  // namespace dyngrad
