// Optimizers and the loss scaler that gates their step (nn/optim.h), and the gradients clipping and loss scaling
// act on (gradient_targets); the schedules: nn/schedules.cpp; clipping: nn/clip.cpp; the optimizer's and scaler's
// checkpoint state: nn/checkpoint.cpp. CPU parameters are updated here one tensor at a time; CUDA parameters are
// gathered per device and updated by the fused multi-tensor kernels of nn/optim.cu (GradScaler's check and update
// kernels too). Both backends call the same per-element rules (nn/optim_internal.h). Over 600 lines: the step and
// the scaler that gates it are one protocol (Optimizer::Gate, found_inf, inv_scale), kept in one file to read.
#include "dyngrad/nn/optim.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/nn/optim_internal.h"
#include "dyngrad/ops/elementwise.h"

namespace dyngrad {

using optim_detail::check_non_negative;

namespace {

// The state of parameter i, for the state accessors.
template <typename State>
const State& state_at(const std::vector<State>& states, std::size_t i, const char* optimizer) {
    if (i >= states.size())
        throw IndexError(str(optimizer, ": parameter index ", i, " is out of range for ", states.size(),
                             " parameters"));
    return states[i];
}

// The optimizer state of one parameter: zeros on first use; it follows the parameter when that moved or
// changed dtype. A parameter that changed shape has lost the meaning of its state (ShapeError).
Tensor& state_for(Tensor& state, const Parameter& p) {
    const Tensor& value = p.value();
    if (!state.defined()) {
        state = Tensor::zeros(value.shape(), value.dtype(), value.device());
        return state;
    }
    if (state.shape() != value.shape())
        throw ShapeError(str("optimizer: parameter '", p.name(), "' changed shape from ", to_string(state.shape()),
                             " to ", to_string(value.shape()), " since its optimizer state was created"));
    if (state.dtype() != value.dtype()) state = state.to(value.dtype());
    if (state.device() != value.device()) state = state.to(value.device());
    return state;
}

// param, grad, buffer (n), one element at a time through the rule the fused kernels apply (nn/optim_internal.h).
// `buffer` is undefined without momentum.
template <typename T>
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buffer, const SgdRule<T>& rule) {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* b = buffer.defined() ? buffer.data<T>() : nullptr;
    T unused = T(0);
    for (std::int64_t i = 0; i < param.numel(); ++i) rule(p[i], g[i], b != nullptr ? b[i] : unused);
}

// param, grad, m, v (n), as sgd_update.
template <typename T>
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamRule<T>& rule) {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    for (std::int64_t i = 0; i < param.numel(); ++i) rule(p[i], g[i], m[i], v[i]);
}

// The CPU rules' unscaling: by the gate's inverse scale where it is not 1.
template <typename T>
Unscale<T> cpu_unscale(double inv_scale) {
    return {static_cast<T>(inv_scale), inv_scale != 1};
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, const GroupSettings& defaults, const char* who,
                     std::span<const char* const> settable)
    : tables_(std::make_unique<DeviceTables>()) {
    const auto allowed = [&](const char* setting) {
        return std::any_of(settable.begin(), settable.end(), [&](const char* s) { return std::strcmp(s, setting) == 0; });
    };
    std::set<const Tensor*> seen;  // a Parameter's identity: the address of its shared value
    for (std::size_t g = 0; g < groups.size(); ++g) {
        ParamGroup& group = groups[g];
        GroupSettings settings = defaults;
        const auto take = [&](const char* setting, const auto& value, auto& into) {
            if (!value.has_value()) return;
            if (!allowed(setting))
                throw ValueError(str(who, ": parameter group ", g, " sets ", setting, ", which ", who, " does not have"));
            into = *value;
        };
        take("lr", group.lr, settings.lr);
        take("weight_decay", group.weight_decay, settings.weight_decay);
        take("momentum", group.momentum, settings.momentum);
        take("nesterov", group.nesterov, settings.nesterov);
        take("beta1", group.beta1, settings.beta1);
        take("beta2", group.beta2, settings.beta2);
        take("eps", group.eps, settings.eps);
        groups_.push_back({parameters_.size(), parameters_.size() + group.parameters.size(), settings});
        for (Parameter& p : group.parameters) {
            const std::size_t i = parameters_.size();
            if (!p.defined()) throw ValueError(str(who, ": parameter ", i, " is undefined"));
            if (!seen.insert(&p.value()).second)
                throw ValueError(str(who, ": parameter '", p.name(), "' (number ", i, ") is listed twice"));
            // Mixed precision keeps f32 master weights (and f32 optimizer state); reduced-precision copies for
            // compute come from to_dtype() in the forward. An update in bf16/f16 would lose small steps.
            if (is_reduced_precision(p.value().dtype()))
                throw DTypeError(str(who, ": parameter '", p.name(), "' (number ", i, ") is ",
                                     dtype_name(p.value().dtype()), "; optimizers update float32 or float64 master ",
                                     "weights: keep the parameter in float32 and cast it with to_dtype() in the ",
                                     "forward (autocast does this)"));
            parameters_.push_back(std::move(p));
            group_of_.push_back(g);
        }
    }
    steps_.assign(parameters_.size(), 0);
    state_.resize(parameters_.size());
    for (Parameter& p : parameters_) p.count_updater(1);  // its steps keep autocast's copy current (run_update)
}

