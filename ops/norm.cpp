// Normalisation: batch_norm, layer_norm, rms_norm. The user functions, shape rules and the CPU kernels (Eigen).
// GPU: ops/norm.cu. Dropout (regularisation): ops/dropout.cpp.
#include "dyngrad/ops/norm.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "dyngrad/ops/argument_rules.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/reduce.h"
#include "dyngrad/ops/norm_geometry.h"

namespace dyngrad {

// ---- argument rules (ops/argument_rules.h; the user functions are front doors in ops/norm.h) ----
namespace {
// PyTorch's rms_norm default: the machine epsilon of x's dtype.
double default_rms_eps(DType dtype) {
    return dtype == DType::f64 ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
}
}  // namespace

// Weight and bias are positional inputs: a bias alone comes with a weight of ones, which changes nothing.
void layer_norm_arguments(OpCall& call) {
    if (call.size() < 3 || call.value(1) != nullptr) return;
    if (const Tensor* bias = call.value(2)) call.fill(1, Tensor::ones(bias->shape(), bias->dtype(), bias->device()));
}

void rms_norm_arguments(OpCall& call) {
    if (call.gave(attr_field_index("eps"))) return;
    const Tensor* x = call.value(0);
    call.attrs.eps = default_rms_eps(x != nullptr && x->defined() ? x->dtype() : DType::f32);
}

// ---- Differentiable backward (graph/higher_order.h): each normalisation rebuilt from its formula ----

namespace {

// x normalised over `axes` (kept as 1) by the biased variance: (x − μ)·(σ² + eps)^-1/2
Var standardize(const Var& x, const std::vector<std::int64_t>& axes, double eps) {
    const Var centered = x - mean(x, axes, true);
    return mul(centered, pow(add_scalar(mean(mul(centered, centered), axes, true), eps), -0.5));
}

}  // namespace

Var norm_composition(OpType op, std::span<const Var> in, const OpAttrs& attrs) {
    const Var& x = in[0];
    const auto rank = static_cast<std::int64_t>(x.shape().size());
    if (op == OpType::BatchNorm) {  // x (N,C) or (N,C,H,W); gamma, beta (C); running statistics in eval
        Shape channel(x.shape().size(), 1);
        channel[1] = x.shape()[1];
        std::vector<std::int64_t> axes{0};
        for (std::int64_t a = 2; a < rank; ++a) axes.push_back(a);
        Var y = attrs.training ? standardize(x, axes, attrs.eps)
                               : mul(x - reshape(in[3], channel), pow(add_scalar(reshape(in[4], channel), attrs.eps), -0.5));
        return mul(y, reshape(in[1], channel)) + reshape(in[2], channel);
    }
    // layer_norm (x, weight?, bias?), rms_norm (x, weight?): over the trailing attrs.shape
    std::vector<std::int64_t> axes;
    for (std::int64_t a = rank - static_cast<std::int64_t>(attrs.shape.size()); a < rank; ++a) axes.push_back(a);
    Var y = op == OpType::LayerNorm ? standardize(x, axes, attrs.eps)
                                    : mul(x, pow(add_scalar(mean(mul(x, x), axes, true), attrs.eps), -0.5));
    if (in.size() >= 2 && in[1].defined()) y = mul(y, in[1]);
    if (in.size() >= 3 && in[2].defined()) y = y + in[2];
    return y;
}

namespace infer {

OutputSpec batch_norm(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    static constexpr const char* kRoles[] = {"x", "gamma", "beta", "running_mean", "running_var"};
    const Tensor& x = inputs[0];
    require_float(x, "x");
    for (std::size_t i = 1; i < inputs.size(); ++i) require_same_dtype(inputs[i], kRoles[i], x, "x");
    if (x.rank() != 2 && x.rank() != 4)
        throw ShapeError(str("x must be (N,C) or (N,C,H,W), got ", to_string(x.shape())));
    const std::int64_t channels = x.size(1);
    for (std::size_t i = 1; i < inputs.size(); ++i)
        if (inputs[i].shape() != Shape{channels})
            throw ShapeError(str(kRoles[i], " ", to_string(inputs[i].shape()), " does not match x ",
                                 to_string(x.shape()), ": expected (", channels, ")"));
    if (!(attrs.eps >= 0)) throw ValueError(str("eps must be >= 0, got ", attrs.eps));
    if (!(attrs.momentum >= 0 && attrs.momentum <= 1))
        throw ValueError(str("momentum must be in [0, 1], got ", attrs.momentum));
    const std::int64_t per_channel = channels == 0 ? 0 : x.numel() / channels;
    // An empty batch has no statistics (like the mean of the losses); one value per channel has no variance.
    if (attrs.training && per_channel == 0)
        throw ShapeError(
            str("training needs a non-empty batch for the batch statistics, got x ", to_string(x.shape())));
    if (attrs.training && per_channel <= 1)
        throw ValueError(str("training needs N·H·W > 1 for the batch variance, got ", per_channel));
    return {x.shape(), x.dtype()};
}

// x (..., *normalized_shape); weight, bias (normalized_shape) where given -> y like x
OutputSpec row_norm(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    static constexpr const char* kRoles[] = {"x", "weight", "bias"};
    const Tensor& x = inputs[0];
    const Shape& normalized = attrs.shape;
    require_float(x, "x");
    for (std::size_t i = 1; i < inputs.size(); ++i) require_same_dtype(inputs[i], kRoles[i], x, "x");
    if (normalized.empty())
        throw ShapeError(str("normalized_shape must name at least one trailing dim of x ", to_string(x.shape()),
                             ", got ()"));
    for (const std::int64_t d : normalized)
        if (d < 0) throw ValueError(str("normalized_shape ", to_string(normalized), " has a negative dim"));
    const bool trailing = x.rank() >= normalized.size() &&
                          std::equal(normalized.begin(), normalized.end(), x.shape().end() - normalized.size());
    if (!trailing)
        throw ShapeError(str("normalized_shape ", to_string(normalized), " is not the trailing dims of x ",
                             to_string(x.shape())));
    // Bias first: layer_norm gives a bias alone a weight of ones in the bias's shape, so a wrong bias is named.
    for (std::size_t i = inputs.size(); i-- > 1;)
        if (inputs[i].shape() != normalized)
            throw ShapeError(str(kRoles[i], " ", to_string(inputs[i].shape()), " does not match normalized_shape ",
                                 to_string(normalized)));
    if (!(attrs.eps >= 0) || !std::isfinite(attrs.eps))
        throw ValueError(str("eps must be finite and >= 0, got ", attrs.eps));
    return {x.shape(), x.dtype()};
}

}  // namespace infer

namespace cpu {

namespace {

using Stats = Eigen::ArrayXd;  // per-channel statistics, accumulated in double

template <typename T>
Eigen::Map<const ArrayRM<T>> sample(const Tensor& t, const ChannelLayout& l, std::int64_t n) {
    return {t.data<T>() + n * l.c * l.hw, l.c, l.hw};
}
template <typename T>
Eigen::Map<ArrayRM<T>> sample_out(const Tensor& t, const ChannelLayout& l, std::int64_t n) {
    return {t.data<T>() + n * l.c * l.hw, l.c, l.hw};
}
template <typename T>
Eigen::Map<ColumnArray<T>> channels(const Tensor& t) {
    return {t.data<T>(), t.numel()};
}

}  // namespace

// x (N,C[,H,W])  gamma, beta, running_mean, running_var (C)  ->  y like x
// Saves mean and invstd = 1/sqrt(var + eps) (C) as used: the batch's in training, the running ones in eval.
Tensor batch_norm_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& running_mean = args.inputs[3];
    const Tensor& running_var = args.inputs[4];
    const BatchNormForward f = batch_norm_forward_outputs(args);
    const ChannelLayout l = f.layout;
    const Tensor &y = f.y, &mean = f.mean, &invstd = f.invstd;
    const OpAttrs& a = args.attrs;
    dispatch_floating(x.dtype(), "batch_norm", [&]<typename T>() {
        Stats mu, var;
        if (a.training) {
            const auto count = static_cast<double>(l.per_channel());
            mu = Stats::Zero(l.c);
            for (std::int64_t n = 0; n < l.n; ++n) mu += sample<T>(x, l, n).template cast<double>().rowwise().sum();
            mu /= count;
            // Two passes: Σ(x − mean)² does not cancel the way Σx² − N·mean² does.
            var = Stats::Zero(l.c);
            for (std::int64_t n = 0; n < l.n; ++n)
                var += (sample<T>(x, l, n).template cast<double>().colwise() - mu).square().rowwise().sum();
            var /= count;
            auto rm = channels<T>(running_mean);
            auto rv = channels<T>(running_var);
            rm = ((1 - a.momentum) * rm.template cast<double>() + a.momentum * mu).template cast<T>();
            rv = ((1 - a.momentum) * rv.template cast<double>() + a.momentum * var * (count / (count - 1)))
                     .template cast<T>();
        } else {
            mu = channels<T>(running_mean).template cast<double>();
            var = channels<T>(running_var).template cast<double>();
        }
        channels<T>(mean) = mu.template cast<T>();
        channels<T>(invstd) = (var + a.eps).sqrt().inverse().template cast<T>();
        const ColumnArray<T> scale = channels<T>(args.inputs[1]) * channels<T>(invstd);
        const ColumnArray<T> shift = channels<T>(args.inputs[2]);
        const ColumnArray<T> center = channels<T>(mean);
        for (std::int64_t n = 0; n < l.n; ++n)
            sample_out<T>(y, l, n) = ((sample<T>(x, l, n).colwise() - center).colwise() * scale).colwise() + shift;
    });
    return y;
}

// Formulas: ops/norm_geometry.h (BatchNormBackward). Per-channel sums in double.
std::vector<Tensor> batch_norm_backward(const BackwardArgs& args) {
    std::vector<Tensor> grads(args.inputs.size());
    const std::optional<BatchNormBackward> plan = batch_norm_backward_plan(args);
    if (!plan) return grads;
    const BatchNormBackward& p = *plan;
    const ChannelLayout l = p.layout;
    dispatch_floating(p.x.dtype(), "batch_norm backward", [&]<typename T>() {
        const Stats mu = channels<T>(p.mean).template cast<double>();
        const Stats inv = channels<T>(p.invstd).template cast<double>();
        Stats sum_dy = Stats::Zero(l.c), sum_dy_xhat = Stats::Zero(l.c);
        if (p.need_sums()) {
            for (std::int64_t n = 0; n < l.n; ++n) {
                const auto dY = sample<T>(p.dy, l, n).template cast<double>();
                const auto xhat = (sample<T>(p.x, l, n).template cast<double>().colwise() - mu).colwise() * inv;
                sum_dy += dY.rowwise().sum();
                sum_dy_xhat += (dY * xhat).rowwise().sum();
            }
        }
        if (p.need_dgamma) {
            grads[1] = Tensor::empty({l.c}, p.x.dtype(), p.x.device());
            channels<T>(grads[1]) = sum_dy_xhat.template cast<T>();
        }
        if (p.need_dbeta) {
            grads[2] = Tensor::empty({l.c}, p.x.dtype(), p.x.device());
            channels<T>(grads[2]) = sum_dy.template cast<T>();
        }
        if (!p.need_dx) return;
        grads[0] = Tensor::empty(p.x.shape(), p.x.dtype(), p.x.device());
        const ColumnArray<T> k = channels<T>(args.inputs[1]) * channels<T>(p.invstd);
        if (!p.training) {
            for (std::int64_t n = 0; n < l.n; ++n) sample_out<T>(grads[0], l, n) = sample<T>(p.dy, l, n).colwise() * k;
            return;
        }
        const auto count = static_cast<double>(l.per_channel());
        const ColumnArray<T> mean_dy = (sum_dy / count).template cast<T>();
        const ColumnArray<T> mean_dy_xhat = (sum_dy_xhat / count).template cast<T>();
        const ColumnArray<T> center = channels<T>(p.mean);
        const ColumnArray<T> scale = channels<T>(p.invstd);
        for (std::int64_t n = 0; n < l.n; ++n) {
            const auto xhat = (sample<T>(p.x, l, n).colwise() - center).colwise() * scale;
            sample_out<T>(grads[0], l, n) =
                ((sample<T>(p.dy, l, n).colwise() - mean_dy) - xhat.colwise() * mean_dy_xhat).colwise() * k;
        }
    });
    return grads;
}

// x (rows, n) with weight, bias (n) where given -> y (rows, n); saves mean (layer_norm only) and rstd (rows).
//   layer_norm: y = (x − mean)·rstd·w + b, rstd = 1/sqrt(Σ(x − mean)²/n + eps)
//   rms_norm:   y = x·rstd·w,             rstd = 1/sqrt(Σx²/n + eps)
// Statistics in double, two passes over the row (Σ(x − mean)² does not cancel like Σx² − n·mean²).
Tensor row_norm_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const bool center = args.op == OpType::LayerNorm;
    const RowNormLayout l = row_norm_layout(x.shape(), args.attrs.shape);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    Tensor mean = Tensor::zeros({l.rows}, x.dtype(), x.device());
    Tensor rstd = Tensor::zeros({l.rows}, x.dtype(), x.device());
    if (l.n > 0) {
        dispatch_floating(x.dtype(), "row_norm", [&]<typename T>() {
            using Row = Eigen::Map<const ColumnArray<T>>;
            const T* w = args.inputs.size() > 1 ? args.inputs[1].data<T>() : nullptr;
            const T* b = args.inputs.size() > 2 ? args.inputs[2].data<T>() : nullptr;
            const double count = static_cast<double>(l.n);
            for (std::int64_t r = 0; r < l.rows; ++r) {
                const Eigen::ArrayXd xr = Row(x.data<T>() + r * l.n, l.n).template cast<double>();
                const double mu = center ? xr.sum() / count : 0.0;
                const double inv = 1.0 / std::sqrt((xr - mu).square().sum() / count + args.attrs.eps);
                Eigen::ArrayXd yr = (xr - mu) * inv;
                if (w != nullptr) yr *= Row(w, l.n).template cast<double>();
                if (b != nullptr) yr += Row(b, l.n).template cast<double>();
                Eigen::Map<ColumnArray<T>>(y.data<T>() + r * l.n, l.n) = yr.template cast<T>();
                mean.data<T>()[r] = static_cast<T>(mu);
                rstd.data<T>()[r] = static_cast<T>(inv);
            }
        });
    }
    if (center) args.saved.push_back(mean);
    args.saved.push_back(rstd);
    return y;
}

