// The factories (tensor from NumPy, zeros, ones, full, arange, randn, rand), the generator and the module's
// switches (no_grad, anomaly mode, devices, threads).
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <optional>

#include "binding.h"

namespace dyngrad::python {

namespace {

struct NoGradScope {
    std::optional<NoGradGuard> guard;
};
struct AnomalyScope {
    std::optional<AnomalyModeGuard> guard;
};

}  // namespace

void bind_factories(nb::module_& m) {
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
        return box->graph().size();
    });
    m.def("_caller_site", [] { return describe_site(python_site()); });
    m.def("cuda_is_available", [] { return cuda_device_count() > 0; });
    m.def("cuda_device_count", &cuda_device_count);
    m.def("cuda_compiled", &cuda_compiled);
    m.def("_capturing", [](int device) { return cuda::capturing(device); }, nb::arg("device"));
    m.def("cuda_synchronize", [](int device) { cuda::synchronize(device); }, nb::arg("device") = 0);
    m.def("cuda_memory_stats", [](int device) {
        const cuda::MemoryStats s = cuda::memory_stats(device);
        nb::dict out;
        out["allocated"] = s.bytes_in_use;
        out["peak_allocated"] = s.peak_bytes_in_use;
        out["reserved"] = s.pool_reserved_bytes + s.capture_reserved_bytes;
        return out;
    });
    m.def("cuda_reset_peak_memory", [](int device) { cuda::reset_peak_memory(device); });
    m.def("cuda_set_memory_limit", [](int device, std::size_t bytes) { cuda::set_memory_limit(device, bytes); });
    m.def("cuda_memory_limit", [](int device) { return cuda::memory_limit(device); });
    m.def("cuda_total_memory", [](int device) { return cuda::device_total_memory(device); });
    m.def("set_cpu_threads", &set_cpu_threads, nb::arg("threads"));
}

}  // namespace dyngrad::python
