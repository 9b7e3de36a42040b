// dyngrad.Tensor, the implicit graph, the op path and the factories (docs/python.md).
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <atomic>
#include <span>
#include <cstring>
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
        t.leaf = t.parameter.defined() ? box->graph.parameter(t.parameter, where) : box->graph.constant(t.value, where);
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
            t.leaf = box->graph.input(t.data(), "", requires_grad, where);
            t.leaf_epoch = box->leaf_epoch;
            t.leaf_data = data;
            t.leaf_requires_grad = requires_grad;
            if (requires_grad) box->stale_leaves.emplace_back(t.leaf.id(), t.graph->graph.describe_node(t.var.id()));
            return t.leaf;
        }
        throw GraphError(str("a tensor from ", t.graph->graph.describe_node(t.var.id()),
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
    ComputeGraph& graph = box->graph;
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
namespace {

// Default attributes, built once: an OpAttrs is large to construct and destroy on every call.
const OpAttrs& no_attrs() {
    static const OpAttrs attrs;
    return attrs;
}

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

OpAttrs parse_attrs(const OpDef& def, const nb::dict& kwargs) {
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
    }
    if (def.op == OpType::Rnn) a.save_for_backward = grad_enabled();  // what ops/rnn's function does
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

// ---- indexing: ints, slices, None, ..., int64 index tensors ----
PyTensor narrow_axis(const PyTensor& t, std::int64_t axis, std::int64_t start, std::int64_t length) {
    OpAttrs a;
    a.axis = axis;
    a.start = start;
    a.length = length;
    return apply(OpType::Narrow, {&t}, a);
}

PyTensor reshape_to(const PyTensor& t, const Shape& shape) {
    if (t.data().shape() == shape) return t;
    OpAttrs a;
    a.shape = shape;
    return apply(OpType::Reshape, {&t}, a);
}

PyTensor index_select_axis(const PyTensor& t, std::int64_t axis, const PyTensor& index) {
    OpAttrs a;
    a.axis = axis;
    return apply(OpType::IndexSelect, {&t, &index}, a);
}

// A bool used as an index (Python's or NumPy's): NumPy and PyTorch add an axis of length 1 (True) or 0 (False)
// where it stands and consume none; it must not be taken as the int 1 or 0.
bool is_bool_index(nb::handle h) {
    if (PyBool_Check(h.ptr())) return true;
    const char* type = Py_TYPE(h.ptr())->tp_name;
    return std::strcmp(type, "numpy.bool") == 0 || std::strcmp(type, "numpy.bool_") == 0;
}

PyTensor getitem(const PyTensor& x, nb::handle key) {
    std::vector<nb::handle> items;
    nb::tuple key_tuple;
    if (nb::isinstance<nb::tuple>(key)) {
        key_tuple = nb::borrow<nb::tuple>(key);
        for (nb::handle h : key_tuple) items.push_back(h);
    } else {
        items.push_back(key);
    }
    const Shape& in_shape = x.data().shape();
    std::size_t consumed = 0, ellipses = 0;
    bool any_false = false;  // a False index: the result has no elements (an axis of length 0)
    for (nb::handle h : items) {
        if (h.is_none()) continue;
        if (is_bool_index(h)) {
            any_false = any_false || !PyObject_IsTrue(h.ptr());
            continue;
        }
        if (h.ptr() == Py_Ellipsis) { ++ellipses; continue; }
        ++consumed;
    }
    if (ellipses > 1) throw IndexError("an index can only have a single ellipsis ('...')");
    if (consumed > in_shape.size())
        throw IndexError(str("too many indices for a tensor of rank ", in_shape.size(), ": ", consumed, " given"));

    PyTensor t = x;
    Shape out_shape;
    std::int64_t axis = 0;  // axis of `t` the next item addresses (t keeps every axis until the final reshape)
    std::vector<std::size_t> false_axes;  // where False indices stand in the result
    for (nb::handle h : items) {
        if (h.is_none()) {
            out_shape.push_back(1);
            continue;
        }
        if (is_bool_index(h)) {
            if (!PyObject_IsTrue(h.ptr())) false_axes.push_back(out_shape.size());
            out_shape.push_back(1);
            continue;
        }
        if (h.ptr() == Py_Ellipsis) {
            const std::size_t skip = in_shape.size() - consumed;
            for (std::size_t i = 0; i < skip; ++i) out_shape.push_back(in_shape[axis++]);
            continue;
        }
        const std::int64_t n = in_shape[axis];
        if (nb::isinstance<nb::int_>(h) || (PyIndex_Check(h.ptr()) && !nb::isinstance<PyTensor>(h))) {
            std::int64_t i = PyNumber_AsSsize_t(h.ptr(), PyExc_IndexError);
            if (i == -1 && PyErr_Occurred()) throw nb::python_error();
            if (i < -n || i >= n)
                throw IndexError(str("index ", i, " is out of bounds for axis ", axis, " with size ", n));
            if (i < 0) i += n;
            t = narrow_axis(t, axis, i, 1);
            ++axis;
        } else if (PySlice_Check(h.ptr())) {
            Py_ssize_t start, stop, step;
            if (PySlice_Unpack(h.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
            const Py_ssize_t length = PySlice_AdjustIndices(static_cast<Py_ssize_t>(n), &start, &stop, step);
            if (step == 1) {
                if (length != n) t = narrow_axis(t, axis, start, length);
            } else {
                std::vector<std::int64_t> picks(static_cast<std::size_t>(length));
                for (Py_ssize_t k = 0; k < length; ++k) picks[static_cast<std::size_t>(k)] = start + k * step;
                const PyTensor index(Tensor::from_vector(picks, {length}, t.data().device()));
                t = index_select_axis(t, axis, index);
            }
            out_shape.push_back(length);
            ++axis;
        } else if (nb::isinstance<PyTensor>(h)) {
            const PyTensor& index = nb::cast<const PyTensor&>(h);
            if (index.data().dtype() != DType::i64 || index.data().rank() != 1)
                throw IndexError(str("a tensor index must be a 1-D int64 tensor, got ", describe(index.data())));
            t = index_select_axis(t, axis, index);
            out_shape.push_back(index.data().numel());
            ++axis;
        } else {
            throw nb::type_error(str("tensor indices must be ints, slices, None, ... or 1-D int64 tensors, got ",
                                     nb::cast<std::string>(nb::str(h.type())))
                                     .c_str());
        }
    }
    for (std::size_t i = static_cast<std::size_t>(axis); i < in_shape.size(); ++i) out_shape.push_back(in_shape[i]);
    t = reshape_to(t, out_shape);
    // False: the new axis of length 1 narrowed to none of it (the gradient flows back as zeros).
    if (any_false) t = narrow_axis(t, static_cast<std::int64_t>(false_axes.front()), 0, 0);
    return t;
}

// ---- scalars as tensors (comparisons, reversed division) ----
PyTensor scalar_like(const PyTensor& t, double value) {
    return PyTensor(Tensor::full({}, value, t.data().dtype(), t.data().device()));
}

PyTensor unary(OpType op, const PyTensor& x, double scalar = 0.0) {
    OpAttrs a;
    a.scalar = scalar;
    return apply(op, {&x}, a);
}

PyTensor binary(OpType op, const PyTensor& a, const PyTensor& b) { return apply(op, {&a, &b}, no_attrs()); }

// A comparison's result is a mask: x[t > 0] selects by it (PyTensor::mask).
PyTensor as_mask(PyTensor t) {
    t.mask = true;
    return t;
}

// As ops/elementwise.cpp's comparisons: an int64 operand (labels, argmax) compares in the other's float dtype,
// float64 when both are int64; it has no gradient, so its converted value is a constant.
PyTensor compare(OpType op, const PyTensor& a, const PyTensor& b) {
    const DType da = a.data().dtype(), db = b.data().dtype();
    if (da != DType::i64 && db != DType::i64) return as_mask(binary(op, a, b));
    const DType dtype = da != DType::i64 ? da : db != DType::i64 ? db : DType::f64;
    const auto as = [dtype](const PyTensor& t) {
        return t.data().dtype() == DType::i64 ? PyTensor(t.data().to(dtype)) : t;
    };
    return as_mask(binary(op, as(a), as(b)));
}

PyTensor compare_scalar(OpType op, const PyTensor& a, double s) {
    if (a.data().dtype() == DType::i64)  // `labels == 2.5` is false everywhere, not a truncated 2
        return as_mask(binary(op, PyTensor(a.data().to(DType::f64)),
                              PyTensor(Tensor::full({}, s, DType::f64, a.data().device()))));
    const PyTensor b = scalar_like(a, s);
    return as_mask(binary(op, a, b));
}

// ---- arithmetic operators as CPython number slots ----
// `a + b` reaches these C functions directly: defining __add__ as a bound method instead made every
// operator go through CPython's generic slot wrapper (a method lookup and a vectorcall) and nanobind's
// overload resolution first, a large part of the per-op cost from Python. Each slot serves both operand
// orders (CPython calls it for `tensor + x` and `x + tensor`) and returns NotImplemented for operands it
// does not take, so Python then tries the other operand's method (a NumPy array's, for one).
PyTypeObject* tensor_type = nullptr;

const PyTensor* as_tensor(PyObject* o) {
    if (Py_TYPE(o) != tensor_type && !PyType_IsSubtype(Py_TYPE(o), tensor_type)) return nullptr;
    return nb::inst_ptr<PyTensor>(o);
}

// A Python or NumPy real scalar, bools included (not a sequence such as an array, not a tensor): what the
// bound methods' float conversion took before.
bool as_scalar(PyObject* o, double& value) {
    if (!(PyFloat_Check(o) || PyLong_Check(o) || PyIndex_Check(o) ||
          (Py_TYPE(o)->tp_as_number && Py_TYPE(o)->tp_as_number->nb_float && !PySequence_Check(o))))
        return false;
    value = PyFloat_AsDouble(o);
    if (value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    return true;
}

enum class Arith { Add, Sub, Mul, Div, Matmul };

PyTensor arith(Arith kind, const PyTensor& a, const PyTensor& b) {
    switch (kind) {
        case Arith::Add: return binary(OpType::Add, a, b);
        case Arith::Sub: return binary(OpType::Sub, a, b);
        case Arith::Mul: return binary(OpType::Mul, a, b);
        case Arith::Div: return binary(OpType::Div, a, b);
        case Arith::Matmul: break;
    }
    return binary(OpType::Matmul, a, b);
}

// tensor (op) scalar, or scalar (op) tensor when `reflected`.
PyTensor arith_scalar(Arith kind, const PyTensor& t, double s, bool reflected) {
    switch (kind) {
        case Arith::Add: return unary(OpType::AddScalar, t, s);
        case Arith::Mul: return unary(OpType::MulScalar, t, s);
        case Arith::Sub:
            if (!reflected) return unary(OpType::AddScalar, t, -s);
            return unary(OpType::AddScalar, unary(OpType::Neg, t), s);
        case Arith::Div:
            if (reflected) return binary(OpType::Div, scalar_like(t, s), t);
            if (s == 0.0) return binary(OpType::Div, t, scalar_like(t, s));
            return unary(OpType::MulScalar, t, 1.0 / s);
        case Arith::Matmul: break;
    }
    throw nb::type_error("matmul with a scalar");  // not reached: matmul takes tensors only
}

template <Arith kind>
PyObject* arith_slot(PyObject* left, PyObject* right) noexcept {
    try {
        const PyTensor* a = as_tensor(left);
        const PyTensor* b = as_tensor(right);
        double s = 0;
        enum { Tensors, TensorScalar, ScalarTensor } form;
        if (a && b) form = Tensors;
        else if (kind != Arith::Matmul && a && as_scalar(right, s)) form = TensorScalar;
        else if (kind != Arith::Matmul && b && as_scalar(left, s)) form = ScalarTensor;
        else Py_RETURN_NOTIMPLEMENTED;
        // The result is built in the new instance's storage (no move); an op that throws leaves the
        // instance unready, and dropping it then destroys nothing.
        nb::object out = nb::inst_alloc(nb::handle(reinterpret_cast<PyObject*>(tensor_type)));
        PyTensor* slot = nb::inst_ptr<PyTensor>(out);
        if (form == Tensors) new (slot) PyTensor(arith(kind, *a, *b));
        else if (form == TensorScalar) new (slot) PyTensor(arith_scalar(kind, *a, s, false));
        else new (slot) PyTensor(arith_scalar(kind, *b, s, true));
        nb::inst_mark_ready(out);
        return out.release().ptr();
    } catch (...) {
        set_python_error_from_current_exception();
        return nullptr;
    }
}

PyType_Slot tensor_slots[] = {
    {Py_nb_add, reinterpret_cast<void*>(&arith_slot<Arith::Add>)},
    {Py_nb_subtract, reinterpret_cast<void*>(&arith_slot<Arith::Sub>)},
    {Py_nb_multiply, reinterpret_cast<void*>(&arith_slot<Arith::Mul>)},
    {Py_nb_true_divide, reinterpret_cast<void*>(&arith_slot<Arith::Div>)},
    {Py_nb_matrix_multiply, reinterpret_cast<void*>(&arith_slot<Arith::Matmul>)},
    {0, nullptr},
};

// PyTorch's repr (core/tensor_print.cpp) with the autograd suffix: requires_grad=True on a leaf, grad_fn=<op>
// (the op table's name, not torch's MulBackward0) on a result with history.
std::string tensor_repr(const PyTensor& t) {
    std::vector<std::string> extra;
    if (t.requires_grad())
        extra.push_back(t.is_leaf() ? "requires_grad=True"
                                    : "grad_fn=<" + std::string(op_def(t.var.node().op, t.var.node().attrs).name) + ">");
    return format_tensor(t.data(), extra);
}

nb::tuple shape_tuple(const Shape& shape) {
    nb::list l;
    for (auto d : shape) l.append(d);
    return nb::tuple(l);
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

// ---- backward ----
// The engine's marking (nodes reachable from the root through nodes that require grad): a stale leaf among
// them would take a gradient that its released history cannot pass on, which PyTorch refuses as well
// ("backward through the graph a second time"). Checked before the backward, so no gradient changes.
void refuse_released_history(GraphBox& box, NodeId root) {
    const ComputeGraph& graph = box.graph;
    std::vector<char> reached(root + 1, 0);
    reached[root] = 1;
    for (NodeId id = root + 1; id-- > 0;) {
        if (!reached[id]) continue;
        for (const NodeInput& input : graph.node(id).inputs)
            if (graph.node(input.id).requires_grad) reached[input.id] = 1;
    }
    for (const auto& [leaf, origin] : box.stale_leaves)
        if (leaf <= root && reached[leaf])
            throw GraphError(str("backward from ", graph.describe_node(root), " needs the gradient of ", origin,
                                 ", a result of a graph an earlier backward() released; call that backward with "
                                 "retain_graph=True, or .detach() the tensor where it is reused"));
}

void run_backward(const PyTensor& t, std::optional<const PyTensor*> grad, bool retain_graph) {
    if (!t.has_history()) {
        if (t.parameter.defined())
            throw GraphError(str("backward() on a leaf ", describe(t.data()), ": nothing to differentiate"));
        throw GraphError(str("backward() on a tensor ", describe(t.data()),
                             " that does not require grad and has no history (no input required grad, or it was "
                             "computed under no_grad())"));
    }
    if (!t.graph->stale_leaves.empty()) refuse_released_history(*t.graph, t.var.id());
    BackwardOptions options;
    options.retain_graph = retain_graph;
    t.graph->leaf_epoch = GraphBox::next_leaf_epoch();
    run_graph_backward(*t.graph, t.var, grad && *grad != nullptr ? &(*grad)->data() : nullptr, options);
    if (!retain_graph) retire_graph(t.graph);
}

struct NoGradScope {
    std::optional<NoGradGuard> guard;
};
struct AnomalyScope {
    std::optional<AnomalyModeGuard> guard;
};

}  // namespace

void bind_tensor(nb::module_& m) {
    nb::enum_<DType>(m, "dtype")
        .value("float32", DType::f32)
        .value("float64", DType::f64)
        .value("int64", DType::i64)
        .value("bfloat16", DType::bf16)
        .value("float16", DType::f16);
    m.attr("float32") = DType::f32;
    m.attr("float64") = DType::f64;
    m.attr("int64") = DType::i64;
    m.attr("bfloat16") = DType::bf16;
    m.attr("float16") = DType::f16;

    nb::class_<Device>(m, "device")
        .def("__init__", [](Device* self, nb::handle spec) { new (self) Device(parse_device(spec)); }, nb::arg("spec"))
        .def_prop_ro("type", [](const Device& d) { return d.is_cpu() ? "cpu" : "cuda"; })
        .def_prop_ro("index", [](const Device& d) { return d.index; })
        .def("__str__", &Device::to_string)
        .def("__repr__", [](const Device& d) { return "device('" + d.to_string() + "')"; })
        .def("__eq__", [](const Device& d, nb::handle other) {
            try {
                return d == parse_device(other);
            } catch (const std::exception&) {
                return false;
            }
        })
        .def("__hash__", [](const Device& d) { return static_cast<int>(d.kind) * 1000 + d.index; });

    nb::class_<PyTensor> tensor(m, "Tensor", nb::type_slots(tensor_slots));
    tensor_type = reinterpret_cast<PyTypeObject*>(tensor.ptr());
    tensor.def(nb::init<>())
        // Tensor(other, requires_grad): shares other's storage; a leaf that requires grad shares other's
        // parameter state (nn.Parameter wraps layers' parameters this way).
        .def("__init__",
             [](PyTensor* self, const PyTensor& other, bool requires_grad) {
                 new (self) PyTensor(other.data());
                 if (!requires_grad) return;
                 self->parameter = other.parameter.defined() ? other.parameter : Parameter(other.data());
                 self->parameter.set_requires_grad(true);
             },
             nb::arg("other"), nb::arg("requires_grad") = false)
        .def_prop_ro("shape", [](const PyTensor& t) { return shape_tuple(t.data().shape()); })
        .def("size", [](const PyTensor& t, std::optional<std::int64_t> dim) -> nb::object {
                 if (dim) return nb::int_(t.data().size(*dim));
                 return shape_tuple(t.data().shape());
             }, nb::arg("dim") = nb::none())
        .def_prop_ro("ndim", [](const PyTensor& t) { return t.data().rank(); })
        .def("dim", [](const PyTensor& t) { return t.data().rank(); })
        .def("numel", [](const PyTensor& t) { return t.data().numel(); })
        .def_prop_ro("dtype", [](const PyTensor& t) { return t.data().dtype(); })
        .def_prop_ro("device", [](const PyTensor& t) { return t.data().device(); })
        .def_prop_ro("is_leaf", &PyTensor::is_leaf)
        .def_prop_ro("is_parameter", [](const PyTensor& t) { return t.parameter.defined(); })
        .def_prop_rw(
            "requires_grad", &PyTensor::requires_grad,
            [](PyTensor& t, bool on) {
                if (t.has_history()) {
                    if (on) return;
                    throw GraphError("requires_grad can only be changed on leaves; use .detach() on a result");
                }
                if (t.parameter.defined()) {
                    t.parameter.set_requires_grad(on);
                    return;
                }
                if (!on) return;
                if (!is_floating(t.value.dtype()))
                    throw DTypeError(str("only float tensors can require grad, got ", describe(t.value)));
                t.parameter = Parameter(t.value);
            })
        .def_prop_rw(
            "grad",
            [](const PyTensor& t) -> std::optional<PyTensor> {
                if (!t.parameter.defined() || !t.parameter.grad().defined()) return std::nullopt;
                return PyTensor(t.parameter.grad());
            },
            [](PyTensor& t, std::optional<const PyTensor*> g) {
                if (g && *g) throw nb::type_error("assigning a gradient is not supported; only `x.grad = None`");
                if (t.parameter.defined()) t.parameter.zero_grad();
            },
            nb::arg("value").none())
        .def_prop_rw(
            "name", [](const PyTensor& t) { return t.parameter.defined() ? t.parameter.name() : std::string(); },
            [](PyTensor& t, const std::string& name) {
                if (t.parameter.defined()) t.parameter.set_name(name);
                if (t.has_history()) t.var.name(name);
            })
        .def("backward", [](const PyTensor& t, std::optional<const PyTensor*> gradient, bool retain_graph) {
                 run_backward(t, gradient, retain_graph);
             }, nb::arg("gradient").none() = nb::none(), nb::arg("retain_graph") = false)
        .def("detach", [](const PyTensor& t) { return PyTensor(t.data()); })
        .def_prop_ro("data", [](const PyTensor& t) { return PyTensor(t.data()); })
        .def("item", [](const PyTensor& t) -> nb::object {
                 const double v = t.data().item();
                 if (t.data().dtype() == DType::i64) return nb::int_(static_cast<std::int64_t>(v));
                 return nb::float_(v);
             })
        .def("tolist_flat", [](const PyTensor& t) { return t.data().to_vector(); })
        .def("to", [](const PyTensor& t, nb::handle first, nb::handle second, nb::handle device, nb::handle dtype,
                      bool non_blocking, bool copy) {
                 // PyTorch's forms: to(device), to(dtype), to(device, dtype), to(other), to(device=, dtype=).
                 (void)non_blocking;  // copies to a GPU are ordered on dyngrad's stream either way
                 std::optional<Device> to_device;
                 std::optional<DType> to_dtype;
                 const auto take = [&](nb::handle h) {
                     if (h.is_none()) return;
                     if (nb::isinstance<PyTensor>(h)) {
                         const Tensor& other = nb::cast<const PyTensor&>(h).data();
                         to_device = other.device();
                         to_dtype = other.dtype();
                     } else if (nb::isinstance<DType>(h) ||
                                (nb::isinstance<nb::str>(h) && nb::cast<std::string>(h).rfind("cpu", 0) != 0 &&
                                 nb::cast<std::string>(h).rfind("cuda", 0) != 0)) {
                         to_dtype = parse_dtype(h);
                     } else {
                         to_device = parse_device(h);
                     }
                 };
                 take(first);
                 take(second);
                 if (!device.is_none()) to_device = parse_device(device);
                 if (!dtype.is_none()) to_dtype = parse_dtype(dtype);
                 const Tensor& value = t.data();
                 const Device d = to_device.value_or(value.device());
                 const DType dt = to_dtype.value_or(value.dtype());
                 if (d == value.device() && dt == value.dtype() && !copy) return t;  // PyTorch returns self
                 Tensor out = value.to(d, dt);
                 return PyTensor(copy && out.raw_data() == value.raw_data() ? out.clone() : out);
             }, nb::arg("target").none() = nb::none(), nb::arg("dtype_").none() = nb::none(), nb::kw_only(),
             nb::arg("device").none() = nb::none(), nb::arg("dtype").none() = nb::none(),
             nb::arg("non_blocking") = false, nb::arg("copy") = false)
        .def("clone", [](const PyTensor& t) { return PyTensor(t.data().clone()); })
        .def("contiguous", [](const PyTensor& t) { return t; })
        // The in-place API (copy_, fill_, add_, x[i] = v, x += 1, ...) is python/dyngrad/_inplace.py over these
        // two: _write_ copies src's values (broadcast and converted there) into this storage and bumps its version
        // (the engine then refuses a backward that needs the old values); _rebind makes this object stand for
        // another result (an in-place op recorded with history: the old node's value stays as it was).
        .def("_write_", [](PyTensor& t, const PyTensor& src) {
                 const Tensor& from = src.data();
                 const_cast<Tensor&>(t.data()).copy_from(from.dtype() == t.data().dtype() ? from : from.to(t.data().dtype()));
             })
        .def("_rebind", [](PyTensor& t, const PyTensor& other) {
                 const bool mask = t.mask;
                 t = other;
                 t.mask = mask && other.mask;
             })
        .def_prop_rw("_is_mask", [](const PyTensor& t) { return t.mask; }, [](PyTensor& t, bool m) { t.mask = m; })
        .def("_set_value", [](PyTensor& t, const PyTensor& src) {
                 // Module.to(): a new value for a leaf (parameters keep their identity and gradient state).
                 if (t.has_history()) throw GraphError("_set_value on a tensor with history");
                 if (t.parameter.defined()) t.parameter.value() = src.data();
                 else t.value = src.data();
             })
        .def("_storage_version", [](const PyTensor& t) { return t.data().version(); })
        .def("_data_ptr", [](const PyTensor& t) { return reinterpret_cast<std::uintptr_t>(t.data().raw_data()); })
        .def("data_ptr", [](const PyTensor& t) { return reinterpret_cast<std::uintptr_t>(t.data().raw_data()); })
        .def("reshape", [](const PyTensor& t, nb::args shape) { return reshape_to(t, shape_from(shape, "reshape")); })
        .def("view", [](const PyTensor& t, nb::args shape) { return reshape_to(t, shape_from(shape, "view")); })
        .def("__getitem__", &getitem)
        .def("__len__", [](const PyTensor& t) {
            if (t.data().rank() == 0) throw nb::type_error("len() of a 0-d tensor");
            return t.data().size(0);
        })
        .def("__repr__", &tensor_repr)
        .def("__float__", [](const PyTensor& t) { return t.data().item(); })
        .def("__int__", [](const PyTensor& t) { return static_cast<std::int64_t>(t.data().item()); })
        .def("__index__", [](const PyTensor& t) {
            if (t.data().dtype() != DType::i64) throw nb::type_error("only int64 one-element tensors are indices");
            return static_cast<std::int64_t>(t.data().item());
        })
        .def("__bool__", [](const PyTensor& t) {
            if (t.data().numel() != 1)
                throw ValueError(str("the truth value of a tensor of ", t.data().numel(), " elements is ambiguous"));
            return t.data().item() != 0.0;
        })
        .def("__hash__", [](nb::handle self) { return reinterpret_cast<std::intptr_t>(self.ptr()) >> 4; })
        // operators
        .def("__pow__", [](const PyTensor& a, double e) { return unary(OpType::PowScalar, a, e); }, nb::is_operator())
        .def("__neg__", [](const PyTensor& a) { return unary(OpType::Neg, a); })
        .def("__abs__", [](const PyTensor& a) { return unary(OpType::Abs, a); })
        .def("__eq__", [](const PyTensor& a, const PyTensor& b) { return compare(OpType::Eq, a, b); }, nb::is_operator())
        .def("__eq__", [](const PyTensor& a, double s) { return compare_scalar(OpType::Eq, a, s); }, nb::is_operator())
        .def("__ne__", [](const PyTensor& a, const PyTensor& b) { return compare(OpType::Ne, a, b); }, nb::is_operator())
        .def("__ne__", [](const PyTensor& a, double s) { return compare_scalar(OpType::Ne, a, s); }, nb::is_operator())
        .def("__lt__", [](const PyTensor& a, const PyTensor& b) { return compare(OpType::Lt, a, b); }, nb::is_operator())
        .def("__lt__", [](const PyTensor& a, double s) { return compare_scalar(OpType::Lt, a, s); }, nb::is_operator())
        .def("__le__", [](const PyTensor& a, const PyTensor& b) { return compare(OpType::Le, a, b); }, nb::is_operator())
        .def("__le__", [](const PyTensor& a, double s) { return compare_scalar(OpType::Le, a, s); }, nb::is_operator())
        .def("__gt__", [](const PyTensor& a, const PyTensor& b) { return compare(OpType::Gt, a, b); }, nb::is_operator())
        .def("__gt__", [](const PyTensor& a, double s) { return compare_scalar(OpType::Gt, a, s); }, nb::is_operator())
        .def("__ge__", [](const PyTensor& a, const PyTensor& b) { return compare(OpType::Ge, a, b); }, nb::is_operator())
        .def("__ge__", [](const PyTensor& a, double s) { return compare_scalar(OpType::Ge, a, s); }, nb::is_operator());

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
        for (std::size_t i = 0; i < count; ++i) {
            if (items[i] == Py_None) throw nb::type_error(str(def.name, "(): input ", i, " is None").c_str());
            inputs[i] = as_tensor(items[i]);
            if (inputs[i] == nullptr)
                throw nb::type_error(str(def.name, "(): input ", i, " must be a dyngrad.Tensor, got ",
                                         nb::cast<std::string>(nb::str(nb::handle(items[i]).type())))
                                         .c_str());
        }
        if (!takes_input_count(def, static_cast<int>(count)))
            throw nb::type_error(str(def.name, "() takes ", input_count_text(def), " tensor inputs, got ", count).c_str());
        const std::span<const PyTensor* const> input_span(inputs, count);
        if (PyDict_GET_SIZE(kwargs.ptr()) == 0 && op != OpType::Rnn) return apply(op, input_span, no_attrs());
        return apply(op, input_span, parse_attrs(def, kwargs));
    });  // positional only: nanobind's vectorcall then skips keyword matching
    m.def("op_table", [] {
        nb::list rows;
        for (const OpDef& def : op_table()) {
            if (def.op == OpType::Leaf || def.op == OpType::Custom) continue;
            rows.append(nb::make_tuple(def.name, static_cast<int>(def.op), def.arity, def.optional_inputs,
                                       def.differentiable));
        }
        return rows;
    });

    // Factories
    m.def("_from_numpy_copy", [](nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu> array, nb::handle device) {  // read only: copies
        DType dtype;
        const auto dt = array.dtype();
        if (dt == nb::dtype<float>()) dtype = DType::f32;
        else if (dt == nb::dtype<double>()) dtype = DType::f64;
        else if (dt == nb::dtype<std::int64_t>()) dtype = DType::i64;
        else throw DTypeError("tensor(): expects float32, float64 or int64 data after conversion");
        Shape shape;
        for (std::size_t i = 0; i < array.ndim(); ++i) shape.push_back(static_cast<std::int64_t>(array.shape(i)));
        Tensor t = Tensor::empty(shape, dtype);
        if (t.nbytes() > 0) std::memcpy(t.raw_data(), array.data(), t.nbytes());
        const Device target = device.is_none() ? Device::cpu() : parse_device(device);
        return PyTensor(target.is_cpu() ? t : t.to(target));
    }, nb::arg("array"), nb::arg("device").none());
    const auto factory = [&m](const char* name, double fill) {
        m.def(name, [fill, name](nb::args shape, nb::handle dtype, nb::handle device, bool requires_grad) {
            PyTensor t(Tensor::full(shape_from(shape, name), fill, dtype.is_none() ? DType::f32 : parse_dtype(dtype),
                                    device.is_none() ? Device::cpu() : parse_device(device)));
            if (requires_grad) t.parameter = Parameter(t.value);
            return t;
        }, nb::arg("shape"), nb::kw_only(), nb::arg("dtype").none() = nb::none(), nb::arg("device").none() = nb::none(),
              nb::arg("requires_grad") = false);
    };
    factory("zeros", 0.0);
    factory("ones", 1.0);
    m.def("full", [](nb::handle shape, double value, nb::handle dtype, nb::handle device) {
        return PyTensor(Tensor::full(shape_from(nb::make_tuple(shape), "full"), value,
                                     dtype.is_none() ? DType::f32 : parse_dtype(dtype),
                                     device.is_none() ? Device::cpu() : parse_device(device)));
    }, nb::arg("shape"), nb::arg("fill_value"), nb::kw_only(), nb::arg("dtype").none() = nb::none(),
          nb::arg("device").none() = nb::none());
    m.def("arange", [](nb::handle start, nb::handle end, nb::handle step, nb::handle dtype, nb::handle device) {
        // PyTorch's rule: all integers (Python or NumPy) give int64, any float gives float32; dtype= wins.
        bool integers = true;
        const auto number = [&](nb::handle v, const char* name) {
            if (PyIndex_Check(v.ptr())) {
                const nb::object index = nb::steal(PyNumber_Index(v.ptr()));
                if (!index.is_valid()) throw nb::python_error();
                return static_cast<double>(nb::cast<std::int64_t>(index));
            }
            if (PyFloat_Check(v.ptr()) || PyNumber_Check(v.ptr())) {  // a NumPy float32 is no Python float
                integers = false;
                const double value = PyFloat_AsDouble(v.ptr());
                if (value == -1.0 && PyErr_Occurred()) throw nb::python_error();
                return value;
            }
            throw nb::type_error(str("arange(): argument '", name, "' must be a number, got ",
                                     nb::cast<std::string>(nb::str(v.type().attr("__name__")))).c_str());
        };
        const double first = number(start, "start");
        const double last = end.is_none() ? 0.0 : number(end, "end");
        const double stride = number(step, "step");
        const double from = end.is_none() ? 0.0 : first, to = end.is_none() ? first : last;
        const DType dt = !dtype.is_none() ? parse_dtype(dtype) : integers ? DType::i64 : DType::f32;
        return PyTensor(Tensor::arange(from, to, stride, dt, device.is_none() ? Device::cpu() : parse_device(device)));
    }, nb::arg("start"), nb::arg("end").none() = nb::none(), nb::arg("step") = nb::int_(1), nb::kw_only(),
          nb::arg("dtype").none() = nb::none(), nb::arg("device").none() = nb::none());
    const auto random_factory = [&m](const char* name, bool normal) {
        m.def(name, [normal, name](nb::args shape, nb::handle dtype, nb::handle device, bool requires_grad) {
            const DType dt = dtype.is_none() ? DType::f32 : parse_dtype(dtype);
            const Device dev = device.is_none() ? Device::cpu() : parse_device(device);
            const Shape dims = shape_from(shape, name);
            PyTensor t(normal ? Tensor::normal(dims, 0.0, 1.0, default_generator(), dt, dev)
                              : Tensor::uniform(dims, 0.0, 1.0, default_generator(), dt, dev));
            if (requires_grad) t.parameter = Parameter(t.value);
            return t;
        }, nb::arg("shape"), nb::kw_only(), nb::arg("dtype").none() = nb::none(), nb::arg("device").none() = nb::none(),
              nb::arg("requires_grad") = false);
    };
    random_factory("randn", true);
    random_factory("rand", false);
    m.def("manual_seed", [](std::uint64_t seed) { default_generator() = Generator(seed); }, nb::arg("seed"));
    // PyTorch's torch.Generator for the samplers (multinomial): a seeded stream of its own.
    nb::class_<Generator>(m, "Generator")
        .def(nb::init<std::uint64_t>(), nb::arg("seed") = 0)
        .def("manual_seed", [](Generator& g, std::uint64_t seed) -> Generator& { return g = Generator(seed); },
             nb::arg("seed"), nb::rv_policy::reference);
    // One 64-bit draw of `generator` (None: the default one manual_seed sets): the seed of a counter-based op.
    m.def("_draw_seed", [](Generator* generator) {
        return static_cast<std::uint64_t>((generator ? *generator : default_generator()).engine()());
    }, nb::arg("generator").none() = nb::none());

    // Autograd switches (context managers in dyngrad/__init__.py)
    nb::class_<NoGradScope>(m, "_NoGradScope")
        .def(nb::init<>())
        .def("enter", [](NoGradScope& s) { s.guard.emplace(); })
        .def("exit", [](NoGradScope& s) { s.guard.reset(); });
    m.def("is_grad_enabled", &grad_enabled);
    nb::class_<AnomalyScope>(m, "_AnomalyScope")
        .def(nb::init<>())
        .def("enter", [](AnomalyScope& s, bool on) { s.guard.emplace(on); })
        .def("exit", [](AnomalyScope& s) { s.guard.reset(); });
    m.def("is_anomaly_enabled", &anomaly_mode_enabled);
    m.def("_set_package_dir", &set_package_dir);
    m.def("_graph_size", [] {
        const std::shared_ptr<GraphBox> box = current_graph();
        return box->graph.size();
    });
    m.def("_caller_site", [] { return describe_site(python_site()); });
    m.def("cuda_is_available", [] { return cuda_device_count() > 0; });
    m.def("cuda_device_count", &cuda_device_count);
    m.def("cuda_compiled", &cuda_compiled);
    m.def("_capturing", [](int device) { return cuda::capturing(device); }, nb::arg("device"));
    m.def("cuda_synchronize", [](int device) { cuda::synchronize(device); }, nb::arg("device") = 0);
    m.def("set_cpu_threads", &set_cpu_threads, nb::arg("threads"));
}

}  // namespace dyngrad::python
