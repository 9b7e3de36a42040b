// DistributedDataParallel (distributed/ddp.h): the model check, the buckets, the readiness hook, the launches in bucket
// order, the wait and the copy back, and the opt-in gradient check.
#include "dyngrad/distributed/ddp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/core/error.h"
#include "dyngrad/core/half.h"
#include "dyngrad/distributed/group_impl.h"
#include "dyngrad/distributed/zero_impl.h"  // copy_ranges, bytes_of

namespace dyngrad::dist {

struct DistributedDataParallel::State {
    struct Slot {
        Parameter parameter;
        std::size_t bucket = 0;
        std::int64_t offset = 0;  // elements into the bucket's buffer
        bool ready = false;
    };
    struct Bucket {
        Tensor flat;                      // persistent: fixed addresses (captured steps), no per-step allocation
        Tensor wire;                      // DDPOptions::compression: the 16-bit buffer that is all-reduced, likewise
        std::vector<std::size_t> slots;   // indices into `slots`
        std::size_t pending = 0;          // gradients still to arrive this pass
        // Gradients that arrived, copied into `flat` in one batched copy when the last one has (instead of a
        // device copy and an API call per gradient: 76 a step for the char GPT); the sources stay alive until then.
        std::vector<device_memory::CopyRange> staged;
        std::vector<Tensor> staged_sources;
        bool launched = false;
        MPI_Request request = MPI_REQUEST_NULL;
    };
    std::vector<Slot> slots;  // reverse registration order
    std::unordered_map<const void*, std::size_t> slot_of;
    std::vector<Bucket> buckets;
    std::size_t next_launch = 0;
    CommStreamsHandle streams;  // CUDA buckets

