// Internal to the optimizer wing of nn/ (not installed): what the optimizers (nn/optim.cpp, nn/optim.cu), the
// schedules (nn/schedules.cpp), checkpoints (nn/checkpoint.cpp), clipping (nn/clip.{cpp,cu}) and loss scaling
// (GradScaler: nn/optim.cpp, its kernels in nn/optim.cu) share, in one header so that a walk through a step reads one file:
//   1. the per-element update rules and per-step scalars both backends apply (as ops/elementwise_math.h is for
//      the elementwise ops): the CPU loop and the fused kernels call them element by element;
//   2. the GPU entry points of the fused steps, with the cached device table of update chunks;
//   3. the gradients clipping and loss scaling act on, and their GPU passes;
//   4. the optimizer's per-device tables of scalars (which a schedule's step advances), an update rule's backend
//      halves, the hyperparameter checks and the checkpoint entry readers;
//   5. nvcc only (__CUDACC__): the batched passes over many gradients that clipping and loss scaling share.
// The GPU entry points are declared in every build; without CUDA the tables stay empty (no parameter lives on a
// GPU) and the entry points are nn/optim_unavailable.cpp's, which throw DeviceError and are never reached.
// Over 600 lines: the five parts above are read together when following one step; split, each would repeat the others.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/core/error.h"
#include "dyngrad/core/safetensors.h"
#include "dyngrad/core/tensor.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/schedule_rule.h"
#include "dyngrad/ops/host_device.h"

// ---- 1. The optimizers' formulas ----
// A rule holds its scalars in the element type T (cast once from the double settings) and updates one element
// in place: w the parameter, g its gradient (already clipped; the rule unscales it), and the rule's state.
namespace dyngrad {

// The scalars of one SGD update of one parameter (its group's settings):
//   g = grad + weight_decay·p;  buf = momentum·buf + g;  g = nesterov ? g + momentum·buf : buf;  p -= lr·g
struct SgdScalars {
    double lr = 0;
    double momentum = 0;      // 0: no momentum buffer
    double weight_decay = 0;  // L2
    double nesterov = 0;      // 1: Nesterov (a double, so that the scalars are one array of doubles)
};

// The scalars of one Adam update at step t (from 1), with the bias corrections folded in:
//   p *= decay;  g += l2·p;  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;
//   p -= step_size · m / (√v / bias2_sqrt + eps)
struct AdamScalars {
    double beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    double l2;     // Adam's weight decay, 0 for AdamW
    double decay;  // AdamW's 1 - lr·wd, 1 for Adam
    double step_size;   // lr / (1 - β1^t)
    double bias2_sqrt;  // √(1 - β2^t)
};

// The bias-correction pieces at step t, each its own expression so that the GPU kernel can evaluate them in
// different warps at once (each a double pow); adam_scalars combines them with the lr, the same bits either way.
DG_HOST_DEVICE double adam_bias1(double beta1, std::int64_t step) {
    return 1 - ::pow(beta1, static_cast<double>(step));  // 1 - β1^t
}
DG_HOST_DEVICE double adam_bias2_sqrt(double beta2, std::int64_t step) {
    return ::sqrt(1 - ::pow(beta2, static_cast<double>(step)));  // √(1 - β2^t)
}
DG_HOST_DEVICE AdamScalars adam_scalars_from(double lr, double beta1, double beta2, double eps, double weight_decay,
                                             bool decoupled, double bias1, double bias2_sqrt) {
    return {beta1,
            1 - beta1,
            beta2,
            1 - beta2,
            eps,
            decoupled ? 0.0 : weight_decay,
            decoupled ? 1 - lr * weight_decay : 1.0,
            lr / bias1,
            bias2_sqrt};
}

// One formula for both backends: the GPU kernel derives these from the device-resident lr and step count
// (so a captured step advances them on every replay), the CPU update from the host ones.
DG_HOST_DEVICE AdamScalars adam_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                        bool decoupled, std::int64_t step) {
    return adam_scalars_from(lr, beta1, beta2, eps, weight_decay, decoupled, adam_bias1(beta1, step),
                             adam_bias2_sqrt(beta2, step));
}

