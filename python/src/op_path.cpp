// The op path from Python (docs/python.md): the implicit graph, the caller's site, apply() (record or eager), the
// keyword attributes and their argument rules, conversions; dg.ops' `apply` and `op_table`.
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <atomic>
#include <span>
#include <frameobject.h>
#include <optional>
#include <unordered_map>

#include "binding.h"

namespace dyngrad::python {

// ---- the implicit graph ----
namespace {
thread_local std::weak_ptr<GraphBox> thread_graph;
}

std::shared_ptr<GraphBox> current_graph() {
    std::shared_ptr<GraphBox> box = thread_graph.lock();
    if (!box) {
        box = std::make_shared<GraphBox>();
        thread_graph = box;
    }
    return box;
}

CurrentGraphScope::CurrentGraphScope(std::shared_ptr<GraphBox> box) : box_(std::move(box)), previous_(thread_graph) {
    thread_graph = box_;
}
CurrentGraphScope::~CurrentGraphScope() { thread_graph = previous_; }

std::uint64_t GraphBox::next_leaf_epoch() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
}

void retire_graph(const std::shared_ptr<GraphBox>& box) {
    box->released = true;
    if (thread_graph.lock() == box) thread_graph.reset();
}

Generator& default_generator() {
    static Generator generator(0);
    return generator;
}

// ---- the caller's site ----
namespace {
std::string package_dir;
struct CodeSites {
    std::string file, function;
    bool internal = false;  // a frame of the dyngrad package: the user's line is further out
    std::unordered_map<int, std::source_location> at;  // by instruction offset (or line)
};
// Code objects are kept alive by this table (one reference each), so an address is never reused for another.
std::unordered_map<PyCodeObject*, CodeSites> code_sites;  // touched only with the GIL held

// A direct-mapped cache in front of code_sites: the few code objects an op's frames walk through (the user's
// function, dyngrad.functional, dyngrad.nn) are found without hashing. Entries point into code_sites, whose
// elements never move or go away.
std::array<std::pair<PyCodeObject*, CodeSites*>, 64> recent_sites{};

CodeSites& sites_of(PyCodeObject* code) {
    auto& recent = recent_sites[(reinterpret_cast<std::uintptr_t>(code) >> 4) % recent_sites.size()];
    if (recent.first == code) return *recent.second;
    auto found = code_sites.find(code);
    if (found != code_sites.end()) {
        recent = {code, &found->second};
        return found->second;
    }
    CodeSites sites;
    nb::handle h(reinterpret_cast<PyObject*>(code));
    sites.file = nb::cast<std::string>(h.attr("co_filename"));
    sites.function = nb::cast<std::string>(h.attr("co_name"));
    sites.internal = !package_dir.empty() && sites.file.compare(0, package_dir.size(), package_dir) == 0;
    Py_INCREF(code);
    return code_sites.emplace(code, std::move(sites)).first->second;
}
}  // namespace

void set_package_dir(std::string dir) { package_dir = std::move(dir); }

namespace {
// The last site resolved for a user frame that called into the package directly (an operator, a method): a
// loop repeats it, so most ops find their site here without a lookup. Read and written with the GIL held.
struct LastSite {
    PyCodeObject* code = nullptr;  // kept alive by code_sites
    int key = -1;
    std::source_location where;
};
LastSite last_site;
}  // namespace

