// Normalisation and regularisation: batch_norm and dropout. The user functions, shape rules and the
// CPU kernels (Eigen). GPU: ops/norm.cu. Dropout's mask formula: ops/dropout_mask.h.
#include "dyngrad/ops/norm.h"

#include <Eigen/Core>

#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/kernels.h"

namespace dyngrad {

// ---- user functions ----
Var batch_norm(const Var& x, const Var& gamma, const Var& beta, const Tensor& running_mean,
               const Tensor& running_var, bool training, double momentum, double eps, std::source_location where) {
    ComputeGraph& graph = x.graph();
    OpAttrs attrs;
    attrs.training = training;
    attrs.momentum = momentum;
    attrs.eps = eps;
    // Constants share the caller's storage: the forward's in-place update reaches the layer's tensors.
    return graph.record(OpType::BatchNorm,
                        {x, gamma, beta, graph.constant(running_mean, where), graph.constant(running_var, where)},
                        attrs, where);
}

Var dropout(const Var& x, double p, bool training, std::uint64_t seed, std::source_location where) {
    OpAttrs attrs;
    attrs.scalar = p;
    attrs.training = training;
    attrs.seed = seed;
    return x.graph().record(OpType::Dropout, {x}, attrs, where);
}

// ---- eager calls (graph/eager.h): the same ops on Tensors ----
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps, std::source_location where) {
    OpAttrs attrs;
    attrs.training = training;
    attrs.momentum = momentum;
    attrs.eps = eps;
    return eager(OpType::BatchNorm, {x, gamma, beta, running_mean, running_var}, attrs, where);
}

Tensor dropout(const Tensor& x, double p, bool training, std::uint64_t seed, std::source_location where) {
    OpAttrs attrs;
    attrs.scalar = p;
    attrs.training = training;
    attrs.seed = seed;
    return eager(OpType::Dropout, {x}, attrs, where);
}

// ---- shape rules ----
namespace infer {

OutputSpec batch_norm(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    static constexpr const char* kRoles[] = {"x", "gamma", "beta", "running_mean", "running_var"};
    const Tensor& x = inputs[0];
    require_float(x, "x");
    for (std::size_t i = 1; i < inputs.size(); ++i)
        if (inputs[i].dtype() != x.dtype())
            throw DTypeError(str(kRoles[i], " is ", dtype_name(inputs[i].dtype()), " but x is ",
                                 dtype_name(x.dtype())));
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

OutputSpec dropout(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_float(x, "x");
    if (!(attrs.scalar >= 0 && attrs.scalar < 1)) throw ValueError(str("p must be in [0, 1), got ", attrs.scalar));
    return {x.shape(), x.dtype()};
}

}  // namespace infer

// ---- CPU kernels ----
namespace cpu {

namespace {

template <typename T> using ArrayRM = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T> using Column = Eigen::Array<T, Eigen::Dynamic, 1>;
using Stats = Eigen::ArrayXd;  // per-channel statistics, accumulated in double

// x viewed as (N, C, HW): HW = H·W for (N,C,H,W), 1 for (N,C). Sample n is a (C, HW) row-major block.
struct ChannelLayout {
    std::int64_t n = 0, c = 0, hw = 1;
    std::int64_t per_channel() const { return n * hw; }
};

ChannelLayout channel_layout(const Shape& shape) {
    ChannelLayout l;
    l.n = shape[0];
    l.c = shape[1];
    for (std::size_t i = 2; i < shape.size(); ++i) l.hw *= shape[i];
    return l;
}

template <typename T>
Eigen::Map<const ArrayRM<T>> sample(const Tensor& t, const ChannelLayout& l, std::int64_t n) {
    return {t.data<T>() + n * l.c * l.hw, l.c, l.hw};
}
template <typename T>
Eigen::Map<ArrayRM<T>> sample_out(const Tensor& t, const ChannelLayout& l, std::int64_t n) {
    return {t.data<T>() + n * l.c * l.hw, l.c, l.hw};
}
template <typename T>
Eigen::Map<Column<T>> channels(const Tensor& t) {
    return {t.data<T>(), t.numel()};
}

// Each element scaled by its mask value: 1/(1 − p) where kept, 0 where dropped.
template <typename T>
auto dropout_mask(const OpAttrs& attrs, std::int64_t n) {
    const std::uint64_t seed = attrs.seed;
    const double p = attrs.scalar;
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    return Column<T>::NullaryExpr(n, [seed, p, scale](Eigen::Index i) {
        return math::dropout_keep(seed, static_cast<std::uint64_t>(i), p) ? scale : T(0);
    });
}

bool dropout_is_identity(const OpAttrs& attrs) { return !attrs.training || attrs.scalar == 0.0; }

}  // namespace

// x (N,C[,H,W])  gamma, beta, running_mean, running_var (C)  ->  y like x
// Saves mean and invstd = 1/sqrt(var + eps) (C) as used: the batch's in training, the running ones in eval.
Tensor batch_norm_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& running_mean = args.inputs[3];
    const Tensor& running_var = args.inputs[4];
    const ChannelLayout l = channel_layout(x.shape());
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    Tensor mean = Tensor::empty({l.c}, x.dtype(), x.device());
    Tensor invstd = Tensor::empty({l.c}, x.dtype(), x.device());
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
        const Column<T> scale = channels<T>(args.inputs[1]) * channels<T>(invstd);
        const Column<T> shift = channels<T>(args.inputs[2]);
        const Column<T> center = channels<T>(mean);
        for (std::int64_t n = 0; n < l.n; ++n)
            sample_out<T>(y, l, n) = ((sample<T>(x, l, n).colwise() - center).colwise() * scale).colwise() + shift;
    });
    args.saved.push_back(mean);
    args.saved.push_back(invstd);
    return y;
}

