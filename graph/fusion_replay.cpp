// The fusion compiler's hook in captured and eager steps (graph/fusion_replay.h, docs/fusion.md): what each thread
// planned, which plan a graph applies, and letting a plan go. The launch schedule and the kernel launches:
// graph/fusion_launch_schedule.cpp.
#include "dyngrad/graph/fusion_replay.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "dyngrad/cuda/runtime.h"
#include "dyngrad/graph/eager.h"

namespace dyngrad::fusion {

namespace {

// What differs: both node counts and the first differing node.
std::string difference_text(std::size_t planned_count, std::size_t recorded_count, std::size_t at,
                            const std::string& planned_node, const std::string& recorded_node) {
    const auto shown = [](const std::string& text) { return text.empty() ? std::string("(none)") : str("'", text, "'"); };
    return str("the graph recorded differs from the one its fusion plan was made from (", recorded_count,
               " nodes recorded, ", planned_count, " in the plan's graph); the first that differs is node #", at, ": ",
               shown(recorded_node), " recorded, ", shown(planned_node), " in the plan's graph");
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
    std::vector<char> ran;  // by group: its kernel has run
};

struct State {
    std::map<std::string, std::shared_ptr<const Prepared>> prepared;  // by signature and root
    // By variant (cuda::current_step_run()): the plans of its warm-up's graphs that ran a backward, in order.
    std::map<std::uint64_t, std::vector<Waiting>> warm_ups;
    std::uint64_t warm_up_variant = 0;
    std::vector<GraphKey> warm_up_graphs;  // graphs of that warm-up that added a plan
    // Eager steps: plans whose signature has come to a backward at least twice, most recent first (at most 8).
    std::vector<std::shared_ptr<const Prepared>> repeated;
    std::map<std::string, std::size_t> backward_count;  // by signature and root
    std::uint64_t switches = 0;  // fusion_switches() when these were counted
    std::optional<Applying> applying;
    std::uint64_t bind_scope = 0;    // the variant a capture's graphs bind in; 0 for eager graphs
    std::vector<GraphKey> declined;  // graphs of that scope that match no plan, or let theirs go: unfused
    ReplayStats stats;
};

// Set while a plan is being applied, a variant's plans wait, or eager plans repeat: the engine's per-node test.
thread_local bool tls_armed = false;
thread_local bool tls_plans_wait = false;
thread_local bool tls_eager_plans = false;

State& state() {
    thread_local State s;
    return s;
}

void update_armed(const State& s) {
    tls_armed = s.applying.has_value();
    tls_plans_wait = !s.warm_ups.empty();
    tls_eager_plans = !s.repeated.empty();
}

constexpr std::size_t kMaxPendingGraphs = 16;  // a warm-up of more graphs than this: the rest are not fused
constexpr std::size_t kMaxWaitingVariants = 64;  // the oldest variants' plans go first (never captured, or re-warmed)
constexpr std::size_t kMaxRepeatedPlans = 8;      // eager plans tried for a new graph
constexpr std::size_t kMaxDeclined = 64;          // graphs remembered as unfused (each a different generation)

std::shared_ptr<const Prepared> prepare(const ComputeGraph& graph, std::string signature, NodeId root) {
    const auto started = std::chrono::steady_clock::now();
    auto out = std::make_shared<Prepared>();
    out->signature = std::move(signature);
    for (NodeId id = 0; id < graph.size(); ++id) out->node_signatures.push_back(node_signature(graph, id));
    FusionPlan plan = plan_fusion(graph);
    out->plan.signature = plan.signature;
    const bool check = fusion_settings().check;
    ReplayStats& stats = state().stats;
    // Only CUDA groups; a member whose forward saved extras for its backward is never skipped (its skipped forward
    // would not save them; no pointwise row saves any today).
    std::vector<char> usable(plan.groups.size(), 0);
    std::vector<std::size_t> usable_groups;
    for (std::size_t g = 0; g < plan.groups.size(); ++g) {
        const std::vector<NodeId>& members = plan.groups[g].members;
        usable[g] = std::all_of(members.begin(), members.end(), [&](NodeId m) {
            const ComputeNode& node = graph.node(m);
            return node.value.device().is_cuda() && node.saved.empty();
        });
        if (usable[g]) usable_groups.push_back(g);
    }
    // Every kernel of the plan, forward and backward, compiled together. The backward: each usable row program's
    // as one kernel where it can be (program_backward_launch), else the chains of the usable groups' segments, as a
    // backward from `root` runs them (they read the values the forward stored, fused or not, so eager steps run
    // them too); a chain whose group is dropped goes with it.
    std::vector<std::size_t> kernel_of_segment(plan.segments.size(), 0);
    for (std::size_t g = 0; g < plan.groups.size(); ++g)
        for (std::size_t segment : plan.groups[g].segments) kernel_of_segment.at(segment) = g;
    const std::vector<char> reached = reached_by_backward(graph, root);
    std::vector<BackwardLaunch> launches;
    std::vector<char> program_launched(plan.groups.size(), 0);
    for (std::size_t g = 0; g < plan.groups.size(); ++g)
        if (auto launch = usable[g] ? program_backward_launch(graph, plan, g, reached, root) : std::nullopt) {
            launches.push_back(std::move(*launch));
            program_launched[g] = 1;
        }
    for (std::size_t segment = 0; segment < plan.segments.size(); ++segment)
        if (usable[kernel_of_segment[segment]] && !program_launched[kernel_of_segment[segment]])
            if (std::optional<BackwardLaunch> launch = backward_launch(graph, plan, segment, reached, root))
                launches.push_back(std::move(*launch));
    CompiledPlan compiled = compile_plan(graph, plan, usable_groups, launches, check);
    stats.nvrtc_ms += compiled.nvrtc_ms;
    std::vector<char> kept(plan.groups.size(), 0);
    for (std::size_t i = 0; i < usable_groups.size(); ++i) {
        if (!compiled.groups[i]) {
            ++stats.groups_dropped;
            continue;
        }
        FusionGroup& group = plan.groups[usable_groups[i]];
        ++stats.groups_compiled;
        stats.groups_from_cache += compiled.groups[i]->from_cache ? 1 : 0;
        for (NodeId m : group.members) out->member_dtype[m] = graph.node(m).value.dtype();
        kept[usable_groups[i]] = 1;
        out->plan.groups.push_back(std::move(group));
        out->kernels.push_back(std::move(*compiled.groups[i]));
    }
    out->backward = std::make_shared<BackwardFusion>();
    out->backward->root = root;
    out->backward->check = check;
    for (std::size_t i = 0; i < launches.size(); ++i) {
        const std::size_t kernel = launches[i].program ? launches[i].group : kernel_of_segment[launches[i].group];
        if (!kept[kernel]) continue;  // its group runs unfused: so do its members' backward
        if (!compiled.chains[i]) {
            ++stats.backward_chains_dropped;
            continue;
        }
        // The prepared plan keeps the kernels only: a compiled chain carries what its launch needs.
        ++stats.backward_chains_compiled;
        out->backward->chains.push_back(std::move(*compiled.chains[i]));
    }
    ++stats.plans;
    stats.prepare_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    return out;
}

bool is(const std::optional<Applying>& applying, const ComputeGraph& graph, std::uint64_t generation) {
    return applying && applying->graph == GraphKey{&graph, generation};
}

void decline(State& s, GraphKey key) {
    if (s.declined.size() >= kMaxDeclined) s.declined.erase(s.declined.begin());
    s.declined.push_back(key);
}

bool node_as_planned(const Prepared& p, const ComputeGraph& graph, NodeId id) {
    return id < graph.size() && id < p.node_signatures.size() && node_signature(graph, id) == p.node_signatures[id];
}

// A recorded member as the plan has it, its scalar arguments to the bit (a changed one would run with the plan's).
bool member_as_planned(const Applying& a, const ComputeGraph& graph, std::size_t g, NodeId id) {
    if (!node_as_planned(*a.prepared, graph, id)) return false;
    const CompiledGroup& kernel = a.prepared->kernels[g];
    for (std::size_t j = 0; j < kernel.scalar_nodes.size(); ++j)
        if (kernel.scalar_nodes[j] == id &&
            member_scalar_bytes(graph.node(id), kernel.double_precision) != kernel.scalars[j])
            return false;
    return true;
}

// The first external input of group g's kernel that is not as in the plan, if any.
std::optional<NodeId> input_not_as_planned(const Applying& a, const ComputeGraph& graph, std::size_t g) {
    for (NodeId id : a.prepared->kernels[g].inputs)
        if (!node_as_planned(*a.prepared, graph, id)) return id;
    return std::nullopt;
}

// Whether group g's kernel can run now: every external input, and every member recorded so far, as in the plan.
bool can_launch(const Applying& a, const ComputeGraph& graph, std::size_t g) {
    const std::vector<NodeId>& members = a.prepared->plan.groups[g].members;
    return !input_not_as_planned(a, graph, g) &&
           std::all_of(members.begin(), members.end(),
                       [&](NodeId id) { return id >= graph.size() || member_as_planned(a, graph, g, id); });
}

// Runs group g's kernel: the recorded members' outputs, and outputs kept for members not recorded yet.
void run_group(Applying& a, const ComputeGraph& graph, std::size_t g) {
    const CompiledGroup& kernel = a.prepared->kernels[g];
    const FusionGroup& group = a.prepared->plan.groups[g];
    std::vector<Tensor> inputs, outputs;
    for (NodeId id : kernel.inputs) inputs.push_back(graph.node(id).value);
    const Device device = Device::cuda(kernel.device);
    for (NodeId id : kernel.outputs) {
        if (id < graph.size()) {
            outputs.push_back(graph.node(id).value);
            continue;
        }
        // Recorded later (an outside reader came between two members): its node takes this tensor.
        Tensor out = Tensor::empty(group.member_shape(id), a.prepared->member_dtype.at(id), device);
        a.preallocated.emplace(id, out);
        outputs.push_back(std::move(out));
    }
    launch_compiled_group(kernel, inputs, outputs);
    a.ran.at(g) = 1;
}

// A recorded member whose kernel was skipped, computed by its op's own forward (the plan was let go).
void recompute(const ComputeGraph& graph, NodeId id) {
    const ComputeNode& node = graph.node(id);
    const OpDef& def = op_def(node.op, node.attrs);
    std::vector<Tensor> inputs;
    for (const NodeInput& input : node.inputs) inputs.push_back(graph.node(input.id).value);
    std::vector<Tensor> saved;
    Tensor value = dyngrad::detail::run_forward(
        def, node.op, inputs, node.attrs, saved, id,
        [&] { return str(graph.describe_node(id), ", recomputed unfused when its fusion plan was let go"); },
        [&](std::size_t i) { return graph.describe_node(node.inputs[i].id); });
    detail::GraphAccess::set_value(graph, id, std::move(value));
}

// The graph turned out to differ from its plan (or a member's value was read before its group could run): every
// member recorded so far whose kernel was skipped gets its value (its group's kernel where its inputs are the
// plan's, else each member's own forward), and the rest of the graph runs unfused. A plan never changes a result.
void let_go(State& s, const ComputeGraph& graph, const std::string& why) {
    Applying& a = *s.applying;
    for (std::size_t g = 0; g < a.prepared->plan.groups.size(); ++g) {
        if (a.ran[g]) continue;
        std::vector<NodeId> skipped;
        for (NodeId m : a.prepared->plan.groups[g].members)
            if (m < graph.size()) skipped.push_back(m);
        if (skipped.empty()) continue;
        if (can_launch(a, graph, g)) {
            run_group(a, graph, g);
            continue;
        }
        for (NodeId m : skipped) recompute(graph, m);
    }
    ++s.stats.plans_let_go;
#if DYNGRAD_WITH_CUDA
    cuda::log_fusion({cuda::FusionLogEntry::Kind::GraphDiffers, "", str(why, "; the rest of the graph runs unfused")});
#else
    static_cast<void>(why);
#endif
    decline(s, a.graph);
    s.applying.reset();
    update_armed(s);
}

// Launches group g when its inputs are the plan's, else lets the plan go. False when the plan was let go.
bool launch_group(State& s, const ComputeGraph& graph, std::size_t g) {
    Applying& a = *s.applying;
    if (const std::optional<NodeId> differs = input_not_as_planned(a, graph, g)) {
        const Prepared& p = *a.prepared;
        const NodeId id = *differs;
        let_go(s, graph, difference_text(p.node_signatures.size(), graph.size(), id,
                                       id < p.node_signatures.size() ? p.node_signatures[id] : std::string(),
                                       id < graph.size() ? node_signature(graph, id) : std::string()));
        return false;
    }
    run_group(a, graph, g);
    return true;
}

// Whether the graph's nodes [from, size) equal `p`'s.
bool prefix_matches(const Prepared& p, const ComputeGraph& graph, NodeId from) {
    if (graph.size() > p.node_signatures.size()) return false;
    for (NodeId id = from; id < graph.size(); ++id)
        if (node_signature(graph, id) != p.node_signatures[id]) return false;
    return true;
}

// Fusion switched off and on since the repeats were counted: count them afresh.
void forget_repeats_if_switched(State& s) {
    if (s.switches == fusion_switches()) return;
    s.switches = fusion_switches();
    s.backward_count.clear();
    s.repeated.clear();
    update_armed(s);
}

constexpr std::size_t kNotWaiting = static_cast<std::size_t>(-1);  // an eager plan: in no variant's list

// A graph takes, at its first recorded op, the first plan whose graph it has recorded so far: in a capture, of its
// variant's waiting plans; eagerly, of the plans whose signature repeated. None: it runs unfused (declined).
bool bind(State& s, const ComputeGraph& graph, std::uint64_t generation, Device device) {
    if (s.applying || !device.is_cuda()) return false;
    const FusionSettings settings = fusion_settings();
    if (!settings.enabled) return false;
    const bool capturing = cuda::capturing(device.index);
    const cuda::StepRun run = cuda::current_step_run();
    if (capturing && !run.capture) return false;  // a capture of the caller's own, outside a CapturedStep
    if (!capturing && !settings.eager) {  // FusionMode::Captured (perhaps since the plans repeated): eager runs unfused
        s.repeated.clear();
        update_armed(s);
        return false;
    }
    const std::uint64_t scope = capturing ? run.variant : 0;
    if (scope != s.bind_scope) {
        s.bind_scope = scope;
        s.declined.clear();
    }
    const GraphKey key{&graph, generation};
    if (std::find(s.declined.begin(), s.declined.end(), key) != s.declined.end()) return false;
    const auto take = [&](const std::shared_ptr<const Prepared>& prepared, std::size_t waiting) {
        s.applying.emplace(Applying{prepared, waiting, key, LaunchTracker(prepared->plan), {}, false,
                                    static_cast<NodeId>(graph.size()),
                                    std::vector<char>(prepared->plan.groups.size(), 0)});
        update_armed(s);
        return true;
    };
    if (capturing) {
        const auto list = s.warm_ups.find(run.variant);
        if (list != s.warm_ups.end())
            for (std::size_t i = 0; i < list->second.size(); ++i)
                if (!list->second[i].used && prefix_matches(*list->second[i].prepared, graph, 0))
                    return take(list->second[i].prepared, i);
    } else {
        forget_repeats_if_switched(s);
        for (const std::shared_ptr<const Prepared>& prepared : s.repeated)
            if (prefix_matches(*prepared, graph, 0)) return take(prepared, kNotWaiting);
    }
    decline(s, key);
    return false;
}

// Before the first member: the graph recorded since the last check must still be the plan's, else the plan lets
// it go (and the graph tries the other waiting plans). False when the graph has no plan any more.
bool still_bound(State& s, const ComputeGraph& graph, std::uint64_t generation, Device device) {
    Applying& a = *s.applying;
    if (a.committed || prefix_matches(*a.prepared, graph, a.checked)) {
        a.checked = static_cast<NodeId>(graph.size());
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

bool replay_armed() noexcept {
    return tls_armed || tls_eager_plans || (tls_plans_wait && cuda::current_step_run().capture);
}

Tensor before_record(const ComputeGraph& graph, std::uint64_t generation, const OpDef& def, OpType op,
                     std::span<const Var> input_vars, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    State& s = state();
    const Device device = inputs.front().device();
    if (is(s.applying, graph, generation)) {
        if (!still_bound(s, graph, generation, device)) return {};
    } else if (!bind(s, graph, generation, device)) {
        return {};
    }
    const auto id = static_cast<NodeId>(graph.size());
    std::vector<NodeId> input_ids;
    for (const Var& v : input_vars) input_ids.push_back(v.id());
    for (std::size_t g : s.applying->tracker.before(id, input_ids))
        if (!launch_group(s, graph, g)) return {};  // let go: the node records unfused
    Applying& a = *s.applying;
    const int g = a.tracker.group_of(id);
    if (g < 0) return {};
    // A member: its output, no kernel. What it records is checked against the plan in after_record.
    const FusionGroup& group = a.prepared->plan.groups[static_cast<std::size_t>(g)];
    const OutputSpec spec = def.infer(op, inputs, attrs);
    const auto dtype = a.prepared->member_dtype.find(id);
    const std::string upcoming = upcoming_signature(def, op, input_vars, attrs, spec, device);
    const bool as_planned = spec.shape == group.member_shape(id) && dtype != a.prepared->member_dtype.end() &&
                            spec.dtype == dtype->second && a.prepared->node_signatures.at(id).starts_with(upcoming);
    if (!as_planned) {
        if (!a.committed) {  // nothing skipped yet: this graph runs unfused
            decline(s, a.graph);
            s.applying.reset();
            update_armed(s);
        } else {
            let_go(s, graph, difference_text(a.prepared->node_signatures.size(), graph.size() + std::size_t{1}, id,
                                             a.prepared->node_signatures.at(id), upcoming));
        }
        return {};
    }
    a.committed = true;
    if (op == OpType::Dropout) draw_skipped_dropout_seed(inputs);  // its seed before its group's kernel reads it
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
    // Its requires_grad too, now that it is recorded, and its scalars.
    if (!member_as_planned(a, graph, static_cast<std::size_t>(g), id)) {
        const Prepared& p = *a.prepared;
        let_go(s, graph, difference_text(p.node_signatures.size(), graph.size(), id, p.node_signatures.at(id),
                                         str(node_signature(graph, id), " (", attrs_text(op_def(graph.node(id).op),
                                                                                        graph.node(id).attrs), ")")));
        return;
    }
    if (const auto due = a.tracker.after(id)) launch_group(s, graph, *due);
}

void before_value_read(const ComputeGraph& graph, std::uint64_t generation, NodeId id) {
    State& s = state();
    if (!is(s.applying, graph, generation) || !s.applying->committed) return;
    Applying& a = *s.applying;
    const int g = a.tracker.group_of(id);
    if (g < 0 || id >= graph.size() || a.ran[static_cast<std::size_t>(g)]) return;
    if (can_launch(a, graph, static_cast<std::size_t>(g))) {  // early: later members take the kept outputs
        a.tracker.claim(static_cast<std::size_t>(g));
        run_group(a, graph, static_cast<std::size_t>(g));
        return;
    }
    let_go(s, graph, str("the value of ", graph.describe_node(id), " was read before its fused group could run"));
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
    const bool capturing = cuda::capturing(device.index);
    std::shared_ptr<BackwardFusion> applied_chains;
    if (is(s.applying, graph, generation)) {
        Applying& a = *s.applying;
        if (!a.committed) {  // it never skipped a kernel: it runs unfused, as a graph without a plan
            decline(s, a.graph);
            s.applying.reset();
            update_armed(s);
        } else {
            // Each kernel's members and inputs were checked against the plan as they were recorded or read, so the
            // forward is right even where the graph differs elsewhere (a host counter adding a node after the
            // groups): then only the backward chains, planned from the whole plan's graph, are not used.
            const bool as_planned = graph_signature(graph) == a.prepared->signature;
            const std::size_t groups = a.prepared->plan.groups.size();
            for (std::size_t g = 0; s.applying && g < groups; ++g)  // none left when the graph is the plan's
                if (s.applying->tracker.claim(g)) launch_group(s, graph, g);
            if (s.applying) {
                if (as_planned) {
                    applied_chains = chains_for(*a.prepared);
                } else {
#if DYNGRAD_WITH_CUDA
                    std::vector<std::string> nodes;
                    for (NodeId id = 0; id < graph.size(); ++id) nodes.push_back(node_signature(graph, id));
                    cuda::log_fusion({cuda::FusionLogEntry::Kind::GraphDiffers, "",
                                      str(graph_mismatch_message(a.prepared->node_signatures, nodes),
                                          "; its fused groups ran, its backward runs unfused")});
#endif
                }
                if (capturing) {
                    ++s.stats.captures;
                    s.stats.last_groups = a.prepared->plan.groups.size();
                    s.stats.last_launches_saved = a.prepared->plan.launches_saved();
                } else {
                    ++s.stats.eager_graphs_fused;
                }
                const auto list = s.warm_ups.find(s.bind_scope);
                if (a.waiting != kNotWaiting && list != s.warm_ups.end()) {
                    list->second.at(a.waiting).used = true;
                    if (std::all_of(list->second.begin(), list->second.end(), [](const Waiting& w) { return w.used; }))
                        s.warm_ups.erase(list);  // the variant's capture took every plan
                }
                s.applying.reset();
                update_armed(s);
            }
        }
    }
    if (capturing) return applied_chains;
    if (!fusion_settings().enabled) {  // turned off since a plan was made: none waits any longer
        s.warm_ups.clear();
        s.repeated.clear();
        s.applying.reset();
        update_armed(s);
        return nullptr;
    }
    forget_repeats_if_switched(s);
    const cuda::StepRun run = cuda::current_step_run();
    const bool eager = fusion_settings().eager;
    if (!eager && run.variant == 0) return nullptr;  // FusionMode::Captured: an eager graph outside a CapturedStep
    // An eager backward (a CapturedStep's warm-up or, in FusionMode::All, any other): plan the graph; a warm-up's
    // plan waits for the variant's capture; a signature that comes back is fused in the next eager graphs that
    // record it (FusionMode::All).
    std::string signature = graph_signature(graph);
    const std::string prepared_key = str(signature, "@", root);
    auto found = s.prepared.find(prepared_key);
    if (found == s.prepared.end()) found = s.prepared.emplace(prepared_key, prepare(graph, signature, root)).first;
    const std::shared_ptr<const Prepared>& prepared = found->second;
    if (eager && !prepared->plan.groups.empty() && ++s.backward_count[prepared_key] >= 2) {
        std::erase(s.repeated, prepared);
        s.repeated.insert(s.repeated.begin(), prepared);
        if (s.repeated.size() > kMaxRepeatedPlans) s.repeated.pop_back();
    }
    if (run.variant != 0 && !run.capture && !prepared->plan.groups.empty()) {
        if (run.variant != s.warm_up_variant) {
            s.warm_up_variant = run.variant;
            s.warm_up_graphs.clear();
        }
        std::vector<Waiting>& list = s.warm_ups[run.variant];
        if (std::find(s.warm_up_graphs.begin(), s.warm_up_graphs.end(), key) == s.warm_up_graphs.end() &&
            list.size() < kMaxPendingGraphs) {
            s.warm_up_graphs.push_back(key);
            list.push_back({prepared});
        }
        while (s.warm_ups.size() > kMaxWaitingVariants) s.warm_ups.erase(s.warm_ups.begin());
    }
    update_armed(s);
    // The chains of the plan the graph applied, else of its own (the same when the graph was the plan's).
    return applied_chains ? applied_chains : chains_for(*prepared);
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

void GraphAccess::set_value(const ComputeGraph& graph, NodeId id, Tensor value) {
    ComputeNode& node = *const_cast<ComputeGraph&>(graph).nodes_.at(id);
    node.value_version = value.version();
    node.value = std::move(value);
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
