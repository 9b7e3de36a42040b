// Autograd beyond Tensor.backward(): dyngrad.autograd.grad, the grad-mode switches (set_grad_enabled,
// enable_grad), C++ functions of Vars called on Python tensors (call_with_vars), and the factories that need the
// default generator (randint, linspace, a dropout seed).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <random>
#include <unordered_map>

#include "binding.h"

namespace dyngrad::python {

PyTensor call_with_vars(std::span<const PyTensor* const> inputs, bool trainable, const VarFunction& fn) {
    const std::source_location where = python_site();
    bool record = false;
    if (grad_enabled()) {
        record = trainable;
        for (const PyTensor* t : inputs) record = record || t->requires_grad();
    }
    std::vector<Var> vars;
    vars.reserve(inputs.size());
    if (record) {
        // The graph of an input with history (a loss handed to GradScaler.scale), else the thread's current one.
        std::shared_ptr<GraphBox> box;
        for (const PyTensor* t : inputs)
            if (!box && t->has_history()) box = t->graph;
        if (!box) box = current_graph();
        for (const PyTensor* t : inputs) vars.push_back(as_var(*t, box, where));
        const Var out = fn(vars, where);
        PyTensor result;
        if (out.requires_grad()) {
            result.var = out;
            result.graph = std::move(box);
        } else {
            result.value = out.value();
        }
        return result;
    }
    // Nothing to differentiate: a graph of its own, dropped on return (the thread's graph does not grow, as
    // eager ops leave it alone).
    ComputeGraph scratch;
    for (const PyTensor* t : inputs) vars.push_back(scratch.constant(t->data(), where));
    return PyTensor(fn(vars, where).value());
}

namespace {

struct GradModeScope {
    bool previous = true;
    bool active = false;
};

// The parameters recorded in `graph` (each once): autograd.grad sets their gradients aside, so that it
// changes no .grad, as PyTorch's does not.
std::vector<Parameter> graph_parameters(const ComputeGraph& graph) {
    std::vector<Parameter> out;
    std::unordered_map<const void*, bool> seen;
    for (NodeId id = 0; id < graph.size(); ++id) {
        const Parameter& p = graph.node(id).parameter;
        if (p.defined() && seen.emplace(p.identity(), true).second) out.push_back(p);
    }
    return out;
}

// Gradients of sum_k <outputs[k], grad_outputs[k]> with respect to `inputs`, through the engine's backward
// (one pass per output; each but the last retains the graph). Parameter inputs are read from their gradient
// slot, emptied before each pass; inputs with history from their node (retain_grads). Every parameter's .grad is
// restored afterwards, on error too.
std::vector<std::optional<PyTensor>> autograd_grad(const std::vector<const PyTensor*>& outputs,
                                                   const std::vector<const PyTensor*>& inputs,
                                                   const std::vector<std::optional<const PyTensor*>>& grad_outputs,
                                                   bool retain_graph, bool allow_unused) {
    if (outputs.empty()) throw ValueError("autograd.grad: outputs is empty");
    if (inputs.empty()) throw ValueError("autograd.grad: inputs is empty");
    if (!grad_outputs.empty() && grad_outputs.size() != outputs.size())
        throw ValueError(str("autograd.grad: grad_outputs has ", grad_outputs.size(), " entries for ", outputs.size(),
                             " outputs"));
    std::shared_ptr<GraphBox> box;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
        const PyTensor* o = outputs[k];
        if (o == nullptr) throw ValueError(str("autograd.grad: outputs[", k, "] is None"));
        if (!o->has_history())
            throw GraphError(str("autograd.grad: outputs[", k, "] ", describe(o->data()),
                                 o->parameter.defined() ? " is a leaf: it has no recorded history to differentiate"
                                                        : " does not require grad and has no history"));
        if (box && o->graph != box) throw GraphError("autograd.grad: the outputs belong to different graphs");
        box = o->graph;
    }
    if (box->released)
        throw GraphError("autograd.grad: the outputs' graph was released by an earlier backward (pass "
                         "retain_graph=True to the earlier call)");
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const PyTensor* t = inputs[i];
        if (t == nullptr) throw ValueError(str("autograd.grad: inputs[", i, "] is None"));
        if (!t->requires_grad())
            throw GraphError(str("autograd.grad: inputs[", i, "] ", describe(t->data()), " does not require grad"));
        if (t->has_history() && t->graph != box)
            throw GraphError(str("autograd.grad: inputs[", i, "] belongs to another graph than the outputs"));
    }

    const std::vector<Parameter> params = graph_parameters(box->graph());
    std::vector<Tensor> set_aside;
    set_aside.reserve(params.size());
    for (Parameter p : params) set_aside.push_back(std::exchange(p.grad_slot(), Tensor()));
    const auto restore = [&] {
        for (std::size_t j = 0; j < params.size(); ++j) Parameter(params[j]).grad_slot() = set_aside[j];
    };

