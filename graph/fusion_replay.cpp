// The captured-step hook of the fusion compiler (graph/fusion_replay.h, docs/fusion.md).
#include "dyngrad/graph/fusion_replay.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <utility>

#include "dyngrad/cuda/runtime.h"

namespace dyngrad::fusion {

LaunchTracker::LaunchTracker(const FusionPlan& plan) : plan_(&plan), launched_(plan.groups.size(), 0) {
    for (std::size_t g = 0; g < plan.groups.size(); ++g)
        for (NodeId m : plan.groups[g].members) {
            if (m >= group_of_.size()) group_of_.resize(m + std::size_t{1}, -1);
            group_of_[m] = static_cast<int>(g);
        }
}

int LaunchTracker::group_of(NodeId node) const { return node < group_of_.size() ? group_of_[node] : -1; }

std::vector<std::size_t> LaunchTracker::before(NodeId node, std::span<const NodeId> inputs) {
    std::vector<std::size_t> due;
    const int own = group_of(node);
    for (NodeId input : inputs) {
        const int g = group_of(input);
        if (g < 0 || g == own || launched_[g]) continue;
        launched_[g] = 1;
        due.push_back(static_cast<std::size_t>(g));
    }
    return due;
}

std::optional<std::size_t> LaunchTracker::after(NodeId node) {
    const int g = group_of(node);
    if (g < 0 || launched_[g] || plan_->groups[g].members.back() != node) return std::nullopt;
    launched_[g] = 1;
    return static_cast<std::size_t>(g);
}

std::vector<LaunchEvent> schedule_launches(const FusionPlan& plan, std::span<const std::vector<NodeId>> node_inputs) {
    LaunchTracker tracker(plan);
    std::vector<LaunchEvent> events;
    for (std::size_t i = 0; i < node_inputs.size(); ++i) {
        const auto node = static_cast<NodeId>(i);
        for (std::size_t g : tracker.before(node, node_inputs[i])) events.push_back({g, node, true});
        if (const auto g = tracker.after(node)) events.push_back({*g, node, false});
    }
    return events;
}

namespace {

// What differs: both node counts and the first differing node.
std::string difference_text(std::size_t warm_up_count, std::size_t capture_count, std::size_t at,
                            const std::string& warm_up_node, const std::string& capture_node) {
    const auto shown = [](const std::string& text) { return text.empty() ? std::string("(none)") : str("'", text, "'"); };
    return str("the captured step recorded another graph than its warm-up (", capture_count, " nodes in the capture, ",
               warm_up_count, " in the warm-up); the first that differs is node #", at, ": ", shown(capture_node),
               " in the capture, ", shown(warm_up_node), " in the warm-up");
}

// The GraphError when a fused group's kernel already stands for a node of the capture that differs.
std::string mismatch_text(std::size_t warm_up_count, std::size_t capture_count, std::size_t at,
                          const std::string& warm_up_node, const std::string& capture_node) {
    return str(difference_text(warm_up_count, capture_count, at, warm_up_node, capture_node),
               ". A fused group's kernel planned in the warm-up has replaced nodes of this graph, so the step is not ",
               "capturable with fusion on (a host branch or counter?); docs/fusion.md");
}

}  // namespace

std::string graph_mismatch_message(std::span<const std::string> warm_up_nodes, std::span<const std::string> capture_nodes) {
    const std::size_t common = std::min(warm_up_nodes.size(), capture_nodes.size());
    std::size_t at = 0;
    while (at < common && warm_up_nodes[at] == capture_nodes[at]) ++at;
    if (at == common && warm_up_nodes.size() == capture_nodes.size()) return "";
    return difference_text(warm_up_nodes.size(), capture_nodes.size(), at,
                           at < warm_up_nodes.size() ? warm_up_nodes[at] : std::string(),
                           at < capture_nodes.size() ? capture_nodes[at] : std::string());
}

namespace {

// One launch of a generated kernel: pointer parameters (inputs, then outputs), then the scalar arguments' bytes.
void launch_generated(const cuda::FusedKernel& kernel, std::int64_t elements, std::span<const Tensor> inputs,
                      std::span<const Tensor> outputs, const std::vector<std::vector<std::byte>>& scalars) {
#if DYNGRAD_WITH_CUDA
    std::vector<void*> pointers;
    pointers.reserve(inputs.size() + outputs.size());
    for (const Tensor& t : inputs) pointers.push_back(t.raw_data());
    for (const Tensor& t : outputs) pointers.push_back(t.raw_data());
    std::vector<void*> arguments;
    arguments.reserve(pointers.size() + scalars.size());
    for (void*& pointer : pointers) arguments.push_back(&pointer);
    for (const std::vector<std::byte>& scalar : scalars) arguments.push_back(const_cast<std::byte*>(scalar.data()));
    kernel.launch(elements, arguments);
#else
    static_cast<void>(kernel);
    static_cast<void>(elements);
    static_cast<void>(inputs);
    static_cast<void>(outputs);
    static_cast<void>(scalars);
    throw DeviceError("fusion: generated kernels need the CUDA build");
#endif
}

}  // namespace

void launch_compiled_group(const CompiledGroup& group, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
    launch_generated(*group.kernel, group.numel, inputs, outputs, group.scalars);
}

void launch_compiled_backward(const CompiledBackward& chain, std::span<const Tensor> inputs,
                              std::span<const Tensor> outputs) {
    if (chain.kernel == nullptr) return;  // nothing to store
    launch_generated(*chain.kernel, numel(chain.shape), inputs, outputs, chain.scalars);
}

// ---- the hook's state, per thread ----
namespace {

// A graph's plan, its groups compiled (those that failed are gone from `plan`), made at its first backward.
struct Prepared {
    std::vector<std::string> node_signatures;  // of the warm-up graph, node by node
    std::string signature;                     // graph_signature() of that graph
    FusionPlan plan;                           // the groups kept; no backward chains
    std::vector<CompiledGroup> kernels;        // by group
    std::map<NodeId, DType> member_dtype;
    std::shared_ptr<BackwardFusion> backward;  // the kept groups' backward chains, for a backward from its root
};

using GraphKey = std::pair<const ComputeGraph*, std::uint64_t>;

// A plan of a CapturedStep variant's warm-up, waiting for that variant's capture.
struct Waiting {
    std::shared_ptr<const Prepared> prepared;
    bool used = false;
};

// The graph of a capture that runs a plan. Until its first member is recorded (`committed`) the graph is only
// compared with the plan's node by node, and a difference lets it go (or take another waiting plan): nothing has
// been skipped yet. From then on the capture must record the warm-up's graph: a difference is a GraphError.
struct Applying {
    std::shared_ptr<const Prepared> prepared;
    std::size_t waiting = 0;  // its index in the variant's list
    GraphKey graph{nullptr, 0};
    LaunchTracker tracker;
    std::map<NodeId, Tensor> preallocated;  // outputs of members not recorded when their group launched
    bool committed = false;
    NodeId checked = 0;  // nodes [0, checked) equal the plan's
};

struct State {
    std::map<std::string, std::shared_ptr<const Prepared>> prepared;  // by signature and root
    // By variant (cuda::current_step_run()): the plans of its warm-up's graphs that ran a backward, in order.
    std::map<std::uint64_t, std::vector<Waiting>> warm_ups;
    std::uint64_t warm_up_variant = 0;
    std::vector<GraphKey> warm_up_graphs;  // graphs of that warm-up that added a plan
    std::optional<Applying> applying;
    std::uint64_t capture_variant = 0;
    std::vector<GraphKey> declined;  // graphs of that capture that match no waiting plan: unfused
    ReplayStats stats;
};

// Set while a plan is being applied or a variant's plans wait: the engine's per-node test.
thread_local bool tls_armed = false;
thread_local bool tls_plans_wait = false;

State& state() {
    thread_local State s;
    return s;
}

void update_armed(const State& s) {
    tls_armed = s.applying.has_value();
    tls_plans_wait = !s.warm_ups.empty();
}

constexpr std::size_t kMaxPendingGraphs = 16;  // a warm-up of more graphs than this: the rest are not fused
constexpr std::size_t kMaxWaitingVariants = 64;  // the oldest variants' plans go first (never captured, or re-warmed)

std::shared_ptr<const Prepared> prepare(const ComputeGraph& graph, std::string signature, NodeId root) {
    const auto started = std::chrono::steady_clock::now();
    auto out = std::make_shared<Prepared>();
    out->signature = std::move(signature);
    for (NodeId id = 0; id < graph.size(); ++id) out->node_signatures.push_back(node_signature(graph, id));
    FusionPlan plan = plan_fusion(graph);
    out->plan.signature = plan.signature;
    const bool check = fusion_settings().check;
    ReplayStats& stats = state().stats;
    for (FusionGroup& group : plan.groups) {
        // Only CUDA groups; a member whose forward saved extras for its backward is never skipped (its skipped
        // forward would not save them; no pointwise row saves any today).
        const bool usable = std::all_of(group.members.begin(), group.members.end(), [&](NodeId m) {
            const ComputeNode& node = graph.node(m);
            return node.value.device().is_cuda() && node.saved.empty();
        });
        if (!usable) continue;
        std::optional<CompiledGroup> compiled = compile_group(graph, group, check);
        if (!compiled) {
            ++stats.groups_dropped;
            continue;
        }
        ++stats.groups_compiled;
        stats.nvrtc_ms += compiled->compile_ms;
        stats.groups_from_cache += compiled->from_cache ? 1 : 0;
        for (NodeId m : group.members) out->member_dtype[m] = graph.node(m).value.dtype();
        out->plan.groups.push_back(std::move(group));
        out->kernels.push_back(std::move(*compiled));
    }
    // The kept groups' backward chains, as a backward from `root` runs them (they read the values the forward
    // stored, fused or not, so eager steps run them too).
    out->backward = std::make_shared<BackwardFusion>();
    out->backward->root = root;
    out->backward->check = check;
    const std::vector<char> reached = reached_by_backward(graph, root);
    for (std::size_t g = 0; g < out->plan.groups.size(); ++g) {
        const std::optional<BackwardLaunch> launch = backward_launch(graph, out->plan, g, reached, root);
        if (!launch) continue;
        std::optional<CompiledBackward> compiled = compile_backward(graph, out->plan.groups[g], *launch);
        if (!compiled) {
            ++stats.backward_chains_dropped;
            continue;
        }
        ++stats.backward_chains_compiled;
        stats.nvrtc_ms += compiled->compile_ms;
        out->backward->chains.push_back(std::move(*compiled));
    }
    ++stats.plans;
    stats.prepare_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    return out;
}

bool is(const std::optional<Applying>& applying, const ComputeGraph& graph, std::uint64_t generation) {
    return applying && applying->graph == GraphKey{&graph, generation};
}

// Ends the capture's use of its plan (CapturedStep discards the capture) and throws.
[[noreturn]] void fail(State& s, std::string message) {
    s.applying.reset();
    update_armed(s);
    throw GraphError(std::move(message));
}

[[noreturn]] void throw_mismatch(State& s, const ComputeGraph& graph, NodeId at) {
    const Prepared& p = *s.applying->prepared;
    const std::string capture_node = at < graph.size() ? node_signature(graph, at) : std::string();
    const std::string warm_up_node = at < p.node_signatures.size() ? p.node_signatures[at] : std::string();
    fail(s, mismatch_text(p.node_signatures.size(), graph.size(), at, warm_up_node, capture_node));
}

// Every node a kernel reads or writes must be the warm-up's: checked when it is recorded (members) or launched
// (external inputs), so no kernel runs on another graph's values even before backward compares the whole graph.
void check_node(State& s, const ComputeGraph& graph, NodeId id) {
    const Prepared& p = *s.applying->prepared;
    if (id >= graph.size() || id >= p.node_signatures.size() || node_signature(graph, id) != p.node_signatures[id])
        throw_mismatch(s, graph, id);
}

void launch_group(State& s, const ComputeGraph& graph, std::size_t g) {
    Applying& a = *s.applying;
    const CompiledGroup& kernel = a.prepared->kernels[g];
    const FusionGroup& group = a.prepared->plan.groups[g];
    std::vector<Tensor> inputs, outputs;
    for (NodeId id : kernel.inputs) {
        check_node(s, graph, id);  // recorded (the plan is legal) and as in the warm-up
        inputs.push_back(graph.node(id).value);
    }
    const Device device = Device::cuda(kernel.device);
    for (NodeId id : kernel.outputs) {
        if (id < graph.size()) {
            outputs.push_back(graph.node(id).value);
            continue;
        }
        // Recorded later (an outside reader came between two members): its node takes this tensor.
        Tensor out = Tensor::empty(group.shape, a.prepared->member_dtype.at(id), device);
        a.preallocated.emplace(id, out);
        outputs.push_back(std::move(out));
    }
    launch_compiled_group(kernel, inputs, outputs);
}

// Whether the graph's nodes [from, size) equal `p`'s.
bool prefix_matches(const Prepared& p, const ComputeGraph& graph, NodeId from) {
    if (graph.size() > p.node_signatures.size()) return false;
    for (NodeId id = from; id < graph.size(); ++id)
        if (node_signature(graph, id) != p.node_signatures[id]) return false;
    return true;
}

// The capture's graph takes the first waiting plan of its variant whose graph it has recorded so far; none: it
// runs unfused (declined), as a graph that ran no backward in the warm-up does.
bool bind(State& s, const ComputeGraph& graph, std::uint64_t generation, Device device) {
    if (s.applying || !device.is_cuda() || !cuda::capturing(device.index) || !fusion_settings().enabled) return false;
    const cuda::StepRun run = cuda::current_step_run();
    if (!run.capture) return false;
    if (run.variant != s.capture_variant) {
        s.capture_variant = run.variant;
        s.declined.clear();
    }
    const GraphKey key{&graph, generation};
    if (std::find(s.declined.begin(), s.declined.end(), key) != s.declined.end()) return false;
    const auto list = s.warm_ups.find(run.variant);
    if (list != s.warm_ups.end())
        for (std::size_t i = 0; i < list->second.size(); ++i) {
            const Waiting& w = list->second[i];
            if (w.used || !prefix_matches(*w.prepared, graph, 0)) continue;
            s.applying.emplace(Applying{w.prepared, i, key, LaunchTracker(w.prepared->plan), {}, false, graph.size()});
            update_armed(s);
            return true;
        }
    s.declined.push_back(key);
    return false;
}

// Before the first member: the graph recorded since the last check must still be the plan's, else the plan lets
// it go (and the graph tries the other waiting plans). False when the graph has no plan any more.
bool still_bound(State& s, const ComputeGraph& graph, std::uint64_t generation, Device device) {
    Applying& a = *s.applying;
    if (a.committed || prefix_matches(*a.prepared, graph, a.checked)) {
        a.checked = graph.size();
        return true;
    }
    s.applying.reset();
    update_armed(s);
    return bind(s, graph, generation, device);
}

// "7 relu() 6 (64, 96) float32 cuda:0": what node_signature will say of a node about to be recorded, up to its
// requires_grad flag (checked once it is recorded).
std::string upcoming_signature(const OpDef& def, OpType op, std::span<const Var> input_vars, const OpAttrs& attrs,
                               const OutputSpec& spec, Device device) {
    std::string out = str(static_cast<int>(op), " ", def.name, "(", attrs_text(def, attrs), ")");
    for (const Var& v : input_vars) out += str(" ", v.id());
    return str(out, " ", to_string(spec.shape), " ", dtype_name(spec.dtype), " ", device.to_string());
}

}  // namespace

ReplayStats replay_stats() { return state().stats; }

namespace detail {

bool replay_armed() noexcept { return tls_armed || (tls_plans_wait && cuda::current_step_run().capture); }

Tensor before_record(const ComputeGraph& graph, std::uint64_t generation, const OpDef& def, OpType op,
                     std::span<const Var> input_vars, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    State& s = state();
    const Device device = inputs.front().device();
    if (is(s.applying, graph, generation)) {
        if (!still_bound(s, graph, generation, device)) return {};
    } else if (!bind(s, graph, generation, device)) {
        return {};
    }
    Applying& a = *s.applying;
    const auto id = static_cast<NodeId>(graph.size());
    std::vector<NodeId> input_ids;
    for (const Var& v : input_vars) input_ids.push_back(v.id());
    for (std::size_t g : a.tracker.before(id, input_ids)) launch_group(s, graph, g);
    const int g = a.tracker.group_of(id);
    if (g < 0) return {};
    // A member: its output, no kernel. What it records is checked against the warm-up in after_record.
    const FusionGroup& group = a.prepared->plan.groups[static_cast<std::size_t>(g)];
    const OutputSpec spec = def.infer(op, inputs, attrs);
    const auto dtype = a.prepared->member_dtype.find(id);
    const bool as_planned = spec.shape == group.shape && dtype != a.prepared->member_dtype.end() &&
                            spec.dtype == dtype->second &&
                            a.prepared->node_signatures.at(id).starts_with(
                                upcoming_signature(def, op, input_vars, attrs, spec, device));
    if (!as_planned) {
        if (!a.committed) {  // nothing skipped yet: this graph runs unfused
            s.declined.push_back(a.graph);
            s.applying.reset();
            update_armed(s);
            return {};
        }
        fail(s, mismatch_text(a.prepared->node_signatures.size(), graph.size() + std::size_t{1}, id,
                              a.prepared->node_signatures.at(id),
                              upcoming_signature(def, op, input_vars, attrs, spec, device)));
    }
    a.committed = true;
    if (const auto kept = a.preallocated.find(id); kept != a.preallocated.end()) {
        Tensor out = std::move(kept->second);
        a.preallocated.erase(kept);
        return out;
    }
    return Tensor::empty(spec.shape, spec.dtype, device);
}

void after_record(const ComputeGraph& graph, std::uint64_t generation, NodeId id) {
    State& s = state();
    if (!is(s.applying, graph, generation)) return;
    Applying& a = *s.applying;
    const int g = a.tracker.group_of(id);
    if (g < 0 || !a.committed) return;  // uncommitted: compared at the next recording or at backward
    check_node(s, graph, id);
    const CompiledGroup& kernel = a.prepared->kernels[static_cast<std::size_t>(g)];
    for (std::size_t j = 0; j < kernel.scalar_nodes.size(); ++j)
        if (kernel.scalar_nodes[j] == id && unary_scalar_bytes(graph.node(id).attrs, kernel.double_precision) != kernel.scalars[j])
            throw_mismatch(s, graph, id);
    if (const auto due = a.tracker.after(id)) launch_group(s, graph, *due);
}

std::shared_ptr<BackwardFusion> at_backward(const ComputeGraph& graph, std::uint64_t generation, NodeId root) {
    const Device device = graph.node(root).value.device();
    if (!device.is_cuda()) return nullptr;
    State& s = state();
    const GraphKey key{&graph, generation};
    // The chains of a plan made for a backward from this root (another root: the members run unfused).
    const auto chains_for = [&](const Prepared& p) -> std::shared_ptr<BackwardFusion> {
        if (!p.backward || p.backward->root != root || p.backward->chains.empty()) return nullptr;
        return p.backward;
    };
    if (cuda::capturing(device.index)) {
        if (!is(s.applying, graph, generation)) return nullptr;
        Applying& a = *s.applying;
        // Each kernel's members and inputs were checked against the warm-up as they were recorded or read, so the
        // forward is right even where the graph differs elsewhere (a host counter adding a node after the groups):
        // then only the backward chains, planned from the whole warm-up graph, are not used.
        const bool as_warm_up = graph_signature(graph) == a.prepared->signature;
        if (!a.committed) {  // it never skipped a kernel: it runs unfused, as a graph without a plan
            s.declined.push_back(a.graph);
            s.applying.reset();
            update_armed(s);
            return nullptr;
        }
        const std::size_t groups = a.prepared->plan.groups.size();
        for (std::size_t g = 0; g < groups; ++g)  // none left when the graph is the warm-up's
            if (!a.tracker.launched(g)) launch_group(s, graph, g);
        std::shared_ptr<BackwardFusion> chains = as_warm_up ? chains_for(*a.prepared) : nullptr;
#if DYNGRAD_WITH_CUDA
        if (!as_warm_up) {
            std::vector<std::string> nodes;
            for (NodeId id = 0; id < graph.size(); ++id) nodes.push_back(node_signature(graph, id));
            cuda::log_fusion({cuda::FusionLogEntry::Kind::GraphDiffers, "",
                              graph_mismatch_message(a.prepared->node_signatures, nodes)});
        }
#endif
        ++s.stats.captures;
        s.stats.last_groups = a.prepared->plan.groups.size();
        s.stats.last_launches_saved = a.prepared->plan.launches_saved();
        const auto list = s.warm_ups.find(s.capture_variant);
        if (list != s.warm_ups.end()) {
            list->second.at(a.waiting).used = true;
            if (std::all_of(list->second.begin(), list->second.end(), [](const Waiting& w) { return w.used; }))
                s.warm_ups.erase(list);  // the variant's capture took every plan
        }
        s.applying.reset();
        update_armed(s);
        return chains;
    }
    if (!fusion_settings().enabled) {  // turned off since a plan was made: none waits any longer
        s.warm_ups.clear();
        s.applying.reset();
        update_armed(s);
        return nullptr;
    }
    // An eager backward (a CapturedStep's warm-up or any other): plan the graph; a warm-up's plan waits for the
    // variant's capture.
    std::string signature = graph_signature(graph);
    const std::string prepared_key = str(signature, "@", root);
    auto found = s.prepared.find(prepared_key);
    if (found == s.prepared.end()) found = s.prepared.emplace(prepared_key, prepare(graph, signature, root)).first;
    const cuda::StepRun run = cuda::current_step_run();
    if (run.variant != 0 && !run.capture && !found->second->plan.groups.empty()) {
        if (run.variant != s.warm_up_variant) {
            s.warm_up_variant = run.variant;
            s.warm_up_graphs.clear();
        }
        std::vector<Waiting>& list = s.warm_ups[run.variant];
        if (std::find(s.warm_up_graphs.begin(), s.warm_up_graphs.end(), key) == s.warm_up_graphs.end() &&
            list.size() < kMaxPendingGraphs) {
            s.warm_up_graphs.push_back(key);
            list.push_back({found->second});
        }
        while (s.warm_ups.size() > kMaxWaitingVariants) s.warm_ups.erase(s.warm_ups.begin());
        update_armed(s);
    }
    return chains_for(*found->second);
}

void count_backward_chain_run() noexcept { ++state().stats.backward_chains_run; }
void backward_chain_dropped(const std::string& reason) {
    ++state().stats.backward_chains_dropped;
#if DYNGRAD_WITH_CUDA
    cuda::log_fusion({cuda::FusionLogEntry::Kind::CheckMismatch, "backward chain", reason});
#else
    static_cast<void>(reason);
#endif
}

void graph_ended(const ComputeGraph& graph, std::uint64_t generation) noexcept {
    if (!tls_armed) return;  // nothing applied: every graph's destructor passes here
    State& s = state();
    if (!is(s.applying, graph, generation)) return;
    s.applying.reset();  // a graph of the capture that ran no backward: its plan is spent
    update_armed(s);
}

}  // namespace detail

}  // namespace dyngrad::fusion
