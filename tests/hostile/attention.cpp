// Hostile inputs to scaled_dot_product_attention (ops/attention.h), recorded and eager: wrong ranks, head dims,
// batch/head/key-length mismatches, masks that do not broadcast or hold other values than 0/1, dtypes, dropout
// probabilities and scales. Each names the op and the operand at fault.
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::randn;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor ones(const Shape& shape, DType dtype = DType::f32) { return Tensor::ones(shape, dtype); }

AttentionOptions options_of(bool causal = false, double dropout_p = 0.0, std::optional<double> scale = std::nullopt) {
    return {.is_causal = causal, .dropout_p = dropout_p, .scale = scale};
}

struct Operands {
    Operands(Shape q_shape, Shape k_shape, Shape v_shape, std::optional<Shape> mask_shape = std::nullopt)
        : q(std::move(q_shape)), k(std::move(k_shape)), v(std::move(v_shape)), mask(std::move(mask_shape)) {}
    Shape q, k, v;
    std::optional<Shape> mask;
    DType q_dtype = DType::f32, k_dtype = DType::f32, v_dtype = DType::f32, mask_dtype = DType::f32;
};

// Recorded: q, k, v (random, requiring gradients) and the mask (ones) of the given shapes and dtypes.
std::function<void()> recorded(Operands o, AttentionOptions options = {}) {
    return [=] {
        ComputeGraph g;
        const Var q = g.input(randn(o.q, 1, o.q_dtype), "q", true);
        const Var k = g.input(randn(o.k, 2, o.k_dtype), "k", true);
        const Var v = g.input(randn(o.v, 3, o.v_dtype), "v", true);
        if (o.mask)
            scaled_dot_product_attention(q, k, v, g.input(ones(*o.mask, o.mask_dtype), "mask"), options);
        else
            scaled_dot_product_attention(q, k, v, options);
    };
}
// The same through the eager Tensor overloads.
std::function<void()> eager_call(Operands o, AttentionOptions options = {}) {
    return [=] {
        const Tensor q = randn(o.q, 1, o.q_dtype), k = randn(o.k, 2, o.k_dtype), v = randn(o.v, 3, o.v_dtype);
        if (o.mask)
            scaled_dot_product_attention(q, k, v, ones(*o.mask, o.mask_dtype), options);
        else
            scaled_dot_product_attention(q, k, v, options);
    };
}

// A (T,S) = (3,4) mask of 1s with `value` at one position.
std::function<void()> mask_holding(double value) {
    return [value] {
        std::vector<double> keep(12, 1.0);
        keep[5] = value;
        scaled_dot_product_attention(randn({1, 2, 3, 8}, 1), randn({1, 2, 4, 8}, 2), randn({1, 2, 4, 8}, 3),
                                     Tensor::from_vector(keep, {3, 4}, DType::f32));
    };
}

const Shape kQ{2, 3, 5, 8}, kK{2, 3, 7, 8};
constexpr const char* kOp = "scaled_dot_product_attention";

using hostile::expect;

