// Higher-order gradients: a backward recorded as ops of the graph, so that its gradients can be differentiated
// again (docs/architecture.md, "Higher-order gradients").
//
// With create_graph, the engine calls each node's differentiable backward (OpDef::differentiable_backward)
// instead of its kernels: a function written with the op functions over Var, beside the first-order backward in
// its family file (ops/<family>.cpp). Broadcast reduction and accumulation at fan-out are recorded ops too. A node
// without one throws HigherOrderError naming the op and the node.
//
//   Var y = ...;                                         // a function of x
//   std::vector<Var> dx = grad({y}, {x}, {}, {.create_graph = true});
//   std::vector<Var> d2x = grad({sum(dx[0])}, {x});      // second derivative
#pragma once
#include <optional>
#include <source_location>
#include <span>
#include <vector>

#include "dyngrad/core/error.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

// create_graph through a node whose op is first-order only (no differentiable backward), or over a graph whose
// saved tensors a backward already released.
class HigherOrderError : public GraphError {
    using GraphError::GraphError;
};

// What a differentiable backward receives: Vars of the node's graph. `output` is the node itself, so a
// derivative written with it (exp's dy·y) is differentiated through the node. Returns one Var per input: an
// undefined Var where needs_grad is false. A gradient may have the shape the input broadcasts to: the engine
// sums it back with recorded ops.
struct DiffBackwardArgs {
    OpType op;
    std::span<const Var> inputs;
    const Var& output;
    const Var& grad_output;
    const OpAttrs& attrs;
    std::span<const bool> needs_grad;
};

struct GradOptions {
    // Record the backward as ops, so that the returned gradients require grad and can be differentiated again.
    bool create_graph = false;
    // Keep the saved tensors for another backward over the same nodes. Absent: create_graph's value (a gradient
    // built with create_graph is differentiated through the nodes it came from), as PyTorch.
    std::optional<bool> retain_graph = std::nullopt;
    // An input that no output reaches gets an undefined Var instead of a GraphError.
    bool allow_unused = false;
};

// The gradients of sum_k <outputs[k], grad_outputs[k]> with respect to `inputs` (Vars of one graph, each
// requiring grad). grad_outputs: empty, or one per output (an undefined Var: ones, for a one-element output).
// Leaves' grad() slots and Parameters' gradients are left untouched, as torch.autograd.grad. With create_graph
// the returned Vars are recorded nodes of the graph.
std::vector<Var> grad(std::span<const Var> outputs, std::span<const Var> inputs,
                      std::span<const Var> grad_outputs = {}, const GradOptions& options = {},
                      std::source_location where = std::source_location::current());
std::vector<Var> grad(std::initializer_list<Var> outputs, std::initializer_list<Var> inputs,
                      std::initializer_list<Var> grad_outputs = {}, const GradOptions& options = {},
                      std::source_location where = std::source_location::current());

// For differentiable backwards of fused ops written as compositions (losses, normalisations, attention): records
// `compose(inputs)` (the op's result rebuilt from primitive ops on the same input Vars) and returns the recorded
// gradients of <compose(inputs), args.grad_output> for the inputs that need them. Costs one extra forward of the
// composition; the primitives it uses have differentiable backwards of their own.
template <typename Compose>
std::vector<Var> differentiate_composition(const DiffBackwardArgs& args, Compose&& compose);

namespace detail {
std::vector<Var> composition_gradients(const DiffBackwardArgs& args, const Var& composed);

// The recorded sweep (graph/higher_order.cpp), with access to the graph's nodes.
struct HigherOrder {
    // ComputeGraph::backward with create_graph: seeds `root` with `seed` and records the backward.
    static void backward(ComputeGraph& graph, NodeId root, const Tensor& seed, const BackwardOptions& options);
    // grad(): the gradients of the seeded roots with respect to `wanted` (undefined where unreached). Nodes at or
    // below `floor` are not expanded (a composition's sweep stops at the op's node). leaf_options: backward()'s,
    // whose leaves get their gradients as tensors and Vars.
    static std::vector<Var> sweep(ComputeGraph& graph, std::span<const NodeId> roots, std::span<const Var> seeds,
                                  std::span<const NodeId> wanted, bool create_graph, bool retain_graph,
                                  const BackwardOptions* leaf_options, std::optional<NodeId> floor);
};
}  // namespace detail

template <typename Compose>
std::vector<Var> differentiate_composition(const DiffBackwardArgs& args, Compose&& compose) {
    return detail::composition_gradients(args, compose(args.inputs));
}

}  // namespace dyngrad
