// ZeRO stage 3 (distributed/zero.h): the units' flat shards, the gather and free around each use, and the one custom op
// that puts a unit into the caller's graph. The op's shape rule gathers the unit and runs its forward without
// recording (the output's shape is only known by running it), its forward kernel hands that output over, and its
// backward gathers again, re-runs the unit in a graph of its own, back-propagates `grad_output`, reduce-scatters
// the unit's gradients into this rank's shards and frees the parameters. Custom ops are plain function pointers,
// so the op finds its unit through a registry keyed by OpAttrs::start (and the forward's autocast dtype in
// OpAttrs::axis, for the recomputation).
#include <algorithm>
#include <map>
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

// The unit's averaged gradients into this rank's shards (added when this step already has some), the
// parameters' own gradients dropped.
void reduce_unit(State& st, State::Unit& unit) {
    const int world = st.group.world_size(), rank = st.group.rank();
    for (std::size_t f : unit.flats) {
        State::Flat& flat = st.flats[f];
        Tensor full = Tensor::zeros({world * flat.shard}, flat.dtype, st.device);
        const std::size_t size = dtype_size(flat.dtype);
        for (auto& m : flat.members) {
            const Tensor& grad = m.parameter.grad();
            if (!grad.defined()) continue;
            if (grad.dtype() != flat.dtype || grad.shape() != m.shape)
                throw DTypeError(str("ZeRO-3 unit '", unit.name, "' (rank ", rank, "/", world, "): the gradient of '",
                                     m.name, "' is ", dtype_name(grad.dtype()), " ", to_string(grad.shape()),
                                     ", its parameter ", dtype_name(flat.dtype), " ", to_string(m.shape)));
            copy_bytes(bytes_of(full) + m.offset * size, grad.raw_data(), grad.nbytes(), st.device);
            m.parameter.zero_grad();
        }
        Tensor shard = Tensor::empty({flat.shard}, flat.dtype, st.device);
        st.group.reduce_scatter(full, shard, ReduceOp::Avg);
        const Tensor& earlier = flat.shard_param.grad();
        flat.shard_param.grad_slot() = flat.accumulating && earlier.defined() ? add(earlier, shard) : shard;
        flat.accumulating = true;
    }
}

OutputSpec unit_infer(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const UnitRef ref = find_unit(attrs);
    State::Unit& unit = ref.state->units[ref.unit];
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
    return out;
}

std::vector<Tensor> unit_backward(const BackwardArgs& args) {
    const UnitRef ref = find_unit(args.attrs);
    State& st = *ref.state;
    State::Unit& unit = st.units[ref.unit];
    Tensor grad_input;
    {
        const GatheredScope gathered(st, unit);
        const GradModeScope with_grad(true);
        // The forward's autocast setting (OpAttrs::axis, see forward()): the recomputation must be the same function.
        const AutocastGuard autocast(args.attrs.axis >= 0 ? static_cast<DType>(args.attrs.axis) : DType::f32);
        ComputeGraph graph;
        const bool wants = args.needs_grad[0];
        const Var input = graph.input(args.inputs[0], "", wants);
        const Var out = unit.forward(input);  // recomputed: the activations inside the unit were not kept
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
    for (std::size_t f : unit.flats) {
        State::Flat& flat = st.flats[f];
        flat.gathered = st.group.all_gather(flat.shard_param.value());  // (W, S): the padded flat buffer
        for (auto& m : flat.members) m.parameter.value() = view_of(flat.gathered, m.offset, m.shape);
        st.gathered_bytes += flat.gathered.nbytes();
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
    if (units.empty()) throw ValueError("ZeroOptimizer (stage 3): no units");
    std::set<std::string> names;
    for (const auto& unit : units) {
        if (unit.name.empty() || unit.name.find('.') != std::string::npos || !names.insert(unit.name).second)
            throw ValueError(str("ZeroOptimizer (stage 3): unit name '", unit.name,
                                 "' is empty, has a dot or is used twice"));
        if (!unit.forward) throw ValueError(str("ZeroOptimizer (stage 3): unit '", unit.name, "' has no forward"));
        module_.register_module(unit.name, unit.module);
    }
    check_and_broadcast("ZeroOptimizer (stage 3)");
    State& st = *state_;
    st.group = group_;
    for (const auto& [name, p] : module_.named_parameters())
        if (p.requires_grad()) st.identities.push_back(p.identity());
    std::set<const void*> seen;
    for (auto& given : units) {
        State::Unit unit{given.name, given.module, std::move(given.forward), {}, 0, false, {}, {}};
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
    if (model.config.dropout != 0)
        throw ValueError(str("gpt_units: the GPT's dropout is ", model.config.dropout, "; ZeRO-3 runs each unit's forward "
                             "again in the backward, so it needs dropout 0"));
    if (model.config.tie_embeddings)
        throw ValueError("gpt_units: the GPT's LM head is its token embedding, which two units would hold");
    if (model.config.reduced_residual)
        throw ValueError("gpt_units: the GPT's reduced_residual is set; the units run the float32 residual stream "
                         "(PyTorch's autocast recipe)");
    std::vector<ZeroUnit> units;
    Module embed;
    embed.register_module("token_embedding", model.token_embedding);
    embed.register_module("position_embedding", model.position_embedding);
    units.push_back({"embed", embed, [tokens = model.token_embedding, positions = model.position_embedding](
                                         const Var& x) { return positions(tokens(x)); }});
    for (std::size_t i = 0; i < model.blocks.size(); ++i)
        units.push_back({str("block", i), model.blocks[i], [block = model.blocks[i]](const Var& x) { return block(x); }});
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
