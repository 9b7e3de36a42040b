// Scalar formulas of the elementwise ops, shared by the Eigen kernels (ops/elementwise.cpp) and
// the CUDA kernels (ops/elementwise.cu). The formulas are proven by the float64 finite-difference
// checks on the CPU; the GPU comparison then proves the GPU indexing and launch code.
//
// Unary op:  forward(x, s) -> y;          derivative(x, y, s) -> dy/dx    (s: OpAttrs::scalar)
// Binary op: forward(a, b) -> y;          d_a(a, b) -> dy/da, d_b(a, b) -> dy/db
//
// NaN: every forward propagates a NaN input (as PyTorch does), so anomaly mode sees it at the op that
// consumes it. The ReLU family is written `x <= 0 ? 0 : x` for that reason (`x > 0 ? x : 0` maps NaN to 0);
// its derivative `x <= 0 ? 0 : 1` then passes dy through at a NaN, as PyTorch's threshold_backward
// (`x <= threshold ? 0 : dy`) and hardtanh_backward do.
// Precision: a derivative that is small where the output saturates (elu, sigmoid, tanh for large |x|) is
// computed from x, never as a difference of two numbers near 1 (y + alpha, 1 - y, 1 - y²), which float32
// rounds to 0 (elu at x = -20: exactly 0 instead of 2e-9).
#pragma once
#include <cmath>

#include "dyngrad/core/error.h"
#include "dyngrad/graph/op_type.h"

#if defined(__CUDACC__)
#define DG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DG_HOST_DEVICE inline
#endif

namespace dyngrad::math {

// Unqualified calls below pick the float or double overload on host and device alike.
using std::exp;
using std::expm1;
using std::log;
using std::log1p;
using std::pow;
using std::sqrt;
using std::tanh;

struct NegOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return -x; }
    template <typename T> DG_HOST_DEVICE static T derivative(T, T, T) { return T(-1); }
};
struct AddScalarOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return x + s; }
    template <typename T> DG_HOST_DEVICE static T derivative(T, T, T) { return T(1); }
};
struct MulScalarOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return x * s; }
    template <typename T> DG_HOST_DEVICE static T derivative(T, T, T s) { return s; }
};
struct ExpOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return exp(x); }
    template <typename T> DG_HOST_DEVICE static T derivative(T, T y, T) { return y; }
};
struct LogOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return log(x); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) { return T(1) / x; }
};
struct SqrtOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return sqrt(x); }
    template <typename T> DG_HOST_DEVICE static T derivative(T, T y, T) { return T(0.5) / y; }
};
struct PowScalarOp {  // x^s
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return pow(x, s); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T s) { return s * pow(x, s - T(1)); }
};
struct AbsOp {  // derivative at 0 taken as 0 (subgradient)
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return x < T(0) ? -x : x; }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) {
        return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
    }
};
struct ReluOp {  // NaN propagates; the fused ReLU of linear and conv2d uses these two as well
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return x <= T(0) ? T(0) : x; }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) { return x <= T(0) ? T(0) : T(1); }
    // The fused ReLU's dz from its output y (y <= 0 exactly where the pre-activation is, NaN where it is
    // NaN): a select, not dy·derivative, so an Inf dy at an inactive unit gives 0, as PyTorch does.
    template <typename T> DG_HOST_DEVICE static T masked_gradient(T y, T dy) { return y <= T(0) ? T(0) : dy; }
};
struct LeakyReluOp {  // s: negative slope
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return x > T(0) ? x : s * x; }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T s) { return x > T(0) ? T(1) : s; }
};
struct EluOp {  // s: alpha. expm1 keeps small |x| exact; the derivative is alpha·e^x, not y + alpha
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return x > T(0) ? x : s * expm1(x); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T s) { return x <= T(0) ? s * exp(x) : T(1); }
};
struct ClippedReluOp {  // min(max(x, 0), s), as cuDNN's CLIPPED_RELU with coef s; NaN propagates
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return x <= T(0) ? T(0) : (x >= s ? s : x); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T s) {
        return (x <= T(0) || x >= s) ? T(0) : T(1);
    }
};
struct SigmoidOp {  // split by sign so exp never overflows
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) {
        if (x >= T(0)) return T(1) / (T(1) + exp(-x));
        const T e = exp(x);
        return e / (T(1) + e);
    }
    // σ(x)·σ(-x) = e/(1 + e)² with e = e^-|x|: y·(1 - y) rounds 1 - y to 0 for large x
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) {
        const T e = exp(x < T(0) ? x : -x);
        return e / ((T(1) + e) * (T(1) + e));
    }
};
struct TanhOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return tanh(x); }
    // sech²(x) = 4e/(1 + e)² with e = e^-2|x|: 1 - y² rounds to 0 for large |x|
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) {
        const T e = exp(T(-2) * (x < T(0) ? -x : x));
        return T(4) * e / ((T(1) + e) * (T(1) + e));
    }
};
struct SoftplusOp {  // log(1 + e^x) = max(x, 0) + log1p(e^-|x|), stable for large |x|
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) {
        return (x > T(0) ? x : T(0)) + log1p(exp(x > T(0) ? -x : x));
    }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) { return SigmoidOp::forward(x, T(0)); }
};

