// Internal: what gradient clipping (nn/clip.cpp) and loss scaling (nn/amp.cpp) share: the gradients they act
// on, and their GPU passes over them (nn/clip.cu, nn/amp.cu; without CUDA nn/optim_unavailable.cpp, never reached).
#pragma once
#include <span>
#include <vector>

#include "dyngrad/core/tensor.h"

namespace dyngrad {

class Parameter;
// What the caller of gradient_targets does with the gradients: only reads them (GradScaler's inf check without
// unscaling), or scales them in place (clipping, unscale()), which needs each one's storage owned alone.
enum class GradientUse { read, scale_in_place };
// The trainable parameters' gradients for clipping and loss scaling (made exclusive for scale_in_place);
// ValueError/DeviceError naming `what` (nn/clip.cpp).
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

// GradScaler (nn/amp.h) on one device, queued with no host synchronisation (capturable):
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
