// ZeRO stage 3 (distributed/zero.h): the units' flat shards, the gather and free around each use, and the one custom op
// that puts a unit into the caller's graph. The op's shape rule gathers the unit and runs its forward (the output's
// shape is only known by running it), its forward kernel hands that output over, and its backward back-propagates
// `grad_output` through the unit, reduce-scatters the unit's gradients into this rank's shards and frees the
// parameters. Two ways (ZeroOptions::recompute):
// - kept (the default, FSDP's): the shape rule records the unit's forward into a nested graph (UnitSession) and
//   frees the gathered memory (Storage::release_memory) while that graph's saved tensors still refer to it; the
//   node keeps the recorded forward (UnitInstance) through a token among its saved tensors, so it lives exactly as
//   long as the node needs it (until its backward without retain_graph, or the caller's graph's clear/destruction);
//   the backward restores the memory, all-gathers into it in place and back-propagates through the nested graph.
// - recomputed: the shape rule runs the forward without recording; the backward gathers again and re-runs it.
// Under autocast each unit's parameter casts are one conversion of a span of its flat (learned from the previous
// forward: State::Unit::cast_spans) whose windows autocast takes as kept copies, and its gradients reach the flat
// buffer in one batched copy: per unit, not per parameter (the GPT's ZeRO-3 step had 2 casts and 2 copies per
// parameter, ~300 small kernels).
// Over 600 lines: the op's shape rule, kernels and both ways share the registry and the recorded-forward types,
// which stay private to this file.
// Custom ops are plain function pointers, so the op finds its unit through a registry keyed by OpAttrs::start (and
// the forward's autocast dtype in OpAttrs::axis, whether its input requires grad in OpAttrs::scalar).
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "dyngrad/core/error.h"
#include "dyngrad/distributed/zero_impl.h"
#include "dyngrad/graph/autocast.h"
#include "dyngrad/graph/custom_op.h"
#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/layout.h"

