// The grouping pass of the fusion compiler (graph/fusion_plan.h, docs/fusion.md). Over 600 lines: the groups, the
// reductions they end in, the row programs that join them and the schedulability net all walk one Builder (the
// graph's readers, the legality rule), kept in one file with the plan they describe.
#include "dyngrad/graph/fusion_plan.h"

#include <algorithm>
#include <functional>
#include <atomic>
#include <optional>
#include <set>
#include <sstream>

#include "dyngrad/core/environment.h"

namespace dyngrad::fusion {

namespace {

// -1: from the environment; else a FusionMode set by set_fusion_mode.
std::atomic<int> mode_override{-1};
std::atomic<std::uint64_t> switches{0};

const PointwiseFormula* formula_of(const ComputeNode& node) {
    if (node.op == OpType::Leaf || node.op == OpType::Custom) return nullptr;
    return op_def(node.op).pointwise;
}

// A reader whose backward a group's chain can take over: a sum or mean of member `member` alone, of its dtype,
// requiring grad. Its backward broadcasts dy back over the reduced axes (times 1/count for the mean), a pointwise
// formula of an input of another shape, which the chain loads broadcast instead of launching reduce_backward's
// expand kernel.
bool absorbable_reduction(const ComputeGraph& graph, const ComputeNode& reader, NodeId member) {
    return (reader.op == OpType::Sum || reader.op == OpType::Mean) && reader.inputs.size() == 1 &&
           reader.inputs[0].id == member && reader.requires_grad && reader.value.defined() &&
           reader.value.dtype() == graph.node(member).value.dtype();
}

// A sum or mean of one node over trailing axes of it, as (rows, row_length); nullopt for other reductions (a
// column sum, no axis) and for the shapes one block per row would serve worse than the unfused reduction (a few
// long rows).
std::optional<RowReduction> row_reduction(const ComputeGraph& graph, NodeId id) {
    const ComputeNode& node = graph.node(id);
    if ((node.op != OpType::Sum && node.op != OpType::Mean) || node.inputs.size() != 1 || !node.value.defined())
        return std::nullopt;
    const Tensor& in = graph.node(node.inputs[0].id).value;
    if (!in.defined() || in.numel() == 0 || node.value.dtype() != in.dtype() || !is_floating(in.dtype()))
        return std::nullopt;  // a generated kernel sums floating values only
    const Shape& shape = in.shape();
    std::vector<bool> reduced(shape.size(), node.attrs.axes.empty());
    for (std::int64_t axis : node.attrs.axes) {
        const std::int64_t a = axis < 0 ? axis + static_cast<std::int64_t>(shape.size()) : axis;
        if (a < 0 || a >= static_cast<std::int64_t>(shape.size())) return std::nullopt;
        reduced[static_cast<std::size_t>(a)] = true;
    }
    RowReduction r;
    r.node = id;
    r.input = node.inputs[0].id;
    r.rows = 1;
    r.row_length = 1;
    r.kept_shape = shape;
    bool trailing = false;  // the reduced axes seen so far form a suffix
    for (std::size_t k = 0; k < shape.size(); ++k) {
        if (reduced[k]) {
            trailing = true;
            r.row_length *= shape[k];
            r.kept_shape[k] = 1;
        } else {
            if (trailing) return std::nullopt;  // a kept axis after a reduced one: not rows
            r.rows *= shape[k];
        }
    }
    if (r.rows < 64 && r.row_length > 16384) return std::nullopt;  // a block per row would leave the device idle
    r.shape = node.value.shape();
    r.mean = node.op == OpType::Mean;
    return r;
}

// The class of arithmetic a generated kernel computes a node in: f64 alone, or f32 for f32/bf16/f16 (loads
// widen to f32 and every result is rounded to its node's dtype, as the unfused kernels do).
bool computes_in_double(DType dtype) { return dtype == DType::f64; }

// A dropout that drops: its forward is a kernel of math::dropout_apply (eval and p = 0 copy x instead, no member).
// Its seed input, when it has one, is an int64 element the kernel reads as bits.
bool dropping(const ComputeNode& node) {
    return node.op == OpType::Dropout && node.attrs.training && node.attrs.scalar != 0.0;
}
bool seed_input(const ComputeNode& node, std::size_t j, const Tensor& value) {
    return node.op == OpType::Dropout && j == 1 && value.dtype() == DType::i64 && value.numel() == 1;
}

// Whether the node can be a member of a generated kernel at all.
bool fusible(const ComputeGraph& graph, const ComputeNode& node) {
    const PointwiseFormula* formula = formula_of(node);
    if (formula == nullptr || !node.value.defined() || node.value.numel() == 0) return false;
    if (node.op == OpType::Dropout && !dropping(node)) return false;
    const DType out = node.value.dtype();
    if (!is_floating(out)) return false;
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        const Tensor& value = graph.node(node.inputs[j].id).value;
        if (value.defined() && seed_input(node, j, value)) continue;
        if (!value.defined() || !is_floating(value.dtype())) return false;
        // A cast across the f64 boundary changes the precision class: it ends the group.
        if (computes_in_double(value.dtype()) != computes_in_double(out)) return false;
    }
    return true;
}

// The groups (non-empty entries of `groups`, disjoint node sets) that lie on a cycle of the dependencies between
// units (a group, or a node outside every group): kernels that would wait on each other.
std::vector<std::size_t> groups_on_cycles(const ComputeGraph& graph, const std::vector<std::vector<NodeId>>& groups) {
    const std::size_t n = graph.size();
    std::vector<std::size_t> unit_of(n);
    for (NodeId id = 0; id < n; ++id) unit_of[id] = id;
    for (std::size_t g = 0; g < groups.size(); ++g)
        for (NodeId m : groups[g]) unit_of[m] = n + g;
    std::vector<std::vector<std::size_t>> next(n + groups.size());
    std::vector<std::size_t> waiting(n + groups.size(), 0);
    for (NodeId id = 0; id < n; ++id)
        for (const NodeInput& input : graph.node(id).inputs)
            if (unit_of[input.id] != unit_of[id]) {
                next[unit_of[input.id]].push_back(unit_of[id]);
                ++waiting[unit_of[id]];
            }
    std::vector<std::size_t> ready;
    for (std::size_t u = 0; u < next.size(); ++u)
        if (waiting[u] == 0) ready.push_back(u);
    while (!ready.empty()) {
        const std::size_t u = ready.back();
        ready.pop_back();
        for (std::size_t v : next[u])
            if (--waiting[v] == 0) ready.push_back(v);
    }
    // Units still waiting lie on a cycle or after one.
    const auto on_cycle = [&](std::size_t start) {
        std::vector<char> seen(next.size(), 0);
        std::vector<std::size_t> stack(next[start].begin(), next[start].end());
        while (!stack.empty()) {
            const std::size_t u = stack.back();
            stack.pop_back();
            if (u == start) return true;
            if (seen[u] || waiting[u] == 0) continue;
            seen[u] = 1;
            stack.insert(stack.end(), next[u].begin(), next[u].end());
        }
        return false;
    };
    std::vector<std::size_t> out;
    for (std::size_t g = 0; g < groups.size(); ++g)
        if (!groups[g].empty() && waiting[n + g] > 0 && on_cycle(n + g)) out.push_back(g);
    return out;
}

struct Builder {
    const ComputeGraph& graph;
    std::vector<std::vector<NodeId>> consumers;
    std::vector<int> group_of;                // -1: none
    std::vector<std::vector<NodeId>> groups;  // members, creation order
    std::map<std::size_t, RowReduction> reductions;  // by group: the sum or mean its kernel ends in

