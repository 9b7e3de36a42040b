// ZeroOptimizer (distributed/zero.h): the flat per-dtype layout, the gradient reduction (all_reduce for stage 1,
// reduce_scatter for stage 2), the global norm over shards, the shard-local AdamW step and the all_gather.
#include "dyngrad/distributed/zero.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/core/error.h"
#include "dyngrad/distributed/group_impl.h"
#include "dyngrad/distributed/zero_impl.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/reduce.h"

namespace dyngrad::dist {

void copy_bytes(void* dst, const void* src, std::size_t bytes, Device device) {
    if (bytes == 0 || dst == src) return;
    if (device.is_cuda()) device_memory::copy(dst, device, src, device, bytes);
    else std::memcpy(dst, src, bytes);
}

void copy_ranges(std::span<const device_memory::CopyRange> ranges, Device device) {
    if (device.is_cuda()) return device_memory::copy_ranges(ranges, device.index);
    for (const auto& r : ranges)
        if (r.bytes > 0 && r.dst != r.src) std::memcpy(r.dst, r.src, r.bytes);
}

void gradients_into_flat(const Tensor& full, const std::vector<GradientPlace>& grads, Device device) {
    std::vector<device_memory::CopyRange> ranges;
    ranges.reserve(grads.size());
    const std::size_t size = dtype_size(full.dtype());
    // dyngrad tensors are contiguous row-major (views are reshapes), so the bytes are the elements.
    for (const auto& [grad, offset] : grads)
        ranges.push_back({bytes_of(full) + offset * static_cast<std::int64_t>(size), grad.raw_data(), grad.nbytes()});
    copy_ranges(ranges, device);
}

char* bytes_of(const Tensor& t) { return static_cast<char*>(const_cast<void*>(t.raw_data())); }

void copy_overlap(const ZeroOptimizer::State::Member& m, const Tensor& member_tensor, const Tensor& shard_tensor,
                  std::int64_t shard, int rank, bool into_shard, Device device) {
    const std::int64_t begin = std::max(m.offset, rank * shard);
    const std::int64_t end = std::min(m.offset + member_tensor.numel(), (rank + 1) * shard);
    if (begin >= end) return;
    const std::size_t size = dtype_size(member_tensor.dtype());
    char* in_member = bytes_of(member_tensor) + (begin - m.offset) * size;
    char* in_shard = bytes_of(shard_tensor) + (begin - rank * shard) * size;
    const std::size_t bytes = static_cast<std::size_t>(end - begin) * size;
    if (into_shard) copy_bytes(in_shard, in_member, bytes, device);
    else copy_bytes(in_member, in_shard, bytes, device);
}

// Tensor::narrow copies; a view lets stage 1's model gradients share the averaged buffer instead of doubling it.
Tensor view_of(const Tensor& flat, std::int64_t offset, const Shape& shape) {
    void* at = bytes_of(flat) + offset * static_cast<std::int64_t>(dtype_size(flat.dtype()));
    return Tensor::from_external(at, shape, flat.dtype(), flat.device(), [keep = flat]() {});
}

void add_member(ZeroOptimizer::State& st, std::size_t first_flat, const std::string& name, const Parameter& p) {
    const DType dtype = p.value().dtype();
    auto flat = std::find_if(st.flats.begin() + static_cast<std::ptrdiff_t>(first_flat), st.flats.end(),
                             [&](const ZeroOptimizer::State::Flat& f) { return f.dtype == dtype; });
    if (flat == st.flats.end()) {
        st.flats.emplace_back();
        st.flats.back().dtype = dtype;
        flat = st.flats.end() - 1;
    }
    flat->members.push_back({name, p, flat->numel, p.value().shape()});
    flat->numel += p.value().numel();
}

void make_shards(ZeroOptimizer::State& st, int rank, int world, const AdamOptions& options, bool members_view_values) {
    std::vector<Parameter> shard_params;
    for (auto& flat : st.flats) {
        flat.shard = (flat.numel + world - 1) / world;  // the padding (W·S − Ψ_d elements) stays zero
        Tensor value;
        if (members_view_values) {
            // Every rank holds the same (broadcast) weights: lay them all out, then let the parameters view them.
            flat.values = Tensor::zeros({world * flat.shard}, flat.dtype, st.device);
            const std::size_t size = dtype_size(flat.dtype);
            for (auto& m : flat.members) {
                Tensor& member = m.parameter.value();
                copy_bytes(bytes_of(flat.values) + m.offset * static_cast<std::int64_t>(size), member.raw_data(),
                           member.nbytes(), st.device);
                member = view_of(flat.values, m.offset, m.shape);
            }
            value = view_of(flat.values, rank * flat.shard, {flat.shard});
        } else {
            value = Tensor::zeros({flat.shard}, flat.dtype, st.device);
            for (const auto& m : flat.members) copy_overlap(m, m.parameter.value(), value, flat.shard, rank, true, st.device);
        }
        flat.shard_param = Parameter(value, str("zero.", dtype_name(flat.dtype), ".rank", rank));
        shard_params.push_back(flat.shard_param);
    }
    st.adam = std::make_unique<AdamW>(shard_params, options);
}

std::string zero_layout(const ZeroOptimizer::State& state) {
    std::string text;
    for (const auto& flat : state.flats) {
        if (!state.units.empty()) text += "|";  // stage 3: a flat per unit and dtype, not stage 1/2's layout
        for (const auto& m : flat.members)
            text += str(m.name, " ", dtype_name(flat.dtype), " ", to_string(m.shape), ";");
    }
    return text;
}

ZeroOptimizer::ZeroOptimizer(const Module& module, ProcessGroup group, const AdamOptions& options, ZeroOptions zero)
    : module_(module), group_(std::move(group)), zero_(zero), state_(std::make_unique<State>()) {
    if (zero_.stage != 1 && zero_.stage != 2)
        throw ValueError(str("ZeroOptimizer: stage ", zero_.stage,
                             " is not supported with a Module (1: optimizer state sharded, 2: gradients too; stage 3 takes a list of "
                             "units, dist::ZeroUnit)"));
    if (zero_.overlap && zero_.stage != 1)
        throw ValueError(str("ZeroOptimizer: overlap (DDP's bucketed all-reduce during the backward) is for stage 1; "
                             "stage ", zero_.stage, " reduce-scatters after the backward"));
    if (zero_.recompute)
        throw ValueError("ZeroOptimizer: recompute (a unit's forward run again in its backward) is for stage 3");
    if (zero_.prefetch.value_or(false))
        throw ValueError("ZeroOptimizer: prefetch (the next unit's all-gather beside a unit's compute) is for stage 3");
    check_and_broadcast("ZeroOptimizer");
    State& st = *state_;
    const auto named = module_.named_parameters();

    // One flat buffer per dtype, in order of first appearance; members in registration order.
    for (const auto& [name, p] : named) {
        if (!p.requires_grad()) continue;
        st.identities.push_back(p.identity());
        add_member(st, 0, name, p);
    }
    make_shards(st, group_.rank(), group_.world_size(), options, true);
    // Its own model check and broadcast repeat ours (construction only); its buckets then average the gradients.
    if (zero_.overlap) st.ddp = std::make_unique<DistributedDataParallel>(module_, group_);
}

void ZeroOptimizer::check_and_broadcast(const char* who) {
    const auto named = module_.named_parameters();
    State& st = *state_;
    bool first = true;
    for (const auto& [name, p] : named) {
        if (!p.requires_grad()) continue;
        const Device d = p.value().device();
        if (first) st.device = d;
        else if (d != st.device)
            throw ValueError(str(who, ": trainable parameters on several devices ('", name, "' on ",
                                 d.to_string(), ", others on ", st.device.to_string(), "); one device per rank"));
        first = false;
    }
    if (first) throw ValueError(str(who, ": the model has no trainable parameters (nothing to shard)"));
    // Refused before any collective, so every rank throws the same error without waiting on the others.
    if (st.device.is_cuda() && !group_.has_nccl())
        throw DeviceError(str(who, ": the parameters are on ", st.device.to_string(), " but ", group_.describe(),
                              " has no NCCL communicator: sharding CUDA tensors needs NCCL's reduce_scatter and "
                              "all_gather (ProcessGroupOptions::use_nccl, a build with NCCL)"));
    if (!st.device.is_cuda() && group_.world_size() > 1 && !group_.has_mpi())
        throw DeviceError(str(who, ": CPU parameters on ", group_.describe(),
                              ", which has no MPI: CPU collectives need a launch by mpirun"));
    check_and_broadcast_model(group_, module_, who);
}

ZeroOptimizer::~ZeroOptimizer() {
    if (!state_ || state_->units.empty()) return;
    unregister_units(*state_);
    for (auto& flat : state_->flats)
        for (auto& m : flat.members) m.parameter.count_updater(-1);  // counted in by the stage-3 constructor
}

Optimizer& ZeroOptimizer::optimizer() { return *state_->adam; }
const Optimizer& ZeroOptimizer::optimizer() const { return *state_->adam; }

void ZeroOptimizer::check_module_unchanged(const char* call) const {
    std::vector<std::string> now;
    std::size_t i = 0;
    bool same = true;
    for (const auto& [name, p] : module_.named_parameters()) {
        if (!p.requires_grad()) continue;
        same = same && i < state_->identities.size() && state_->identities[i] == p.identity();
        now.push_back(name);
        ++i;
    }
    same = same && i == state_->identities.size();
    if (same) return;
    std::string sharded;
    for (const auto& flat : state_->flats)
        for (const auto& m : flat.members) sharded += str(sharded.empty() ? "" : ", ", m.name);
    std::string current;
    for (const auto& name : now) current += str(current.empty() ? "" : ", ", name);
    throw ValueError(str("ZeroOptimizer::", call, " (rank ", group_.rank(), "/", group_.world_size(),
                         "): the module's trainable parameters changed after the ZeroOptimizer was built (a parameter "
                         "added, removed, replaced, frozen or unfrozen after wrapping): sharded [", sharded, "], now [",
                         current, "]. Build the ZeroOptimizer once the model is complete"));
}

void ZeroOptimizer::backward(ComputeGraph& graph, const Var& loss) {
    State& st = *state_;
    if (!st.ddp) {
        graph.backward(loss);
        reduce_gradients();
        return;
    }
    check_module_unchanged("backward");
    st.ddp->backward(graph, loss);  // every trainable parameter now holds the averaged gradient (zeros if unused)
    const int rank = group_.rank();
    for (auto& flat : st.flats) {
        // This rank's shard of the averaged gradients (the model's accumulate across backward calls, so a copy).
        Tensor shard = Tensor::zeros({flat.shard}, flat.dtype, st.device);
        for (const auto& m : flat.members)
            if (m.parameter.grad().defined()) copy_overlap(m, m.parameter.grad(), shard, flat.shard, rank, true, st.device);
        flat.shard_param.grad_slot() = shard;
        flat.full_grad = Tensor();
    }
    st.reduced = true;
    st.unscaled = false;
}

void ZeroOptimizer::reduce_gradients() {
    check_module_unchanged("reduce_gradients");
    State& st = *state_;
    if (zero_.stage == 3) {  // the units' backward nodes reduced; a unit not reached contributes zeros (as DDP)
        for (auto& flat : st.flats)
            if (!flat.accumulating) {
                flat.shard_param.grad_slot() = Tensor::zeros({flat.shard}, flat.dtype, st.device);
                flat.accumulating = true;
            }
        st.reduced = true;
        st.unscaled = false;
        return;
    }
    const int world = group_.world_size(), rank = group_.rank();
    for (auto& flat : st.flats) {
        // The model's gradients end to end (zeros for a parameter the backward did not reach, and the padding).
        Tensor full = Tensor::zeros({world * flat.shard}, flat.dtype, st.device);
        std::vector<GradientPlace> grads;
        for (const auto& m : flat.members) {
            const Tensor& grad = m.parameter.grad();
            if (!grad.defined()) continue;
            const std::string mismatch = str("ZeroOptimizer::reduce_gradients (rank ", rank, "/", world,
                                             "): the gradient of '", m.name, "' is ", dtype_name(grad.dtype()), " ",
                                             to_string(grad.shape()), ", its parameter ", dtype_name(flat.dtype), " ",
                                             to_string(m.parameter.value().shape()));
            if (grad.dtype() != flat.dtype) throw DTypeError(mismatch);
            if (grad.shape() != m.parameter.value().shape()) throw ShapeError(mismatch);
            grads.push_back({grad, m.offset});
        }
        gradients_into_flat(full, grads, st.device);
        if (zero_.stage == 1) {
            group_.all_reduce(full, ReduceOp::Avg);
            // The model's gradients and the shard's become views of the averaged buffer (Ψ·b, no second copy).
            for (auto& m : flat.members) {
                m.parameter.grad_slot() = view_of(full, m.offset, m.parameter.value().shape());
                m.parameter.grad_slot().bump_version();
            }
            flat.shard_param.grad_slot() = view_of(full, rank * flat.shard, {flat.shard});
            flat.full_grad = full;
        } else {
            Tensor shard = Tensor::empty({flat.shard}, flat.dtype, st.device);
            group_.reduce_scatter(full, shard, ReduceOp::Avg);
            // A second reduction before the step (gradient accumulation over micro-batches) adds to the shard, as
            // the model's gradients would have accumulated: stage 1 and DDP give the same sum.
            const Tensor& earlier = flat.shard_param.grad();
            flat.shard_param.grad_slot() = st.reduced && earlier.defined() ? add(earlier, shard) : shard;
            for (auto& m : flat.members) m.parameter.zero_grad();  // only the shard is kept (ZeRO-2)
        }
    }
    st.reduced = true;
    st.unscaled = false;
}

Tensor ZeroOptimizer::clip_grad_norm(double max_norm, double norm_type, double eps) {
    State& st = *state_;
    if (!(max_norm >= 0) || !std::isfinite(max_norm))
        throw ValueError(str("ZeroOptimizer::clip_grad_norm: max_norm must be finite and non-negative, got ", max_norm));
    if (!(norm_type > 0) || std::isinf(norm_type))
        throw ValueError(str("ZeroOptimizer::clip_grad_norm: norm_type must be positive and finite, got ", norm_type,
                             " (the infinity norm needs a max all-reduce, which the group does not have)"));
    if (!st.reduced)
        throw ValueError("ZeroOptimizer::clip_grad_norm: no reduce_gradients() (or backward()) since the last step");
    // Σ|g|^p over this rank's shard (the padding adds zero), in f64 as clip_grad_norm accumulates, then summed
    // over the ranks: every rank gets the norm of the whole averaged gradient. Tensor ops: stays on the device.
    Tensor total = Tensor::zeros({}, DType::f64, st.device);
    for (auto& flat : st.flats) {
        const Tensor a = abs(flat.shard_param.grad().to(DType::f64));
        total = add(total, sum(norm_type == 2 ? mul(a, a) : norm_type == 1 ? a : pow(a, norm_type)));
    }
    group_.all_reduce(total, ReduceOp::Sum);
    const Tensor norm = norm_type == 2 ? sqrt(total) : pow(total, 1 / norm_type);
    const Tensor coefficient =
        clamp(div(Tensor::full({}, max_norm, DType::f64, st.device), add_scalar(norm, eps)), std::nullopt, 1.0);
    for (auto& flat : st.flats) {
        const Tensor c = coefficient.to(flat.dtype);
        if (flat.full_grad.defined()) {  // stage 1: the shard is a view of full_grad: scale the buffer once
            const Tensor scaled = mul(flat.full_grad, c);
            copy_bytes(bytes_of(flat.full_grad), scaled.raw_data(), scaled.nbytes(), st.device);
            flat.full_grad.bump_version();
        } else {
            flat.shard_param.grad_slot() = mul(flat.shard_param.grad(), c);
            if (zero_.stage == 1)  // overlap: the model keeps its own averaged gradients; clip them alike
                for (auto& m : flat.members) m.parameter.grad_slot() = mul(m.parameter.grad(), c);
        }
    }
    return norm;
}

void ZeroOptimizer::unscale(GradScaler& scaler) {
    State& st = *state_;
    if (!st.reduced) throw ValueError("ZeroOptimizer::unscale: no reduce_gradients() (or backward()) since the last step");
    if (st.unscaled) throw ValueError("ZeroOptimizer::unscale: called twice for one step");
    scaler.unscale(*st.adam);  // this rank's shards: unscaled in place, found_inf for them
    // One verdict for all ranks: found_inf (f32, on the device) summed, so an inf in any shard skips the step
    // everywhere and the parameters stay equal across ranks.
    for (auto& [name, t] : scaler.state_tensors())
        if (name == "found_inf") group_.all_reduce(t, ReduceOp::Sum);
    st.unscaled = true;
}

void ZeroOptimizer::step(GradScaler& scaler) {
    check_module_unchanged("step");
    State& st = *state_;
    if (!st.reduced) throw ValueError("ZeroOptimizer::step: no reduce_gradients() (or backward()) since the last step");
    if (!st.unscaled) unscale(scaler);
    scaler.step(*st.adam);
    gather_parameters();
    st.reduced = false;
    st.unscaled = false;
}

void ZeroOptimizer::step() {
    check_module_unchanged("step");
    State& st = *state_;
    if (!st.reduced) throw ValueError("ZeroOptimizer::step: no reduce_gradients() (or backward()) since the last step");
    st.adam->step();
    gather_parameters();
    st.reduced = false;
}

void ZeroOptimizer::gather_parameters() {
    State& st = *state_;
    for (auto& flat : st.flats) flat.accumulating = false;
    drop_prefetched(st);  // gathered from the shards before this step
    if (zero_.stage == 3) return;  // the parameters stay sharded; the next forward gathers them
    for (auto& flat : st.flats) {
        // In place: this rank's shard is its block of `values`, which the parameters view (make_shards).
        Tensor blocks = flat.values.reshaped({group_.world_size(), flat.shard});
        group_.all_gather(flat.shard_param.value(), blocks);
        const std::size_t size = dtype_size(flat.dtype);
        for (auto& m : flat.members) {
            Tensor& value = m.parameter.value();
            const char* at = bytes_of(flat.values) + m.offset * static_cast<std::int64_t>(size);
            // A value replaced since (load_parameters into a new tensor, to()) no longer views the buffer: copied.
            if (value.raw_data() != at) copy_bytes(bytes_of(value), at, value.nbytes(), st.device);
            value.bump_version();
        }
    }
}

void ZeroOptimizer::zero_grad() {
    State& st = *state_;
    for (auto& flat : st.flats) {
        for (auto& m : flat.members) m.parameter.zero_grad();
        flat.shard_param.zero_grad();
        flat.full_grad = Tensor();
        flat.accumulating = false;
    }
    st.reduced = false;
    st.unscaled = false;
}

std::vector<ZeroOptimizer::FlatInfo> ZeroOptimizer::flats() const {
    std::vector<FlatInfo> out;
    for (const auto& flat : state_->flats) out.push_back({flat.dtype, flat.numel, flat.shard});
    return out;
}

std::vector<std::pair<std::string, Tensor>> ZeroOptimizer::shards() const {
    std::vector<std::pair<std::string, Tensor>> out;
    for (std::size_t i = 0; i < state_->flats.size(); ++i) {
        const auto& flat = state_->flats[i];
        const std::string prefix(dtype_name(flat.dtype));
        out.emplace_back(prefix + ".param", flat.shard_param.value());
        for (const auto& [name, t] : state_->adam->state_tensors(i)) out.emplace_back(prefix + "." + name, t);
    }
    return out;
}

ZeroMemory ZeroOptimizer::memory() const {
    const State& st = *state_;
    ZeroMemory m;
    m.world = group_.world_size();
    m.stage = zero_.stage;
    for (std::size_t i = 0; i < st.flats.size(); ++i) {
        const auto& flat = st.flats[i];
        const auto b = static_cast<std::int64_t>(dtype_size(flat.dtype));
        m.parameters += flat.numel;
        m.padded += flat.shard * m.world;
        for (const auto& member : flat.members) {
            m.parameter_bytes += member.parameter.value().nbytes();
            // Stage 1's gradients are views of full_grad (counted once below), or with overlap their own tensors
            // plus DDP's bucket buffer; stage 2 has none after the reduction.
            if ((zero_.stage >= 2 || st.ddp) && member.parameter.grad().defined())
                m.gradient_bytes += member.parameter.grad().nbytes();
            if (st.ddp) m.gradient_bytes += member.parameter.value().nbytes();  // its slot in DDP's buckets
        }
        if (zero_.stage == 1 && flat.full_grad.defined()) m.gradient_bytes += flat.full_grad.nbytes();
        if (zero_.stage == 3) m.parameter_bytes += flat.shard_param.value().nbytes();
        if ((zero_.stage >= 2 || st.ddp) && flat.shard_param.grad().defined())
            m.gradient_bytes += flat.shard_param.grad().nbytes();
        for (const auto& [name, t] : st.adam->state_tensors(i)) m.optimizer_bytes += t.nbytes();
        m.formula_parameter_bytes += (zero_.stage == 3 ? flat.shard : flat.numel) * b;
        m.formula_gradient_bytes += (zero_.stage == 1 ? flat.shard * m.world : flat.shard) * b;
        m.formula_optimizer_bytes += 2 * flat.shard * b;
        m.ddp_bytes += 4 * flat.numel * b;
    }
    m.gathered_peak_bytes = st.gathered_peak_bytes;
    m.gathered_bytes = st.gathered_bytes;
    kept_bytes(st, m);
    // One unit gathered at a time; with prefetch a unit and the neighbour gathered beside it.
    const bool prefetch = st.prefetch && m.world > 1;
    std::int64_t previous = 0;
    for (const auto& unit : st.units) {
        std::int64_t bytes = 0;
        for (std::size_t f : unit.flats)
            bytes += st.flats[f].shard * m.world * static_cast<std::int64_t>(dtype_size(st.flats[f].dtype));
        m.formula_gathered_bytes = std::max(m.formula_gathered_bytes, bytes + (prefetch ? previous : 0));
        previous = bytes;
    }
    return m;
}

}  // namespace dyngrad::dist