Optimizer::~Optimizer() {
    for (Parameter& p : parameters_) p.count_updater(-1);
}

std::string Optimizer::group_name(std::size_t group) const {
    return groups_.size() == 1 ? std::string(name()) : str(name(), " group ", group);
}

void Optimizer::check_groups() const {
    for (std::size_t g = 0; g < groups_.size(); ++g) check_settings(groups_[g].settings, group_name(g));
}

const GroupSettings& Optimizer::settings(std::size_t group) const {
    if (group >= groups_.size())
        throw IndexError(str(name(), ": parameter group ", group, " does not exist (", groups_.size(), " groups)"));
    pull_device_scalars();
    return groups_[group].settings;
}

void Optimizer::pull_device_scalars() const {
    for (const auto& [device, on] : tables_->by_device) {
        // Before next_lrs may queue a kernel: a host read inside a capture is a GraphError.
        cuda::refuse_in_capture(device, str(name(), ": a host read of the lr or step counts").c_str(),
                                "it copies device memory to the host (a synchronisation)");
        const std::vector<double> lrs = on.next_lrs(device).to_vector();
        for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].settings.lr = lrs[g];
        const Tensor steps = on.steps.to(Device::cpu());
        for (std::size_t i = 0; i < parameters_.size(); ++i)
            if (parameters_[i].value().device() == Device::cuda(device)) steps_[i] = steps.data<std::int64_t>()[i];
    }
}

bool Optimizer::gate_skips(const Gate* gate, const Device& device) {
    if (gate == nullptr) return false;
    if (!gate->found_inf.defined() || !gate->inv_scale.defined())
        throw ValueError("optimizer: a gated step needs both its inv_scale and found_inf tensors");
    if (gate->found_inf.device() != device || gate->inv_scale.device() != device)
        throw DeviceError(str("optimizer: a gated step's flags are on ", gate->found_inf.device().to_string(),
                              " and its parameters on ", device.to_string()));
    return device.is_cpu() && gate->found_inf.data<float>()[0] != 0;
}

// The CPU updates' inverse scale. A gate on a GPU is read by the step kernel on the device (reading it here
// dereferenced device memory on the host: a segfault in test_gpu_capture).
double Optimizer::gate_inv_scale(const Gate* gate) {
    if (gate == nullptr || !gate->inv_scale.device().is_cpu()) return 1.0;
    return static_cast<double>(gate->inv_scale.data<float>()[0]);
}

