// Softmax family and losses: user functions, shape rules and the CPU kernels (Eigen).
// GPU: ops/loss.cu.
#include "dyngrad/ops/loss.h"

#include <Eigen/Core>

#include "dyngrad/ops/kernels.h"

namespace dyngrad {

// ---- user functions ----
Var softmax(const Var& x, std::int64_t axis, std::source_location where) {
    OpAttrs attrs;
    attrs.axis = axis;
    return x.graph().record(OpType::Softmax, {x}, attrs, where);
}

Var log_softmax(const Var& x, std::int64_t axis, std::source_location where) {
    OpAttrs attrs;
    attrs.axis = axis;
    return x.graph().record(OpType::LogSoftmax, {x}, attrs, where);
}

Var cross_entropy(const Var& logits, const Var& labels, std::source_location where) {
    return logits.graph().record(OpType::CrossEntropy, {logits, labels}, {}, where);
}

Var mse_loss(const Var& prediction, const Var& target, std::source_location where) {
    return prediction.graph().record(OpType::MseLoss, {prediction, target}, {}, where);
}

// ---- eager calls (graph/eager.h): the same ops on Tensors ----
Tensor softmax(const Tensor& x, std::int64_t axis, std::source_location where) {
    OpAttrs attrs;
    attrs.axis = axis;
    return eager(OpType::Softmax, {x}, attrs, where);
}
Tensor log_softmax(const Tensor& x, std::int64_t axis, std::source_location where) {
    OpAttrs attrs;
    attrs.axis = axis;
    return eager(OpType::LogSoftmax, {x}, attrs, where);
}
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, std::source_location where) {
    return eager(OpType::CrossEntropy, {logits, labels}, {}, where);
}
Tensor mse_loss(const Tensor& prediction, const Tensor& target, std::source_location where) {
    return eager(OpType::MseLoss, {prediction, target}, {}, where);
}

// ---- shape rules ----
namespace infer {

OutputSpec along_axis(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_float(x, "x");
    normalize_axis(attrs.axis, x.rank());
    return {x.shape(), x.dtype()};
}

OutputSpec cross_entropy(OpType, std::span<const Tensor> inputs, const OpAttrs&) {
    const Tensor& logits = inputs[0];
    const Tensor& labels = inputs[1];
    require_float(logits, "logits");
    if (labels.dtype() != DType::i64)
        throw DTypeError(str("labels must be int64, got ", dtype_name(labels.dtype())));
    if (logits.rank() != 2) throw ShapeError(str("logits must be (N,C), got ", to_string(logits.shape())));
    if (labels.shape() != Shape{logits.shape()[0]})
        throw ShapeError(str("labels ", to_string(labels.shape()), " do not match logits ",
                             to_string(logits.shape()), ": expected (", logits.shape()[0], ")"));
    if (logits.numel() == 0)
        throw ShapeError(str("logits ", to_string(logits.shape()), " are empty: the mean needs N, C >= 1"));
    return {{}, logits.dtype()};
}

OutputSpec mse_loss(OpType, std::span<const Tensor> inputs, const OpAttrs&) {
    const Tensor& prediction = inputs[0];
    const Tensor& target = inputs[1];
    require_float(prediction, "prediction");
    if (target.dtype() != prediction.dtype())
        throw DTypeError(str("prediction is ", dtype_name(prediction.dtype()), " but target is ",
                             dtype_name(target.dtype())));
    if (prediction.shape() != target.shape())
        throw ShapeError(str("prediction ", to_string(prediction.shape()), " and target ",
                             to_string(target.shape()), " differ in shape"));
    if (prediction.numel() == 0) throw ShapeError("inputs are empty: the mean needs at least one element");
    return {{}, prediction.dtype()};
}

}  // namespace infer

// ---- CPU kernels ----
namespace cpu {

namespace {

template <typename T> using ArrayRM = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T> using ConstArrayMap = Eigen::Map<const ArrayRM<T>>;
template <typename T> using ArrayMap = Eigen::Map<ArrayRM<T>>;
template <typename T> using RowArray = Eigen::Array<T, 1, Eigen::Dynamic>;
template <typename T> using ColumnArray = Eigen::Array<T, Eigen::Dynamic, 1>;

// A tensor viewed as (outer, n, inner) around `axis`: each outer slice is an (n, inner) row-major
// block whose columns are the vectors being normalised.
struct AxisSplit {
    std::int64_t outer = 1, n = 1, inner = 1;
};

AxisSplit split_at(const Shape& shape, std::int64_t axis) {
    const int a = normalize_axis(axis, shape.size());
    AxisSplit s;
    for (int i = 0; i < a; ++i) s.outer *= shape[i];
    s.n = shape[a];
    for (std::size_t i = a + 1; i < shape.size(); ++i) s.inner *= shape[i];
    return s;
}

// Labels index rows of the logits, so they are checked before any use (in the backward too: the
// tensor may have been changed since the forward).
void check_labels(const Tensor& labels, std::int64_t classes) {
    const std::int64_t* label = labels.data<std::int64_t>();
    for (std::int64_t i = 0; i < labels.numel(); ++i)
        if (label[i] < 0 || label[i] >= classes)
            throw IndexError(str("label ", label[i], " at row ", i, " is out of range for ", classes, " classes"));
}

}  // namespace

// x (outer, n, inner) -> y same shape, normalised over n; the max is subtracted first so exp never
// overflows. LogSoftmax: y = x - max - log Σ exp(x - max).
Tensor softmax_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    if (y.numel() == 0) return y;
    const AxisSplit s = split_at(x.shape(), args.attrs.axis);
    const bool log = args.op == OpType::LogSoftmax;
    dispatch_floating(x.dtype(), "softmax", [&]<typename T>() {
        for (std::int64_t o = 0; o < s.outer; ++o) {
            const ConstArrayMap<T> X(x.data<T>() + o * s.n * s.inner, s.n, s.inner);
            ArrayMap<T> Y(y.data<T>() + o * s.n * s.inner, s.n, s.inner);
            const RowArray<T> max = X.colwise().maxCoeff();
            if (log) {
                Y = X.rowwise() - max;
                const RowArray<T> log_sum = Y.exp().colwise().sum().log();
                Y.rowwise() -= log_sum;
            } else {
                Y = (X.rowwise() - max).exp();
                const RowArray<T> sum = Y.colwise().sum();
                Y.rowwise() /= sum;
            }
        }
    });
    return y;
}

