// Normalisation: batch_norm, layer_norm, rms_norm. CPU: ops/norm.cpp. GPU: ops/norm.cu.
// Dropout (regularisation) has its own family: ops/dropout.h.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// x (N,C) or (N,C,H,W); gamma, beta, running_mean, running_var (C).
// y = gamma · (x − mean) / sqrt(var + eps) + beta, per channel.
// training: mean and (biased) var are the batch statistics over N,H,W, and the running statistics
//   are updated in place: running = (1 − momentum)·running + momentum·batch, with the unbiased batch
//   variance for running_var (as PyTorch). Needs N·H·W > 1.
// eval: mean and var are running_mean and running_var, left unchanged.
// The running tensors belong to the caller (a layer): recorded as constants, they get no gradient.
// One front door over Var (recorded; the running statistics become constants of x's graph) and Tensor (eager: eval
// uses the running statistics; training also updates them in place).
template <Operand T>
T batch_norm(const T& x, const T& gamma, const T& beta, const Tensor& running_mean, const Tensor& running_var,
             bool training, double momentum = 0.1, double eps = 1e-5,
             std::source_location where = std::source_location::current()) {
    OpAttrs attrs;
    attrs.training = training;
    attrs.momentum = momentum;
    attrs.eps = eps;
    // Constants share the caller's storage: the forward's in-place update reaches the layer's tensors.
    return apply_op(OpType::BatchNorm,
                    {x, gamma, beta, as_operand(running_mean, x, where), as_operand(running_var, x, where)}, attrs,
                    where);
}

// Layer normalisation over the trailing dims of x given by normalized_shape (PyTorch's F.layer_norm):
// x (..., *normalized_shape); weight, bias (normalized_shape), each optional (an undefined Var/Tensor).
// Each row of N = numel(normalized_shape) values: y = (x − mean)·rstd·weight + bias, rstd = 1/sqrt(var + eps),
// var the biased variance of the row. The forward saves mean and rstd per row for the backward.
// A bias without a weight is recorded with a constant weight of ones.
// (The rule lives in the row: OpDef::prepare, which Python's dg.ops.layer_norm runs too.)
template <Operand T>
T layer_norm(const T& x, const Shape& normalized_shape, const T& weight = T(), const T& bias = T(), double eps = 1e-5,
             std::source_location where = std::source_location::current()) {
    OpAttrs attrs;
    attrs.shape = normalized_shape;
    attrs.eps = eps;
    return apply_op(OpType::LayerNorm, {x, weight, bias}, attrs, where);
}

// Root-mean-square normalisation over the trailing dims given by normalized_shape (PyTorch's F.rms_norm):
// y = x·rstd·weight, rstd = 1/sqrt(mean(x²) + eps) per row; weight (normalized_shape) optional.
// eps absent: the machine epsilon of x's dtype, as PyTorch. The forward saves rstd per row.
template <Operand T>
T rms_norm(const T& x, const Shape& normalized_shape, const T& weight = T(), std::optional<double> eps = std::nullopt,
           std::source_location where = std::source_location::current()) {
    OpAttrs attrs;
    attrs.shape = normalized_shape;
    attrs.eps = eps.value_or(0.0);
    const AttrSet given = eps ? AttrSet{}.with(attr_field_index("eps")) : AttrSet{};
    return apply_op(OpType::RmsNorm, {x, weight}, attrs, where, given);
}

}  // namespace dyngrad
