// The fusion compiler's switch, counters and log for Python (dyngrad.fusion, python/dyngrad/fusion.py; docs/fusion.md):
// fusion::fusion_settings / set_fusion_enabled (graph/fusion_plan.h), fusion::replay_stats (graph/fusion_replay.h)
// and cuda::fusion_log / clear_fusion_log (cuda/nvrtc_compiler.h). The log lives in cuda/nvrtc_compiler.cpp, which
// only a CUDA build compiles; without CUDA nothing could have logged, so the log reads empty there.
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/stl/string.h>

#include <string>
#include <utility>

#include "binding.h"
#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/graph/fusion_replay.h"

namespace dyngrad::python {

namespace {

using LogKind = cuda::FusionLogEntry::Kind;

// Each kind of log entry by its Python name (the enumerator in snake case). python/tests/test_cpp_parity.py compares
// this list with the enumerators of cuda/nvrtc_compiler.h, so a kind added there fails a test until it is named here.
constexpr std::pair<LogKind, const char*> kLogKinds[] = {
    {LogKind::CompileFallback, "compile_fallback"}, {LogKind::CacheUnwritable, "cache_unwritable"},
    {LogKind::CacheReadFailed, "cache_read_failed"}, {LogKind::CheckMismatch, "check_mismatch"},
    {LogKind::GraphDiffers, "graph_differs"},
};

[[maybe_unused]] const char* log_kind_name(LogKind kind) {
    for (const auto& [known, name] : kLogKinds)
        if (known == kind) return name;
    throw Error(str("dyngrad.fusion.log(): an entry of kind ", static_cast<int>(kind),
                    ", which python/src/fusion.cpp does not name (add it to kLogKinds)"));
}

}  // namespace

void bind_fusion(nb::module_& m) {
    m.def("fusion_settings", [] {
        const fusion::FusionSettings s = fusion::fusion_settings();
        nb::dict d;  // FusionSettings' fields in order (test_cpp_parity.py), the mode by its name
        d["mode"] = fusion::fusion_mode_name(s.mode);
        d["enabled"] = s.enabled;
        d["eager"] = s.eager;
        d["print"] = s.print;
        d["check"] = s.check;
        return d;
    }, "{'mode', 'enabled', 'eager', 'print', 'check'}: the fusion switches (DYNGRAD_FUSION, DYNGRAD_PRINT_FUSIONS, "
       "DYNGRAD_CHECK_FUSIONS; 'mode' as set_fusion_mode or set_fusion_enabled last set it).");
    m.def("set_fusion_enabled", &fusion::set_fusion_enabled, nb::arg("enabled"),
          "True: fuse captured steps and eager graphs ('all'); False: never ('off'). Overrides DYNGRAD_FUSION.");
    m.def("set_fusion_mode", [](const std::string& mode) {
        if (mode != "off" && mode != "captured" && mode != "all")
            throw ValueError(str("fusion.set_mode: mode must be 'off', 'captured' or 'all', got '", mode, "'"));
        fusion::set_fusion_mode(fusion::parse_fusion_mode(mode));
    }, nb::arg("mode"), "'off', 'captured' (the default) or 'all'. Overrides DYNGRAD_FUSION.");
    m.def("fusion_stats", [] {
        using R = fusion::ReplayStats;
        return fields_dict(fusion::replay_stats(), field("plans", &R::plans),
                           field("groups_compiled", &R::groups_compiled), field("groups_dropped", &R::groups_dropped),
                           field("captures", &R::captures), field("last_groups", &R::last_groups),
                           field("last_launches_saved", &R::last_launches_saved), field("prepare_ms", &R::prepare_ms),
                           field("nvrtc_ms", &R::nvrtc_ms), field("groups_from_cache", &R::groups_from_cache),
                           field("backward_chains_compiled", &R::backward_chains_compiled),
                           field("backward_chains_dropped", &R::backward_chains_dropped),
                           field("backward_chains_run", &R::backward_chains_run),
                           field("eager_graphs_fused", &R::eager_graphs_fused),
                           field("plans_let_go", &R::plans_let_go));
    }, "The calling thread's fusion counters (fusion::replay_stats), one key per field.");
    m.def("fusion_log", [] {
        nb::list out;
#if DYNGRAD_WITH_CUDA
        for (const cuda::FusionLogEntry& entry : cuda::fusion_log()) {
            nb::dict d;
            d["kind"] = log_kind_name(entry.kind);
            d["kernel"] = entry.kernel;
            d["reason"] = entry.reason;
            out.append(d);
        }
#endif
        return out;
    }, "The process's fusion log (cuda::fusion_log), oldest first: [{'kind', 'kernel', 'reason'}].");
    m.def("clear_fusion_log", [] {
#if DYNGRAD_WITH_CUDA
        cuda::clear_fusion_log();
#endif
    }, "Empties the fusion log (cuda::clear_fusion_log).");
    m.def("fusion_log_kinds", [] {
        nb::list out;
        for (const auto& [kind, name] : kLogKinds) out.append(name);
        return out;
    }, "The names a fusion log entry's 'kind' takes, in the C++ enumerators' order.");
}

}  // namespace dyngrad::python
