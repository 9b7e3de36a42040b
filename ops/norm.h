// Normalisation: batch_norm, layer_norm, rms_norm. CPU: ops/norm.cpp. GPU: ops/norm.cu.
// Dropout (regularisation) has its own family: ops/dropout.h.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

// x (N,C) or (N,C,H,W); gamma, beta, running_mean, running_var (C).
// y = gamma · (x − mean) / sqrt(var + eps) + beta, per channel.
// training: mean and (biased) var are the batch statistics over N,H,W, and the running statistics
//   are updated in place: running = (1 − momentum)·running + momentum·batch, with the unbiased batch
//   variance for running_var (as PyTorch). Needs N·H·W > 1.
// eval: mean and var are running_mean and running_var, left unchanged.
// The running tensors belong to the caller (a layer): recorded as constants, they get no gradient.
Var batch_norm(const Var& x, const Var& gamma, const Var& beta, const Tensor& running_mean,
               const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
               std::source_location where = std::source_location::current());
// Eager (no gradient): eval uses the running statistics; training also updates them in place.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
                  std::source_location where = std::source_location::current());

// Layer normalisation over the trailing dims of x given by normalized_shape (PyTorch's F.layer_norm):
// x (..., *normalized_shape); weight, bias (normalized_shape), each optional (an undefined Var/Tensor).
// Each row of N = numel(normalized_shape) values: y = (x − mean)·rstd·weight + bias, rstd = 1/sqrt(var + eps),
// var the biased variance of the row. The forward saves mean and rstd per row for the backward.
// A bias without a weight is recorded with a constant weight of ones.
Var layer_norm(const Var& x, const Shape& normalized_shape, const Var& weight = Var(), const Var& bias = Var(),
               double eps = 1e-5, std::source_location where = std::source_location::current());
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5,
                  std::source_location where = std::source_location::current());

// Root-mean-square normalisation over the trailing dims given by normalized_shape (PyTorch's F.rms_norm):
// y = x·rstd·weight, rstd = 1/sqrt(mean(x²) + eps) per row; weight (normalized_shape) optional.
// eps absent: the machine epsilon of x's dtype, as PyTorch. The forward saves rstd per row.
Var rms_norm(const Var& x, const Shape& normalized_shape, const Var& weight = Var(),
             std::optional<double> eps = std::nullopt, std::source_location where = std::source_location::current());
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt, std::source_location where = std::source_location::current());

}  // namespace dyngrad
