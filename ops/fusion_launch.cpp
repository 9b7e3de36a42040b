// A fusion plan's kernels made runnable for the hook (graph/fusion_replay.h declares it; ops/ implements it because
// it generates the sources, ops/fusion_source.h): each group's source (every member an output) and each backward
// chain's generated once, compiled together through NVRTC's disk cache, loaded as one module per device, and with
// DYNGRAD_CHECK_FUSIONS=1 each group compared once with its members' unfused values.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "dyngrad/core/half.h"
#include "dyngrad/cuda/fused_kernel.h"
#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/graph/anomaly.h"
#include "dyngrad/graph/fusion_replay.h"
#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/fusion_source.h"
#include "dyngrad/ops/kernels.h"

namespace dyngrad::fusion {

std::vector<std::byte> member_scalar_bytes(const ComputeNode& node, bool double_precision) {
    const auto bytes = [](const auto& value) {
        std::vector<std::byte> out(sizeof value);
        std::memcpy(out.data(), &value, sizeof value);
        return out;
    };
    // dropout: its p and attribute seed (the seed input, when it has one, is a kernel input instead).
    if (node.op == OpType::Dropout) return bytes(math::DropoutScalars{node.attrs.scalar, node.attrs.seed});
    OpAttrs attrs = node.attrs;
    // masked_fill stores its scalar converted to the output's dtype once (double -> bf16/f16 directly, as its CUDA
    // kernel converts it): passed already rounded, the kernel's f32 holds it exactly.
    if (node.op == OpType::MaskedFill && node.value.dtype() == DType::bf16) attrs.scalar = to_double(to_bfloat16(attrs.scalar));
    if (node.op == OpType::MaskedFill && node.value.dtype() == DType::f16) attrs.scalar = to_double(to_float16(attrs.scalar));
    return double_precision ? bytes(math::unary_scalars<double>(attrs)) : bytes(math::unary_scalars<float>(attrs));
}

namespace detail {
void draw_skipped_dropout_seed(std::span<const Tensor> inputs) {
#if DYNGRAD_WITH_CUDA
    if (inputs.size() > 1 && inputs[1].device().is_cuda()) cuda::draw_pending_seed(inputs[1]);
#else
    static_cast<void>(inputs);
#endif
}
}  // namespace detail

#if DYNGRAD_WITH_CUDA
namespace {

// "add #5, relu #6": a group in log entries.
std::string members_text(const ComputeGraph& graph, const FusionGroup& group) {
    std::string out;
    for (NodeId m : group.members) out += str(out.empty() ? "" : ", ", op_def(graph.node(m).op).name, " #", m);
    return out;
}

// Loaded kernels live for the process: a captured graph's kernel nodes point into them on every replay. By device
// and kernel name (a name is a hash of the kernel's source), with whether the image came from the disk cache.
struct Loaded {
    std::unique_ptr<cuda::FusedKernel> kernel;
    bool from_cache = false;
};
std::mutex loaded_mutex;
std::map<std::pair<int, std::string>, Loaded>& loaded_kernels() {
    static auto* kernels = new std::map<std::pair<int, std::string>, Loaded>;
    return *kernels;
}

const Loaded* find_loaded(const std::string& name, int device) {
    const std::lock_guard lock(loaded_mutex);
    const auto found = loaded_kernels().find({device, name});
    return found == loaded_kernels().end() ? nullptr : &found->second;
}

// Kernels `names` of one compiled image, loaded as one module; nothing is kept when any of them fails (throws).
void load_kernels(const cuda::CompiledKernel& compiled, std::span<const std::string> names, int device) {
    const auto module = std::make_shared<const cuda::FusedModule>(compiled.image, device);
    std::vector<std::unique_ptr<cuda::FusedKernel>> kernels;
    for (const std::string& name : names) kernels.push_back(std::make_unique<cuda::FusedKernel>(module, name));
    const std::lock_guard lock(loaded_mutex);
    for (std::size_t i = 0; i < names.size(); ++i)
        loaded_kernels().try_emplace({device, names[i]}, Loaded{std::move(kernels[i]), compiled.from_cache});
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
    const std::vector<int> passes = member_passes(graph, group);
    const auto pass_of = [&](NodeId id) {
        return passes[static_cast<std::size_t>(std::find(group.members.begin(), group.members.end(), id) - group.members.begin())];
    };
    for (std::size_t j = 0; j < scratch.size(); ++j) {
        const Tensor& expected = graph.node(kernel.outputs[j]).value;
        const RowReduction* reduction = group.reduction_of(kernel.outputs[j]);
        // A row's sums add in another order than the unfused reduction, and what a later pass computes from them
        // inherits that: within the sum's rounding, bounded by the row's largest term times its length (a value
        // computed from sums: by its own largest magnitude).
        if (reduction != nullptr || pass_of(kernel.outputs[j]) > 0) {
            double magnitude = 0.0;
            if (reduction != nullptr) {
                const TensorStats stats = tensor_stats(graph.node(reduction->input).value);
                magnitude = std::max(std::abs(stats.min), std::abs(stats.max)) * static_cast<double>(reduction->row_length);
                if (reduction->mean) magnitude /= static_cast<double>(reduction->row_length);
                if (!std::isfinite(magnitude)) magnitude = 0.0;
            }
            const std::string mismatch = backward_mismatch(scratch[j], expected, /*same_order=*/false, magnitude);
            if (mismatch.empty()) continue;
            cuda::log_fusion({cuda::FusionLogEntry::Kind::CheckMismatch, name,
                              str("group ", members_text(graph, group), ": #", kernel.outputs[j], " (",
                                  dtype_name(expected.dtype()), ", after a row reduction): ", mismatch,
                                  "; the group runs its unfused kernels")});
            return false;
        }
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

// A CompiledGroup or CompiledBackward pointed at its loaded kernel; false when it is not loaded.
template <typename Compiled>
bool take_loaded(const std::string& name, int device, Compiled& out) {
    const Loaded* loaded = find_loaded(name, device);
    if (loaded == nullptr) return false;
    out.kernel = loaded->kernel.get();
    out.from_cache = loaded->from_cache;
    return true;
}

CompiledGroup group_arguments(const ComputeGraph& graph, const FusionGroup& group, const FusedKernelSource& source,
                              int device) {
    CompiledGroup out;
    out.inputs = source.inputs;
    out.outputs = source.outputs;
    out.double_precision = group.double_precision;
    out.numel = source.numel;
    out.device = device;
    for (const ScalarArgument& scalar : source.scalars) {
        out.scalar_nodes.push_back(scalar.node);
        out.scalars.push_back(member_scalar_bytes(graph.node(scalar.node), group.double_precision));
    }
    return out;
}

CompiledBackward backward_arguments(const ComputeGraph& graph, const FusionGroup& group, const BackwardLaunch& launch,
                                    const FusedBackwardSource& source, int device) {
    CompiledBackward out;
    out.launch = launch;
    out.saved = source.saved;
    out.gradients_in = source.gradients_in;
    out.store_dtypes = source.store_dtypes;
    out.store_shapes = source.store_shapes;
    out.numel = source.numel;
    for (const FusedBackwardSource::Result& r : source.results)
        out.results.push_back({r.input, r.store, r.gradient_in, r.contributions, r.row_summed, r.magnitude_store});
    for (const ScalarArgument& scalar : source.scalars) {
        out.scalar_nodes.push_back(scalar.node);
        out.scalars.push_back(member_scalar_bytes(graph.node(scalar.node), group.double_precision));
    }
    out.shape = group.shape;
    out.double_precision = group.double_precision;
    out.device = device;
    return out;
}

}  // namespace

CompiledPlan compile_plan(const ComputeGraph& graph, const FusionPlan& plan, std::span<const std::size_t> groups,
                          std::span<const BackwardLaunch> launches, bool check) {
    CompiledPlan out;
    out.groups.resize(groups.size());
    out.chains.resize(launches.size());
    if (groups.empty()) return out;
    const int device = graph.node(plan.groups.at(groups.front()).members.front()).value.device().index;
    // Each kernel's source, generated once; a group or chain the generator cannot write is logged and left unfused.
    std::vector<std::optional<FusedKernelSource>> group_sources(groups.size());
    std::vector<std::optional<FusedBackwardSource>> chain_sources(launches.size());
    for (std::size_t i = 0; i < groups.size(); ++i) {
        const FusionGroup& group = plan.groups.at(groups[i]);
        try {
            group_sources[i] = generate_fused_source(graph, with_every_member_written(group));
        } catch (const Error& e) {
            cuda::log_fusion({cuda::FusionLogEntry::Kind::CompileFallback, "",
                              str("group ", members_text(graph, group), ": ", e.what(),
                                  "; the group runs its unfused kernels")});
        }
    }
    for (std::size_t i = 0; i < launches.size(); ++i) {
        const FusionGroup& group = launch_group(plan, launches[i]);
        try {
            chain_sources[i] = generate_backward_source(graph, group, launches[i], /*magnitudes=*/check);
        } catch (const Error& e) {
            cuda::log_fusion({cuda::FusionLogEntry::Kind::CompileFallback, "",
                              str("backward of group ", members_text(graph, group), ": ", e.what(),
                                  "; its members run their unfused backward")});
        }
    }
    // The kernels not loaded yet (a chain that stores nothing has no kernel), in one translation unit.
    std::vector<std::string> sources, names;
    const auto add = [&](const std::string& source, const std::string& name) {
        if (name.empty() || find_loaded(name, device) != nullptr ||
            std::find(names.begin(), names.end(), name) != names.end())
            return;
        sources.push_back(source);
        names.push_back(name);
    };
    for (const auto& source : group_sources)
        if (source) add(source->source, source->name);
    for (const auto& source : chain_sources)
        if (source) add(source->source, source->name);
    cuda::FusedKernelCompileOptions options;
    options.arch = cuda::device_arch(device);
    bool together = false;
    if (sources.size() >= 2) {
        const std::string unit = combined_source(sources);
        if (const std::optional<cuda::CompiledKernel> compiled =
                cuda::try_compile_fused_kernel(unit, "dg_plan_" + cuda::hex64(cuda::fnv1a64(unit)), options)) {
            out.nvrtc_ms += compiled->compile_ms;
            try {
                load_kernels(*compiled, names, device);
                together = true;
                out.kernels_together = names.size();
            } catch (const Error& e) {  // an image the driver refuses: each kernel alone then
                cuda::log_fusion({cuda::FusionLogEntry::Kind::CompileFallback, "",
                                  str("a plan's translation unit: ", e.what(), "; its kernels are compiled one by one")});
            }
        }  // else logged by the compiler; each kernel alone then
    }
    if (!together)
        for (std::size_t i = 0; i < names.size(); ++i) {
            const std::optional<cuda::CompiledKernel> compiled = cuda::try_compile_fused_kernel(sources[i], names[i], options);
            if (!compiled) continue;  // logged by the compiler: that kernel's group or chain runs unfused
            out.nvrtc_ms += compiled->compile_ms;
            try {
                load_kernels(*compiled, std::span(&names[i], 1), device);
            } catch (const Error& e) {
                cuda::log_fusion({cuda::FusionLogEntry::Kind::CompileFallback, names[i],
                                  str(e.what(), "; its group or chain runs unfused")});
            }
        }
    for (std::size_t i = 0; i < groups.size(); ++i) {
        if (!group_sources[i]) continue;
        const FusionGroup& group = plan.groups.at(groups[i]);
        CompiledGroup compiled = group_arguments(graph, group, *group_sources[i], device);
        if (!take_loaded(group_sources[i]->name, device, compiled)) continue;
        if (check && !matches_unfused(graph, group, compiled, group_sources[i]->name)) continue;
        out.groups[i] = std::move(compiled);
    }
    for (std::size_t i = 0; i < launches.size(); ++i) {
        if (!chain_sources[i]) continue;
        const FusionGroup& group = launch_group(plan, launches[i]);
        CompiledBackward compiled = backward_arguments(graph, group, launches[i], *chain_sources[i], device);
        if (!chain_sources[i]->name.empty() && !take_loaded(chain_sources[i]->name, device, compiled)) continue;
        out.chains[i] = std::move(compiled);
    }
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
CompiledPlan compile_plan(const ComputeGraph&, const FusionPlan&, std::span<const std::size_t> groups,
                          std::span<const BackwardLaunch> launches, bool) {
    CompiledPlan out;
    out.groups.resize(groups.size());
    out.chains.resize(launches.size());
    return out;
}
std::string backward_mismatch(const Tensor&, const Tensor&, bool, double) { return "the CUDA build only"; }
#endif

}  // namespace dyngrad::fusion
