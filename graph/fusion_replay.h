// The fusion compiler inside steps (issue 33, docs/fusion.md "The hook"): with fusion on (the default,
// FusionMode::Captured), each fusion group's generated kernel runs instead of its members' kernels in the forward
// of a cuda::CapturedStep's capture, and the backward of its warm-up and capture runs each group's backward chain
// as one generated kernel; with FusionMode::All (DYNGRAD_FUSION=1, fusion::set_fusion_enabled(true)) also in the
// forward of eager graphs whose signature has repeated and in every eager backward on the GPU.
//
//   eager backward: at the graph's first backward, plan the graph as recorded so far (plan_fusion, cached by
//     signature and root), compile every group's kernel and backward chain (compilation is not capturable); a
//     group whose compile fails, or that DYNGRAD_CHECK_FUSIONS=1 finds differing from its unfused kernels, is
//     dropped. The sweep runs the chains (graph/sweep.cpp). In a CapturedStep's warm-up (cuda::current_step_run)
//     the plan also waits, thread-local, for that variant's capture; a plan whose signature comes to a backward a
//     second time is offered to the next eager graphs (FusionMode::All; FusionMode::Captured plans no other eager
//     graph).
//   forward: a graph takes the first plan whose graph it has recorded so far (a capture: its variant's waiting
//     plans; eager: the repeated ones); recording a member allocates its output and launches nothing; its group's
//     kernel is launched just before the first node outside the group that reads a member, right after its last
//     member, or when Var::value() asks for a member, whichever comes first (LaunchTracker). Every node a kernel
//     touches must be the plan's: a graph that turns out to differ lets its plan go there (the members recorded so
//     far get their values, by the group's kernel or their own forward, and the rest runs unfused; a
//     GraphDiffers entry in cuda::fusion_log()). Never a kernel made for another graph, never another result.
//
// Off, or on a CPU, the engine's hooks cost one thread-local test per recorded node.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/cuda/fused_kernel.h"
#include "dyngrad/graph/fusion_plan.h"

