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

std::string mismatch_text(std::size_t warm_up_count, std::size_t capture_count, std::size_t at,
                          const std::string& warm_up_node, const std::string& capture_node) {
    const auto shown = [](const std::string& text) { return text.empty() ? std::string("(none)") : str("'", text, "'"); };
    return str("the captured step recorded another graph than its warm-up (", capture_count, " nodes in the capture, ",
               warm_up_count, " in the warm-up); the first that differs is node #", at, ": ", shown(capture_node),
               " in the capture, ", shown(warm_up_node), " in the warm-up. The fusion plan made in the warm-up does ",
               "not apply: the step is not capturable with fusion on (a host branch or counter?); docs/fusion.md");
}

}  // namespace

std::string graph_mismatch_message(std::span<const std::string> warm_up_nodes, std::span<const std::string> capture_nodes) {
    const std::size_t common = std::min(warm_up_nodes.size(), capture_nodes.size());
    std::size_t at = 0;
    while (at < common && warm_up_nodes[at] == capture_nodes[at]) ++at;
    if (at == common && warm_up_nodes.size() == capture_nodes.size()) return "";
    return mismatch_text(warm_up_nodes.size(), capture_nodes.size(), at,
                         at < warm_up_nodes.size() ? warm_up_nodes[at] : std::string(),
                         at < capture_nodes.size() ? capture_nodes[at] : std::string());
}

void launch_compiled_group(const CompiledGroup& group, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
#if DYNGRAD_WITH_CUDA
    std::vector<void*> pointers;
    pointers.reserve(inputs.size() + outputs.size());
    for (const Tensor& t : inputs) pointers.push_back(t.raw_data());
    for (const Tensor& t : outputs) pointers.push_back(t.raw_data());
    std::vector<void*> arguments;
    arguments.reserve(pointers.size() + group.scalars.size());
    for (void*& pointer : pointers) arguments.push_back(&pointer);
    for (const std::vector<std::byte>& scalar : group.scalars) arguments.push_back(const_cast<std::byte*>(scalar.data()));
    group.kernel->launch(group.numel, arguments);
#else
    static_cast<void>(group);
    static_cast<void>(inputs);
    static_cast<void>(outputs);
    throw DeviceError("fusion: generated kernels need the CUDA build");
#endif
}

// ---- the hook's state, per thread ----
namespace {

// A warm-up's plan, its groups compiled (those that failed are gone from `plan`).
struct Prepared {
    std::vector<std::string> node_signatures;  // of the warm-up graph, node by node
    std::string signature;                     // graph_signature() of that graph
    FusionPlan plan;                           // the groups kept; no backward chains
    std::vector<CompiledGroup> kernels;        // by group
    std::map<NodeId, DType> member_dtype;
};

using GraphKey = std::pair<const ComputeGraph*, std::uint64_t>;

// The graph of a capture that runs a plan.
struct Applying {
    std::shared_ptr<const Prepared> prepared;
    GraphKey graph{nullptr, 0};
    LaunchTracker tracker;
    std::map<NodeId, Tensor> preallocated;  // outputs of members not recorded when their group launched
};

struct State {
    std::map<std::string, std::shared_ptr<const Prepared>> prepared;  // by signature
    // The plans of the last eager step, one per graph that ran a backward, in that order; a capture's graphs take
    // them in turn (the step records the same graphs in the same order when it is capturable).
    std::vector<std::shared_ptr<const Prepared>> pending;
    std::vector<GraphKey> pending_graphs;
    std::size_t next_pending = 0;
    std::vector<GraphKey> bound;  // graphs of this capture that took a plan
    std::optional<Applying> applying;
    ReplayStats stats;
};

// Set whenever a plan waits or is being applied: the engine's per-node test.
thread_local bool tls_armed = false;

State& state() {
    thread_local State s;
    return s;
}

void update_armed(const State& s) { tls_armed = s.applying.has_value() || s.next_pending < s.pending.size(); }

constexpr std::size_t kMaxPendingGraphs = 16;  // a step of more graphs than this is not fused

std::shared_ptr<const Prepared> prepare(const ComputeGraph& graph, std::string signature) {
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
    ++stats.plans;
    stats.prepare_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    return out;
}

bool is(const std::optional<Applying>& applying, const ComputeGraph& graph, std::uint64_t generation) {
    return applying && applying->graph == GraphKey{&graph, generation};
}

// Ends the capture's use of its plan (consumed: CapturedStep discards the capture) and throws.
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

// The capture's next graph takes the next waiting plan.
bool bind(State& s, const ComputeGraph& graph, std::uint64_t generation, Device device) {
    if (s.applying || s.next_pending >= s.pending.size() || !device.is_cuda() || !cuda::capturing(device.index))
        return false;
    const GraphKey key{&graph, generation};
    if (std::find(s.bound.begin(), s.bound.end(), key) != s.bound.end() || !fusion_settings().enabled) return false;
    s.bound.push_back(key);
    const std::shared_ptr<const Prepared>& prepared = s.pending[s.next_pending++];
    s.applying.emplace(Applying{prepared, key, LaunchTracker(prepared->plan), {}});
    update_armed(s);
    return true;
}

}  // namespace

