// The optimizers' formulas, written once for both backends as ops/elementwise_math.h is for the elementwise
// ops: the per-step scalars (Adam's bias corrections, a schedule's lr) and the per-element update rules, which
// the CPU loop (nn/optim.cpp) and the fused CUDA kernels (nn/optim.cu) call element by element. Internal.
//
// A rule holds its scalars in the element type T (cast once from the double settings) and updates one element
// in place: w the parameter, g its gradient (already clipped; the rule unscales it), and the rule's state.
#pragma once
#include <cmath>
#include <cstdint>

#include "dyngrad/nn/schedule_rule.h"
#include "dyngrad/ops/host_device.h"

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