    explicit Builder(const ComputeGraph& g) : graph(g), consumers(g.size()), group_of(g.size(), -1) {
        for (NodeId id = 0; id < g.size(); ++id)
            for (const NodeInput& input : g.node(id).inputs) consumers[input.id].push_back(id);
    }

    bool compatible(NodeId member, NodeId id) const {
        const Tensor& a = graph.node(member).value;
        const Tensor& b = graph.node(id).value;
        return a.shape() == b.shape() && a.device() == b.device() &&
               computes_in_double(a.dtype()) == computes_in_double(b.dtype());
    }

    // A set of members is one legal kernel when it can run after its last external input and before the
    // first node outside it that reads a member. That also rules out cycles: a path from a member through
    // outside nodes into the group passes an outside reader no later than the external input it reaches.
    bool legal(const std::vector<NodeId>& members) const {
        const std::set<NodeId> in(members.begin(), members.end());
        std::optional<NodeId> last_input;
        std::optional<NodeId> first_reader;
        for (NodeId m : members) {
            for (const NodeInput& input : graph.node(m).inputs)
                if (!in.contains(input.id)) last_input = std::max(last_input.value_or(0), input.id);
            for (NodeId reader : consumers[m])
                if (!in.contains(reader)) first_reader = std::min(first_reader.value_or(reader), reader);
        }
        return !last_input || !first_reader || *last_input < *first_reader;
    }

    void assign(std::vector<NodeId> members) {
        std::sort(members.begin(), members.end());
        const int index = static_cast<int>(groups.size());
        for (NodeId m : members) group_of[m] = index;
        groups.push_back(std::move(members));
    }

