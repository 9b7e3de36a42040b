// dyngrad._core: the extension module. dyngrad::Error and its subclasses become Python exceptions of the same
// names, each also a subclass of the built-in exception a Python user would catch (docs/python.md).
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/stl/string.h>

#include <exception>
#include <string_view>
#include <typeinfo>
#include <utility>

#include "binding.h"

namespace dyngrad::python {

namespace {

struct ErrorClasses {
    PyObject *error, *shape, *dtype, *device, *graph, *higher_order, *index, *value, *cuda, *oom, *io, *numerical,
        *distributed;
};
ErrorClasses classes;

PyObject* make_class(nb::module_& m, const char* name, std::initializer_list<PyObject*> bases, const char* doc) {
    nb::tuple base_tuple = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(bases.size())));
    Py_ssize_t i = 0;
    for (PyObject* b : bases) {
        Py_INCREF(b);
        PyTuple_SET_ITEM(base_tuple.ptr(), i++, b);
    }
    const std::string qualified = std::string("dyngrad.") + name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base_tuple.ptr(), nullptr);
    if (cls == nullptr) throw nb::python_error();
    m.attr(name) = nb::handle(cls);
    return cls;  // the module holds a reference
}

// Errors in the caller's language: the engine's messages name C++ spellings where a Python user has others.
constexpr std::pair<std::string_view, std::string_view> kPythonSpellings[] = {
    {"BackwardOptions{.retain_graph = true}", "retain_graph=True"},
    {"NoGradGuard", "dg.no_grad()"},
};

// The user's line, appended when the message does not name it yet (errors not tied to a node, e.g. a bad
// factory argument; op errors already carry it as their creation site).
std::string with_site(const char* what) {
    std::string message = what;
    for (const auto& [cpp, python] : kPythonSpellings)
        for (std::size_t at = message.find(cpp); at != std::string::npos; at = message.find(cpp, at + python.size()))
            message.replace(at, cpp.size(), python);
    const std::string site = describe_site(python_site());
    const std::string file = site.substr(0, site.rfind(':'));
    if (!file.empty() && message.find(site) == std::string::npos) message += " [at " + site + "]";
    return message;
}

void translate(const std::exception_ptr& p, void*) {
    try {
        std::rethrow_exception(p);
    } catch (const OutOfMemory& e) {
        PyErr_SetString(classes.oom, with_site(e.what()).c_str());
    } catch (const CudaError& e) {
        PyErr_SetString(classes.cuda, with_site(e.what()).c_str());
    } catch (const ShapeError& e) {
        PyErr_SetString(classes.shape, with_site(e.what()).c_str());
    } catch (const DTypeError& e) {
        PyErr_SetString(classes.dtype, with_site(e.what()).c_str());
    } catch (const DeviceError& e) {
        PyErr_SetString(classes.device, with_site(e.what()).c_str());
    } catch (const HigherOrderError& e) {
        PyErr_SetString(classes.higher_order, with_site(e.what()).c_str());
    } catch (const GraphError& e) {
        PyErr_SetString(classes.graph, with_site(e.what()).c_str());
    } catch (const IndexError& e) {
        PyErr_SetString(classes.index, with_site(e.what()).c_str());
    } catch (const ValueError& e) {
        PyErr_SetString(classes.value, with_site(e.what()).c_str());
    } catch (const IoError& e) {
        PyErr_SetString(classes.io, with_site(e.what()).c_str());
    } catch (const NumericalError& e) {
        PyErr_SetString(classes.numerical, with_site(e.what()).c_str());
    } catch (const DistributedError& e) {
        PyErr_SetString(classes.distributed, with_site(e.what()).c_str());
    } catch (const Error& e) {
        PyErr_SetString(classes.error, with_site(e.what()).c_str());
    } catch (const std::bad_cast&) {
        // A last resort: user arguments are converted by arg_as (binding.h), whose TypeError names the function
        // and the argument; an nb::cast that still fails here names neither, so say what is known.
        PyErr_SetString(PyExc_TypeError,
                        with_site("a dyngrad call got an argument of an incompatible Python type (no conversion of it "
                                  "to the C++ type it needs)").c_str());
    } catch (const std::bad_alloc&) {
        PyErr_SetString(classes.oom, with_site("host memory exhausted (std::bad_alloc)").c_str());
    }
}

template <typename E>
[[noreturn]] void throw_as(const std::string& message) {
    throw E(message);
}

}  // namespace

