// Hostile inputs of mixed precision (issue 15): a bf16/f16 input mixed with another floating dtype in one op
// (the engine never converts silently: autocast inserts explicit casts), casts to or from what is not a
// floating dtype, bf16/f16 parameters given to an optimizer (master weights stay f32), overflow of the reduced
// range under anomaly mode. Each is a typed error naming the op and the dtypes.
#include <cstdint>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

Tensor t(const Shape& shape, DType dtype, std::uint64_t seed = 1) {
    Generator gen(seed);
    return Tensor::normal(shape, 0.0, 1.0, gen, DType::f64).to(dtype);
}
Tensor labels(std::int64_t n, std::int64_t classes) {
    std::vector<std::int64_t> values(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = i % classes;
    return Tensor::from_vector(values, {n});
}
Parameter param(DType dtype) { return Parameter(t({4}, dtype), "w"); }

constexpr DType bf16 = DType::bf16;
constexpr DType f16 = DType::f16;
constexpr DType f32 = DType::f32;
constexpr DType f64 = DType::f64;

const bool added = hostile::add(
    "reduced_precision",
    {
        // ---- one op, two floating dtypes ----
        hostile::expect<DTypeError>("add bf16 + f32", {"add", "bfloat16", "float32"},
                                    [] { add(t({3}, bf16), t({3}, f32)); }),
        hostile::expect<DTypeError>("sub f16 - bf16", {"sub", "float16", "bfloat16"},
                                    [] { sub(t({3}, f16), t({3}, bf16)); }),
        hostile::expect<DTypeError>("mul bf16 * f64", {"mul", "bfloat16", "float64"},
                                    [] { mul(t({2, 3}, bf16), t({3}, f64)); }),
        hostile::expect<DTypeError>("div f32 / f16", {"div", "float16", "float32"},
                                    [] { div(t({3}, f32), t({3}, f16)); }),
        hostile::expect<DTypeError>("maximum f16, f32", {"maximum", "float16", "float32"},
                                    [] { maximum(t({3}, f16), t({3}, f32)); }),
        hostile::expect<DTypeError>("eq bf16 == f32", {"eq", "bfloat16", "float32"},
                                    [] { eq(t({3}, bf16), t({3}, f32)); }),
        hostile::expect<DTypeError>("matmul bf16 x f32", {"matmul", "bfloat16", "float32"},
                                    [] { matmul(t({2, 3}, bf16), t({3, 4}, f32)); }),
        hostile::expect<DTypeError>("linear bf16 x with an f32 weight", {"linear", "bfloat16", "float32"},
                                    [] { linear(t({2, 3}, bf16), t({4, 3}, f32), t({4}, f32)); }),
        hostile::expect<DTypeError>("linear f16 x and weight, bf16 bias", {"linear", "float16", "bfloat16"},
                                    [] { linear(t({2, 3}, f16), t({4, 3}, f16), t({4}, bf16)); }),
        hostile::expect<DTypeError>("conv2d bf16 input, f32 weight", {"conv2d", "bfloat16", "float32"},
                                    [] { conv2d(t({1, 2, 5, 5}, bf16), t({3, 2, 3, 3}, f32)); }),
        hostile::expect<DTypeError>("where with an f32 condition and bf16 operands", {"where", "bfloat16", "float32"},
                                    [] { where(Tensor::ones({3}, f32), t({3}, bf16), t({3}, bf16)); }),
        hostile::expect<DTypeError>("masked_fill f16 x with a bf16 mask", {"masked_fill", "float16", "bfloat16"},
                                    [] { masked_fill(t({3}, f16), Tensor::ones({3}, bf16), 0.0); }),
        hostile::expect<DTypeError>("concat bf16 and f32", {"concat", "bfloat16", "float32"},
                                    [] { concat({t({2}, bf16), t({2}, f32)}); }),
        hostile::expect<DTypeError>("mse_loss bf16 prediction, f32 target", {"mse_loss", "bfloat16", "float32"},
                                    [] { mse_loss(t({4}, bf16), t({4}, f32)); }),
        hostile::expect<DTypeError>("l1_loss f16 prediction, f64 target", {"l1_loss", "float16", "float64"},
                                    [] { l1_loss(t({4}, f16), t({4}, f64)); }),
        hostile::expect<DTypeError>("smooth_l1_loss bf16 prediction, f16 target",
                                    {"smooth_l1_loss", "bfloat16", "float16"},
                                    [] { smooth_l1_loss(t({4}, bf16), t({4}, f16)); }),
        hostile::expect<DTypeError>("bce_with_logits bf16 logits, f32 target",
                                    {"binary_cross_entropy_with_logits", "bfloat16", "float32"},
                                    [] { binary_cross_entropy_with_logits(t({4}, bf16), Tensor::ones({4}, f32)); }),
        hostile::expect<DTypeError>("cross_entropy bf16 logits, f32 class weights",
                                    {"cross_entropy", "bfloat16", "float32"},
                                    [] { cross_entropy(t({4, 3}, bf16), labels(4, 3), Tensor::ones({3}, f32)); }),
        hostile::expect<DTypeError>("nll_loss f16 log-probabilities, bf16 class weights",
                                    {"nll_loss", "float16", "bfloat16"},
                                    [] { nll_loss(t({4, 3}, f16), labels(4, 3), Tensor::ones({3}, bf16)); }),
        hostile::expect<DTypeError>("layer_norm bf16 x, f32 weight", {"layer_norm", "bfloat16", "float32"},
                                    [] { layer_norm(t({2, 4}, bf16), {4}, Tensor::ones({4}, f32)); }),
        hostile::expect<DTypeError>("rms_norm f16 x, f32 weight", {"rms_norm", "float16", "float32"},
                                    [] { rms_norm(t({2, 4}, f16), {4}, Tensor::ones({4}, f32)); }),
        hostile::expect<DTypeError>("batch_norm bf16 x, f32 running statistics", {"batch_norm", "bfloat16", "float32"},
                                    [] {
                                        batch_norm(t({4, 2}, bf16), Tensor::ones({2}, bf16), Tensor::zeros({2}, bf16),
                                                   Tensor::zeros({2}, f32), Tensor::ones({2}, f32), true, 0.1, 1e-5);
                                    }),
        hostile::expect<DTypeError>("attention bf16 q, f32 k and v",
                                    {"scaled_dot_product_attention", "bfloat16", "float32"},
                                    [] {
                                        scaled_dot_product_attention(t({1, 1, 2, 4}, bf16), t({1, 1, 2, 4}, f32),
                                                                     t({1, 1, 2, 4}, f32));
                                    }),
        hostile::expect<DTypeError>("scatter_add bf16 base, f32 source", {"scatter_add", "bfloat16", "float32"},
                                    [] {
                                        scatter_add(t({2, 3}, bf16), 1, Tensor::zeros({2, 3}, DType::i64),
                                                    t({2, 3}, f32));
                                    }),
        hostile::expect<DTypeError>("recorded add of a bf16 Var and an f32 Var", {"add", "new node", "bfloat16"},
                                    [] {
                                        ComputeGraph graph;
                                        const Var a = graph.input(t({3}, bf16), "a", true);
                                        const Var b = graph.input(t({3}, f32), "b", true);
                                        add(a, b);
                                    }),

        // ---- casts ----
        hostile::expect<DTypeError>("to_dtype to int64", {"cast", "int64"}, [] { to_dtype(t({3}, f32), DType::i64); }),
        hostile::expect<DTypeError>("to_dtype of an int64 tensor", {"cast", "int64"},
                                    [] { to_dtype(labels(3, 2), bf16); }),
        hostile::expect<DTypeError>("to_dtype to dtype code 99", {"cast", "dtype code 99"},
                                    [] { to_dtype(t({3}, f32), static_cast<DType>(99)); }),
        hostile::expect<DTypeError>("recorded to_dtype to int64", {"cast", "new node", "int64"},
                                    [] {
                                        ComputeGraph graph;
                                        to_dtype(graph.input(t({3}, bf16), "x", true), DType::i64);
                                    }),
        hostile::expect<GraphError>("backward of a bf16 output seeded with an f32 gradient",
                                    {"backward", "bfloat16", "float32"},
                                    [] {
                                        ComputeGraph graph;
                                        const Var x = graph.input(t({3}, bf16), "x", true);
                                        graph.backward(relu(x), Tensor::ones({3}, f32));
                                    }),

        // ---- optimizers keep f32 master weights ----
        hostile::expect<DTypeError>("SGD with a bf16 parameter", {"SGD", "bfloat16", "master"},
                                    [] { SGD({param(bf16)}); }),
        hostile::expect<DTypeError>("SGD with an f16 parameter", {"SGD", "float16", "to_dtype"},
                                    [] { SGD({param(f16)}); }),
        hostile::expect<DTypeError>("Adam with a bf16 parameter", {"Adam", "bfloat16", "master"},
                                    [] { Adam({param(bf16)}); }),
        hostile::expect<DTypeError>("AdamW with an f16 parameter among f32 ones", {"AdamW", "float16", "number 1"},
                                    [] { AdamW({param(f32), param(f16)}); }),

        // ---- the reduced range under anomaly mode ----
        hostile::expect<NumericalError>("f16 overflow in a forward: 300 * 300 > 65504", {"anomaly", "NaN/Inf"},
                                        [] {
                                            const AnomalyModeGuard anomaly;
                                            const Tensor x = Tensor::full({2}, 300.0, f16);
                                            mul(x, x);
                                        }),
        hostile::expect<NumericalError>("cast of 70000 to f16 overflows", {"anomaly", "cast"},
                                        [] {
                                            const AnomalyModeGuard anomaly;
                                            to_dtype(Tensor::full({2}, 70000.0, f32), f16);
                                        }),
        hostile::expect<NumericalError>("bf16 exp(100) beyond bf16's largest value", {"anomaly", "exp"},
                                        [] {
                                            const AnomalyModeGuard anomaly;
                                            exp(Tensor::full({2}, 100.0, bf16));
                                        }),
        hostile::expect<DTypeError>("unit_roundoff of int64", {"unit_roundoff", "int64"},
                                    [] { unit_roundoff(DType::i64); }),
    });

}  // namespace