    // A lone node whose only reader is a sum or mean it feeds alone: its forward kernel saves nothing, but its
    // backward chain runs the reduction's broadcast and its own derivative as one kernel instead of two.
    bool worth_alone(NodeId id) const {
        return graph.node(id).requires_grad && consumers[id].size() == 1 &&
               absorbable_reduction(graph, graph.node(consumers[id][0]), id);
    }

    void dissolve(std::size_t g) {
        for (NodeId m : groups[g]) group_of[m] = -1;
        groups[g].clear();
        reductions.erase(g);
    }

    // A sum or mean over trailing axes of a member joins its group (the kernel ends in it): when it comes after
    // every member, no member reads it (a member reading it would need the whole row first: softmax's two passes,
    // not generated yet), the group has no reduction yet and stays legal with it.
    void attach_reductions() {
        for (NodeId id = 0; id < graph.size(); ++id) {
            if (group_of[id] >= 0) continue;
            const std::optional<RowReduction> r = row_reduction(graph, id);
            if (!r) continue;
            const int g = group_of[r->input];
            // Recorded after every member (the kernel's last node, as its launch point expects), one per group.
            if (g < 0 || reductions.contains(static_cast<std::size_t>(g)) || groups[g].back() > id) continue;
            const bool read_by_member = std::any_of(consumers[id].begin(), consumers[id].end(),
                                                    [&](NodeId reader) { return group_of[reader] == g; });
            std::vector<NodeId> joined = groups[g];
            joined.push_back(id);
            if (read_by_member || !legal(joined)) continue;
            groups[g] = std::move(joined);
            group_of[id] = g;
            reductions.emplace(static_cast<std::size_t>(g), *r);
        }
    }

    // Each group checked alone can run between its inputs and its readers; together they must not wait on each
    // other in a circle (a group reading a member of another that reads one of its own). Over units (a group, or a
    // node outside any group) the dependencies must form a DAG: while they do not, the newest group in a cycle is
    // dissolved into its nodes. A safety net (no test graph needs it, docs/fusion.md). Groups of one are dissolved
    // first (they save nothing), unless their backward chain takes over a sum's or mean's (worth_alone).
    void keep_schedulable() {
        for (std::size_t g = 0; g < groups.size(); ++g)
            if (groups[g].size() < 2 && !(groups[g].size() == 1 && worth_alone(groups[g][0]))) dissolve(g);
        for (;;) {
            std::optional<std::size_t> newest;  // of the groups on a cycle, the one whose first member is newest
            for (std::size_t g : groups_on_cycles(graph, groups))
                if (!newest || groups[g].front() > groups[*newest].front()) newest = g;
            if (!newest) return;
            dissolve(*newest);
        }
    }

    // ---- row programs (docs/fusion.md, "Row programs") ----
    // Units (a group, or a lone pointwise node or row reduction) join into one kernel when a member of one reads a
    // reduction of the other's rows, or a value with one element per row computed from one: softmax's e / sum(e),
    // a norm's (x - mean) * rsqrt(var + eps). A block per row then runs the passes; the groups stay the backward's.
    struct Program {
        std::vector<NodeId> members;      // sorted
        std::vector<std::size_t> groups;  // the groups it holds (indices into `groups`)
        bool crosses = false;             // joined across a reduction read back: a row program
    };

    enum class RowRole : std::uint8_t { None, Full, Row, Reduction };
    // What node `id` would be in a row program over the rows of reduction `space`.
    RowRole role(NodeId id, const RowReduction& space) const {
        const Shape& full = graph.node(space.input).value.shape();
        if (const std::optional<RowReduction> r = row_reduction(graph, id))
            return graph.node(r->input).value.shape() == full && r->kept_shape == space.kept_shape ? RowRole::Reduction
                                                                                                 : RowRole::None;
        const ComputeNode& node = graph.node(id);
        if (!fusible(graph, node)) return RowRole::None;
        if (node.value.shape() == full) return RowRole::Full;
        // A dropout's mask is drawn by element index: one of a row value's shape is not a row member (whose
        // formulas see the row's first element's index).
        return node.value.shape() == space.kept_shape && node.op != OpType::Dropout ? RowRole::Row : RowRole::None;
    }

    // The first reduction of `members` (sorted), whose rows a program over them has.
    std::optional<RowReduction> program_rows(const std::vector<NodeId>& members) const {
        for (NodeId m : members)
            if (std::optional<RowReduction> r = row_reduction(graph, m)) return r;
        return std::nullopt;
    }

