// Elementwise ops: the user functions, their shape rules and the Eigen kernels. The scalar formulas
// live in ops/elementwise_math.h, shared with ops/elementwise.cu.
// Over 600 lines: the unary, binary and cast ops and, at the end, softmax/log_softmax (the activations along an
// axis); they share the dispatch and broadcast helpers at the top.
#include "dyngrad/ops/elementwise.h"

#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "dyngrad/ops/cpu_parallel.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduce.h"

namespace dyngrad {

namespace {

template <typename T>
using Array1 = Eigen::Array<T, Eigen::Dynamic, 1>;

template <typename T>
Eigen::Map<const Array1<T>> in(const T* data, std::int64_t n) {
    return {data, n};
}
template <typename T>
Eigen::Map<const Array1<T>> in(const Tensor& t) {
    return {t.data<T>(), t.numel()};
}
template <typename T>
Eigen::Map<Array1<T>> out(const Tensor& t) {
    return {t.data<T>(), t.numel()};
}
// Elements [begin, end) of a tensor, for the chunks of parallel_elements (ops/cpu_parallel.h).
template <typename T>
Eigen::Map<const Array1<T>> in(const Tensor& t, std::int64_t begin, std::int64_t end) {
    return {t.data<T>() + begin, end - begin};
}
template <typename T>
Eigen::Map<Array1<T>> out(const Tensor& t, std::int64_t begin, std::int64_t end) {
    return {t.data<T>() + begin, end - begin};
}

// The output dims of a broadcasting binary op, with each input's element stride along them (0 where
// that input is broadcast). Size-1 dims are dropped and neighbours merged wherever both inputs stay
// contiguous across them: (N,C)+(C) walks N runs of C, equal shapes one run of N*C. The innermost dim
// is then one run per output row along which each input is contiguous (stride 1) or constant (stride 0).
struct BroadcastPlan {
    std::vector<std::int64_t> dims;
    std::vector<std::int64_t> stride_a;
    std::vector<std::int64_t> stride_b;
};

BroadcastPlan plan_broadcast(const Shape& y, const Shape& a, const Shape& b) {
    const auto aligned_strides = [&y](const Shape& s) {
        std::vector<std::int64_t> strides(y.size(), 0);
        const std::vector<std::int64_t> own = contiguous_strides(s);
        const std::size_t lead = y.size() - s.size();
        for (std::size_t i = 0; i < s.size(); ++i)
            if (s[i] != 1) strides[lead + i] = own[i];
        return strides;
    };
    const std::vector<std::int64_t> sa = aligned_strides(a);
    const std::vector<std::int64_t> sb = aligned_strides(b);
    BroadcastPlan plan;
    for (std::size_t i = 0; i < y.size(); ++i) {
        if (y[i] == 1) continue;
        const bool mergeable = !plan.dims.empty() && plan.stride_a.back() == sa[i] * y[i] &&
                               plan.stride_b.back() == sb[i] * y[i];
        if (mergeable) {
            plan.dims.back() *= y[i];
            plan.stride_a.back() = sa[i];
            plan.stride_b.back() = sb[i];
        } else {
            plan.dims.push_back(y[i]);
            plan.stride_a.push_back(sa[i]);
            plan.stride_b.push_back(sb[i]);
        }
    }
    if (plan.dims.empty()) plan = {{1}, {0}, {0}};  // one element
    return plan;
}

// Calls run(y_offset, a_offset, b_offset, n) for each innermost run of n output elements, stepping the
// outer dims with an odometer (no division per element).
template <typename Run>
void for_each_run(const BroadcastPlan& plan, Run&& run) {
    const std::size_t outer_rank = plan.dims.size() - 1;
    const std::int64_t n = plan.dims.back();
    std::int64_t runs = 1;
    for (std::size_t d = 0; d < outer_rank; ++d) runs *= plan.dims[d];
    if (n == 0) return;
    std::vector<std::int64_t> index(outer_rank, 0);
    std::int64_t ia = 0, ib = 0;
    for (std::int64_t k = 0; k < runs; ++k) {
        run(k * n, ia, ib, n);
        for (std::size_t d = outer_rank; d-- > 0;) {
            if (++index[d] < plan.dims[d]) {
                ia += plan.stride_a[d];
                ib += plan.stride_b[d];
                break;
            }
            index[d] = 0;
            ia -= plan.stride_a[d] * (plan.dims[d] - 1);
            ib -= plan.stride_b[d] * (plan.dims[d] - 1);
        }
    }
}

// For each innermost run of the plan: store(y_offset, n, values), `values` being the Eigen expression
// f(a, b) over that run; the caller decides what to write where.
template <typename T, typename F, typename Store>
void broadcast_runs(const BroadcastPlan& plan, const T* a, const T* b, F f, Store store) {
    const std::int64_t sa = plan.stride_a.back();
    const std::int64_t sb = plan.stride_b.back();
    for_each_run(plan, [&](std::int64_t iy, std::int64_t ia, std::int64_t ib, std::int64_t n) {
        if (sa == 1 && sb == 1) {
            store(iy, n, in(a + ia, n).binaryExpr(in(b + ib, n), f));
        } else if (sa == 0 && sb == 1) {
            const T av = a[ia];
            store(iy, n, in(b + ib, n).unaryExpr([&](T v) { return f(av, v); }));
        } else if (sa == 1 && sb == 0) {
            const T bv = b[ib];
            store(iy, n, in(a + ia, n).unaryExpr([&](T u) { return f(u, bv); }));
        } else {
            store(iy, n, Array1<T>::Constant(n, f(a[ia], b[ib])));  // both constant: a one-element output
        }
    });
}

std::string_view file_name(const Loc& where) {
    const std::string_view path = where.file_name();
    const std::size_t slash = path.find_last_of("/\\");
    return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

// ---- user functions: the front doors with more than a row behind them (the others are in the header) ----
template <Operand T>
T div_scalar(const T& x, double s, Loc where) {
    if (s == 0) throw ValueError(str("div_scalar at ", file_name(where), ":", where.line(), ": division by zero"));
    return mul_scalar(x, 1.0 / s, where);
}
template Var div_scalar(const Var&, double, Loc);
template Tensor div_scalar(const Tensor&, double, Loc);

// The operators both operand types share: the front doors, at the call site the At operand captured.
#define DG_SHARED_OPERATORS(T, At, operand)                                                  \
    T operator+(At a, const T& b) { return add(a.operand, b, a.where); }                     \
    T operator-(At a, const T& b) { return sub(a.operand, b, a.where); }                     \
    T operator*(At a, const T& b) { return mul(a.operand, b, a.where); }                     \
    T operator/(At a, const T& b) { return div(a.operand, b, a.where); }                     \
    T operator-(At x) { return neg(x.operand, x.where); }                                    \
    T operator+(At x, double s) { return add_scalar(x.operand, s, x.where); }                \
    T operator+(double s, At x) { return add_scalar(x.operand, s, x.where); }                \
    T operator-(At x, double s) { return add_scalar(x.operand, -s, x.where); }               \
    T operator*(At x, double s) { return mul_scalar(x.operand, s, x.where); }                \
    T operator*(double s, At x) { return mul_scalar(x.operand, s, x.where); }                \
    T operator/(At x, double s) { return div_scalar(x.operand, s, x.where); }
DG_SHARED_OPERATORS(Var, VarAt, var)
DG_SHARED_OPERATORS(Tensor, TensorAt, tensor)
#undef DG_SHARED_OPERATORS

// Comparisons take int64 operands too (argmax against labels is an accuracy): such an operand is compared in
// the other's float dtype, float64 when both are int64 (exact below 2^53), as PyTorch promotes. An int64 value
// has no gradient to lose, so its converted value enters as a constant (the cast op converts floating tensors).
namespace {
DType comparison_dtype(DType a, DType b) { return a != DType::i64 ? a : b != DType::i64 ? b : DType::f64; }
Var comparable(const Var& x, DType dtype, Loc where) {
    return x.defined() && x.dtype() == DType::i64 ? x.graph().constant(x.value().to(dtype), where) : x;
}
Tensor comparable(const Tensor& x, DType dtype, Loc) { return x.defined() && x.dtype() == DType::i64 ? x.to(dtype) : x; }
template <Operand T>
T compare(OpType op, const T& a, const T& b, Loc where) {
    if (!a.defined() || !b.defined()) return apply_op(op, {a, b}, {}, where);  // the engine's error
    const DType dtype = comparison_dtype(a.dtype(), b.dtype());
    return apply_op(op, {comparable(a, dtype, where), comparable(b, dtype, where)}, {}, where);
}
}  // namespace

#define DG_COMPARISON_FRONT_DOOR(name, tag)                                                   \
    template <Operand T>                                                                      \
    T name(const T& a, const T& b, Loc where) {                                               \
        return compare(OpType::tag, a, b, where);                                             \
    }                                                                                         \
    template Var name(const Var&, const Var&, Loc);                                           \
    template Tensor name(const Tensor&, const Tensor&, Loc);
DG_COMPARISON_FRONT_DOOR(eq, Eq)
DG_COMPARISON_FRONT_DOOR(ne, Ne)
DG_COMPARISON_FRONT_DOOR(lt, Lt)
DG_COMPARISON_FRONT_DOOR(le, Le)
DG_COMPARISON_FRONT_DOOR(gt, Gt)
DG_COMPARISON_FRONT_DOOR(ge, Ge)
#undef DG_COMPARISON_FRONT_DOOR

namespace {
// `s` as a one-element tensor of x's dtype and device, for a binary op with a scalar operand; float64 beside
// int64, so `labels >= 1.5` compares with 1.5, not with a truncated 1.
Tensor scalar_like(const Tensor& x, double s, Loc where) {
    if (!x.defined())
        throw ValueError(str("operator at ", describe_site(where), ": the tensor beside the scalar ", s, " is undefined"));
    return Tensor::full({}, s, x.dtype() == DType::i64 ? DType::f64 : x.dtype(), x.device());
}
}  // namespace

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, Loc where) {
    if (!(rtol >= 0) || !(atol >= 0))
        throw ValueError(str("allclose at ", describe_site(where), ": rtol and atol must be >= 0, got rtol ", rtol,
                             ", atol ", atol));
    const Tensor close = le(abs(sub(a, b, where), where), add_scalar(mul_scalar(abs(b, where), rtol, where), atol, where),
                            where);
    if (close.shape() != a.shape())  // b may broadcast to a, not a to b
        throw ShapeError(str("allclose at ", describe_site(where), ": ", describe(b), " does not broadcast to ",
                             describe(a)));
    // Counted in float64: a sum of ones in bf16 (or f16) is exact only to 256 (2048), so a 16-bit count of 511
    // close elements would round to 512 and pass a tensor with one element far off.
    return sum(close.to(DType::f64), {}, false, where).item() == static_cast<double>(close.numel());
}

bool equal(const Tensor& a, const Tensor& b, Loc where) {
    for (const Tensor* t : {&a, &b})
        if (!t->defined()) throw ValueError(str("equal at ", describe_site(where), ": a tensor is undefined"));
    if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
    if (a.device() != b.device())
        throw DeviceError(str("equal at ", describe_site(where), ": ", describe(a), " vs ", describe(b)));
    if (!is_floating(a.dtype())) return a.to_vector() == b.to_vector();  // int64: compared on the host
    return sum(eq(a, b, where).to(DType::f64), {}, false, where).item() == static_cast<double>(a.numel());  // as allclose
}

Tensor operator-(double s, TensorAt x) { return sub(scalar_like(x.tensor, s, x.where), x.tensor, x.where); }
Tensor operator/(double s, TensorAt x) { return div(scalar_like(x.tensor, s, x.where), x.tensor, x.where); }
Tensor operator==(TensorAt a, const Tensor& b) { return eq(a.tensor, b, a.where); }
Tensor operator!=(TensorAt a, const Tensor& b) { return ne(a.tensor, b, a.where); }
Tensor operator<(TensorAt a, const Tensor& b) { return lt(a.tensor, b, a.where); }
Tensor operator<=(TensorAt a, const Tensor& b) { return le(a.tensor, b, a.where); }
Tensor operator>(TensorAt a, const Tensor& b) { return gt(a.tensor, b, a.where); }
Tensor operator>=(TensorAt a, const Tensor& b) { return ge(a.tensor, b, a.where); }
Tensor operator==(TensorAt x, double s) { return eq(x.tensor, scalar_like(x.tensor, s, x.where), x.where); }
Tensor operator!=(TensorAt x, double s) { return ne(x.tensor, scalar_like(x.tensor, s, x.where), x.where); }
Tensor operator<(TensorAt x, double s) { return lt(x.tensor, scalar_like(x.tensor, s, x.where), x.where); }
Tensor operator<=(TensorAt x, double s) { return le(x.tensor, scalar_like(x.tensor, s, x.where), x.where); }
Tensor operator>(TensorAt x, double s) { return gt(x.tensor, scalar_like(x.tensor, s, x.where), x.where); }
Tensor operator>=(TensorAt x, double s) { return ge(x.tensor, scalar_like(x.tensor, s, x.where), x.where); }
Tensor operator==(double s, TensorAt x) { return eq(scalar_like(x.tensor, s, x.where), x.tensor, x.where); }
Tensor operator!=(double s, TensorAt x) { return ne(scalar_like(x.tensor, s, x.where), x.tensor, x.where); }
Tensor operator<(double s, TensorAt x) { return lt(scalar_like(x.tensor, s, x.where), x.tensor, x.where); }
Tensor operator<=(double s, TensorAt x) { return le(scalar_like(x.tensor, s, x.where), x.tensor, x.where); }
Tensor operator>(double s, TensorAt x) { return gt(scalar_like(x.tensor, s, x.where), x.tensor, x.where); }
Tensor operator>=(double s, TensorAt x) { return ge(scalar_like(x.tensor, s, x.where), x.tensor, x.where); }

namespace infer {

OutputSpec same_as_first(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    if (!is_floating(x.dtype()))
        throw DTypeError(str("expects float32 or float64, got ", dtype_name(x.dtype())));
    if (op == OpType::ClippedRelu && !(attrs.scalar > 0))
        throw ValueError(str("ceiling must be positive, got ", attrs.scalar));
    if (op == OpType::Clamp) {
        const std::optional<double>& min = attrs.clamp_min;
        const std::optional<double>& max = attrs.clamp_max;
        if (!min && !max) throw ValueError("needs a min or a max bound (or both), got neither");
        if (min && std::isnan(*min)) throw ValueError("min is NaN");
        if (max && std::isnan(*max)) throw ValueError("max is NaN");
        if (min && max && *min > *max) throw ValueError(str("min ", *min, " is greater than max ", *max));
    }
    if (op == OpType::Gelu && attrs.gelu_approximation != GeluApproximation::None &&
        attrs.gelu_approximation != GeluApproximation::Tanh)
        throw ValueError(str("approximation must be None or Tanh, got ",
                             static_cast<int>(attrs.gelu_approximation)));
    return {x.shape(), x.dtype()};
}

OutputSpec cast(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    if (!is_floating(x.dtype()))
        throw DTypeError(str("converts floating tensors; x is ", dtype_name(x.dtype())));
    if (!is_floating(attrs.dtype))
        throw DTypeError(str("converts to float32, float64, bfloat16 or float16, not to ", dtype_name(attrs.dtype),
                             " (dtype code ", static_cast<int>(attrs.dtype), ")"));
    return {x.shape(), attrs.dtype};
}

OutputSpec broadcast(OpType, std::span<const Tensor> inputs, const OpAttrs&) {
    const Tensor& a = inputs[0];
    const Tensor& b = inputs[1];
    for (const Tensor* t : {&a, &b})
        if (!is_floating(t->dtype()))
            throw DTypeError(str("expects float32 or float64, got ", dtype_name(t->dtype())));
    if (a.dtype() != b.dtype()) throw DTypeError(str(dtype_name(a.dtype()), " vs ", dtype_name(b.dtype())));
    return {broadcast_shapes(a.shape(), b.shape()), a.dtype()};
}

}  // namespace infer

// x -> y = x in the target dtype (aliases x when it is already that dtype, as the contract allows)
Tensor cast_forward(const ForwardArgs& args) { return args.inputs[0].to(args.out.dtype); }

// dy (target dtype) -> dx = dy in x's dtype
std::vector<Tensor> cast_backward(const BackwardArgs& args) {
    std::vector<Tensor> grads(1);
    if (args.needs_grad[0]) grads[0] = args.grad_output.to(args.inputs[0].dtype());
    return grads;
}

// ---- Differentiable backwards (graph/higher_order.h): the derivatives above, written with recorded ops ----

namespace {

// dy · f'(x) for a unary op, f' built from x and the output y as Vars; the kinks' masks are constants.
Var unary_derivative(const DiffBackwardArgs& args) {
    const Var& x = args.inputs[0];
    const Var& y = args.output;
    const Tensor& xv = x.value();
    const double s = args.attrs.scalar;
    const auto mask = [&](const Tensor& m) { return constant_of(x, m); };
    switch (args.op) {
        case OpType::Exp: return y;
        case OpType::Log: return pow(x, -1.0);
        case OpType::Sqrt: return pow(mul_scalar(y, 2.0), -1.0);
        case OpType::PowScalar: return mul_scalar(pow(x, s - 1.0), s);
        case OpType::Abs: return mask((xv > 0.0) - (xv < 0.0));
        case OpType::Sin: return cos(x);
        case OpType::Cos: return neg(sin(x));
        case OpType::Clamp: {
            const double inf = std::numeric_limits<double>::infinity();
            return mask((xv > args.attrs.clamp_min.value_or(-inf)) * (xv < args.attrs.clamp_max.value_or(inf)));
        }
        case OpType::Relu: return mask(xv > 0.0);
        case OpType::LeakyRelu: return mask((xv > 0.0) + (xv <= 0.0) * s);
        case OpType::Elu:  // alpha·e^x below 0 (e^min(x, 0): no overflow on the side the mask drops), 1 above
            return mul(mask(xv <= 0.0), mul_scalar(exp(clamp(x, std::nullopt, 0.0)), s)) + mask(xv > 0.0);
        case OpType::ClippedRelu: return mask((xv > 0.0) * (xv < s));
        case OpType::Sigmoid: return mul(y, sigmoid(neg(x)));  // σ(x)·σ(-x), not y·(1 - y)
        case OpType::Tanh: return add_scalar(neg(mul(y, y)), 1.0);
        case OpType::Softplus: return sigmoid(x);
        case OpType::Silu: return sigmoid(x) + mul(x, mul(sigmoid(x), sigmoid(neg(x))));
        case OpType::LogSigmoid: return sigmoid(neg(x));
        case OpType::Softsign: return pow(add_scalar(abs(x), 1.0), -2.0);  // 1 / (1 + |x|)²
        case OpType::Gelu: {
            if (args.attrs.gelu_approximation == GeluApproximation::Tanh) {  // σ(2u) + x·2σ(2u)σ(-2u)·du/dx
                const double c = 0.79788456080286535588;
                const Var two_u = mul_scalar(x + mul_scalar(pow(x, 3.0), 0.044715), 2 * c);
                const Var du_dx = add_scalar(mul_scalar(mul(x, x), c * 3 * 0.044715), c);
                return sigmoid(two_u) + mul(mul_scalar(mul(x, sigmoid(two_u)), 2.0), mul(sigmoid(neg(two_u)), du_dx));
            }
            // Φ(x) + x·φ(x). Φ has no op of its own: Φ(x) = gelu(x)/x, exact to rounding (a quotient, nothing
            // cancels) everywhere but x = 0 exactly, where the mask puts Φ(0) = 1/2.
            const Tensor zero = (xv == 0.0);
            const Var phi_cdf = div(gelu(x), x + mask(zero)) + mask(zero * 0.5);
            const Var phi = mul_scalar(exp(mul_scalar(mul(x, x), -0.5)), 0.39894228040143267794);
            return phi_cdf + mul(x, phi);
        }
        default: break;
    }
    throw GraphError(str("differentiable backward: ", op_def(args.op).name, " is not a unary op"));
}

}  // namespace

std::vector<Var> unary_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    const Var& g = args.grad_output;
    switch (args.op) {
        case OpType::Neg: return {neg(g)};
        case OpType::AddScalar: return {g};
        case OpType::MulScalar: return {mul_scalar(g, args.attrs.scalar)};
        case OpType::Cast: return {to_dtype(g, args.inputs[0].dtype())};
        default: return {mul(g, unary_derivative(args))};
    }
}

// da, db in the output's (broadcast) shape; the engine sums them back with recorded ops.
std::vector<Var> binary_differentiable_backward(const DiffBackwardArgs& args) {
    const Var& a = args.inputs[0];
    const Var& b = args.inputs[1];
    const Var& g = args.grad_output;
    std::vector<Var> grads(2);
    const auto want = [&](std::size_t i, auto make) {
        if (args.needs_grad[i]) grads[i] = make();
    };
    switch (args.op) {
        case OpType::Add: want(0, [&] { return g; }); want(1, [&] { return g; }); break;
        case OpType::Sub: want(0, [&] { return g; }); want(1, [&] { return neg(g); }); break;
        case OpType::Mul: want(0, [&] { return mul(g, b); }); want(1, [&] { return mul(g, a); }); break;
        case OpType::Div:
            want(0, [&] { return div(g, b); });
            want(1, [&] { return neg(div(mul(g, a), mul(b, b))); });
            break;
        case OpType::Maximum:
        case OpType::Minimum: {  // the kernels' tie rule: half each
            const Tensor& av = a.value();
            const Tensor& bv = b.value();
            const Tensor a_wins = args.op == OpType::Maximum ? (av > bv) : (av < bv);
            const Tensor b_wins = args.op == OpType::Maximum ? (av < bv) : (av > bv);
            const Tensor tie = (av == bv) * 0.5;
            want(0, [&] { return mul(g, constant_of(a, a_wins + tie)); });
            want(1, [&] { return mul(g, constant_of(b, b_wins + tie)); });
            break;
        }
        default: throw GraphError(str("differentiable backward: ", op_def(args.op).name, " is not a binary op"));
    }
    return grads;
}

// softmax: dx = y·(dy − Σ dy·y);  log_softmax: dx = dy − e^y·Σ dy  (sums along the axis)
std::vector<Var> softmax_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    const Var& y = args.output;
    const Var& g = args.grad_output;
    const std::vector<std::int64_t> axis{args.attrs.axis};
    if (args.op == OpType::Softmax) return {mul(y, g - sum(mul(g, y), axis, true))};
    return {g - mul(exp(y), sum(g, axis, true))};
}