std::source_location python_site() {
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    if (frame == nullptr) return std::source_location::current();
    if (last_site.code != nullptr) {
        PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
        Py_DECREF(code);  // code_sites holds one: the object outlives this call
#if PY_VERSION_HEX >= 0x030B0000
        const int key = PyFrame_GetLasti(frame);
#else
        const int key = PyFrame_GetLineNumber(frame);
#endif
        if (code == last_site.code && key == last_site.key) return last_site.where;
    }
    Py_INCREF(frame);
    for (int depth = 0; frame != nullptr && depth < 64; ++depth) {
        PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
        CodeSites& sites = sites_of(code);
        Py_DECREF(code);
        if (!sites.internal || depth == 63) {
#if PY_VERSION_HEX >= 0x030B0000
            const int key = PyFrame_GetLasti(frame);
#else
            const int key = PyFrame_GetLineNumber(frame);
#endif
            auto found = sites.at.find(key);
            if (found == sites.at.end()) {
                const int line = PyFrame_GetLineNumber(frame);
                found = sites.at
                            .emplace(key, foreign_site(sites.file, sites.function,
                                                       static_cast<unsigned>(line < 0 ? 0 : line)))
                            .first;
            }
            if (depth == 0) last_site = {code, key, found->second};
            Py_DECREF(frame);
            return found->second;
        }
        PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
        Py_DECREF(frame);
        frame = back;
    }
    if (frame != nullptr) Py_DECREF(frame);
    return std::source_location::current();
}

// ---- the op path ----
Var as_var(const PyTensor& t, const std::shared_ptr<GraphBox>& box, std::source_location where) {
    if (!t.has_history()) {
        const bool requires_grad = t.parameter.defined() && t.parameter.requires_grad();
        const void* data = t.data().defined() ? t.data().raw_data() : nullptr;
        if (t.leaf_epoch == box->leaf_epoch && t.leaf_data == data && t.leaf_requires_grad == requires_grad)
            return t.leaf;
        t.leaf = t.parameter.defined() ? box->graph().parameter(t.parameter, where) : box->graph().constant(t.value, where);
        t.leaf_epoch = box->leaf_epoch;
        t.leaf_data = data;
        t.leaf_requires_grad = requires_grad;
        return t.leaf;
    }
    if (t.graph != box) {
        if (t.graph->released) {
            // A value backward() kept (it releases saved tensors only, as in C++): a leaf of this graph.
            const void* data = t.data().raw_data();
            const bool requires_grad = t.var.requires_grad();
            if (t.leaf_epoch == box->leaf_epoch && t.leaf_data == data && t.leaf_requires_grad == requires_grad)
                return t.leaf;
            t.leaf = box->graph().input(t.data(), "", requires_grad, where);
            t.leaf_epoch = box->leaf_epoch;
            t.leaf_data = data;
            t.leaf_requires_grad = requires_grad;
            if (requires_grad) box->stale_leaves.emplace_back(t.leaf.id(), t.graph->graph().describe_node(t.var.id()));
            return t.leaf;
        }
        if (box->borrowed())
            throw GraphError(str("a tensor from ", t.graph->graph().describe_node(t.var.id()),
                                 " was recorded outside this ZeRO-3 unit; a unit may use its input, its own "
                                 "parameters and constants (.detach() it to use it as a constant)"));
        throw GraphError(str("a tensor from ", t.graph->graph().describe_node(t.var.id()),
                             " belongs to another thread's graph; .detach() it to use it here"));
    }
    return t.var;
}

