// Zero-copy exchange (DLPack both ways, NumPy views) and custom ops written in Python (docs/python.md).
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <unordered_map>

#include "binding.h"

namespace dyngrad::python {

namespace {

// ---- DLPack (the unversioned ABI, DLManagedTensor; nanobind declares the tensor part) ----
struct ManagedTensor {
    nb::dlpack::dltensor dl;
    void* manager_ctx;
    void (*deleter)(ManagedTensor* self);
};
// DLPack 1.x (versioned): what NumPy 2 and PyTorch ask for with max_version; it carries a read-only flag,
// without which NumPy makes its view read-only.
struct DLPackVersion {
    std::uint32_t major, minor;
};
struct ManagedTensorVersioned {
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(ManagedTensorVersioned* self);
    std::uint64_t flags;
    nb::dlpack::dltensor dl;
};
constexpr const char* kVersionedCapsuleName = "dltensor_versioned";
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;
constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

struct ExportContext {
    Tensor tensor;  // keeps the storage alive while the consumer holds the view
    std::vector<std::int64_t> shape;
};

void delete_exported(ManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
    delete self;
}

void delete_exported_versioned(ManagedTensorVersioned* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
    delete self;
}

void destroy_unconsumed_versioned_capsule(PyObject* capsule) {
    if (!PyCapsule_IsValid(capsule, kVersionedCapsuleName)) return;
    auto* managed = static_cast<ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersionedCapsuleName));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

void destroy_unconsumed_capsule(PyObject* capsule) {
    // A capsule nobody consumed still owns its tensor; a consumer renames it and calls the deleter itself.
    if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
    auto* managed = static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

nb::dlpack::dtype dl_dtype(DType dtype) {
    switch (dtype) {
        case DType::f32: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 32, 1};
        case DType::f64: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 64, 1};
        case DType::i64: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int), 64, 1};
    }
    throw DTypeError("unknown dtype");
}

// DLPack's stream argument on CUDA: None is the legacy default stream (1), -1 asks for no synchronisation.
void sync_for_consumer(const Tensor& t, nb::handle stream) {
    if (!t.device().is_cuda()) return;
    std::int64_t s = 1;
    if (!stream.is_none()) s = arg_as<std::int64_t>(stream, "__dlpack__", "stream", "an int or None");
    if (s == -1) return;
    if (s == 0) throw ValueError("__dlpack__: stream=0 is ambiguous on CUDA (DLPack: use 1 for the legacy default stream)");
    cuda::make_stream_wait(static_cast<std::uintptr_t>(s), t.device().index);
}