const bool added = hostile::add(
    "attention",
    {
        // ---- ranks ----
        expect<ShapeError>("q of rank 3", {kOp, "q must be (B, H, T, D)", "(3,5,8)"}, recorded({{3, 5, 8}, kK, kK})),
        expect<ShapeError>("k of rank 5", {kOp, "k must be (B, H, S, D)", "(1,2,3,7,8)"},
                           recorded({kQ, {1, 2, 3, 7, 8}, kK})),
        expect<ShapeError>("v of rank 2", {kOp, "v must be", "(7,8)"}, recorded({kQ, kK, {7, 8}})),
        expect<ShapeError>("q a scalar (eager)", {kOp, "eager", "q must be", "()"}, eager_call({{}, kK, kK})),
        // ---- head dims ----
        expect<ShapeError>("k head dim 16 vs q 8", {kOp, "head dim D", "(2,3,7,16)"},
                           recorded({kQ, {2, 3, 7, 16}, kK})),
        expect<ShapeError>("v head dim 4 vs q 8", {kOp, "head dim D", "(2,3,7,4)"}, recorded({kQ, kK, {2, 3, 7, 4}})),
        expect<ShapeError>("head dim 0 everywhere", {kOp, "head dim D must be >= 1"},
                           recorded({{2, 3, 5, 0}, {2, 3, 7, 0}, {2, 3, 7, 0}})),
        expect<ShapeError>("k head dim mismatch (eager)", {kOp, "eager", "head dim"},
                           eager_call({kQ, {2, 3, 7, 9}, {2, 3, 7, 9}})),
        // ---- batch, heads, key length ----
        expect<ShapeError>("k batch 1 vs q batch 2 (no broadcasting)", {kOp, "batch B and heads H", "(1,3,7,8)"},
                           recorded({kQ, {1, 3, 7, 8}, {1, 3, 7, 8}})),
        expect<ShapeError>("v heads 1 vs q heads 3 (no grouped queries)", {kOp, "batch B and heads H", "(2,1,7,8)"},
                           recorded({kQ, kK, {2, 1, 7, 8}})),
        expect<ShapeError>("k heads 4 vs q heads 3", {kOp, "heads H", "(2,4,7,8)"}, recorded({kQ, {2, 4, 7, 8}, kK})),
        expect<ShapeError>("k S 7 vs v S 6", {kOp, "key length S", "(2,3,6,8)"}, recorded({kQ, kK, {2, 3, 6, 8}})),
        expect<ShapeError>("v S 9 vs k S 7 (eager)", {kOp, "eager", "key length S"},
                           eager_call({kQ, kK, {2, 3, 9, 8}})),
        // ---- masks ----
        expect<ShapeError>("mask (5,6): S is 7", {kOp, "mask (5,6)", "(2,3,5,7)"}, recorded({kQ, kK, kK, Shape{5, 6}})),
        expect<ShapeError>("mask (7,5): T and S swapped", {kOp, "mask (7,5)", "broadcast"},
                           recorded({kQ, kK, kK, Shape{7, 5}})),
        expect<ShapeError>("mask (3,1,1,7): batch 3 for 2", {kOp, "mask (3,1,1,7)"},
                           recorded({kQ, kK, kK, Shape{3, 1, 1, 7}})),
        expect<ShapeError>("mask (2,2,5,7): heads 2 for 3", {kOp, "mask (2,2,5,7)"},
                           recorded({kQ, kK, kK, Shape{2, 2, 5, 7}})),
        expect<ShapeError>("mask of rank 5", {kOp, "mask (1,2,3,5,7)"}, recorded({kQ, kK, kK, Shape{1, 2, 3, 5, 7}})),
        expect<ShapeError>("mask (8): one key too many", {kOp, "mask (8)"}, recorded({kQ, kK, kK, Shape{8}})),
        expect<ShapeError>("mask (5,7) with T 5, S 7 but padded (6,7) (eager)", {kOp, "eager", "mask (6,7)"},
                           eager_call({kQ, kK, kK, Shape{6, 7}})),
        expect<DTypeError>("mask float64 with float32 q", {kOp, "mask is float64", "float32"},
                           [] {
                               Operands o{kQ, kK, kK, Shape{5, 7}};
                               o.mask_dtype = DType::f64;
                               recorded(o)();
                           }),
        expect<DTypeError>("mask of int64", {kOp, "mask is int64"},
                           [] {
                               Operands o{kQ, kK, kK, Shape{5, 7}};
                               o.mask_dtype = DType::i64;
                               recorded(o)();
                           }),
        expect<ValueError>("mask holding 0.5", {kOp, "mask values must be 0", "or 1", "0.5"}, mask_holding(0.5)),
        expect<ValueError>("mask holding -inf (an additive PyTorch mask)", {kOp, "mask", "-inf", "mask == 0"},
                           mask_holding(-kInf)),
        expect<ValueError>("mask holding NaN", {kOp, "mask values", "nan"}, mask_holding(kNaN)),
        expect<ValueError>("mask holding 2", {kOp, "mask values", "got 2"}, mask_holding(2.0)),
        expect<ValueError>("mask holding -1", {kOp, "mask values", "got -1"}, mask_holding(-1.0)),
        // ---- dtypes ----
        expect<DTypeError>("k float64 with float32 q", {kOp, "k is float64", "float32"},
                           [] {
                               Operands o{kQ, kK, kK};
                               o.k_dtype = DType::f64;
                               recorded(o)();
                           }),
        expect<DTypeError>("v float64 with float32 q (eager)", {kOp, "eager", "v is float64"},
                           [] {
                               Operands o{kQ, kK, kK};
                               o.v_dtype = DType::f64;
                               eager_call(o)();
                           }),
        expect<DTypeError>("q of int64", {kOp, "q must be float32 or float64", "int64"},
                           [] {
                               scaled_dot_product_attention(Tensor::zeros(kQ, DType::i64), randn(kK, 2),
                                                            randn(kK, 3));
                           }),
        // ---- dropout and scale ----
        expect<ValueError>("dropout_p 1", {kOp, "dropout_p must be in [0, 1)", "1"},
                           recorded({kQ, kK, kK}, options_of(false, 1.0))),
        expect<ValueError>("dropout_p -0.1", {kOp, "dropout_p", "-0.1"}, recorded({kQ, kK, kK}, options_of(false, -0.1))),
        expect<ValueError>("dropout_p 1.5 (eager)", {kOp, "eager", "dropout_p", "1.5"},
                           eager_call({kQ, kK, kK}, options_of(false, 1.5))),
        expect<ValueError>("dropout_p NaN", {kOp, "dropout_p", "nan"}, recorded({kQ, kK, kK}, options_of(true, kNaN))),
        expect<ValueError>("scale NaN", {kOp, "scale must be finite", "nan"},
                           recorded({kQ, kK, kK}, options_of(false, 0.0, kNaN))),
        expect<ValueError>("scale +inf", {kOp, "scale must be finite", "inf"},
                           recorded({kQ, kK, kK}, options_of(false, 0.0, kInf))),
        expect<ValueError>("scale -inf (eager, causal)", {kOp, "eager", "scale must be finite"},
                           eager_call({kQ, kK, kK}, options_of(true, 0.0, -kInf))),
        // ---- undefined operands ----
        expect<ValueError>("undefined k (eager)", {kOp, "undefined"},
                           [] { scaled_dot_product_attention(randn(kQ, 1), Tensor(), randn(kK, 3)); }),
        expect<ValueError>("undefined mask (eager)", {kOp, "undefined"},
                           [] { scaled_dot_product_attention(randn(kQ, 1), randn(kK, 2), randn(kK, 3), Tensor()); }),
    });

}  // namespace
