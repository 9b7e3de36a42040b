// ComputeGraph records ComputeNodes while user code runs the forward pass; backward(loss) walks the
// nodes reachable from `loss` in reverse topological order. Vars are light handles (graph + node id).
//
// Node ids grow in creation order and every input id is smaller than its consumer's id, so creation
// order is a topological order: backward is one reverse sweep over ids, no recursion, no sort.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

class ComputeGraph;
using NodeId = std::uint32_t;
namespace fusion {
struct BackwardFusion;  // the fusion compiler's backward chains for one sweep (graph/fusion_replay.h)
namespace detail {
struct GraphAccess;  // replaces a fused member's value when its plan is let go (graph/fusion_replay.h)
}  // namespace detail
}  // namespace fusion

namespace detail {
struct GraphAnchor;  // a graph's liveness record; outlives the graph (graph.cpp)
struct HigherOrder;  // the create_graph sweep (graph/higher_order.cpp)
struct Checkpoint;   // drops and replays a checkpointed segment's values (graph/checkpoint.cpp)
}

// A tensor that outlives graphs (a model weight). Its gradient accumulates over backward calls
// until zero_grad(). Copies of a Parameter share state.
//
// A parameter belongs to one pending forward pass at a time: a graph that records it with grad enabled
// binds it until that graph runs a backward without retain_graph, is cleared, or is destroyed. Recording
// it in a second graph meanwhile throws GraphError (its gradient would mix two passes); the same graph
// may record it any number of times, and recording under NoGradGuard does not bind. Binding is atomic: of
// two threads recording one parameter into two graphs at once, exactly one succeeds.
//
// A frozen parameter (set_requires_grad(false)) is recorded as a constant leaf: no gradient reaches it,
// it binds to no graph, and optimizers and clip_grad_norm skip it. Freezing takes effect at the next
// recording; it keeps a gradient it already has (zero_grad() drops it).
class Parameter {
public:
    Parameter() = default;
    explicit Parameter(Tensor value, std::string name = "");

    bool defined() const { return state_ != nullptr; }
    const Tensor& value() const;
    Tensor& value();
    // Undefined until a backward reaches this parameter.
    const Tensor& grad() const;
    void zero_grad();  // drops the gradient (the next backward starts from zero)
    const std::string& name() const;
    // Renames every copy (Module registration sets the dotted path, e.g. "fc1.weight").
    void set_name(std::string name);
    // Trainable (the default) or frozen; shared by every copy.
    bool requires_grad() const;
    void set_requires_grad(bool requires_grad);
    // Internal: the engine accumulates into the gradient.
    Tensor& grad_slot();
    // The same for every copy of this parameter, distinct between parameters (a key for maps).
    const void* identity() const { return state_.get(); }

    // Internal (graph/autocast.cpp, nn/optim.cpp): a 16-bit copy of the value kept across steps, as llm.c keeps
    // its bf16 weights. Autocast keeps the cast it made of a trainable parameter; an optimizer step rewrites
    // that copy from the new value in the same kernel (nn/optim.cu) and marks it current; autocast then takes
    // a current copy as the cast's value and launches no cast kernel. "Current" means made from this very
    // storage at its present version: any other in-place write (they bump the version) or a replaced value
    // makes it stale, and a stale copy is never read (autocast casts again and keeps that).
    // The copy of `dtype` when it is current, else an undefined tensor.
    Tensor current_reduced_copy(DType dtype) const;
    // Keeps `copy` (the value cast to a 16-bit dtype, just made) as current for the value as it is now.
    void keep_reduced_copy(Tensor copy);
    // The kept copy, current or stale (undefined when none): what an optimizer step rewrites.
    Tensor reduced_copy() const;
    // After an in-place update that also rewrote reduced_copy() from the new value: current again.
    void mark_reduced_copy_current();
    // Forgets the copy (its memory is freed when no graph holds it).
    void drop_reduced_copy();
    // How many optimizers update this parameter (each counts itself in and out, nn/optim.cpp): autocast keeps
    // a copy only of a parameter that one of them will keep current.
    void count_updater(int delta);
    bool has_updater() const;

private:
    friend class ComputeGraph;
    struct ReducedCopy {
        Tensor copy;
        // The value it was made from, without keeping that alive (a replaced value's memory is freed as before).
        std::weak_ptr<const Storage> storage;
        const void* data = nullptr;
        Shape shape;
        std::uint32_t version = 0;  // the storage version it matches
    };
    struct State {
        Tensor value;
        Tensor grad;
        std::optional<ReducedCopy> reduced;
        std::atomic<int> updaters{0};
        std::string name;
        bool requires_grad = true;
        std::mutex binding;                    // guards graph and bound_at: graphs on other threads bind too
        const ComputeGraph* graph = nullptr;  // the graph whose pending forward pass holds it
        std::source_location bound_at;         // where that graph first recorded it
    };
    std::shared_ptr<State> state_;
};