// From the output y and dy (outer, n, inner):
//   softmax:     dx = y * (dy - Σ dy·y)
//   log_softmax: dx = dy - exp(y) * Σ dy
std::vector<Tensor> softmax_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& y = args.output;
    const Tensor& dy = args.grad_output;
    if (!args.needs_grad[0]) return {Tensor()};
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (dx.numel() == 0) return {dx};
    const AxisSplit s = split_at(x.shape(), args.attrs.axis);
    const bool log = args.op == OpType::LogSoftmax;
    dispatch_floating(x.dtype(), "softmax backward", [&]<typename T>() {
        for (std::int64_t o = 0; o < s.outer; ++o) {
            const std::int64_t offset = o * s.n * s.inner;
            const ConstArrayMap<T> Y(y.data<T>() + offset, s.n, s.inner);
            const ConstArrayMap<T> dY(dy.data<T>() + offset, s.n, s.inner);
            ArrayMap<T> dX(dx.data<T>() + offset, s.n, s.inner);
            if (log) {
                const RowArray<T> sum = dY.colwise().sum();
                dX = dY - (Y.exp().rowwise() * sum);
            } else {
                const RowArray<T> dot = (dY * Y).colwise().sum();
                dX = Y * (dY.rowwise() - dot);
            }
        }
    });
    return {dx};
}

// logits (N,C)  labels (N) int64  loss () = mean_i [log Σ_c exp(logits_ic) - logits_i,label_i]
// Fused with a log-sum-exp for numerical stability; saves lse (N) so the backward rebuilds the softmax.
Tensor cross_entropy_forward(const ForwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    const Tensor& labels = args.inputs[1];
    const std::int64_t n = logits.size(0);
    const std::int64_t classes = logits.size(1);
    check_labels(labels, classes);
    Tensor loss = Tensor::empty(args.out.shape, args.out.dtype, logits.device());
    Tensor lse = Tensor::empty({n}, logits.dtype(), logits.device());
    dispatch_floating(logits.dtype(), "cross_entropy", [&]<typename T>() {
        const ConstArrayMap<T> X(logits.data<T>(), n, classes);
        Eigen::Map<ColumnArray<T>> L(lse.data<T>(), n);
        const ColumnArray<T> max = X.rowwise().maxCoeff();
        L = max + (X.colwise() - max).exp().rowwise().sum().log();
        const std::int64_t* label = labels.data<std::int64_t>();
        ColumnArray<T> picked(n);
        for (std::int64_t i = 0; i < n; ++i) picked(i) = X(i, label[i]);
        loss.data<T>()[0] = (L - picked).mean();
    });
    args.saved.push_back(lse);
    return loss;
}

// dloss () -> dlogits (N,C) = (softmax(logits) - onehot(labels)) * dloss / N; labels get no gradient.
std::vector<Tensor> cross_entropy_backward(const BackwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    const Tensor& labels = args.inputs[1];
    std::vector<Tensor> grads(2);
    if (!args.needs_grad[0]) return grads;
    if (args.saved.size() != 1) throw Error("internal: cross_entropy backward needs the forward's log-sum-exp");
    const Tensor& lse = args.saved[0];
    const std::int64_t n = logits.size(0);
    const std::int64_t classes = logits.size(1);
    check_labels(labels, classes);
    grads[0] = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
    dispatch_floating(logits.dtype(), "cross_entropy backward", [&]<typename T>() {
        const ConstArrayMap<T> X(logits.data<T>(), n, classes);
        const Eigen::Map<const ColumnArray<T>> L(lse.data<T>(), n);
        ArrayMap<T> dX(grads[0].data<T>(), n, classes);
        dX = (X.colwise() - L).exp();
        const std::int64_t* label = labels.data<std::int64_t>();
        for (std::int64_t i = 0; i < n; ++i) dX(i, label[i]) -= T(1);
        dX *= args.grad_output.data<T>()[0] / static_cast<T>(n);
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
    std::vector<Tensor> grads(2);
    for (std::size_t i = 0; i < 2; ++i)
        if (args.needs_grad[i]) grads[i] = Tensor::empty(prediction.shape(), prediction.dtype(), prediction.device());
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

}  // namespace cpu

}  // namespace dyngrad
