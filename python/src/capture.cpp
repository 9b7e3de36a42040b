// cuda::CapturedStep for Python (dyngrad.cuda.CapturedStep, also dyngrad.CapturedStep): a Python step function
// captured into a CUDA graph on its second call and replayed after (cuda/capture.h). The C++ class does the
// work; this file only calls the Python function with the GIL and converts the options. On a build without
// CUDA the C++ stub (cuda/cuda_unavailable.cpp) is what runs: construction checks the options, run() raises
// DeviceError, as in C++.
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <utility>
#include <vector>

#include "binding.h"

namespace dyngrad::python {

namespace {

struct PyCapturedStep {
    nb::object fn;
    nb::object guard_state;  // the Python callable behind CaptureOptions::guard_state (kept alive here)
    std::unique_ptr<cuda::CapturedStep> step;
};

// The tensors guard_state() names: a dict {name: Tensor} or an iterable of (name, Tensor) pairs.
std::vector<std::pair<std::string, Tensor>> guard_tensors(nb::handle fn) {
    nb::gil_scoped_acquire gil;
    nb::object result = fn();
    nb::object items = nb::isinstance<nb::dict>(result) ? nb::borrow<nb::dict>(result).items() : result;
    std::vector<std::pair<std::string, Tensor>> out;
    for (nb::handle item : items) {
        nb::tuple pair;
        if (!nb::try_cast<nb::tuple>(item, pair) || pair.size() != 2 || !nb::isinstance<nb::str>(pair[0]) ||
            !nb::isinstance<PyTensor>(pair[1]))
            throw nb::type_error("CapturedStep(guard_state=...): guard_state() must return a dict {name: Tensor} "
                                 "or (name, Tensor) pairs");
        out.emplace_back(nb::cast<std::string>(pair[0]), nb::cast<const PyTensor&>(pair[1]).data());
    }
    return out;
}

Tensor run_step(PyCapturedStep& s, nb::args inputs) {
    std::vector<Tensor> ts;
    std::size_t i = 0;
    for (nb::handle h : inputs) {
        if (!nb::isinstance<PyTensor>(h))
            throw nb::type_error(str("CapturedStep.run(): argument ", i, " must be a dyngrad Tensor, not ",
                                     nb::inst_name(h).c_str()).c_str());
        ts.push_back(nb::cast<const PyTensor&>(h).data());
        ++i;
    }
    return s.step->run(ts);
}

}  // namespace

void bind_capture(nb::module_& m) {
    nb::class_<PyCapturedStep>(m, "CapturedStep")
        .def("__init__", [](PyCapturedStep* self, nb::object fn, std::size_t guard_replays, nb::object guard_state) {
            if (!PyCallable_Check(fn.ptr()))
                throw nb::type_error("CapturedStep(): argument 'step' must be a callable step(*tensors) -> Tensor");
            if (!guard_state.is_none() && !PyCallable_Check(guard_state.ptr()))
                throw nb::type_error("CapturedStep(): argument 'guard_state' must be a callable returning "
                                     "{name: Tensor} (or None)");
            new (self) PyCapturedStep{fn, guard_state, nullptr};
            cuda::CaptureOptions options;
            options.guard_replays = guard_replays;
            if (!guard_state.is_none()) {
                nb::object held = guard_state;
                options.guard_state = [held] { return guard_tensors(held); };
            }
            nb::object held = fn;
            self->step = std::make_unique<cuda::CapturedStep>([held](std::span<const Tensor> inputs) -> Tensor {
                nb::gil_scoped_acquire gil;
                nb::list args;
                for (const Tensor& t : inputs) args.append(PyTensor(t));
                nb::object result = held(*nb::tuple(args));
                if (!nb::isinstance<PyTensor>(result))
                    throw ValueError("CapturedStep: the step must return a dyngrad Tensor (e.g. the loss, detached)");
                return nb::cast<const PyTensor&>(result).data();
            }, std::move(options));
        }, nb::arg("step"), nb::arg("guard_replays") = 0, nb::arg("guard_state").none() = nb::none())
        .def("run", [](PyCapturedStep& s, nb::args inputs) { return PyTensor(run_step(s, inputs)); })
        .def("__call__", [](PyCapturedStep& s, nb::args inputs) { return PyTensor(run_step(s, inputs)); })
        .def_prop_ro("variants", [](const PyCapturedStep& s) { return s.step->variants(); })
        .def("last_graph_counts", [](const PyCapturedStep& s) {
            using Counts = cuda::CapturedStep::GraphCounts;
            return fields_dict(s.step->last_graph_counts(), field("nodes", &Counts::nodes),
                               field("kernels", &Counts::kernels), field("memsets", &Counts::memsets),
                               field("memcpys", &Counts::memcpys), field("other", &Counts::other),
                               field("longest_chain", &Counts::longest_chain));
        });
}

}  // namespace dyngrad::python
