// The Python front end's shared pieces (python/src): the Python-side tensor, the implicit per-thread graph,
// the caller's Python file and line as a creation site, and the one path every op takes.
//
// Only public headers (dyngrad.h): the package builds against an installed dyngrad too.
#pragma once
#include <nanobind/nanobind.h>

#include "strict_int.h"  // before any conversion of an integer

#include <functional>
#include <map>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dyngrad/dyngrad.h"

namespace dyngrad::python {

namespace nb = nanobind;

// The graph Python code records into implicitly. Each thread has a current one; Tensors with history hold
// it (shared), the thread only observes it (weak), so a graph lives exactly as long as a Tensor of it, and a
// backward without retain_graph starts the next forward in a fresh graph (as PyTorch frees its autograd
// graph after backward).
struct GraphBox {
    GraphBox() = default;
    // A box over a graph owned elsewhere, reached through `member` (one of its Vars): a ZeRO-3 unit's forward
    // records into the unit's own graph (src/distributed.cpp). graph() raises GraphError once that graph is gone
    // (a tensor the unit's Python forward kept), instead of reaching freed memory.
    explicit GraphBox(const Var& member) : borrowed_(member) {}
    GraphBox(const GraphBox&) = delete;
    GraphBox& operator=(const GraphBox&) = delete;
    ComputeGraph& graph() {
        if (!borrowed_.defined()) return owned_;
        if (!borrowed_.is_live())
            throw GraphError("a tensor recorded inside a ZeRO-3 unit's forward, whose graph is gone once the unit ran "
                             "(keep only what the unit returns, or .detach() a value inside it)");
        return borrowed_.graph();
    }
    bool borrowed() const { return borrowed_.defined(); }
    bool released = false;  // back-propagated without retain_graph: its saved tensors are gone
    // Names this box's current leaves for PyTensor::leaf: unique over the process, renewed by every backward
    // (a leaf that took part in a backward is not reused by a later forward of a retained graph).
    std::uint64_t leaf_epoch = next_leaf_epoch();
    static std::uint64_t next_leaf_epoch();
    // Leaves standing for results of released graphs that require grad (a forward's outputs stay usable
    // after backward(), as in C++), with the node each stands for: a backward that would send a gradient into
    // one raises GraphError before it writes any gradient (the released history cannot take it further).
    std::vector<std::pair<NodeId, std::string>> stale_leaves;
    // When set, loss.backward() on this graph runs this instead of graph.backward: DistributedDataParallel's
    // forward sets it (src/distributed.cpp) so that the backward averages gradients across ranks, as PyTorch's
    // DDP hooks its reducer into autograd. grad_output is null for backward() without a gradient.
    std::function<void(ComputeGraph&, const Var&, const Tensor* grad_output, const BackwardOptions&)> backward;

private:
    ComputeGraph owned_;
    Var borrowed_;
};
using GraphBackward = decltype(GraphBox::backward);
// loss.backward() on `box`'s graph: its `backward` when set, else the engine's (src/distributed.cpp).
void run_graph_backward(GraphBox& box, const Var& output, const Tensor* grad_output, const BackwardOptions& options);
std::shared_ptr<GraphBox> current_graph();
// Makes `box` the thread's current graph for its lifetime, then restores the previous one (a ZeRO-3 unit's
// Python forward records into the unit's graph, src/distributed.cpp).
class CurrentGraphScope {
public:
    explicit CurrentGraphScope(std::shared_ptr<GraphBox> box);
    ~CurrentGraphScope();
    CurrentGraphScope(const CurrentGraphScope&) = delete;
    CurrentGraphScope& operator=(const CurrentGraphScope&) = delete;

private:
    std::shared_ptr<GraphBox> box_;
    std::weak_ptr<GraphBox> previous_;
};
// Ends the thread's current graph if it is `box` (the next op starts a new one).
void retire_graph(const std::shared_ptr<GraphBox>& box);

// dyngrad.Tensor. One of three kinds:
//  - a constant: `value` only (no gradient flows into it);
//  - a leaf that requires grad: `parameter` (its value and its gradient, which accumulates over backward
//    calls until zero_grad, exactly PyTorch's leaf .grad);
//  - a result with history: `var`, a node of `graph` (whose output is its value; `value` stays empty).
struct PyTensor {
    Tensor value;
    Parameter parameter;
    Var var;
    std::shared_ptr<GraphBox> graph;
    // A constant or a parameter enters a graph as a leaf node once per forward pass, not once per use (a
    // new leaf per op cost a node, its allocation and a backward visit on every call, e.g. `y = y + c` in a
    // loop): the leaf recorded for it in the box of epoch `leaf_epoch`, for the data and grad mode it had.
    mutable Var leaf;
    mutable std::uint64_t leaf_epoch = 0;
    mutable const void* leaf_data = nullptr;
    mutable bool leaf_requires_grad = false;
    // A boolean mask (dyngrad has no bool dtype): set on a comparison's result and by .bool(), so x[mask]
    // selects by it; any other tensor used as an index keeps meaning gather-by-index (docs/python.md).
    bool mask = false;