// The hot path of every op from Python: no heap allocation beyond the engine's own (output, node) for up to
// kInlineInputs inputs, which is every op but concat/stack of many tensors.
PyTensor apply(OpType op, std::span<const PyTensor* const> inputs, const OpAttrs& attrs) {
    constexpr std::size_t kInlineInputs = 4;
    const std::source_location where = python_site();
    bool record = false;
    if (grad_enabled())
        for (const PyTensor* t : inputs)
            if (t->requires_grad()) {
                record = true;
                break;
            }
    if (!record) {
        if (inputs.size() == 1) return PyTensor(eager(op, std::span<const Tensor>(&inputs[0]->data(), 1), attrs, where));
        if (inputs.size() <= kInlineInputs) {
            std::array<Tensor, kInlineInputs> values;
            for (std::size_t i = 0; i < inputs.size(); ++i) values[i] = inputs[i]->data();
            return PyTensor(eager(op, std::span<const Tensor>(values.data(), inputs.size()), attrs, where));
        }
        std::vector<Tensor> values;
        values.reserve(inputs.size());
        for (const PyTensor* t : inputs) values.push_back(t->data());
        return PyTensor(eager(op, values, attrs, where));
    }
    std::shared_ptr<GraphBox> box = current_graph();
    ComputeGraph& graph = box->graph();
    Var out;
    if (inputs.size() <= kInlineInputs) {
        std::array<Var, kInlineInputs> v;
        for (std::size_t i = 0; i < inputs.size(); ++i) v[i] = as_var(*inputs[i], box, where);
        switch (inputs.size()) {  // the initializer_list overload: no vector for the inputs
            case 0: out = graph.record(op, std::initializer_list<Var>{}, attrs, where); break;
            case 1: out = graph.record(op, {v[0]}, attrs, where); break;
            case 2: out = graph.record(op, {v[0], v[1]}, attrs, where); break;
            case 3: out = graph.record(op, {v[0], v[1], v[2]}, attrs, where); break;
            default: out = graph.record(op, {v[0], v[1], v[2], v[3]}, attrs, where); break;
        }
    } else {
        std::vector<Var> vars;
        vars.reserve(inputs.size());
        for (const PyTensor* t : inputs) vars.push_back(as_var(*t, box, where));
        out = graph.record(op, vars, attrs, where);
    }
    PyTensor result;
    if (out.requires_grad()) {  // a comparison or an index has no history to keep
        result.var = out;
        result.graph = std::move(box);
    } else {
        result.value = out.value();
    }
    return result;
}

PyTensor apply(OpType op, std::initializer_list<const PyTensor*> inputs, const OpAttrs& attrs) {
    return apply(op, std::span<const PyTensor* const>(inputs.begin(), inputs.size()), attrs);
}

// ---- attributes ----
const OpAttrs& no_attrs() {
    static const OpAttrs attrs;
    return attrs;
}

namespace {

// One int (an int or a NumPy integer), not a sequence: a NumPy array has __index__ too, but is a sequence.
bool is_one_int(nb::handle value) { return PyIndex_Check(value.ptr()) && !PySequence_Check(value.ptr()); }

std::array<std::int64_t, 2> pair_of(nb::handle value, std::string_view who, std::string_view key) {
    if (is_one_int(value)) {
        const std::int64_t v = int_of(value, who, key);
        return {v, v};
    }
    const auto v = arg_as<std::vector<std::int64_t>>(value, who, key, "an int or a pair of ints");
    if (v.size() != 2)
        throw ValueError(str(who, "(): ", key, "= expects an int or a pair of ints, got ", v.size(), " values"));
    return {v[0], v[1]};
}

std::vector<std::int64_t> ints_of(nb::handle value, std::string_view who, std::string_view key) {
    if (is_one_int(value)) return {int_of(value, who, key)};
    return arg_as<std::vector<std::int64_t>>(value, who, key, "an int or a sequence of ints");
}

}  // namespace