// The closed forms of the built-in schedules, shared by the host (LRScheduler::lr_for) and the kernel that
// advances a schedule on the device (a captured scheduler.step() computes the next lr on every replay).
DG_HOST_DEVICE double schedule_lr(const ScheduleRule& r, double base_lr, std::int64_t epoch) {
    constexpr double kPi = 3.141592653589793;  // std::numbers::pi, usable in device code
    switch (r.kind) {
        case ScheduleKind::Step: return base_lr * ::pow(r.x, static_cast<double>(epoch / r.n1));
        case ScheduleKind::Cosine: {
            const double phase = kPi * static_cast<double>(epoch) / static_cast<double>(r.n1);
            return r.x + (base_lr - r.x) * (1 + ::cos(phase)) / 2;
        }
        case ScheduleKind::WarmupCosine: {
            // nanoGPT's: linear warm-up to the base lr, then a half cosine down to min_lr at total_steps.
            if (epoch < r.n1) return base_lr * static_cast<double>(epoch + 1) / static_cast<double>(r.n1 + 1);
            if (epoch >= r.n2) return r.x;
            const double ratio = static_cast<double>(epoch - r.n1) / static_cast<double>(r.n2 - r.n1);
            return r.x + (base_lr - r.x) * (1 + ::cos(kPi * ratio)) / 2;
        }
    }
    return base_lr;
}

// GradScaler's unscaling, the first thing both rules do with a gradient: g·inv_scale, or g when not unscaling.
template <typename T>
struct Unscale {
    T inv_scale = T(1);
    bool active = false;
    DG_HOST_DEVICE T operator()(T g) const { return active ? g * inv_scale : g; }
};

// SGD with momentum, Nesterov and L2 weight decay; b is the momentum buffer, untouched without momentum.
template <typename T>
struct SgdRule {
    T lr, momentum, weight_decay;
    bool nesterov;
    bool has_buffer;  // momentum > 0
    Unscale<T> unscale;

    DG_HOST_DEVICE SgdRule(double lr_, double momentum_, double weight_decay_, bool nesterov_, bool has_buffer_,
                           Unscale<T> unscale_)
        : lr(static_cast<T>(lr_)),
          momentum(static_cast<T>(momentum_)),
          weight_decay(static_cast<T>(weight_decay_)),
          nesterov(nesterov_),
          has_buffer(has_buffer_),
          unscale(unscale_) {}

    DG_HOST_DEVICE void operator()(T& w, T g, T& b) const {
        T d = unscale(g);
        if (weight_decay != T(0)) d = d + weight_decay * w;
        if (has_buffer) {
            b = momentum * b + d;
            d = nesterov ? d + momentum * b : b;
        }
        w = w - lr * d;
    }
};

// Adam / AdamW (AdamScalars: decay is AdamW's, l2 Adam's weight decay); m and v are the moments.
template <typename T>
struct AdamRule {
    T beta1, one_minus_beta1, beta2, one_minus_beta2, eps, l2, decay, step_size, bias2_sqrt;
    Unscale<T> unscale;

    DG_HOST_DEVICE AdamRule(const AdamScalars& s, Unscale<T> unscale_)
        : beta1(static_cast<T>(s.beta1)),
          one_minus_beta1(static_cast<T>(s.one_minus_beta1)),
          beta2(static_cast<T>(s.beta2)),
          one_minus_beta2(static_cast<T>(s.one_minus_beta2)),
          eps(static_cast<T>(s.eps)),
          l2(static_cast<T>(s.l2)),
          decay(static_cast<T>(s.decay)),
          step_size(static_cast<T>(s.step_size)),
          bias2_sqrt(static_cast<T>(s.bias2_sqrt)),
          unscale(unscale_) {}