    // Whether `members` can be one row program: each a pointwise node of the rows' full or kept shape or a reduction
    // of the same rows, one precision class and device, a reduction or row value read by a pointwise member only in
    // the kept shape (so it broadcasts along its own row), and the kernel legal.
    bool valid_program(const std::vector<NodeId>& members) const {
        const std::optional<RowReduction> space = program_rows(members);
        if (!space || space->row_length < 2) return false;  // a row of one: full and kept shapes would coincide
        const std::set<NodeId> in(members.begin(), members.end());
        const Tensor& first = graph.node(members.front()).value;
        for (NodeId m : members) {
            const RowRole r = role(m, *space);
            if (r == RowRole::None) return false;
            const Tensor& value = graph.node(m).value;
            if (value.device() != first.device() ||
                computes_in_double(value.dtype()) != computes_in_double(first.dtype()))
                return false;
            if (r == RowRole::Reduction) continue;  // its input has the full shape (role)
            for (const NodeInput& input : graph.node(m).inputs) {
                if (!in.contains(input.id)) continue;
                const RowRole from = role(input.id, *space);
                if ((from == RowRole::Reduction || from == RowRole::Row) &&
                    graph.node(input.id).value.shape() != space->kept_shape)
                    return false;
            }
        }
        return legal(members);
    }

    std::vector<Program> row_programs() const {
        std::vector<Program> programs;
        std::vector<int> program_of(graph.size(), -1);
        for (std::size_t g = 0; g < groups.size(); ++g) {
            if (groups[g].empty()) continue;
            for (NodeId m : groups[g]) program_of[m] = static_cast<int>(programs.size());
            programs.push_back({groups[g], {g}, false});
        }
        for (NodeId id = 0; id < graph.size(); ++id) {
            if (program_of[id] >= 0 || (!fusible(graph, graph.node(id)) && !row_reduction(graph, id))) continue;
            program_of[id] = static_cast<int>(programs.size());
            programs.push_back({{id}, {}, false});
        }
        for (NodeId id = 0; id < graph.size(); ++id)
            for (const NodeInput& input : graph.node(id).inputs) {
                const int u = program_of[id], v = program_of[input.id];
                if (u < 0 || v < 0 || u == v) continue;
                std::vector<NodeId> merged = programs[u].members;
                merged.insert(merged.end(), programs[v].members.begin(), programs[v].members.end());
                std::sort(merged.begin(), merged.end());
                const std::optional<RowReduction> space = program_rows(merged);
                if (!space) continue;
                const RowRole from = role(input.id, *space);  // only across a row's value
                if ((from != RowRole::Reduction && from != RowRole::Row) || !valid_program(merged)) continue;
                for (NodeId m : programs[v].members) program_of[m] = u;
                programs[u].members = std::move(merged);
                programs[u].groups.insert(programs[u].groups.end(), programs[v].groups.begin(), programs[v].groups.end());
                programs[u].crosses = true;
                programs[v] = {};
            }
        std::vector<Program> out;
        for (Program& p : programs)
            if (p.crosses) out.push_back(std::move(p));
        // Together with the groups they leave alone the kernels must stay schedulable (keep_schedulable): a program on
        // a cycle goes back to its groups, newest first (without programs the groups are schedulable).
        for (;;) {
            std::vector<std::vector<NodeId>> units;
            std::vector<char> held(groups.size(), 0);
            for (const Program& p : out) {
                units.push_back(p.members);
                for (std::size_t g : p.groups) held[g] = 1;
            }
            for (std::size_t g = 0; g < groups.size(); ++g)
                if (!held[g]) units.push_back(groups[g]);
            std::optional<std::size_t> newest;
            for (std::size_t u : groups_on_cycles(graph, units))
                if (u < out.size() && (!newest || out[u].members.front() > out[*newest].members.front())) newest = u;
            if (!newest) return out;
            out.erase(out.begin() + static_cast<std::ptrdiff_t>(*newest));
        }
    }