nb::object to_dlpack(const PyTensor& self, nb::handle stream, nb::handle max_version, nb::handle dl_device,
                     nb::handle copy) {
    Tensor t = self.data();
    if (!dl_device.is_none()) {
        const auto target = arg_as<std::pair<int, int>>(dl_device, "__dlpack__", "dl_device", "a pair of ints or None");
        const bool same = t.device().is_cpu() ? target.first == kDLCPU
                                              : target.first == kDLCUDA && target.second == t.device().index;
        if (!same) {
            PyErr_SetString(PyExc_BufferError, "__dlpack__: dl_device other than the tensor's own needs a copy; use .to()");
            throw nb::python_error();
        }
    }
    const bool copied = !copy.is_none() && arg_as<bool>(copy, "__dlpack__", "copy", "a bool or None");
    if (copied) t = t.clone();
    sync_for_consumer(t, stream);
    auto context = std::make_unique<ExportContext>();
    context->tensor = t;
    context->shape.assign(t.shape().begin(), t.shape().end());
    nb::dlpack::dltensor dl;
    dl.data = t.numel() > 0 ? t.raw_data() : nullptr;
    dl.device = {t.device().is_cpu() ? kDLCPU : kDLCUDA, t.device().is_cpu() ? 0 : t.device().index};
    dl.ndim = static_cast<std::int32_t>(t.rank());
    dl.dtype = dl_dtype(t.dtype());
    dl.shape = context->shape.data();
    dl.strides = nullptr;  // compact row-major
    dl.byte_offset = 0;
    if (!max_version.is_none() &&
        arg_as<std::pair<int, int>>(max_version, "__dlpack__", "max_version", "a pair of ints or None").first >= 1) {
        auto managed = std::make_unique<ManagedTensorVersioned>();
        managed->version = {1, 0};
        managed->manager_ctx = context.get();
        managed->deleter = &delete_exported_versioned;
        managed->flags = copied ? 2u : 0u;  // DLPACK_FLAG_BITMASK_IS_COPIED
        managed->dl = dl;
        PyObject* capsule = PyCapsule_New(managed.get(), kVersionedCapsuleName, &destroy_unconsumed_versioned_capsule);
        if (capsule == nullptr) throw nb::python_error();
        context.release();
        managed.release();
        return nb::steal(capsule);
    }
    auto managed = std::make_unique<ManagedTensor>();
    managed->dl = dl;
    managed->manager_ctx = context.get();
    managed->deleter = &delete_exported;
    PyObject* capsule = PyCapsule_New(managed.get(), kCapsuleName, &destroy_unconsumed_capsule);
    if (capsule == nullptr) throw nb::python_error();
    context.release();
    managed.release();
    return nb::steal(capsule);
}

nb::tuple dlpack_device(const PyTensor& self) {
    const Device d = self.data().device();
    return nb::make_tuple(d.is_cpu() ? kDLCPU : kDLCUDA, d.is_cpu() ? 0 : d.index);
}

bool interpreter_alive() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsInitialized() && !Py_IsFinalizing();
#else
    return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

constexpr std::uint64_t kDLPackReadOnly = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY
constexpr const char* kUsedVersionedCapsuleName = "used_dltensor_versioned";

