#include "dyngrad/graph/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "dyngrad/graph/custom_op.h"
#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/higher_order.h"

namespace dyngrad {

namespace detail {

// A recorded segment: its node ids [first, last], the nodes whose values stay, and whether create_graph pinned the
// replayed values (the gradient's nodes read them). Reached from a marker's backward through the segment's key
// (the markers' `seed` attribute): a first-order backward kernel sees tensors, not the graph.
struct Segment {
    Var anchor;  // a Var of the segment's graph: its liveness and the graph itself
    NodeId first = 0;
    NodeId last = 0;
    std::vector<NodeId> kept;  // sorted
    bool pinned = false;
};

// Friend of ComputeGraph: drops and replays node values.
struct Checkpoint {
    static void release(Segment& segment);
    static void restore(Segment& segment);
};

}  // namespace detail

namespace {

using detail::Segment;

// Segments by key. Entries whose graph was cleared or destroyed are pruned as new ones arrive (a Var's liveness
// check never reads the graph), so the map holds about the live segments.
struct SegmentRegistry {
    std::mutex mutex;
    std::unordered_map<std::uint64_t, std::shared_ptr<Segment>> segments;
    std::size_t prune_at = 64;
    std::uint64_t next_key = 1;
};
SegmentRegistry& segment_registry() {
    static SegmentRegistry r;
    return r;
}

std::uint64_t register_segment(std::shared_ptr<Segment> segment) {
    SegmentRegistry& r = segment_registry();
    const std::lock_guard lock(r.mutex);
    if (r.segments.size() >= r.prune_at) {
        std::erase_if(r.segments, [](const auto& entry) { return !entry.second->anchor.is_live(); });
        r.prune_at = std::max<std::size_t>(64, 2 * r.segments.size());
    }
    const std::uint64_t key = r.next_key++;
    r.segments.emplace(key, std::move(segment));
    return key;
}

std::shared_ptr<Segment> find_segment(std::uint64_t key) {
    SegmentRegistry& r = segment_registry();
    const std::lock_guard lock(r.mutex);
    const auto it = r.segments.find(key);
    if (it == r.segments.end() || !it->second->anchor.is_live())
        throw GraphError(str("checkpoint: segment ", key, " belongs to a graph that was cleared or destroyed"));
    return it->second;
}

// ---- the markers: identities whose backward replays (outputs) or drops (inputs) the segment ----
OutputSpec marker_infer(OpType, std::span<const Tensor> in, const OpAttrs&) {
    return {in[0].shape(), in[0].dtype()};
}
Tensor marker_forward(const ForwardArgs& args) { return args.inputs[0]; }  // the same storage: no bytes
std::vector<Tensor> output_marker_backward(const BackwardArgs& args) {
    detail::Checkpoint::restore(*find_segment(args.attrs.seed));
    return {args.grad_output};
}
std::vector<Tensor> input_marker_backward(const BackwardArgs& args) {
    detail::Checkpoint::release(*find_segment(args.attrs.seed));
    return {args.grad_output};
}
// create_graph: replay and pin (the gradient's nodes read the values); the inputs' markers drop nothing.
std::vector<Var> output_marker_differentiable_backward(const DiffBackwardArgs& args) {
    Segment& segment = *find_segment(args.attrs.seed);
    segment.pinned = true;
    detail::Checkpoint::restore(segment);
    return {args.grad_output};
}
std::vector<Var> input_marker_differentiable_backward(const DiffBackwardArgs& args) { return {args.grad_output}; }

// Host-only kernels (no device code), the same for both backends; they take bf16/f16 as they are.
CustomOp define_marker(const char* name, BackwardFn backward, DiffBackwardFn differentiable_backward) {
    const BackendKernels kernels{marker_forward, backward, /*native_reduced=*/true};
    return CustomOp::define({.name = name, .arity = 1, .infer = marker_infer, .cpu = kernels, .cuda = kernels,
                             .differentiable_backward = differentiable_backward});
}
const CustomOp& input_marker() {
    static const CustomOp op =
        define_marker("checkpoint_input", input_marker_backward, input_marker_differentiable_backward);
    return op;
}
const CustomOp& output_marker() {
    static const CustomOp op =
        define_marker("checkpoint_output", output_marker_backward, output_marker_differentiable_backward);
    return op;
}

}  // namespace

namespace detail {

void Checkpoint::release(Segment& segment) {
    if (segment.pinned) return;
    ComputeGraph& graph = segment.anchor.graph();
    for (NodeId id = segment.first; id <= segment.last; ++id) {
        ComputeNode& n = *graph.nodes_[id];
        if (n.op == OpType::Leaf || std::binary_search(segment.kept.begin(), segment.kept.end(), id)) continue;
        n.value = Tensor();
        n.saved.clear();
        n.saved_versions.clear();
    }
}

void Checkpoint::restore(Segment& segment) {
    ComputeGraph& graph = segment.anchor.graph();
    std::vector<Tensor> values;
    for (NodeId id = segment.first; id <= segment.last; ++id) {
        ComputeNode& n = *graph.nodes_[id];
        if (n.op == OpType::Leaf || n.value.defined()) continue;
        const OpDef& def = op_def(n.op, n.attrs);
        values.clear();
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
            const Tensor& v = graph.nodes_[n.inputs[i].id]->value;
            if (!v.defined())
                throw GraphError(str("checkpoint: replaying ", graph.describe_node(id), ": input ", i, " (",
                                     graph.describe_node(n.inputs[i].id), ") has no value (released by a backward ",
                                     "with free_values)"));
            // A forward that updates this input in place (running statistics) replays on a copy: once per step.
            values.push_back(def.updates_inputs >> i & 1u ? v.clone() : v);
        }
        std::vector<Tensor> saved;
        Tensor out = detail::run_forward(
            def, n.op, values, n.attrs, saved, id,
            [&] { return str("checkpoint: replaying ", graph.describe_node(id)); },
            [&](std::size_t i) { return graph.describe_node(n.inputs[i].id); });
        // The replayed values are new storages: the version checks of the backward compare against them.
        for (std::size_t i = 0; i < n.inputs.size(); ++i)
            if (n.inputs[i].id >= segment.first && !(def.updates_inputs >> i & 1u))
                n.inputs[i].version = values[i].version();
        n.value_version = out.version();
        n.value = std::move(out);
        n.saved_versions.clear();
        for (const Tensor& t : saved) n.saved_versions.push_back(t.version());
        n.saved = std::move(saved);
    }
}

}  // namespace detail