    void add(NodeId id) {
        std::vector<int> candidates;
        for (const NodeInput& input : graph.node(id).inputs) {
            const int g = group_of[input.id];
            if (g >= 0 && compatible(input.id, id) &&
                std::find(candidates.begin(), candidates.end(), g) == candidates.end())
                candidates.push_back(g);
        }
        // First every producer group with the node, then the largest that alone is legal, else a new group.
        std::vector<NodeId> merged{id};
        for (int g : candidates) merged.insert(merged.end(), groups[g].begin(), groups[g].end());
        if (candidates.size() > 1 && legal(merged)) {
            for (int g : candidates) groups[g].clear();
            assign(std::move(merged));
            return;
        }
        std::sort(candidates.begin(), candidates.end(),
                  [&](int a, int b) { return groups[a].size() > groups[b].size(); });
        for (int g : candidates) {
            std::vector<NodeId> joined = groups[g];
            joined.push_back(id);
            if (legal(joined)) {
                groups[g].push_back(id);
                group_of[id] = g;
                return;
            }
        }
        assign({id});
    }
};

void push_unique(std::vector<NodeId>& list, NodeId id) {
    if (std::find(list.begin(), list.end(), id) == list.end()) list.push_back(id);
}

// Whether `reader`'s derivative formula reads the value of node `id` (one of its inputs).
bool derivative_reads(const ComputeNode& reader, NodeId id) {
    const PointwiseFormula* formula = formula_of(reader);
    if (formula == nullptr) return false;
    for (std::size_t j = 0; j < reader.inputs.size(); ++j)
        if (reader.inputs[j].id == id && derivative_reads_input(*formula, j)) return true;
    return false;
}

// The inputs of `node` its derivative formula reads, onto `reads`.
void push_derivative_reads(const ComputeNode& node, const PointwiseFormula& formula, std::vector<NodeId>& reads) {
    for (std::size_t j = 0; j < node.inputs.size(); ++j)
        if (derivative_reads_input(formula, j)) push_unique(reads, node.inputs[j].id);
}

// The members of `in` whose gradients come into a backward launch from `root` (read by a reached node outside
// `in`, or the root itself) onto `gradients_in`; the lowest such outside reader, below which the launch runs.
std::optional<NodeId> incoming_gradients(const ComputeGraph& graph, const std::set<NodeId>& in, NodeId first,
                                         std::span<const char> reached, NodeId root, std::vector<NodeId>& gradients_in) {
    const auto is_reached = [&](NodeId id) { return id < reached.size() && reached[id] != 0; };
    std::optional<NodeId> lowest_reader;
    for (NodeId reader = first + 1; reader <= root; ++reader) {
        if (in.contains(reader) || !is_reached(reader)) continue;
        for (const NodeInput& input : graph.node(reader).inputs)
            if (in.contains(input.id) && is_reached(input.id)) {
                lowest_reader = std::min(lowest_reader.value_or(reader), reader);
                push_unique(gradients_in, input.id);
            }
    }
    if (in.contains(root)) push_unique(gradients_in, root);
    return lowest_reader;
}

FusionGroup describe_group(const Builder& b, const std::vector<NodeId>& members) {
    const ComputeGraph& graph = b.graph;
    const std::set<NodeId> in(members.begin(), members.end());
    FusionGroup group;
    group.members = members;
    group.shape = graph.node(members.front()).value.shape();
    group.double_precision = computes_in_double(graph.node(members.front()).value.dtype());
    for (NodeId m : members) {
        const ComputeNode& node = graph.node(m);
        for (const NodeInput& input : node.inputs)
            if (!in.contains(input.id)) push_unique(group.inputs, input.id);
        bool read_outside = false, read_by_backward = false;
        for (NodeId reader : b.consumers[m]) {
            if (!in.contains(reader)) read_outside = true;
            else if (graph.node(reader).requires_grad && derivative_reads(graph.node(reader), m))
                read_by_backward = true;
        }
        const PointwiseFormula* formula = formula_of(node);  // none for the row reduction
        if (node.requires_grad && formula != nullptr && formula->derivative_reads_output) read_by_backward = true;
        if (read_outside) group.outputs.push_back({m, Materialise::ConsumedOutside});
        else if (b.consumers[m].empty()) group.outputs.push_back({m, Materialise::StepResult});
        else if (read_by_backward) group.outputs.push_back({m, Materialise::NeededByBackward});
    }
    return group;
}

// A group's reductions (creation order), and for a row program its row members, its index space (the rows' full
// shape: its first member may be a reduction) and its passes.
void describe_rows(const ComputeGraph& graph, FusionGroup& group, bool program) {
    for (NodeId m : group.members)
        if (std::optional<RowReduction> r = row_reduction(graph, m)) group.reductions.push_back(*r);
    if (group.reductions.empty()) return;
    group.row_shape = group.reductions.front().kept_shape;
    group.row_program = program;
    if (!program) return;
    group.shape = graph.node(group.reductions.front().input).value.shape();
    for (NodeId m : group.members)
        if (group.reduction_of(m) == nullptr && graph.node(m).value.shape() != group.shape) group.row_members.push_back(m);
    const std::vector<int> passes = member_passes(graph, group);
    for (std::size_t k = 0; k < group.members.size(); ++k)
        if (std::find(group.row_members.begin(), group.row_members.end(), group.members[k]) == group.row_members.end())
            group.passes = std::max(group.passes, passes[k] + 1);
}

std::optional<BackwardChain> describe_backward(const Builder& b, const FusionGroup& group, std::size_t index) {
    const ComputeGraph& graph = b.graph;
    const std::set<NodeId> in(group.members.begin(), group.members.end());
    BackwardChain chain;
    chain.group = index;
    for (auto it = group.members.rbegin(); it != group.members.rend(); ++it) {
        const ComputeNode& node = graph.node(*it);
        if (!node.requires_grad) continue;
        chain.members.push_back(*it);
        const bool reader_outside = std::any_of(b.consumers[*it].begin(), b.consumers[*it].end(),
                                                [&](NodeId r) { return !in.contains(r); });
        if (reader_outside || b.consumers[*it].empty()) chain.gradients_in.push_back(*it);
        const PointwiseFormula* formula = formula_of(node);
        if (formula == nullptr) continue;  // the row reduction: its backward (a broadcast) reads no value
        push_derivative_reads(node, *formula, chain.saved_reads);
        if (formula->derivative_reads_output) push_unique(chain.saved_reads, *it);
    }
    if (chain.members.empty()) return std::nullopt;
    std::sort(chain.saved_reads.begin(), chain.saved_reads.end());
    for (NodeId input : group.inputs) {
        if (!graph.node(input).requires_grad) continue;
        chain.gradients_out.push_back(input);
        if (graph.node(input).value.shape() != group.shape) chain.reduced.push_back(input);
    }
    return chain;
}

}  // namespace