// A producer's tensor, without a copy, from a 'dltensor' or a DLPack 1.x 'dltensor_versioned' capsule. The
// producer's memory stays alive until the last dyngrad handle goes (its deleter runs then, with the GIL held).
// A read-only producer (the versioned capsule's flag) is refused: dyngrad tensors are writable, so sharing its
// memory would let dyngrad write where the producer promised nobody would.
Tensor from_capsule(nb::handle capsule_handle) {
    PyObject* capsule = capsule_handle.ptr();
    const bool versioned = PyCapsule_IsValid(capsule, kVersionedCapsuleName) != 0;
    if (!versioned && !PyCapsule_IsValid(capsule, kCapsuleName)) {
        if (PyCapsule_CheckExact(capsule) &&
            (PyCapsule_IsValid(capsule, kUsedCapsuleName) || PyCapsule_IsValid(capsule, kUsedVersionedCapsuleName)))
            throw ValueError("from_dlpack: this DLPack capsule was already consumed");
        throw nb::type_error("from_dlpack: expected an object with __dlpack__ or an unconsumed 'dltensor' capsule");
    }
    auto* plain = versioned ? nullptr : static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    auto* managed_v =
        versioned ? static_cast<ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersionedCapsuleName)) : nullptr;
    if (versioned && managed_v->version.major != 1)
        throw ValueError(str("from_dlpack: DLPack version ", managed_v->version.major, ".", managed_v->version.minor,
                             " is not supported (1.x is)"));
    if (versioned && (managed_v->flags & kDLPackReadOnly) != 0)
        throw ValueError("from_dlpack: the producer's data is read-only (e.g. a NumPy array with writeable=False); "
                         "dyngrad tensors are writable and share memory, so copy it: dyngrad.tensor(x)");
    const nb::dlpack::dltensor& dl = versioned ? managed_v->dl : plain->dl;
    Device device;
    switch (dl.device.device_type) {
        case kDLCPU:
        case kDLCUDAHost: device = Device::cpu(); break;
        case kDLCUDA:
        case kDLCUDAManaged: device = Device::cuda(dl.device.device_id); break;
        default: throw DeviceError(str("from_dlpack: DLPack device type ", dl.device.device_type, " is not supported (cpu and cuda are)"));
    }
    if (dl.dtype.lanes != 1) throw DTypeError(str("from_dlpack: vector dtypes (lanes ", dl.dtype.lanes, ") are not supported"));
    DType dtype;
    const auto code = static_cast<nb::dlpack::dtype_code>(dl.dtype.code);
    if (code == nb::dlpack::dtype_code::Float && dl.dtype.bits == 32) dtype = DType::f32;
    else if (code == nb::dlpack::dtype_code::Float && dl.dtype.bits == 64) dtype = DType::f64;
    else if (code == nb::dlpack::dtype_code::Int && dl.dtype.bits == 64) dtype = DType::i64;
    else
        throw DTypeError(str("from_dlpack: dtype code ", static_cast<int>(dl.dtype.code), " with ", static_cast<int>(dl.dtype.bits),
                             " bits is not supported without a copy (dyngrad has float32, float64, int64; convert first, "
                             "or use dyngrad.tensor() to copy)"));
    if (dl.ndim < 0) throw ShapeError(str("from_dlpack: negative rank ", dl.ndim));
    Shape shape(dl.shape, dl.shape + dl.ndim);
    for (auto d : shape)
        if (d < 0) throw ShapeError(str("from_dlpack: negative dimension in ", to_string(shape)));
    // An array without elements is contiguous whatever its strides (PyTorch's rule; NumPy 2 gives empty
    // arrays zero strides), and its data pointer is never read.
    const bool empty = numel(shape) == 0;
    if (dl.strides != nullptr && !empty) {
        std::int64_t expected = 1;
        for (std::int32_t i = dl.ndim - 1; i >= 0; --i) {
            if (shape[static_cast<std::size_t>(i)] != 1 && dl.strides[i] != expected)
                throw ValueError(str("from_dlpack: a non-contiguous tensor of shape ", to_string(shape),
                                     " cannot be shared without a copy; make it contiguous first (.contiguous(), "
                                     "np.ascontiguousarray)"));
            expected *= shape[static_cast<std::size_t>(i)];
        }
    }
    void* data = static_cast<char*>(dl.data) + dl.byte_offset;
    if (!empty && reinterpret_cast<std::uintptr_t>(data) % dtype_size(dtype) != 0)
        throw ValueError(str("from_dlpack: data at ", data, " is not aligned to its ", dtype_size(dtype), "-byte elements"));
    // Consumed: the capsule no longer frees the tensor; our storage does.
    if (PyCapsule_SetName(capsule, versioned ? kUsedVersionedCapsuleName : kUsedCapsuleName) != 0)
        throw nb::python_error();
    PyCapsule_SetDestructor(capsule, nullptr);
    const auto release = [plain, managed_v] {
        if (plain != nullptr && plain->deleter != nullptr) plain->deleter(plain);
        if (managed_v != nullptr && managed_v->deleter != nullptr) managed_v->deleter(managed_v);
    };
    return Tensor::from_external(data, shape, dtype, device, [release, device] {
        if (!interpreter_alive()) return;  // at exit: the producer's memory goes with the process
        if (device.is_cuda()) {
            // The producer may hand the memory out again at once, on its own stream: dyngrad's queued kernels
            // that read it must be done first. Only when an imported GPU tensor dies; never throws from here.
            try {
                cuda::synchronize(device.index);
            } catch (...) {
            }
        }
        PyGILState_STATE state = PyGILState_Ensure();
        release();
        PyGILState_Release(state);
    });
}

