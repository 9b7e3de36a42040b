// Hostile inputs to dropout on bf16/f16 tensors (the native 16-bit kernels, ops/dropout.cu; on the CPU the same
// validation runs before the path through f32): bad drop probabilities, bad seed tensors in either form, in eager
// calls and in graphs, and the Dropout layer's own checks.
#include <cstdint>
#include <limits>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor activations(DType dtype) {
    Generator gen(53);
    return Tensor::normal({4, 6}, 0.0, 1.0, gen).to(dtype);
}
Tensor seed_of(std::vector<std::int64_t> values, Shape shape) { return Tensor::from_vector(values, shape); }
Tensor good_seed() { return seed_of({12345}, {1}); }

// dropout(x, p) in a graph with the attribute seed, on a 16-bit input that requires grad.
void graph_dropout(DType dtype, double p, bool training = true) {
    ComputeGraph graph;
    dropout(graph.input(activations(dtype), "x", true), p, training, 7);
}
// dropout(x, p, seed tensor) in a graph.
void graph_dropout_seeded(DType dtype, double p, const Tensor& seed) {
    ComputeGraph graph;
    dropout(graph.input(activations(dtype), "x", true), p, true, graph.constant(seed));
}

const bool added = hostile::add(
    "dropout in bf16/f16",
    {
        // The drop probability: [0, 1) whatever the dtype, in training and in evaluation alike.
        hostile::expect<ValueError>("bf16 dropout with p = 1", {"dropout", "p must be in [0, 1)", "1"},
                                    [] { dropout(activations(DType::bf16), 1.0, true, 3); }),
        hostile::expect<ValueError>("f16 dropout with p = 1", {"dropout", "p must be in [0, 1)", "1"},
                                    [] { dropout(activations(DType::f16), 1.0, true, 3); }),
        hostile::expect<ValueError>("bf16 dropout with p = -0.25", {"dropout", "p must be in [0, 1)", "-0.25"},
                                    [] { dropout(activations(DType::bf16), -0.25, true, 3); }),
        hostile::expect<ValueError>("f16 dropout with p = 1.5", {"dropout", "p must be in [0, 1)", "1.5"},
                                    [] { dropout(activations(DType::f16), 1.5, true, 3); }),
        hostile::expect<ValueError>("bf16 dropout with p NaN", {"dropout", "p must be in [0, 1)", "nan"},
                                    [] { dropout(activations(DType::bf16), kNaN, true, 3); }),
        hostile::expect<ValueError>("f16 dropout with p +inf", {"dropout", "p must be in [0, 1)", "inf"},
                                    [] { dropout(activations(DType::f16), kInf, true, 3); }),
        hostile::expect<ValueError>("bf16 dropout with p -inf", {"dropout", "p must be in [0, 1)", "-inf"},
                                    [] { dropout(activations(DType::bf16), -kInf, true, 3); }),
        hostile::expect<ValueError>("bf16 dropout in evaluation with p = 2", {"dropout", "p must be in [0, 1)", "2"},
                                    [] { dropout(activations(DType::bf16), 2.0, false, 3); }),
        hostile::expect<ValueError>("bf16 dropout in a graph with p = 1", {"dropout", "p must be in [0, 1)"},
                                    [] { graph_dropout(DType::bf16, 1.0); }),
        hostile::expect<ValueError>("f16 dropout in a graph with p NaN", {"dropout", "p must be in [0, 1)", "nan"},
                                    [] { graph_dropout(DType::f16, kNaN); }),
        hostile::expect<ValueError>("f16 dropout in a graph in evaluation with p = -1",
                                    {"dropout", "p must be in [0, 1)", "-1"},
                                    [] { graph_dropout(DType::f16, -1.0, false); }),
        hostile::expect<ValueError>("bf16 dropout, seed tensor, p = 1", {"dropout", "p must be in [0, 1)"},
                                    [] { dropout(activations(DType::bf16), 1.0, true, good_seed()); }),
        hostile::expect<ValueError>("f16 dropout in a graph, seed tensor, p = 1.0000001",
                                    {"dropout", "p must be in [0, 1)"},
                                    [] { graph_dropout_seeded(DType::f16, 1.0000001, good_seed()); }),
        // The seed tensor: one int64, never the activations' own 16-bit dtype.
        hostile::expect<DTypeError>("bf16 dropout with a bf16 seed tensor", {"dropout", "seed", "int64", "bfloat16"},
                                    [] {
                                        dropout(activations(DType::bf16), 0.5, true,
                                                Tensor::zeros({1}, DType::bf16));
                                    }),
        hostile::expect<DTypeError>("f16 dropout with an f16 seed tensor", {"dropout", "seed", "int64", "float16"},
                                    [] {
                                        dropout(activations(DType::f16), 0.5, true, Tensor::zeros({1}, DType::f16));
                                    }),
        // A floating seed of another dtype meets the engine's dtype-mix check first: it names the seed's position.
        hostile::expect<DTypeError>("bf16 dropout with an f32 seed tensor",
                                    {"dropout", "bfloat16", "float32", "input 1"},
                                    [] {
                                        dropout(activations(DType::bf16), 0.5, true, Tensor::zeros({1}, DType::f32));
                                    }),
        hostile::expect<DTypeError>("f16 dropout with an f64 seed tensor",
                                    {"dropout", "float16", "float64", "input 1"}, [] {
                                        dropout(activations(DType::f16), 0.5, true, Tensor::zeros({1}, DType::f64));
                                    }),
        hostile::expect<DTypeError>("bf16 dropout in a graph with a bf16 seed Var", {"dropout", "seed", "bfloat16"},
                                    [] { graph_dropout_seeded(DType::bf16, 0.5, Tensor::zeros({1}, DType::bf16)); }),
        hostile::expect<DTypeError>("f16 dropout in a graph with an f16 seed Var", {"dropout", "seed", "float16"},
                                    [] { graph_dropout_seeded(DType::f16, 0.5, Tensor::zeros({1}, DType::f16)); }),
        hostile::expect<ShapeError>("bf16 dropout with a seed tensor of two elements",
                                    {"dropout", "seed", "one element", "(2)"},
                                    [] { dropout(activations(DType::bf16), 0.5, true, seed_of({1, 2}, {2})); }),
        hostile::expect<ShapeError>("f16 dropout with a seed tensor of no elements",
                                    {"dropout", "seed", "one element", "(0)"},
                                    [] { dropout(activations(DType::f16), 0.5, true, seed_of({}, {0})); }),
        hostile::expect<ShapeError>("bf16 dropout with a (2,2) seed tensor", {"seed", "one element", "(2,2)"},
                                    [] {
                                        dropout(activations(DType::bf16), 0.5, true, seed_of({1, 2, 3, 4}, {2, 2}));
                                    }),
        hostile::expect<ShapeError>("f16 dropout in a graph with a seed Var of three elements",
                                    {"dropout", "seed", "one element", "(3)"},
                                    [] { graph_dropout_seeded(DType::f16, 0.5, seed_of({1, 2, 3}, {3})); }),
        // The input: floating only (an int64 tensor is not activations).
        hostile::expect<DTypeError>("dropout of an int64 tensor", {"dropout", "int64"},
                                    [] { dropout(seed_of({1, 2, 3, 4}, {4}), 0.5, true, 3); }),
        hostile::expect<DTypeError>("dropout of an int64 tensor with a seed tensor", {"dropout", "int64"},
                                    [] { dropout(seed_of({1, 2, 3, 4}, {2, 2}), 0.5, true, good_seed()); }),
        // The Dropout layer refuses a bad p at construction, before any 16-bit input reaches it.
        hostile::expect<ValueError>("Dropout layer with p = 1", {"Dropout", "p must be in [0, 1)", "1"},
                                    [] { Dropout(1.0, 5); }),
        hostile::expect<ValueError>("Dropout layer with p NaN", {"Dropout", "p must be in [0, 1)", "nan"},
                                    [] { Dropout(kNaN, 5); }),
        hostile::expect<ValueError>("Dropout layer with p = -0.5", {"Dropout", "p must be in [0, 1)", "-0.5"},
                                    [] { Dropout(-0.5, 5); }),
    });

}  // namespace