    std::vector<Tensor> sums(inputs.size());
    const auto accumulate = [&](std::size_t i, const Tensor& g) {
        if (!g.defined()) return;
        sums[i] = sums[i].defined() ? eager(OpType::Add, {sums[i], g}) : g.clone();
    };
    try {
        for (std::size_t k = 0; k < outputs.size(); ++k) {
            for (Parameter p : params) p.grad_slot() = Tensor();
            BackwardOptions options;
            options.retain_graph = retain_graph || k + 1 < outputs.size();
            options.retain_grads = true;
            box->leaf_epoch = GraphBox::next_leaf_epoch();
            const PyTensor* seed = grad_outputs.empty() || !grad_outputs[k] ? nullptr : *grad_outputs[k];
            if (seed != nullptr) box->graph().backward(outputs[k]->var, seed->data(), options);
            else box->graph().backward(outputs[k]->var, options);
            for (std::size_t i = 0; i < inputs.size(); ++i) {
                const PyTensor* t = inputs[i];
                if (t->has_history()) {
                    const ComputeNode& node = box->graph().node(t->var.id());
                    accumulate(i, node.grad);
                } else {
                    accumulate(i, t->parameter.grad());
                }
            }
        }
    } catch (...) {
        restore();
        throw;
    }
    restore();
    if (!retain_graph) retire_graph(box);

    std::vector<std::optional<PyTensor>> out;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (!sums[i].defined()) {
            if (!allow_unused)
                throw GraphError(str("autograd.grad: inputs[", i, "] ", describe(inputs[i]->data()),
                                     " was not used to compute the outputs (pass allow_unused=True for None)"));
            out.emplace_back(std::nullopt);
        } else {
            out.emplace_back(PyTensor(sums[i]));
        }
    }
    return out;
}

// autograd.grad(create_graph=True): dyngrad::grad (graph/higher_order.h) records the backward into the outputs'
// graph, so the returned gradients have history there and can be differentiated again. No .grad changes.
std::vector<std::optional<PyTensor>> autograd_grad_create_graph(
    const std::vector<const PyTensor*>& outputs, const std::vector<const PyTensor*>& inputs,
    const std::vector<std::optional<const PyTensor*>>& grad_outputs, bool retain_graph, bool allow_unused) {
    if (outputs.empty() || inputs.empty()) throw ValueError("autograd.grad: outputs and inputs must not be empty");
    std::shared_ptr<GraphBox> box;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
        if (outputs[k] == nullptr || !outputs[k]->has_history())
            throw GraphError(str("autograd.grad: outputs[", k, "] does not require grad and has no history"));
        if (box && outputs[k]->graph != box) throw GraphError("autograd.grad: the outputs belong to different graphs");
        box = outputs[k]->graph;
    }
    if (box->released)
        throw HigherOrderError("autograd.grad(create_graph=True): the outputs' graph was released by an earlier "
                               "backward (pass retain_graph=True to the earlier call)");
    const std::source_location where = python_site();
    std::vector<Var> out_vars, in_vars, seeds;
    for (const PyTensor* o : outputs) out_vars.push_back(o->var);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i] == nullptr || !inputs[i]->requires_grad())
            throw GraphError(str("autograd.grad: inputs[", i, "] does not require grad"));
        in_vars.push_back(as_var(*inputs[i], box, where));
    }
    for (std::size_t k = 0; k < grad_outputs.size(); ++k)
        seeds.push_back(grad_outputs[k] && *grad_outputs[k] ? as_var(**grad_outputs[k], box, where) : Var());
    GradOptions options;
    options.create_graph = true;
    options.retain_graph = retain_graph;
    options.allow_unused = allow_unused;
    const std::vector<Var> grads = dyngrad::grad(out_vars, in_vars, seeds, options, where);
    if (!retain_graph) box->released = true;
    std::vector<std::optional<PyTensor>> result;
    for (const Var& g : grads) {
        if (!g.defined()) {
            result.emplace_back(std::nullopt);
            continue;
        }
        PyTensor t;
        if (g.requires_grad()) {
            t.var = g;
            t.graph = box;
        } else {
            t.value = g.value();  // a gradient that depends on no input (a linear function's): a constant
        }
        result.push_back(std::move(t));
    }
    return result;
}

