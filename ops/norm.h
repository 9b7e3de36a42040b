// Normalisation and regularisation: batch_norm, layer_norm, rms_norm and dropout. CPU: ops/norm.cpp.
// GPU: ops/norm.cu.
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

// training: zeroes each element with probability p in [0, 1) and scales the survivors by 1/(1 − p);
// the mask is a function of (seed, element index) alone, the same on every backend (ops/dropout_mask.h).
// eval (or p = 0): the identity.
Var dropout(const Var& x, double p, bool training, std::uint64_t seed,
            std::source_location where = std::source_location::current());
Tensor dropout(const Tensor& x, double p, bool training, std::uint64_t seed,
               std::source_location where = std::source_location::current());
// The same with the mask seed read from `seed`, a one-element int64 tensor on x's device (its bits are the
// seed), where the kernels read it: a captured step whose seed tensor is rewritten on the device draws fresh
// masks on every replay, and the node (its seed input) records the seed each replay used, so the CPU replay
// (verify) and the backward reproduce the mask. DTypeError/ShapeError for another seed tensor.
Var dropout(const Var& x, double p, bool training, const Var& seed,
            std::source_location where = std::source_location::current());
Tensor dropout(const Tensor& x, double p, bool training, const Tensor& seed,
               std::source_location where = std::source_location::current());

// A stream of dropout mask seeds whose draw counter lives on the device that draws the masks: next(device)
// returns a fresh one-element int64 tensor on `device` holding the seed of draw n = ++counter,
// math::dropout_draw_seed(seed, n) (ops/dropout_mask.h). On a GPU the counter is advanced by a kernel, so a
// captured step draws new seeds on every replay: exactly those the same number of eager draws gets. The
// counter moves to the device of the first draw there (a host-to-device copy: not inside a captured step,
// GraphError). Copies of a handle share the stream.
class DropoutSeeds {
public:
    explicit DropoutSeeds(std::uint64_t seed);
    Tensor next(Device device);
    std::uint64_t seed() const { return seed_; }
    // Draws so far (a host read of the device counter: a host synchronisation).
    std::uint64_t draws() const;
    // The counter tensor (int64, one element), for CapturedStep's guard state.
    const Tensor& counter() const { return counter_; }

private:
    std::uint64_t seed_;
    Tensor counter_;
};

}  // namespace dyngrad
