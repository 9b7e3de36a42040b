// Hostile inputs to mixed precision (issue 15): autocast guards and policies, dtype mixes outside (and past)
// autocast, f16 overflow under anomaly mode, a collapsing loss scale.
#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

Tensor normal(const Shape& shape, std::uint64_t seed, DType dtype = DType::f32) {
    Generator gen(seed);
    return Tensor::normal(shape, 0.0, 1.0, gen).to(dtype);
}

// Two graph inputs of `a` and `b`, then `op` on them.
template <typename Op>
void recorded(const Tensor& a, const Tensor& b, Op op) {
    ComputeGraph g;
    op(g.input(a), g.input(b));
}

const bool added = hostile::add(
    "autocast",
    {
        hostile::expect<DTypeError>("AutocastGuard into float64", {"AutocastGuard", "float64"},
                                    [] { AutocastGuard guard(DType::f64); }),
        hostile::expect<DTypeError>("AutocastGuard into int64", {"AutocastGuard", "int64"},
                                    [] { AutocastGuard guard(DType::i64); }),
        hostile::expect<DTypeError>("autocast_target with float32 as the autocast dtype",
                                    {"autocast", "bfloat16 or float16", "float32"},
                                    [] {
                                        const DType in[] = {DType::f32};
                                        autocast_target(OpType::Matmul, in, DType::f32);
                                    }),
        hostile::expect<DTypeError>("autocast_target with int64 as the autocast dtype", {"autocast", "int64"},
                                    [] {
                                        const DType in[] = {DType::f32};
                                        autocast_target(OpType::Relu, in, DType::i64);
                                    }),
        hostile::expect<DTypeError>("matmul of bf16 and f32 outside autocast", {"matmul", "bfloat16", "float32"},
                                    [] {
                                        recorded(normal({2, 3}, 1, DType::bf16), normal({3, 2}, 2),
                                                 [](Var a, Var b) { matmul(a, b); });
                                    }),
        hostile::expect<DTypeError>("matmul of f16 and bf16 outside autocast", {"matmul", "float16", "bfloat16"},
                                    [] {
                                        recorded(normal({2, 3}, 3, DType::f16), normal({3, 2}, 4, DType::bf16),
                                                 [](Var a, Var b) { matmul(a, b); });
                                    }),
        hostile::expect<DTypeError>("eager matmul of f32 and f16 outside autocast", {"matmul", "float32", "float16"},
                                    [] { matmul(normal({2, 3}, 5), normal({3, 2}, 6, DType::f16)); }),
        hostile::expect<DTypeError>("linear with an f16 input and f32 weights outside autocast",
                                    {"linear", "float16", "float32"},
                                    [] {
                                        ComputeGraph g;
                                        linear(g.input(normal({4, 3}, 7, DType::f16)), g.input(normal({2, 3}, 8)),
                                               g.input(normal({2}, 9)));
                                    }),
        hostile::expect<DTypeError>("conv2d of a bf16 image with f32 filters outside autocast",
                                    {"conv2d", "bfloat16", "float32"},
                                    [] {
                                        recorded(normal({1, 2, 5, 5}, 10, DType::bf16), normal({3, 2, 3, 3}, 11),
                                                 [](Var x, Var w) { conv2d(x, w); });
                                    }),
        hostile::expect<DTypeError>("add of bf16 and f32 outside autocast", {"add", "bfloat16", "float32"},
                                    [] {
                                        recorded(normal({3}, 12, DType::bf16), normal({3}, 13),
                                                 [](Var a, Var b) { add(a, b); });
                                    }),
        hostile::expect<DTypeError>("mul of f16 and bf16 outside autocast", {"mul", "float16", "bfloat16"},
                                    [] {
                                        recorded(normal({3}, 14, DType::f16), normal({3}, 15, DType::bf16),
                                                 [](Var a, Var b) { mul(a, b); });
                                    }),
        hostile::expect<DTypeError>("mse_loss of a bf16 prediction and an f32 target outside autocast",
                                    {"mse_loss", "bfloat16", "float32"},
                                    [] {
                                        recorded(normal({4}, 16, DType::bf16), normal({4}, 17),
                                                 [](Var a, Var b) { mse_loss(a, b); });
                                    }),
        hostile::expect<DTypeError>("concat of f16 and f32 outside autocast", {"concat", "float16", "float32"},
                                    [] {
                                        recorded(normal({2}, 18, DType::f16), normal({2}, 19),
                                                 [](Var a, Var b) { concat({a, b}, 0); });
                                    }),
        hostile::expect<DTypeError>("matmul of f64 and bf16 under autocast (f64 is never cast)",
                                    {"matmul", "float64", "bfloat16"},
                                    [] {
                                        const AutocastGuard autocast(DType::bf16);
                                        recorded(normal({2, 3}, 20, DType::f64), normal({3, 2}, 21),
                                                 [](Var a, Var b) { matmul(a, b); });
                                    }),
        hostile::expect<DTypeError>("add of f64 and f16 under autocast (f64 is never cast)",
                                    {"add", "float64", "float16"},
                                    [] {
                                        const AutocastGuard autocast(DType::f16);
                                        recorded(normal({3}, 22, DType::f64), normal({3}, 23, DType::f16),
                                                 [](Var a, Var b) { add(a, b); });
                                    }),
        hostile::expect<ShapeError>("matmul with mismatched inner dims under autocast: the shape error survives "
                                    "the casts",
                                    {"matmul", "inner dims", "3", "4"},
                                    [] {
                                        const AutocastGuard autocast(DType::bf16);
                                        recorded(normal({2, 3}, 24), normal({4, 2}, 25),
                                                 [](Var a, Var b) { matmul(a, b); });
                                    }),
        hostile::expect<NumericalError>("f16 overflow in a linear under anomaly mode",
                                        {"linear", "anomaly mode", "NaN/Inf", "this op made it"},
                                        [] {
                                            const AnomalyModeGuard anomaly;
                                            const AutocastGuard autocast(DType::f16);
                                            ComputeGraph g;
                                            linear(g.input(Tensor::full({2, 8}, 6e4)),
                                                   g.input(Tensor::full({3, 8}, 0.75)), g.input(normal({3}, 26)));
                                        }),
        hostile::expect<NumericalError>("f16 overflow in a matmul under anomaly mode",
                                        {"matmul", "NaN/Inf", "float16"},
                                        [] {
                                            const AnomalyModeGuard anomaly;
                                            const AutocastGuard autocast(DType::f16);
                                            ComputeGraph g;
                                            matmul(g.input(Tensor::full({2, 4}, 3e4)), g.input(Tensor::full({4, 2}, 2.0)));
                                        }),
        hostile::expect<NumericalError>("a loss scale collapsing under non-finite gradients at every scale",
                                        {"GradScaler", "at step 2", "collapsed", "2 consecutive skipped steps"},
                                        [] {
                                            Generator gen(27);
                                            Linear layer(3, 2, true, gen);
                                            SGD sgd(layer.parameters(), {.lr = 0.1});
                                            GradScaler scaler({.init_scale = 2.0, .min_scale = 1.0,
                                                               .max_consecutive_skips = 2});
                                            for (int step = 0; step < 2; ++step) {
                                                ComputeGraph g;
                                                // sqrt of a negative input: NaN loss and NaN gradients (1/(2·sqrt))
                                                // every step (log's gradient 1/x would stay finite)
                                                const Var out = layer(g.input(normal({4, 3}, 28)));
                                                g.backward(scaler.scale(sum(sqrt(mul_scalar(exp(out), -1.0)))));
                                                scaler.step(sgd);
                                                scaler.update();
                                                sgd.zero_grad();
                                            }
                                        }),
    });

}  // namespace
