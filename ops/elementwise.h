// Elementwise ops: binary with NumPy broadcasting, unary math and activations.
// Formulas: ops/elementwise_math.h. CPU: ops/elementwise.cpp. GPU: ops/elementwise.cu.
#pragma once
#include <optional>
#include <source_location>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

using Loc = std::source_location;

// a, b broadcast NumPy-style (e.g. a per-channel bias (1,C,1,1) over (N,C,H,W)).
Var add(const Var& a, const Var& b, Loc where = Loc::current());
Var sub(const Var& a, const Var& b, Loc where = Loc::current());
Var mul(const Var& a, const Var& b, Loc where = Loc::current());
Var div(const Var& a, const Var& b, Loc where = Loc::current());
// Elementwise max / min, broadcast like add. NaN in either operand propagates. Gradient: to the larger
// (smaller) operand; at a tie half to each, as PyTorch.
Var maximum(const Var& a, const Var& b, Loc where = Loc::current());
Tensor maximum(const Tensor& a, const Tensor& b, Loc where = Loc::current());
Var minimum(const Var& a, const Var& b, Loc where = Loc::current());
Tensor minimum(const Tensor& a, const Tensor& b, Loc where = Loc::current());

Var neg(const Var& x, Loc where = Loc::current());
Var add_scalar(const Var& x, double s, Loc where = Loc::current());
Var mul_scalar(const Var& x, double s, Loc where = Loc::current());
Var div_scalar(const Var& x, double s, Loc where = Loc::current());  // composite: mul_scalar(x, 1/s)
Var exp(const Var& x, Loc where = Loc::current());
Var log(const Var& x, Loc where = Loc::current());
Var sqrt(const Var& x, Loc where = Loc::current());
Var pow(const Var& x, double exponent, Loc where = Loc::current());
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

Var relu(const Var& x, Loc where = Loc::current());
Var leaky_relu(const Var& x, double negative_slope = 0.01, Loc where = Loc::current());
Var elu(const Var& x, double alpha = 1.0, Loc where = Loc::current());
Var clipped_relu(const Var& x, double ceiling = 6.0, Loc where = Loc::current());
Var sigmoid(const Var& x, Loc where = Loc::current());
Var tanh(const Var& x, Loc where = Loc::current());
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

}  // namespace dyngrad