// An int argument: a Python int (or an object with __index__), never a bool, a str or a float.
std::int64_t int_of(nb::handle value, std::string_view who, std::string_view key) {
    if (!PyIndex_Check(value.ptr()) || PyBool_Check(value.ptr())) throw_argument_type(who, key, "an int", value);
    const Py_ssize_t v = PyNumber_AsSsize_t(value.ptr(), PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    return v;
}

void throw_argument_type(std::string_view who, std::string_view arg, const char* expected, nb::handle given) {
    throw nb::type_error(str(who, "(): argument '", arg, "' must be ", expected, ", not ",
                             nb::cast<std::string>(nb::str(given.type().attr("__name__"))))
                             .c_str());
}

namespace {

// One keyword onto its field, by the field's kind (the member's type in graph/op_def.h's kAttrFields); each
// conversion names the op and the keyword when the value has another Python type. None sets a field to its
// default (an absent bound, padding_idx -1, activation none).
void parse_field(OpAttrs& a, const AttrField& field, nb::handle value, std::string_view who, std::string_view key) {
    std::visit(
        [&](auto member) {
            auto& out = a.*member;
            using T = std::remove_cvref_t<decltype(out)>;
            if (value.is_none()) out = OpAttrs{}.*member;
            else if constexpr (std::is_same_v<T, double>) out = arg_as<double>(value, who, key, "a float");
            else if constexpr (std::is_same_v<T, std::optional<double>>) out = arg_as<double>(value, who, key, "a float");
            else if constexpr (std::is_same_v<T, bool>) out = arg_as<bool>(value, who, key, "a bool");
            else if constexpr (std::is_same_v<T, std::uint64_t>) out = arg_as<std::uint64_t>(value, who, key, "an int");
            else if constexpr (std::is_same_v<T, std::int64_t>) out = int_of(value, who, key);
            else if constexpr (std::is_same_v<T, std::uint32_t>) out = static_cast<std::uint32_t>(int_of(value, who, key));
            else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) out = ints_of(value, who, key);
            else if constexpr (std::is_same_v<T, std::array<std::int64_t, 2>>) out = pair_of(value, who, key);
            else if constexpr (std::is_same_v<T, DType>) out = parse_dtype(value);
            else out = parse_choice<T>(value, who, key);  // an enum: one of choice_names(T)
        },
        field.member);
}

}  // namespace

OpAttrs parse_attrs(const OpDef& def, const nb::dict& kwargs, AttrSet* given) {
    OpAttrs a;
    for (auto [key_handle, value] : kwargs) {
        // The key's UTF-8 view (cached in the str object): no std::string per keyword and call.
        Py_ssize_t key_size = 0;
        const char* key_text = PyUnicode_Check(key_handle.ptr()) ? PyUnicode_AsUTF8AndSize(key_handle.ptr(), &key_size) : nullptr;
        if (key_text == nullptr) {
            PyErr_Clear();
            throw nb::type_error(str(def.name, "() keywords must be strings").c_str());
        }
        const std::string_view key(key_text, static_cast<std::size_t>(key_size));
        // The field by index in this module's own kAttrFields: an address from the library's copy
        // (find_attr_keyword) is not one of ours, as this module's symbols are hidden.
        std::size_t field = 0;
        const auto names_key = [&](const AttrField& f) {
            for (const std::string_view k : f.keywords)
                if (!k.empty() && k == key) return true;
            return false;
        };
        while (field < kAttrFieldCount && !names_key(kAttrFields[field])) ++field;
        // A keyword of an attribute this op does not read is refused like an unknown one: it would be ignored.
        if (field == kAttrFieldCount || key.empty() || !def.attrs.contains(field))
            throw nb::type_error(str(def.name, "() got an unexpected keyword argument '", key, "' (", def.name,
                                     " takes: ", attr_keywords_text(def), ")")
                                     .c_str());
        parse_field(a, kAttrFields[field], value, def.name, key);
        // None is the default, not a value given: the row's argument rule still fills what depends on the inputs.
        if (given != nullptr && !value.is_none()) *given = given->with(field);
    }
    return a;
}

// ---- conversions ----
DType parse_dtype(nb::handle dtype) {
    if (nb::isinstance<DType>(dtype)) return nb::cast<DType>(dtype);
    if (nb::isinstance<nb::str>(dtype)) {
        const std::string s = nb::cast<std::string>(dtype);
        if (s == "float32" || s == "float") return DType::f32;
        if (s == "float64" || s == "double") return DType::f64;
        if (s == "int64" || s == "long") return DType::i64;
        if (s == "bfloat16") return DType::bf16;
        if (s == "float16" || s == "half") return DType::f16;
        throw DTypeError(str("unknown dtype '", s, "': dyngrad has float32, float64, int64, bfloat16 and float16"));
    }
    throw nb::type_error(str("expected a dyngrad dtype or its name, got ", nb::cast<std::string>(nb::str(dtype.type()))).c_str());
}

