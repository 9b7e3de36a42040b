// Gradient clipping (nn/optim.h): clip_grad_norm, clip_grad_value and the optimizers' fused
// clip_grad_norm_and_step. CPU gradients are scaled here with Eigen; GPU ones by the batched passes of
// nn/clip.cu, with no host synchronisation. The gradients they act on: gradient_targets (nn/optim.cpp).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/optim_internal.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/reduce.h"

namespace dyngrad {

namespace {

template <typename T>
Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> map(Tensor& t) {
    return {t.data<T>(), t.numel()};
}

void check_clip_arguments(const char* who, double max_norm, double norm_type, double eps) {
    if (!(max_norm >= 0)) throw ValueError(str(who, ": max_norm must be non-negative, got ", max_norm));
    if (!(norm_type > 0)) throw ValueError(str(who, ": norm_type must be positive, got ", norm_type));
    if (!(eps >= 0) || !std::isfinite(eps))
        throw ValueError(str(who, ": eps must be finite and non-negative, got ", eps));
}

DType norm_dtype_of(const std::vector<Tensor*>& grads) {
    const bool any_f64 = std::any_of(grads.begin(), grads.end(), [](const Tensor* g) { return g->dtype() == DType::f64; });
    return any_f64 ? DType::f64 : DType::f32;
}

}  // namespace

Tensor Optimizer::clip_grad_norm_and_step(double max_norm, double norm_type, double eps) {
    constexpr const char* kWho = "clip_grad_norm_and_step";
    check_clip_arguments(kWho, max_norm, norm_type, eps);
    const std::vector<Tensor*> grads = gradient_targets(parameters_, kWho);
    if (!grads.empty() && grads.front()->device().is_cuda()) {
        // The norm's kernel leaves the coefficient on the device; the step's kernel clips as it reads.
        const Device device = grads.front()->device();
        Tensor norm = Tensor::empty({}, norm_dtype_of(grads), device);
        Tensor coefficient = Tensor::empty({}, DType::f64, device);
        cuda::clip_norm(device.index, cuda::grad_operands(grads), max_norm, norm_type, eps, norm, &coefficient);
        update(nullptr, &coefficient);
        return norm;
    }
    Tensor norm = clip_grad_norm(parameters_, max_norm, norm_type, eps);
    step();
    return norm;
}

Tensor clip_grad_norm(const std::vector<Parameter>& parameters, double max_norm, double norm_type, double eps) {
    check_clip_arguments("clip_grad_norm", max_norm, norm_type, eps);
    const std::vector<Tensor*> grads = gradient_targets(parameters, "clip_grad_norm");
    if (grads.empty()) return Tensor::zeros({});
    const DType norm_dtype = norm_dtype_of(grads);
    const Device device = grads.front()->device();
    if (device.is_cuda()) {
        Tensor norm = Tensor::empty({}, norm_dtype, device);
        cuda::clip_norm(device.index, cuda::grad_operands(grads), max_norm, norm_type, eps, norm);
        return norm;
    }
    const bool infinity = std::isinf(norm_type);
    double total = 0;  // Σ|g|^p, or max |g| (NaN propagates, as in PyTorch)
    for (const Tensor* grad : grads)
        dispatch_floating(grad->dtype(), "clip_grad_norm", [&]<typename T>() {
            const T* g = grad->data<T>();
            for (std::int64_t i = 0; i < grad->numel(); ++i) {
                const double a = std::abs(static_cast<double>(g[i]));
                if (infinity) total = (a > total || std::isnan(a)) ? a : total;
                else if (norm_type == 2) total += a * a;
                else if (norm_type == 1) total += a;
                else total += std::pow(a, norm_type);
            }
        });
    const double norm = infinity ? total : norm_type == 2 ? std::sqrt(total) : std::pow(total, 1 / norm_type);
    const double coefficient = max_norm / (norm + eps);
    if (coefficient < 1 || std::isnan(coefficient))
        for (Tensor* grad : grads) {
            grad->bump_version();
            dispatch_floating(grad->dtype(), "clip_grad_norm",
                              [&]<typename T>() { map<T>(*grad) *= static_cast<T>(coefficient); });
        }
    return Tensor::full({}, norm, norm_dtype);
}

// The norm through eager ops in float64 on the gradients' device, each gradient's part read back to the host
// and checked before anything is scaled; only error_if_nonfinite pays for it (PyTorch synchronises for it too).
Tensor clip_grad_norm(const std::vector<Parameter>& parameters, double max_norm, double norm_type,
                      bool error_if_nonfinite, double eps) {
    if (!error_if_nonfinite) return clip_grad_norm(parameters, max_norm, norm_type, eps);
    check_clip_arguments("clip_grad_norm", max_norm, norm_type, eps);
    double total = 0;
    for (const Tensor* grad : gradient_targets(parameters, "clip_grad_norm", GradientUse::read)) {
        const Tensor magnitude = abs(grad->to(DType::f64).reshaped({-1}));
        if (!std::isinf(norm_type)) {
            total += sum(pow(magnitude, norm_type)).item();
        } else if (magnitude.numel() > 0) {
            const double largest = max(magnitude, 0).item();  // NaN when any element is (max's NaN rule)
            total = std::isnan(largest) || largest > total ? largest : total;
        }
        if (std::isnan(total)) break;
    }
    if (!std::isfinite(total))
        throw NumericalError(str("clip_grad_norm: the total norm of order ", norm_type, " of the gradients is ", total,
                                 " (error_if_nonfinite=true); the gradients are left unchanged"));
    return clip_grad_norm(parameters, max_norm, norm_type, eps);
}

void clip_grad_value(const std::vector<Parameter>& parameters, double clip_value) {
    if (!(clip_value >= 0)) throw ValueError(str("clip_grad_value: clip_value must be non-negative, got ", clip_value));
    const std::vector<Tensor*> grads = gradient_targets(parameters, "clip_grad_value");
    if (grads.empty()) return;
    for (Tensor* grad : grads) grad->bump_version();
    if (grads.front()->device().is_cuda()) {
        cuda::clip_value(grads.front()->device().index, cuda::grad_operands(grads), clip_value);
        return;
    }
    for (Tensor* grad : grads)
        dispatch_floating(grad->dtype(), "clip_grad_value", [&]<typename T>() {
            const auto bound = static_cast<T>(clip_value);
            map<T>(*grad) = map<T>(*grad).max(-bound).min(bound);
        });
}

}  // namespace dyngrad