// One input of a node: its id, and the version of its value's storage when the node was recorded
// (Storage::version), which the backward checks before it reads the value. Reads as the id.
struct NodeInput {
    NodeId id;
    std::uint32_t version;
    operator NodeId() const { return id; }
};

struct ComputeNode {
    OpType op = OpType::Leaf;
    std::vector<NodeInput> inputs;
    OpAttrs attrs;
    Tensor value;
    Tensor grad;                 // filled by backward; on a leaf, the sum over this graph's backward passes
    NodeId grad_node = 0;        // a leaf after a create_graph backward: the node holding `grad` (0: none)
    std::vector<Tensor> saved;   // extras saved by the forward for the backward
    // Storage versions of `value` and of each saved extra when recorded (empty when nothing is saved).
    std::uint32_t value_version = 0;
    std::vector<std::uint32_t> saved_versions;
    bool requires_grad = false;
    Parameter parameter;         // set on parameter leaves
    std::string name;
    std::source_location where;

    ComputeNode() = default;
    ComputeNode(const ComputeNode&) = delete;
    ComputeNode& operator=(const ComputeNode&) = delete;
};

// Handle to one node of one graph. Valid until the graph is cleared or destroyed; using a handle
// from a cleared or destroyed graph throws GraphError. It holds no reference count: liveness is checked
// through the graph's anchor, which outlives the graph (docs/architecture.md).
class Var {
public:
    Var() = default;

    bool defined() const { return anchor_ != nullptr; }
    // Defined and its graph neither cleared nor destroyed since (never throws).
    bool is_live() const;
    ComputeGraph& graph() const;
    NodeId id() const { return id_; }
    const ComputeNode& node() const;

    const Tensor& value() const;
    // The gradient backward computed for this node; GraphError when it has none. On a leaf it is the sum
    // over this graph's backward passes (a retained graph run twice gives twice the gradient), as PyTorch's
    // .grad of a leaf; a Parameter's own grad() sums over every graph until zero_grad().
    const Tensor& grad() const;
    // After backward(..., {.create_graph = true}): the gradient as a recorded Var of this graph, differentiable
    // again (graph/higher_order.h); GraphError when no create_graph backward reached this leaf.
    Var grad_var() const;
    const Shape& shape() const { return stored_value().shape(); }
    DType dtype() const { return stored_value().dtype(); }
    Device device() const { return stored_value().device(); }
    bool requires_grad() const;
    double item() const { return value().item(); }
    // Sets the debug name used in error messages and reports; returns *this for chaining.
    Var& name(const std::string& debug_name);

private:
    friend class ComputeGraph;
    Var(detail::GraphAnchor* anchor, NodeId id, std::uint64_t generation)
        : anchor_(anchor), id_(id), generation_(generation) {}
    // The live graph this handle belongs to; GraphError for an undefined or stale handle.
    ComputeGraph& live_graph() const;
    // The node's value tensor for its shape, dtype and device: value() without the fusion compiler's hook, which
    // makes a fused member's data ready (graph/fusion_replay.h).
    const Tensor& stored_value() const;

    detail::GraphAnchor* anchor_ = nullptr;
    NodeId id_ = 0;
    std::uint64_t generation_ = 0;
};

struct BackwardOptions {
    // Keep saved tensors so backward may run again over the same graph.
    bool retain_graph = false;
    // Keep the gradient of every node, not only of leaves (verification reads them all).
    bool retain_grads = false;
    // Release each intermediate node's value as soon as the sweep no longer needs it (after the node's own
    // backward; its consumers' ran before), as PyTorch frees saved activations during backward. Lowers the
    // step's peak memory by the activations; reading such a value afterwards throws GraphError. Leaves, the
    // node back-propagated from, and nodes the sweep does not visit keep their values. Ignored with
    // retain_graph.
    bool free_values = false;
    // Called once per parameter that this pass reaches, as soon as its gradient for the pass is final: this
    // pass's contributions (from every leaf recording it) have been added into Parameter::grad(). The sweep
    // visits a parameter's last leaf after all its consumers, so the calls come in readiness order (roughly
    // the reverse of the order the forward recorded the parameters); unreached and frozen parameters get no
    // call. Data-parallel training launches gradient all-reduces from it while the sweep goes on
    // (distributed/ddp.h). Empty (the default): the sweep pays one test per parameter leaf. An exception thrown by
    // the callback ends the backward like an op's error (leaf gradients are restored).
    std::function<void(const Parameter&)> on_parameter_ready = {};
    // Record the backward as ops of this graph (graph/higher_order.h): each node's differentiable backward runs
    // instead of its kernels, and a leaf's gradient is also a Var (Var::grad_var) that can be differentiated
    // again. Implies keeping the saved tensors (the gradient's nodes read them); ignores free_values. A node whose
    // op is first-order only throws HigherOrderError.
    bool create_graph = false;
};