Device parse_device(nb::handle device) {
    if (nb::isinstance<Device>(device)) return nb::cast<Device>(device);
    if (nb::isinstance<nb::str>(device)) {
        const std::string s = nb::cast<std::string>(device);
        if (s == "cpu") return Device::cpu();
        if (s == "cuda") return Device::cuda(0);
        if (s.rfind("cuda:", 0) == 0) {
            const std::string index = s.substr(5);
            if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos && index.size() < 6)
                return Device::cuda(std::stoi(index));
        }
        throw DeviceError(str("unknown device '", s, "': expected 'cpu', 'cuda' or 'cuda:N'"));
    }
    throw nb::type_error(str("expected a dyngrad device or its name, got ", nb::cast<std::string>(nb::str(device.type()))).c_str());
}

Shape shape_from(nb::handle args, const char* who) {
    // reshape(2, 3) or reshape((2, 3)); ints or objects with __index__ only (no '3', no 3.0)
    const char* expected = "ints or one sequence of ints";
    std::vector<std::int64_t> dims;
    nb::tuple t = nb::borrow<nb::tuple>(args);
    if (t.size() == 1 && !is_one_int(t[0])) dims = arg_as<std::vector<std::int64_t>>(t[0], who, "size", expected);
    else dims = arg_as<std::vector<std::int64_t>>(t, who, "size", expected);
    return Shape(dims.begin(), dims.end());
}

std::vector<Parameter> parameters_of(const std::vector<PyTensor*>& tensors, const char* who) {
    std::vector<Parameter> out;
    out.reserve(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (tensors[i] == nullptr) throw ValueError(str(who, ": parameter ", i, " is None"));
        if (!tensors[i]->parameter.defined())
            throw ValueError(str(who, ": tensor ", i, " ", describe(tensors[i]->data()),
                                 " is not a leaf that requires grad (use dyngrad.nn.Parameter or requires_grad=True)"));
        out.push_back(tensors[i]->parameter);
    }
    return out;
}

namespace {

// A Python call as the row's argument rule sees it (graph/front_door.h): None operands are left out, and what
// the rule fills in lives here until the op has run.
class PyOpCall final : public OpCall {
public:
    PyOpCall(std::span<const PyTensor*> operands, OpAttrs& attrs, AttrSet given)
        : OpCall(attrs, given, python_site()), operands_(operands) {}
    std::size_t size() const override { return operands_.size(); }
    const Tensor* value(std::size_t i) const override { return operands_[i] ? &operands_[i]->data() : nullptr; }
    void fill(std::size_t i, const Tensor& constant) override {
        filled_[i] = PyTensor(constant);
        operands_[i] = &filled_[i];
    }
    // The operands up to the last one present (prepare_call has refused a gap before it).
    std::span<const PyTensor* const> operands() const {
        std::size_t present = operands_.size();
        while (present > 0 && operands_[present - 1] == nullptr) --present;
        return operands_.first(present);
    }

private:
    std::span<const PyTensor*> operands_;
    std::array<PyTensor, 8> filled_;
};

}  // namespace