    DG_HOST_DEVICE void operator()(T& w, T g, T& m, T& v) const {
        using std::sqrt;  // the float or double overload, on host and device alike
        if (decay != T(1)) w = w * decay;
        T d = unscale(g);
        if (l2 != T(0)) d = d + l2 * w;
        m = beta1 * m + one_minus_beta1 * d;
        v = beta2 * v + one_minus_beta2 * (d * d);
        w = w - step_size * m / (sqrt(v) / bias2_sqrt + eps);
    }
};

}  // namespace dyngrad

// ---- 2. The fused steps' GPU entry points ----
namespace dyngrad {

// The per-group settings a GPU chunk carries (the lr and step count are read from device memory):
// SGD: momentum, weight_decay, nesterov; Adam: beta1, beta2, eps, weight_decay, decoupled.
inline constexpr int kStepScalars = 5;

namespace cuda {

// One tensor's update: param, grad and state (null where the rule keeps none) of `numel` elements of
// `dtype`, all on the same device, with its group's settings and its indices into the device scalars.
struct StepOperands {
    DType dtype;
    void* param;
    void* grad;    // written only by a step fused with clipping (StepState::clip)
    void* state1;  // SGD: momentum buffer; Adam: m
    void* state2;  // Adam: v
    std::int64_t numel;
    std::array<double, kStepScalars> scalars;
    std::int32_t group;      // index into StepState::lrs
    std::int32_t parameter;  // index into StepState::steps
    void* copy = nullptr;  // Parameter::reduced_copy (f32 parameters), rewritten by the step's kernel; null: none
    DType copy_dtype = DType::bf16;
};

constexpr std::int32_t kCopyBf16 = 0, kCopyF16 = 1;  // StepChunk::copy_kind
// A slice of at most kStepChunk elements of one tensor, as the kernels read it from the device table.
struct StepChunk {
    void* param;
    void* grad;
    void* state1;
    void* state2;
    std::int64_t n;
    double scalars[kStepScalars];
    std::int32_t group;
    std::int32_t parameter;
    std::int64_t blocks;  // how many blocks update its parameter (non-empty slices of all its chunks): the last
                          // to finish advances the step count
    void* copy;  // StepOperands::copy at this chunk's offset (null: none)
    std::int32_t copy_kind;
    friend bool operator==(const StepChunk&, const StepChunk&) = default;
};

// A schedule's steps whose device effect is deferred into the next fused optimizer step on one device
// (LRScheduler::step launches nothing): that step's kernel computes each group's lr as
// schedule_lr(rule, base_lrs[g], *epoch + count), its blocks store those lrs (StepState::lr_stored_groups; the
// last block the rest) and its last block advances *epoch by `count`. So a step with a per-step schedule costs no launch beyond the optimizer's. Outside a step (a host
// read, set_lr, another schedule's step) the same formula is evaluated by a one-thread kernel (nn/optim.cu).
struct ScheduleAdvance {
    ScheduleRule rule{};
    const double* base_lrs = nullptr;  // per group, the schedule's (device)
    long long* epoch = nullptr;        // the schedule's device epoch: the steps applied so far
    long long count = 0;               // steps deferred; 0: none (the step reads StepState::lrs as they are)
};

// The optimizer's scalars that live in device memory (one set per device), read by every fused step:
// a captured step replays the kernels that read and advance them, so replays see the lr a schedule set
// and the step count the previous replay reached. GradScaler adds its two flags for one step.
struct StepState {
    double* lrs = nullptr;              // per group: the lr of the next step (but see `schedule`)
    // Per group, meaningful while a schedule advance is deferred: an lr set_lr() wrote after the schedule's
    // step, which wins over the schedule's lr for that one step (as it did when the schedule wrote the lrs
    // at once); negative: none. Consumed (reset) with the advance.
    double* lr_overrides = nullptr;
    int groups = 0;
    ScheduleAdvance schedule;
    // Per launch: whether this launch's last block applies `schedule` (the last launch of a step on this
    // device), its blocks that hold elements (the arrivals that make the last), and the device's counter.
    bool applies_schedule = false;
    unsigned launch_blocks = 0;
    unsigned* block_counter = nullptr;
    long long* steps = nullptr;         // per parameter: updates so far (the kernel uses steps + 1)
    unsigned long long* arrivals = nullptr;  // per parameter: chunks finished in this launch (0 between)
    const float* inv_scale = nullptr;   // gradients are multiplied by it; null: by 1
    const float* found_inf = nullptr;   // non-zero: the whole step is skipped (nothing changes); null: never
    // clip_grad_norm's coefficient (Optimizer::clip_grad_norm_and_step): where it is not 1, every gradient is
    // multiplied by it (in the gradient's dtype, as clip_grad_norm's scaling pass) and written back before
    // the update reads it (and before inv_scale); null: no clipping.
    const double* clip = nullptr;
    // Per launch, with a deferred schedule advance: bit g set when group g (< 64) has a non-empty block in this
    // step (any launch). Such a block stores the lr it computed into lrs[g] (every writer the same bits, and
    // with a deferred advance no update reads lrs), so the applying block evaluates the schedule again only
    // for the other groups, or for all when GradScaler skipped the step (its blocks computed no lr).
    std::uint64_t lr_stored_groups = 0;
};

// The device-side chunk table of one optimizer on one device. Gradients are re-allocated by every
// backward, so the table usually changes from step to step; it is re-uploaded, with one asynchronous
// copy from pinned memory, only when its contents differ from the last upload. Two pinned slots take
// turns; a slot is rewritten only after the copy that last read it has run (an event two uploads old,
// so the host never waits on the current step's work). No device synchronisation, no per-step
// allocation: the device array comes from the pool and grows only with the number of chunks.
class StepTable {
public:
    explicit StepTable(int device);
    ~StepTable();
    StepTable(const StepTable&) = delete;
    StepTable& operator=(const StepTable&) = delete;