namespace cpu {

// x, y: same shape
Tensor unary_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    dispatch_floating(x.dtype(), "unary_forward", [&]<typename T>() {
        const math::UnaryScalars<T> p = math::unary_scalars<T>(args.attrs);
        math::visit_unary(args.op, args.attrs, [&]<typename Op>(Op) {
            parallel_elements(y.numel(), [&](std::int64_t b, std::int64_t e) {
                out<T>(y, b, e) = in<T>(x, b, e).unaryExpr([p](T v) { return math::apply_forward<Op>(v, p); });
            });
        });
    });
    return y;
}

// x, y, dy, dx: same shape; dx = dy * derivative(x, y)
std::vector<Tensor> unary_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    if (!args.needs_grad[0]) return {Tensor()};
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    dispatch_floating(x.dtype(), "unary_backward", [&]<typename T>() {
        const math::UnaryScalars<T> p = math::unary_scalars<T>(args.attrs);
        math::visit_unary(args.op, args.attrs, [&]<typename Op>(Op) {
            const auto derivative = [p](T xv, T yv) { return math::apply_derivative<Op>(xv, yv, p); };
            parallel_elements(dx.numel(), [&](std::int64_t b, std::int64_t e) {
                out<T>(dx, b, e) =
                    in<T>(args.grad_output, b, e) * in<T>(x, b, e).binaryExpr(in<T>(args.output, b, e), derivative);
            });
        });
    });
    return {dx};
}