std::vector<Var> checkpoint(const SegmentFn& fn, std::span<const Var> inputs, std::source_location where) {
    const auto at = [&] { return str("checkpoint at ", describe_site(where)); };
    if (!fn) throw CheckpointError(str(at(), ": no segment function"));
    if (inputs.empty()) throw CheckpointError(str(at(), ": needs at least one input Var"));
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (!inputs[i].is_live())
            throw CheckpointError(str(at(), ": input ", i, " is undefined or belongs to a cleared or destroyed graph"));
        if (&inputs[i].graph() != &inputs.front().graph())
            throw CheckpointError(str(at(), ": input ", i, " belongs to another graph than input 0"));
    }
    if (!grad_enabled()) return fn(inputs);  // nothing is recorded, so nothing is kept
    ComputeGraph& graph = inputs.front().graph();

    auto segment = std::make_shared<Segment>();
    const std::uint64_t key = register_segment(segment);
    OpAttrs attrs;
    attrs.seed = key;
    std::vector<Var> entered;
    for (const Var& x : inputs) entered.push_back(input_marker()({x}, attrs, where));
    segment->anchor = entered.front();
    segment->first = static_cast<NodeId>(graph.size());
    std::vector<Var> outputs = fn(entered);
    segment->last = static_cast<NodeId>(graph.size()) - 1;

    if (outputs.empty()) throw CheckpointError(str(at(), ": the segment function returned no Var"));
    bool any_requires_grad = false;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
        if (!outputs[k].is_live() || &outputs[k].graph() != &graph)
            throw CheckpointError(str(at(), ": output ", k, " of the segment function is undefined, stale or of ",
                                      "another graph than its inputs"));
        any_requires_grad = any_requires_grad || outputs[k].requires_grad();
        segment->kept.push_back(outputs[k].id());
    }
    if (!any_requires_grad)
        throw CheckpointError(str(at(), ": no output of the segment requires grad (no input or parameter that ",
                                  "requires grad reaches it): there is nothing to recompute for; call the function ",
                                  "without checkpoint"));
    // Autocast caches a parameter's cast per graph and hands it to later segments too: keep those.
    for (NodeId id = segment->first; id <= segment->last && segment->first <= segment->last; ++id) {
        const ComputeNode& n = graph.node(id);
        if (n.op == OpType::Cast && n.inputs.size() == 1 && graph.node(n.inputs[0].id).parameter.defined())
            segment->kept.push_back(id);
    }
    std::sort(segment->kept.begin(), segment->kept.end());
    if (segment->first <= segment->last) detail::Checkpoint::release(*segment);

    std::vector<Var> result;
    for (const Var& y : outputs) result.push_back(output_marker()({y}, attrs, where));
    return result;
}

Var checkpoint(const std::function<Var(const Var&)>& fn, const Var& input, std::source_location where) {
    if (!fn) throw CheckpointError(str("checkpoint at ", describe_site(where), ": no segment function"));
    const Var inputs[] = {input};
    return checkpoint([&](std::span<const Var> in) { return std::vector<Var>{fn(in[0])}; }, inputs, where).front();
}

GraphMemory graph_memory(const ComputeGraph& graph) {
    std::map<const void*, std::size_t> storages;
    const auto count = [&](const Tensor& t) {
        if (!t.defined() || t.numel() == 0) return;
        std::size_t& bytes = storages[t.raw_data()];
        bytes = std::max(bytes, t.nbytes());
    };
    for (NodeId id = 0; id < graph.size(); ++id) {
        const ComputeNode& n = graph.node(id);
        count(n.value);
        for (const Tensor& t : n.saved) count(t);
    }
    GraphMemory memory;
    memory.tensors = storages.size();
    for (const auto& [data, bytes] : storages) memory.bytes += bytes;
    return memory;
}

}  // namespace dyngrad
