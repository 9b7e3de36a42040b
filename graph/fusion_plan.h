// The fusion compiler's grouping pass (issue 33, docs/fusion.md): over a recorded graph, the maximal groups of
// pointwise nodes (rows with OpDef::pointwise: elementwise unary and binary ops, activations, casts, scalar ops) that
// one generated kernel can compute, what each group must write to memory, and which backward chains can be grouped
// likewise. A plan describes; it runs nothing (ops/fusion_source.h generates a group's kernel source,
// cuda/nvrtc_compiler.h compiles it). By default it fuses inside captured steps (cuda::CapturedStep) only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dyngrad/graph/graph.h"

namespace dyngrad::fusion {

// The switches, read once from the environment (set_* override them, e.g. in tests):
//   DYNGRAD_FUSION           unset or "captured": fuse inside captured steps (cuda::CapturedStep: its warm-up
//                            plans, its capture launches the generated kernels), never an eager graph;
//                            "0" or "off": never fuse; "1" or "all": also eager graphs whose signature repeats
//   DYNGRAD_PRINT_FUSIONS=1  print each generated kernel's source and each fallback to stderr
//   DYNGRAD_CHECK_FUSIONS=1  compare each generated kernel with its unfused composition on first use
// Captured steps by default: a capture already asks for a warm-up and a fixed graph, as torch.compile does, and
// there the generated kernels were measured (docs/fusion.md); an eager graph's fused forward leaves a member's
// value unwritten until its group runs, which a caller reading Var::node().value would see, so eager is opt-in.
enum class FusionMode : std::uint8_t { Off, Captured, All };
struct FusionSettings {
    FusionMode mode = FusionMode::Captured;
    bool enabled = true;  // mode != Off: captured steps fuse
    bool eager = false;   // mode == All: eager graphs fuse too
    bool print = false;
    bool check = false;
};
FusionSettings fusion_settings();
// DYNGRAD_FUSION's text as a mode: "" and "captured" Captured, "0" and "off" Off, anything else All (as "1").
FusionMode parse_fusion_mode(std::string_view text);
const char* fusion_mode_name(FusionMode mode);  // "off", "captured", "all"
// Also starts afresh what the hook learnt of repeating graphs (graph/fusion_replay.h): a process that turns fusion
// off and on again fuses an eager graph once its signature has come to a backward twice more.
void set_fusion_mode(FusionMode mode);
// true: FusionMode::All (eager graphs too), false: Off.
void set_fusion_enabled(bool enabled);
// How many times set_fusion_mode/set_fusion_enabled has been called (the hook compares it with what it last saw).
std::uint64_t fusion_switches();

// Why a member's value is written to memory by its group's kernel.
enum class Materialise : std::uint8_t {
    ConsumedOutside,   // a node outside the group reads it
    NeededByBackward,  // a derivative formula reads it (OpDef::pointwise's derivative_reads_*)
    StepResult,        // nothing in the graph reads it: the caller does
};
const char* materialise_name(Materialise why);

struct GroupOutput {
    NodeId node;
    Materialise why;
};

// A sum or mean over the trailing axes of one value that a group's kernel computes too (issue 33's pointwise +
// row-reduction pattern): the value seen as (rows, row_length), each row summed by one block in a fixed order as the
// elements are computed. Its result is the reduction's value (not the unfused kernel's order of additions: close,
// not bitwise).
struct RowReduction {
    NodeId node = 0;   // the sum or mean, a member of the group
    NodeId input = 0;  // the value it reduces: a member, or (in a row program) an external input
    std::int64_t rows = 0;
    std::int64_t row_length = 0;
    Shape shape;       // its output shape
    Shape kept_shape;  // its input's shape with the reduced axes as 1 (keepdim's): one element per row
    bool mean = false;
};

// One generated kernel: members computed elementwise over one index space, external inputs broadcast into it.
// With reductions, a block per row: a group that ends in a sum or mean (one reduction, read by no member), or a
// row program (docs/fusion.md, "Row programs"): members that read a reduction of the same rows back (softmax's
// e / sum(e), a norm's x - mean(x)), in passes over each row, each pass ending in the reductions the next reads.
struct FusionGroup {
    std::vector<NodeId> members;       // creation order; the kernel runs where the last member ran
    std::vector<NodeId> inputs;        // the distinct producers outside the group, in first-use order
    std::vector<GroupOutput> outputs;  // the members written to memory, creation order
    Shape shape;                       // every pointwise member's output shape but row members': the index space
    bool double_precision = false;     // computes in f64 (every member f64), else in f32 (f32, bf16, f16)
    std::vector<RowReduction> reductions;  // members, creation order; all over the same rows of `shape`
    // Pointwise members with one value per row (shape `row_shape`, the reductions' kept_shape): formulas of the
    // reductions, as a norm's 1 / sqrt(var + eps), computed once per row between two passes.
    std::vector<NodeId> row_members;
    Shape row_shape;
    int passes = 1;  // loops over each row: more than one when members read reductions back
    // The groups of the grouping pass this kernel joins (indices into FusionPlan::segments): one, or a row
    // program's several. Their backward chains are the segments'.
    std::vector<std::size_t> segments;
    const RowReduction* reduction_of(NodeId id) const {
        for (const RowReduction& r : reductions)
            if (r.node == id) return &r;
        return nullptr;
    }
    // The shape member `id` has: a reduction's, a row member's, or the group's.
    const Shape& member_shape(NodeId id) const;
    bool row_program = false;  // joined across a reduction read back (or a row member): see above
};

// The pass over each row in which each member of `group` (parallel to group.members) is computed: a pointwise
// member of the group's shape in that loop (and again in later loops that read it); a reduction summed in that
// loop; a row member after the reductions of the loops before it (pass k: between loop k - 1 and loop k; equal to
// group.passes: after the last loop). 0 for every member of a group without reductions.
std::vector<int> member_passes(const ComputeGraph& graph, const FusionGroup& group);

// The backward of a group's members that require grad, as one kernel: the incoming gradients of the outputs
// consumed outside, the derivative formulas applied in reverse creation order with fan-out summed in registers,
// one gradient per external input that requires grad. A gradient broadcast into the shape still needs its sum
// to the input's shape (a reduction): the chain writes it in the group's shape and `reduced` names it.
struct BackwardChain {
    std::size_t group = 0;              // index into FusionPlan::segments
    std::vector<NodeId> members;        // reverse creation order
    std::vector<NodeId> gradients_in;   // members whose gradient comes from outside the group
    std::vector<NodeId> saved_reads;    // the values the derivative formulas read (materialised by the forward)
    std::vector<NodeId> gradients_out;  // external inputs that require grad
    std::vector<NodeId> reduced;        // those of gradients_out whose shape differs from the group's
};

// A group's backward as one backward pass from `root` runs it: only what that pass reaches (its `needed` marks,
// reached_by_backward). The sweep (graph/sweep.cpp) skips the members and runs the chain's generated kernel once
// every reached reader outside the group has given its gradient: at the start of its visit to node `run_before`
// (just below the lowest such reader; legality puts every external input at or below it).
// A sum or mean that is a member's only reached reader outside the group is taken over too: its backward (dy
// broadcast back, times 1/count for the mean) becomes part of the chain, which loads its gradient broadcast, so the
// reduction's expand kernel and the member's derivative run as one kernel.
struct BackwardLaunch {
    std::size_t group = 0;              // index into FusionPlan::segments (into FusionPlan::groups when `program`)
    // A row program's whole backward as one kernel (program_backward_launch), in place of its segments' chains.
    bool program = false;
    std::vector<NodeId> members;        // the reached members and the sums/means taken over, reverse creation order
    std::vector<NodeId> gradients_in;   // of those, the root and those with a reached reader outside the chain
    std::vector<NodeId> saved_reads;    // the values their derivatives read (members and external inputs), sorted
    std::vector<NodeId> gradients_out;  // external inputs the pass reaches that a member gives a gradient
    NodeId run_before = 0;
};

struct FusionPlan {
    std::string signature;  // graph_signature() of the graph it was made for
    std::vector<FusionGroup> groups;  // the forward kernels, by their first member
    // The groups of the grouping pass, by their first member: each a forward kernel of its own, or part of a row
    // program's (FusionGroup::segments). Backward chains are made of these (BackwardChain::group, backward_launch):
    // a row program's backward runs as its segments' chains and its other members' unfused backward. Without row
    // programs, equal to `groups`.
    std::vector<FusionGroup> segments;
    std::vector<BackwardChain> backward;
    // Kernel launches a forward saves: each group replaces its members' launches by one.
    std::size_t launches_saved() const;
    // One line per group: "group 0: add #5, relu #6 | inputs #3, #4 | outputs relu #6 (consumed outside)".
    std::string describe(const ComputeGraph& graph) const;
};

// Groups of at least two nodes (a group of one saves nothing; except a node whose only reader is a sum or mean of it
// alone that requires grad: its backward chain saves the reduction's expand kernel). Legal by construction: every member has the
// group's shape and precision class, and no path leads from a member through a node outside the group back into
// the group (the kernel would need a value computed after it).
FusionPlan plan_fusion(const ComputeGraph& graph);

// The nodes a backward from `root` visits: 1 for the root and every node that requires grad on a path into it
// (as ComputeGraph::backward marks them), 0 otherwise; sized root + 1.
std::vector<char> reached_by_backward(const ComputeGraph& graph, NodeId root);
// Segment `index` of `plan` (FusionPlan::segments) as that backward runs it; nullopt when the pass reaches none of its members or a reached
// member's row has no backward.
std::optional<BackwardLaunch> backward_launch(const ComputeGraph& graph, const FusionPlan& plan, std::size_t index,
                                              std::span<const char> reached, NodeId root);

// The backward of row program `index` of plan.groups as one kernel of its passes in reverse (docs/fusion.md,
// "Backward row programs"): every reached member (its groups' and the lone nodes it took in), the gradients of its
// row values summed over their rows in the kernel. nullopt when the group is no row program, the pass reaches none
// of it, a reached member has no backward, or an input that takes a gradient from a row member is not of the rows'
// kept shape (its segments' chains run then).
std::optional<BackwardLaunch> program_backward_launch(const ComputeGraph& graph, const FusionPlan& plan,
                                                      std::size_t index, std::span<const char> reached, NodeId root);
// The group a launch is of: a segment, or a row program.
const FusionGroup& launch_group(const FusionPlan& plan, const BackwardLaunch& launch);

// What a plan depends on, exactly: each node's op, inputs, attributes, shape, dtype, device and requires_grad.
// Two graphs with the same signature get the same plan; a change in any of these (a new batch size) is another
// signature, so no plan or kernel made for other shapes is ever reused.
std::string graph_signature(const ComputeGraph& graph);
// One node's part of graph_signature (the signature is each node's, followed by ';'): "12 relu() 11 (64, 96)
// float32 cuda:0 g". The captured step names the first node that differs from its warm-up's with it.
std::string node_signature(const ComputeGraph& graph, NodeId id);

// Plans by signature: the captured step asks once per replay key (a changed shape plans anew).
class FusionPlanCache {
public:
    const FusionPlan& plan_for(const ComputeGraph& graph);
    std::size_t size() const { return plans_.size(); }

private:
    std::map<std::string, FusionPlan> plans_;
};

}  // namespace dyngrad::fusion