// dy like x  ->  with x̂ = (x − mean)·invstd, per channel over N,H,W (M values):
//   dgamma = Σ dy·x̂,  dbeta = Σ dy
//   training: dx = gamma·invstd·(dy − Σdy/M − x̂·Σ(dy·x̂)/M)   (through the batch statistics)
//   eval:     dx = gamma·invstd·dy
// The running statistics get no gradient.
std::vector<Tensor> batch_norm_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& dy = args.grad_output;
    std::vector<Tensor> grads(args.inputs.size());
    const bool need_dx = args.needs_grad[0], need_dgamma = args.needs_grad[1], need_dbeta = args.needs_grad[2];
    if (!need_dx && !need_dgamma && !need_dbeta) return grads;
    if (args.saved.size() != 2) throw Error("internal: batch_norm backward needs the forward's mean and invstd");
    const Tensor& mean = args.saved[0];
    const Tensor& invstd = args.saved[1];
    const ChannelLayout l = channel_layout(x.shape());
    const bool training = args.attrs.training;
    dispatch_floating(x.dtype(), "batch_norm backward", [&]<typename T>() {
        const Stats mu = channels<T>(mean).template cast<double>();
        const Stats inv = channels<T>(invstd).template cast<double>();
        Stats sum_dy = Stats::Zero(l.c), sum_dy_xhat = Stats::Zero(l.c);
        if (need_dgamma || need_dbeta || (training && need_dx)) {
            for (std::int64_t n = 0; n < l.n; ++n) {
                const auto dY = sample<T>(dy, l, n).template cast<double>();
                const auto xhat = (sample<T>(x, l, n).template cast<double>().colwise() - mu).colwise() * inv;
                sum_dy += dY.rowwise().sum();
                sum_dy_xhat += (dY * xhat).rowwise().sum();
            }
        }
        if (need_dgamma) {
            grads[1] = Tensor::empty({l.c}, x.dtype(), x.device());
            channels<T>(grads[1]) = sum_dy_xhat.template cast<T>();
        }
        if (need_dbeta) {
            grads[2] = Tensor::empty({l.c}, x.dtype(), x.device());
            channels<T>(grads[2]) = sum_dy.template cast<T>();
        }
        if (!need_dx) return;
        grads[0] = Tensor::empty(x.shape(), x.dtype(), x.device());
        const Column<T> k = channels<T>(args.inputs[1]) * channels<T>(invstd);
        if (!training) {
            for (std::int64_t n = 0; n < l.n; ++n) sample_out<T>(grads[0], l, n) = sample<T>(dy, l, n).colwise() * k;
            return;
        }
        const auto count = static_cast<double>(l.per_channel());
        const Column<T> mean_dy = (sum_dy / count).template cast<T>();
        const Column<T> mean_dy_xhat = (sum_dy_xhat / count).template cast<T>();
        const Column<T> center = channels<T>(mean);
        const Column<T> scale = channels<T>(invstd);
        for (std::int64_t n = 0; n < l.n; ++n) {
            const auto xhat = (sample<T>(x, l, n).colwise() - center).colwise() * scale;
            sample_out<T>(grads[0], l, n) =
                ((sample<T>(dy, l, n).colwise() - mean_dy) - xhat.colwise() * mean_dy_xhat).colwise() * k;
        }
    });
    return grads;
}

// x (any shape) -> y like x: x · mask, mask = 1/(1 − p) or 0 per element (identity in eval or at p = 0)
Tensor dropout_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    dispatch_floating(x.dtype(), "dropout", [&]<typename T>() {
        const std::int64_t n = x.numel();
        const Eigen::Map<const Column<T>> X(x.data<T>(), n);
        Eigen::Map<Column<T>> Y(y.data<T>(), n);
        if (dropout_is_identity(args.attrs))
            Y = X;
        else
            Y = X * dropout_mask<T>(args.attrs, n);
    });
    return y;
}

// dy -> dx = dy · mask, the forward's mask recomputed from (seed, index)
std::vector<Tensor> dropout_backward(const BackwardArgs& args) {
    if (!args.needs_grad[0]) return {Tensor()};
    const Tensor& dy = args.grad_output;
    if (dropout_is_identity(args.attrs)) return {dy};
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    dispatch_floating(dy.dtype(), "dropout backward", [&]<typename T>() {
        const std::int64_t n = dy.numel();
        Eigen::Map<Column<T>>(dx.data<T>(), n) =
            Eigen::Map<const Column<T>>(dy.data<T>(), n) * dropout_mask<T>(args.attrs, n);
    });
    return {dx};
}

}  // namespace cpu

}  // namespace dyngrad
