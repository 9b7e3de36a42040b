// Internal: the engine's helpers that recording (graph/graph.cpp) and the backward sweep (graph/sweep.cpp) share.
#pragma once
#include <span>
#include <string>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad::detail {

// "(3) float64 cpu, (3) float64 cpu": the inputs of a node, for messages.
std::string describe_inputs(std::span<const Tensor> inputs);
// The op's kernels on `device`'s backend.
const BackendKernels& kernels_for(const OpDef& def, Device device);
// Anomaly mode's report of some tensors: "; input 0 (3) float64 cpu: min -1 max 2, 1 NaN, 0 Inf (of 3)".
std::string stats_of(const std::string& role, const Tensor& t);
std::string stats_of_inputs(std::span<const Tensor> inputs);
// "custom op 'square'" or "op 'relu'": who broke the kernel contract (graph/op_def.h), for its messages.
std::string op_label(const OpDef& def);
// Inside a catch block around an op's shape rule or kernels: rethrow_with_context for std exceptions; anything
// else (`throw 42` in a user's op) becomes dyngrad::Error naming the op and what threw it.
[[noreturn]] void rethrow_op_failure(const std::string& context, const OpDef& def, const char* stage);

}  // namespace dyngrad::detail
