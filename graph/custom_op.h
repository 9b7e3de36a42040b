// User-defined ops, registered from user code at run time with their own shape rule, forward and
// backward per backend (the same contract as built-in ops, graph/op_def.h). They record
// OpType::Custom nodes, so backward, replay verification and the gradient checks treat them like
// any other op.
//
//   CustomOp square = CustomOp::define({.name = "square", .arity = 1, .infer = ..., .cpu = {...}, .cuda = {...}});
//   Var y = square({x});
#pragma once
#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

struct CustomOpSpec {
    std::string name;
    int arity = 1;
    InferFn infer = nullptr;
    BackendKernels cpu{};   // required
    BackendKernels cuda{};  // optional: without it the op runs on CPU tensors only
    std::vector<OpCase> (*cases)() = nullptr;  // optional, for gradient checks of the op
    // optional: the backward written with op functions over Var (graph/higher_order.h), for create_graph; without
    // it the op is first-order only (create_graph through it throws HigherOrderError naming it)
    DiffBackwardFn differentiable_backward = nullptr;
};

class CustomOp {
public:
    // Registers the op for the life of the process; throws ValueError on an incomplete spec.
    static CustomOp define(const CustomOpSpec& spec);

    Var operator()(const std::vector<Var>& inputs, OpAttrs attrs = {},
                   std::source_location where = std::source_location::current()) const;
    // Its definition (op == OpType::Custom), usable with finite_difference_check and friends.
    const OpDef& def() const;
    std::uint32_t id() const { return id_; }

private:
    explicit CustomOp(std::uint32_t id) : id_(id) {}
    std::uint32_t id_;
};

// The registered definition for `custom_id` (GraphError if there is none).
const OpDef& custom_op_def(std::uint32_t custom_id);
// The id of a registered definition (GraphError if `def` is not one).
std::uint32_t custom_op_id(const OpDef& def);

}  // namespace dyngrad