// a, b broadcast to y
Tensor binary_forward(const ForwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Tensor& b = args.inputs[1];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, a.device());
    dispatch_floating(y.dtype(), "binary_forward", [&]<typename T>() {
        math::visit_binary(args.op, [&]<typename Op>(Op) {
            const auto f = [](T u, T v) { return Op::forward(u, v); };
            if (a.shape() == b.shape())
                parallel_elements(y.numel(), [&](std::int64_t i, std::int64_t e) {
                    out<T>(y, i, e) = in<T>(a, i, e).binaryExpr(in<T>(b, i, e), f);
                });
            else
                broadcast_runs(plan_broadcast(y.shape(), a.shape(), b.shape()), a.data<T>(), b.data<T>(), f,
                               [yp = y.data<T>()](std::int64_t iy, std::int64_t n, const auto& values) {
                                   Eigen::Map<Array1<T>>(yp + iy, n) = values;
                               });
        });
    });
    return y;
}

// a, b broadcast to dy; da and db come back in dy's shape (the engine sums them down to a's and b's).
std::vector<Tensor> binary_backward(const BackwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Tensor& b = args.inputs[1];
    const Tensor& dy = args.grad_output;
    const bool same_shape = a.shape() == b.shape();
    const BroadcastPlan plan = same_shape ? BroadcastPlan{} : plan_broadcast(dy.shape(), a.shape(), b.shape());
    std::vector<Tensor> grads(2);
    dispatch_floating(dy.dtype(), "binary_backward", [&]<typename T>() {
        math::visit_binary(args.op, [&]<typename Op>(Op) {
            // d = dy * partial(a, b)
            const auto gradient = [&](auto partial) {
                Tensor d = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
                if (same_shape) {
                    parallel_elements(d.numel(), [&](std::int64_t i, std::int64_t e) {
                        out<T>(d, i, e) = in<T>(dy, i, e) * in<T>(a, i, e).binaryExpr(in<T>(b, i, e), partial);
                    });
                } else {
                    broadcast_runs(plan, a.data<T>(), b.data<T>(), partial,
                                   [dp = d.data<T>(), dyp = dy.data<T>()](std::int64_t iy, std::int64_t n,
                                                                         const auto& values) {
                                       Eigen::Map<Array1<T>>(dp + iy, n) = in(dyp + iy, n) * values;
                                   });
                }
                return d;
            };
            if (args.needs_grad[0]) grads[0] = gradient([](T u, T v) { return Op::d_a(u, v); });
            if (args.needs_grad[1]) grads[1] = gradient([](T u, T v) { return Op::d_b(u, v); });
        });
    });
    return grads;
}