// The gradients clipping (nn/clip.cpp) and loss scaling (GradScaler, below) act on, beside the step that reads them:
// trainable parameters that have one. For scale_in_place they are made exclusive (a gradient may share storage
// with a graph's values or another gradient) so that scaling one in place touches nothing else. A reader copies
// nothing: a parameter's gradient is shared with its leaf in the graph until the graph goes, so the copies cost
// every gradient's size again (256 MiB at the f16 MLP 4096 step's peak, GradScaler::step) and a device copy of each.
std::vector<Tensor*> gradient_targets(const std::vector<Parameter>& parameters, const char* what, GradientUse use) {
    std::vector<Tensor*> grads;
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        const Parameter& p = parameters[i];
        if (!p.defined()) throw ValueError(str(what, ": parameter ", i, " is undefined"));
        if (!p.requires_grad() || !p.grad().defined()) continue;
        const Tensor& grad = p.grad();
        if (grad.shape() != p.value().shape() || grad.dtype() != p.value().dtype())
            throw ValueError(str(what, ": parameter '", p.name(), "' ", describe(p.value()), " has a gradient ",
                                 describe(grad), "; call zero_grad() after changing a parameter"));
        if (!grads.empty() && grad.device() != grads.front()->device())
            throw DeviceError(str(what, ": gradients on several devices (", describe(*grads.front()), " and '",
                                  p.name(), "' ", describe(grad), "); clip each device's parameters separately"));
        grads.push_back(&const_cast<Parameter&>(p).grad_slot());
    }
    if (use == GradientUse::scale_in_place)
        for (Tensor* grad : grads)
            if (!grad->owns_storage_exclusively()) *grad = grad->clone();
    return grads;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::device_scalars() const {
    std::vector<std::pair<std::string, Tensor>> out;
    for (const auto& [device, on] : tables_->by_device) {
        out.emplace_back(str("lr.cuda", device), on.lrs);
        out.emplace_back(str("steps.cuda", device), on.steps);
        out.emplace_back(str("lr_overrides.cuda", device), on.lr_overrides);
    }
    return out;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors(std::size_t parameter) const {
    const std::array<Tensor, 2>& state = state_at(state_, parameter, name());
    const std::vector<const char*> names = state_names(groups_[group_of_[parameter]].settings);
    std::vector<std::pair<std::string, Tensor>> out;
    for (std::size_t k = 0; k < names.size(); ++k)
        if (state[k].defined()) out.emplace_back(names[k], state[k]);
    return out;
}

std::span<const Parameter> Optimizer::group_parameters(std::size_t group) const {
    settings(group);  // the index check
    return std::span<const Parameter>(parameters_).subspan(groups_[group].begin,
                                                           groups_[group].end - groups_[group].begin);
}

std::vector<std::size_t> Optimizer::with_grad() const {
    std::vector<std::size_t> ready;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const Parameter& p = parameters_[i];
        const Tensor& grad = p.grad();
        if (!grad.defined() || !p.requires_grad()) continue;
        const Tensor& value = p.value();
        if (grad.shape() != value.shape() || grad.dtype() != value.dtype() || grad.device() != value.device())
            throw ValueError(str("optimizer: parameter '", p.name(), "' ", describe(value), " has a gradient ",
                                 describe(grad), "; call zero_grad() after changing a parameter"));
        ready.push_back(i);
    }
    return ready;
}

void Optimizer::zero_grad() {
    for (Parameter& p : parameters_) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
    check_non_negative(name(), "lr", lr);
    for (std::size_t g = 0; g < groups_.size(); ++g) set_lr(g, lr);
}

void Optimizer::set_lr(std::size_t group, double lr) {
    if (group >= groups_.size())
        throw IndexError(str(name(), ": parameter group ", group, " does not exist (", groups_.size(), " groups)"));
    set_host_lr(group, lr);
    // A fill kernel with the value as its argument: stream-ordered and capturable.
    for (auto& [device, on] : tables_->by_device) on.write_lr(device, group, lr);
}

void Optimizer::set_host_lr(std::size_t group, double lr) {
    check_non_negative(group_name(group), "lr", lr);
    groups_[group].settings.lr = lr;
}

// ---- the frame of every update ----

