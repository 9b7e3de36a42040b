// Looking at a recorded graph: lint before backward, and a Graphviz picture.
//
// lint(graph, loss) finds what would silently go wrong in backward(loss):
//  - a parameter in the graph that receives no gradient from `loss` (it does not reach the loss, or it
//    was recorded under NoGradGuard);
//  - a node on the backward path whose op has no backward kernel on its device while an input needs a
//    gradient (backward would stop there with DeviceError);
//  - computations that do not reach `loss` (work done for nothing, or a result meant to feed the loss
//    that was left out). Vars are plain values the graph cannot track, so a dangling handle is not
//    detectable as such; the node it was made for shows up here instead.
//
// to_dot(graph) writes the graph in Graphviz DOT: one node per graph node, labelled with op, id, debug
// name, creation site, shape, dtype and device, and one edge per input -> consumer. Given the report of
// verify() on that graph, it adds each checked node's value/gradient errors and colours failures red.
// Render with `dot -Tsvg graph.dot -o graph.svg`.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "dyngrad/graph/graph.h"

namespace dyngrad {

struct VerifyReport;

struct LintIssue {
    enum class Kind {
        UnusedParameter,  // receives no gradient from the loss
        MissingBackward,  // backward would fail: no backward kernel on the node's device
        UnusedNode,       // an op node that does not contribute to the loss
    };
    Kind kind;
    NodeId node;          // the parameter's (first) leaf, or the op node
    std::string message;  // names the node: op, id, debug name, creation site
};

struct LintReport {
    std::vector<LintIssue> issues;  // in node order
    bool clean() const { return issues.empty(); }
    std::size_t count(LintIssue::Kind kind) const;
    // "lint: clean", or one line per issue under a summary line.
    std::string to_string() const;
};

// Inspects `graph` as backward(loss) would walk it; changes nothing. GraphError when `loss` is not a
// live handle into `graph`.
LintReport lint(const ComputeGraph& graph, const Var& loss);

// Graphviz DOT text for `graph`; `report` (from verify() on this graph) adds per-node errors.
std::string to_dot(const ComputeGraph& graph, const VerifyReport* report = nullptr);

}  // namespace dyngrad