// dst += src, in place (same shape and dtype); bf16/f16 summed in f32, rounded once
void accumulate_into(Tensor& dst, const Tensor& src) {
    if (dst.dtype() != src.dtype())
        throw DTypeError(str("accumulate ", dtype_name(src.dtype()), " into ", dtype_name(dst.dtype())));
    if (dst.shape() != src.shape())
        throw ShapeError(str("accumulate ", to_string(src.shape()), " into ", to_string(dst.shape())));
    if (is_reduced_precision(dst.dtype())) {
        Tensor sum = dst.to(DType::f32);
        cpu::accumulate_into(sum, src.to(DType::f32));
        const Tensor rounded = sum.to(dst.dtype());
        std::memcpy(dst.raw_data(), rounded.raw_data(), dst.nbytes());  // the caller's dst, owned alone
        return;
    }
    dispatch_floating(dst.dtype(), "accumulate_into", [&]<typename T>() {
        parallel_elements(dst.numel(), [&](std::int64_t b, std::int64_t e) { out<T>(dst, b, e) += in<T>(src, b, e); });
    });
}

}  // namespace cpu

// ---- softmax, log_softmax: the activations along an axis ----
// (one block: user functions, shape rule, CPU kernels; GPU: the end of ops/elementwise.cu)

// (softmax and log_softmax themselves are front doors in ops/elementwise.h)