void Optimizer::run_update(const std::vector<std::size_t>& ready, const Gate* gate, const Tensor* clip,
                           const StepRule& rule) {
    bool skip = false;
    for (const std::size_t i : ready) skip = gate_skips(gate, parameters_[i].value().device()) || skip;
    if (skip) return;  // a CPU step the scaler skips (on a GPU the kernel reads the flag)
    const double inv_scale = gate_inv_scale(gate);
    // The device scalars start from the host's counts, before this step advances them.
    for (const std::size_t i : ready)
        if (const Device d = parameters_[i].value().device(); d.is_cuda()) tables_->on(d.index, groups_, steps_, name());
    std::map<int, std::vector<cuda::StepOperands>> on_gpu;
    std::vector<std::size_t> rewrote_copy;  // parameters whose kept 16-bit copy this step rewrites
    for (const std::size_t i : ready) {
        Parameter& parameter = parameters_[i];
        const Tensor& value = parameter.value();
        ++steps_[i];
        // An in-place write (here on the CPU, in the fused launch below on a GPU): a recorded graph whose
        // backward still needs the old value now refuses to run (Tensor::bump_version).
        value.bump_version();
        // Autocast's kept copy (Parameter::reduced_copy) follows the new value: rewritten by the same kernel on a
        // GPU, cast after the update on the CPU. A copy that no longer fits the value (replaced by another shape,
        // moved) is dropped: autocast casts afresh.
        Tensor copy = parameter.reduced_copy();
        if (copy.defined() && (value.dtype() != DType::f32 || copy.shape() != value.shape() ||
                               copy.device() != value.device())) {
            parameter.drop_reduced_copy();
            copy = Tensor();
        }
        if (value.device().is_cpu()) {
            rule.cpu(i, inv_scale);
            if (copy.defined()) copy.copy_from(value.to(copy.dtype()));
        } else {
            cuda::StepOperands operands = rule.gpu(i);
            if (copy.defined()) {
                operands.copy = copy.raw_data();
                operands.copy_dtype = copy.dtype();
                copy.bump_version();  // its readers of earlier graphs see the write, as the value's do
            }
            on_gpu[value.device().index].push_back(operands);
        }
        if (copy.defined()) rewrote_copy.push_back(i);
    }
    for (const auto& [device, tensors] : on_gpu) {
        auto& on = tables_->on(device, groups_, steps_, name());
        if (rule.fused(on.table, tensors, on.state(gate, clip))) on.launched();
    }
    // After every bump: parameters may share a storage (views of one flat buffer), whose version each bump moves.
    for (const std::size_t i : rewrote_copy) parameters_[i].mark_reduced_copy_current();
}

namespace {
constexpr std::array<const char*, 4> kSgdSettings = {"lr", "weight_decay", "momentum", "nesterov"};
constexpr std::array<const char*, 5> kAdamSettings = {"lr", "weight_decay", "beta1", "beta2", "eps"};

GroupSettings sgd_defaults(const SgdOptions& o) {
    return {.lr = o.lr, .weight_decay = o.weight_decay, .momentum = o.momentum, .nesterov = o.nesterov};
}
GroupSettings adam_defaults(const AdamOptions& o) {
    return {.lr = o.lr, .weight_decay = o.weight_decay, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps};
}
std::vector<ParamGroup> one_group(std::vector<Parameter> parameters) {
    std::vector<ParamGroup> groups(1);
    groups[0].parameters = std::move(parameters);
    return groups;
}
}  // namespace

