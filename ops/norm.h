// Normalisation and regularisation: batch_norm and dropout. CPU: ops/norm.cpp. GPU: ops/norm.cu.
#pragma once
#include <cstdint>
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

// training: zeroes each element with probability p in [0, 1) and scales the survivors by 1/(1 − p);
// the mask is a function of (seed, element index) alone, the same on every backend (ops/dropout_mask.h).
// eval (or p = 0): the identity.
Var dropout(const Var& x, double p, bool training, std::uint64_t seed,
            std::source_location where = std::source_location::current());
Tensor dropout(const Tensor& x, double p, bool training, std::uint64_t seed,
               std::source_location where = std::source_location::current());

}  // namespace dyngrad
