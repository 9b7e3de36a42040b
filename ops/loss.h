// Losses. CPU: ops/loss.cpp. GPU: ops/loss.cu. softmax and log_softmax: ops/elementwise.h (activations).
#pragma once
#include <source_location>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

namespace detail {
inline OpAttrs reduction_attrs(Reduction reduction, double beta = 0.0) {
    OpAttrs attrs;
    attrs.reduction = reduction;
    attrs.scalar = beta;
    return attrs;
}
}  // namespace detail

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
// One front door per function over Var (recorded) and Tensor (eager: no graph, no gradient); graph/front_door.h.
template <Operand T>
T cross_entropy(const T& logits, const T& labels, const T& class_weight, const CrossEntropyOptions& options = {},
                std::source_location where = std::source_location::current());
template <Operand T>
T cross_entropy(const T& logits, const T& labels, const CrossEntropyOptions& options = {},
                std::source_location where = std::source_location::current()) {
    return cross_entropy(logits, labels, T(), options, where);
}
// log_probs (N,C) (e.g. log_softmax), labels (N) int64; class_weight (C) where given (a constant).
//   loss_i = -w[labels_i]·log_probs[i, labels_i] (0 where ignored); Mean divides by Σ_{i not ignored} w[labels_i].
template <Operand T>
T nll_loss(const T& log_probs, const T& labels, const T& class_weight, const NllLossOptions& options = {},
           std::source_location where = std::source_location::current());
template <Operand T>
T nll_loss(const T& log_probs, const T& labels, const NllLossOptions& options = {},
           std::source_location where = std::source_location::current()) {
    return nll_loss(log_probs, labels, T(), options, where);
}
// logits, target (the same shape); weight and pos_weight (constants; an undefined Var() for none) with a
// shape that is a suffix of the logits' (e.g. pos_weight (C) for logits (N,C)):
//   loss = weight · [(1 - target)·logits + (1 + (pos_weight - 1)·target) · softplus(-logits)]
// (= -weight·[pos_weight·target·log σ(logits) + (1 - target)·log(1 - σ(logits))], without overflow).
// Mean over all elements, Sum, or None (the logits' shape).
// A pos_weight without a weight is the row's rule (a weight of 1), which Python's dg.ops runs too.
template <Operand T>
T binary_cross_entropy_with_logits(const T& logits, const T& target, const T& weight, const T& pos_weight,
                                   Reduction reduction = Reduction::Mean,
                                   std::source_location where = std::source_location::current()) {
    return apply_op(OpType::BceWithLogits, {logits, target, weight, pos_weight}, detail::reduction_attrs(reduction),
                    where);
}
template <Operand T>
T binary_cross_entropy_with_logits(const T& logits, const T& target, Reduction reduction = Reduction::Mean,
                                   std::source_location where = std::source_location::current()) {
    return apply_op(OpType::BceWithLogits, {logits, target}, detail::reduction_attrs(reduction), where);
}
// mean((prediction - target)^2) over all elements; shapes must match.
template <Operand T>
T mse_loss(const T& prediction, const T& target, std::source_location where = std::source_location::current()) {
    return apply_op(OpType::MseLoss, {prediction, target}, {}, where);
}
// |prediction - target|, reduced; shapes must match.
template <Operand T>
T l1_loss(const T& prediction, const T& target, Reduction reduction = Reduction::Mean,
          std::source_location where = std::source_location::current()) {
    return apply_op(OpType::L1Loss, {prediction, target}, detail::reduction_attrs(reduction), where);
}
// Huber-like, PyTorch's smooth_l1: d = prediction - target; 0.5·d²/beta where |d| < beta, else |d| - 0.5·beta
// (beta >= 0; beta = 0 is l1_loss). Reduced; shapes must match.
template <Operand T>
T smooth_l1_loss(const T& prediction, const T& target, Reduction reduction = Reduction::Mean, double beta = 1.0,
                 std::source_location where = std::source_location::current()) {
    return apply_op(OpType::SmoothL1Loss, {prediction, target}, detail::reduction_attrs(reduction, beta), where);
}

}  // namespace dyngrad
