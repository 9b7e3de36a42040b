// Losses: user functions, shape rules and the CPU kernels (Eigen). GPU: ops/loss.cu. softmax and log_softmax
// live with the activations (ops/elementwise.cpp).
// Over 600 lines: six losses share the reduction, ignore_index and weight helpers, and their second-order forms
// (compositions of the same formulas) sit beside the first-order kernels they mirror.
#include "dyngrad/ops/loss.h"

#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "dyngrad/graph/eager.h"
#include "dyngrad/ops/argument_rules.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/indexing.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/reduce.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/loss_math.h"

namespace dyngrad {

namespace {

OpAttrs class_loss_attrs(Reduction reduction, std::int64_t ignore_index, double label_smoothing) {
    OpAttrs attrs;
    attrs.reduction = reduction;
    attrs.ignore_index = ignore_index;
    attrs.label_smoothing = label_smoothing;
    return attrs;
}

// The class losses take PyTorch's (N,C,d1,...,dk) with labels (N,d1,...,dk), and (C) with a 0-d label: the
// class axis moves last and every other position becomes a row of the (N,C) op, so the kernels, the op
// table's cases and the goldens stay 2-D. Rows are what the mean divides by in PyTorch too (Σ of the
// weights of the positions not ignored), so every reduction keeps its meaning; None gets its shape back.
template <class V, class Rows>
V over_class_rows(const char* op, const V& input, const V& labels, Reduction reduction, Rows&& loss_2d,
                  std::source_location where) {
    const Shape& shape = input.shape();
    if (shape.size() == 2 || shape.empty()) return loss_2d(input, labels);
    Shape positions;  // the shape of a Reduction::None result
    V rows;
    if (shape.size() == 1) {
        rows = reshape(input, {1, shape[0]}, where);
    } else {
        std::vector<std::int64_t> order{0};
        for (std::size_t d = 2; d < shape.size(); ++d) order.push_back(static_cast<std::int64_t>(d));
        order.push_back(1);
        positions.push_back(shape[0]);
        positions.insert(positions.end(), shape.begin() + 2, shape.end());
        rows = reshape(permute(input, order, where), {numel(positions), shape[1]}, where);
    }
    if (labels.shape() != positions)
        throw ShapeError(str(op, " at ", describe_site(where), ": labels ", to_string(labels.shape()),
                             " do not match input ", to_string(shape), ": expected ", to_string(positions),
                             " (the input's shape without its class axis 1)"));
    V out = loss_2d(rows, reshape(labels, {numel(positions)}, where));
    return reduction == Reduction::None ? reshape(out, positions, where) : out;
}

}  // namespace

template <Operand T>
T cross_entropy(const T& logits, const T& labels, const T& class_weight, const CrossEntropyOptions& options,
                std::source_location where) {
    const OpAttrs attrs = class_loss_attrs(options.reduction, options.ignore_index, options.label_smoothing);
    return over_class_rows("cross_entropy", logits, labels, options.reduction, [&](const T& x, const T& y) {
        return apply_op(OpType::CrossEntropy, {x, y, class_weight}, attrs, where);  // an undefined weight: none
    }, where);
}
template Var cross_entropy(const Var&, const Var&, const Var&, const CrossEntropyOptions&, std::source_location);
template Tensor cross_entropy(const Tensor&, const Tensor&, const Tensor&, const CrossEntropyOptions&,
                              std::source_location);

template <Operand T>
T nll_loss(const T& log_probs, const T& labels, const T& class_weight, const NllLossOptions& options,
           std::source_location where) {
    const OpAttrs attrs = class_loss_attrs(options.reduction, options.ignore_index, 0.0);
    return over_class_rows("nll_loss", log_probs, labels, options.reduction, [&](const T& x, const T& y) {
        return apply_op(OpType::NllLoss, {x, y, class_weight}, attrs, where);
    }, where);
}
template Var nll_loss(const Var&, const Var&, const Var&, const NllLossOptions&, std::source_location);
template Tensor nll_loss(const Tensor&, const Tensor&, const Tensor&, const NllLossOptions&, std::source_location);

// pos_weight is the fourth input, so a missing weight is a constant 1 (a scalar: it broadcasts).
void bce_with_logits_arguments(OpCall& call) {
    if (call.size() < 4 || call.value(3) == nullptr || call.value(2) != nullptr) return;
    const Tensor* logits = call.value(0);
    if (logits != nullptr) call.fill(2, Tensor::ones({}, logits->dtype(), logits->device()));
}

// ---- Differentiable backward (graph/higher_order.h): each loss rebuilt from its formula in primitive ops ----

namespace {

Var reduce_loss(const Var& per_element, Reduction reduction) {
    if (reduction == Reduction::Mean) return mean(per_element);
    if (reduction == Reduction::Sum) return sum(per_element);
    return per_element;
}

// cross_entropy (logits, labels[, class_weight]) and nll_loss (log_probs, labels[, class_weight]): the per-row terms
// of ops/loss.h. The labels pick values through a gather (ignored rows pick class 0 and weigh 0); the class weights
// and the Mean denominator are constants, as in the kernels.
Var class_loss_composition(std::span<const Var> in, const OpAttrs& attrs, OpType op) {
    const Var& x = in[0];
    const std::int64_t n = x.shape()[0];
    const std::int64_t classes = x.shape()[1];
    const std::vector<double> labels = in[1].value().to(Device::cpu()).to_vector();
    const bool weighted = in.size() >= 3 && in[2].defined();
    const std::vector<double> class_weight =
        weighted ? in[2].value().to(Device::cpu()).to_vector() : std::vector<double>(classes, 1.0);
    std::vector<std::int64_t> picked(static_cast<std::size_t>(n));
    std::vector<double> row_weight(static_cast<std::size_t>(n)), kept(static_cast<std::size_t>(n));
    double denominator = 0;
    for (std::size_t i = 0; i < picked.size(); ++i) {
        const auto label = static_cast<std::int64_t>(labels[i]);
        const bool ignored = label == attrs.ignore_index;
        picked[i] = ignored ? 0 : label;
        row_weight[i] = ignored ? 0.0 : class_weight[static_cast<std::size_t>(label)];
        kept[i] = ignored ? 0.0 : 1.0;
        denominator += row_weight[i];
    }
    const auto constant = [&](const std::vector<double>& v, const Shape& shape) {
        return constant_of(x, Tensor::from_vector(v, shape, x.dtype(), x.device()));
    };
    const Var lp = op == OpType::CrossEntropy ? log_softmax(x, 1) : x;
    const Var index = constant_of(x, Tensor::from_vector(picked, {n, 1}, x.device()));
    Var loss = neg(mul(gather(lp, 1, index), constant(row_weight, {n, 1})));  // (N,1)
    const double eps = op == OpType::CrossEntropy ? attrs.label_smoothing : 0.0;
    if (eps != 0.0) {
        const Var smooth = neg(sum(mul(lp, constant(class_weight, {1, classes})), {1}, true));
        loss = mul_scalar(loss, 1.0 - eps) + mul(mul_scalar(smooth, eps / static_cast<double>(classes)),
                                                 constant(kept, {n, 1}));
    }
    loss = reshape(loss, {n});
    if (attrs.reduction == Reduction::Mean) return mul_scalar(sum(loss), 1.0 / denominator);
    return attrs.reduction == Reduction::Sum ? sum(loss) : loss;
}

}  // namespace

Var loss_composition(OpType op, std::span<const Var> in, const OpAttrs& attrs) {
    switch (op) {
        case OpType::CrossEntropy:
        case OpType::NllLoss: return class_loss_composition(in, attrs, op);
        case OpType::MseLoss: {
            const Var d = in[0] - in[1];
            return mean(mul(d, d));
        }
        case OpType::L1Loss: return reduce_loss(abs(in[0] - in[1]), attrs.reduction);
        case OpType::SmoothL1Loss: {
            const double beta = attrs.scalar;
            const Var d = in[0] - in[1];
            if (beta == 0.0) return reduce_loss(abs(d), attrs.reduction);
            const Tensor inside = abs(d.value()) < beta;  // where the quadratic piece holds: a constant mask
            const Var quadratic = mul_scalar(mul(d, d), 0.5 / beta);
            const Var linear = add_scalar(abs(d), -0.5 * beta);
            return reduce_loss(mul(quadratic, constant_of(d, inside)) + mul(linear, constant_of(d, 1.0 - inside)),
                               attrs.reduction);
        }
        case OpType::BceWithLogits: {  // w·[(1 − t)·x + (1 + (pw − 1)·t)·softplus(−x)]
            const Var& x = in[0];
            const Var& t = in[1];
            Var coefficient = add_scalar(neg(t), 1.0);
            Var scale = in.size() >= 4 ? add_scalar(mul(add_scalar(in[3], -1.0), t), 1.0) : Var();
            Var loss = mul(coefficient, x) + (scale.defined() ? mul(scale, softplus(neg(x))) : softplus(neg(x)));
            if (in.size() >= 3) loss = mul(loss, in[2]);
            return reduce_loss(loss, attrs.reduction);
        }
        default: break;
    }
    throw GraphError(str("differentiable backward: ", op_def(op).name, " is not a loss"));
}

namespace infer {

namespace {

// Also rejects a reduction that is none of the three (a cast integer), which no kernel would write.
Shape loss_output_shape(Reduction reduction, const Shape& unreduced) {
    if (reduction != Reduction::Mean && reduction != Reduction::Sum && reduction != Reduction::None)
        throw ValueError(str("reduction must be Mean, Sum or None, got ", static_cast<int>(reduction)));
    return reduction == Reduction::None ? unreduced : Shape{};
}

}  // namespace

// cross_entropy: logits (N,C); nll_loss: log_probs (N,C); labels (N) int64; class weights (C) optional.
OutputSpec cross_entropy(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const char* role = op == OpType::NllLoss ? "log_probs" : "logits";
    const Tensor& logits = inputs[0];
    const Tensor& labels = inputs[1];
    require_float(logits, role);
    require_int64(labels, "labels");
    if (logits.rank() != 2) throw ShapeError(str(role, " must be (N,C), got ", to_string(logits.shape())));
    if (labels.shape() != Shape{logits.shape()[0]})
        throw ShapeError(str("labels ", to_string(labels.shape()), " do not match ", role, " ",
                             to_string(logits.shape()), ": expected (", logits.shape()[0], ")"));
    if (logits.numel() == 0)
        throw ShapeError(str(role, " ", to_string(logits.shape()), " are empty: the loss needs N, C >= 1"));
    if (inputs.size() > 2) {
        const Tensor& weight = inputs[2];
        require_same_dtype(weight, "class_weight", logits, role);
        if (weight.shape() != Shape{logits.shape()[1]})
            throw ShapeError(str("class_weight ", to_string(weight.shape()), " does not match the ",
                                 logits.shape()[1], " classes of ", role, " ", to_string(logits.shape()),
                                 ": expected (", logits.shape()[1], ")"));
    }
    if (!(attrs.label_smoothing >= 0.0 && attrs.label_smoothing <= 1.0))
        throw ValueError(str("label_smoothing must be in [0, 1], got ", attrs.label_smoothing));
    if (op == OpType::NllLoss && attrs.label_smoothing != 0.0)
        throw ValueError(str("nll_loss takes no label_smoothing (got ", attrs.label_smoothing,
                             "); cross_entropy does"));
    return {loss_output_shape(attrs.reduction, {logits.shape()[0]}), logits.dtype()};
}

// logits, target (the same shape); weight, pos_weight optional, each shaped as a suffix of the logits'.
OutputSpec bce_with_logits(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& logits = inputs[0];
    require_float(logits, "logits");
    require_same_dtype(inputs[1], "target", logits, "logits");
    if (inputs[1].shape() != logits.shape())
        throw ShapeError(str("target ", to_string(inputs[1].shape()), " and logits ", to_string(logits.shape()),
                             " differ in shape"));
    const char* roles[] = {"logits", "target", "weight", "pos_weight"};
    for (std::size_t i = 2; i < inputs.size(); ++i) {
        const Tensor& w = inputs[i];
        require_same_dtype(w, roles[i], logits, "logits");
        // Broadcast over leading axes only: the kernels read element k's weight at k mod numel.
        const Shape& s = w.shape();
        const Shape& x = logits.shape();
        std::size_t lead = 0;  // leading 1s broadcast like missing axes
        while (lead < s.size() && s[lead] == 1) ++lead;
        const bool suffix = s.size() <= x.size() && std::equal(s.begin() + static_cast<std::ptrdiff_t>(lead), s.end(),
                                                               x.end() - static_cast<std::ptrdiff_t>(s.size() - lead));
        if (!suffix)
            throw ShapeError(str(roles[i], " ", to_string(s), " does not broadcast to logits ", to_string(x),
                                 " over leading axes: its shape must be a suffix of the logits' (e.g. (",
                                 x.empty() ? 1 : x.back(), ") for the last axis)"));
    }
    if (logits.numel() == 0 && attrs.reduction == Reduction::Mean)
        throw ShapeError(str("logits ", to_string(logits.shape()), " are empty: the mean needs at least one element"));
    return {loss_output_shape(attrs.reduction, logits.shape()), logits.dtype()};
}

// l1_loss, smooth_l1_loss: prediction, target (the same shape and dtype); smooth_l1's beta in OpAttrs::scalar.
OutputSpec pointwise_loss(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& prediction = inputs[0];
    const Tensor& target = inputs[1];
    require_float(prediction, "prediction");
    require_same_dtype(target, "target", prediction, "prediction");
    if (prediction.shape() != target.shape())
        throw ShapeError(str("prediction ", to_string(prediction.shape()), " and target ",
                             to_string(target.shape()), " differ in shape"));
    if (op == OpType::SmoothL1Loss && !(attrs.scalar >= 0.0 && std::isfinite(attrs.scalar)))
        throw ValueError(str("beta must be finite and >= 0, got ", attrs.scalar));
    if (prediction.numel() == 0 && attrs.reduction == Reduction::Mean)
        throw ShapeError("inputs are empty: the mean needs at least one element");
    return {loss_output_shape(attrs.reduction, prediction.shape()), prediction.dtype()};
}

// mse_loss: pointwise_loss's rule for the mean (OpAttrs' default reduction), the only reduction it has.
OutputSpec mse_loss(OpType op, std::span<const Tensor> inputs, const OpAttrs&) {
    return pointwise_loss(op, inputs, OpAttrs{});
}

}  // namespace infer

namespace cpu {

namespace {

// Labels index rows of the logits, so they are checked before any use (in the backward too: the
// tensor may have been changed since the forward). ignore_index may lie anywhere, in [0,C) too.
void check_labels(const Tensor& labels, std::int64_t classes, std::int64_t ignore_index) {
    const std::int64_t* label = labels.data<std::int64_t>();
    for (std::int64_t i = 0; i < labels.numel(); ++i)
        if ((label[i] < 0 || label[i] >= classes) && label[i] != ignore_index)
            throw IndexError(str("label ", label[i], " at row ", i, " is out of range for ", classes,
                                 " classes (ignore_index ", ignore_index, ")"));
}

// The factor of row (or element) i's loss in the reduced loss, times the upstream gradient dy.
template <typename T> struct ReductionScale {
    Reduction reduction;
    const T* dy;
    T mean_scale;  // dy / (the mean's denominator)
    ReductionScale(Reduction r, const Tensor& grad_output, double denominator)
        : reduction(r), dy(grad_output.data<T>()),
          mean_scale(r == Reduction::None ? T(0) : static_cast<T>(static_cast<double>(dy[0]) / denominator)) {}
    T operator()(std::int64_t i) const {
        if (reduction == Reduction::None) return dy[i];
        return reduction == Reduction::Sum ? dy[0] : mean_scale;
    }
};

}  // namespace

// cross_entropy: logits (N,C)  labels (N) int64  class_weight (C) optional  ->  loss () or (N)
// nll_loss:      log_probs (N,C), the same labels and weights
// Row i, w = class_weight (or 1), ε = label_smoothing; 0 where labels_i == ignore_index:
//   cross_entropy: lse_i = log Σ_c exp(x_ic) (max subtracted first);
//                  loss_i = (1 - ε)·w[y_i]·(lse_i - x_i,y_i) + (ε/C)·Σ_c w[c]·(lse_i - x_ic)
//   nll_loss:      loss_i = -w[y_i]·x_i,y_i
// Mean divides Σ_i loss_i by D = Σ_{i not ignored} w[y_i] (NaN when every row is ignored, as PyTorch).
// Saves [D, Σ_c w[c]] (f64) for the backward, and cross_entropy lse (N). Sums over rows in double.
Tensor cross_entropy_forward(const ForwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    const Tensor& labels = args.inputs[1];
    const bool weighted = args.inputs.size() > 2;
    const bool nll = args.op == OpType::NllLoss;
    const std::int64_t n = logits.size(0);
    const std::int64_t classes = logits.size(1);
    const std::int64_t ignore_index = args.attrs.ignore_index;
    check_labels(labels, classes, ignore_index);
    math::ClassLossForward f = math::class_loss_forward_outputs(args);
    Tensor &loss = f.loss, &lse = f.lse, &sums = f.sums;
    dispatch_floating(logits.dtype(), "cross_entropy", [&]<typename T>() {
        const ConstArrayMap<T> X(logits.data<T>(), n, classes);
        const T* w = weighted ? args.inputs[2].data<T>() : nullptr;
        const std::int64_t* label = labels.data<std::int64_t>();
        const T smoothing = static_cast<T>(args.attrs.label_smoothing);
        double weight_sum = 0.0;
        for (std::int64_t c = 0; c < classes; ++c) weight_sum += w ? static_cast<double>(w[c]) : 1.0;
        double total = 0.0, denominator = 0.0;
        for (std::int64_t i = 0; i < n; ++i) {
            T row_loss = T(0);
            if (!nll) {
                const T max = X.row(i).maxCoeff();
                lse.data<T>()[i] = max + std::log((X.row(i) - max).exp().sum());
            }
            if (label[i] != ignore_index) {
                const T wy = w ? w[label[i]] : T(1);
                if (nll) {
                    row_loss = -wy * X(i, label[i]);
                } else {
                    const T l = lse.data<T>()[i];
                    row_loss = (T(1) - smoothing) * wy * (l - X(i, label[i]));
                    if (smoothing != T(0)) {
                        T smooth = T(0);
                        for (std::int64_t c = 0; c < classes; ++c) smooth += (w ? w[c] : T(1)) * (l - X(i, c));
                        row_loss += smoothing / static_cast<T>(classes) * smooth;
                    }
                }
                denominator += static_cast<double>(wy);
            }
            if (args.attrs.reduction == Reduction::None) loss.data<T>()[i] = row_loss;
            total += static_cast<double>(row_loss);
        }
        if (args.attrs.reduction == Reduction::Sum) loss.data<T>()[0] = static_cast<T>(total);
        if (args.attrs.reduction == Reduction::Mean) loss.data<T>()[0] = static_cast<T>(total / denominator);
        sums.data<double>()[0] = denominator;
        sums.data<double>()[1] = weight_sum;
    });
    return loss;
}

// dloss () or (N)  ->  dlogits (N,C); labels and class weights get no gradient (as in PyTorch). s_i: the
// row's reduction factor times dloss (dloss / D for the mean); p = exp(x_i - lse_i), W = Σ_c w[c]:
//   cross_entropy: dx_ic = s_i·[p_c·((1 - ε)·w[y_i] + (ε/C)·W) - (1 - ε)·w[y_i]·[c = y_i] - (ε/C)·w[c]]
//   nll_loss:      dx_ic = -s_i·w[y_i]·[c = y_i]
// and 0 in ignored rows.
std::vector<Tensor> cross_entropy_backward(const BackwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    const Tensor& labels = args.inputs[1];
    const bool weighted = args.inputs.size() > 2;
    const bool nll = args.op == OpType::NllLoss;
    std::vector<Tensor> grads(args.inputs.size());
    if (!math::class_loss_needs_dlogits(args)) return grads;
    const std::int64_t n = logits.size(0);
    const std::int64_t classes = logits.size(1);
    const std::int64_t ignore_index = args.attrs.ignore_index;
    check_labels(labels, classes, ignore_index);
    grads[0] = Tensor::zeros(logits.shape(), logits.dtype(), logits.device());
    const double denominator = args.saved[0].data<double>()[0];
    const double weight_sum = args.saved[0].data<double>()[1];
    dispatch_floating(logits.dtype(), "cross_entropy backward", [&]<typename T>() {
        const ConstArrayMap<T> X(logits.data<T>(), n, classes);
        ArrayMap<T> dX(grads[0].data<T>(), n, classes);
        const T* w = weighted ? args.inputs[2].data<T>() : nullptr;
        const std::int64_t* label = labels.data<std::int64_t>();
        const ReductionScale<T> scale(args.attrs.reduction, args.grad_output, denominator);
        const T smoothing = static_cast<T>(args.attrs.label_smoothing);
        const T smooth_per_class = smoothing / static_cast<T>(classes);
        for (std::int64_t i = 0; i < n; ++i) {
            if (label[i] == ignore_index) continue;
            const T s = scale(i);
            const T wy = w ? w[label[i]] : T(1);
            if (nll) {
                dX(i, label[i]) = -s * wy;
                continue;
            }
            const T lse = args.saved[1].data<T>()[i];
            const T p_factor = (T(1) - smoothing) * wy + smooth_per_class * static_cast<T>(weight_sum);
            dX.row(i) = (X.row(i) - lse).exp() * (p_factor * s);
            dX(i, label[i]) -= (T(1) - smoothing) * wy * s;
            if (smoothing != T(0))
                for (std::int64_t c = 0; c < classes; ++c) dX(i, c) -= smooth_per_class * (w ? w[c] : T(1)) * s;
        }
    });
    return grads;
}

// prediction, target (any shape, the same)  loss () = mean((prediction - target)²)
Tensor mse_loss_forward(const ForwardArgs& args) {
    const Tensor& prediction = args.inputs[0];
    const Tensor& target = args.inputs[1];
    Tensor loss = Tensor::empty(args.out.shape, args.out.dtype, prediction.device());
    dispatch_floating(prediction.dtype(), "mse_loss", [&]<typename T>() {
        const Eigen::Map<const ColumnArray<T>> P(prediction.data<T>(), prediction.numel());
        const Eigen::Map<const ColumnArray<T>> Tg(target.data<T>(), target.numel());
        loss.data<T>()[0] = (P - Tg).square().mean();
    });
    return loss;
}

// dloss () -> dprediction = 2 (prediction - target) / n * dloss, dtarget = -dprediction
std::vector<Tensor> mse_loss_backward(const BackwardArgs& args) {
    const Tensor& prediction = args.inputs[0];
    const Tensor& target = args.inputs[1];
    std::vector<Tensor> grads = math::point_loss_gradients(args);  // d prediction, d target where needed
    dispatch_floating(prediction.dtype(), "mse_loss backward", [&]<typename T>() {
        const std::int64_t n = prediction.numel();
        const Eigen::Map<const ColumnArray<T>> P(prediction.data<T>(), n);
        const Eigen::Map<const ColumnArray<T>> Tg(target.data<T>(), n);
        const T scale = T(2) * args.grad_output.data<T>()[0] / static_cast<T>(n);
        if (grads[0].defined()) Eigen::Map<ColumnArray<T>>(grads[0].data<T>(), n) = scale * (P - Tg);
        if (grads[1].defined()) Eigen::Map<ColumnArray<T>>(grads[1].data<T>(), n) = -scale * (P - Tg);
    });
    return grads;
}

// l1_loss, smooth_l1_loss: prediction, target;  bce_with_logits: logits, target, [weight], [pos_weight]
//   -> loss () (Mean over all n elements, Sum; summed in double) or the inputs' shape (None).
// Formulas: ops/loss_math.h.
Tensor pointwise_loss_forward(const ForwardArgs& args) {
    const Tensor& a = args.inputs[0];
    Tensor loss = Tensor::empty(args.out.shape, args.out.dtype, a.device());
    const std::int64_t n = a.numel();
    dispatch_floating(a.dtype(), "pointwise loss", [&]<typename T>() {
        const math::PointLossInputs<T> in = math::point_loss_inputs<T>(args.inputs, args.attrs);
        T* out = loss.data<T>();
        if (args.attrs.reduction == Reduction::None) {
            for (std::int64_t i = 0; i < n; ++i) out[i] = math::point_loss(args.op, in, i);
            return;
        }
        double total = 0.0;
        for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(math::point_loss(args.op, in, i));
        out[0] = static_cast<T>(args.attrs.reduction == Reduction::Mean ? total / static_cast<double>(n) : total);
    });
    return loss;
}

// dloss () or (shape)  ->  d input 0, d target (ops/loss_math.h) times the reduction factor (dloss / n for
// the mean); bce's weight and pos_weight get no gradient (as in PyTorch).
std::vector<Tensor> pointwise_loss_backward(const BackwardArgs& args) {
    const Tensor& a = args.inputs[0];
    std::vector<Tensor> grads = math::point_loss_gradients(args);
    const std::int64_t n = a.numel();
    dispatch_floating(a.dtype(), "pointwise loss backward", [&]<typename T>() {
        const math::PointLossInputs<T> in = math::point_loss_inputs<T>(args.inputs, args.attrs);
        const ReductionScale<T> scale(args.attrs.reduction, args.grad_output, static_cast<double>(n));
        T* da = grads[0].defined() ? grads[0].data<T>() : nullptr;
        T* db = grads[1].defined() ? grads[1].data<T>() : nullptr;
        for (std::int64_t i = 0; i < n; ++i) {
            T ga, gb;
            math::point_loss_grads(args.op, in, i, ga, gb);
            const T s = scale(i);
            if (da) da[i] = ga * s;
            if (db) db[i] = gb * s;
        }
    });
    return grads;
}

}  // namespace cpu

}  // namespace dyngrad