// obj.__dlpack__(**kwargs), asking for a DLPack 1.x capsule (which carries the read-only flag; NumPy 2 refuses
// to export a read-only array without it); producers that predate max_version get the plain call. A producer
// that still refuses to export (NumPy's BufferError for a read-only array) raises dyngrad's ValueError.
nb::object dlpack_capsule(nb::handle obj, const nb::dict& kwargs) {
    nb::dict versioned;
    for (auto [key, value] : kwargs) versioned[key] = value;
    versioned["max_version"] = nb::make_tuple(1, 0);
    try {
        return obj.attr("__dlpack__")(**versioned);
    } catch (nb::python_error& e) {
        if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_BufferError)) throw;  // TypeError: no max_version
    }
    try {
        return obj.attr("__dlpack__")(**kwargs);
    } catch (nb::python_error& e) {
        if (!e.matches(PyExc_BufferError)) throw;
        throw ValueError(str("from_dlpack: ", nb::cast<std::string>(nb::str(obj.type().attr("__name__"))),
                             " refused to export its data (", e.what(),
                             "); a read-only array cannot be shared with dyngrad: copy it, dyngrad.tensor(x)"));
    }
}

Tensor from_dlpack_object(nb::handle obj) {
    if (nb::isinstance<PyTensor>(obj)) return nb::cast<const PyTensor&>(obj).data();
    if (PyCapsule_CheckExact(obj.ptr())) return from_capsule(obj);
    if (!nb::hasattr(obj, "__dlpack__"))
        throw nb::type_error(str("from_dlpack: ", nb::cast<std::string>(nb::str(obj.type())),
                                 " does not support DLPack (no __dlpack__)").c_str());
    int device_type = kDLCPU, device_id = 0;
    if (nb::hasattr(obj, "__dlpack_device__")) {
        const auto dev = arg_as<std::pair<int, int>>(obj.attr("__dlpack_device__")(), "from_dlpack",
                                                     "__dlpack_device__()", "a pair of ints");
        device_type = dev.first;
        device_id = dev.second;
    }
    nb::dict kwargs;
    // The producer makes dyngrad's stream wait for its pending writes (DLPack's stream contract).
    if (device_type == kDLCUDA || device_type == kDLCUDAManaged) kwargs["stream"] = cuda::stream_handle(device_id);
    return from_capsule(dlpack_capsule(obj, kwargs));
}

// ---- NumPy views ----
nb::object numpy_view(const PyTensor& self) {
    const Tensor& t = self.data();
    if (!t.device().is_cpu())
        throw DeviceError(str(".numpy(): the tensor is on ", t.device().to_string(), "; copy it with .cpu() first"));
    auto* keep = new Tensor(t);
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
    std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
    void* data = t.numel() > 0 ? t.raw_data() : nullptr;
    nb::dlpack::dtype dt = dl_dtype(t.dtype());
    nb::ndarray<nb::numpy> array(data, shape.size(), shape.data(), owner, nullptr, dt, nb::device::cpu::value, 0);
    return nb::cast(array, nb::rv_policy::reference);
}

nb::object numpy_module() {
    static nb::object np = nb::module_::import_("numpy");
    return np;
}

nb::object numpy_of(const Tensor& t) {
    PyTensor wrapper(t);
    return numpy_view(wrapper);
}

// ---- custom ops written in Python ----
struct PyCustomOp {
    std::string name;
    int arity = 1;
    nb::object forward, backward, infer, cuda_forward, cuda_backward;
    std::optional<CustomOp> op;  // set once registered
};
std::unordered_map<std::uint32_t, PyCustomOp*>& custom_ops() {
    static auto* ops = new std::unordered_map<std::uint32_t, PyCustomOp*>();  // lives for the process
    return *ops;
}
PyCustomOp& custom_op_for(const OpAttrs& attrs) {
    auto found = custom_ops().find(attrs.custom_id);
    if (found == custom_ops().end()) throw GraphError(str("no Python custom op with id ", attrs.custom_id));
    return *found->second;
}