    // The device address of `chunks` (uploaded when they changed), valid for kernels queued next.
    const StepChunk* upload(const std::vector<StepChunk>& chunks);
    int device() const { return device_; }

private:
    int device_;
    std::vector<StepChunk> uploaded_;
    Tensor table_;  // device bytes for at least uploaded_.size() chunks
    std::size_t pinned_capacity_ = 0;  // chunks per slot
    std::array<void*, 2> pinned_{};
    std::array<StreamEvent, 2> copied_;
    int next_slot_ = 0;
};

// Fused steps over every operand (on the table's device): one kernel launch per dtype; the last applies
// state.schedule. False when nothing was launched (no elements): a deferred schedule advance is then still due.
bool sgd_step(StepTable& table, std::span<const StepOperands> tensors, const StepState& state);
bool adam_step(StepTable& table, std::span<const StepOperands> tensors, const StepState& state);
// GraphError (cuda::throw_if_capturing) when this thread is capturing `device`'s stream.
void refuse_in_capture(int device, const char* what, const char* why);
// One thread on `device`: applies state.schedule as a step's last block would (the lrs, the overrides, the
// epoch), for a deferred advance that cannot wait for the next step (another schedule's step).
void apply_schedule(int device, const StepState& state);
// One thread on `device`: out[g] = the lr group g's next step will use (state.groups of them), changing nothing:
// what a host read reports while a schedule advance is deferred.
void next_lrs(int device, const StepState& state, double* out);

}  // namespace cuda

}  // namespace dyngrad

