// Activation checkpointing: run a segment of the forward pass without keeping its intermediate values, and
// recompute them when the backward reaches the segment (torch.utils.checkpoint.checkpoint).
//
//   std::vector<Var> h = checkpoint([&](std::span<const Var> in) { return std::vector<Var>{block(in[0])}; }, {x});
//
// The segment is recorded as usual, so its nodes, parameters and gradients are those of the plain run; only the
// values (and saved extras) of its intermediate nodes are dropped once `fn` returns. Two identity markers frame
// it: one on each input, one on each output. The backward of an output marker replays the segment's nodes from
// their recorded ops and attributes (docs/architecture.md, "Activation checkpointing"), so:
// - dropout draws the same masks (its seed is an attribute or a recorded seed input), autocast's casts are the
//   recorded cast nodes, data-dependent control flow in `fn` is the recorded one, and the replay runs the same
//   kernels on the same inputs: first-order gradients are bitwise those of the run without checkpointing when the
//   segment's inputs feed nothing outside it (a transformer block's). Otherwise, and at second order, the markers
//   may group float sums differently (they add up the segment's contributions before these meet the others);
// - the replay runs each op's forward kernel as the forward did: no allocation, synchronisation or host copy
//   beyond the forward's, so a checkpointed step can be captured into a CUDA graph;
// - the backward of the input markers drops the replayed values again, so one segment's activations are alive
//   at a time; with create_graph they stay (the gradient's nodes read them), so second order works through it.
// Kept: the segment's outputs, leaves (parameters, constants), and the casts of parameters (autocast's cache
// shares them across segments). A forward that updates an input in place (batch_norm's running statistics in
// training mode) replays on a copy of it, so the statistics move once per step, not twice.
#pragma once
#include <cstddef>
#include <functional>
#include <source_location>
#include <span>
#include <vector>

#include "dyngrad/core/error.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

// A checkpoint call that cannot work: no input, a segment that returns nothing, or nothing differentiable.
class CheckpointError : public GraphError {
    using GraphError::GraphError;
};

using SegmentFn = std::function<std::vector<Var>(std::span<const Var> inputs)>;

// Runs fn(inputs) as a checkpointed segment and returns its outputs (marker nodes holding the same values).
// Inputs: Vars of one graph, at least one; an input that does not require grad is fine (it gets no gradient).
// Under NoGradGuard it just runs fn. CheckpointError when fn returns no Var, an undefined Var, a Var of another
// graph, or outputs none of which requires grad.
std::vector<Var> checkpoint(const SegmentFn& fn, std::span<const Var> inputs,
                            std::source_location where = std::source_location::current());
// One input, one output.
Var checkpoint(const std::function<Var(const Var&)>& fn, const Var& input,
               std::source_location where = std::source_location::current());

// The tensors a graph keeps alive: distinct storages among its nodes' values and saved extras (a view counts
// with the tensor it shares), and their bytes. What checkpointing lowers; nodes' gradients are not counted.
struct GraphMemory {
    std::size_t tensors = 0;
    std::size_t bytes = 0;
};
GraphMemory graph_memory(const ComputeGraph& graph);

}  // namespace dyngrad