[[noreturn]] void rethrow_python(const PyCustomOp& op, const char* what, nb::python_error& e) {
    const std::string message = e.what();
    e.restore();
    PyErr_Clear();
    throw ValueError(str("custom op '", op.name, "': its Python ", what, " raised ", message));
}

OutputSpec custom_infer(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    nb::gil_scoped_acquire gil;
    PyCustomOp& op = custom_op_for(attrs);
    if (op.infer.is_none()) return {inputs[0].shape(), inputs[0].dtype()};
    nb::list shapes, dtypes;
    for (const Tensor& t : inputs) {
        nb::list dims;
        for (auto d : t.shape()) dims.append(d);
        shapes.append(nb::tuple(dims));
        dtypes.append(t.dtype());
    }
    nb::object result;
    try {
        result = op.infer(shapes, dtypes);
    } catch (nb::python_error& e) {
        rethrow_python(op, "infer", e);
    }
    DType dtype = inputs[0].dtype();
    nb::object shape_obj = result;
    if (nb::isinstance<nb::tuple>(result) && nb::len(result) == 2 && !nb::isinstance<nb::int_>(result[1]) &&
        !nb::isinstance<nb::int_>(result[0])) {
        shape_obj = result[0];
        dtype = parse_dtype(result[1]);
    }
    const auto dims = arg_as<std::vector<std::int64_t>>(shape_obj, op.name, "the shape its infer returned",
                                                         "a sequence of ints (or (shape, dtype))");
    return {Shape(dims.begin(), dims.end()), dtype};
}

// The data pointers of the op's inputs during a custom op's Python call (a GPU result returned as is must
// not be one of them).
thread_local std::vector<const void*> current_inputs;
bool inputs_alias(const Tensor& t) {
    for (const void* p : current_inputs)
        if (p == t.raw_data()) return true;
    return false;
}

// A Python result as a tensor of `shape` and `dtype` on `device`: a copy on the CPU (a result may be a view
// of an input), the producer's memory itself on a GPU.
Tensor tensor_from_result(const PyCustomOp& op, const char* what, nb::handle result, const Shape& shape, DType dtype,
                          Device device) {
    Tensor out;
    if (device.is_cpu()) {
        nb::object np = numpy_module();
        const char* np_dtype = dtype == DType::f32 ? "float32" : dtype == DType::f64 ? "float64" : "int64";
        // np.array keeps a 0-d result 0-d (ascontiguousarray would make it 1-d).
        nb::object array = np.attr("array")(result, nb::arg("dtype") = np_dtype, nb::arg("order") = "C");
        const auto array_shape = nb::cast<std::vector<std::int64_t>>(array.attr("shape"));
        if (Shape(array_shape.begin(), array_shape.end()) != shape)
            throw ShapeError(str("custom op '", op.name, "': its ", what, " returned shape ",
                                 to_string(Shape(array_shape.begin(), array_shape.end())), ", expected ", to_string(shape)));
        out = Tensor::empty(shape, dtype);
        const auto address = nb::cast<std::uintptr_t>(array.attr("ctypes").attr("data"));
        if (out.nbytes() > 0) std::memcpy(out.raw_data(), reinterpret_cast<const void*>(address), out.nbytes());
        return out;
    }
    const Tensor produced = from_dlpack_object(result);
    if (produced.shape() != shape)
        throw ShapeError(str("custom op '", op.name, "': its ", what, " returned shape ", to_string(produced.shape()),
                             ", expected ", to_string(shape)));
    if (produced.device() != device)
        throw DeviceError(str("custom op '", op.name, "': its ", what, " returned a tensor on ",
                              produced.device().to_string(), ", expected ", device.to_string()));
    // Kept as it is (its storage holds the producer's memory): a copy would be queued on dyngrad's stream
    // while the producer could reuse the memory on its own. Only a result that is an input itself is copied.
    Tensor out_tensor = produced.to(dtype);
    if (out_tensor.numel() > 0 && inputs_alias(out_tensor)) out_tensor = out_tensor.clone();
    return out_tensor;
}

