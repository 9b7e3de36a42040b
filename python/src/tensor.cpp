// dyngrad.Tensor: its class, indexing and operators (docs/python.md). The op path: src/op_path.cpp; the factories:
// src/factories.cpp.
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

}  // namespace

const PyTensor* as_tensor(PyObject* o) {
    if (Py_TYPE(o) != tensor_type && !PyType_IsSubtype(Py_TYPE(o), tensor_type)) return nullptr;
    return nb::inst_ptr<PyTensor>(o);
}

namespace {

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


// ---- backward ----
// The engine's marking (nodes reachable from the root through nodes that require grad): a stale leaf among
// them would take a gradient that its released history cannot pass on, which PyTorch refuses as well
// ("backward through the graph a second time"). Checked before the backward, so no gradient changes.
void refuse_released_history(GraphBox& box, NodeId root) {
    const ComputeGraph& graph = box.graph();
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

}

}  // namespace dyngrad::python