FusionMode parse_fusion_mode(std::string_view text) {
    if (text.empty() || text == "captured") return FusionMode::Captured;
    if (text == "0" || text == "off") return FusionMode::Off;
    return FusionMode::All;
}

const char* fusion_mode_name(FusionMode mode) {
    switch (mode) {
        case FusionMode::Off: return "off";
        case FusionMode::Captured: return "captured";
        case FusionMode::All: return "all";
    }
    return "unknown";
}

FusionSettings fusion_settings() {
    static const FusionMode environment_mode = parse_fusion_mode(environment("DYNGRAD_FUSION"));
    static const bool print = environment_flag("DYNGRAD_PRINT_FUSIONS");
    static const bool check = environment_flag("DYNGRAD_CHECK_FUSIONS");
    const int override_value = mode_override.load(std::memory_order_relaxed);
    const FusionMode mode = override_value >= 0 ? static_cast<FusionMode>(override_value) : environment_mode;
    return {mode, mode != FusionMode::Off, mode == FusionMode::All, print, check};
}

void set_fusion_mode(FusionMode mode) {
    mode_override.store(static_cast<int>(mode), std::memory_order_relaxed);
    switches.fetch_add(1, std::memory_order_relaxed);
}

void set_fusion_enabled(bool enabled) { set_fusion_mode(enabled ? FusionMode::All : FusionMode::Off); }

std::uint64_t fusion_switches() { return switches.load(std::memory_order_relaxed); }

const char* materialise_name(Materialise why) {
    switch (why) {
        case Materialise::ConsumedOutside: return "consumed outside";
        case Materialise::NeededByBackward: return "needed by backward";
        case Materialise::StepResult: return "step result";
    }
    return "unknown";
}

const Shape& FusionGroup::member_shape(NodeId id) const {
    if (const RowReduction* r = reduction_of(id)) return r->shape;
    if (std::find(row_members.begin(), row_members.end(), id) != row_members.end()) return row_shape;
    return shape;
}

std::size_t FusionPlan::launches_saved() const {
    std::size_t saved = 0;
    for (const FusionGroup& group : groups) saved += group.members.size() - 1;
    return saved;
}

std::string FusionPlan::describe(const ComputeGraph& graph) const {
    std::ostringstream out;
    const auto node_text = [&](NodeId id) {
        const ComputeNode& node = graph.node(id);
        return str(node.op == OpType::Leaf ? "leaf" : op_def(node.op, node.attrs).name, " #", id);
    };
    for (std::size_t g = 0; g < groups.size(); ++g) {
        const FusionGroup& group = groups[g];
        out << "group " << g << " " << to_string(group.shape) << (group.double_precision ? " f64" : " f32");
        if (group.row_program) out << " row program, " << group.passes << " passes over " << to_string(group.row_shape);
        out << ":";
        for (std::size_t i = 0; i < group.members.size(); ++i) out << (i ? ", " : " ") << node_text(group.members[i]);
        out << " | inputs";
        for (std::size_t i = 0; i < group.inputs.size(); ++i) out << (i ? ", " : " ") << node_text(group.inputs[i]);
        out << " | outputs";
        for (std::size_t i = 0; i < group.outputs.size(); ++i)
            out << (i ? ", " : " ") << node_text(group.outputs[i].node) << " ("
                << materialise_name(group.outputs[i].why) << ")";
        out << "\n";
    }
    return out.str();
}