namespace infer {

OutputSpec along_axis(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_float(x, "x");
    normalize_axis(attrs.axis, x.rank());
    return {x.shape(), x.dtype()};
}

}  // namespace infer

SoftmaxGeometry softmax_geometry(OpType op, const Shape& x, std::int64_t axis) {
    return {split_at_axis(x, normalize_axis(axis, x.size())), op == OpType::LogSoftmax};
}

SoftmaxBackward softmax_backward_setup(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    SoftmaxBackward b{softmax_geometry(args.op, x.shape(), args.attrs.axis), Tensor()};
    if (args.needs_grad[0]) b.dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    return b;
}

namespace cpu {

// x (outer, n, inner) -> y same shape, normalised over n; the max is subtracted first so exp never
// overflows. Each outer slice of x is an (n, inner) row-major block (ArrayRM) whose columns are the vectors
// being normalised. LogSoftmax: y = x - max - log Σ exp(x - max).
Tensor softmax_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    if (y.numel() == 0) return y;
    const SoftmaxGeometry g = softmax_geometry(args.op, x.shape(), args.attrs.axis);
    const AxisSplit s = g.split;
    const bool log = g.log;
    dispatch_floating(x.dtype(), "softmax", [&]<typename T>() {
        for (std::int64_t o = 0; o < s.outer; ++o) {
            const ConstArrayMap<T> X(x.data<T>() + o * s.size * s.inner, s.size, s.inner);
            ArrayMap<T> Y(y.data<T>() + o * s.size * s.inner, s.size, s.inner);
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
    const SoftmaxBackward b = softmax_backward_setup(args);
    if (b.nothing_to_compute()) return {b.dx};
    const Tensor &y = args.output, &dy = args.grad_output, &dx = b.dx;
    const AxisSplit s = b.geometry.split;
    dispatch_floating(dx.dtype(), "softmax backward", [&]<typename T>() {
        for (std::int64_t o = 0; o < s.outer; ++o) {
            const std::int64_t offset = o * s.size * s.inner;
            const ConstArrayMap<T> Y(y.data<T>() + offset, s.size, s.inner);
            const ConstArrayMap<T> dY(dy.data<T>() + offset, s.size, s.inner);
            ArrayMap<T> dX(dx.data<T>() + offset, s.size, s.inner);
            if (b.geometry.log) {
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

}  // namespace cpu

}  // namespace dyngrad