// ---- 3. Clipping and loss scaling: the gradients and their GPU passes ----
namespace dyngrad {

class Parameter;
// What the caller of gradient_targets does with the gradients: only reads them (GradScaler's inf check without
// unscaling), or scales them in place (clipping, unscale()), which needs each one's storage owned alone.
enum class GradientUse { read, scale_in_place };
// The trainable parameters' gradients for clipping and loss scaling (made exclusive for scale_in_place);
// ValueError/DeviceError naming `what` (nn/optim.cpp).
std::vector<Tensor*> gradient_targets(const std::vector<Parameter>& parameters, const char* what,
                                      GradientUse use = GradientUse::scale_in_place);

namespace cuda {

// Gradient clipping on one device, queued on its stream with no host synchronisation. `grads` are
// (pointer, numel, dtype) triples. clip_norm: the norm of all grads (into `norm`, a 0-d tensor of its
// dtype on the device) and grads *= min(1, max_norm / (norm + eps)) read from the device.
struct GradOperand {
    DType dtype;
    void* data;
    std::int64_t numel;
};
inline std::vector<GradOperand> grad_operands(const std::vector<Tensor*>& grads) {
    std::vector<GradOperand> out;
    for (Tensor* grad : grads) out.push_back({grad->dtype(), grad->raw_data(), grad->numel()});
    return out;
}
// With `coefficient` (a 0-d float64 tensor on the device), the coefficient is left there and the gradients
// are not scaled: a fused step (StepState::clip) applies it.
void clip_norm(int device, std::span<const GradOperand> grads, double max_norm, double norm_type, double eps,
               Tensor& norm, Tensor* coefficient = nullptr);
void clip_value(int device, std::span<const GradOperand> grads, double clip_value);

// GradScaler (nn/optim.h) on one device, queued with no host synchronisation (capturable):
// scaler_check: inv_scale = 1/scale (computed in double, rounded to float), found_inf = 0, then found_inf = 1
// when any grad·inv_scale is not finite; with `unscale`, grads = grad·inv_scale in place as well.
void scaler_check(int device, std::span<const GradOperand> grads, const float* scale, float* inv_scale,
                  float* found_inf, bool unscale);
// The scale update, PyTorch's rule: found_inf: scale *= backoff, tracker = 0, ++skips; else ++tracker,
// skips = 0, and at tracker == interval: scale *= growth (when finite), tracker = 0. When skips reaches
// max_skips with scale below min_scale, the device error record gets loss_scale_collapsed (NumericalError
// at the next host synchronisation).
struct ScalerRule {
    double growth = 2, backoff = 0.5, min_scale = 1;
    long long interval = 2000, max_skips = 16;
};
void scaler_update(int device, const ScalerRule& rule, float* scale, long long* tracker, long long* skips,
                   const float* found_inf);

}  // namespace cuda

}  // namespace dyngrad

// ---- 4. The per-device tables, the update rules' halves, the checks and entry readers ----
namespace dyngrad {

struct Optimizer::DeviceTables {
    // What the fused steps of one device read: the chunk table and the device-resident scalars.
    struct OnDevice {
        explicit OnDevice(int device) : table(device) {}
        cuda::StepTable table;
        Tensor lrs;       // f64 (groups)
        Tensor steps;     // i64 (parameters): updates so far
        Tensor arrivals;  // i64 (parameters): the kernels' per-launch chunk counters, zero between launches
        Tensor lr_overrides;  // f64 (groups): set_lr's values while a schedule advance is deferred; -1: none
        // A schedule's steps the next fused step applies (cuda::ScheduleAdvance; count 0: none), and the
        // schedule's device epoch and base lrs, kept alive until then.
        cuda::ScheduleAdvance deferred;
        Tensor deferred_epoch, deferred_base_lrs;

