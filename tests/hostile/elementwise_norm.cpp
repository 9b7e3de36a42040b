// Hostile inputs to issue 13's elementwise ops (clamp, minimum, maximum, gelu, silu, sin, cos, log_sigmoid),
// norms (layer_norm, rms_norm) and their layers (LayerNorm, RMSNorm, GELU): bad bounds, shapes, dtypes,
// normalized shapes and eps, recorded and eager. Each names the op (or layer) and the operand at fault.
#include <cstdint>
#include <limits>
#include <optional>

#include "dyngrad/dyngrad.h"
#include "hostile.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::randn;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int64_t k2p40 = std::int64_t{1} << 40;

Tensor labels(const Shape& shape) { return Tensor::zeros(shape, DType::i64); }

// One graph per case: op(graph, x) with x a random float32 input of `shape`.
template <typename Op>
std::function<void()> on_input(Shape shape, Op op) {
    return [shape, op] {
        ComputeGraph g;
        op(g, g.input(randn(shape, 13), "x", true));
    };
}

// layer_norm on a recorded x of x_shape with optional weight/bias of the given shapes and dtypes.
std::function<void()> layer_norm_with(Shape x_shape, Shape normalized, std::optional<Shape> weight,
                                      std::optional<Shape> bias, double eps = 1e-5, DType param_dtype = DType::f32) {
    return [=] {
        ComputeGraph g;
        const Var x = g.input(randn(x_shape, 1), "x", true);
        const Var w = weight ? g.input(randn(*weight, 2, param_dtype), "weight", true) : Var();
        const Var b = bias ? g.input(randn(*bias, 3, param_dtype), "bias", true) : Var();
        layer_norm(x, normalized, w, b, eps);
    };
}

std::function<void()> rms_norm_with(Shape x_shape, Shape normalized, std::optional<Shape> weight,
                                    std::optional<double> eps = std::nullopt, DType param_dtype = DType::f32) {
    return [=] {
        ComputeGraph g;
        const Var x = g.input(randn(x_shape, 4), "x", true);
        const Var w = weight ? g.input(randn(*weight, 5, param_dtype), "weight", true) : Var();
        rms_norm(x, normalized, w, eps);
    };
}

using hostile::expect;