FusionPlan plan_fusion(const ComputeGraph& graph) {
    Builder builder(graph);
    for (NodeId id = 0; id < graph.size(); ++id)
        if (fusible(graph, graph.node(id))) builder.add(id);
    builder.attach_reductions();
    builder.keep_schedulable();
    const std::vector<Builder::Program> programs = builder.row_programs();
    FusionPlan plan;
    plan.signature = graph_signature(graph);
    // The segments (every group, by its first member: the order a replay meets them) and their backward chains.
    std::vector<std::size_t> order;
    for (std::size_t g = 0; g < builder.groups.size(); ++g)
        if (!builder.groups[g].empty()) order.push_back(g);  // else dissolved
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return builder.groups[a].front() < builder.groups[b].front(); });
    std::vector<std::size_t> segment_of(builder.groups.size(), 0);
    for (std::size_t i = 0; i < order.size(); ++i) {
        segment_of[order[i]] = i;
        FusionGroup segment = describe_group(builder, builder.groups[order[i]]);
        describe_rows(graph, segment, false);
        segment.segments = {i};
        if (auto chain = describe_backward(builder, segment, i)) plan.backward.push_back(std::move(*chain));
        plan.segments.push_back(std::move(segment));
    }
    // The forward kernels: the row programs, and the segments no program holds.
    std::vector<char> held(builder.groups.size(), 0);
    for (const Builder::Program& program : programs) {
        FusionGroup kernel = describe_group(builder, program.members);
        describe_rows(graph, kernel, true);
        for (std::size_t g : program.groups) {
            held[g] = 1;
            kernel.segments.push_back(segment_of[g]);
        }
        std::sort(kernel.segments.begin(), kernel.segments.end());
        plan.groups.push_back(std::move(kernel));
    }
    for (std::size_t g : order)
        if (!held[g]) plan.groups.push_back(plan.segments[segment_of[g]]);
    std::sort(plan.groups.begin(), plan.groups.end(),
              [](const FusionGroup& a, const FusionGroup& b) { return a.members.front() < b.members.front(); });
    return plan;
}

std::vector<int> member_passes(const ComputeGraph& graph, const FusionGroup& group) {
    std::map<NodeId, int> pass;  // of the members so far
    std::vector<int> out;
    for (NodeId m : group.members) {
        int p = 0;
        const RowReduction* reduction = group.reduction_of(m);
        for (const NodeInput& input : graph.node(m).inputs) {
            const auto found = pass.find(input.id);
            if (found == pass.end()) continue;  // an external input: there from the start
            // A reduction's value exists after its loop: the next pass reads it (a reduction reads no reduction).
            p = std::max(p, found->second + (group.reduction_of(input.id) != nullptr && reduction == nullptr ? 1 : 0));
        }
        pass[m] = p;
        out.push_back(p);
    }
    return out;
}

std::vector<char> reached_by_backward(const ComputeGraph& graph, NodeId root) {
    std::vector<char> reached(std::size_t{root} + 1, 0);
    reached[root] = 1;
    for (NodeId id = root + 1; id-- > 0;) {
        if (!reached[id]) continue;
        for (const NodeInput& input : graph.node(id).inputs)
            if (graph.node(input.id).requires_grad) reached[input.id] = 1;
    }
    return reached;
}

std::optional<BackwardLaunch> backward_launch(const ComputeGraph& graph, const FusionPlan& plan, std::size_t index,
                                              std::span<const char> reached, NodeId root) {
    const FusionGroup& group = plan.segments.at(index);
    std::set<NodeId> in(group.members.begin(), group.members.end());
    const auto is_reached = [&](NodeId id) { return id < reached.size() && reached[id] != 0; };
    BackwardLaunch launch;
    launch.group = index;
    // A member whose one reached reader outside the group is a sum or mean of it alone: that reduction's backward
    // joins the chain (its gradient loaded broadcast); its readers become the chain's outside readers.
    std::map<NodeId, std::vector<NodeId>> outside_readers;
    for (NodeId reader = group.members.front() + 1; reader <= root; ++reader) {
        if (in.contains(reader) || !is_reached(reader)) continue;
        for (const NodeInput& input : graph.node(reader).inputs)
            if (in.contains(input.id) && is_reached(input.id)) push_unique(outside_readers[input.id], reader);
    }
    for (const auto& [member, readers] : outside_readers)
        if (readers.size() == 1 && absorbable_reduction(graph, graph.node(readers[0]), member)) in.insert(readers[0]);
    // reached readers outside the chain
    const std::optional<NodeId> lowest_reader =
        incoming_gradients(graph, in, group.members.front(), reached, root, launch.gradients_in);
    for (auto it = in.rbegin(); it != in.rend(); ++it) {
        if (!is_reached(*it)) continue;
        const ComputeNode& node = graph.node(*it);
        if (!op_def(node.op, node.attrs).differentiable) return std::nullopt;
        launch.members.push_back(*it);
        const PointwiseFormula* formula = formula_of(node);
        if (formula == nullptr) continue;  // an absorbed sum or mean: it reads no value, its input is a member
        const bool gives_gradient = std::any_of(node.inputs.begin(), node.inputs.end(),
                                                [&](const NodeInput& input) { return is_reached(input.id); });
        if (!gives_gradient) continue;
        push_derivative_reads(node, *formula, launch.saved_reads);
        if (formula->derivative_reads_output) push_unique(launch.saved_reads, *it);
        for (const NodeInput& input : node.inputs)
            if (!in.contains(input.id) && is_reached(input.id)) push_unique(launch.gradients_out, input.id);
    }
    if (launch.members.empty()) return std::nullopt;
    std::sort(launch.saved_reads.begin(), launch.saved_reads.end());
    std::sort(launch.gradients_in.begin(), launch.gradients_in.end(), std::greater<>());
    launch.run_before = lowest_reader ? *lowest_reader - 1 : root;
    return launch;
}