        cuda::StepState state(const Gate* gate, const Tensor* clip) const {
            cuda::StepState s;
            if (clip != nullptr) s.clip = clip->data<double>();
            s.lrs = lrs.data<double>();
            s.lr_overrides = lr_overrides.data<double>();
            s.groups = static_cast<int>(lrs.numel());
            s.schedule = deferred;
            s.steps = reinterpret_cast<long long*>(steps.data<std::int64_t>());
            s.arrivals = reinterpret_cast<unsigned long long*>(arrivals.data<std::int64_t>());
            if (gate != nullptr) {
                s.inv_scale = gate->inv_scale.data<float>();
                s.found_inf = gate->found_inf.data<float>();
            }
            return s;
        }
        // After a fused step that launched: the deferred advance is applied.
        void launched() { deferred.count = 0; }
        // Group g's lr from the host: the device lr, or while a schedule advance is deferred the override,
        // which wins over the schedule's lr for the next step (a fill kernel: capturable).
        void write_lr(int device, std::size_t group, double lr) {
            const Tensor& target = deferred.count > 0 ? lr_overrides : lrs;
            device_memory::fill(target.data<double>() + group, 1, lr, DType::f64, device);
        }
        // The lrs the next step uses (a device tensor; with a deferred advance computed by a kernel that
        // changes nothing): what host reads report.
        Tensor next_lrs(int device) const {
            if (deferred.count == 0) return lrs;
            Tensor out = Tensor::empty(lrs.shape(), DType::f64, lrs.device());
            cuda::next_lrs(device, state(nullptr, nullptr), out.data<double>());
            return out;
        }
        // Defers one step of the schedule whose device epoch and base lrs these are; another schedule's
        // deferred steps are applied first (a kernel), so each keeps its order.
        void defer_schedule_step(int device, const ScheduleRule& rule, const Tensor& epoch, const Tensor& base_lrs) {
            auto* epoch_address = reinterpret_cast<long long*>(epoch.data<std::int64_t>());
            if (deferred.count > 0 && deferred.epoch != epoch_address) {
                cuda::apply_schedule(device, state(nullptr, nullptr));
                deferred.count = 0;
            }
            deferred = {rule, base_lrs.data<double>(), epoch_address, deferred.count + 1};
            deferred_epoch = epoch;
            deferred_base_lrs = base_lrs;
        }
        // How many steps of the schedule with this device epoch are deferred here.
        std::int64_t deferred_steps_of(const Tensor& epoch) const {
            return deferred.epoch == reinterpret_cast<const long long*>(epoch.data<std::int64_t>()) ? deferred.count
                                                                                                  : 0;
        }
    };
    std::map<int, OnDevice> by_device;

    // Device `device`'s scalars, made from the host's values at the first GPU step there (host-to-device
    // copies, so that first step cannot be captured).
    OnDevice& on(int device, const std::vector<Group>& groups, const std::vector<std::int64_t>& steps,
                 const char* optimizer) {
        const auto found = by_device.find(device);
        if (found != by_device.end()) return found->second;
        cuda::refuse_in_capture(device, str(optimizer, "::step()").c_str(),
                                "its first step on a device creates the device-resident lrs and step counts "
                                "(host-to-device copies); run one step eagerly before capturing (CapturedStep's "
                                "warm-up run does)");
        std::vector<double> lrs;
        for (const Group& group : groups) lrs.push_back(group.settings.lr);
        const Device where = Device::cuda(device);
        Tensor lr_values = Tensor::from_vector(lrs, {static_cast<std::int64_t>(lrs.size())}, DType::f64).to(where);
        Tensor step_values = Tensor::from_vector(steps, {static_cast<std::int64_t>(steps.size())}).to(where);
        Tensor arrivals = Tensor::zeros({static_cast<std::int64_t>(steps.size())}, DType::i64, where);
        Tensor overrides = Tensor::full({static_cast<std::int64_t>(lrs.size())}, -1.0, DType::f64).to(where);
        auto& on = by_device.try_emplace(device, device).first->second;
        on.lrs = std::move(lr_values);
        on.steps = std::move(step_values);
        on.arrivals = std::move(arrivals);
        on.lr_overrides = std::move(overrides);
        return on;
    }
};

struct Optimizer::StepRule {
    std::function<void(std::size_t, double)> cpu;  // parameter i on the CPU, with the gate's inverse scale
    std::function<cuda::StepOperands(std::size_t)> gpu;  // parameter i's operands for the fused kernel
    bool (*fused)(cuda::StepTable&, std::span<const cuda::StepOperands>, const cuda::StepState&);

