// Mixed precision for Python: autocast scopes over graph/autocast.h's AutocastGuard (dyngrad.autocast) and
// nn/amp.h's GradScaler (dyngrad.amp.GradScaler), with PyTorch's method names.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "binding.h"

namespace dyngrad::python {

namespace {

struct AutocastScope {
    std::optional<AutocastGuard> guard;
};

}  // namespace

void bind_amp(nb::module_& m) {
    nb::class_<AutocastScope>(m, "_AutocastScope")
        .def(nb::init<>())
        .def("enter", [](AutocastScope& s, nb::handle dtype) { s.guard.emplace(parse_dtype(dtype)); })
        .def("exit", [](AutocastScope& s) { s.guard.reset(); });
    m.def("get_autocast_dtype", [] { return autocast_dtype(); },
          "The autocast dtype of this thread (bfloat16/float16 inside dyngrad.autocast), None outside.");
    m.def("set_autocast_parameter_copies", &set_autocast_parameter_copies, nb::arg("keep"));
    m.def("autocast_parameter_copies", &autocast_parameter_copies);
    m.def("set_batched_gradient_casts", &set_batched_gradient_casts, nb::arg("batch"));
    m.def("batched_gradient_casts", &batched_gradient_casts);
    m.def("_batched_gradient_cast_stats", [] {  // this process's (for tests)
        const BatchedGradientCastStats s = batched_gradient_cast_stats();
        nb::dict out;
        out["casts"] = s.casts;
        out["batches"] = s.batches;
        return out;
    });
    m.def("_autocast_cache_stats", [] {  // this thread's, since its outermost autocast block began (for tests)
        const AutocastCacheStats s = autocast_cache_stats();
        nb::dict out;
        out["hits"] = s.hits;
        out["casts"] = s.casts;
        out["copies_used"] = s.copies_used;
        return out;
    });

    nb::class_<GradScaler>(m, "GradScaler")
        .def("__init__", [](GradScaler* self, double init_scale, double growth_factor, double backoff_factor,
                            std::int64_t growth_interval, bool enabled, double min_scale,
                            std::int64_t max_consecutive_skips) {
            new (self) GradScaler(GradScalerOptions{.init_scale = init_scale, .growth_factor = growth_factor,
                                                    .backoff_factor = backoff_factor, .growth_interval = growth_interval,
                                                    .enabled = enabled, .min_scale = min_scale,
                                                    .max_consecutive_skips = max_consecutive_skips});
        }, nb::arg("init_scale") = 65536.0, nb::arg("growth_factor") = 2.0, nb::arg("backoff_factor") = 0.5,
           nb::arg("growth_interval") = 2000, nb::arg("enabled") = true, nb::kw_only(), nb::arg("min_scale") = 1.0,
           nb::arg("max_consecutive_skips") = 16)
        .def("scale", [](GradScaler& s, const PyTensor& loss) {
            const PyTensor* inputs[] = {&loss};
            return call_with_vars(inputs, false,
                                  [&s](std::span<const Var> v, std::source_location) { return s.scale(v[0]); });
        }, nb::arg("outputs"), "outputs · scale (the identity when disabled).")
        .def("unscale_", [](GradScaler& s, Optimizer& o) { s.unscale(o); }, nb::arg("optimizer"))
        .def("step", [](GradScaler& s, Optimizer& o) { s.step(o); }, nb::arg("optimizer"))
        .def("update", [](GradScaler& s, nb::handle new_scale) {
            if (!new_scale.is_none())
                throw ValueError("GradScaler.update(new_scale): setting the scale by hand is not supported; the scale "
                                 "follows growth_factor/backoff_factor (or load_state_dict)");
            s.update();
        }, nb::arg("new_scale").none() = nb::none())
        .def("get_scale", &GradScaler::scale_value)
        .def("is_enabled", &GradScaler::enabled)
        .def("get_growth_factor", [](const GradScaler& s) { return s.options().growth_factor; })
        .def("get_backoff_factor", [](const GradScaler& s) { return s.options().backoff_factor; })
        .def("get_growth_interval", [](const GradScaler& s) { return s.options().growth_interval; })
        .def("_get_growth_tracker", &GradScaler::growth_tracker)
        .def_prop_ro("last_step_skipped", &GradScaler::last_step_skipped)
        .def_prop_ro("consecutive_skips", &GradScaler::consecutive_skips)
        .def("_save_state", &saved_state<GradScaler>)
        .def("_load_state", [](GradScaler& s, const std::map<std::string, PyTensor*>& tensors,
                               const SafetensorsMetadata& metadata) {
            s.load_state(tensor_map_of(tensors, "GradScaler.load_state_dict"), metadata, "state_dict");
        }, nb::arg("tensors"), nb::arg("metadata"));
}

}  // namespace dyngrad::python