void rethrow_as_dyngrad_error(nb::python_error& e, const std::string& context) {
    const std::string type = nb::cast<std::string>(e.type().attr("__name__"));
    const std::string message = str(context, " ", type, ": ", nb::str(e.value()).c_str());
    // Most derived first, as translate() reads them.
    const std::pair<PyObject*, void (*)(const std::string&)> by_class[] = {
        {classes.oom, throw_as<OutOfMemory>}, {classes.cuda, throw_as<CudaError>},
        {classes.shape, throw_as<ShapeError>}, {classes.dtype, throw_as<DTypeError>},
        {classes.device, throw_as<DeviceError>}, {classes.higher_order, throw_as<HigherOrderError>},
        {classes.graph, throw_as<GraphError>}, {classes.index, throw_as<IndexError>},
        {classes.value, throw_as<ValueError>}, {classes.io, throw_as<IoError>},
        {classes.numerical, throw_as<NumericalError>}, {classes.distributed, throw_as<DistributedError>},
        {classes.error, throw_as<Error>},
    };
    for (const auto& [cls, raise] : by_class)
        if (PyErr_GivenExceptionMatches(e.type().ptr(), cls) != 0) raise(message);
    throw ValueError(message);
}

void set_python_error_from_current_exception() noexcept {
    if (!std::current_exception()) {  // outside a catch block the bare `throw;` would call std::terminate
        PyErr_SetString(PyExc_RuntimeError, "dyngrad: an error was reported with no exception in flight");
        return;
    }
    try {
        throw;
    } catch (nb::python_error& e) {
        e.restore();
    } catch (const nb::builtin_exception& e) {
        PyErr_SetString(PyExc_TypeError, e.what());  // the op path raises only type_error of these
    } catch (...) {
        try {
            translate(std::current_exception(), nullptr);
        } catch (const std::exception& e) {
            PyErr_SetString(PyExc_RuntimeError, e.what());
        } catch (...) {
            PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
        }
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
    }
}

}  // namespace dyngrad::python

NB_MODULE(_core, m) {
    using namespace dyngrad::python;
    m.doc() = "dyngrad's engine (C++), bound with nanobind; use the dyngrad package around it";
    classes.error = make_class(m, "Error", {PyExc_RuntimeError}, "Base of every dyngrad error.");
    classes.shape = make_class(m, "ShapeError", {classes.error, PyExc_ValueError}, "Shapes that do not fit together.");
    classes.dtype = make_class(m, "DTypeError", {classes.error, PyExc_TypeError}, "A dtype an op does not accept.");
    classes.device = make_class(m, "DeviceError", {classes.error}, "Inputs on different or unavailable devices.");
    classes.graph = make_class(m, "GraphError", {classes.error}, "Misuse of the graph (backward twice, stale history).");
    // graph/higher_order.h's HigherOrderError: create_graph through a first-order-only op or a released graph
    // (dyngrad.autograd.HigherOrderNotSupported, a NotImplementedError as well).
    classes.higher_order = make_class(m, "HigherOrderNotSupported", {classes.graph, PyExc_NotImplementedError},
                                      "A gradient that cannot be differentiated again (a first-order-only op).");
    classes.index = make_class(m, "IndexError", {classes.error, PyExc_IndexError}, "An index out of range.");
    classes.value = make_class(m, "ValueError", {classes.error, PyExc_ValueError}, "An invalid argument value.");
    classes.cuda = make_class(m, "CudaError", {classes.error}, "A CUDA, cuBLAS or cuDNN call failed.");
    classes.oom = make_class(m, "OutOfMemory", {classes.cuda, PyExc_MemoryError}, "A device or host ran out of memory.");
    classes.io = make_class(m, "IoError", {classes.error, PyExc_OSError}, "A missing, truncated or malformed file.");
    classes.numerical = make_class(m, "NumericalError", {classes.error, PyExc_ArithmeticError},
                                   "A NaN or Inf found by anomaly mode.");
    classes.distributed = make_class(m, "DistributedError", {classes.error},
                                     "A collective failed or timed out (a peer died or never joined), or the "
                                     "distributed layer is unavailable.");
    nb::register_exception_translator(&translate);
    // Custom ops (and their Python callables) are registered for the life of the process, as in C++.
    nb::set_leak_warnings(false);

    bind_tensor(m);
    bind_op_path(m);
    bind_factories(m);
    bind_interop(m);
    bind_nn(m);
    bind_transformer(m);
    bind_token_files(m);
    bind_amp(m);
    bind_autograd(m);
    bind_schedules(m);
    bind_distributed(m);
    bind_capture(m);
    bind_fusion(m);
}
