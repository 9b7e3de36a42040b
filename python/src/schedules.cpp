// Optimizer and schedule state for Python (dyngrad/optim.py): WarmupCosineLR, the closed forms of the
// schedules, param_groups' settings read and written, and state_dict()/load_state_dict() over the C++
// save_state/load_state (the same entries a checkpoint holds).
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "binding.h"

namespace dyngrad::python {

std::map<std::string, PyTensor> py_tensor_map(const TensorMap& tensors) {
    std::map<std::string, PyTensor> out;
    for (const auto& [name, t] : tensors) out.emplace(name, PyTensor(t));
    return out;
}

TensorMap tensor_map_of(const std::map<std::string, PyTensor*>& tensors, const char* who) {
    TensorMap out;
    for (const auto& [name, t] : tensors) {
        if (t == nullptr) throw ValueError(str(who, ": state entry '", name, "' is None"));
        out[name] = t->data();
    }
    return out;
}

namespace {

nb::dict settings_dict(const Optimizer& o, std::size_t group) {
    const GroupSettings& s = o.settings(group);
    nb::dict d;
    d["lr"] = s.lr;
    d["weight_decay"] = s.weight_decay;
    if (std::string(o.name()) == "SGD") {
        d["momentum"] = s.momentum;
        d["nesterov"] = s.nesterov;
    } else {
        d["betas"] = nb::make_tuple(s.beta1, s.beta2);
        d["eps"] = s.eps;
    }
    return d;
}

// Column of a setting in the "@optimizer.settings" rows save_state writes (lr, weight_decay, momentum,
// nesterov, beta1, beta2, eps; nn/optim.cpp). set_setting checks the result through settings(), so a change
// of that layout fails loudly here instead of setting the wrong field.
int setting_column(const std::string& key) {
    static const char* const columns[] = {"lr", "weight_decay", "momentum", "nesterov", "beta1", "beta2", "eps"};
    for (int c = 0; c < 7; ++c)
        if (key == columns[c]) return c;
    return -1;
}

double setting_of(const GroupSettings& s, int column) {
    const double values[] = {s.lr, s.weight_decay, s.momentum, s.nesterov ? 1.0 : 0.0, s.beta1, s.beta2, s.eps};
    return values[column];
}

// Changes one setting of one group: through save_state/load_state, which check it as the constructor does
// (ValueError for an invalid value) and change nothing on error. lr goes through set_lr (no state round trip).
void set_setting(Optimizer& o, std::size_t group, const std::string& key, double value) {
    if (group >= o.group_count())
        throw IndexError(str(o.name(), ": parameter group ", group, " does not exist (", o.group_count(), " groups)"));
    if (key == "lr") {
        o.set_lr(group, value);
        return;
    }
    const bool sgd = std::string(o.name()) == "SGD";
    const bool known = key == "weight_decay" || (sgd ? (key == "momentum" || key == "nesterov")
                                                     : (key == "beta1" || key == "beta2" || key == "eps"));
    if (!known) throw ValueError(str(o.name(), ": param_groups[", group, "] has no setting '", key, "'"));
    const int column = setting_column(key);
    TensorMap tensors;
    SafetensorsMetadata metadata;
    o.save_state(tensors, metadata);
    Tensor rows = tensors.at("@optimizer.settings").clone();
    if (rows.dtype() != DType::f64 || rows.rank() != 2 || rows.shape()[1] != 7)
        throw Error("param_groups: the optimizer's settings table changed layout (python/src/schedules.cpp)");
    rows.data<double>()[group * 7 + static_cast<std::size_t>(column)] = value;
    tensors["@optimizer.settings"] = rows;
    o.load_state(tensors, metadata, str("param_groups[", group, "]['", key, "']"));
    if (setting_of(o.settings(group), column) != value)
        throw Error(str("param_groups: '", key, "' did not take effect: the optimizer's settings table changed layout"));
}

}  // namespace

void bind_schedules(nb::module_& m) {
    nb::class_<WarmupCosineLR, LRScheduler>(m, "WarmupCosineLR")
        .def(nb::init<Optimizer&, std::int64_t, std::int64_t, double>(), nb::arg("optimizer"), nb::arg("warmup_steps"),
             nb::arg("total_steps"), nb::arg("min_lr") = 0.0, nb::keep_alive<1, 2>());

    m.def("_schedule_lr_at", [](const LRScheduler& s, std::int64_t epoch, std::size_t group) {
        return s.lr_at(epoch, group);
    }, nb::arg("schedule"), nb::arg("epoch"), nb::arg("group") = 0);
    m.def("_schedule_base_lrs", [](const LRScheduler& s) { return s.base_lrs(); });
    m.def("_schedule_name", [](const LRScheduler& s) { return std::string(s.name()); });
    m.def("_schedule_save_state", &saved_state<LRScheduler>);
    m.def("_schedule_load_state", [](LRScheduler& s, const std::map<std::string, PyTensor*>& tensors,
                                     const SafetensorsMetadata& metadata) {
        s.load_state(tensor_map_of(tensors, "load_state_dict"), metadata, "state_dict");
    });

    m.def("_optimizer_save_state", &saved_state<Optimizer>);
    m.def("_optimizer_load_state", [](Optimizer& o, const std::map<std::string, PyTensor*>& tensors,
                                      const SafetensorsMetadata& metadata) {
        o.load_state(tensor_map_of(tensors, "load_state_dict"), metadata, "state_dict");
    });
    m.def("_optimizer_settings", &settings_dict, nb::arg("optimizer"), nb::arg("group"));
    m.def("_optimizer_set_setting", &set_setting, nb::arg("optimizer"), nb::arg("group"), nb::arg("key"),
          nb::arg("value"));
    m.def("_optimizer_group_size", [](const Optimizer& o, std::size_t g) { return o.group_parameters(g).size(); });
    m.def("_optimizer_state", [](const Optimizer& o, std::size_t i) {
        nb::dict d;
        d["step"] = o.step_count(i);
        for (const auto& [name, t] : o.state_tensors(i)) d[nb::str(name.c_str())] = PyTensor(t);
        return d;
    }, nb::arg("optimizer"), nb::arg("parameter"));
}

}  // namespace dyngrad::python