// Threads: a graph is used by one thread at a time (recording, backward, clear, reading its Vars);
// different graphs on different threads are fine. A call that finds the graph in use by another thread
// throws GraphError instead of touching it (docs/architecture.md, "Threads").
class ComputeGraph {
public:
    ComputeGraph();
    ~ComputeGraph();
    ComputeGraph(const ComputeGraph&) = delete;
    ComputeGraph& operator=(const ComputeGraph&) = delete;

    // Leaves. An input that requires grad gets a gradient readable through Var::grad().
    Var input(const Tensor& value, const std::string& name = "", bool requires_grad = false,
              std::source_location where = std::source_location::current());
    Var parameter(const Parameter& parameter, std::source_location where = std::source_location::current());
    Var constant(const Tensor& value, std::source_location where = std::source_location::current());

    // Records one op node: checks inputs (same graph, device, dtype), infers the output, runs the
    // forward on the inputs' backend. Called by the op functions in ops/.
    Var record(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs, std::source_location where);
    Var record(OpType op, const std::vector<Var>& inputs, const OpAttrs& attrs, std::source_location where);
    // Internal (graph/autocast.cpp): records `op` as record() does, but with `value` as its output instead of
    // running its forward: a value already computed for exactly these inputs and attributes (a parameter's kept
    // 16-bit copy, Parameter::current_reduced_copy). GraphError unless `value` is what the shape rule describes.
    Var record_precomputed(OpType op, std::span<const Var> inputs, const OpAttrs& attrs, Tensor value,
                           std::source_location where);

    // Seeds a one-element `loss` with 1 and back-propagates.
    void backward(const Var& loss, const BackwardOptions& options = {});
    // Back-propagates an explicit gradient of `output`'s shape, dtype and device. No leaf's gradient shares
    // storage with `grad_output` (a leaf it would reach unchanged gets a copy): the caller may reuse it.
    void backward(const Var& output, const Tensor& grad_output, const BackwardOptions& options = {});

    // Drops every node; handles into the graph become stale. Parameters keep their gradients and are
    // released (free to be recorded by another graph).
    void clear();
    std::size_t size() const { return nodes_.size(); }
    const ComputeNode& node(NodeId id) const;
    Var handle(NodeId id);

    // "relu #12 'h1' (model.cpp:42)"
    std::string describe_node(NodeId id) const;

private:
    friend class Var;
    friend struct detail::HigherOrder;
    friend struct detail::Checkpoint;
    friend struct fusion::detail::GraphAccess;
    // Held by every call that reads or changes the nodes: takes the graph for this thread (nested calls on
    // the same thread pass), throws GraphError when another thread holds it.
    class Use;
    // Why `var` cannot be used in this graph ("belongs to another graph", ...); nullptr when it can.
    const char* foreign_reason(const Var& var) const;
    Var add_leaf(const Tensor& value, bool requires_grad, Parameter parameter, const std::string& name,
                 std::source_location where);
    Var record_inputs(OpType op, std::span<const Var> inputs, const OpAttrs& attrs, std::source_location where,
                      const Tensor* precomputed = nullptr);
    void run_backward(NodeId root, Tensor seed, const BackwardOptions& options);
    // `fused`: backward chains of the fusion compiler that stand in for their members (graph/fusion_replay.h).
    void sweep(NodeId root, Tensor seed, std::span<const char> needed, const BackwardOptions& options,
               fusion::BackwardFusion* fused = nullptr);
    void restore_leaf_grads(std::vector<std::pair<NodeId, Tensor>>& earlier);
    void check_versions(NodeId id, std::span<const Tensor> input_values) const;
    void check_own(const Var& var, const char* role) const;
    void release_parameters() noexcept;

    std::vector<std::unique_ptr<ComputeNode>> nodes_;
    std::vector<Parameter> bound_;  // parameters this graph's pending forward pass holds
    detail::GraphAnchor* anchor_;   // Vars reach the graph through it; it learns of clear() and destruction
    std::uint64_t generation_;      // the anchor's generation while this graph lives (a copy, for the hot path)
    bool saved_released_ = false;  // a backward without retain_graph has run
    mutable std::atomic<std::thread::id> user_{};       // the thread inside a Use; none when idle
    mutable std::atomic<const char*> user_activity_{};  // what that thread does, for the error message
};

// While alive on this thread, ops record leaves holding their values and no history.
class NoGradGuard {
public:
    NoGradGuard();
    ~NoGradGuard();
    NoGradGuard(const NoGradGuard&) = delete;
    NoGradGuard& operator=(const NoGradGuard&) = delete;

private:
    bool previous_;
};
bool grad_enabled();

// A creation site as error messages print it: "model.cpp:42".
std::string describe_site(const std::source_location& where);

// A leaf holding x's value (shared storage) that no gradient flows through.
Var detach(const Var& x, std::source_location where = std::source_location::current());

}  // namespace dyngrad
