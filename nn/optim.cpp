// Optimizers and learning-rate schedules (nn/optim.h). CPU parameters are updated here with Eigen,
// one tensor at a time; CUDA parameters are gathered per device and updated by the fused multi-tensor
// kernels of nn/optim.cu. Both backends apply the same formulas in the same order
// (nn/optim_kernels.h holds the per-step scalars they share).
#include "dyngrad/nn/optim.h"

#include <Eigen/Core>
#include <cmath>
#include <map>
#include <numbers>
#include <set>

#include "dyngrad/nn/optim_kernels.h"

namespace dyngrad {

struct Optimizer::DeviceTables {
#if DYNGRAD_WITH_CUDA
    std::map<int, cuda::StepTable> by_device;
    cuda::StepTable& on(int device) { return by_device.try_emplace(device, device).first->second; }
#endif
};

namespace {

template <typename T>
using Array1 = Eigen::Array<T, Eigen::Dynamic, 1>;
template <typename T>
Eigen::Map<Array1<T>> map(const Tensor& t) {
    return {t.data<T>(), t.numel()};
}
template <typename T>
Eigen::Map<const Array1<T>> map_const(const Tensor& t) {
    return {t.data<T>(), t.numel()};
}

// The state of parameter i, for the state accessors.
template <typename State>
const State& state_at(const std::vector<State>& states, std::size_t i, const char* optimizer) {
    if (i >= states.size())
        throw IndexError(str(optimizer, ": parameter index ", i, " is out of range for ", states.size(),
                             " parameters"));
    return states[i];
}

// The one check of every optimizer's and schedule's hyperparameters (lr, momentum, weight decay, eps,
// gamma, eta_min; set_lr too, so a schedule cannot step to an lr of inf): NaN and ±inf are refused with
// the negative values. Betas are checked against [0, 1), which refuses them as well.
void check_non_negative(const char* optimizer, const char* what, double value) {
    if (!(value >= 0) || !std::isfinite(value))
        throw ValueError(str(optimizer, ": ", what, " must be finite and non-negative, got ", value));
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

// param, grad, buffer (n). g = grad + wd·p; buffer = momentum·buffer + g; g = nesterov ? g + momentum·buffer
// : buffer; p -= lr·g.  `buffer` is undefined without momentum.
template <typename T>
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buffer, const SgdHyper& h) {
    auto p = map<T>(param);
    Array1<T> g = map_const<T>(grad);
    if (h.weight_decay != 0) g += static_cast<T>(h.weight_decay) * p;
    if (buffer.defined()) {
        auto b = map<T>(buffer);
        const auto momentum = static_cast<T>(h.momentum);
        b = momentum * b + g;
        if (h.nesterov) g += momentum * b;
        else g = b;
    }
    p -= static_cast<T>(h.lr) * g;
}

// param, grad, m, v (n); the formulas of AdamScalars.
template <typename T>
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamScalars& s) {
    auto p = map<T>(param);
    auto m = map<T>(exp_avg);
    auto v = map<T>(exp_avg_sq);
    if (s.decay != 1) p *= static_cast<T>(s.decay);
    Array1<T> g = map_const<T>(grad);
    if (s.l2 != 0) g += static_cast<T>(s.l2) * p;
    m = static_cast<T>(s.beta1) * m + static_cast<T>(s.one_minus_beta1) * g;
    v = static_cast<T>(s.beta2) * v + static_cast<T>(s.one_minus_beta2) * g.square();
    p -= static_cast<T>(s.step_size) * m / (v.sqrt() / static_cast<T>(s.bias2_sqrt) + static_cast<T>(s.eps));
}

}  // namespace

// ---- Optimizer ----

Optimizer::Optimizer(std::vector<Parameter> parameters, double lr)
    : parameters_(std::move(parameters)), lr_(lr), tables_(std::make_unique<DeviceTables>()) {
    check_non_negative("optimizer", "lr", lr);
    std::set<const Tensor*> seen;  // a Parameter's identity: the address of its shared value
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const Parameter& p = parameters_[i];
        if (!p.defined()) throw ValueError(str("optimizer: parameter ", i, " is undefined"));
        if (!seen.insert(&p.value()).second)
            throw ValueError(str("optimizer: parameter '", p.name(), "' (number ", i, ") is listed twice"));
    }
}

Optimizer::~Optimizer() = default;

std::vector<std::size_t> Optimizer::with_grad() const {
    std::vector<std::size_t> ready;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const Parameter& p = parameters_[i];
        const Tensor& grad = p.grad();
        if (!grad.defined()) continue;
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
    check_non_negative("optimizer", "lr", lr);
    lr_ = lr;
}

// ---- SGD ----

SGD::SGD(std::vector<Parameter> parameters, const SgdOptions& options)
    : Optimizer(std::move(parameters), options.lr), options_(options), momentum_buffers_(parameters_.size()) {
    check_non_negative("SGD", "momentum", options.momentum);
    check_non_negative("SGD", "weight_decay", options.weight_decay);
    if (options.nesterov && options.momentum == 0) throw ValueError("SGD: nesterov needs a momentum above 0");
}