struct AddOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a + b; }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T) { return T(1); }
    template <typename T> DG_HOST_DEVICE static T d_b(T, T) { return T(1); }
};
struct SubOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a - b; }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T) { return T(1); }
    template <typename T> DG_HOST_DEVICE static T d_b(T, T) { return T(-1); }
};
struct MulOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a * b; }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T b) { return b; }
    template <typename T> DG_HOST_DEVICE static T d_b(T a, T) { return a; }
};
struct DivOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a / b; }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T b) { return T(1) / b; }
    template <typename T> DG_HOST_DEVICE static T d_b(T a, T b) { return -a / (b * b); }
};

// Comparisons: 1 where the relation holds, 0 where not (NaN: only != holds, as in IEEE and PyTorch). A step
// function: its derivative is 0 wherever it exists, and the rows are not differentiable (no backward runs).
struct EqOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a == b ? T(1) : T(0); }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T) { return T(0); }
    template <typename T> DG_HOST_DEVICE static T d_b(T, T) { return T(0); }
};
struct NeOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a != b ? T(1) : T(0); }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T) { return T(0); }
    template <typename T> DG_HOST_DEVICE static T d_b(T, T) { return T(0); }
};
struct LtOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a < b ? T(1) : T(0); }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T) { return T(0); }
    template <typename T> DG_HOST_DEVICE static T d_b(T, T) { return T(0); }
};
struct LeOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a <= b ? T(1) : T(0); }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T) { return T(0); }
    template <typename T> DG_HOST_DEVICE static T d_b(T, T) { return T(0); }
};
struct GtOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a > b ? T(1) : T(0); }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T) { return T(0); }
    template <typename T> DG_HOST_DEVICE static T d_b(T, T) { return T(0); }
};
struct GeOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return a >= b ? T(1) : T(0); }
    template <typename T> DG_HOST_DEVICE static T d_a(T, T) { return T(0); }
    template <typename T> DG_HOST_DEVICE static T d_b(T, T) { return T(0); }
};

// Calls fn(Functor{}) for a unary elementwise OpType. Host code only.
template <typename Fn>
decltype(auto) visit_unary(OpType op, Fn&& fn) {
    switch (op) {
        case OpType::Neg: return fn(NegOp{});
        case OpType::AddScalar: return fn(AddScalarOp{});
        case OpType::MulScalar: return fn(MulScalarOp{});
        case OpType::Exp: return fn(ExpOp{});
        case OpType::Log: return fn(LogOp{});
        case OpType::Sqrt: return fn(SqrtOp{});
        case OpType::PowScalar: return fn(PowScalarOp{});
        case OpType::Abs: return fn(AbsOp{});
        case OpType::Relu: return fn(ReluOp{});
        case OpType::LeakyRelu: return fn(LeakyReluOp{});
        case OpType::Elu: return fn(EluOp{});
        case OpType::ClippedRelu: return fn(ClippedReluOp{});
        case OpType::Sigmoid: return fn(SigmoidOp{});
        case OpType::Tanh: return fn(TanhOp{});
        case OpType::Softplus: return fn(SoftplusOp{});
        default: break;
    }
    throw Error(str("internal: op tag ", static_cast<int>(op), " is not a unary elementwise op"));
}

// Calls fn(Functor{}) for a binary elementwise OpType. Host code only.
template <typename Fn>
decltype(auto) visit_binary(OpType op, Fn&& fn) {
    switch (op) {
        case OpType::Add: return fn(AddOp{});
        case OpType::Sub: return fn(SubOp{});
        case OpType::Mul: return fn(MulOp{});
        case OpType::Div: return fn(DivOp{});
        case OpType::Eq: return fn(EqOp{});
        case OpType::Ne: return fn(NeOp{});
        case OpType::Lt: return fn(LtOp{});
        case OpType::Le: return fn(LeOp{});
        case OpType::Gt: return fn(GtOp{});
        case OpType::Ge: return fn(GeOp{});
        default: break;
    }
    throw Error(str("internal: op tag ", static_cast<int>(op), " is not a binary elementwise op"));
}

}  // namespace dyngrad::math