// Formulas: ops/norm_geometry.h (RowNormBackward). Statistics in double, one row at a time.
std::vector<Tensor> row_norm_backward(const BackwardArgs& args) {
    const RowNormBackward p = row_norm_backward_plan(args);
    const RowNormLayout l = p.layout;
    std::vector<Tensor> grads(args.inputs.size());
    dispatch_floating(p.x.dtype(), "row_norm backward", [&]<typename T>() {
        using Row = Eigen::Map<const ColumnArray<T>>;
        const T* mean = p.center ? args.saved[0].data<T>() : nullptr;
        const T* rstd = args.saved.back().data<T>();
        const T* w = args.inputs.size() > 1 ? args.inputs[1].data<T>() : nullptr;
        const double count = static_cast<double>(l.n);
        Eigen::ArrayXd dw = Eigen::ArrayXd::Zero(l.n), db = Eigen::ArrayXd::Zero(l.n);
        if (p.need_dx) grads[0] = Tensor::empty(p.x.shape(), p.x.dtype(), p.x.device());
        for (std::int64_t r = 0; r < l.rows && l.n > 0; ++r) {
            const double mu = p.center ? static_cast<double>(mean[r]) : 0.0;
            const double inv = static_cast<double>(rstd[r]);
            const Eigen::ArrayXd xhat = (Row(p.x.data<T>() + r * l.n, l.n).template cast<double>() - mu) * inv;
            const Eigen::ArrayXd dyr = Row(p.dy.data<T>() + r * l.n, l.n).template cast<double>();
            if (p.need_dw) dw += dyr * xhat;
            if (p.need_db) db += dyr;
            if (!p.need_dx) continue;
            const Eigen::ArrayXd g = w != nullptr ? Eigen::ArrayXd(dyr * Row(w, l.n).template cast<double>()) : dyr;
            const double mean_g = p.center ? g.sum() / count : 0.0;
            const double mean_g_xhat = (g * xhat).sum() / count;
            Eigen::Map<ColumnArray<T>>(grads[0].data<T>() + r * l.n, l.n) =
                (inv * (g - mean_g - xhat * mean_g_xhat)).template cast<T>();
        }
        const Shape& normalized = args.attrs.shape;
        if (p.need_dw) {
            grads[1] = Tensor::empty(normalized, p.x.dtype(), p.x.device());
            Eigen::Map<ColumnArray<T>>(grads[1].data<T>(), l.n) = dw.template cast<T>();
        }
        if (p.need_db) {
            grads[2] = Tensor::empty(normalized, p.x.dtype(), p.x.device());
            Eigen::Map<ColumnArray<T>>(grads[2].data<T>(), l.n) = db.template cast<T>();
        }
    });
    return grads;
}

}  // namespace cpu

}  // namespace dyngrad