nb::object python_view(const Tensor& t) {
    if (t.device().is_cpu()) return numpy_of(t);
    return nb::cast(PyTensor(t));  // a DLPack producer for CuPy, PyTorch, ...
}

// Calls a custom op's Python function on views of (grad_output,) inputs; remembers their data pointers.
nb::object call_python(PyCustomOp& op, const char* what, const nb::object& fn, const Tensor* grad_output,
                       std::span<const Tensor> inputs) {
    nb::list views;
    current_inputs.clear();
    const auto add = [&](const Tensor& t) {
        views.append(python_view(t));
        if (t.numel() > 0) current_inputs.push_back(t.raw_data());
    };
    if (grad_output != nullptr) add(*grad_output);
    for (const Tensor& t : inputs) add(t);
    try {
        return fn(*nb::tuple(views));
    } catch (nb::python_error& e) {
        rethrow_python(op, what, e);
    }
}

Tensor custom_forward(const ForwardArgs& args) {
    nb::gil_scoped_acquire gil;
    PyCustomOp& op = custom_op_for(args.attrs);
    const bool on_cpu = args.inputs.empty() || args.inputs[0].device().is_cpu();
    nb::object fn = on_cpu ? op.forward : op.cuda_forward;
    const nb::object result = call_python(op, "forward", fn, nullptr, args.inputs);
    return tensor_from_result(op, "forward", result, args.out.shape, args.out.dtype,
                              on_cpu ? Device::cpu() : args.inputs[0].device());
}

std::vector<Tensor> custom_backward(const BackwardArgs& args) {
    nb::gil_scoped_acquire gil;
    PyCustomOp& op = custom_op_for(args.attrs);
    const bool on_cpu = args.inputs.empty() || args.inputs[0].device().is_cpu();
    nb::object fn = on_cpu ? op.backward : op.cuda_backward;
    const nb::object result = call_python(op, "backward", fn, &args.grad_output, args.inputs);
    std::vector<nb::object> grads;
    if (args.inputs.size() == 1 && !nb::isinstance<nb::tuple>(result) && !nb::isinstance<nb::list>(result)) {
        grads.push_back(result);
    } else {
        if (!nb::isinstance<nb::tuple>(result) && !nb::isinstance<nb::list>(result))
            throw ValueError(str("custom op '", op.name, "': backward must return one gradient per input (a tuple of ",
                                 args.inputs.size(), ")"));
        for (nb::handle h : result) grads.push_back(nb::borrow(h));
    }
    if (grads.size() != args.inputs.size())
        throw ValueError(str("custom op '", op.name, "': backward returned ", grads.size(), " gradients for ",
                             args.inputs.size(), " inputs"));
    std::vector<Tensor> out(args.inputs.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
        if (grads[i].is_none() || !args.needs_grad[i]) continue;
        out[i] = tensor_from_result(op, "backward", grads[i], args.inputs[i].shape(), args.inputs[i].dtype(),
                                    args.inputs[i].device());
    }
    return out;
}

struct CustomOpHandle {
    PyCustomOp* op;
};

}  // namespace