ReplayStats replay_stats() { return state().stats; }

namespace detail {

bool replay_armed() noexcept { return tls_armed; }

Tensor before_record(const ComputeGraph& graph, std::uint64_t generation, const OpDef& def, OpType op,
                     std::span<const Var> input_vars, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    State& s = state();
    if (!is(s.applying, graph, generation) && !bind(s, graph, generation, inputs.front().device())) return {};
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
    if (spec.shape != group.shape || dtype == a.prepared->member_dtype.end() || spec.dtype != dtype->second)
        fail(s, mismatch_text(a.prepared->node_signatures.size(), graph.size() + std::size_t{1}, id,
                              a.prepared->node_signatures.at(id),
                              str(def.name, " ", to_string(spec.shape), " ", dtype_name(spec.dtype))));
    if (const auto kept = a.preallocated.find(id); kept != a.preallocated.end()) {
        Tensor out = std::move(kept->second);
        a.preallocated.erase(kept);
        return out;
    }
    return Tensor::empty(spec.shape, spec.dtype, inputs.front().device());
}

void after_record(const ComputeGraph& graph, std::uint64_t generation, NodeId id) {
    State& s = state();
    if (!is(s.applying, graph, generation)) return;
    Applying& a = *s.applying;
    const int g = a.tracker.group_of(id);
    if (g < 0) return;
    check_node(s, graph, id);
    const CompiledGroup& kernel = a.prepared->kernels[static_cast<std::size_t>(g)];
    for (std::size_t j = 0; j < kernel.scalar_nodes.size(); ++j)
        if (kernel.scalar_nodes[j] == id && unary_scalar_bytes(graph.node(id).attrs, kernel.double_precision) != kernel.scalars[j])
            throw_mismatch(s, graph, id);
    if (const auto due = a.tracker.after(id)) launch_group(s, graph, *due);
}

void at_backward(const ComputeGraph& graph, std::uint64_t generation, NodeId root) {
    const Device device = graph.node(root).value.device();
    if (!device.is_cuda()) return;
    State& s = state();
    const GraphKey key{&graph, generation};
    if (cuda::capturing(device.index)) {
        if (!is(s.applying, graph, generation)) return;
        if (graph_signature(graph) != s.applying->prepared->signature) {
            std::vector<std::string> nodes;
            for (NodeId id = 0; id < graph.size(); ++id) nodes.push_back(node_signature(graph, id));
            fail(s, graph_mismatch_message(s.applying->prepared->node_signatures, nodes));
        }
        const std::size_t groups = s.applying->prepared->plan.groups.size();
        for (std::size_t g = 0; g < groups; ++g)  // none left when the graph is the warm-up's; cheap insurance
            if (!s.applying->tracker.launched(g)) launch_group(s, graph, g);
        ++s.stats.captures;
        s.stats.last_groups = s.applying->prepared->plan.groups.size();
        s.stats.last_launches_saved = s.applying->prepared->plan.launches_saved();
        s.applying.reset();
        if (s.next_pending >= s.pending.size()) {  // every plan of the warm-up used: consumed
            s.pending.clear();
            s.pending_graphs.clear();
            s.next_pending = 0;
        }
        update_armed(s);
        return;
    }
    if (!fusion_settings().enabled) {  // turned off since a plan was made: none waits any longer
        s.pending.clear();
        s.pending_graphs.clear();
        s.next_pending = 0;
        s.applying.reset();
        update_armed(s);
        return;
    }
    // A warm-up (or any eager step): plan the graph at its first backward.
    if (std::find(s.pending_graphs.begin(), s.pending_graphs.end(), key) != s.pending_graphs.end()) return;
    std::string signature = graph_signature(graph);
    auto found = s.prepared.find(signature);
    if (found == s.prepared.end()) found = s.prepared.emplace(signature, prepare(graph, signature)).first;
    // A step's first graph again, a capture having started, or too many graphs: this backward starts a new step.
    if (s.next_pending > 0 || s.applying || s.pending.size() >= kMaxPendingGraphs ||
        (!s.pending.empty() && s.pending.front()->signature == signature)) {
        s.pending.clear();
        s.pending_graphs.clear();
    }
    s.applying.reset();
    s.bound.clear();
    s.next_pending = 0;
    s.pending.push_back(found->second);
    s.pending_graphs.push_back(key);
    update_armed(s);
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
