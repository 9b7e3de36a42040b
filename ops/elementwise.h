// Elementwise ops: binary with NumPy broadcasting, unary math and activations; softmax and log_softmax,
// the activations along an axis.
// Formulas: ops/elementwise_math.h. CPU: ops/elementwise.cpp. GPU: ops/elementwise.cu.
#pragma once
#include <optional>
#include <source_location>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// Every function is one front door over its operand type (graph/front_door.h): Var (recorded in the Var's graph,
// differentiable) or Tensor (eager: run at once through the same kernels, no graph, no gradient).
namespace detail {
inline OpAttrs scalar_attrs(double s) {
    OpAttrs attrs;
    attrs.scalar = s;
    return attrs;
}
inline OpAttrs axis_attrs(std::int64_t axis) {
    OpAttrs attrs;
    attrs.axis = axis;
    return attrs;
}
}  // namespace detail

// The binary ops: a, b broadcast NumPy-style (e.g. a per-channel bias (1,C,1,1) over (N,C,H,W)). maximum and
// minimum: NaN in either operand propagates; the gradient goes to the larger (smaller) operand, at a tie half to
// each, as PyTorch.
#define DG_BINARY_FRONT_DOOR(name, tag) \
    template <Operand T>                \
    T name(const T& a, const T& b, Loc where = Loc::current()) { return apply_op(OpType::tag, {a, b}, {}, where); }
DG_BINARY_FRONT_DOOR(add, Add)
DG_BINARY_FRONT_DOOR(sub, Sub)
DG_BINARY_FRONT_DOOR(mul, Mul)
DG_BINARY_FRONT_DOOR(div, Div)
DG_BINARY_FRONT_DOOR(maximum, Maximum)
DG_BINARY_FRONT_DOOR(minimum, Minimum)
#undef DG_BINARY_FRONT_DOOR

// The unary ops without an attribute (DG_PLAIN_UNARY_OPS): x ↦ f(x), one formula per op in ops/elementwise_math.h.
#define DG_UNARY_FRONT_DOOR(name, tag) \
    template <Operand T>               \
    T name(const T& x, Loc where = Loc::current()) { return apply_op(OpType::tag, {x}, {}, where); }
DG_PLAIN_UNARY_OPS(DG_UNARY_FRONT_DOOR)  // graph/op_type.h lists them
#undef DG_UNARY_FRONT_DOOR

// The unary ops with a scalar (OpAttrs::scalar).
template <Operand T>
T add_scalar(const T& x, double s, Loc where = Loc::current()) {
    return apply_op(OpType::AddScalar, {x}, detail::scalar_attrs(s), where);
}
template <Operand T>
T mul_scalar(const T& x, double s, Loc where = Loc::current()) {
    return apply_op(OpType::MulScalar, {x}, detail::scalar_attrs(s), where);
}
template <Operand T>
T div_scalar(const T& x, double s, Loc where = Loc::current());  // composite: mul_scalar(x, 1/s)
template <Operand T>
T pow(const T& x, double exponent, Loc where = Loc::current()) {
    return apply_op(OpType::PowScalar, {x}, detail::scalar_attrs(exponent), where);
}
template <Operand T>
T leaky_relu(const T& x, double negative_slope = 0.01, Loc where = Loc::current()) {
    return apply_op(OpType::LeakyRelu, {x}, detail::scalar_attrs(negative_slope), where);
}
template <Operand T>
T elu(const T& x, double alpha = 1.0, Loc where = Loc::current()) {
    return apply_op(OpType::Elu, {x}, detail::scalar_attrs(alpha), where);
}
template <Operand T>
T clipped_relu(const T& x, double ceiling = 6.0, Loc where = Loc::current()) {
    return apply_op(OpType::ClippedRelu, {x}, detail::scalar_attrs(ceiling), where);
}

// min(max(x, min), max); either bound may be absent (std::nullopt), not both, and min <= max (ValueError
// otherwise, also for a NaN bound). NaN propagates. Gradient 1 strictly between the bounds, 0 at and beyond
// them, as PyTorch.
template <Operand T>
T clamp(const T& x, std::optional<double> min, std::optional<double> max, Loc where = Loc::current()) {
    OpAttrs attrs;
    attrs.clamp_min = min;
    attrs.clamp_max = max;
    return apply_op(OpType::Clamp, {x}, attrs, where);
}
// x converted to floating `dtype` (float32, float64, bfloat16, float16), rounding to nearest even (op cast). The
// gradient is converted back to x's dtype. Converting to x's own dtype returns x's value (no copy).
template <Operand T>
T to_dtype(const T& x, DType dtype, Loc where = Loc::current()) {
    OpAttrs attrs;
    attrs.dtype = dtype;
    return apply_op(OpType::Cast, {x}, attrs, where);
}
// x·Φ(x) (Φ: the standard normal CDF), or with GeluApproximation::Tanh x·(1 + tanh(√(2/π)(x + 0.044715x³)))/2.
template <Operand T>
T gelu(const T& x, GeluApproximation approximation = GeluApproximation::None, Loc where = Loc::current()) {
    OpAttrs attrs;
    attrs.gelu_approximation = approximation;
    return apply_op(OpType::Gelu, {x}, attrs, where);
}

