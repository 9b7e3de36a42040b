// Elementwise ops: the user functions, their shape rules and the Eigen kernels. The scalar formulas
// live in ops/elementwise_math.h, shared with ops/elementwise.cu.
#include "dyngrad/ops/elementwise.h"

#include <Eigen/Core>
#include <string_view>

#include "dyngrad/ops/cpu_parallel.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/kernels.h"

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

Var record_unary(OpType op, const Var& x, double s, Loc where) {
    OpAttrs attrs;
    attrs.scalar = s;
    return x.graph().record(op, {x}, attrs, where);
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

// ---- user functions ----
Var add(const Var& a, const Var& b, Loc where) { return a.graph().record(OpType::Add, {a, b}, {}, where); }
Var sub(const Var& a, const Var& b, Loc where) { return a.graph().record(OpType::Sub, {a, b}, {}, where); }
Var mul(const Var& a, const Var& b, Loc where) { return a.graph().record(OpType::Mul, {a, b}, {}, where); }
Var div(const Var& a, const Var& b, Loc where) { return a.graph().record(OpType::Div, {a, b}, {}, where); }

Var neg(const Var& x, Loc where) { return record_unary(OpType::Neg, x, 0.0, where); }
Var add_scalar(const Var& x, double s, Loc where) { return record_unary(OpType::AddScalar, x, s, where); }
Var mul_scalar(const Var& x, double s, Loc where) { return record_unary(OpType::MulScalar, x, s, where); }
Var div_scalar(const Var& x, double s, Loc where) {
    if (s == 0) throw ValueError(str("div_scalar at ", file_name(where), ":", where.line(), ": division by zero"));
    return mul_scalar(x, 1.0 / s, where);
}
Var exp(const Var& x, Loc where) { return record_unary(OpType::Exp, x, 0.0, where); }
Var log(const Var& x, Loc where) { return record_unary(OpType::Log, x, 0.0, where); }
Var sqrt(const Var& x, Loc where) { return record_unary(OpType::Sqrt, x, 0.0, where); }
Var pow(const Var& x, double exponent, Loc where) { return record_unary(OpType::PowScalar, x, exponent, where); }
Var abs(const Var& x, Loc where) { return record_unary(OpType::Abs, x, 0.0, where); }

Var relu(const Var& x, Loc where) { return record_unary(OpType::Relu, x, 0.0, where); }
Var leaky_relu(const Var& x, double negative_slope, Loc where) {
    return record_unary(OpType::LeakyRelu, x, negative_slope, where);
}
Var elu(const Var& x, double alpha, Loc where) { return record_unary(OpType::Elu, x, alpha, where); }
Var clipped_relu(const Var& x, double ceiling, Loc where) {
    return record_unary(OpType::ClippedRelu, x, ceiling, where);
}
Var sigmoid(const Var& x, Loc where) { return record_unary(OpType::Sigmoid, x, 0.0, where); }
Var tanh(const Var& x, Loc where) { return record_unary(OpType::Tanh, x, 0.0, where); }
Var softplus(const Var& x, Loc where) { return record_unary(OpType::Softplus, x, 0.0, where); }

Var operator+(VarAt a, const Var& b) { return add(a.var, b, a.where); }
Var operator-(VarAt a, const Var& b) { return sub(a.var, b, a.where); }
Var operator*(VarAt a, const Var& b) { return mul(a.var, b, a.where); }
Var operator/(VarAt a, const Var& b) { return div(a.var, b, a.where); }
Var operator-(VarAt x) { return neg(x.var, x.where); }
Var operator+(VarAt x, double s) { return add_scalar(x.var, s, x.where); }
Var operator+(double s, VarAt x) { return add_scalar(x.var, s, x.where); }
Var operator-(VarAt x, double s) { return add_scalar(x.var, -s, x.where); }
Var operator*(VarAt x, double s) { return mul_scalar(x.var, s, x.where); }
Var operator*(double s, VarAt x) { return mul_scalar(x.var, s, x.where); }
Var operator/(VarAt x, double s) { return div_scalar(x.var, s, x.where); }

// ---- shape rules ----
namespace infer {

OutputSpec same_as_first(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    if (!is_floating(x.dtype()))
        throw DTypeError(str("expects float32 or float64, got ", dtype_name(x.dtype())));
    if (op == OpType::ClippedRelu && !(attrs.scalar > 0))
        throw ValueError(str("ceiling must be positive, got ", attrs.scalar));
    return {x.shape(), x.dtype()};
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

// ---- CPU kernels ----
namespace cpu {

// x, y: same shape
Tensor unary_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    dispatch_floating(x.dtype(), "unary_forward", [&]<typename T>() {
        const T s = static_cast<T>(args.attrs.scalar);
        math::visit_unary(args.op, [&]<typename Op>(Op) {
            parallel_elements(y.numel(), [&](std::int64_t b, std::int64_t e) {
                out<T>(y, b, e) = in<T>(x, b, e).unaryExpr([s](T v) { return Op::forward(v, s); });
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
        const T s = static_cast<T>(args.attrs.scalar);
        math::visit_unary(args.op, [&]<typename Op>(Op) {
            const auto derivative = [s](T xv, T yv) { return Op::derivative(xv, yv, s); };
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

// dst += src, in place (same shape and dtype)
void accumulate_into(Tensor& dst, const Tensor& src) {
    if (dst.dtype() != src.dtype())
        throw DTypeError(str("accumulate ", dtype_name(src.dtype()), " into ", dtype_name(dst.dtype())));
    if (dst.shape() != src.shape())
        throw ShapeError(str("accumulate ", to_string(src.shape()), " into ", to_string(dst.shape())));
    dispatch_floating(dst.dtype(), "accumulate_into", [&]<typename T>() {
        parallel_elements(dst.numel(), [&](std::int64_t b, std::int64_t e) { out<T>(dst, b, e) += in<T>(src, b, e); });
    });
}

}  // namespace cpu

}  // namespace dyngrad
