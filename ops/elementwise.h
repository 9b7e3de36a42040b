// Elementwise ops: binary with NumPy broadcasting, unary math and activations; softmax and log_softmax,
// the activations along an axis.
// Formulas: ops/elementwise_math.h. CPU: ops/elementwise.cpp. GPU: ops/elementwise.cu.
#pragma once
#include <optional>
#include <source_location>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

using Loc = std::source_location;

// Every function has a Var form (recorded in the Var's graph, differentiable) and a Tensor form (eager: run at
// once through the same kernels, no graph, no gradient; graph/eager.h).
// a, b broadcast NumPy-style (e.g. a per-channel bias (1,C,1,1) over (N,C,H,W)).
Var add(const Var& a, const Var& b, Loc where = Loc::current());
Tensor add(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var sub(const Var& a, const Var& b, Loc where = Loc::current());
Tensor sub(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var mul(const Var& a, const Var& b, Loc where = Loc::current());
Tensor mul(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var div(const Var& a, const Var& b, Loc where = Loc::current());
// Elementwise max / min, broadcast like add. NaN in either operand propagates. Gradient: to the larger
// (smaller) operand; at a tie half to each, as PyTorch.
Var maximum(const Var& a, const Var& b, Loc where = Loc::current());
Tensor maximum(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var minimum(const Var& a, const Var& b, Loc where = Loc::current());
Tensor minimum(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Tensor div(const Tensor& a, const Tensor& b, Loc where = Loc::current());

Var neg(const Var& x, Loc where = Loc::current());
Tensor neg(const Tensor& x, Loc where = Loc::current());
Var add_scalar(const Var& x, double s, Loc where = Loc::current());
Tensor add_scalar(const Tensor& x, double s, Loc where = Loc::current());
Var mul_scalar(const Var& x, double s, Loc where = Loc::current());
Tensor mul_scalar(const Tensor& x, double s, Loc where = Loc::current());
Var div_scalar(const Var& x, double s, Loc where = Loc::current());  // composite: mul_scalar(x, 1/s)
Tensor div_scalar(const Tensor& x, double s, Loc where = Loc::current());
Var exp(const Var& x, Loc where = Loc::current());
Tensor exp(const Tensor& x, Loc where = Loc::current());
Var log(const Var& x, Loc where = Loc::current());
Tensor log(const Tensor& x, Loc where = Loc::current());
Var sqrt(const Var& x, Loc where = Loc::current());
Tensor sqrt(const Tensor& x, Loc where = Loc::current());
Var pow(const Var& x, double exponent, Loc where = Loc::current());
Tensor pow(const Tensor& x, double exponent, Loc where = Loc::current());
Var abs(const Var& x, Loc where = Loc::current());
Var sin(const Var& x, Loc where = Loc::current());
Tensor sin(const Tensor& x, Loc where = Loc::current());
Var cos(const Var& x, Loc where = Loc::current());
Tensor cos(const Tensor& x, Loc where = Loc::current());
// min(max(x, min), max); either bound may be absent (std::nullopt), not both, and min <= max (ValueError
// otherwise, also for a NaN bound). NaN propagates. Gradient 1 strictly between the bounds, 0 at and beyond
// them, as PyTorch.
Var clamp(const Var& x, std::optional<double> min, std::optional<double> max, Loc where = Loc::current());
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max, Loc where = Loc::current());
Tensor abs(const Tensor& x, Loc where = Loc::current());
// x converted to floating `dtype` (float32, float64, bfloat16, float16), rounding to nearest even (op cast). The
// gradient is converted back to x's dtype. Converting to x's own dtype returns x's value (no copy).
Var to_dtype(const Var& x, DType dtype, Loc where = Loc::current());
Tensor to_dtype(const Tensor& x, DType dtype, Loc where = Loc::current());

Var relu(const Var& x, Loc where = Loc::current());
Tensor relu(const Tensor& x, Loc where = Loc::current());
Var leaky_relu(const Var& x, double negative_slope = 0.01, Loc where = Loc::current());
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01, Loc where = Loc::current());
Var elu(const Var& x, double alpha = 1.0, Loc where = Loc::current());
Tensor elu(const Tensor& x, double alpha = 1.0, Loc where = Loc::current());
Var clipped_relu(const Var& x, double ceiling = 6.0, Loc where = Loc::current());
Tensor clipped_relu(const Tensor& x, double ceiling = 6.0, Loc where = Loc::current());
Var sigmoid(const Var& x, Loc where = Loc::current());
Tensor sigmoid(const Tensor& x, Loc where = Loc::current());
Var tanh(const Var& x, Loc where = Loc::current());
Tensor tanh(const Tensor& x, Loc where = Loc::current());
Var softplus(const Var& x, Loc where = Loc::current());
// x·Φ(x) (Φ: the standard normal CDF), or with GeluApproximation::Tanh x·(1 + tanh(√(2/π)(x + 0.044715x³)))/2.
Var gelu(const Var& x, GeluApproximation approximation = GeluApproximation::None, Loc where = Loc::current());
Tensor gelu(const Tensor& x, GeluApproximation approximation = GeluApproximation::None, Loc where = Loc::current());
// x·σ(x) (swish).
Var silu(const Var& x, Loc where = Loc::current());
Tensor silu(const Tensor& x, Loc where = Loc::current());
// log σ(x), computed without overflow or cancellation for any |x|.
Var log_sigmoid(const Var& x, Loc where = Loc::current());
Tensor log_sigmoid(const Tensor& x, Loc where = Loc::current());
// x / (1 + |x|).
Var softsign(const Var& x, Loc where = Loc::current());
Tensor softsign(const Tensor& x, Loc where = Loc::current());
Tensor softplus(const Tensor& x, Loc where = Loc::current());

// The activations along an axis: softmax y = exp(x − max) / Σ exp(x − max) and log_softmax
// y = x − max − log Σ exp(x − max) over `axis` (negative counts from the end).
Var softmax(const Var& x, std::int64_t axis = -1, Loc where = Loc::current());
Tensor softmax(const Tensor& x, std::int64_t axis = -1, Loc where = Loc::current());
Var log_softmax(const Var& x, std::int64_t axis = -1, Loc where = Loc::current());
Tensor log_softmax(const Tensor& x, std::int64_t axis = -1, Loc where = Loc::current());

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
Var eq(const Var& a, const Var& b, Loc where = Loc::current());
Tensor eq(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var ne(const Var& a, const Var& b, Loc where = Loc::current());
Tensor ne(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var lt(const Var& a, const Var& b, Loc where = Loc::current());
Tensor lt(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var le(const Var& a, const Var& b, Loc where = Loc::current());
Tensor le(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var gt(const Var& a, const Var& b, Loc where = Loc::current());
Tensor gt(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var ge(const Var& a, const Var& b, Loc where = Loc::current());
Tensor ge(const Tensor& a, const Tensor& b, Loc where = Loc::current());

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
