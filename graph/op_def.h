// The contract between the graph engine and an op's kernels, and the op-table row type.
//
// Forward:  (inputs, attrs, out shape/dtype) -> output value       (written with '=' into a new tensor)
// Backward: (inputs, output, grad_out, attrs, needs_grad) -> one gradient per input, or an undefined
//           Tensor for inputs that need none. Kernels always return fresh (or aliasing) tensors: the
//           engine alone accumulates at fan-out and reduces broadcast gradients, the same way on every
//           backend, so no kernel decides between '=' and '+='.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_type.h"

namespace dyngrad {

// Attributes of a node. Each op reads the fields its table row documents.
struct OpAttrs {
    double scalar = 0.0;              // add/mul scalar operand, pow exponent, leaky slope, elu alpha, clip ceiling
    std::vector<std::int64_t> axes;   // sum/mean axes (empty: all); transpose: the two axes swapped
    std::int64_t axis = -1;           // max, softmax, log_softmax
    bool keepdim = false;             // sum/mean/max
    Shape shape;                      // reshape target
};

struct OutputSpec {
    Shape shape;
    DType dtype;
};

struct ForwardArgs {
    OpType op;
    std::span<const Tensor> inputs;
    const OpAttrs& attrs;
    const OutputSpec& out;
    std::vector<Tensor>& saved;  // extra tensors a backward needs beyond inputs and output
};

struct BackwardArgs {
    OpType op;
    std::span<const Tensor> inputs;
    const Tensor& output;
    const Tensor& grad_output;
    const OpAttrs& attrs;
    std::span<const Tensor> saved;
    std::span<const bool> needs_grad;  // one per input
};

using InferFn = OutputSpec (*)(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs);
using ForwardFn = Tensor (*)(const ForwardArgs& args);
using BackwardFn = std::vector<Tensor> (*)(const BackwardArgs& args);

struct BackendKernels {
    ForwardFn forward = nullptr;
    BackwardFn backward = nullptr;
};

// How the finite-difference checker fills an input.
enum class InputDomain : std::uint8_t {
    Any,           // normal(0, 1)
    Positive,      // uniform [0.5, 2]  (log, sqrt, pow, div denominators)
    AwayFromZero,  // |x| in [0.2, 2], random sign (kinks at 0: abs, relu family)
    Labels,        // int64 class indices in [0, inputs[0].shape[1])
};

// One case of an op's checks: shapes, attributes and input domains.
struct OpCase {
    std::string label;
    std::vector<Shape> shapes;
    OpAttrs attrs;
    std::vector<InputDomain> domains;  // empty: all Any
};

struct OpDef {
    OpType op;
    const char* name;
    int arity;  // number of inputs
    InferFn infer;
    BackendKernels cpu;
    BackendKernels cuda;
    std::vector<OpCase> (*cases)();  // test cases picked up by tests and dyngrad-verify
};

// The row for `op` (never null for a valid tag).
const OpDef& op_def(OpType op);
std::span<const OpDef> op_table();
// Looks a row up by name; nullptr when there is none.
const OpDef* find_op(std::string_view name);

}  // namespace dyngrad