    // Parameter i of `optimizer` with its gradient, state tensors (undefined: none) and group settings.
    static cuda::StepOperands operands(const Optimizer& optimizer, std::size_t i, const Tensor& state1,
                                       const Tensor& state2, const std::array<double, kStepScalars>& settings) {
        const Tensor& value = optimizer.parameters_[i].value();
        return {value.dtype(),
                value.raw_data(),
                optimizer.parameters_[i].grad().raw_data(),
                state1.defined() ? state1.raw_data() : nullptr,
                state2.defined() ? state2.raw_data() : nullptr,
                value.numel(),
                settings,
                static_cast<std::int32_t>(optimizer.group_of_[i]),
                static_cast<std::int32_t>(i)};
    }
};

namespace optim_detail {

constexpr const char* kSchedulePrefix = "@schedule.";
constexpr const char* kScheduleType = "dyngrad.schedule";

// The one check of every optimizer's and schedule's hyperparameters (lr, momentum, weight decay, eps,
// gamma, eta_min; set_lr too, so a schedule cannot step to an lr of inf): NaN and ±inf are refused with
// the negative values. Betas are checked against [0, 1), which refuses them as well.
void check_non_negative(const std::string& who, const char* what, double value);

// The entry `key` of a checkpoint, with the dtype and shape it must have.
const Tensor& entry(const TensorMap& tensors, const std::string& key, DType dtype, const Shape& shape,
                    const std::string& source);

// ValueError when the rank-1 entry `key` has another length than `groups`: a checkpoint of another group
// layout (`what` names the groups in the message). Nothing when the entry is missing or of another rank.
void check_group_count(const TensorMap& tensors, const std::string& key, std::int64_t groups, const std::string& what,
                       const std::string& source);

// IoError for an entry under `prefix` that was not read (`used`): a checkpoint of another model or optimizer.
void check_no_extra(const TensorMap& tensors, const std::string& prefix, const std::set<std::string>& used,
                    const std::string& source);

// ValueError unless the metadata entry `key` names `expected`, the optimizer or schedule type (`what`) being
// loaded; IoError without one.
void check_type_entry(const SafetensorsMetadata& metadata, const char* key, const char* what, const char* expected,
                      const std::string& source);

}  // namespace optim_detail

}  // namespace dyngrad