    static void copy_staged(Bucket& bucket);
    // Where the slot's gradient lives in its bucket's flat buffer.
    char* slot_bytes(const Slot& slot) const {
        const Tensor& flat = buckets[slot.bucket].flat;
        return bytes_of(flat) + slot.offset * static_cast<std::int64_t>(dtype_size(flat.dtype()));
    }
};

namespace {

void divide(Tensor& t, double by) {
    if (t.dtype() == DType::f32) {
        float* p = t.data<float>();
        const float f = static_cast<float>(by);
        for (std::int64_t i = 0; i < t.numel(); ++i) p[i] /= f;
    } else {
        double* p = t.data<double>();
        for (std::int64_t i = 0; i < t.numel(); ++i) p[i] /= by;
    }
}

double squared_norm(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x * x;
    return s;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(const Module& module, ProcessGroup group, DDPOptions options)
    : module_(module), group_(std::move(group)), options_(options), state_(std::make_unique<State>()) {
    if (!(options_.bucket_cap_mb > 0) || !(options_.first_bucket_cap_mb > 0) || !std::isfinite(options_.bucket_cap_mb) ||
        !std::isfinite(options_.first_bucket_cap_mb))
        throw ValueError(str("DistributedDataParallel: bucket caps ", options_.first_bucket_cap_mb, " MiB (first) and ",
                             options_.bucket_cap_mb, " MiB must be positive"));
    if (options_.check_tolerance < 0 || !std::isfinite(options_.check_tolerance))
        throw ValueError(str("DistributedDataParallel: check_tolerance ", options_.check_tolerance, " is negative"));
    check_and_broadcast_model(group_, module_, "DistributedDataParallel");
    const auto named = module_.named_parameters();

    // Buckets over the trainable parameters, in reverse registration order; one dtype and device each.
    State& st = *state_;
    for (auto it = named.rbegin(); it != named.rend(); ++it)
        if (it->second.requires_grad()) st.slots.push_back({it->second, 0, 0, false});
    if (st.slots.empty())
        throw ValueError("DistributedDataParallel: the model has no trainable parameters (nothing to average)");
    struct Layout {
        DType dtype;
        Device device;
        std::int64_t elements = 0;
        std::size_t bytes = 0;
    };
    std::vector<Layout> layouts;
    for (std::size_t i = 0; i < st.slots.size(); ++i) {
        const Tensor& v = st.slots[i].parameter.value();
        // The first bucket is small (communication starts after the last layers), the others up to the cap.
        const double cap = (layouts.size() == 1 ? options_.first_bucket_cap_mb : options_.bucket_cap_mb) * 1048576.0;
        const bool fits = !layouts.empty() && layouts.back().dtype == v.dtype() && layouts.back().device == v.device() &&
                          static_cast<double>(layouts.back().bytes + v.nbytes()) <= cap;
        if (!fits) {  // a parameter larger than the cap gets a bucket of its own
            layouts.push_back({v.dtype(), v.device()});
            st.buckets.emplace_back();
        }
        st.slots[i].bucket = st.buckets.size() - 1;
        st.slots[i].offset = layouts.back().elements;
        st.buckets.back().slots.push_back(i);
        layouts.back().elements += v.numel();
        layouts.back().bytes += v.nbytes();
        st.slot_of[st.slots[i].parameter.identity()] = i;
    }
    for (std::size_t b = 0; b < st.buckets.size(); ++b)
        st.buckets[b].flat = Tensor::zeros({layouts[b].elements}, layouts[b].dtype, layouts[b].device);
    set_compression(options_.compression);
    const Device device = st.buckets.front().flat.device();
    for (const auto& b : st.buckets)
        if (b.flat.device() != device)
            throw DeviceError(str("DistributedDataParallel: the model's parameters are on ", device.to_string(), " and ",
                                  b.flat.device().to_string(), "; one device per process"));
    if (device.is_cuda()) {
        if (device != group_.device())
            throw DeviceError(str("DistributedDataParallel: the model is on ", device.to_string(), ", the group's ",
                                  group_.describe(), " device is ", group_.device().to_string()));
        st.streams = make_comm_streams(device.index, st.buckets.size());
    } else if (!group_.has_mpi() && group_.world_size() > 1) {
        throw DeviceError(str("DistributedDataParallel: the model is on the CPU, and ", group_.describe(),
                              " has no MPI (CPU tensors are reduced through MPI: launch with mpirun)"));
    }
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::set_compression(std::optional<DType> compression) {
    if (in_backward_)
        throw ValueError("DistributedDataParallel::set_compression: called during this DDP's backward");
    if (compression && !is_reduced_precision(*compression))
        throw ValueError(str("DistributedDataParallel: compression ", dtype_name(*compression),
                             " is not a 16-bit dtype (bfloat16 or float16)"));
    State& st = *state_;
    for (const auto& b : st.buckets)  // every check before anything changes
        if (compression && b.flat.dtype() != DType::f32)
            throw DTypeError(str("DistributedDataParallel: compression to ", dtype_name(*compression),
                                 " is for float32 gradients; parameter '", st.slots[b.slots.front()].parameter.name(),
                                 "' is ", dtype_name(b.flat.dtype())));
    for (auto& b : st.buckets)
        b.wire = compression ? Tensor::zeros({b.flat.numel()}, *compression, b.flat.device()) : Tensor();
    options_.compression = compression;
}

std::vector<std::vector<std::string>> DistributedDataParallel::buckets() const {
    std::vector<std::vector<std::string>> out;
    for (const auto& b : state_->buckets) {
        out.emplace_back();
        for (std::size_t i : b.slots) out.back().push_back(state_->slots[i].parameter.name());
    }
    return out;
}

void DistributedDataParallel::backward(ComputeGraph& graph, const Var& loss, BackwardOptions options) {
    if (in_backward_)
        throw ValueError("DistributedDataParallel::backward: called during its own backward (from a readiness "
                         "callback); the running backward's buckets would be reset: one backward at a time");
    ++stats_.backward_calls;
    synchronised_ = false;  // until this backward's averages are in the gradients
    if (no_sync_) {
        graph.backward(loss, options);
        return;
    }
    State& st = *state_;
    for (auto& s : st.slots) s.ready = false;
    for (auto& b : st.buckets) {
        b.pending = b.slots.size();
        b.launched = false;
        b.staged.clear();  // left by a backward that threw
        b.staged_sources.clear();
    }
    st.next_launch = 0;
    stats_.ready_order.clear();
    stats_.launch_order.clear();
    stats_.buckets_launched_during_backward = 0;
    stats_.buckets_launched_after_backward = 0;
    stats_.unused_parameters = 0;
    auto user_hook = std::move(options.on_parameter_ready);
    options.on_parameter_ready = [this, &user_hook](const Parameter& p) {
        if (user_hook) user_hook(p);
        on_ready(p);
    };
    in_backward_ = true;
    try {
        graph.backward(loss, options);
    } catch (...) {
        in_backward_ = false;
        throw;  // buckets already launched stay pending: the other ranks wait for the rest and time out
    }
    in_backward_ = false;
    finish();
    synchronised_ = true;
    ++stats_.synchronised_calls;
}

void DistributedDataParallel::on_ready(const Parameter& p) {
    State& st = *state_;
    const auto found = st.slot_of.find(p.identity());
    if (found == st.slot_of.end()) return;  // not a trainable parameter of this model
    State::Slot& slot = st.slots[found->second];
    if (slot.ready) return;
    State::Bucket& bucket = st.buckets[slot.bucket];
    const Tensor& grad = p.grad();
    char* dst = st.slot_bytes(slot);
    if (dst != grad.raw_data()) {  // a gradient that is already its bucket view is in place
        bucket.staged.push_back({dst, grad.raw_data(), grad.nbytes()});
        bucket.staged_sources.push_back(grad);
    }
    slot.ready = true;
    stats_.ready_order.push_back(p.name());
    if (--bucket.pending == 0) {
        State::copy_staged(bucket);
        if (options_.overlap) launch_ready_buckets();
    }
    // MPI progresses non-blocking collectives inside MPI calls: give the launched ones a turn.
    for (std::size_t b = 0; b < st.next_launch; ++b)
        if (st.buckets[b].request != MPI_REQUEST_NULL) {
            int done = 0;
            group_.impl().check_mpi(MPI_Test(&st.buckets[b].request, &done, MPI_STATUS_IGNORE),
                                    "DistributedDataParallel: progress of a bucket's all-reduce");
        }
}

// The bucket's gradients into its flat buffer, one batched copy (before its all-reduce, on the same stream).
void DistributedDataParallel::State::copy_staged(Bucket& bucket) {
    copy_ranges(bucket.staged, bucket.flat.device());
    bucket.staged.clear();
    bucket.staged_sources.clear();
}

void DistributedDataParallel::launch_ready_buckets() {
    State& st = *state_;
    while (st.next_launch < st.buckets.size() && st.buckets[st.next_launch].pending == 0) launch(st.next_launch++);
}

void DistributedDataParallel::launch(std::size_t index) {
    State& st = *state_;
    State::Bucket& b = st.buckets[index];
    b.launched = true;
    stats_.launch_order.push_back(index);
    ++(in_backward_ ? stats_.buckets_launched_during_backward : stats_.buckets_launched_after_backward);
    if (group_.world_size() == 1) return;  // nothing to average
    ProcessGroup::Impl& g = group_.impl();
    const std::string what = g.what(str("DistributedDataParallel bucket ", index, " all_reduce(avg)"), b.flat);
    const auto count = static_cast<std::size_t>(b.flat.numel());
    // With compression the 16-bit copy travels (converted on dyngrad's stream before the hand-off).
    const Tensor& sent = b.wire.defined() ? b.wire : b.flat;
    if (b.flat.device().is_cuda()) {
        NcclComm& comm = g.nccl_for(b.flat, what);  // DeviceError without NCCL, before the stream is touched
        if (b.wire.defined())
            device_memory::convert(b.wire.raw_data(), b.wire.dtype(), b.flat.raw_data(), DType::f32, b.flat.numel(),
                                   b.flat.device().index);
        hand_bucket_to_comm(*st.streams, index);
        nccl_all_reduce(comm, sent.raw_data(), sent.raw_data(), count, sent.dtype(), ReduceOp::Avg,
                        comm_stream(*st.streams), what);
    } else {
        if (b.wire.defined()) {
            divide(b.flat, group_.world_size());  // summed in 16 bits: the mean's magnitude, not W times it
            floats_to_half_bits(b.flat.data<float>(), static_cast<std::uint16_t*>(b.wire.raw_data()), count,
                                half_format(b.wire.dtype()));
        }
        b.request = g.start_mpi_all_reduce(sent.raw_data(), count, sent.dtype(), what);
    }
}

void DistributedDataParallel::finish() {
    State& st = *state_;
    // Parameters this pass did not reach contribute their current gradient, or zeros.
    for (auto& slot : st.slots) {
        if (slot.ready) continue;
        State::Bucket& bucket = st.buckets[slot.bucket];
        const std::size_t element = dtype_size(bucket.flat.dtype());
        char* dst = st.slot_bytes(slot);
        const Tensor& grad = slot.parameter.grad();
        const std::int64_t numel = slot.parameter.value().numel();
        const std::size_t bytes = static_cast<std::size_t>(numel) * element;
        if (grad.defined()) {
            bucket.staged.push_back({dst, grad.raw_data(), bytes});
            bucket.staged_sources.push_back(grad);
        } else if (bucket.flat.device().is_cuda())
            device_memory::fill(dst, numel, 0.0, bucket.flat.dtype(), bucket.flat.device().index);
        else std::memset(dst, 0, bytes);
        slot.ready = true;
        --bucket.pending;
        ++stats_.unused_parameters;
    }
    for (auto& bucket : st.buckets)
        if (!bucket.staged.empty()) State::copy_staged(bucket);
    launch_ready_buckets();
    // Wait for each bucket (the device: an event; the CPU: MPI), then hand the means back to the gradients.
    ProcessGroup::Impl& g = group_.impl();
    for (std::size_t index = 0; index < st.buckets.size(); ++index) {
        State::Bucket& b = st.buckets[index];
        if (group_.world_size() > 1) {
            if (b.flat.device().is_cuda()) {
                hand_bucket_back(*st.streams, index);
                if (b.wire.defined())
                    device_memory::convert(b.flat.raw_data(), DType::f32, b.wire.raw_data(), b.wire.dtype(),
                                           b.flat.numel(), b.flat.device().index);
            } else {
                g.wait_mpi(b.request, g.what(str("DistributedDataParallel bucket ", index, " all_reduce(avg)"), b.flat));
                if (b.wire.defined())
                    half_bits_to_floats(static_cast<const std::uint16_t*>(b.wire.raw_data()), b.flat.data<float>(),
                                        static_cast<std::size_t>(b.flat.numel()),
                                        half_format(b.wire.dtype()));
                else divide(b.flat, group_.world_size());
            }
        }
        std::vector<device_memory::CopyRange> back;  // the means into the gradients: one batched copy
        for (std::size_t i : b.slots) {
            State::Slot& slot = st.slots[i];
            Tensor& grad = slot.parameter.grad_slot();
            const Tensor& value = slot.parameter.value();
            // In place when the gradient is this parameter's alone; a gradient shared with a graph's leaf (its
            // Var::grad()) gets a tensor of its own instead of changing that one.
            if (options_.gradient_as_bucket_view) {
                if (!grad.defined() || grad.raw_data() != st.slot_bytes(slot))
                    grad = view_of(b.flat, slot.offset, value.shape());
                grad.bump_version();
                continue;
            }
            if (!grad.defined() || !grad.owns_storage_exclusively() || grad.shape() != value.shape())
                grad = Tensor::empty(value.shape(), value.dtype(), value.device());
            back.push_back({grad.raw_data(), st.slot_bytes(slot), grad.nbytes()});
            grad.bump_version();
        }
        copy_ranges(back, b.flat.device());
    }
}

Tensor DistributedDataParallel::forward_backward(std::span<const Tensor> batch, const LossFn& loss_fn) {
    ComputeGraph graph;
    const Var loss = loss_fn(graph, batch);
    backward(graph, loss);
    if (options_.check_gradients && !no_sync_) check_gradients(batch, loss_fn);
    return loss.value();
}

GradientCheckResult DistributedDataParallel::check_gradients(std::span<const Tensor> batch, const LossFn& loss_fn) {
    // Gradients that were never averaged would be "off" by the other ranks' part: a misleading NumericalError.
    if (!synchronised_)
        throw ValueError(str("DistributedDataParallel::check_gradients: no synchronised backward to check (",
                             stats_.backward_calls == 0 ? "no backward yet" : "the last backward ran inside no_sync() or failed",
                             "); call it right after backward() or forward_backward()"));
    // The global batch: every rank's tensors, gathered and laid end to end along dim 0.
    std::vector<Tensor> global;
    for (const Tensor& t : batch) {
        const Tensor gathered = t.device().is_cuda() || group_.has_mpi() || group_.world_size() == 1
                                    ? group_.all_gather(t)
                                    : group_.all_gather(t.to(group_.device())).to(t.device());
        Shape shape = t.shape();
        if (shape.empty()) throw ShapeError("DistributedDataParallel::check_gradients: a batch tensor is 0-d");
        shape[0] *= group_.world_size();
        global.push_back(gathered.reshaped(shape));
    }
    State& st = *state_;
    std::vector<Tensor> averaged;
    for (auto& slot : st.slots) averaged.push_back(slot.parameter.grad());
    for (auto& slot : st.slots) slot.parameter.zero_grad();
    GradientCheckResult result;
    try {
        ComputeGraph graph;
        graph.backward(loss_fn(graph, global));
        for (std::size_t i = 0; i < st.slots.size(); ++i) {
            const Parameter& p = st.slots[i].parameter;
            const std::vector<double> got = averaged[i].defined() ? averaged[i].to_vector() : std::vector<double>();
            std::vector<double> want = p.grad().defined() ? p.grad().to_vector()
                                                          : std::vector<double>(got.size(), 0.0);
            if (got.size() != want.size())
                throw NumericalError(str("DistributedDataParallel::check_gradients (rank ", group_.rank(), "): parameter '",
                                         p.name(), "' has no averaged gradient"));
            std::vector<double> diff(got.size());
            for (std::size_t k = 0; k < got.size(); ++k) diff[k] = got[k] - want[k];
            const double error = std::sqrt(squared_norm(diff)) / std::max(std::sqrt(squared_norm(want)), 1e-30);
            if (error > result.worst_relative_error || result.worst_parameter.empty()) {
                result.worst_relative_error = error;
                result.worst_parameter = p.name();
            }
            // With compression the average went through two 16-bit roundings (bf16 2^-8, f16 2^-11 relative each).
            const double tolerance = options_.check_tolerance > 0 ? options_.check_tolerance
                                     : options_.compression == DType::bf16 ? 2e-2
                                     : options_.compression == DType::f16 ? 3e-3
                                     : p.value().dtype() == DType::f64 ? 1e-10 : 1e-5;
            if (!(error <= tolerance))
                throw NumericalError(str("DistributedDataParallel::check_gradients (rank ", group_.rank(), "/",
                                         group_.world_size(), "): the averaged gradient of '", p.name(), "' ",
                                         to_string(p.value().shape()), " differs from the single-device gradient of ",
                                         "the global batch by ", error, " (relative L2; tolerance ", tolerance, ")"));
        }
    } catch (...) {
        for (std::size_t i = 0; i < st.slots.size(); ++i) st.slots[i].parameter.grad_slot() = averaged[i];
        throw;
    }
    for (std::size_t i = 0; i < st.slots.size(); ++i) st.slots[i].parameter.grad_slot() = averaged[i];
    return result;
}

}  // namespace dyngrad::dist