void bind_op_path(nb::module_& m) {
    // Every op of the table by its id: dyngrad/ops.py generates one function per row from op_table().
    // The inputs are read straight from the list (no std::vector per call for up to 8 inputs).
    m.def("apply", [](int op_index, nb::handle input_list, const nb::dict& kwargs) {
        if (op_index <= 0 || op_index >= static_cast<int>(kOpTypeCount) ||
            static_cast<OpType>(op_index) == OpType::Custom)
            throw ValueError(str("apply: no op with index ", op_index));
        const OpType op = static_cast<OpType>(op_index);
        const OpDef& def = op_def(op);
        if (!PyList_Check(input_list.ptr()) && !PyTuple_Check(input_list.ptr()))
            throw nb::type_error(str(def.name, "(): the inputs must be a list of tensors, got ",
                                     nb::cast<std::string>(nb::str(input_list.type())))
                                     .c_str());
        PyObject* const* items = PySequence_Fast_ITEMS(input_list.ptr());
        const auto count = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(input_list.ptr()));
        std::array<const PyTensor*, 8> inline_inputs{};
        std::vector<const PyTensor*> many;
        if (count > inline_inputs.size()) many.resize(count);
        const PyTensor** inputs = count > inline_inputs.size() ? many.data() : inline_inputs.data();
        bool left_out = false;
        for (std::size_t i = 0; i < count; ++i) {
            if (items[i] == Py_None) {  // an optional input left out: the row's argument rule may fill it
                if (def.arity == kVariadic || static_cast<int>(i) < def.arity - def.optional_inputs)
                    throw nb::type_error(str(def.name, "(): input ", i, " is None").c_str());
                inputs[i] = nullptr;
                left_out = true;
                continue;
            }
            inputs[i] = as_tensor(items[i]);
            if (inputs[i] == nullptr)
                throw nb::type_error(str(def.name, "(): input ", i, " must be a dyngrad.Tensor, got ",
                                         nb::cast<std::string>(nb::str(nb::handle(items[i]).type())))
                                         .c_str());
        }
        if (!takes_input_count(def, static_cast<int>(count)))
            throw nb::type_error(str(def.name, "() takes ", input_count_text(def), " tensor inputs, got ", count).c_str());
        const std::span<const PyTensor* const> input_span(inputs, count);
        const bool plain = def.prepare == nullptr && !left_out;
        if (plain && PyDict_GET_SIZE(kwargs.ptr()) == 0) return apply(op, input_span, no_attrs());
        AttrSet given;
        OpAttrs attrs = parse_attrs(def, kwargs, &given);
        if (plain) return apply(op, input_span, attrs);
        PyOpCall call(std::span<const PyTensor*>(inputs, count), attrs, given);  // the rule the C++ front doors run
        prepare_call(def, call);
        return apply(op, call.operands(), attrs);
    });  // positional only: nanobind's vectorcall then skips keyword matching
    // The op's checks without recording or running it (graph/front_door.h's check_op_call), each input viewed with
    // the shape given for it (None: its own): a composite in dyngrad/functional.py checks the op it will end in
    // before it records the reshapes that lead there, so a refused call records nothing (as the C++ front doors).
    m.def("check_call", [](int op_index, const nb::list& input_list, const nb::list& shapes, const nb::dict& kwargs) {
        if (op_index <= 0 || op_index >= static_cast<int>(kOpTypeCount) ||
            static_cast<OpType>(op_index) == OpType::Custom)
            throw ValueError(str("check_call: no op with index ", op_index));
        const OpType op = static_cast<OpType>(op_index);
        const OpDef& def = op_def(op);
        if (shapes.size() != input_list.size())
            throw ValueError(str(def.name, ": check_call: ", shapes.size(), " shapes for ", input_list.size(), " inputs"));
        std::vector<Tensor> values;
        for (std::size_t i = 0; i < input_list.size(); ++i) {
            const PyTensor* t = as_tensor(input_list[i].ptr());
            if (t == nullptr)
                throw nb::type_error(str(def.name, "(): input ", i, " must be a dyngrad.Tensor").c_str());
            values.push_back(shapes[i].is_none() ? t->data() : t->data().reshaped(nb::cast<Shape>(shapes[i])));
        }
        AttrSet given;
        check_op_call(op, values, parse_attrs(def, kwargs, &given), python_site());
    });
    m.def("op_table", [] {
        nb::list rows;
        for (const OpDef& def : op_table()) {
            if (def.op == OpType::Leaf || def.op == OpType::Custom) continue;
            rows.append(nb::make_tuple(def.name, static_cast<int>(def.op), def.arity, def.optional_inputs,
                                       def.differentiable));
        }
        return rows;
    });

}

}  // namespace dyngrad::python