namespace dyngrad::fusion {

// ---- the launch schedule (pure: tests/fusion/test_fusion_replay.cpp) ----

// Which group's kernel a captured step launches where: just before recording `node` (a node outside the group
// reads one of its members) or right after recording it (the group's last member).
struct LaunchEvent {
    std::size_t group = 0;
    NodeId node = 0;
    bool before = false;
    bool operator==(const LaunchEvent&) const = default;
};

// The lazy launch rule, fed node by node in recording order; each group launches once.
class LaunchTracker {
public:
    explicit LaunchTracker(const FusionPlan& plan);
    // The group `node` is a member of, or -1.
    int group_of(NodeId node) const;
    // The groups to launch before recording `node`, which reads `inputs`: those not launched yet that have a member
    // among `inputs` and do not hold `node`. Marks them launched.
    std::vector<std::size_t> before(NodeId node, std::span<const NodeId> inputs);
    // The group to launch right after recording `node`: its own when it is that group's last member and the group
    // has not launched yet. Marks it launched.
    std::optional<std::size_t> after(NodeId node);
    bool launched(std::size_t group) const { return launched_.at(group) != 0; }
    // Marks `group` launched (its kernel runs now, ahead of the rule: a read of a member's value); false when it was.
    bool claim(std::size_t group);

private:
    const FusionPlan* plan_;
    std::vector<int> group_of_;  // by node id, -1 outside every group
    std::vector<char> launched_;
};

// Every launch of a step that records nodes 0 .. node_inputs.size()-1 in order, node i reading node_inputs[i].
std::vector<LaunchEvent> schedule_launches(const FusionPlan& plan, std::span<const std::vector<NodeId>> node_inputs);

// How a capture's graph differs from the warm-up graph its plan was made from: both node counts and the first node
// that differs (each as node_signature() gives it), or "" when the signatures are equal (the GraphDiffers entry of
// cuda::fusion_log()).
std::string graph_mismatch_message(std::span<const std::string> warm_up_nodes, std::span<const std::string> capture_nodes);

// ---- what happened (tests, debugging) ----
struct ReplayStats {
    std::size_t plans = 0;           // plans made in warm-ups (a repeated signature reuses its plan)
    std::size_t groups_compiled = 0; // groups whose kernel is ready
    std::size_t groups_dropped = 0;  // a failed compile or a failed DYNGRAD_CHECK_FUSIONS comparison
    std::size_t captures = 0;        // captured graphs that ran generated kernels
    std::size_t last_groups = 0;          // groups of the plan the last of those applied
    std::size_t last_launches_saved = 0;  // its launches_saved()
    // What fusion cost the host (issue 33's compile-time target): the warm-ups' planning, source generation,
    // NVRTC and module loading, in ms; of it, NVRTC alone; and the groups whose image came from the disk cache.
    double prepare_ms = 0.0;
    double nvrtc_ms = 0.0;
    std::size_t groups_from_cache = 0;
    // Backward chains (graph/fusion_plan.h, BackwardLaunch): compiled, dropped (a failed compile or check), and
    // run by a sweep (eager or captured; each run launches at most one kernel in place of its members' backward).
    std::size_t backward_chains_compiled = 0;
    std::size_t backward_chains_dropped = 0;
    std::size_t backward_chains_run = 0;
    // Eager graphs (outside a capture) that ran generated forward kernels, once their signature had repeated; and
    // graphs (eager or captured) whose plan was let go part way (a different node, an early read of a member).
    std::size_t eager_graphs_fused = 0;
    std::size_t plans_let_go = 0;
};
ReplayStats replay_stats();  // this thread's

// ---- one group made runnable (implemented in ops/fusion_launch.cpp: it generates the source) ----
struct CompiledGroup {
    const cuda::FusedKernel* kernel = nullptr;  // loaded for the group's device; lives for the process
    std::vector<NodeId> inputs;       // the kernel's pointer parameters, in order: inputs, then outputs
    std::vector<NodeId> outputs;      // every member (the unfused backward may read any of them)
    std::vector<NodeId> scalar_nodes; // members passing a math::UnaryScalars, in parameter order
    std::vector<std::vector<std::byte>> scalars;  // their bytes, from the warm-up's attributes
    bool double_precision = false;
    std::int64_t numel = 0;
    int device = 0;                   // the CUDA device it was loaded for
    bool from_cache = false;          // its image came from the disk cache
};
// The bytes of the math::UnaryScalars<float or double> a member passes its kernel (the capture checks each member's
// against the plan's).
std::vector<std::byte> member_scalar_bytes(const ComputeNode& node, bool double_precision);
// Launches a compiled group on its device's stream (capturable): `inputs` and `outputs` in its parameter order.
void launch_compiled_group(const CompiledGroup& group, std::span<const Tensor> inputs, std::span<const Tensor> outputs);

// ---- a group's backward chain made runnable (ops/fusion_launch.cpp) ----
struct CompiledBackward {
    BackwardLaunch launch;
    const cuda::FusedKernel* kernel = nullptr;  // nullptr when it stores nothing (every result an incoming gradient)
    // The kernel's pointer parameters in order: the saved values, the incoming gradients, one output per store.
    std::vector<NodeId> saved;
    std::vector<NodeId> gradients_in;
    std::vector<DType> store_dtypes;
    std::vector<Shape> store_shapes;  // the group's shape; a row program's kept shape for its row sums
    std::int64_t numel = 0;           // the threads it launches
    // Per external input that gets a gradient: a store of the kernel, or an incoming gradient passed unchanged;
    // `contributions`: how many members' gradients it sums (the check's rule, below); `row_summed`: summed over
    // its rows in the kernel (a row program's), with `magnitude_store` (DYNGRAD_CHECK_FUSIONS=1's kernels) the
    // rows' sums of the terms' magnitudes.
    struct Result {
        NodeId input = 0;
        int store = -1;
        int gradient_in = -1;
        int contributions = 0;
        bool row_summed = false;
        int magnitude_store = -1;
    };
    std::vector<Result> results;
    std::vector<NodeId> scalar_nodes;
    std::vector<std::vector<std::byte>> scalars;
    Shape shape;  // the group's index space
    bool double_precision = false;
    int device = 0;
    bool from_cache = false;
    bool dropped = false;  // the DYNGRAD_CHECK_FUSIONS=1 comparison failed: the members run unfused
};
// Every kernel of a plan: the groups `groups` (indices into plan.groups) and the backward chains `launches` (each
// of one of those groups). Each source is generated once; the kernels not loaded yet are compiled in one NVRTC
// translation unit and loaded as one module (a unit NVRTC or the driver refuses is logged, and each kernel is then
// compiled alone); with `check`, each group also runs once on the warm-up's values against its members' (bitwise
// for f32/f64, one unit in the last place for bf16/f16). What cannot be generated, compiled, loaded or checked is
// nullopt after a cuda::fusion_log() entry: that group or chain runs unfused. CUDA only (all nullopt without).
struct CompiledPlan {
    std::vector<std::optional<CompiledGroup>> groups;     // parallel to `groups`
    std::vector<std::optional<CompiledBackward>> chains;  // parallel to `launches`
    double nvrtc_ms = 0.0;             // NVRTC's time (0 when every image came from the disk cache or was loaded)
    std::size_t kernels_together = 0;  // kernels the shared unit held (0: none compiled together)
};
CompiledPlan compile_plan(const ComputeGraph& graph, const FusionPlan& plan, std::span<const std::size_t> groups,
                          std::span<const BackwardLaunch> launches, bool check);
// Launches it on its device's stream (capturable): `inputs` the saved values then the incoming gradients.
void launch_compiled_backward(const CompiledBackward& chain, std::span<const Tensor> inputs,
                              std::span<const Tensor> outputs);
// DYNGRAD_CHECK_FUSIONS=1 for a chain: where its gradient `generated` for an input differs from the sum of the
// members' unfused gradients `unfused` ("" when they agree): bitwise for f32/f64 and one unit in the last place
// for bf16/f16 when `same_order` (the input took one member's gradient, or has the group's shape: the same sums
// in the same order). Else (several members' gradients summed over broadcast axes, in another order) within a
// relative 1e-5 (f64 1e-12, bf16/f16 1e-2) of `magnitude`, a bound on the sum of the terms' magnitudes (0: the
// largest magnitude of `unfused`).
std::string backward_mismatch(const Tensor& generated, const Tensor& unfused, bool same_order, double magnitude = 0.0);

// The chains one backward pass runs in place of their members' unfused backward (ComputeGraph's sweep).
struct BackwardFusion {
    NodeId root = 0;
    std::vector<CompiledBackward> chains;
    bool check = false;  // DYNGRAD_CHECK_FUSIONS=1's first pass: each chain beside its members' unfused backward
};

namespace detail {
// Engine hooks (graph/graph.cpp). `generation` tells a cleared graph from its earlier self.
// Before recording node graph.size() from `inputs`: launches the groups it must follow; returns the output to
// record without running a kernel when the node is a member of the group being applied, else an undefined tensor.
Tensor before_record(const ComputeGraph& graph, std::uint64_t generation, const OpDef& def, OpType op,
                     std::span<const Var> input_vars, std::span<const Tensor> inputs, const OpAttrs& attrs);
// After node `id` was added (an op node, or the leaf a no-grad recording makes).
void after_record(const ComputeGraph& graph, std::uint64_t generation, NodeId id);
// At the start of backward from `root`: plans in a warm-up; checks and finishes the plan in a capture. Returns the
// backward chains this pass may run (null when none): a capture's, or an eager step's once its graph was planned.
std::shared_ptr<BackwardFusion> at_backward(const ComputeGraph& graph, std::uint64_t generation, NodeId root);
// The sweep ran a chain's kernel (replay_stats()), or dropped a chain whose check failed (a CheckMismatch entry
// of cuda::fusion_log() with `reason`).
void count_backward_chain_run() noexcept;
void backward_chain_dropped(const std::string& reason);
// The graph is cleared or destroyed.
void graph_ended(const ComputeGraph& graph, std::uint64_t generation) noexcept;
// Before a Var's value is handed out (Var::value()): a member whose group's kernel has not run gets it run now, or,
// when the group cannot run yet, the plan is let go and the members recorded so far run their unfused forward.
void before_value_read(const ComputeGraph& graph, std::uint64_t generation, NodeId id);
// A dropout member whose kernel is skipped (ops/fusion_launch.cpp): the Dropout layer's pending seed draw for its
// seed input `inputs[1]` (ops/kernels.h, cuda::FusedSeedDraw) runs now, before any group kernel reads the seed.
void draw_skipped_dropout_seed(std::span<const Tensor> inputs);
// Whether any hook has work: fusion is on and a plan waits or is being applied on this thread.
bool replay_armed() noexcept;
// Replaces a recorded node's value (a member recomputed by its unfused forward when a plan is let go).
struct GraphAccess {
    static void set_value(const ComputeGraph& graph, NodeId id, Tensor value);
};
}  // namespace detail

}  // namespace dyngrad::fusion
