// GradScaler (nn/amp.h): the host logic, the CPU rules, and the calls into the GPU passes
// (nn/optim.cu: scaler_check, scaler_update; the optimizer's fused step reads the flags).
#include "dyngrad/nn/amp.h"

#include <cmath>

#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/optim_internal.h"
#include "dyngrad/ops/elementwise.h"

namespace dyngrad {

namespace {

constexpr const char* kScalerPrefix = "@scaler.";
constexpr const char* kScalerType = "dyngrad.scaler";

// The one-element entry `key` of a checkpoint as a double (IoError when missing, DTypeError/ShapeError when
// it is not one element of `dtype`).
double scalar_entry(const TensorMap& tensors, const std::string& key, DType dtype, const std::string& source) {
    const auto found = tensors.find(key);
    if (found == tensors.end()) throw IoError(str("checkpoint '", source, "' has no tensor '", key, "'"));
    if (found->second.dtype() != dtype)
        throw DTypeError(str("checkpoint '", source, "': tensor '", key, "' is ", dtype_name(found->second.dtype()),
                             ", expected ", dtype_name(dtype)));
    if (found->second.numel() != 1)
        throw ShapeError(str("checkpoint '", source, "': tensor '", key, "' has shape ",
                             to_string(found->second.shape()), ", expected one element"));
    return found->second.item();
}

}  // namespace

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

void GradScaler::save_state(TensorMap& tensors, SafetensorsMetadata& metadata) const {
    const std::string prefix = kScalerPrefix;
    metadata[kScalerType] = "GradScaler";
    tensors[prefix + "scale"] = Tensor::full({1}, scale_value(), DType::f64);
    tensors[prefix + "growth_tracker"] = Tensor::from_vector(std::vector<std::int64_t>{growth_tracker()}, {1});
    tensors[prefix + "skips"] = Tensor::from_vector(std::vector<std::int64_t>{consecutive_skips()}, {1});
}

std::function<void()> GradScaler::stage_state(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                                              const std::string& source) {
    if (scaled_ || unscaled_)
        throw ValueError(str("checkpoint '", source, "': GradScaler state loaded between scale() and step(); the "
                             "pending gradients were scaled by the current scale: load it before scale() or after step()"));
    if (!metadata.contains(kScalerType))
        throw IoError(str("checkpoint '", source, "' holds no GradScaler state (no metadata '", kScalerType, "')"));
    const std::string prefix = kScalerPrefix;
    const double scale = scalar_entry(tensors, prefix + "scale", DType::f64, source);
    const double tracker = scalar_entry(tensors, prefix + "growth_tracker", DType::i64, source);
    const double skips = scalar_entry(tensors, prefix + "skips", DType::i64, source);
    if (!(scale > 0) || !std::isfinite(scale))
        throw ValueError(str("checkpoint '", source, "': GradScaler scale ", scale, " is not positive and finite"));
    if (tracker < 0 || skips < 0)
        throw ValueError(str("checkpoint '", source, "': GradScaler growth tracker ", tracker, " or skips ", skips,
                             " is negative"));
    for (const auto& [key, value] : tensors)
        if (key.starts_with(prefix) && key != prefix + "scale" && key != prefix + "growth_tracker" &&
            key != prefix + "skips")
            throw IoError(str("checkpoint '", source, "' has tensor '", key, "' that GradScaler does not have"));
    return [this, scale, tracker, skips] {
        // In place: a captured step reads these addresses.
        scale_.copy_from(Tensor::full({}, scale, DType::f32));
        inv_scale_.copy_from(Tensor::full({}, 1.0 / scale, DType::f32));
        tracker_.copy_from(Tensor::full({}, tracker, DType::i64));
        skips_.copy_from(Tensor::full({}, skips, DType::i64));
    };
}

void GradScaler::load_state(const TensorMap& tensors, const SafetensorsMetadata& metadata, const std::string& source) {
    stage_state(tensors, metadata, source)();
}

}  // namespace dyngrad