std::optional<BackwardLaunch> program_backward_launch(const ComputeGraph& graph, const FusionPlan& plan,
                                                      std::size_t index, std::span<const char> reached, NodeId root) {
    const FusionGroup& group = plan.groups.at(index);
    if (!group.row_program) return std::nullopt;
    const std::set<NodeId> in(group.members.begin(), group.members.end());
    const auto is_reached = [&](NodeId id) { return id < reached.size() && reached[id] != 0; };
    const auto is_row_member = [&](NodeId id) {
        return std::find(group.row_members.begin(), group.row_members.end(), id) != group.row_members.end();
    };
    BackwardLaunch launch;
    launch.group = index;
    launch.program = true;
    const std::optional<NodeId> lowest_reader =
        incoming_gradients(graph, in, group.members.front(), reached, root, launch.gradients_in);
    for (auto it = group.members.rbegin(); it != group.members.rend(); ++it) {
        if (!is_reached(*it)) continue;
        const ComputeNode& node = graph.node(*it);
        if (!op_def(node.op, node.attrs).differentiable) return std::nullopt;
        launch.members.push_back(*it);
        const bool gives_gradient = std::any_of(node.inputs.begin(), node.inputs.end(),
                                                [&](const NodeInput& input) { return is_reached(input.id); });
        if (!gives_gradient) continue;
        if (const PointwiseFormula* formula = formula_of(node)) {
            push_derivative_reads(node, *formula, launch.saved_reads);
            if (formula->derivative_reads_output) push_unique(launch.saved_reads, *it);
        }
        for (const NodeInput& input : node.inputs) {
            if (in.contains(input.id) || !is_reached(input.id)) continue;
            // A row member's gradient to an input is one value per row: only an input of the rows' kept shape takes it.
            if (is_row_member(*it) && graph.node(input.id).value.shape() != group.row_shape) return std::nullopt;
            push_unique(launch.gradients_out, input.id);
        }
    }
    if (launch.members.empty()) return std::nullopt;
    std::sort(launch.saved_reads.begin(), launch.saved_reads.end());
    std::sort(launch.gradients_in.begin(), launch.gradients_in.end(), std::greater<>());
    launch.run_before = lowest_reader ? *lowest_reader - 1 : root;
    return launch;
}

const FusionGroup& launch_group(const FusionPlan& plan, const BackwardLaunch& launch) {
    return launch.program ? plan.groups.at(launch.group) : plan.segments.at(launch.group);
}

std::string node_signature(const ComputeGraph& graph, NodeId id) {
    std::ostringstream out;
    const ComputeNode& node = graph.node(id);
    out << static_cast<int>(node.op);
    if (node.op != OpType::Leaf) {
        const OpDef& def = op_def(node.op, node.attrs);
        out << ' ' << def.name << '(' << attrs_text(def, node.attrs) << ')';
    }
    for (const NodeInput& input : node.inputs) out << ' ' << input.id;
    if (node.value.defined())
        out << ' ' << to_string(node.value.shape()) << ' ' << dtype_name(node.value.dtype()) << ' '
            << node.value.device().to_string();
    else
        out << " released";
    out << (node.requires_grad ? " g" : "");
    return out.str();
}

std::string graph_signature(const ComputeGraph& graph) {
    std::string out;
    for (NodeId id = 0; id < graph.size(); ++id) out += node_signature(graph, id) + ";";
    return out;
}

const FusionPlan& FusionPlanCache::plan_for(const ComputeGraph& graph) {
    std::string signature = graph_signature(graph);
    auto found = plans_.find(signature);
    if (found != plans_.end()) return found->second;
    return plans_.emplace(std::move(signature), plan_fusion(graph)).first->second;
}

}  // namespace dyngrad::fusion