    PyTensor() = default;
    explicit PyTensor(Tensor v) : value(std::move(v)) {}

    // A result with history reads its node's output (not a copy per op: a Tensor copy allocates its shape).
    const Tensor& data() const {
        if (parameter.defined()) return parameter.value();
        return var.defined() ? var.value() : value;
    }
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
PyTensor apply(OpType op, std::span<const PyTensor* const> inputs, const OpAttrs& attrs);
PyTensor apply(OpType op, std::initializer_list<const PyTensor*> inputs, const OpAttrs& attrs = {});
// `t` as a node of `box`'s graph: its node when it has history there, else its leaf for this forward pass;
// GraphError for a tensor of a released or another thread's graph.
Var as_var(const PyTensor& t, const std::shared_ptr<GraphBox>& box, std::source_location where);

// Runs a C++ function over Vars (a C++ layer's operator(), GradScaler::scale) on Python tensors, as apply()
// runs an op: recorded when gradients are enabled and an input or the function's own parameters (`trainable`)
// require grad (into the graph of the inputs with history, else the thread's current one), otherwise in a
// scratch graph whose result keeps only its value.
using VarFunction = std::function<Var(std::span<const Var>, std::source_location)>;
PyTensor call_with_vars(std::span<const PyTensor* const> inputs, bool trainable, const VarFunction& fn);

// kwargs (axis=, keepdim=, stride=, ...) into OpAttrs; TypeError naming an unknown keyword. `given`, when set,
// gets the fields the keywords named (the row's argument rule fills the others, graph/front_door.h).
OpAttrs parse_attrs(const OpDef& def, const nb::dict& kwargs, AttrSet* given = nullptr);
// Default attributes, built once: an OpAttrs is large to construct and destroy on every call.
const OpAttrs& no_attrs();
// The PyTensor inside a dyngrad.Tensor object; nullptr for any other object (src/tensor.cpp).
const PyTensor* as_tensor(PyObject* o);
// A shape from size arguments: ints, or one sequence of ints (src/op_path.cpp).
Shape shape_from(nb::handle args, const char* who);

// State dicts (optimizer, schedule, GradScaler) between C++ TensorMaps and Python dicts (src/schedules.cpp);
// `who` names the caller when an entry is None.
std::map<std::string, PyTensor> py_tensor_map(const TensorMap& tensors);
TensorMap tensor_map_of(const std::map<std::string, PyTensor*>& tensors, const char* who);
// x.save_state(...) as (tensors, metadata) for Python.
template <typename Stateful>
std::pair<std::map<std::string, PyTensor>, SafetensorsMetadata> saved_state(const Stateful& x) {
    TensorMap tensors;
    SafetensorsMetadata metadata;
    x.save_state(tensors, metadata);
    return {py_tensor_map(tensors), metadata};
}
// A C++ struct's fields as a Python dict of the same names (counters and reports read from Python):
// fields_dict(counts, field("nodes", &Counts::nodes), field("kernels", &Counts::kernels)).
template <typename Struct, typename Member>
struct Field {
    const char* name;
    Member Struct::*member;
};
template <typename Struct, typename Member>
constexpr Field<Struct, Member> field(const char* name, Member Struct::*member) {
    return {name, member};
}
template <typename Struct, typename... Members>
nb::dict fields_dict(const Struct& value, Field<Struct, Members>... fields) {
    nb::dict d;
    ((d[fields.name] = value.*fields.member), ...);
    return d;
}
// Python arguments of the wrong type: TypeError "who(): argument 'arg' must be <expected>, not <type>", in
// PyTorch's words (nb::cast's own failure names neither the function nor the argument).
[[noreturn]] void throw_argument_type(std::string_view who, std::string_view arg, const char* expected, nb::handle given);
template <typename T>
T arg_as(nb::handle value, std::string_view who, std::string_view arg, const char* expected) {
    T out{};
    if (!nb::try_cast<T>(value, out)) throw_argument_type(who, arg, expected, value);
    return out;
}
// An int argument: an int or an object with __index__; not a bool, a str or a float (TypeError as above).
std::int64_t int_of(nb::handle value, std::string_view who, std::string_view arg);
// An enum argument given by name, one of choice_names(E) (reduction="mean", ...): TypeError for a non-str,
// ValueError listing the names for an unknown one.
template <typename E>
E parse_choice(nb::handle value, std::string_view who, std::string_view key) {
    if (!nb::isinstance<nb::str>(value)) throw_argument_type(who, key, "a str", value);
    const std::string text = nb::cast<std::string>(value);
    const auto names = choice_names(E{});
    for (std::size_t i = 0; i < names.size(); ++i)
        if (text == names[i]) return static_cast<E>(i);
    std::string known;
    for (const std::string_view name : names) known += str(known.empty() ? "" : ", ", name);
    throw ValueError(str(who, "(): ", key, "='", text, "': expected one of ", known));
}

// A parameter list from Python tensors (ValueError for one that is not a leaf requiring grad).
std::vector<Parameter> parameters_of(const std::vector<PyTensor*>& tensors, const char* who);
DType parse_dtype(nb::handle dtype);
Device parse_device(nb::handle device);

// The process's default generator (dyngrad.manual_seed).
Generator& default_generator();

// Inside a catch block of a raw CPython slot: sets the Python error nanobind's translation would (dyngrad
// errors as their Python classes, naming the user's line).
void set_python_error_from_current_exception() noexcept;
// A Python exception raised by Python code that C++ called (a ZeRO-3 unit's forward) as the dyngrad error of the
// same class, "<context> <Python type>: <message>"; any other exception as ValueError. Needs the GIL.
[[noreturn]] void rethrow_as_dyngrad_error(nb::python_error& e, const std::string& context);

void bind_tensor(nb::module_& m);
void bind_op_path(nb::module_& m);   // src/op_path.cpp
void bind_factories(nb::module_& m); // src/factories.cpp
void bind_interop(nb::module_& m);
void bind_nn(nb::module_& m);
void bind_transformer(nb::module_& m);  // src/transformer.cpp
void bind_token_files(nb::module_& m);  // src/token_files.cpp
void bind_amp(nb::module_& m);          // src/amp.cpp
void bind_autograd(nb::module_& m);     // src/autograd.cpp
void bind_schedules(nb::module_& m);    // src/schedules.cpp
void bind_distributed(nb::module_& m);  // src/distributed.cpp
void bind_capture(nb::module_& m);      // src/capture.cpp
void bind_fusion(nb::module_& m);       // src/fusion.cpp

}  // namespace dyngrad::python