// dyngrad.utils.checkpoint.checkpoint: `fn` (a Python callable over the tensors, returning a list of tensors) as a
// checkpointed segment of the inputs' graph (graph/checkpoint.h). An input that requires no grad enters `fn` as
// itself (a tensor without history stays one); the others enter as the segment's input markers.
std::vector<PyTensor> checkpoint_segment(nb::callable fn, nb::list inputs) {
    const std::source_location where = python_site();
    std::vector<const PyTensor*> tensors;
    for (nb::handle h : inputs) tensors.push_back(&nb::cast<const PyTensor&>(h));
    std::shared_ptr<GraphBox> box;
    for (const PyTensor* t : tensors)
        if (!box && t->has_history()) box = t->graph;
    if (!box) box = current_graph();
    std::vector<Var> vars;
    for (const PyTensor* t : tensors) vars.push_back(as_var(*t, box, where));
    const SegmentFn segment = [&](std::span<const Var> entered) {
        nb::list args;
        for (std::size_t i = 0; i < entered.size(); ++i) {
            if (!entered[i].requires_grad()) {
                args.append(inputs[i]);
                continue;
            }
            PyTensor t;
            t.var = entered[i];
            t.graph = box;
            args.append(nb::cast(std::move(t)));
        }
        const nb::object result = fn(*args);
        std::vector<Var> out;
        for (nb::handle h : nb::cast<nb::list>(result)) out.push_back(as_var(nb::cast<const PyTensor&>(h), box, where));
        return out;
    };
    std::vector<PyTensor> result;
    for (const Var& y : checkpoint(segment, vars, where)) {
        PyTensor t;
        t.var = y;
        t.graph = box;
        result.push_back(std::move(t));
    }
    return result;
}

}  // namespace

void bind_autograd(nb::module_& m) {
    m.def("_checkpoint", &checkpoint_segment, nb::arg("fn"), nb::arg("inputs"));
    m.def("_autograd_grad", &autograd_grad, nb::arg("outputs"), nb::arg("inputs"), nb::arg("grad_outputs"),
          nb::arg("retain_graph"), nb::arg("allow_unused"));
    m.def("_autograd_grad_create_graph", &autograd_grad_create_graph, nb::arg("outputs"), nb::arg("inputs"),
          nb::arg("grad_outputs"), nb::arg("retain_graph"), nb::arg("allow_unused"));

    // set_grad_enabled / enable_grad: the engine's per-thread recording switch, restored on exit.
    nb::class_<GradModeScope>(m, "_GradModeScope")
        .def(nb::init<>())
        .def("enter", [](GradModeScope& s, bool enabled) {
            s.previous = detail::exchange_grad_enabled(enabled);
            s.active = true;
        })
        .def("exit", [](GradModeScope& s) {
            if (s.active) detail::exchange_grad_enabled(s.previous);
            s.active = false;
        });
    m.def("_set_grad_enabled", [](bool enabled) { detail::exchange_grad_enabled(enabled); }, nb::arg("mode"));

    m.def("randint", [](std::int64_t low, std::int64_t high, std::vector<std::int64_t> size, nb::handle device) {
        if (high <= low) throw ValueError(str("randint: high (", high, ") must be greater than low (", low, ")"));
        for (std::int64_t d : size)
            if (d < 0) throw ValueError(str("randint: size has a negative dimension ", d));
        Shape shape(size.begin(), size.end());
        std::int64_t n = 1;
        for (std::int64_t d : size) n *= d;
        std::uniform_int_distribution<std::int64_t> pick(low, high - 1);
        std::vector<std::int64_t> values(static_cast<std::size_t>(n));
        for (auto& v : values) v = pick(default_generator().engine());
        const Tensor t = Tensor::from_vector(values, shape);
        return PyTensor(device.is_none() ? t : t.to(parse_device(device)));
    }, nb::arg("low"), nb::arg("high"), nb::arg("size"), nb::arg("device").none() = nb::none());
    m.def("linspace", [](double start, double end, std::int64_t steps, nb::handle dtype, nb::handle device) {
        if (steps < 0) throw ValueError(str("linspace: steps must be non-negative, got ", steps));
        // As PyTorch: the first half counts up from start, the second down from end (both ends exact).
        std::vector<double> values(static_cast<std::size_t>(steps));
        const double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
        for (std::int64_t i = 0; i < steps; ++i)
            values[static_cast<std::size_t>(i)] =
                i < steps / 2 ? start + step * static_cast<double>(i) : end - step * static_cast<double>(steps - 1 - i);
        if (steps == 1) values[0] = start;
        Tensor t = Tensor::from_vector(values, {steps}, DType::f64);
        t = t.to(dtype.is_none() ? DType::f32 : parse_dtype(dtype));
        return PyTensor(device.is_none() ? t : t.to(parse_device(device)));
    }, nb::arg("start"), nb::arg("end"), nb::arg("steps"), nb::kw_only(), nb::arg("dtype").none() = nb::none(),
       nb::arg("device").none() = nb::none());
    // A dropout seed from the default generator (functional.scaled_dot_product_attention's dropout_p).
    m.def("_draw_seed", [] { return default_generator().engine()(); });
}

}  // namespace dyngrad::python