namespace dyngrad::dist {

namespace {

using State = ZeroOptimizer::State;

struct UnitRef {
    State* state;
    std::size_t unit;
};

std::mutex& registry_mutex() {
    static std::mutex m;
    return m;
}
std::map<std::int64_t, UnitRef>& registry() {
    static std::map<std::int64_t, UnitRef> units;
    return units;
}
std::int64_t next_key() {
    static std::int64_t key = 0;
    return ++key;  // under registry_mutex
}

UnitRef find_unit(const OpAttrs& attrs) {
    const std::lock_guard lock(registry_mutex());
    const auto found = registry().find(attrs.start);
    if (found == registry().end())
        throw GraphError("ZeRO-3 unit: its ZeroOptimizer was destroyed before the graph that recorded the unit ran "
                         "its backward");
    return found->second;
}

// Frees the unit's parameters when the scope ends, also on an exception (unless an enclosing scope gathered them:
// full_parameters(), a checkpoint).
struct GatheredScope {
    State& state;
    State::Unit& unit;
    bool owner;
    GatheredScope(State& s, State::Unit& u) : state(s), unit(u), owner(!u.gathered) { gather_unit(s, u); }
    ~GatheredScope() {
        if (owner) release_unit(state, unit);
    }
    GatheredScope(const GatheredScope&) = delete;
    GatheredScope& operator=(const GatheredScope&) = delete;
};

struct GradModeScope {
    bool previous;
    explicit GradModeScope(bool enabled) : previous(detail::exchange_grad_enabled(enabled)) {}
    ~GradModeScope() { detail::exchange_grad_enabled(previous); }
};

}  // namespace

// The nested graph a unit's recorded forwards share: a Parameter is recorded by one pending graph at a time
// (graph/graph.h), so two forwards of a unit before their backwards (micro-batches summed into one loss) record
// into the same graph. It lives while any of them does.
struct UnitSession {
    ComputeGraph graph;
    int awaiting = 0;     // forwards recorded whose backward has not run (nor will: the instance died)
    bool closed = false;  // a backward without retain_graph ran: its saved tensors are gone, record no more
};

// One recorded forward of a unit, owned by the token its node saves. Destroyed from the token's release (a
// destructor): it touches only its own tensors and the session, never the optimizer's State (it may be gone).
struct UnitInstance {
    std::shared_ptr<UnitSession> session;
    Var input, output;
    NodeId first = 0, end = 0;  // its nodes in the session's graph
    std::vector<Tensor> flats;  // the gathered buffers its parameters' values are windows of, per unit flat
    struct Cast {
        Tensor value;   // a cast node's output (shares that node's storage)
        Tensor source;  // the cast's input: a parameter's window into `flats`
    };
    std::vector<Cast> casts;  // autocast's casts of the gathered parameters, freed and recomputed with them
    struct ReducedSpan {
        Tensor value;        // 16-bit: elements [begin, begin + value.numel()) of `source`, converted
        Tensor source;       // the unit flat's gathered buffer (an entry of `flats`)
        std::int64_t begin;  // elements into `source`
    };
    // The unit's cast spans (State::Unit::cast_spans): the casts of the members inside them are windows of these,
    // freed and converted again as one piece.
    std::vector<ReducedSpan> reduced;
    std::size_t unit = 0;     // its index in State::units
    bool released = false;    // flats and casts freed between the forward and the backward
    bool prefetched = false;  // released, but its flats restored and all-gathered by the next unit's backward
    bool done = false;        // its backward ran
    ~UnitInstance() {
        if (!done && session) --session->awaiting;
    }
};

namespace {

// The token saved by the unit's node: 0 elements, its data pointer the instance it owns.
Tensor instance_token(std::shared_ptr<UnitInstance> instance, Device device) {
    void* at = instance.get();
    return Tensor::from_external(at, {0}, DType::i64, device, [owned = std::move(instance)]() mutable { owned.reset(); });
}

void release_instance(UnitInstance& inst) noexcept {
    // Owned storages (find_casts, all_gather's output): the ValueError of external memory cannot come.
    try {
        for (const auto& cast : inst.casts) cast.value.release_memory();
        for (const auto& span : inst.reduced) span.value.release_memory();
        for (const Tensor& flat : inst.flats) flat.release_memory();
    } catch (...) {
    }
    inst.released = true;
}

// Where a member sits: its unit flat (an index into Unit::flats) and its elements in that flat.
struct MemberPlace {
    std::size_t flat;
    std::int64_t begin, end;
};

// `src` (any floating dtype, elements [begin, begin + dst.numel()) of it) converted into `dst`'s memory.
void convert_into(const Tensor& dst, const Tensor& src, std::int64_t begin, Device device) {
    const std::size_t at = static_cast<std::size_t>(begin) * dtype_size(src.dtype());
    if (device.is_cuda()) {
        device_memory::convert(dst.raw_data(), dst.dtype(), bytes_of(src) + at, src.dtype(), dst.numel(), device.index);
        return;
    }
    const Tensor converted = src.window(begin, {dst.numel()}).to(dst.dtype());
    copy_bytes(bytes_of(dst), converted.raw_data(), converted.nbytes(), device);
}

// Before the unit's forward under autocast to `dtype`: each learned cast span converted into a 16-bit buffer,
// and the members inside it given their windows of it as current kept copies, which autocast takes as the casts'
// values without a kernel (graph/autocast.h).
void cast_spans(State& st, State::Unit& unit, UnitInstance& inst, DType dtype) {
    for (std::size_t k = 0; k < unit.flats.size() && k < unit.cast_spans.size(); ++k) {
        const State::Unit::CastSpan& span = unit.cast_spans[k];
        State::Flat& flat = st.flats[unit.flats[k]];
        if (span.dtype != dtype || span.begin >= span.end || flat.dtype != DType::f32) continue;
        Tensor buffer = Tensor::empty({span.end - span.begin}, dtype, st.device);
        convert_into(buffer, flat.gathered, span.begin, st.device);
        for (auto& m : flat.members) {
            const std::int64_t numel = m.parameter.value().numel();
            if (m.offset >= span.begin && m.offset + numel <= span.end)
                m.parameter.keep_reduced_copy(buffer.window(m.offset - span.begin, m.shape));
        }
        inst.reduced.push_back({std::move(buffer), flat.gathered, span.begin});
    }
}

// After the unit's recorded forward: the autocast casts (in the instance's node range) whose input is one of the
// unit's gathered parameters. Those outside the cast spans (full-size 16-bit copies that matmuls save) are freed
// with the parameters; the spans are learned anew for the next forward: per unit flat, the elements covering
// every member cast to the autocast dtype, widened to 8-element (16-byte) boundaries for vector conversion.
void find_casts(State& st, State::Unit& unit, UnitInstance& inst, const std::map<const void*, MemberPlace>& members,
                std::optional<DType> autocast) {
    const ComputeGraph& graph = inst.session->graph;
    std::vector<State::Unit::CastSpan> learned(unit.flats.size());
    for (auto& span : learned) {
        span.dtype = autocast.value_or(DType::f32);
        span.begin = INT64_MAX;
        span.end = 0;
    }
    const auto in_reduced = [&](const Tensor& value) {
        const auto* at = static_cast<const char*>(value.raw_data());
        for (const auto& r : inst.reduced) {
            const auto* begin = static_cast<const char*>(r.value.raw_data());
            if (at >= begin && at < begin + r.value.nbytes()) return true;
        }
        return false;
    };
    for (NodeId id = inst.first; id < inst.end; ++id) {
        const ComputeNode& node = graph.node(id);
        if (node.op != OpType::Cast || node.inputs.size() != 1 || id == inst.output.id()) continue;
        const ComputeNode& source = graph.node(node.inputs[0]);
        if (source.op != OpType::Leaf || !source.parameter.defined()) continue;
        const auto place = members.find(source.parameter.identity());
        if (place == members.end()) continue;
        if (node.value.external() || node.value.shares_storage_with(source.value) || node.value.numel() == 0) continue;
        if (autocast && node.value.dtype() == *autocast && st.flats[unit.flats[place->second.flat]].dtype == DType::f32) {
            auto& span = learned[place->second.flat];
            span.begin = std::min(span.begin, place->second.begin);
            span.end = std::max(span.end, place->second.end);
        }
        if (!in_reduced(node.value)) inst.casts.push_back({node.value, source.value});
    }
    for (std::size_t k = 0; k < learned.size(); ++k) {
        auto& span = learned[k];
        if (span.begin >= span.end) {
            span.begin = span.end = 0;
            continue;
        }
        const std::int64_t padded = st.flats[unit.flats[k]].gathered.numel();
        span.begin -= span.begin % 8;
        span.end = std::min(padded, (span.end + 7) / 8 * 8);
    }
    unit.cast_spans = std::move(learned);
}

// The unit's averaged gradients into this rank's shards (added when this step already has some), the
// parameters' own gradients dropped.
void reduce_unit(State& st, State::Unit& unit) {
    const int world = st.group.world_size(), rank = st.group.rank();
    for (std::size_t f : unit.flats) {
        State::Flat& flat = st.flats[f];
        Tensor full = Tensor::zeros({world * flat.shard}, flat.dtype, st.device);
        std::vector<GradientPlace> grads;
        for (auto& m : flat.members) {
            const Tensor& grad = m.parameter.grad();
            if (!grad.defined()) continue;
            if (grad.dtype() != flat.dtype || grad.shape() != m.shape)
                throw DTypeError(str("ZeRO-3 unit '", unit.name, "' (rank ", rank, "/", world, "): the gradient of '",
                                     m.name, "' is ", dtype_name(grad.dtype()), " ", to_string(grad.shape()),
                                     ", its parameter ", dtype_name(flat.dtype), " ", to_string(m.shape)));
            grads.push_back({grad, m.offset});  // keeps the gradient alive until the copy is queued
            m.parameter.zero_grad();
        }
        gradients_into_flat(full, grads, st.device);
        Tensor shard = Tensor::empty({flat.shard}, flat.dtype, st.device);
        st.group.reduce_scatter(full, shard, ReduceOp::Avg);
        const Tensor& earlier = flat.shard_param.grad();
        flat.shard_param.grad_slot() = flat.accumulating && earlier.defined() ? add(earlier, shard) : shard;
        flat.accumulating = true;
    }
}

// ---- ZeroOptions::prefetch ----
// A prefetch is one or more all-gathers into buffers allocated on dyngrad's stream. On CUDA they go on the
// communication stream, which first waits for everything queued on dyngrad's stream (the collective before them
// included) and which dyngrad's stream waits for before its next collective (hand_back): the collectives of every
// rank's device keep the order the host issued them in, while the unit's own kernels overlap them. Without streams
// (the CPU) the all-gathers run at once.
class Prefetch {
public:
    Prefetch(State& st, std::size_t event) : st_(st), event_(event) {}
    ~Prefetch() {
        try {
            hand_back();
        } catch (...) {  // the communicator failed: its next use says so
        }
    }
    Prefetch(const Prefetch&) = delete;
    Prefetch& operator=(const Prefetch&) = delete;
    void all_gather(const Tensor& shard, Tensor& output, const std::string& unit_name) {
        if (!st_.streams) {
            st_.group.all_gather(shard, output);
            return;
        }
        ProcessGroup::Impl& g = st_.group.impl();
        const std::string what = g.what(str("ZeRO-3 prefetch of unit '", unit_name, "': all_gather"), shard);
        NcclComm& comm = g.nccl_for(shard, what);
        if (!on_comm_) {
            hand_bucket_to_comm(*st_.streams, event_);
            on_comm_ = true;
        }
        nccl_all_gather(comm, shard.raw_data(), output.raw_data(), static_cast<std::size_t>(shard.numel()), shard.dtype(),
                        comm_stream(*st_.streams), what);
    }
    // dyngrad's stream waits for the prefetch (before the next collective, or the prefetched memory's first use).
    void hand_back() {
        if (!on_comm_) return;
        on_comm_ = false;
        hand_bucket_back(*st_.streams, event_);
    }

private:
    State& st_;
    std::size_t event_;
    bool on_comm_ = false;
};

bool prefetching(const State& st) { return st.prefetch && st.group.world_size() > 1; }

// Forward: the next unit's shards gathered into fresh buffers (State::prefetched), which its gather adopts.
void prefetch_forward(State& st, std::size_t next, Prefetch& prefetch) {
    if (!prefetching(st) || next >= st.units.size() || st.units[next].gathered || !st.prefetched[next].empty()) return;
    State::Unit& unit = st.units[next];
    std::vector<Tensor> buffers;
    for (std::size_t f : unit.flats)  // allocated on dyngrad's stream before the hand-off
        buffers.push_back(Tensor::empty({st.group.world_size(), st.flats[f].shard}, st.flats[f].dtype, st.device));
    for (std::size_t k = 0; k < unit.flats.size(); ++k)
        prefetch.all_gather(st.flats[unit.flats[k]].shard_param.value(), buffers[k], unit.name);
    // Counted as gathered from now (the unit's gather adopts them without counting again; dropped: uncounted).
    for (const Tensor& b : buffers) st.gathered_bytes += static_cast<std::int64_t>(b.nbytes());
    st.gathered_peak_bytes = std::max(st.gathered_peak_bytes, st.gathered_bytes);
    st.prefetched[next] = std::move(buffers);
}

// Backward: the latest recorded forward of unit `previous` that awaits its backward gets its released buffers back
// and all-gathered into (the restore its own backward would make first).
void prefetch_backward(State& st, std::size_t previous, Prefetch& prefetch) {
    if (!prefetching(st)) return;
    std::shared_ptr<UnitInstance> inst;
    for (auto it = st.instances.rbegin(); it != st.instances.rend() && !inst; ++it)
        if (auto alive = it->lock(); alive && alive->unit == previous && !alive->done) inst = std::move(alive);
    if (!inst || !inst->released || inst->prefetched) return;
    const State::Unit& unit = st.units[previous];
    for (Tensor& buffer : inst->flats) buffer.restore_memory();  // on dyngrad's stream, before the hand-off
    inst->prefetched = true;  // from here on its buffers hold the gather (or the communicator failed for good)
    for (std::size_t k = 0; k < unit.flats.size(); ++k)
        prefetch.all_gather(st.flats[unit.flats[k]].shard_param.value(), inst->flats[k], unit.name);
}

}  // namespace

void drop_prefetched(State& st) noexcept {
    for (auto& buffers : st.prefetched) {  // handed back already: dyngrad's stream waited for them
        for (const Tensor& b : buffers) st.gathered_bytes -= static_cast<std::int64_t>(b.nbytes());
        buffers.clear();
    }
}

namespace {

// Records the unit's forward into its session's graph (kept), the gathered memory freed after it.
std::shared_ptr<UnitInstance> record_unit(State& st, State::Unit& unit, const Tensor& x, bool wants) {
    std::shared_ptr<UnitSession> session = unit.session.lock();
    if (!session || session->closed) {
        session = std::make_shared<UnitSession>();
        unit.session = session;
    }
    auto inst = std::make_shared<UnitInstance>();
    inst->session = session;
    inst->unit = static_cast<std::size_t>(&unit - st.units.data());
    ++session->awaiting;
    bool owner = false;
    {
        const GatheredScope gathered(st, unit);
        owner = gathered.owner;  // else an enclosing scope uses the buffers: they stay resident
        for (std::size_t f : unit.flats) inst->flats.push_back(st.flats[f].gathered);
        // The next unit's gather beside this unit's forward (handed back when the scope ends).
        Prefetch prefetch(st, inst->unit + 1);
        prefetch_forward(st, inst->unit + 1, prefetch);
        const std::optional<DType> autocast = autocast_dtype();
        // Only where autocast takes kept copies (DYNGRAD_AUTOCAST_PARAMETER_COPIES=0 turns them off): else it casts anyway.
        if (autocast && is_reduced_precision(*autocast) && autocast_parameter_copies())
            cast_spans(st, unit, *inst, *autocast);
        const GradModeScope with_grad(true);
        inst->first = static_cast<NodeId>(session->graph.size());
        inst->input = session->graph.input(x, "", wants);
        inst->output = unit.forward(inst->input);
        if (!inst->output.defined() || &inst->output.graph() != &session->graph)
            throw GraphError(str("ZeRO-3 unit '", unit.name, "': its forward must return a Var of the graph it was given"));
        inst->end = static_cast<NodeId>(session->graph.size());
        std::map<const void*, MemberPlace> members;
        for (std::size_t k = 0; k < unit.flats.size(); ++k)
            for (const auto& m : st.flats[unit.flats[k]].members)
                members[m.parameter.identity()] = {k, m.offset, m.offset + m.parameter.value().numel()};
        find_casts(st, unit, *inst, members, autocast);
    }
    if (owner) release_instance(*inst);
    st.instances.erase(std::remove_if(st.instances.begin(), st.instances.end(), [](const auto& w) { return w.expired(); }),
                       st.instances.end());
    st.instances.push_back(inst);
    return inst;
}

OutputSpec unit_infer(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const UnitRef ref = find_unit(attrs);
    State::Unit& unit = ref.state->units[ref.unit];
    if (!ref.state->recompute && grad_enabled()) {  // under NoGradGuard nothing is kept: no backward will come
        const bool wants = attrs.scalar != 0 && is_floating(inputs[0].dtype());
        unit.pending_instance = record_unit(*ref.state, unit, inputs[0], wants);
        unit.pending = unit.pending_instance->output.value();
        return {unit.pending.shape(), unit.pending.dtype()};
    }
    const GatheredScope gathered(*ref.state, unit);
    const GradModeScope no_grad(false);
    ComputeGraph graph;
    const Var out = unit.forward(graph.constant(inputs[0]));  // inputs[1]: the anchor, 0 elements
    if (!out.defined() || &out.graph() != &graph)
        throw GraphError(str("ZeRO-3 unit '", unit.name, "': its forward must return a Var of the graph it was given"));
    unit.pending = out.value();
    return {unit.pending.shape(), unit.pending.dtype()};
}

Tensor unit_forward(const ForwardArgs& args) {
    const UnitRef ref = find_unit(args.attrs);
    State::Unit& unit = ref.state->units[ref.unit];
    Tensor out = std::move(unit.pending);
    unit.pending = Tensor();
    if (!out.defined()) throw GraphError(str("ZeRO-3 unit '", unit.name, "': forward without its shape rule"));
    if (std::shared_ptr<UnitInstance> inst = std::move(unit.pending_instance))
        args.saved.push_back(instance_token(std::move(inst), out.device()));
    return out;
}

// The instance's memory back for its backward: the gathered buffers restored and all-gathered into in place (the
// nested graph's saved windows read them), the unit's parameters their windows again, the casts recomputed (the
// cast op's own kernel, Tensor::to). Freed again when the scope ends, also on an exception.
struct RestoredScope {
    State& st;
    State::Unit& unit;
    UnitInstance& inst;
    bool owner;  // the unit's gathered state is ours (no enclosing scope)
    RestoredScope(State& s, State::Unit& u, UnitInstance& i) : st(s), unit(u), inst(i), owner(!u.gathered) {
        if (!inst.released) return;
        try {
            if (owner) unit.gathered = true;  // first: a failed gather below is undone by release_unit
            for (std::size_t k = 0; k < unit.flats.size(); ++k) {
                State::Flat& flat = st.flats[unit.flats[k]];
                Tensor& buffer = inst.flats[k];
                if (!inst.prefetched) {  // else the next unit's backward restored and gathered it already
                    buffer.restore_memory();
                    st.group.all_gather(flat.shard_param.value(), buffer);
                }
                if (!owner) continue;
                flat.gathered = buffer;
                for (auto& m : flat.members) m.parameter.value() = buffer.window(m.offset, m.shape);
                st.gathered_bytes += static_cast<std::int64_t>(buffer.nbytes());
            }
            st.gathered_peak_bytes = std::max(st.gathered_peak_bytes, st.gathered_bytes);
            for (const auto& span : inst.reduced) {
                span.value.restore_memory();
                convert_into(span.value, span.source, span.begin, st.device);
            }
            for (const auto& cast : inst.casts) {
                cast.value.restore_memory();
                const Tensor fresh = cast.source.to(cast.value.dtype());
                copy_bytes(bytes_of(cast.value), fresh.raw_data(), fresh.nbytes(), st.device);
            }
        } catch (...) {
            free();
            throw;
        }
    }
    ~RestoredScope() {
        if (inst.released) free();
    }
    void free() noexcept {
        if (owner) release_unit(st, unit);
        release_instance(inst);
    }
    RestoredScope(const RestoredScope&) = delete;
    RestoredScope& operator=(const RestoredScope&) = delete;
};

Tensor backward_kept(State& st, State::Unit& unit, const BackwardArgs& args) {
    if (args.saved.size() != 1) throw GraphError(str("ZeRO-3 unit '", unit.name, "': its node lost its recorded forward"));
    UnitInstance& inst = *static_cast<UnitInstance*>(args.saved[0].raw_data());
    if (inst.done)
        throw GraphError(str("ZeRO-3 unit '", unit.name, "': a second backward through the unit's recorded forward "
                             "(retain_graph) needs ZeroOptions::recompute (its graph is back-propagated once)"));
    inst.done = true;
    UnitSession& session = *inst.session;
    // Another forward of this unit awaiting its backward shares the graph: keep its saved tensors for it.
    const bool retain = --session.awaiting > 0;
    if (!retain) session.closed = true;
    Tensor grad_input;
    {
        const RestoredScope restored(st, unit, inst);
        inst.prefetched = false;
        // The previous unit's gather beside this unit's backward, handed back before the reduce-scatter.
        Prefetch prefetch(st, inst.unit);
        if (inst.unit > 0) prefetch_backward(st, inst.unit - 1, prefetch);
        session.graph.backward(inst.output, args.grad_output, {.retain_graph = retain});
        if (args.needs_grad[0] && inst.input.requires_grad()) grad_input = inst.input.grad();
        prefetch.hand_back();
        reduce_unit(st, unit);
    }
    return grad_input;
}

std::vector<Tensor> unit_backward(const BackwardArgs& args) {
    const UnitRef ref = find_unit(args.attrs);
    State& st = *ref.state;
    State::Unit& unit = st.units[ref.unit];
    Tensor grad_input;
    if (!args.saved.empty()) {
        grad_input = backward_kept(st, unit, args);
    } else {
        const GatheredScope gathered(st, unit);
        const GradModeScope with_grad(true);
        // The forward's autocast setting (OpAttrs::axis, see forward()): the recomputation must be the same function.
        const AutocastGuard autocast(args.attrs.axis >= 0 ? static_cast<DType>(args.attrs.axis) : DType::f32);
        ComputeGraph graph;
        const bool wants = args.needs_grad[0];
        const Var input = graph.input(args.inputs[0], "", wants);
        const Var out = unit.forward(input);  // recomputed: the activations inside the unit were not kept
        for (NodeId id = 0; id < graph.size(); ++id)  // a second draw would differ from the forward's
            if (graph.node(id).op == OpType::Dropout && graph.node(id).attrs.training && graph.node(id).attrs.scalar > 0)
                throw ValueError(str("ZeRO-3 unit '", unit.name, "' records a dropout: with ZeroOptions::recompute its "
                                     "forward runs twice and must be deterministic (recompute = false keeps it)"));
        graph.backward(out, args.grad_output);
        if (wants) grad_input = input.grad();
        reduce_unit(st, unit);
    }
    return {grad_input, Tensor::zeros({0}, args.inputs[1].dtype(), args.inputs[1].device())};
}

const CustomOp& unit_op() {
    static const CustomOp op = CustomOp::define({
        .name = "zero3_unit",
        .arity = 2,  // the unit's input and its anchor (see forward())
        .infer = unit_infer,
        // The kernels are host code over dyngrad ops: the same for both backends, any dtype.
        .cpu = {.forward = unit_forward, .backward = unit_backward, .native_reduced = true},
        .cuda = {.forward = unit_forward, .backward = unit_backward, .native_reduced = true},
    });
    return op;
}

}  // namespace

void gather_unit(State& st, State::Unit& unit) {
    if (unit.gathered) return;
    // A forward prefetch made during the previous unit's forward (ZeroOptions::prefetch): its buffers, handed back.
    const auto index = static_cast<std::size_t>(&unit - st.units.data());
    std::vector<Tensor> prefetched;
    if (index < st.prefetched.size()) std::swap(prefetched, st.prefetched[index]);
    for (std::size_t k = 0; k < unit.flats.size(); ++k) {
        State::Flat& flat = st.flats[unit.flats[k]];
        // (W, S): the padded flat buffer
        flat.gathered = prefetched.empty() ? st.group.all_gather(flat.shard_param.value()) : prefetched[k];
        // Windows of the buffer (core/tensor.h): a recorded forward's saved values follow its release and restore.
        for (auto& m : flat.members) m.parameter.value() = flat.gathered.window(m.offset, m.shape);
        if (prefetched.empty()) st.gathered_bytes += flat.gathered.nbytes();  // a prefetch counted its own
    }
    unit.gathered = true;
    st.gathered_peak_bytes = std::max(st.gathered_peak_bytes, st.gathered_bytes);
}

void release_unit(State& st, State::Unit& unit) {
    if (!unit.gathered) return;
    for (std::size_t f : unit.flats) {
        State::Flat& flat = st.flats[f];
        // 0 elements, its dtype and device kept: a unit called outside zero.forward fails on the shape.
        // Autocast's kept 16-bit copy (graph/autocast.h) would hold a full-size copy of a sharded parameter.
        for (auto& m : flat.members) {
            m.parameter.value() = Tensor::empty({0}, flat.dtype, st.device);
            m.parameter.drop_reduced_copy();
        }
        st.gathered_bytes -= flat.gathered.nbytes();
        flat.gathered = Tensor();
    }
    unit.gathered = false;
}

AllUnitsGathered::AllUnitsGathered(State& s) : state(s) {
    for (auto& unit : state.units) gather_unit(state, unit);
}
AllUnitsGathered::~AllUnitsGathered() {
    for (auto& unit : state.units) release_unit(state, unit);
}

void kept_bytes(const State& st, ZeroMemory& m) {
    std::set<std::weak_ptr<const Storage>, std::owner_less<>> seen;  // each storage counted once
    const auto count = [&](const Tensor& t, bool parameters) {
        if (!t.defined() || !seen.insert(t.storage_reference()).second) return;
        const auto bytes = static_cast<std::int64_t>(t.nbytes());
        if (parameters) (t.resident() ? m.kept_parameter_bytes : m.released_bytes) += bytes;
        else if (t.resident()) m.kept_activation_bytes += bytes;
    };
    for (const auto& weak : st.instances) {
        const std::shared_ptr<UnitInstance> inst = weak.lock();
        if (!inst || inst->done) continue;
        for (const Tensor& flat : inst->flats) count(flat, true);
        for (const auto& cast : inst->casts) count(cast.value, true);
        for (const auto& span : inst->reduced) count(span.value, true);
        // The parameters' windows, the unit's input and output: counted above, or the caller's graph holds them.
        const ComputeGraph& graph = inst->session->graph;
        for (NodeId id = inst->first; id < inst->end; ++id)
            if (graph.node(id).op == OpType::Leaf || id == inst->output.id()) seen.insert(graph.node(id).value.storage_reference());
        for (NodeId id = inst->first; id < inst->end; ++id) {
            count(graph.node(id).value, false);
            for (const Tensor& saved : graph.node(id).saved) count(saved, false);
        }
    }
}

void unregister_units(State& st) noexcept {
    const std::lock_guard lock(registry_mutex());
    for (const auto& unit : st.units) registry().erase(unit.key);
}

ZeroOptimizer::ZeroOptimizer(std::vector<ZeroUnit> units, ProcessGroup group, const AdamOptions& options,
                             ZeroOptions zero)
    : group_(std::move(group)), zero_(zero), state_(std::make_unique<State>()) {
    if (zero_.stage != 3)
        throw ValueError(str("ZeroOptimizer: a list of units is for stage 3, got stage ", zero_.stage,
                             " (stages 1 and 2 take the Module)"));
    if (zero_.overlap) throw ValueError("ZeroOptimizer: overlap is for stage 1; stage 3 reduces per unit");
    if (zero_.prefetch.value_or(false) && zero_.recompute)
        throw ValueError("ZeroOptimizer (stage 3): prefetch is for the kept forward; with recompute each unit's forward "
                         "runs again in its backward (not prefetched)");
    if (units.empty()) throw ValueError("ZeroOptimizer (stage 3): no units");
    std::set<std::string> names;
    for (const auto& unit : units) {
        if (unit.name.empty() || unit.name.find('.') != std::string::npos || !names.insert(unit.name).second)
            throw ValueError(str("ZeroOptimizer (stage 3): unit name '", unit.name,
                                 "' is empty, has a dot or is used twice"));
        if (!unit.forward) throw ValueError(str("ZeroOptimizer (stage 3): unit '", unit.name, "' has no forward"));
        if (unit.stochastic && zero_.recompute)
            throw ValueError(str("ZeroOptimizer (stage 3): unit '", unit.name, "' is stochastic (dropout): with "
                                 "recompute its forward runs twice and must give the same result; use recompute = false"));
        module_.register_module(unit.name, unit.module);
    }
    check_and_broadcast("ZeroOptimizer (stage 3)");
    State& st = *state_;
    st.group = group_;
    st.recompute = zero_.recompute;
    st.prefetch = zero_.prefetch.value_or(!zero_.recompute);
    for (const auto& [name, p] : module_.named_parameters())
        if (p.requires_grad()) st.identities.push_back(p.identity());
    std::set<const void*> seen;
    for (auto& given : units) {
        State::Unit unit;
        unit.name = given.name;
        unit.module = given.module;
        unit.forward = std::move(given.forward);
        unit.stochastic = given.stochastic;
        const std::size_t first = st.flats.size();
        for (const auto& [name, p] : unit.module.named_parameters()) {
            if (!p.requires_grad()) continue;
            const std::string full = str(unit.name, ".", name);
            if (!seen.insert(p.identity()).second)
                throw ValueError(str("ZeroOptimizer (stage 3): '", full, "' is also in an earlier unit; a parameter "
                                     "belongs to one unit (its gather and reduction are the unit's)"));
            add_member(st, first, full, p);
        }
        for (std::size_t f = first; f < st.flats.size(); ++f) unit.flats.push_back(f);
        st.units.push_back(std::move(unit));
    }
    make_shards(st, group_.rank(), group_.world_size(), options, false);
    st.prefetched.resize(st.units.size());
    if (st.prefetch && st.device.is_cuda() && group_.world_size() > 1)
        st.streams = make_comm_streams(st.device.index, st.units.size());
    unit_op();  // registered once per process, before any graph records it
    {
        const std::lock_guard lock(registry_mutex());
        for (std::size_t i = 0; i < st.units.size(); ++i) {
            st.units[i].key = next_key();
            registry()[st.units[i].key] = {&st, i};
        }
    }
    // The full values are in the shards now: free them.
    for (auto& flat : st.flats)
        // Autocast's kept 16-bit copy (graph/autocast.h) would hold a full-size copy of a sharded parameter.
        for (auto& m : flat.members) {
            m.parameter.value() = Tensor::empty({0}, flat.dtype, st.device);
            m.parameter.drop_reduced_copy();
            // Counted as updated (until the destructor), so that autocast takes their kept 16-bit copies
            // (graph/autocast.h): the windows of the unit's cast spans (find_casts), made current at each forward.
            m.parameter.count_updater(1);
        }
}

Var ZeroOptimizer::forward(const Var& input) {
    if (zero_.stage != 3)
        throw ValueError(str("ZeroOptimizer::forward: for stage 3 (units); stage ", zero_.stage,
                             " runs the model itself"));
    check_module_unchanged("forward");
    Var x = input;
    OpAttrs attrs;
    const std::optional<DType> autocast = autocast_dtype();
    attrs.axis = autocast ? static_cast<std::int64_t>(*autocast) : -1;
    for (auto& unit : state_->units) {
        attrs.start = unit.key;
        attrs.scalar = x.requires_grad() ? 1.0 : 0.0;  // the kept forward records its input as needing grad or not
        // The node must require grad for the sweep to reach it, though the model's parameters are not its inputs:
        // a 0-element parameter per unit is. Its dtype follows x's (bf16 beside f32 is refused by the engine).
        const DType dtype = is_floating(x.dtype()) ? x.dtype() : DType::f32;
        if (!unit.anchor.defined() || unit.anchor.value().dtype() != dtype || unit.anchor.value().device() != x.device())
            unit.anchor = Parameter(Tensor::zeros({0}, dtype, x.device()), str("zero3.anchor.", unit.name));
        x = unit_op()({x, x.graph().parameter(unit.anchor)}, attrs);
    }
    return x;
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::full_parameters() {
    std::vector<std::pair<std::string, Tensor>> out;
    State& st = *state_;
    if (zero_.stage != 3) {
        for (const auto& [name, p] : module_.named_parameters()) out.emplace_back(name, p.value());
        return out;
    }
    for (auto& unit : st.units) {
        const GatheredScope gathered(st, unit);
        for (std::size_t f : unit.flats)
            for (const auto& m : st.flats[f].members) out.emplace_back(m.name, m.parameter.value());
    }
    return out;  // the views keep their gathered buffers alive after the release
}

std::vector<ZeroUnit> gpt_units(const GPT& model) {
    if (model.config.tie_embeddings)
        throw ValueError("gpt_units: the GPT's LM head is its token embedding, which two units would hold");
    if (model.config.reduced_residual)
        throw ValueError("gpt_units: the GPT's reduced_residual is set; the units run the float32 residual stream "
                         "(PyTorch's autocast recipe)");
    std::vector<ZeroUnit> units;
    Module embed;
    embed.register_module("token_embedding", model.token_embedding);
    embed.register_module("position_embedding", model.position_embedding);
    const bool stochastic = model.config.dropout != 0;
    units.push_back({"embed", embed,
                     [tokens = model.token_embedding, positions = model.position_embedding,
                      dropout = model.embedding_dropout()](const Var& x) { return dropout(positions(tokens(x))); },
                     stochastic});
    for (std::size_t i = 0; i < model.blocks.size(); ++i)
        units.push_back({str("block", i), model.blocks[i], [block = model.blocks[i]](const Var& x) { return block(x); },
                         stochastic});
    Module head;
    head.register_module("ln_f", model.ln_f);
    head.register_module("lm_head", model.lm_head);
    units.push_back({"head", head, [ln = model.ln_f, lm = model.lm_head](const Var& x) {
                         const Shape s = x.shape();
                         return reshape(lm(reshape(ln(x), {s[0] * s[1], s[2]})), {s[0], s[1], lm.weight.value().size(0)});
                     }});
    return units;
}

}  // namespace dyngrad::dist
