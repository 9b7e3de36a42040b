// The engine: recording and backward() with their checks; the reverse sweep itself: graph/sweep.cpp.
// Over 600 lines: the version counter, liveness anchors and thread guard belong to the same two code paths;
// split candidates: the guards.
#include "dyngrad/graph/graph.h"

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/graph/anomaly.h"
#include "dyngrad/graph/autocast.h"
#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/graph/fusion_replay.h"
#include "dyngrad/graph/backend.h"
#include "dyngrad/graph/engine_helpers.h"
#include "dyngrad/graph/higher_order.h"
#include "dyngrad/graph/profiling.h"
#include "dyngrad/graph/through_f32.h"

namespace dyngrad {

namespace detail {
// What a Var holds instead of the graph: anchors are never freed (a graph's destructor returns its anchor
// to a free list for the next graph), so a handle from a destroyed graph can always read one and find its
// generation changed, without touching the graph's freed memory. Generations are unique over the process.
struct GraphAnchor {
    std::atomic<std::uint64_t> generation{0};  // of the live graph; 0 while on the free list
    ComputeGraph* graph = nullptr;             // valid while `generation` matches a handle's
    GraphAnchor* next_free = nullptr;
};

// The engine's message helpers, shared with the backward sweep (graph/sweep.cpp; graph/engine_helpers.h).
std::string describe_inputs(std::span<const Tensor> inputs) {
    std::string out;
    for (std::size_t i = 0; i < inputs.size(); ++i) out += str(i ? ", " : "", describe(inputs[i]));
    return out;
}

const BackendKernels& kernels_for(const OpDef& def, Device device) {
    return device.is_cpu() ? def.cpu : def.cuda;
}

std::string stats_of(const std::string& role, const Tensor& t) {
    return str("; ", role, " ", describe(t), ": ", to_string(tensor_stats(t)));
}
std::string stats_of_inputs(std::span<const Tensor> inputs) {
    std::string out;
    for (std::size_t i = 0; i < inputs.size(); ++i) out += stats_of(str("input ", i), inputs[i]);
    return out;
}

std::string op_label(const OpDef& def) {
    return str(def.op == OpType::Custom ? "custom op '" : "op '", def.name, "'");
}
[[noreturn]] void rethrow_op_failure(const std::string& context, const OpDef& def, const char* stage) {
    try {
        throw;
    } catch (const std::exception&) {
        rethrow_with_context(context);
    } catch (...) {
        throw Error(str(context, ": ", op_label(def), ": its ", stage, " threw something that is not a ",
                        "std::exception (such as `throw 42`); an op must throw a dyngrad::Error or a std::exception"));
    }
}
}  // namespace detail
using detail::describe_inputs;
using detail::kernels_for;
using detail::op_label;
using detail::rethrow_op_failure;
using detail::stats_of;
using detail::stats_of_inputs;

namespace {
thread_local bool tls_grad_enabled = true;

// Each graph and each clear() gets a fresh generation, so stale handles are recognised even when
// a new graph reuses the anchor of a destroyed one.
std::uint64_t next_generation() {
    static std::atomic<std::uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
}

// Anchors of destroyed graphs, reused by new ones. Leaked on purpose (a graph may be destroyed during
// static destruction); every anchor stays reachable from here or from a live graph.
struct AnchorPool {
    std::mutex mutex;
    detail::GraphAnchor* free = nullptr;
};
AnchorPool& anchor_pool() {
    static AnchorPool* pool = new AnchorPool;
    return *pool;
}
detail::GraphAnchor* acquire_anchor() {
    AnchorPool& pool = anchor_pool();
    {
        const std::lock_guard lock(pool.mutex);
        if (detail::GraphAnchor* anchor = pool.free) {
            pool.free = anchor->next_free;
            anchor->next_free = nullptr;
            return anchor;
        }
    }
    return new detail::GraphAnchor;
}
void release_anchor(detail::GraphAnchor* anchor) noexcept {
    anchor->generation.store(0, std::memory_order_release);
    anchor->graph = nullptr;
    AnchorPool& pool = anchor_pool();
    const std::lock_guard lock(pool.mutex);
    anchor->next_free = pool.free;
    pool.free = anchor;
}

// The input values of one node for its kernels: inline for up to four inputs (every op but a long
// concat), on the heap beyond, so recording a node allocates no list of them.
class InputValues {
public:
    explicit InputValues(std::size_t count) : count_(count) {
        if (count > inline_.size()) heap_.resize(count);
    }
    Tensor& operator[](std::size_t i) { return count_ > inline_.size() ? heap_[i] : inline_[i]; }
    std::span<const Tensor> span() const {
        if (count_ > inline_.size()) return heap_;
        return {inline_.data(), count_};
    }

private:
    std::array<Tensor, 4> inline_;
    std::vector<Tensor> heap_;
    std::size_t count_;
};

// The contract checks at the one place every op's shape rule and forward are called, so a user op that
// breaks its own rule is stopped here instead of being recorded (and blamed on something else later).
void check_output_spec(const OpDef& def, const OutputSpec& spec) {
    for (const std::int64_t d : spec.shape)
        if (d < 0)
            throw ShapeError(str(op_label(def), ": its shape rule returned shape ", to_string(spec.shape),
                                 ", which has a negative dimension"));
}
void check_forward_output(const OpDef& def, const OutputSpec& spec, Device device, const Tensor& out) {
    if (!out.defined())
        throw GraphError(str(op_label(def), ": its forward returned an undefined tensor; it must return the ",
                             to_string(spec.shape), " ", dtype_name(spec.dtype), " ", device.to_string(),
                             " tensor its shape rule describes"));
    if (out.shape() != spec.shape || out.dtype() != spec.dtype || out.device() != device)
        throw GraphError(str(op_label(def), ": its forward returned ", describe(out), ", but its shape rule gave ",
                             to_string(spec.shape), " ", dtype_name(spec.dtype), " on the inputs' device ",
                             device.to_string(), "; a forward must return exactly what its shape rule describes"));
}


// Anomaly mode, right after a forward: NumericalError when the new value holds a NaN or Inf. When an
// input already held one (a weight, the data), the message names that input's node, a parameter by its
// name: the node that reports is only the first to consume it (e.g. linear's internal transpose).
template <typename DescribeInput>
void check_forward_value(std::span<const Tensor> inputs, const Tensor& out, const DescribeInput& describe_input) {
    const TensorStats stats = tensor_stats(out);
    if (stats.all_finite()) return;
    std::string source = "; its inputs are finite, so this op made it";
    for (std::size_t i = 0; i < inputs.size(); ++i)
        if (!tensor_stats(inputs[i]).all_finite()) {
            source = str("; it comes from input ", i, ", ", describe_input(i), ", which already held NaN/Inf");
            break;
        }
    throw NumericalError(str("anomaly mode: the output holds NaN/Inf", source, stats_of("output", out),
                             stats_of_inputs(inputs)));
}
}  // namespace

namespace detail {

// The one checked path from inputs to an op's output, shared by recording and eager calls: shape rule,
// contract checks, the backend's forward, anomaly mode; every failure rethrown with `context()` in front.
Tensor run_forward(const OpDef& def, OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs,
                   std::vector<Tensor>& saved, std::size_t profiling_id, const std::function<std::string()>& context,
                   const std::function<std::string(std::size_t)>& describe_input) {
    const Device device = inputs.front().device();
    const char* stage = "shape rule";
    try {
        reduced_input_dtype(inputs);  // DTypeError for bf16/f16 mixed with another floating dtype
        const OutputSpec spec = def.infer(op, inputs, attrs);
        check_output_spec(def, spec);
        const BackendKernels& k = kernels_for(def, device);
        if (!k.forward) throw DeviceError(str("no forward kernel on ", device.to_string()));
        const ProfilingRange range(ProfilingRange::Pass::Forward, def.name, profiling_id);
        stage = "forward";
        Tensor out = run_forward_kernel(def, k, ForwardArgs{op, inputs, attrs, spec, saved});
        check_forward_output(def, spec, device, out);
        if (anomaly_mode_enabled()) check_forward_value(inputs, out, describe_input);
        if (fusion_check_enabled()) check_fused_forward(def, op, inputs, attrs, out);
        return out;
    } catch (...) {
        rethrow_op_failure(context(), def, stage);
    }
}

}  // namespace detail

namespace {
// An unrecorded call's operands (eager, check_op_call): their count, presence and device, errors prefixed `at`.
template <class At>
void check_operands(const OpDef& def, std::span<const Tensor> inputs, const At& at) {
    if (!takes_input_count(def, static_cast<int>(inputs.size())))
        throw GraphError(str(at(), ": takes ", input_count_text(def), " inputs, got ", inputs.size()));
    for (std::size_t i = 0; i < inputs.size(); ++i)
        if (!inputs[i].defined()) throw ValueError(str(at(), ": input ", i, " is an undefined tensor"));
    const Device device = inputs.front().device();
    for (const Tensor& v : inputs)
        if (v.device() != device)
            throw DeviceError(str(at(), ": inputs on different devices: ", describe_inputs(inputs)));
}
}  // namespace

void check_op_call(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs, std::source_location where) {
    if (autocast_dtype()) return;  // the op would see autocast's casts, which only recording makes
    const OpDef& def = op_def(op, attrs);
    const auto at = [&] { return str(def.name, " (at ", describe_site(where), ")"); };
    check_operands(def, inputs, at);
    try {
        detail::reduced_input_dtype(inputs);
        check_output_spec(def, def.infer(op, inputs, attrs));
    } catch (...) {
        detail::rethrow_op_failure(str(at(), " with inputs ", describe_inputs(inputs)), def, "shape rule");
    }
}

Tensor eager(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs, std::source_location where) {
    const OpDef& def = op_def(op, attrs);
    // "relu (eager at model.cpp:42)": the prefix of every error of this call.
    const auto at = [&] { return str(def.name, " (eager at ", describe_site(where), ")"); };
    check_operands(def, inputs, at);
    if (autocast_dtype()) [[unlikely]]
        if (const auto cast = detail::autocast_tensors(op, inputs)) return eager(op, *cast, attrs, where);
    std::vector<Tensor> saved;  // no backward will read them
    return detail::run_forward(
        def, op, inputs, attrs, saved, 0, [&] { return str(at(), " with inputs ", describe_inputs(inputs)); },
        [](std::size_t i) { return str("input ", i); });
}

// ---- one thread at a time ----
class ComputeGraph::Use {
public:
    Use(const ComputeGraph& graph, const char* activity) : graph_(graph) {
        const std::thread::id me = std::this_thread::get_id();
        std::thread::id holder{};
        if (graph.user_.compare_exchange_strong(holder, me, std::memory_order_acquire, std::memory_order_relaxed)) {
            owner_ = true;
            graph.user_activity_.store(activity, std::memory_order_relaxed);
            return;
        }
        if (holder == me) return;  // a nested call of the same thread
        const char* other = graph.user_activity_.load(std::memory_order_relaxed);
        throw GraphError(str(activity, ": the graph is in use by another thread (", other ? other : "a call",
                             "); a ComputeGraph is used by one thread at a time: give each thread its own graph, ",
                             "or let one finish before another starts (docs/architecture.md, Threads)"));
    }
    ~Use() {
        if (owner_) graph_.user_.store(std::thread::id{}, std::memory_order_release);
    }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

private:
    const ComputeGraph& graph_;
    bool owner_ = false;
};

bool grad_enabled() { return tls_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(tls_grad_enabled) { tls_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tls_grad_enabled = previous_; }
bool detail::exchange_grad_enabled(bool enabled) { return std::exchange(tls_grad_enabled, enabled); }

Parameter::Parameter(Tensor value, std::string name) : state_(std::make_shared<State>()) {
    state_->value = std::move(value);
    state_->name = std::move(name);
    if (!state_->value.defined()) throw ValueError(str("Parameter '", state_->name, "': value is undefined"));
    if (!is_floating(state_->value.dtype()))
        throw DTypeError(str("Parameter '", state_->name, "': needs float32 or float64, got ",
                             dtype_name(state_->value.dtype())));
}
const Tensor& Parameter::value() const {
    if (!state_) throw ValueError("Parameter is undefined");
    return state_->value;
}
Tensor& Parameter::value() {
    if (!state_) throw ValueError("Parameter is undefined");
    return state_->value;
}
const Tensor& Parameter::grad() const { return const_cast<Parameter*>(this)->grad_slot(); }
Tensor& Parameter::grad_slot() {
    if (!state_) throw ValueError("Parameter is undefined");
    return state_->grad;
}
void Parameter::zero_grad() {
    if (state_) state_->grad = Tensor();
}
const std::string& Parameter::name() const {
    static const std::string none;
    return state_ ? state_->name : none;
}
void Parameter::set_name(std::string name) {
    if (!state_) throw ValueError("Parameter is undefined");
    state_->name = std::move(name);
}
Tensor Parameter::current_reduced_copy(DType dtype) const {
    if (!state_ || !state_->reduced) return Tensor();
    const ReducedCopy& r = *state_->reduced;
    const Tensor& value = state_->value;
    const bool current = r.copy.dtype() == dtype && value.uses_storage(r.storage) && r.data == value.raw_data() &&
                         r.shape == value.shape() && r.version == value.version() &&
                         r.copy.device() == value.device();
    return current ? r.copy : Tensor();
}
void Parameter::keep_reduced_copy(Tensor copy) {
    if (!state_) throw ValueError("Parameter is undefined");
    if (!is_reduced_precision(copy.dtype()) || copy.shape() != state_->value.shape() ||
        copy.device() != state_->value.device())
        throw ValueError(str("Parameter '", state_->name, "': a reduced copy must be bfloat16 or float16 of the ",
                             "value's shape and device; got ", describe(copy), " for ", describe(state_->value)));
    const Tensor& value = state_->value;
    state_->reduced = ReducedCopy{std::move(copy), value.storage_reference(), value.raw_data(), value.shape(),
                                  value.version()};
}
Tensor Parameter::reduced_copy() const { return state_ && state_->reduced ? state_->reduced->copy : Tensor(); }
void Parameter::mark_reduced_copy_current() {
    if (!state_ || !state_->reduced) return;
    const Tensor& value = state_->value;
    ReducedCopy& r = *state_->reduced;
    r.storage = value.storage_reference();
    r.data = value.raw_data();
    r.shape = value.shape();
    r.version = value.version();
}
void Parameter::drop_reduced_copy() {
    if (state_) state_->reduced.reset();
}
void Parameter::count_updater(int delta) {
    if (state_) state_->updaters.fetch_add(delta, std::memory_order_relaxed);
}
bool Parameter::has_updater() const { return state_ && state_->updaters.load(std::memory_order_relaxed) > 0; }
bool Parameter::requires_grad() const { return state_ && state_->requires_grad; }
void Parameter::set_requires_grad(bool requires_grad) {
    if (!state_) throw ValueError("Parameter is undefined");
    state_->requires_grad = requires_grad;
}

// Reads only the anchor until the generation matches: a destroyed graph's memory is never touched. The
// generation matching also means id_ exists (ids only grow until the next clear()).
ComputeGraph& Var::live_graph() const {
    if (!anchor_) throw GraphError("Var is undefined (default-constructed)");
    if (anchor_->generation.load(std::memory_order_acquire) != generation_)
        throw GraphError(str("Var #", id_, " belongs to a graph that was cleared or destroyed"));
    return *anchor_->graph;
}
ComputeGraph& Var::graph() const { return live_graph(); }
bool Var::is_live() const {
    return anchor_ != nullptr && anchor_->generation.load(std::memory_order_acquire) == generation_;
}
const ComputeNode& Var::node() const {
    const ComputeGraph& g = live_graph();
    const ComputeGraph::Use use(g, "reading a Var");
    return *g.nodes_[id_];
}
const Tensor& Var::value() const {
    if (fusion::detail::replay_armed()) [[unlikely]] {
        const ComputeGraph& g = live_graph();
        fusion::detail::before_value_read(g, g.generation_, id_);
    }
    return stored_value();
}

const Tensor& Var::stored_value() const {
    const ComputeGraph& g = live_graph();
    const ComputeGraph::Use use(g, "reading a Var's value");
    const ComputeNode& n = *g.nodes_[id_];
    if (!n.value.defined())
        throw GraphError(str(g.describe_node(id_), ": its value was released by a backward with ",
                             "BackwardOptions{.free_values = true}; read it before that backward"));
    return n.value;
}
const Tensor& Var::grad() const {
    const ComputeGraph& g = live_graph();
    const ComputeGraph::Use use(g, "reading a Var's gradient");
    const ComputeNode& n = *g.nodes_[id_];
    if (!n.grad.defined())
        throw GraphError(str(g.describe_node(id_), " has no gradient: it needs none, backward has not ",
                             "reached it, or it is an intermediate and retain_grads was off"));
    return n.grad;
}
bool Var::requires_grad() const { return node().requires_grad; }
Var& Var::name(const std::string& debug_name) {
    ComputeGraph& g = live_graph();
    const ComputeGraph::Use use(g, "naming a Var");
    g.nodes_[id_]->name = debug_name;
    return *this;
}

ComputeGraph::ComputeGraph() : anchor_(acquire_anchor()), generation_(next_generation()) {
    anchor_->graph = this;
    anchor_->generation.store(generation_, std::memory_order_release);
}
ComputeGraph::~ComputeGraph() {
    fusion::detail::graph_ended(*this, generation_);
    release_anchor(anchor_);  // first: from here on every handle into this graph throws
    release_parameters();
}

const char* ComputeGraph::foreign_reason(const Var& var) const {
    if (var.anchor_ == anchor_ && var.generation_ == generation_) return nullptr;
    if (!var.anchor_) return "belongs to no graph (undefined Var)";
    if (var.anchor_ == anchor_) return "is from before this graph was cleared";
    if (var.anchor_->generation.load(std::memory_order_acquire) != var.generation_)
        return "belongs to a graph that was cleared or destroyed";
    return "belongs to another graph";
}

std::string ComputeGraph::describe_node(NodeId id) const {
    const Use use(*this, "describe_node()");
    const ComputeNode& n = node(id);
    std::string out = str(op_def(n.op, n.attrs).name, " #", id);
    if (!n.name.empty()) out += str(" '", n.name, "'");
    return out + str(" (", describe_site(n.where), ")");
}

const ComputeNode& ComputeGraph::node(NodeId id) const {
    const Use use(*this, "node()");
    if (id >= nodes_.size()) throw GraphError(str("node #", id, " does not exist (graph has ", nodes_.size(), ")"));
    return *nodes_[id];
}

Var ComputeGraph::handle(NodeId id) {
    node(id);
    return Var(anchor_, id, generation_);
}

Var ComputeGraph::add_leaf(const Tensor& value, bool requires_grad, Parameter parameter, const std::string& name,
                           std::source_location where) {
    if (!value.defined()) throw ValueError(str("leaf '", name, "' at ", describe_site(where), ": tensor is undefined"));
    if (requires_grad && !is_floating(value.dtype()))
        throw DTypeError(str("leaf '", name, "' at ", describe_site(where),
                             ": only float tensors can require grad, got ",
                             dtype_name(value.dtype())));
    if (nodes_.size() >= std::numeric_limits<NodeId>::max()) throw GraphError("graph is full");
    auto n = std::make_unique<ComputeNode>();
    n->value = value;
    n->requires_grad = requires_grad;
    n->parameter = std::move(parameter);
    n->name = name;
    n->where = where;
    nodes_.push_back(std::move(n));
    return Var(anchor_, static_cast<NodeId>(nodes_.size() - 1), generation_);
}

Var ComputeGraph::input(const Tensor& value, const std::string& name, bool requires_grad, std::source_location where) {
    const Use use(*this, "input()");
    return add_leaf(value, requires_grad, Parameter(), name, where);
}
Var ComputeGraph::parameter(const Parameter& p, std::source_location where) {
    const Use use(*this, "parameter()");
    if (!p.defined()) throw ValueError(str("parameter at ", describe_site(where), ": the Parameter is undefined"));
    const Tensor& value = p.value();
    // Frozen, or recorded without grad: a constant leaf that binds to no graph.
    if (!grad_enabled() || !p.requires_grad()) return add_leaf(value, false, p, p.name(), where);
    Parameter::State& state = *p.state_;
    // Check and bind under the parameter's lock: two graphs on two threads cannot both take it.
    const std::lock_guard lock(state.binding);
    if (state.graph != nullptr && state.graph != this)
        throw GraphError(str("parameter '", p.name(), "' ", describe(value), " at ", describe_site(where),
                             ": still part of another graph's pending forward pass (recorded there at ",
                             describe_site(state.bound_at),
                             "); release it there first: backward(), clear() or destroy that graph"));
    Var var = add_leaf(value, true, p, p.name(), where);
    if (state.graph == nullptr) {
        bound_.push_back(p);  // first, so that a bound parameter is always in the list that releases it
        state.graph = this;
        state.bound_at = where;
    }
    return var;
}
Var ComputeGraph::constant(const Tensor& value, std::source_location where) {
    const Use use(*this, "constant()");
    return add_leaf(value, false, Parameter(), "", where);
}

Var ComputeGraph::record(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs,
                         std::source_location where) {
    return record_inputs(op, std::span<const Var>(inputs.begin(), inputs.size()), attrs, where);
}

Var ComputeGraph::record(OpType op, const std::vector<Var>& inputs, const OpAttrs& attrs, std::source_location where) {
    return record_inputs(op, inputs, attrs, where);
}

Var ComputeGraph::record_precomputed(OpType op, std::span<const Var> inputs, const OpAttrs& attrs, Tensor value,
                                     std::source_location where) {
    return record_inputs(op, inputs, attrs, where, &value);
}

// The hot path of every op: no string is built and nothing is allocated beyond the output, the node and
// its input list unless something fails (error messages are composed on the throwing paths only).
Var ComputeGraph::record_inputs(OpType op, std::span<const Var> inputs, const OpAttrs& attrs,
                                std::source_location where, const Tensor* precomputed) {
    const OpDef& def = op_def(op, attrs);
    const Use use(*this, def.name);
    // "relu (new node #12 at model.cpp:42)": the prefix of every error of this call.
    const auto at = [&] { return str(def.name, " (new node #", nodes_.size(), " at ", describe_site(where), ")"); };
    if (!takes_input_count(def, static_cast<int>(inputs.size())))
        throw GraphError(str(at(), ": takes ", input_count_text(def), " inputs, got ", inputs.size()));

    InputValues values(inputs.size());
    bool any_requires_grad = false;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const Var& in = inputs[i];
        if (const char* reason = foreign_reason(in))
            throw GraphError(str(at(), ": input ", i, " (Var #", in.id_, ") ", reason));
        const ComputeNode& n = *nodes_[in.id_];
        if (!n.value.defined())
            throw GraphError(str(at(), ": input ", i, " (", describe_node(in.id_), ") had its value released by a ",
                                 "backward with free_values"));
        values[i] = n.value;
        any_requires_grad = any_requires_grad || n.requires_grad;
    }
    const std::span<const Tensor> input_values = values.span();
    if (autocast_dtype() && precomputed == nullptr) [[unlikely]]  // record the casts autocast wants, then this op
        if (const auto cast = detail::autocast_inputs(op, inputs, input_values))
            return record_inputs(op, *cast, attrs, where);
    const Device device = input_values.front().device();
    for (const Tensor& v : input_values)
        if (v.device() != device)
            throw DeviceError(str(at(), ": inputs on different devices: ", describe_inputs(input_values)));

    std::vector<Tensor> saved;
    Tensor out;  // a member of a fused group in a captured step: its group's kernel writes it (graph/fusion_replay.h)
    if (fusion::detail::replay_armed()) [[unlikely]] {
        out = fusion::detail::before_record(*this, generation_, def, op, inputs, input_values, attrs);
        // A plan let go there may have given an input a recomputed value: read them again.
        for (std::size_t i = 0; i < inputs.size(); ++i) values[i] = nodes_[inputs[i].id_]->value;
    }
    const auto recorded = [&](Var var) {
        if (fusion::detail::replay_armed()) [[unlikely]]
            fusion::detail::after_record(*this, generation_, var.id_);
        return var;
    };
    if (!out.defined() && precomputed != nullptr) [[unlikely]] {
        try {
            check_forward_output(def, def.infer(op, input_values, attrs), device, *precomputed);
        } catch (const Error& e) {
            throw GraphError(str(at(), ": the value given for it does not fit: ", e.what()));
        }
        out = *precomputed;
    }
    if (!out.defined()) out = detail::run_forward(def, op, input_values, attrs, saved, nodes_.size(), [&] {
        return str(at(), " with inputs ", describe_inputs(input_values));
    }, [&](std::size_t i) {
        const ComputeNode& n = *nodes_[inputs[i].id_];
        if (!n.parameter.defined()) return describe_node(inputs[i].id_);
        return str("parameter '", n.parameter.name(), "' (", describe_node(inputs[i].id_), ")");
    });

    if (!grad_enabled()) return recorded(add_leaf(out, false, Parameter(), "", where));
    if (nodes_.size() >= std::numeric_limits<NodeId>::max()) throw GraphError("graph is full");
    auto n = std::make_unique<ComputeNode>();
    n->op = op;
    // The versions of everything the backward may read, taken after the forward (a forward that updates an
    // input in place, as batch_norm's running statistics, counts as part of the recording).
    n->inputs.reserve(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) n->inputs.push_back({inputs[i].id_, input_values[i].version()});
    n->attrs = attrs;
    n->value_version = out.version();
    n->value = std::move(out);
    if (!saved.empty()) {  // only the few ops that save extras, which allocate them anyway
        n->saved_versions.reserve(saved.size());
        for (const Tensor& t : saved) n->saved_versions.push_back(t.version());
    }
    n->saved = std::move(saved);
    n->requires_grad = any_requires_grad && def.differentiable;
    n->where = where;
    nodes_.push_back(std::move(n));
    return recorded(Var(anchor_, static_cast<NodeId>(nodes_.size() - 1), generation_));
}

namespace {

// The seed of backward(loss), a one. On a CUDA device each thread keeps one per device and dtype, filled once, so
// a step launches no fill kernel for it (a captured replay starts its backward a node earlier). The engine never
// writes a storage it shares (its in-place additions take only slots owned alone), and without retain_grads the
// root's gradient is dropped after its backward; with it, the caller may keep and write that gradient, so it gets
// a fresh one. The kept one is made outside a capture only: made inside, its block would belong to the capture's
// private pool and its fill would run only on replays (CapturedStep's eager warm-up makes it first).
Tensor unit_seed(const Tensor& value, bool retain_grads) {
    const Device device = value.device();
    if (retain_grads || !device.is_cuda()) return Tensor::ones(value.shape(), value.dtype(), device);
    thread_local std::map<std::pair<int, DType>, Tensor> ones;
    const auto key = std::make_pair(device.index, value.dtype());
    auto kept = ones.find(key);
    if (kept == ones.end()) {
        if (cuda::capturing(device.index)) return Tensor::ones(value.shape(), value.dtype(), device);
        kept = ones.emplace(key, Tensor::ones({1}, value.dtype(), device)).first;
    }
    return kept->second.reshaped(value.shape());
}

}  // namespace

void ComputeGraph::check_own(const Var& var, const char* role) const {
    if (const char* reason = foreign_reason(var))
        throw GraphError(str("backward: the ", role, " (Var #", var.id_, ") ", reason));
}

void ComputeGraph::backward(const Var& loss, const BackwardOptions& options) {
    const Use use(*this, "backward()");
    check_own(loss, "loss");
    const Tensor& value = loss.value();
    if (value.numel() != 1)
        throw GraphError(str("backward: ", describe_node(loss.id_), " has shape ", to_string(value.shape()),
                             "; a non-scalar output needs an explicit gradient: backward(output, grad_output)"));
    run_backward(loss.id_, unit_seed(value, options.retain_grads), options);
}

void ComputeGraph::backward(const Var& output, const Tensor& grad_output, const BackwardOptions& options) {
    const Use use(*this, "backward()");
    check_own(output, "output");
    const Tensor& value = output.value();
    if (!grad_output.defined() || grad_output.shape() != value.shape() || grad_output.dtype() != value.dtype() ||
        grad_output.device() != value.device())
        throw GraphError(str("backward: gradient ", describe(grad_output), " does not match ",
                             describe_node(output.id_), " of ", describe(value)));
    run_backward(output.id_, grad_output, options);
}

void ComputeGraph::run_backward(NodeId root, Tensor seed, const BackwardOptions& options) {
    std::shared_ptr<fusion::BackwardFusion> fused;  // generated backward chains (graph/fusion_replay.h)
    if (fusion::detail::replay_armed() || fusion::fusion_settings().enabled)  // plans in a warm-up, checks in a capture
        fused = fusion::detail::at_backward(*this, generation_, root);
    if (options.create_graph) return detail::HigherOrder::backward(*this, root, seed, options);  // higher_order.cpp
    // The chains stand in for their members' backward: not when the members' own gradients are asked for
    // (retain_grads) or each gradient is inspected (anomaly mode).
    if (options.retain_grads || anomaly_mode_enabled()) fused = nullptr;
    if (saved_released_)
        throw GraphError(str("backward from ", describe_node(root), ": this graph was already back-propagated and ",
                             "its saved tensors were released; pass BackwardOptions{.retain_graph = true} to the ",
                             "earlier backward to run it again"));
    if (!nodes_[root]->requires_grad)
        throw GraphError(str("backward: ", describe_node(root), " does not require grad (no input or parameter ",
                             "that requires grad reaches it)"));
    // Mark what the sweep must visit: nodes reachable from the root that require grad.
    std::vector<char> needed(root + 1, 0);
    needed[root] = 1;
    for (NodeId id = root + 1; id-- > 0;) {
        if (!needed[id]) continue;
        for (NodeId in : nodes_[id]->inputs)
            if (nodes_[in]->requires_grad) needed[in] = 1;
    }
    // Every slot the sweep fills starts empty, so it holds exactly this pass's gradient: intermediates drop
    // the gradients of earlier retained passes, leaves set theirs aside and get them back (plus this pass's)
    // after the sweep. A parameter leaf adds only this pass's gradient into the Parameter: adding the slot
    // with the earlier passes in it counted them again (issue 11, class 1).
    std::vector<std::pair<NodeId, Tensor>> earlier_leaf_grads;
    for (NodeId id = 0; id <= root; ++id) {
        if (!needed[id]) continue;
        ComputeNode& n = *nodes_[id];
        if (n.op == OpType::Leaf && n.grad.defined()) earlier_leaf_grads.emplace_back(id, std::move(n.grad));
        n.grad = Tensor();
    }
    // With a readiness callback: a parameter recorded several times is final at its first (lowest) needed
    // leaf, which the reverse sweep visits last. Mark those leaves (needed[id] = 2).
    if (options.on_parameter_ready) {
        std::unordered_set<const void*> seen;
        for (NodeId id = 0; id <= root; ++id) {
            const ComputeNode& n = *nodes_[id];
            if (needed[id] && n.op == OpType::Leaf && n.parameter.defined() && seen.insert(n.parameter.identity()).second)
                needed[id] = 2;
        }
    }
    try {
        sweep(root, std::move(seed), needed, options, fused.get());
        // Gradients the sweep left pending (a backend's side work) are final before backward() returns.
        device_memory::await_all_writes();
    } catch (...) {
        try {
            device_memory::await_all_writes();
        } catch (...) {
            // The sweep's own error is the one to report.
        }
        restore_leaf_grads(earlier_leaf_grads);
        throw;
    }
    restore_leaf_grads(earlier_leaf_grads);
    if (!options.retain_graph) {
        saved_released_ = true;
        release_parameters();
    }
}

void ComputeGraph::restore_leaf_grads(std::vector<std::pair<NodeId, Tensor>>& earlier) {
    for (auto& [id, grad] : earlier) {
        Tensor& slot = nodes_[id]->grad;
        if (slot.defined()) accumulate_into(grad, std::move(slot));  // out of place when `grad` is shared (a Parameter's)
        slot = std::move(grad);
    }
}

void ComputeGraph::clear() {
    const Use use(*this, "clear()");
    fusion::detail::graph_ended(*this, generation_);
    generation_ = next_generation();  // first: the old handles are stale before their nodes go
    anchor_->generation.store(generation_, std::memory_order_release);
    // Destroy back to front: no recursion is involved, nodes only hold ids.
    while (!nodes_.empty()) nodes_.pop_back();
    saved_released_ = false;
    release_parameters();
}

void ComputeGraph::release_parameters() noexcept {
    for (const Parameter& p : bound_) {
        const std::lock_guard lock(p.state_->binding);
        if (p.state_->graph == this) p.state_->graph = nullptr;
    }
    bound_.clear();
}

Var detach(const Var& x, std::source_location where) {
    return x.graph().constant(x.value(), where);
}

}  // namespace dyngrad