SGD::SGD(std::vector<Parameter> parameters, const SgdOptions& options)
    : SGD(one_group(std::move(parameters)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SgdOptions& defaults)
    : Optimizer(std::move(groups), sgd_defaults(defaults), "SGD", kSgdSettings) {
    check_groups();
}

void SGD::check_settings(const GroupSettings& s, const std::string& who) const {
    check_non_negative(who, "lr", s.lr);
    check_non_negative(who, "momentum", s.momentum);
    check_non_negative(who, "weight_decay", s.weight_decay);
    if (s.nesterov && s.momentum == 0) throw ValueError(str(who, ": nesterov needs a momentum above 0"));
}

std::vector<const char*> SGD::state_names(const GroupSettings& s) const {
    if (s.momentum == 0) return {};
    return {"momentum_buffer"};
}

SgdOptions SGD::options(std::size_t group) const {
    const GroupSettings& s = settings(group);
    return {.lr = s.lr, .momentum = s.momentum, .nesterov = s.nesterov, .weight_decay = s.weight_decay};
}

void SGD::update(const Gate* gate, const Tensor* clip) {
    // Everything that can throw happens before the first update: an error leaves every parameter as it was.
    const std::vector<std::size_t> ready = with_grad();
    for (const std::size_t i : ready)
        if (groups_[group_of_[i]].settings.momentum != 0) state_for(state_[i][0], parameters_[i]);
    const auto buffer_of = [this](std::size_t i) {
        return groups_[group_of_[i]].settings.momentum != 0 ? state_[i][0] : Tensor();
    };
    const auto on_cpu = [&](std::size_t i, double inv_scale) {
        const GroupSettings& s = groups_[group_of_[i]].settings;
        const Tensor& value = parameters_[i].value();
        const Tensor buffer = buffer_of(i);
        dispatch_floating(value.dtype(), "SGD", [&]<typename T>() {
            sgd_update<T>(value, parameters_[i].grad(), buffer,
                          SgdRule<T>(s.lr, s.momentum, s.weight_decay, s.nesterov, buffer.defined(),
                                     cpu_unscale<T>(inv_scale)));
        });
    };
    const auto on_gpu = [&](std::size_t i) {
        const GroupSettings& s = groups_[group_of_[i]].settings;
        return StepRule::operands(*this, i, buffer_of(i), Tensor(), {s.momentum, s.weight_decay, s.nesterov ? 1.0 : 0.0});
    };
    run_update(ready, gate, clip, StepRule{on_cpu, on_gpu, cuda::sgd_step});
}

std::int64_t Optimizer::step_count(std::size_t parameter) const {
    state_at(steps_, parameter, name());  // the index check
    pull_device_scalars();
    return steps_[parameter];
}

const Tensor& SGD::momentum_buffer(std::size_t i) const { return state_at(state_, i, "SGD")[0]; }

Adam::Adam(std::vector<Parameter> parameters, const AdamOptions& options)
    : Adam(one_group(std::move(parameters)), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults) : Adam(std::move(groups), defaults, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults, bool decoupled_weight_decay)
    : Optimizer(std::move(groups), adam_defaults(defaults), decoupled_weight_decay ? "AdamW" : "Adam", kAdamSettings),
      decoupled_(decoupled_weight_decay) {
    check_groups();
}

void Adam::check_settings(const GroupSettings& s, const std::string& who) const {
    check_non_negative(who, "lr", s.lr);
    if (!(s.beta1 >= 0 && s.beta1 < 1) || !(s.beta2 >= 0 && s.beta2 < 1))
        throw ValueError(str(who, ": betas must be in [0, 1), got ", s.beta1, " and ", s.beta2));
    check_non_negative(who, "eps", s.eps);
    check_non_negative(who, "weight_decay", s.weight_decay);
}

std::vector<const char*> Adam::state_names(const GroupSettings&) const { return {"exp_avg", "exp_avg_sq"}; }

AdamOptions Adam::options(std::size_t group) const {
    const GroupSettings& s = settings(group);
    return {.lr = s.lr, .beta1 = s.beta1, .beta2 = s.beta2, .eps = s.eps, .weight_decay = s.weight_decay};
}

void Adam::update(const Gate* gate, const Tensor* clip) {
    const std::vector<std::size_t> ready = with_grad();
    for (const std::size_t i : ready) {
        state_for(state_[i][0], parameters_[i]);
        state_for(state_[i][1], parameters_[i]);
    }
    const auto on_cpu = [&](std::size_t i, double inv_scale) {
        const GroupSettings& s = groups_[group_of_[i]].settings;
        const Tensor& value = parameters_[i].value();
        const AdamScalars scalars = adam_scalars(s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, decoupled_, steps_[i]);
        dispatch_floating(value.dtype(), name(), [&]<typename T>() {
            adam_update<T>(value, parameters_[i].grad(), state_[i][0], state_[i][1],
                           AdamRule<T>(scalars, cpu_unscale<T>(inv_scale)));
        });
    };
    // On a GPU the lr and the step count (hence the bias corrections) are read on the device (nn/optim.cu).
    const auto on_gpu = [&](std::size_t i) {
        const GroupSettings& s = groups_[group_of_[i]].settings;
        return StepRule::operands(*this, i, state_[i][0], state_[i][1],
                                  {s.beta1, s.beta2, s.eps, s.weight_decay, decoupled_ ? 1.0 : 0.0});
    };
    run_update(ready, gate, clip, StepRule{on_cpu, on_gpu, cuda::adam_step});
}

const Tensor& Adam::exp_avg(std::size_t i) const { return state_at(state_, i, name())[0]; }
const Tensor& Adam::exp_avg_sq(std::size_t i) const {
    return state_at(state_, i, name())[1];
}

AdamW::AdamW(std::vector<Parameter> parameters, const AdamOptions& options)
    : Adam(one_group(std::move(parameters)), options, true) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamOptions& defaults) : Adam(std::move(groups), defaults, true) {}

