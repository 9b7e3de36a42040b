// Scalar formulas of the elementwise ops, shared by the Eigen kernels (ops/elementwise.cpp) and
// the CUDA kernels (ops/elementwise.cu). The formulas are proven by the float64 finite-difference
// checks on the CPU; the GPU comparison then proves the GPU indexing and launch code.
//
// Unary op:  forward(x, s) -> y;          derivative(x, y, s) -> dy/dx    (s: OpAttrs::scalar)
//            or, for an op with more attributes (clamp's bounds), the same with s the whole UnaryScalars
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
#include <limits>

#include "dyngrad/core/error.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/graph/op_type.h"
#include "dyngrad/ops/host_device.h"

namespace dyngrad::math {

// Unqualified calls below pick the float or double overload on host and device alike.
using std::cos;
using std::erfc;
using std::exp;
using std::expm1;
using std::log;
using std::log1p;
using std::pow;
using std::sin;
using std::sqrt;
using std::tanh;

// fusion-source-begin: from here to fusion-source-end, the text is also compiled by NVRTC into the fusion compiler's
// generated kernels (embedded at build time: cmake/embed_source.cmake, ops/fusion_source.cpp). Only DG_HOST_DEVICE
// functors calling the math functions of the using-declarations above: no std::, no dyngrad types.

// The scalar attributes a unary formula may read, in the kernel's type: OpAttrs::scalar, and clamp's bounds
// (±infinity where absent, so one comparison each needs no flag).
template <typename T>
struct UnaryScalars {
    T s;
    T lo;
    T hi;
};

// The kernels call a unary formula through these: a functor declares forward(x, s) with the one scalar
// most ops read, or forward(x, UnaryScalars) when it needs more.
template <typename Op, typename T>
DG_HOST_DEVICE T apply_forward(T x, const UnaryScalars<T>& p) {
    if constexpr (requires { Op::forward(x, p); })
        return Op::forward(x, p);
    else
        return Op::forward(x, p.s);
}
template <typename Op, typename T>
DG_HOST_DEVICE T apply_derivative(T x, T y, const UnaryScalars<T>& p) {
    if constexpr (requires { Op::derivative(x, y, p); })
        return Op::derivative(x, y, p);
    else
        return Op::derivative(x, y, p.s);
}

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
struct SinOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return sin(x); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) { return cos(x); }
};
struct CosOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return cos(x); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) { return -sin(x); }
};
// min(max(x, lo), hi) with NaN propagated. The gradient passes strictly inside (lo, hi) and is 0 at a bound
// and at NaN, as PyTorch's clamp_backward (checked against torch 2.15).
struct ClampOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, const UnaryScalars<T>& p) {
        return x < p.lo ? p.lo : (x > p.hi ? p.hi : x);
    }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, const UnaryScalars<T>& p) {
        return (x > p.lo && x < p.hi) ? T(1) : T(0);
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

// x·Φ(x), Φ the standard normal CDF written erfc(-x/√2)/2: 1 + erf(x/√2) rounds to 0 for x below about -5.9
// in float32 (the output and derivative would be 0 instead of tiny).
struct GeluOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) {
        return x * (T(0.5) * erfc(-x * T(0.70710678118654752440)));
    }
    // Φ(x) + x·φ(x)
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) {
        return T(0.5) * erfc(-x * T(0.70710678118654752440)) + x * (T(0.39894228040143267794) * exp(T(-0.5) * x * x));
    }
};
// The tanh form x·(1 + tanh(u))/2, u = √(2/π)·(x + 0.044715·x³), written x·σ(2u): 1 + tanh(u) cancels for
// large negative x.
struct GeluTanhOp {
    template <typename T> DG_HOST_DEVICE static T inner(T x) {
        return T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
    }
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return x * SigmoidOp::forward(T(2) * inner(x), T(0)); }
    // σ(2u) + x·2σ(2u)σ(-2u)·du/dx, σ(2u)σ(-2u) = e/(1 + e)² without the cancellation of σ(1 - σ). Both from one
    // e = exp(-|2u|) and one division (σ and σ' apart took two of each: GPT-2's GELU backward was bound by them,
    // 319 µs per (32768, 3072) bf16 call on an H200, ncu 2026-11-29).
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) {
        const T two_u = T(2) * inner(x);
        const T du_dx = T(0.79788456080286535588) * (T(1) + T(3 * 0.044715) * x * x);
        const T e = exp(two_u < T(0) ? two_u : -two_u);
        const T r = T(1) / (T(1) + e);
        const T sigmoid = two_u >= T(0) ? r : e * r;
        return sigmoid + x * (T(2) * (e * r * r) * du_dx);
    }
};
struct SiluOp {  // x·σ(x); derivative σ(x) + x·σ(x)σ(-x)
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return x * SigmoidOp::forward(x, T(0)); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) {
        return SigmoidOp::forward(x, T(0)) + x * SigmoidOp::derivative(x, T(0), T(0));
    }
};
// log σ(x) = min(x, 0) − log1p(e^−|x|): no exp overflows and nothing cancels (log(σ(x)) is log(1) = 0 for
// x > 17 in float32, -inf below -88). The derivative σ(-x) is computed directly, not as 1 − σ(x).
struct LogSigmoidOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) {
        return (x < T(0) ? x : T(0)) - log1p(exp(x < T(0) ? x : -x));
    }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) { return SigmoidOp::forward(-x, T(0)); }
};
// x / (1 + |x|); derivative 1 / (1 + |x|)², from x (no 1 − |y| that cancels where y nears ±1).
struct SoftsignOp {
    template <typename T> DG_HOST_DEVICE static T forward(T x, T) { return x / (T(1) + (x < T(0) ? -x : x)); }
    template <typename T> DG_HOST_DEVICE static T derivative(T x, T, T) {
        const T d = T(1) + (x < T(0) ? -x : x);
        return T(1) / (d * d);
    }
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

// NaN propagates (either operand). At a tie each operand gets half the gradient; at a NaN both get all of it
// (PyTorch's maximum/minimum backward: where(a == b, g/2, g) masked where the other operand wins).
struct MaximumOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return (a > b || a != a) ? a : b; }
    template <typename T> DG_HOST_DEVICE static T d_a(T a, T b) { return a == b ? T(0.5) : (a < b ? T(0) : T(1)); }
    template <typename T> DG_HOST_DEVICE static T d_b(T a, T b) { return a == b ? T(0.5) : (a > b ? T(0) : T(1)); }
};
struct MinimumOp {
    template <typename T> DG_HOST_DEVICE static T forward(T a, T b) { return (a < b || a != a) ? a : b; }
    template <typename T> DG_HOST_DEVICE static T d_a(T a, T b) { return a == b ? T(0.5) : (a > b ? T(0) : T(1)); }
    template <typename T> DG_HOST_DEVICE static T d_b(T a, T b) { return a == b ? T(0.5) : (a < b ? T(0) : T(1)); }
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

// fusion-source-end

template <typename T>
UnaryScalars<T> unary_scalars(const OpAttrs& attrs) {
    constexpr double inf = std::numeric_limits<double>::infinity();
    return {static_cast<T>(attrs.scalar), static_cast<T>(attrs.clamp_min.value_or(-inf)),
            static_cast<T>(attrs.clamp_max.value_or(inf))};
}

// The rows' PointwiseFormula (graph/op_def.h, OpDef::pointwise): the functor each op's kernels call, by name, for
// the fusion compiler's generated source, and what its derivative reads (tests/fusion/test_fusion_plan.cpp checks that
// every name is a functor above).
namespace formula {
using Form = PointwiseFormula::Form;
constexpr bool kReadsX = true;
inline constexpr PointwiseFormula neg{Form::Unary, "NegOp"};
inline constexpr PointwiseFormula add_scalar{Form::Unary, "AddScalarOp"};
inline constexpr PointwiseFormula mul_scalar{Form::Unary, "MulScalarOp"};
inline constexpr PointwiseFormula exp{Form::Unary, "ExpOp", nullptr, false, /*reads output=*/true};
inline constexpr PointwiseFormula log{Form::Unary, "LogOp", nullptr, kReadsX};
inline constexpr PointwiseFormula sqrt{Form::Unary, "SqrtOp", nullptr, false, /*reads output=*/true};
inline constexpr PointwiseFormula pow_scalar{Form::Unary, "PowScalarOp", nullptr, kReadsX};
inline constexpr PointwiseFormula abs{Form::Unary, "AbsOp", nullptr, kReadsX};
inline constexpr PointwiseFormula sin{Form::Unary, "SinOp", nullptr, kReadsX};
inline constexpr PointwiseFormula cos{Form::Unary, "CosOp", nullptr, kReadsX};
inline constexpr PointwiseFormula clamp{Form::Unary, "ClampOp", nullptr, kReadsX};
inline constexpr PointwiseFormula cast{Form::Cast, nullptr};
inline constexpr PointwiseFormula where{Form::Where, nullptr};
inline constexpr PointwiseFormula masked_fill{Form::MaskedFill, nullptr};
inline constexpr PointwiseFormula dropout{Form::Dropout, nullptr};  // math::dropout_apply (ops/dropout_mask.h)
inline constexpr PointwiseFormula relu{Form::Unary, "ReluOp", nullptr, kReadsX};
inline constexpr PointwiseFormula leaky_relu{Form::Unary, "LeakyReluOp", nullptr, kReadsX};
inline constexpr PointwiseFormula elu{Form::Unary, "EluOp", nullptr, kReadsX};
inline constexpr PointwiseFormula clipped_relu{Form::Unary, "ClippedReluOp", nullptr, kReadsX};
inline constexpr PointwiseFormula sigmoid{Form::Unary, "SigmoidOp", nullptr, kReadsX};
inline constexpr PointwiseFormula tanh{Form::Unary, "TanhOp", nullptr, kReadsX};
inline constexpr PointwiseFormula softplus{Form::Unary, "SoftplusOp", nullptr, kReadsX};
inline constexpr PointwiseFormula gelu{Form::Unary, "GeluOp", "GeluTanhOp", kReadsX};
inline constexpr PointwiseFormula silu{Form::Unary, "SiluOp", nullptr, kReadsX};
inline constexpr PointwiseFormula log_sigmoid{Form::Unary, "LogSigmoidOp", nullptr, kReadsX};
inline constexpr PointwiseFormula softsign{Form::Unary, "SoftsignOp", nullptr, kReadsX};
inline constexpr PointwiseFormula add{Form::Binary, "AddOp"};
inline constexpr PointwiseFormula sub{Form::Binary, "SubOp"};
inline constexpr PointwiseFormula mul{Form::Binary, "MulOp", nullptr, kReadsX};
inline constexpr PointwiseFormula div{Form::Binary, "DivOp", nullptr, kReadsX};
inline constexpr PointwiseFormula minimum{Form::Binary, "MinimumOp", nullptr, kReadsX};
inline constexpr PointwiseFormula maximum{Form::Binary, "MaximumOp", nullptr, kReadsX};
// Comparisons are not differentiable: no backward reads anything.
inline constexpr PointwiseFormula eq{Form::Binary, "EqOp"};
inline constexpr PointwiseFormula ne{Form::Binary, "NeOp"};
inline constexpr PointwiseFormula lt{Form::Binary, "LtOp"};
inline constexpr PointwiseFormula le{Form::Binary, "LeOp"};
inline constexpr PointwiseFormula gt{Form::Binary, "GtOp"};
inline constexpr PointwiseFormula ge{Form::Binary, "GeOp"};
}  // namespace formula

// Calls fn(Functor{}) for a unary elementwise node; its attributes pick the form where an op has several
// (gelu's approximation). Host code only.
template <typename Fn>
decltype(auto) visit_unary(OpType op, const OpAttrs& attrs, Fn&& fn) {
    switch (op) {
#define DG_VISIT_PLAIN_UNARY(name, tag) \
    case OpType::tag: return fn(tag##Op{});
        DG_PLAIN_UNARY_OPS(DG_VISIT_PLAIN_UNARY)
#undef DG_VISIT_PLAIN_UNARY
        case OpType::AddScalar: return fn(AddScalarOp{});
        case OpType::MulScalar: return fn(MulScalarOp{});
        case OpType::PowScalar: return fn(PowScalarOp{});
        case OpType::Clamp: return fn(ClampOp{});
        case OpType::LeakyRelu: return fn(LeakyReluOp{});
        case OpType::Elu: return fn(EluOp{});
        case OpType::ClippedRelu: return fn(ClippedReluOp{});
        case OpType::Gelu:
            if (attrs.gelu_approximation == GeluApproximation::Tanh) return fn(GeluTanhOp{});
            return fn(GeluOp{});
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
        case OpType::Minimum: return fn(MinimumOp{});
        case OpType::Maximum: return fn(MaximumOp{});
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