// The activations along an axis: softmax y = exp(x − max) / Σ exp(x − max) and log_softmax
// y = x − max − log Σ exp(x − max) over `axis` (negative counts from the end).
template <Operand T>
T softmax(const T& x, std::int64_t axis = -1, Loc where = Loc::current()) {
    return apply_op(OpType::Softmax, {x}, detail::axis_attrs(axis), where);
}
template <Operand T>
T log_softmax(const T& x, std::int64_t axis = -1, Loc where = Loc::current()) {
    return apply_op(OpType::LogSoftmax, {x}, detail::axis_attrs(axis), where);
}

// An operand of an operator that also captures where the operator was called: the defaulted
// source_location of the converting constructor is filled in at the user's expression, so operator
// nodes report the user's file:line like the named functions do.
struct VarAt {
    VarAt(const Var& var, Loc where = Loc::current()) : var(var), where(where) {}  // NOLINT: implicit on purpose
    const Var& var;
    Loc where;
};

// Operators record the same nodes as the named functions.
Var operator+(VarAt a, const Var& b);
Var operator-(VarAt a, const Var& b);
Var operator*(VarAt a, const Var& b);
Var operator/(VarAt a, const Var& b);
Var operator-(VarAt x);
Var operator+(VarAt x, double s);
Var operator+(double s, VarAt x);
Var operator-(VarAt x, double s);
Var operator*(VarAt x, double s);
Var operator*(double s, VarAt x);
Var operator/(VarAt x, double s);

// Comparisons, broadcast like add: 1 where the relation holds, 0 where not, in the inputs' (float) dtype, so a
// mask multiplies straight into float math (mean(eq(argmax...)) is an accuracy). NaN compares unequal to
// everything, itself included (only ne holds). Not differentiable: a Var result never requires grad. An int64
// operand (labels, argmax) is compared in the other's float dtype, float64 when both are int64 (the mask's dtype).
template <Operand T>
T eq(const T& a, const T& b, Loc where = Loc::current());
template <Operand T>
T ne(const T& a, const T& b, Loc where = Loc::current());
template <Operand T>
T lt(const T& a, const T& b, Loc where = Loc::current());
template <Operand T>
T le(const T& a, const T& b, Loc where = Loc::current());
template <Operand T>
T gt(const T& a, const T& b, Loc where = Loc::current());
template <Operand T>
T ge(const T& a, const T& b, Loc where = Loc::current());

// |a - b| <= atol + rtol·|b| everywhere (b broadcast to a; PyTorch's and NumPy's defaults); NaN is close to
// nothing. equal: same shape and dtype and every element equal (any dtype; NaN unequal). Eager, any device.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, Loc where = Loc::current());
bool equal(const Tensor& a, const Tensor& b, Loc where = Loc::current());

// The operand of a Tensor operator, capturing the operator's call site as VarAt does.
struct TensorAt {
    TensorAt(const Tensor& tensor, Loc where = Loc::current()) : tensor(tensor), where(where) {}  // NOLINT: implicit
    const Tensor& tensor;
    Loc where;
};

// Tensor operators: the eager forms of the functions above (the Var operators' set, plus a scalar on the left
// of - and /, and comparisons). A scalar beside a comparison or on the left of - and / becomes a one-element
// tensor of the other operand's dtype and device.
Tensor operator+(TensorAt a, const Tensor& b);
Tensor operator-(TensorAt a, const Tensor& b);
Tensor operator*(TensorAt a, const Tensor& b);
Tensor operator/(TensorAt a, const Tensor& b);
Tensor operator-(TensorAt x);
Tensor operator+(TensorAt x, double s);
Tensor operator+(double s, TensorAt x);
Tensor operator-(TensorAt x, double s);
Tensor operator-(double s, TensorAt x);
Tensor operator*(TensorAt x, double s);
Tensor operator*(double s, TensorAt x);
Tensor operator/(TensorAt x, double s);
Tensor operator/(double s, TensorAt x);
Tensor operator==(TensorAt a, const Tensor& b);
Tensor operator!=(TensorAt a, const Tensor& b);
Tensor operator<(TensorAt a, const Tensor& b);
Tensor operator<=(TensorAt a, const Tensor& b);
Tensor operator>(TensorAt a, const Tensor& b);
Tensor operator>=(TensorAt a, const Tensor& b);
Tensor operator==(TensorAt x, double s);
Tensor operator!=(TensorAt x, double s);
Tensor operator<(TensorAt x, double s);
Tensor operator<=(TensorAt x, double s);
Tensor operator>(TensorAt x, double s);
Tensor operator>=(TensorAt x, double s);
Tensor operator==(double s, TensorAt x);
Tensor operator!=(double s, TensorAt x);
Tensor operator<(double s, TensorAt x);
Tensor operator<=(double s, TensorAt x);
Tensor operator>(double s, TensorAt x);
Tensor operator>=(double s, TensorAt x);

}  // namespace dyngrad
