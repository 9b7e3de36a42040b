// Eager calls: an op applied to Tensors directly, with no graph and no gradient. The same checked path as
// recording (shape rule, contract checks, the inputs' backend, anomaly mode) and the same kernels, so eager
// math is not a second implementation: the op functions' Tensor overloads (ops/) are one line each,
//   Tensor relu(const Tensor& x, std::source_location where) { return eager(OpType::Relu, {x}, {}, where); }
// Errors name the op and the call site: "relu (eager at model.cpp:42): ...".
#pragma once
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

// Runs `op` on `inputs` (one device, all defined) and returns its output; saved extras are dropped.
Tensor eager(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs = {},
             std::source_location where = std::source_location::current());
inline Tensor eager(OpType op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs = {},
                    std::source_location where = std::source_location::current()) {
    return eager(op, std::span<const Tensor>(inputs.begin(), inputs.size()), attrs, where);
}

namespace detail {
// The checked forward shared by ComputeGraph::record and eager(): `context()` prefixes every error,
// `describe_input(i)` names input i in anomaly mode's report.
Tensor run_forward(const OpDef& def, OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs,
                   std::vector<Tensor>& saved, std::size_t profiling_id, const std::function<std::string()>& context,
                   const std::function<std::string(std::size_t)>& describe_input);
}  // namespace detail

}  // namespace dyngrad