void bind_interop(nb::module_& m) {
    nb::class_<PyTensor> tensor = nb::borrow<nb::class_<PyTensor>>(m.attr("Tensor"));
    tensor.def("__dlpack__", &to_dlpack, nb::kw_only(), nb::arg("stream").none() = nb::none(),
               nb::arg("max_version").none() = nb::none(), nb::arg("dl_device").none() = nb::none(),
               nb::arg("copy").none() = nb::none())
        .def("__dlpack_device__", &dlpack_device)
        .def("numpy", &numpy_view);
    m.def("from_dlpack", [](nb::handle obj) { return PyTensor(from_dlpack_object(obj)); }, nb::arg("obj"),
          "A dyngrad tensor sharing obj's memory (NumPy, PyTorch, CuPy, ...: anything with __dlpack__).");
    m.def("_is_external", [](const PyTensor& t) { return t.data().external(); });

    nb::class_<CustomOpHandle>(m, "CustomOp")
        .def("__call__", [](const CustomOpHandle& h, nb::args inputs) {
            std::vector<const PyTensor*> ts;
            for (nb::handle i : inputs) {
                if (!nb::isinstance<PyTensor>(i))
                    throw nb::type_error(str("custom op '", h.op->name, "': inputs must be dyngrad tensors, got ",
                                             nb::cast<std::string>(nb::str(i.type()))).c_str());
                ts.push_back(&nb::cast<const PyTensor&>(i));
            }
            if (static_cast<int>(ts.size()) != h.op->arity)
                throw nb::type_error(str("custom op '", h.op->name, "' takes ", h.op->arity, " inputs, got ", ts.size()).c_str());
            OpAttrs attrs;
            attrs.custom_id = h.op->op->id();
            return apply(OpType::Custom, ts, attrs);
        })
        .def_prop_ro("name", [](const CustomOpHandle& h) { return h.op->name; })
        .def("gradcheck", [](const CustomOpHandle& h, const std::vector<std::vector<std::int64_t>>& shapes, std::uint64_t seed) {
            // The finite-difference check the op table's rows get (float64, graph/gradcheck.h).
            OpCase c;
            c.label = h.op->name;
            for (const auto& s : shapes) c.shapes.emplace_back(s.begin(), s.end());
            c.attrs.custom_id = h.op->op->id();
            Generator gen(seed);
            const CheckResult r = finite_difference_check(h.op->op->def(), c, gen);
            return nb::make_tuple(r.pass, r.max_rel_err, r.detail);
        }, nb::arg("shapes"), nb::arg("seed") = 0);

    m.def("custom_op", [](const std::string& name, int arity, nb::object forward, nb::object backward, nb::object infer,
                          nb::object cuda_forward, nb::object cuda_backward) {
        if (!PyCallable_Check(forward.ptr()) || !PyCallable_Check(backward.ptr()))
            throw nb::type_error("custom_op: forward and backward must be callables");
        for (const auto& [what, fn] : {std::pair{"infer", &infer}, {"cuda_forward", &cuda_forward}, {"cuda_backward", &cuda_backward}})
            if (!fn->is_none() && !PyCallable_Check(fn->ptr())) throw_argument_type("custom_op", what, "a callable or None", *fn);
        if (cuda_forward.is_none() != cuda_backward.is_none())
            throw ValueError("custom_op: give both cuda_forward and cuda_backward, or neither");
        auto* op = new PyCustomOp();  // lives for the process, as the engine's registration does
        op->name = name;
        op->arity = arity;
        op->forward = std::move(forward);
        op->backward = std::move(backward);
        op->infer = std::move(infer);
        op->cuda_forward = std::move(cuda_forward);
        op->cuda_backward = std::move(cuda_backward);
        CustomOpSpec spec;
        spec.name = name;
        spec.arity = arity;
        spec.infer = &custom_infer;
        spec.cpu = {&custom_forward, &custom_backward};
        if (!op->cuda_forward.is_none()) spec.cuda = {&custom_forward, &custom_backward};
        try {
            op->op.emplace(CustomOp::define(spec));
        } catch (...) {
            delete op;
            throw;
        }
        custom_ops()[op->op->id()] = op;
        return CustomOpHandle{op};
    }, nb::arg("name"), nb::arg("arity"), nb::arg("forward"), nb::arg("backward"), nb::arg("infer").none() = nb::none(),
       nb::arg("cuda_forward").none() = nb::none(), nb::arg("cuda_backward").none() = nb::none());
}

}  // namespace dyngrad::python
