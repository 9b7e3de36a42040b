// Scalar formulas of the elementwise ops, shared by the Eigen kernels (ops/elementwise.cpp) and
// the CUDA kernels (ops/elementwise.cu). The formulas are proven by the float64 finite-difference
// checks on the CPU; the GPU comparison then proves the GPU indexing and launch code.
//
// Unary op:  forward(x, s) -> y;          derivative(x, y, s) -> dy/dx    (s: OpAttrs::scalar)
// Binary op: forward(a, b) -> y;          d_a(a, b) -> dy/da, d_b(a, b) -> dy/db
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
struct ReluOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return x > T(0) ? x : T(0); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) { return x > T(0) ? T(1) : T(0); }
};
struct LeakyReluOp {  // s: negative slope
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return x > T(0) ? x : s * x; }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T s) { return x > T(0) ? T(1) : s; }
};
struct EluOp {  // s: alpha
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return x > T(0) ? x : s * (exp(x) - T(1)); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T y, T s) { return x > T(0) ? T(1) : y + s; }
};
struct ClippedReluOp {  // min(max(x, 0), s), as cuDNN's CLIPPED_RELU with coef s
    template <typename T> DG_HOST_DEVICE static T forward(T x, T s) { return x > T(0) ? (x < s ? x : s) : T(0); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T s) { return (x > T(0) && x < s) ? T(1) : T(0); }
};
struct SigmoidOp {  // split by sign so exp never overflows
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) {
        if (x >= T(0)) return T(1) / (T(1) + exp(-x));
        const T e = exp(x);
        return e / (T(1) + e);
    }
    template <typename T> DG_HOST_DEVICE static T derivative(T, T y, T) { return y * (T(1) - y); }
};
struct TanhOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return tanh(x); }
    template <typename T> DG_HOST_DEVICE static T derivative(T, T y, T) { return T(1) - y * y; }
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
        default: break;
    }
    throw Error(str("internal: op tag ", static_cast<int>(op), " is not a binary elementwise op"));
}

}  // namespace dyngrad::math