const bool added = hostile::add(
    "elementwise_norm",
    {
        // ---- clamp ----
        expect<ValueError>("clamp with neither bound", {"clamp", "neither"},
                           on_input({3}, [](ComputeGraph&, const Var& x) { clamp(x, std::nullopt, std::nullopt); })),
        expect<ValueError>("clamp min > max", {"clamp", "min 1", "max -1"},
                           on_input({3}, [](ComputeGraph&, const Var& x) { clamp(x, 1.0, -1.0); })),
        expect<ValueError>("clamp min NaN", {"clamp", "min is NaN"},
                           on_input({3}, [](ComputeGraph&, const Var& x) { clamp(x, kNaN, 1.0); })),
        expect<ValueError>("clamp max NaN", {"clamp", "max is NaN"},
                           on_input({3}, [](ComputeGraph&, const Var& x) { clamp(x, std::nullopt, kNaN); })),
        expect<ValueError>("clamp min +inf above max", {"clamp", "min inf"},
                           on_input({3}, [](ComputeGraph&, const Var& x) { clamp(x, kInf, 0.0); })),
        expect<DTypeError>("clamp of int64 labels (eager)", {"clamp", "eager", "int64"},
                           [] { clamp(labels({4}), 0.0, 1.0); }),
        expect<ValueError>("clamp eager with neither bound", {"clamp", "eager", "neither"},
                           [] { clamp(randn({2}, 6), std::nullopt, std::nullopt); }),
        expect<ValueError>("clamp eager of an undefined tensor", {"clamp", "undefined"},
                           [] { clamp(Tensor(), 0.0, 1.0); }),
        // ---- maximum, minimum ----
        expect<ShapeError>("maximum (3,4) with (5)", {"maximum", "(3,4)", "(5)"},
                           [] {
                               ComputeGraph g;
                               maximum(g.input(randn({3, 4}, 1)), g.input(randn({5}, 2)));
                           }),
        expect<ShapeError>("minimum (2,3) with (3,2) eager", {"minimum", "eager", "(2,3)", "(3,2)"},
                           [] { minimum(randn({2, 3}, 1), randn({3, 2}, 2)); }),
        expect<DTypeError>("maximum float32 with float64", {"maximum", "float32", "float64"},
                           [] { maximum(randn({3}, 1), randn({3}, 2, DType::f64)); }),
        expect<DTypeError>("minimum with int64 labels", {"minimum", "int64"},
                           [] { minimum(randn({3}, 1), labels({3})); }),
        expect<ValueError>("maximum with an undefined tensor", {"maximum", "undefined"},
                           [] { maximum(randn({3}, 1), Tensor()); }),
        // ---- activations and sin/cos ----
        expect<ValueError>("gelu with approximation 7", {"gelu", "approximation", "7"},
                           on_input({3}, [](ComputeGraph&, const Var& x) { gelu(x, static_cast<GeluApproximation>(7)); })),
        expect<DTypeError>("gelu of int64", {"gelu", "int64"}, [] { gelu(labels({3})); }),
        expect<DTypeError>("silu of int64", {"silu", "int64"}, [] { silu(labels({3})); }),
        expect<DTypeError>("sin of int64", {"sin", "int64"}, [] { sin(labels({3})); }),
        expect<DTypeError>("cos of int64", {"cos", "int64"}, [] { cos(labels({3})); }),
        expect<DTypeError>("log_sigmoid of int64", {"log_sigmoid", "int64"}, [] { log_sigmoid(labels({3})); }),
        expect<ValueError>("sin of an undefined tensor", {"sin", "undefined"}, [] { sin(Tensor()); }),
        expect<ValueError>("GELU layer with approximation 3", {"gelu", "approximation"},
                           on_input({2}, [](ComputeGraph&, const Var& x) { GELU(static_cast<GeluApproximation>(3))(x); })),
        // ---- layer_norm ----
        expect<ShapeError>("layer_norm over a dim that is not trailing", {"layer_norm", "(3)", "(2,3,4)", "trailing"},
                           layer_norm_with({2, 3, 4}, {3}, std::nullopt, std::nullopt)),
        expect<ShapeError>("layer_norm normalized_shape longer than x", {"layer_norm", "(2,4)", "(4)"},
                           layer_norm_with({4}, {2, 4}, std::nullopt, std::nullopt)),
        expect<ShapeError>("layer_norm with an empty normalized_shape", {"layer_norm", "at least one"},
                           layer_norm_with({2, 4}, {}, std::nullopt, std::nullopt)),
        expect<ValueError>("layer_norm normalized_shape with a negative dim", {"layer_norm", "negative", "(-4)"},
                           layer_norm_with({2, 4}, {-4}, std::nullopt, std::nullopt)),
        expect<ShapeError>("layer_norm weight (5) for (4)", {"layer_norm", "weight (5)", "normalized_shape (4)"},
                           layer_norm_with({2, 4}, {4}, Shape{5}, Shape{4})),
        expect<ShapeError>("layer_norm bias (4,1) for (4)", {"layer_norm", "bias (4,1)"},
                           layer_norm_with({2, 4}, {4}, Shape{4}, Shape{4, 1})),
        expect<ShapeError>("layer_norm bias alone of the wrong shape", {"layer_norm", "bias (3)"},
                           layer_norm_with({2, 4}, {4}, std::nullopt, Shape{3})),
        expect<ShapeError>("layer_norm weight given as a scalar", {"layer_norm", "weight ()"},
                           layer_norm_with({2, 4}, {4}, Shape{}, std::nullopt)),
        expect<DTypeError>("layer_norm float64 weight for float32 x", {"layer_norm", "weight", "float64", "float32"},
                           layer_norm_with({2, 4}, {4}, Shape{4}, std::nullopt, 1e-5, DType::f64)),
        expect<DTypeError>("layer_norm float64 weight and bias for float32 x", {"layer_norm", "float64"},
                           layer_norm_with({2, 4}, {4}, Shape{4}, Shape{4}, 1e-5, DType::f64)),
        expect<ValueError>("layer_norm eps -1", {"layer_norm", "eps", "-1"},
                           layer_norm_with({2, 4}, {4}, std::nullopt, std::nullopt, -1.0)),
        expect<ValueError>("layer_norm eps NaN", {"layer_norm", "eps", "nan"},
                           layer_norm_with({2, 4}, {4}, std::nullopt, std::nullopt, kNaN)),
        expect<ValueError>("layer_norm eps inf", {"layer_norm", "eps", "inf"},
                           layer_norm_with({2, 4}, {4}, std::nullopt, std::nullopt, kInf)),
        expect<DTypeError>("layer_norm of int64 (eager)", {"layer_norm", "eager", "x", "int64"},
                           [] { layer_norm(labels({2, 4}), {4}); }),
        expect<ShapeError>("layer_norm eager weight (2,2) for (4)", {"layer_norm", "eager", "weight (2,2)"},
                           [] { layer_norm(randn({3, 4}, 1), {4}, randn({2, 2}, 2)); }),
        expect<ShapeError>("layer_norm of a scalar", {"layer_norm", "()"},
                           [] { layer_norm(randn({}, 1), {1}); }),
        // ---- rms_norm ----
        expect<ShapeError>("rms_norm weight (3) for (4)", {"rms_norm", "weight (3)", "(4)"},
                           rms_norm_with({2, 4}, {4}, Shape{3})),
        expect<ShapeError>("rms_norm over a leading dim", {"rms_norm", "(2)", "(2,4)"},
                           rms_norm_with({2, 4}, {2}, std::nullopt)),
        expect<ShapeError>("rms_norm with an empty normalized_shape", {"rms_norm", "at least one"},
                           rms_norm_with({2, 4}, {}, std::nullopt)),
        expect<ValueError>("rms_norm eps -0.5", {"rms_norm", "eps", "-0.5"},
                           rms_norm_with({2, 4}, {4}, std::nullopt, -0.5)),
        expect<ValueError>("rms_norm eps NaN", {"rms_norm", "eps"}, rms_norm_with({2, 4}, {4}, Shape{4}, kNaN)),
        expect<DTypeError>("rms_norm float64 weight for float32 x", {"rms_norm", "weight", "float64"},
                           rms_norm_with({2, 4}, {4}, Shape{4}, std::nullopt, DType::f64)),
        expect<DTypeError>("rms_norm of int64 (eager)", {"rms_norm", "eager", "int64"},
                           [] { rms_norm(labels({2, 4}), {4}); }),
        expect<ValueError>("rms_norm of an undefined tensor", {"rms_norm", "undefined"},
                           [] { rms_norm(Tensor(), {4}); }),
        // ---- layers ----
        expect<ValueError>("LayerNorm with no dims", {"LayerNorm", "normalized_shape"}, [] { LayerNorm({}); }),
        expect<ValueError>("LayerNorm with a zero dim", {"LayerNorm", "(4,0)"}, [] { LayerNorm({4, 0}); }),
        expect<ShapeError>("LayerNorm (2^40,2^40): the count overflows", {"LayerNorm", "normalized_shape"},
                           [] { LayerNorm({k2p40, k2p40}); }),
        expect<ValueError>("LayerNorm eps -1", {"LayerNorm", "eps"}, [] { LayerNorm({4}, -1.0); }),
        expect<ValueError>("LayerNorm eps NaN", {"LayerNorm", "eps"}, [] { LayerNorm({4}, kNaN); }),
        expect<ValueError>("RMSNorm with a negative dim", {"RMSNorm", "(-2)"}, [] { RMSNorm({-2}); }),
        expect<ValueError>("RMSNorm eps -1e-3", {"RMSNorm", "eps"}, [] { RMSNorm({4}, -1e-3); }),
        expect<ShapeError>("LayerNorm (4) on x (2,5)", {"layer_norm", "(4)", "(2,5)"},
                           on_input({2, 5}, [](ComputeGraph&, const Var& x) { LayerNorm({4})(x); })),
        expect<ShapeError>("RMSNorm (4) on x (3)", {"rms_norm", "(4)", "(3)"},
                           on_input({3}, [](ComputeGraph&, const Var& x) { RMSNorm({4})(x); })),
    });

}  // namespace