// ---- 5. The batched passes over many gradients (nvcc only: nn/clip.cu, nn/optim.cu's GradScaler kernels) ----
// A batch of gradients of one dtype passed by value as a kernel argument, a flat grid of fixed slices over it,
// and the host loop that cuts the gradients into batches.
#ifdef __CUDACC__
namespace dyngrad::cuda {

// A block's slice: kBatchSlice elements, kBatchPerThread (8) per thread, as an optimizer step's slice.
constexpr unsigned kBatchThreads = 256;
constexpr std::int64_t kBatchSlice = 2048;
constexpr int kBatchPerThread = static_cast<int>(kBatchSlice / kBatchThreads);
static_assert(kBatchSlice % kBatchThreads == 0, "a slice is a whole number of elements per thread");

// Up to kGradBatch gradients of one dtype, passed by value as a kernel argument (no table to upload, so
// nothing waits on the host and a captured step keeps its own copy). Every pass over them is one launch of a
// flat grid: kBatchSlice elements (8 per thread) per block, tensor after tensor; first_block is the prefix
// sum of the tensors' block counts, and a block finds its tensor by a binary search of it. The norm's
// partial sums used to run one block per 32K-element chunk: 128 dependent loads per thread and, for the
// GPT's 10.8M parameters, 64 blocks per launch in 6 launches (ncu: 28 µs for lenet's 61k parameters, 400 µs
// for the GPT, where the bytes need 20 µs).
constexpr int kGradBatch = 120;  // 120 · 24 bytes: the argument stays under the 4 KB of every CUDA version
struct GradBatch {
    void* data[kGradBatch];
    std::int64_t n[kGradBatch];
    std::int64_t first_block[kGradBatch + 1];  // first_block[count]: the launch's blocks
    std::int64_t first_partial;  // index of this launch's first block in the norm's partial sums
    int count;
};

struct BlockSlice {
    int tensor;
    std::int64_t begin;  // this thread's first element
    std::int64_t end;    // the slice's end
};

// The tensor and slice of this block: the last tensor whose first block is at most blockIdx.x (tensors
// without elements are never put in a batch, so that is the tensor holding the block).
__device__ inline BlockSlice block_slice(const GradBatch& batch) {
    const auto block = static_cast<std::int64_t>(blockIdx.x);
    int low = 0, high = batch.count - 1;
    while (low < high) {
        const int middle = (low + high + 1) / 2;
        if (batch.first_block[middle] <= block) low = middle;
        else high = middle - 1;
    }
    const std::int64_t slice_start = (block - batch.first_block[low]) * kBatchSlice;
    return {low, slice_start + threadIdx.x, std::min(batch.n[low], slice_start + kBatchSlice)};
}

// A launch's grid stays well inside gridDim.x's 2^31 − 1 blocks.
constexpr std::int64_t kMaxBatchBlocks = std::int64_t{1} << 30;

// DTypeError unless every gradient is f32 or f64 (the batched kernels' types): called before anything is queued,
// so a refused call changes no state (a bf16/f16 gradient would otherwise be skipped).
inline void require_batch_dtypes(std::span<const GradOperand> grads, const char* what) {
    for (const GradOperand& g : grads)
        if (g.dtype != DType::f32 && g.dtype != DType::f64)
            throw DTypeError(str(what, ": gradients must be float32 or float64 on the GPU, got ", dtype_name(g.dtype)));
}

// Calls launch(dtype, batch, blocks) over batches of up to kGradBatch gradients of one dtype (a gradient
// larger than kMaxBatchBlocks slices is cut into several entries); returns the blocks launched in all, which
// is the number of partial sums the norm writes.
template <typename Launch>
std::int64_t for_each_batch(std::span<const GradOperand> grads, const char* what, Launch launch) {
    require_batch_dtypes(grads, what);
    std::int64_t blocks_so_far = 0;
    for (const DType dtype : {DType::f32, DType::f64}) {
        GradBatch batch{};
        const auto flush = [&] {
            if (batch.count == 0) return;
            const std::int64_t blocks = batch.first_block[batch.count];
            launch(dtype, batch, static_cast<unsigned>(blocks));
            blocks_so_far += blocks;
            batch.count = 0;
            batch.first_block[0] = 0;
        };
        for (const GradOperand& g : grads) {
            if (g.dtype != dtype) continue;
            const auto width = static_cast<std::int64_t>(dtype_size(dtype));
            for (std::int64_t offset = 0; offset < g.numel;) {
                if (batch.count == 0) batch.first_partial = blocks_so_far;
                const std::int64_t room = kMaxBatchBlocks - batch.first_block[batch.count];
                const std::int64_t n = std::min(g.numel - offset, room * kBatchSlice);
                batch.data[batch.count] = static_cast<char*>(g.data) + offset * width;
                batch.n[batch.count] = n;
                batch.first_block[batch.count + 1] = batch.first_block[batch.count] + (n + kBatchSlice - 1) / kBatchSlice;
                offset += n;
                if (++batch.count == kGradBatch || batch.first_block[batch.count] == kMaxBatchBlocks) flush();
            }
        }
        flush();
    }
    return blocks_so_far;
}

}  // namespace dyngrad::cuda
#endif  // __CUDACC__