void SGD::step() {
    const SgdHyper hyper{lr_, options_.momentum, options_.weight_decay, options_.nesterov};
    // Everything that can throw happens before the first update: an error leaves every parameter as it was.
    const std::vector<std::size_t> ready = with_grad();
    std::vector<Tensor> buffers(parameters_.size());
    if (hyper.momentum != 0)
        for (const std::size_t i : ready) buffers[i] = state_for(momentum_buffers_[i], parameters_[i]);
#if DYNGRAD_WITH_CUDA
    std::map<int, std::vector<cuda::StepOperands>> on_gpu;
#endif
    for (const std::size_t i : ready) {
        const Tensor& value = parameters_[i].value();
        const Tensor& grad = parameters_[i].grad();
        const Tensor& buffer = buffers[i];
        // An in-place write (here on the CPU, in the fused launch below on a GPU): a recorded graph whose
        // backward still needs the old value now refuses to run (Tensor::bump_version).
        value.bump_version();
        if (value.device().is_cpu()) {
            dispatch_floating(value.dtype(), "SGD", [&]<typename T>() { sgd_update<T>(value, grad, buffer, hyper); });
            continue;
        }
#if DYNGRAD_WITH_CUDA
        on_gpu[value.device().index].push_back({value.dtype(), value.raw_data(), grad.raw_data(),
                                                buffer.defined() ? buffer.raw_data() : nullptr, nullptr,
                                                value.numel(), 0});
#endif
    }
#if DYNGRAD_WITH_CUDA
    for (const auto& [device, tensors] : on_gpu) cuda::sgd_step(tables_->on(device), tensors, hyper);
#endif
}

const Tensor& SGD::momentum_buffer(std::size_t i) const { return state_at(momentum_buffers_, i, "SGD"); }

// ---- Adam / AdamW ----

Adam::Adam(std::vector<Parameter> parameters, const AdamOptions& options)
    : Adam(std::move(parameters), options, false) {}

Adam::Adam(std::vector<Parameter> parameters, const AdamOptions& options, bool decoupled_weight_decay)
    : Optimizer(std::move(parameters), options.lr),
      options_(options),
      decoupled_(decoupled_weight_decay),
      exp_avg_(parameters_.size()),
      exp_avg_sq_(parameters_.size()),
      steps_(parameters_.size(), 0) {
    const char* name = decoupled_ ? "AdamW" : "Adam";
    if (!(options.beta1 >= 0 && options.beta1 < 1) || !(options.beta2 >= 0 && options.beta2 < 1))
        throw ValueError(str(name, ": betas must be in [0, 1), got ", options.beta1, " and ", options.beta2));
    check_non_negative(name, "eps", options.eps);
    check_non_negative(name, "weight_decay", options.weight_decay);
}

void Adam::step() {
    const AdamHyper hyper{lr_, options_.beta1, options_.beta2, options_.eps, options_.weight_decay, decoupled_};
    const std::vector<std::size_t> ready = with_grad();
    for (const std::size_t i : ready) {
        state_for(exp_avg_[i], parameters_[i]);
        state_for(exp_avg_sq_[i], parameters_[i]);
    }
#if DYNGRAD_WITH_CUDA
    std::map<int, std::vector<cuda::StepOperands>> on_gpu;
#endif
    for (const std::size_t i : ready) {
        const Tensor& value = parameters_[i].value();
        const Tensor& grad = parameters_[i].grad();
        const std::int64_t step = ++steps_[i];
        value.bump_version();
        if (value.device().is_cpu()) {
            const AdamScalars scalars = adam_scalars(hyper, step);
            dispatch_floating(value.dtype(), decoupled_ ? "AdamW" : "Adam", [&]<typename T>() {
                adam_update<T>(value, grad, exp_avg_[i], exp_avg_sq_[i], scalars);
            });
            continue;
        }
#if DYNGRAD_WITH_CUDA
        on_gpu[value.device().index].push_back({value.dtype(), value.raw_data(), grad.raw_data(),
                                                exp_avg_[i].raw_data(), exp_avg_sq_[i].raw_data(), value.numel(),
                                                step});
#endif
    }
#if DYNGRAD_WITH_CUDA
    for (const auto& [device, tensors] : on_gpu) cuda::adam_step(tables_->on(device), tensors, hyper);
#endif
}

const Tensor& Adam::exp_avg(std::size_t i) const { return state_at(exp_avg_, i, decoupled_ ? "AdamW" : "Adam"); }
const Tensor& Adam::exp_avg_sq(std::size_t i) const {
    return state_at(exp_avg_sq_, i, decoupled_ ? "AdamW" : "Adam");
}
std::int64_t Adam::step_count(std::size_t i) const { return state_at(steps_, i, decoupled_ ? "AdamW" : "Adam"); }

AdamW::AdamW(std::vector<Parameter> parameters, const AdamOptions& options)
    : Adam(std::move(parameters), options, true) {}

// ---- schedules ----

StepLR::StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma)
    : optimizer_(optimizer), step_size_(step_size), gamma_(gamma), base_lr_(optimizer.lr()) {
    if (step_size <= 0) throw ValueError(str("StepLR: step_size must be positive, got ", step_size));
    check_non_negative("StepLR", "gamma", gamma);
}

double StepLR::lr_at(std::int64_t epoch) const {
    return base_lr_ * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

void StepLR::step() { optimizer_.set_lr(lr_at(++epoch_)); }

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, std::int64_t t_max, double eta_min)
    : optimizer_(optimizer), t_max_(t_max), eta_min_(eta_min), base_lr_(optimizer.lr()) {
    if (t_max <= 0) throw ValueError(str("CosineAnnealingLR: T_max must be positive, got ", t_max));
    check_non_negative("CosineAnnealingLR", "eta_min", eta_min);
}

double CosineAnnealingLR::lr_at(std::int64_t epoch) const {
    const double phase = std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(t_max_);
    return eta_min_ + (base_lr_ - eta_min_) * (1 + std::cos(phase)) / 2;
}

void CosineAnnealingLR::step() { optimizer_.set_lr(lr_at(++epoch_)); }

}  // namespace dyngrad