// ---- GradScaler (nn/optim.h): the host logic, the CPU rules, and the calls into the GPU passes of nn/optim.cu ----

GradScaler::GradScaler(const GradScalerOptions& o) : options_(o) {
    if (!(o.init_scale > 0) || !std::isfinite(o.init_scale))
        throw ValueError(str("GradScaler: init_scale must be positive and finite, got ", o.init_scale));
    if (!(o.growth_factor > 1) || !std::isfinite(o.growth_factor))
        throw ValueError(str("GradScaler: growth_factor must be finite and above 1, got ", o.growth_factor));
    if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
        throw ValueError(str("GradScaler: backoff_factor must be in (0, 1), got ", o.backoff_factor));
    if (o.growth_interval <= 0)
        throw ValueError(str("GradScaler: growth_interval must be positive, got ", o.growth_interval));
    if (o.max_consecutive_skips <= 0)
        throw ValueError(str("GradScaler: max_consecutive_skips must be positive, got ", o.max_consecutive_skips));
    if (!(o.min_scale >= 0) || !std::isfinite(o.min_scale))
        throw ValueError(str("GradScaler: min_scale must be finite and non-negative, got ", o.min_scale));
    scale_ = Tensor::full({}, o.init_scale, DType::f32);
    inv_scale_ = Tensor::full({}, 1.0 / o.init_scale, DType::f32);
    found_inf_ = Tensor::zeros({}, DType::f32);
    one_ = Tensor::ones({}, DType::f32);
    tracker_ = Tensor::zeros({}, DType::i64);
    skips_ = Tensor::zeros({}, DType::i64);
}

void GradScaler::place(const Device& device) {
    if (scale_.device() == device) return;
    if (device.is_cuda())
        cuda::refuse_in_capture(device.index, "GradScaler",
                                "its first use on a device moves its state there (host-to-device copies); run one "
                                "step eagerly before capturing (CapturedStep's warm-up run does)");
    for (Tensor* t : {&scale_, &inv_scale_, &found_inf_, &one_, &tracker_, &skips_}) *t = t->to(device);
}

Var GradScaler::scale(const Var& loss) {
    if (!options_.enabled) return loss;
    const Tensor& value = loss.value();
    if (!is_floating(value.dtype()))
        throw DTypeError(str("GradScaler::scale: the loss must be floating, got ", describe(value)));
    if (unscaled_)
        throw ValueError("GradScaler::scale: unscale() was already called for this step; call step() first (the "
                         "gradients of this loss would stay scaled while the others are unscaled)");
    place(value.device());
    scaled_ = true;
    const Tensor factor = value.dtype() == DType::f32 ? scale_ : scale_.to(value.dtype());
    return mul(loss, loss.graph().constant(factor));
}

void GradScaler::check(Optimizer& optimizer, bool unscale) {
    // Without unscaling the check only reads the gradients: no exclusive copies.
    const std::vector<Tensor*> grads = gradient_targets(optimizer.parameters(), "GradScaler",
                                                        unscale ? GradientUse::scale_in_place : GradientUse::read);
    const Device device = grads.empty() ? scale_.device() : grads.front()->device();
    place(device);
    if (device.is_cuda()) {
        if (unscale)
            for (Tensor* grad : grads) grad->bump_version();
        cuda::scaler_check(device.index, cuda::grad_operands(grads), scale_.data<float>(), inv_scale_.data<float>(),
                           found_inf_.data<float>(), unscale);
        return;
    }
    const float inv = static_cast<float>(1.0 / static_cast<double>(scale_.data<float>()[0]));
    bool found = false;
    for (Tensor* grad : grads) {
        if (unscale) grad->bump_version();
        dispatch_floating(grad->dtype(), "GradScaler", [&]<typename T>() {
            T* g = grad->data<T>();
            for (std::int64_t i = 0; i < grad->numel(); ++i) {
                const T v = g[i] * static_cast<T>(inv);
                found = found || !std::isfinite(v);
                if (unscale) g[i] = v;
            }
        });
    }
    inv_scale_.data<float>()[0] = inv;
    found_inf_.data<float>()[0] = found ? 1.0f : 0.0f;
}

