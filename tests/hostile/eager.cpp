// Hostile inputs to eager math (the Tensor forms of the op functions, graph/eager.h), the Tensor operators and
// comparisons, argmax/argmin, allclose/equal, and indexing (select, narrow, squeeze, unsqueeze, flatten) on
// Tensors and Vars. Each error names the op (eager calls: "<op> (eager at file:line)") and the operand.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

Tensor matrix() {  // (3,4) float32
    Generator gen(41);
    return Tensor::normal({3, 4}, 0, 1, gen);
}
Tensor labels() { return Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2}, {3}); }

const bool added = hostile::add(
    "eager",
    {
        // ---- indexing ----
        hostile::expect<IndexError>("select index equal to the axis size", {"select", "index 3", "size 3", "(3,4)"},
                                    [] { matrix().select(0, 3); }),
        hostile::expect<IndexError>("select index below -size", {"select", "index -5", "size 4"},
                                    [] { select(matrix(), 1, -5); }),
        hostile::expect<IndexError>("select index INT64_MIN", {"select", "out of range"},
                                    [] { select(matrix(), 0, std::numeric_limits<std::int64_t>::min()); }),
        hostile::expect<ShapeError>("select axis past the rank", {"select", "axis 2", "(3,4)"},
                                    [] { matrix().select(2, 0); }),
        hostile::expect<ShapeError>("select negative axis past the rank", {"select", "axis -3"},
                                    [] { matrix().select(-3, 0); }),
        hostile::expect<ShapeError>("select on a rank-0 tensor", {"select", "axis 0", "()"},
                                    [] { Tensor::full({}, 1.0).select(0, 0); }),
        hostile::expect<IndexError>("select on int64 labels out of range", {"select", "index 3", "int64"},
                                    [] { labels().select(0, 3); }),
        hostile::expect<IndexError>("select on a Var, index out of range", {"select", "index 4", "(3,4)"},
                                    [] {
                                        ComputeGraph g;
                                        select(g.input(matrix()), 1, 4);
                                    }),
        hostile::expect<ShapeError>("squeeze of an axis of size 3", {"squeeze", "axis 0", "size 3"},
                                    [] { matrix().squeeze(0); }),
        hostile::expect<ShapeError>("squeeze axis out of range", {"squeeze", "axis 5"}, [] { matrix().squeeze(5); }),
        hostile::expect<ShapeError>("squeeze of a Var axis of size 4", {"squeeze", "size 4"},
                                    [] {
                                        ComputeGraph g;
                                        squeeze(g.input(matrix()), -1);
                                    }),
        hostile::expect<ShapeError>("unsqueeze axis rank + 1", {"unsqueeze", "axis 3"}, [] { matrix().unsqueeze(3); }),
        hostile::expect<ShapeError>("unsqueeze axis -(rank + 2)", {"unsqueeze", "axis -4"},
                                    [] { matrix().unsqueeze(-4); }),
        hostile::expect<ShapeError>("flatten start after end", {"flatten", "start axis 1", "end axis 0"},
                                    [] { matrix().flatten(1, 0); }),
        hostile::expect<ShapeError>("flatten end axis out of range", {"flatten", "axis 2"},
                                    [] { matrix().flatten(0, 2); }),
        hostile::expect<ShapeError>("flatten (N, ...) of a vector", {"flatten", "rank >= 2"},
                                    [] { flatten(Tensor::zeros({4})); }),
        hostile::expect<IndexError>("narrow from a negative start", {"narrow (eager at", "[-1, 1)"},
                                    [] { matrix().narrow(1, -1, 2); }),
        hostile::expect<ValueError>("narrow of negative length", {"narrow (eager at", "length -2"},
                                    [] { narrow(matrix(), 0, 1, -2); }),
        hostile::expect<IndexError>("narrow past the end", {"narrow (eager at", "[3, 5)", "size 4"},
                                    [] { matrix().narrow(1, 3, 2); }),
        // ---- reductions ----
        hostile::expect<DTypeError>("argmax of int64", {"argmax (eager at", "int64"}, [] { argmax(labels(), 0); }),
        hostile::expect<ShapeError>("argmax over an empty axis", {"argmax", "(2,0)", "empty"},
                                    [] { argmax(Tensor::zeros({2, 0}), 1); }),
        hostile::expect<ShapeError>("argmin axis out of range", {"argmin (eager at", "axis 2"},
                                    [] { argmin(matrix(), 2); }),
        hostile::expect<ShapeError>("argmax of a rank-0 tensor", {"argmax", "rank 0"},
                                    [] { argmax(Tensor::full({}, 1.0), 0); }),
        hostile::expect<DTypeError>("argmax of int64 on a Var", {"argmax (new node", "int64"},
                                    [] {
                                        ComputeGraph g;
                                        argmax(g.input(labels()), 0);
                                    }),
        hostile::expect<ShapeError>("sum with an axis listed twice", {"sum (eager at", "twice"},
                                    [] { sum(matrix(), {1, -1}); }),
        hostile::expect<ShapeError>("mean over an empty axis", {"mean (eager at", "zero elements"},
                                    [] { mean(Tensor::zeros({3, 0}), {1}); }),
        hostile::expect<ShapeError>("max axis out of range", {"max (eager at", "axis -3"}, [] { max(matrix(), -3); }),
        hostile::expect<DTypeError>("min of int64 (the composite -max(-x))", {"neg (eager at", "int64"},
                                    [] { min(labels(), 0); }),
        // ---- comparisons and operators ----
        hostile::expect<DTypeError>("lt of float32 and float64", {"lt (eager at", "float32", "float64"},
                                    [] { matrix() < Tensor::zeros({3, 4}, DType::f64); }),
        hostile::expect<ShapeError>("eq of shapes that do not broadcast", {"eq (eager at", "(3,4)", "(5)"},
                                    [] { eq(matrix(), Tensor::zeros({5})); }),
        // Comparisons of int64 are PyTorch's (an accuracy, tests/ops/test_torch_semantics.cpp); arithmetic is not.
        hostile::expect<DTypeError>("add of int64 labels", {"add (eager at", "int64"}, [] { labels() + labels(); }),
        hostile::expect<DTypeError>("a scalar minus int64 labels", {"sub (eager at", "int64"}, [] { 2.0 - labels(); }),
        hostile::expect<ShapeError>("operator+ of shapes that do not broadcast", {"add (eager at", "(3,4)", "(2)"},
                                    [] { matrix() + Tensor::zeros({2}); }),
        hostile::expect<ValueError>("tensor / 0.0", {"div_scalar", "division by zero"}, [] { matrix() / 0.0; }),
        hostile::expect<ValueError>("scalar - undefined tensor", {"operator", "undefined"}, [] { 2.0 - Tensor(); }),
        hostile::expect<ValueError>("undefined tensor * scalar", {"mul_scalar (eager at", "undefined"},
                                    [] { Tensor() * 2.0; }),
        hostile::expect<ValueError>("relu of an undefined tensor", {"relu (eager at", "undefined"},
                                    [] { relu(Tensor()); }),
        hostile::expect<DTypeError>("sqrt of int64", {"sqrt (eager at", "int64"}, [] { sqrt(labels()); }),
        hostile::expect<GraphError>("eager add with one input", {"add (eager at", "takes 2 inputs, got 1"},
                                    [] { eager(OpType::Add, {matrix()}); }),
        hostile::expect<GraphError>("eager argmax with two inputs", {"argmax (eager at", "takes 1 inputs, got 2"},
                                    [] { eager(OpType::ArgMax, {matrix(), matrix()}); }),
        // ---- allclose, equal ----
        hostile::expect<ValueError>("allclose with a negative rtol", {"allclose", "rtol", "-1"},
                                    [] { allclose(matrix(), matrix(), -1.0); }),
        hostile::expect<ValueError>("allclose with a NaN atol", {"allclose", "atol", "nan"},
                                    [] { allclose(matrix(), matrix(), 1e-5, std::nan("")); }),
        hostile::expect<ShapeError>("allclose of a row against a matrix", {"allclose", "(3,4)", "(4)", "broadcast"},
                                    [] { allclose(Tensor::zeros({4}), matrix()); }),
        hostile::expect<DTypeError>("allclose of float32 and float64", {"sub (eager at", "float64"},
                                    [] { allclose(matrix(), matrix().to(DType::f64)); }),
        hostile::expect<ValueError>("equal with an undefined tensor", {"equal", "undefined"},
                                    [] { equal(matrix(), Tensor()); }),
        // ---- the Tensor forms of the other families ----
        hostile::expect<ShapeError>("matmul of mismatched inner dims", {"matmul (eager at", "(3,4)", "(3,4)"},
                                    [] { matmul(matrix(), matrix()); }),
        hostile::expect<ShapeError>("linear with a weight of the wrong width", {"linear (eager at", "(2,5)"},
                                    [] { linear(matrix(), Tensor::zeros({2, 5}), Tensor::zeros({2})); }),
        hostile::expect<ShapeError>("conv2d with mismatched channels", {"conv2d (eager at", "(2,3,5,5)", "(4,2,3,3)"},
                                    [] { conv2d(Tensor::zeros({2, 3, 5, 5}), Tensor::zeros({4, 2, 3, 3})); }),
        hostile::expect<ShapeError>("max_pool2d of a matrix", {"max_pool2d (eager at", "(3,4)"},
                                    [] { max_pool2d(matrix(), {2, 2}); }),
        hostile::expect<IndexError>("cross_entropy with a label out of range", {"cross_entropy (eager at", "7"},
                                    [] {
                                        cross_entropy(matrix(), Tensor::from_vector(std::vector<std::int64_t>{0, 7, 1},
                                                                                    {3}));
                                    }),
        hostile::expect<DTypeError>("cross_entropy with float labels", {"cross_entropy (eager at", "float32"},
                                    [] { cross_entropy(matrix(), Tensor::zeros({3})); }),
        hostile::expect<ShapeError>("mse_loss of different shapes", {"mse_loss (eager at", "(3,4)", "(4,3)"},
                                    [] { mse_loss(matrix(), Tensor::zeros({4, 3})); }),
        hostile::expect<ShapeError>("softmax axis out of range", {"softmax (eager at", "axis 2"},
                                    [] { softmax(matrix(), 2); }),
        hostile::expect<ShapeError>("batch_norm with running statistics of the wrong size", {"batch_norm (eager at"},
                                    [] {
                                        batch_norm(matrix(), Tensor::ones({4}), Tensor::zeros({4}), Tensor::zeros({3}),
                                                   Tensor::ones({4}), false);
                                    }),
        hostile::expect<ValueError>("dropout with p = 1", {"dropout (eager at", "1"},
                                    [] { dropout(matrix(), 1.0, true, 3); }),
        hostile::expect<ValueError>("concat of no tensors", {"concat", "at least one"},
                                    [] { concat(std::vector<Tensor>{}, 0); }),
        hostile::expect<DTypeError>("concat of float32 and int64", {"concat (eager at", "int64"},
                                    [] { concat({Tensor::zeros({3}), labels()}, 0); }),
        hostile::expect<ShapeError>("reshape to another element count", {"reshape (eager at", "(3,4)", "(5,2)"},
                                    [] { reshape(matrix(), {5, 2}); }),
        hostile::expect<ShapeError>("transpose axis out of range", {"transpose (eager at", "axis 3"},
                                    [] { transpose(matrix(), 0, 3); }),
    });

}  // namespace
