// A fusion group made runnable for the captured-step hook (graph/fusion_replay.h declares it; ops/ implements it
// because it generates the source, ops/fusion_source.h): the source with every member as an output, compiled
// through NVRTC's disk cache, loaded once per device and kernel name, and with DYNGRAD_CHECK_FUSIONS=1 compared
// once with the members' unfused values.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "dyngrad/cuda/fused_kernel.h"
#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/graph/fusion_replay.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/fusion_source.h"

namespace dyngrad::fusion {

std::vector<std::byte> unary_scalar_bytes(const OpAttrs& attrs, bool double_precision) {
    const auto bytes = [](const auto& value) {
        std::vector<std::byte> out(sizeof value);
        std::memcpy(out.data(), &value, sizeof value);
        return out;
    };
    return double_precision ? bytes(math::unary_scalars<double>(attrs)) : bytes(math::unary_scalars<float>(attrs));
}

#if DYNGRAD_WITH_CUDA
namespace {

// "add #5, relu #6": a group in log entries.
std::string members_text(const ComputeGraph& graph, const FusionGroup& group) {
    std::string out;
    for (NodeId m : group.members) out += str(out.empty() ? "" : ", ", op_def(graph.node(m).op).name, " #", m);
    return out;
}

// Loaded modules live for the process: a captured graph's kernel nodes point into them on every replay. By device and
// kernel name, with whether the image came from the disk cache.
struct Loaded {
    std::unique_ptr<cuda::FusedKernel> kernel;
    bool from_cache = false;
};
std::mutex loaded_mutex;
std::map<std::pair<int, std::string>, Loaded>& loaded_kernels() {
    static auto* kernels = new std::map<std::pair<int, std::string>, Loaded>;
    return *kernels;
}

const Loaded& loaded_kernel(const cuda::CompiledKernel& compiled, int device) {
    const std::lock_guard lock(loaded_mutex);
    auto& kernels = loaded_kernels();
    const std::pair<int, std::string> key{device, compiled.kernel};
    if (const auto found = kernels.find(key); found != kernels.end()) return found->second;
    auto kernel = std::make_unique<cuda::FusedKernel>(compiled, device);  // throws before anything is kept
    return kernels.emplace(key, Loaded{std::move(kernel), compiled.from_cache}).first->second;
}

const Loaded* find_loaded(const std::string& name, int device) {
    const std::lock_guard lock(loaded_mutex);
    const auto found = loaded_kernels().find({device, name});
    return found == loaded_kernels().end() ? nullptr : &found->second;
}

// Loads kernel `name` for `device` into `out` (a CompiledGroup or CompiledBackward): already loaded (a plan's
// translation unit, or an earlier plan), else compiled alone (or read from the disk cache); false after the
// compiler logged why not.
template <typename Compiled>
bool compile_and_load(const std::string& source, const std::string& name, int device, Compiled& out) {
    if (const Loaded* loaded = find_loaded(name, device)) {
        out.kernel = loaded->kernel.get();
        out.compile_ms = 0.0;
        out.from_cache = loaded->from_cache;
        return true;
    }
    cuda::FusedKernelCompileOptions options;
    options.arch = cuda::device_arch(device);
    const std::optional<cuda::CompiledKernel> compiled = cuda::try_compile_fused_kernel(source, name, options);
    if (!compiled) return false;
    out.kernel = loaded_kernel(*compiled, device).kernel.get();
    out.compile_ms = compiled->compile_ms;
    out.from_cache = compiled->from_cache;
    return true;
}

// Distance in units in the last place between two values of a 16-bit floating format (sign-magnitude bits).
int ulps16(std::uint16_t a, std::uint16_t b) {
    const auto ordered = [](std::uint16_t bits) {
        return (bits & 0x8000u) ? -static_cast<int>(bits & 0x7fffu) : static_cast<int>(bits);
    };
    return std::abs(ordered(a) - ordered(b));
}

// The first element where the generated kernel's `got` and the unfused `expected` differ beyond the rule (bitwise
// for f32/f64, one ulp for bf16/f16; two NaNs agree), or -1.
std::int64_t first_mismatch(const Tensor& got, const Tensor& expected) {
    const Tensor a = got.to(Device::cpu()), b = expected.to(Device::cpu());
    const std::size_t width = dtype_size(a.dtype());
    const auto* x = static_cast<const unsigned char*>(a.raw_data());
    const auto* y = static_cast<const unsigned char*>(b.raw_data());
    for (std::int64_t i = 0; i < a.numel(); ++i) {
        const unsigned char* p = x + i * width;
        const unsigned char* q = y + i * width;
        if (std::memcmp(p, q, width) == 0) continue;
        if (width == 2) {
            std::uint16_t u = 0, v = 0;
            std::memcpy(&u, p, 2);
            std::memcpy(&v, q, 2);
            const bool nan_u = (u & 0x7fffu) > (a.dtype() == DType::bf16 ? 0x7f80u : 0x7c00u);
            const bool nan_v = (v & 0x7fffu) > (a.dtype() == DType::bf16 ? 0x7f80u : 0x7c00u);
            if ((nan_u && nan_v) || (!nan_u && !nan_v && ulps16(u, v) <= 1)) continue;
        } else if (width == 4) {
            float s = 0, t = 0;
            std::memcpy(&s, p, 4);
            std::memcpy(&t, q, 4);
            if (std::isnan(s) && std::isnan(t)) continue;
        } else if (width == 8) {
            double s = 0, t = 0;
            std::memcpy(&s, p, 8);
            std::memcpy(&t, q, 8);
            if (std::isnan(s) && std::isnan(t)) continue;
        }
        return i;
    }
    return -1;
}

// DYNGRAD_CHECK_FUSIONS=1: the kernel on the warm-up's own inputs, into scratch tensors, against the values the
// unfused kernels stored. false after logging the first differing element.
bool matches_unfused(const ComputeGraph& graph, const FusionGroup& group, const CompiledGroup& kernel,
                     const std::string& name) {
    std::vector<Tensor> inputs, scratch;
    for (NodeId id : kernel.inputs) inputs.push_back(graph.node(id).value);
    for (NodeId id : kernel.outputs) {
        const Tensor& value = graph.node(id).value;
        scratch.push_back(Tensor::empty(value.shape(), value.dtype(), value.device()));
    }
    launch_compiled_group(kernel, inputs, scratch);
    for (std::size_t j = 0; j < scratch.size(); ++j) {
        const Tensor& expected = graph.node(kernel.outputs[j]).value;
        const std::int64_t at = first_mismatch(scratch[j], expected);
        if (at < 0) continue;
        const auto element = [&](const Tensor& t) {
            return t.to(Device::cpu()).to(DType::f64).reshaped({t.numel()}).to_vector()[static_cast<std::size_t>(at)];
        };
        cuda::log_fusion({cuda::FusionLogEntry::Kind::CheckMismatch, name,
                          str("group ", members_text(graph, group), ": output #", kernel.outputs[j], " (",
                              dtype_name(expected.dtype()), ") element ", at, " is ", element(scratch[j]),
                              " generated and ", element(expected), " unfused; the group runs its unfused kernels")});
        return false;
    }
    return true;
}

}  // namespace

PlanCompile compile_plan_together(const ComputeGraph& graph, const FusionPlan& plan, std::span<const std::size_t> groups,
                                  std::span<const BackwardLaunch> launches) {
    PlanCompile out;
    if (groups.empty()) return out;
    const int device = graph.node(plan.groups[groups.front()].members.front()).value.device().index;
    std::vector<std::string> sources, names;
    const auto add = [&](std::string source, std::string name) {
        if (name.empty() || find_loaded(name, device) != nullptr ||
            std::find(names.begin(), names.end(), name) != names.end())
            return;
        sources.push_back(std::move(source));
        names.push_back(std::move(name));
    };
    try {
        for (std::size_t g : groups) {
            FusedKernelSource source = generate_fused_source(graph, with_every_member_written(plan.groups.at(g)));
            add(std::move(source.source), std::move(source.name));
        }
        for (const BackwardLaunch& launch : launches) {
            FusedBackwardSource source = generate_backward_source(graph, plan.groups.at(launch.group), launch);
            add(std::move(source.source), std::move(source.name));
        }
    } catch (const Error&) {
        return out;  // each kernel alone then, where the same error is logged against its group
    }
    if (sources.size() < 2) return out;  // nothing to share
    const std::string unit = combined_source(sources);
    cuda::FusedKernelCompileOptions options;
    options.arch = cuda::device_arch(device);
    const std::optional<cuda::CompiledKernel> compiled =
        cuda::try_compile_fused_kernel(unit, "dg_plan_" + cuda::hex64(cuda::fnv1a64(unit)), options);
    if (!compiled) return out;  // logged; each kernel alone then
    try {
        for (const std::string& name : names) {
            cuda::CompiledKernel one = *compiled;
            one.kernel = name;
            loaded_kernel(one, device);
        }
    } catch (const Error& e) {  // an image the driver refuses: each kernel alone then
        cuda::log_fusion({cuda::FusionLogEntry::Kind::CompileFallback, "", str("a plan's translation unit: ", e.what())});
        return out;
    }
    out.nvrtc_ms = compiled->compile_ms;
    out.from_cache = compiled->from_cache;
    out.kernels = names.size();
    return out;
}

std::optional<CompiledGroup> compile_group(const ComputeGraph& graph, const FusionGroup& group, bool check) {
    const int device = graph.node(group.members.front()).value.device().index;
    FusedKernelSource source;
    CompiledGroup out;
    try {
        source = generate_fused_source(graph, with_every_member_written(group));
        if (!compile_and_load(source.source, source.name, device, out)) return std::nullopt;  // logged by the compiler
    } catch (const Error& e) {  // a group the generator cannot write, or an image the driver refuses: unfused
        cuda::log_fusion({cuda::FusionLogEntry::Kind::CompileFallback, source.name,
                          str("group ", members_text(graph, group), ": ", e.what(), "; the group runs its unfused kernels")});
        return std::nullopt;
    }
    out.inputs = source.inputs;
    out.outputs = source.outputs;
    out.double_precision = group.double_precision;
    out.numel = source.numel;
    out.device = device;
    for (const ScalarArgument& scalar : source.scalars) {
        out.scalar_nodes.push_back(scalar.node);
        out.scalars.push_back(unary_scalar_bytes(graph.node(scalar.node).attrs, group.double_precision));
    }
    if (check && !matches_unfused(graph, group, out, source.name)) return std::nullopt;
    return out;
}
std::optional<CompiledBackward> compile_backward(const ComputeGraph& graph, const FusionGroup& group,
                                                 const BackwardLaunch& launch) {
    const int device = graph.node(group.members.front()).value.device().index;
    FusedBackwardSource source;
    CompiledBackward out;
    try {
        source = generate_backward_source(graph, group, launch);
        if (!source.name.empty() && !compile_and_load(source.source, source.name, device, out))
            return std::nullopt;  // logged by the compiler
    } catch (const Error& e) {
        cuda::log_fusion({cuda::FusionLogEntry::Kind::CompileFallback, source.name,
                          str("backward of group ", members_text(graph, group), ": ", e.what(),
                              "; its members run their unfused backward")});
        return std::nullopt;
    }
    out.launch = launch;
    out.saved = source.saved;
    out.gradients_in = source.gradients_in;
    for (NodeId e : source.stores) out.store_dtypes.push_back(graph.node(e).value.dtype());
    for (const FusedBackwardSource::Result& r : source.results)
        out.results.push_back({r.input, r.store, r.gradient_in, r.contributions});
    for (const ScalarArgument& scalar : source.scalars) {
        out.scalar_nodes.push_back(scalar.node);
        out.scalars.push_back(unary_scalar_bytes(graph.node(scalar.node).attrs, group.double_precision));
    }
    out.shape = group.shape;
    out.double_precision = group.double_precision;
    out.device = device;
    return out;
}

std::string backward_mismatch(const Tensor& generated, const Tensor& unfused, bool same_order, double magnitude) {
    if (generated.shape() != unfused.shape() || generated.dtype() != unfused.dtype())
        return str("generated ", describe(generated), ", unfused ", describe(unfused));
    if (same_order) {
        const std::int64_t at = first_mismatch(generated, unfused);
        if (at < 0) return "";
        const auto element = [&](const Tensor& t) {
            return t.to(Device::cpu()).to(DType::f64).reshaped({t.numel()}).to_vector()[static_cast<std::size_t>(at)];
        };
        return str("element ", at, " is ", element(generated), " generated and ", element(unfused), " unfused");
    }
    const std::vector<double> a = generated.to(Device::cpu()).to(DType::f64).reshaped({generated.numel()}).to_vector();
    const std::vector<double> b = unfused.to(Device::cpu()).to(DType::f64).reshaped({unfused.numel()}).to_vector();
    double largest = magnitude;
    if (largest <= 0.0)
        for (double v : b) largest = std::max(largest, std::abs(v));
    const double relative = unfused.dtype() == DType::f64 ? 1e-12 : unfused.dtype() == DType::f32 ? 1e-5 : 1e-2;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!(std::abs(a[i] - b[i]) <= relative * largest) && !(std::isnan(a[i]) && std::isnan(b[i])))
            return str("element ", i, " is ", a[i], " generated and ", b[i], " unfused (beyond ", relative,
                       " of the largest magnitude ", largest, ")");
    return "";
}
#else
PlanCompile compile_plan_together(const ComputeGraph&, const FusionPlan&, std::span<const std::size_t>,
                                  std::span<const BackwardLaunch>) {
    return {};
}
std::optional<CompiledGroup> compile_group(const ComputeGraph&, const FusionGroup&, bool) { return std::nullopt; }
std::optional<CompiledBackward> compile_backward(const ComputeGraph&, const FusionGroup&, const BackwardLaunch&) {
    return std::nullopt;
}
std::string backward_mismatch(const Tensor&, const Tensor&, bool, double) { return "the CUDA build only"; }
#endif

}  // namespace dyngrad::fusion