void GradScaler::require_scaled(const char* call) const {
    if (!scaled_)
        throw ValueError(str("GradScaler::", call, ": no loss was scaled since the last step(); call scale(loss) and "
                             "backward on the scaled loss first (these gradients are not scaled: dividing them by the "
                             "scale would make the step that much too small)"));
}

void GradScaler::unscale(Optimizer& optimizer) {
    if (!options_.enabled) return;
    if (unscaled_)
        throw ValueError("GradScaler::unscale: already called since the last step(); call it once per step");
    require_scaled("unscale");
    check(optimizer, true);
    unscaled_ = true;
}

void GradScaler::step(Optimizer& optimizer) {
    if (!options_.enabled) {
        optimizer.step();
        return;
    }
    if (checked_)
        throw ValueError("GradScaler::step: already called since the last update(); call update() once per step");
    require_scaled("step");
    if (!unscaled_) check(optimizer, false);
    optimizer.step(Optimizer::Gate{unscaled_ ? one_ : inv_scale_, found_inf_});
    scaled_ = false;
    unscaled_ = false;
    checked_ = true;
}

void GradScaler::update() {
    if (!options_.enabled) return;
    if (!checked_) throw ValueError("GradScaler::update: no step() since the last update(); call step() first");
    checked_ = false;
    ++updates_;
    for (Tensor* t : {&scale_, &tracker_, &skips_}) t->bump_version();
    if (scale_.device().is_cuda()) {
        const cuda::ScalerRule rule{options_.growth_factor, options_.backoff_factor, options_.min_scale,
                                    options_.growth_interval, options_.max_consecutive_skips};
        cuda::scaler_update(scale_.device().index, rule, scale_.data<float>(),
                            reinterpret_cast<long long*>(tracker_.data<std::int64_t>()),
                            reinterpret_cast<long long*>(skips_.data<std::int64_t>()), found_inf_.data<float>());
        return;
    }
    // The rule of scaler_update_kernel (nn/optim.cu), in the same float arithmetic.
    float& scale = scale_.data<float>()[0];
    std::int64_t& tracker = tracker_.data<std::int64_t>()[0];
    std::int64_t& skips = skips_.data<std::int64_t>()[0];
    if (found_inf_.data<float>()[0] != 0.0f) {
        scale = static_cast<float>(static_cast<double>(scale) * options_.backoff_factor);
        tracker = 0;
        ++skips;
        if (skips >= options_.max_consecutive_skips && static_cast<double>(scale) < options_.min_scale)
            throw NumericalError(str("GradScaler: at step ", updates_, " (update() call ", updates_,
                                     ") the loss scale collapsed to ", scale, " after ", skips,
                                     " consecutive skipped steps (non-finite gradients at every scale): the training "
                                     "diverged"));
        return;
    }
    skips = 0;
    if (++tracker == options_.growth_interval) {
        const auto grown = static_cast<float>(static_cast<double>(scale) * options_.growth_factor);
        if (std::isfinite(grown)) scale = grown;
        tracker = 0;
    }
}

double GradScaler::scale_value() const { return options_.enabled ? scale_.item() : 1.0; }
std::int64_t GradScaler::growth_tracker() const { return static_cast<std::int64_t>(tracker_.item()); }
std::int64_t GradScaler::consecutive_skips() const { return static_cast<std::int64_t>(skips_.item()); }
bool GradScaler::last_step_skipped() const { return found_inf_.item() != 0; }

std::vector<std::pair<std::string, Tensor>> GradScaler::state_tensors() const {
    return {{"scale", scale_}, {"growth_tracker", tracker_}, {"skips", skips_}, {"found_inf", found_inf_},
            {"inv_scale", inv_scale_}};
}

}  // namespace dyngrad
