// Function transforms on top of grad (graph/higher_order.h), as torch.autograd.functional: vjp, jvp (the
// double-vjp trick: J·v = d/du <Jᵀu, v>, two reverse passes, no forward mode), hvp, and the dense jacobian and
// hessian for small inputs (one reverse pass per output element). Each call records `f` on fresh leaves of a
// graph of its own and returns tensors; the caller's tensors and Parameters are untouched.
//
//   const AdFunction f = [](std::span<const Var> x) { return sum(mul(x[0], sin(x[0]))); };
//   const std::vector<Tensor> h = hvp(f, {x}, {v}).hvp;
#pragma once
#include <functional>
#include <span>
#include <vector>

#include "dyngrad/graph/higher_order.h"

namespace dyngrad {

// inputs -> one output, recorded with the op functions over Var.
using AdFunction = std::function<Var(std::span<const Var>)>;

struct VjpResult {
    Tensor output;
    std::vector<Tensor> vjp;  // vᵀ·J for each input (zeros where the output does not depend on it)
};
// v: the output's shape; undefined for a one-element output (1).
VjpResult vjp(const AdFunction& f, const std::vector<Tensor>& inputs, const Tensor& v = {});

struct JvpResult {
    Tensor output;
    Tensor jvp;  // J·v, the output's shape
};
// v: one tangent per input, each of its input's shape.
JvpResult jvp(const AdFunction& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v);

struct HvpResult {
    Tensor output;
    std::vector<Tensor> hvp;  // H·v for each input: Σ_j ∂²f/∂x_i∂x_j · v_j
};
// f: one-element output; v: one direction per input.
HvpResult hvp(const AdFunction& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v);

// J[i] of shape output.shape + inputs[i].shape.
std::vector<Tensor> jacobian(const AdFunction& f, const std::vector<Tensor>& inputs);
// H[i][j] of shape inputs[i].shape + inputs[j].shape, for a one-element output.
std::vector<std::vector<Tensor>> hessian(const AdFunction& f, const std::vector<Tensor>& inputs);

}  // namespace dyngrad
