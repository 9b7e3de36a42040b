// The Python front end's shared pieces (python/src): the Python-side tensor, the implicit per-thread graph,
// the caller's Python file and line as a creation site, and the one path every op takes.
//
// Only public headers (dyngrad.h): the package builds against an installed dyngrad too.
#pragma once
#include <nanobind/nanobind.h>

#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "dyngrad/dyngrad.h"

namespace dyngrad::python {

namespace nb = nanobind;

// The graph Python code records into implicitly. Each thread has a current one; Tensors with history hold
// it (shared), the thread only observes it (weak), so a graph lives exactly as long as a Tensor of it, and a
// backward without retain_graph starts the next forward in a fresh graph (as PyTorch frees its autograd
// graph after backward).
struct GraphBox {
    ComputeGraph graph;
    bool released = false;  // back-propagated without retain_graph: its saved tensors are gone
};
std::shared_ptr<GraphBox> current_graph();
// Ends the thread's current graph if it is `box` (the next op starts a new one).
void retire_graph(const std::shared_ptr<GraphBox>& box);

// dyngrad.Tensor. One of three kinds:
//  - a constant: `value` only (no gradient flows into it);
//  - a leaf that requires grad: `parameter` (its value and its gradient, which accumulates over backward
//    calls until zero_grad, exactly PyTorch's leaf .grad);
//  - a result with history: `var`, a node of `graph`, plus `value` (the node's output, shared).
struct PyTensor {
    Tensor value;
    Parameter parameter;
    Var var;
    std::shared_ptr<GraphBox> graph;

    PyTensor() = default;
    explicit PyTensor(Tensor v) : value(std::move(v)) {}

    const Tensor& data() const { return parameter.defined() ? parameter.value() : value; }
    bool has_history() const { return var.defined(); }
    bool requires_grad() const {
        return parameter.defined() ? parameter.requires_grad() : has_history();
    }
    bool is_leaf() const { return !has_history(); }
};

// The first frame outside the dyngrad package (the user's line), as a source_location (core/source_site.h).
std::source_location python_site();
void set_package_dir(std::string dir);

// Runs `op` on the inputs: recorded into the current graph when gradients are enabled and an input requires
// grad, eager otherwise. Errors name the op, the inputs and the caller's Python line.
PyTensor apply(OpType op, const std::vector<const PyTensor*>& inputs, const OpAttrs& attrs);
PyTensor apply(OpType op, std::initializer_list<const PyTensor*> inputs, const OpAttrs& attrs = {});
// kwargs (axis=, keepdim=, stride=, ...) into OpAttrs; TypeError naming an unknown keyword.
OpAttrs parse_attrs(const OpDef& def, const nb::dict& kwargs);

// A parameter list from Python tensors (ValueError for one that is not a leaf requiring grad).
std::vector<Parameter> parameters_of(const std::vector<PyTensor*>& tensors, const char* who);
DType parse_dtype(nb::handle dtype);
Device parse_device(nb::handle device);

// The process's default generator (dyngrad.manual_seed).
Generator& default_generator();

void bind_tensor(nb::module_& m);
void bind_interop(nb::module_& m);
void bind_nn(nb::module_& m);

}  // namespace dyngrad::python
