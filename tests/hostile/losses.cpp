// Hostile inputs to the losses (ops/loss.h): cross_entropy with its options, nll_loss,
// binary_cross_entropy_with_logits, l1_loss, smooth_l1_loss, on graphs and eagerly.
#include <cmath>
#include <limits>

#include "dyngrad/dyngrad.h"
#include "hostile.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::labels;

namespace {

Tensor normal(const Shape& shape, DType dtype = DType::f32) {
    static Generator gen(1313);
    return Tensor::normal(shape, 0.0, 1.0, gen, dtype);
}

// cross_entropy on fresh leaves of one graph; the logits require grad so a backward can run.
void ce(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options = {}) {
    ComputeGraph g;
    cross_entropy(g.input(logits, "logits", true), g.input(targets, "labels"), options);
}
void ce_weighted(const Tensor& logits, const Tensor& targets, const Tensor& weight,
                 const CrossEntropyOptions& options = {}) {
    ComputeGraph g;
    cross_entropy(g.input(logits, "logits", true), g.input(targets, "labels"), g.input(weight, "weight"), options);
}
void nll(const Tensor& log_probs, const Tensor& targets, const NllLossOptions& options = {}) {
    ComputeGraph g;
    nll_loss(g.input(log_probs, "log_probs", true), g.input(targets, "labels"), options);
}
void bce(const Tensor& logits, const Tensor& target, const Tensor& weight = {}, const Tensor& pos_weight = {},
         Reduction reduction = Reduction::Mean) {
    ComputeGraph g;
    const Var w = weight.defined() ? g.input(weight, "weight") : Var();
    const Var pw = pos_weight.defined() ? g.input(pos_weight, "pos_weight") : Var();
    binary_cross_entropy_with_logits(g.input(logits, "logits", true), g.input(target, "target"), w, pw, reduction);
}
void l1(const Tensor& prediction, const Tensor& target, Reduction reduction = Reduction::Mean) {
    ComputeGraph g;
    l1_loss(g.input(prediction, "prediction", true), g.input(target, "target"), reduction);
}
void smooth_l1(const Tensor& prediction, const Tensor& target, double beta) {
    ComputeGraph g;
    smooth_l1_loss(g.input(prediction, "prediction", true), g.input(target, "target"), Reduction::Mean, beta);
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

const bool added = hostile::add(
    "losses",
    {
        // ---- cross_entropy ----
        hostile::expect<DTypeError>("cross_entropy with float labels", {"cross_entropy", "labels", "int64", "float32"},
                                    [] { ce(normal({4, 3}), normal({4})); }),
        hostile::expect<DTypeError>("cross_entropy with int64 logits", {"cross_entropy", "logits", "int64"},
                                    [] { cross_entropy(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2}, {1, 3}), labels({0})); }),
        hostile::expect<ShapeError>("cross_entropy with 1-D logits and a 1-D label",
                                    {"cross_entropy", "labels (1)", "(5)", "expected ()"},
                                    [] { ce(normal({5}), labels({0})); }),
        hostile::expect<ShapeError>("cross_entropy with 3-D logits and 1-D labels",
                                    {"cross_entropy", "labels (2)", "(2,3,4)", "expected (2,4)"},
                                    [] { ce(normal({2, 3, 4}), labels({0, 1})); }),
        hostile::expect<ShapeError>("cross_entropy labels shorter than the batch", {"cross_entropy", "labels", "(3)", "(4,3)"},
                                    [] { ce(normal({4, 3}), labels({0, 1, 2})); }),
        hostile::expect<ShapeError>("cross_entropy labels of shape (4,1)", {"cross_entropy", "labels", "(4,1)"},
                                    [] { ce(normal({4, 3}), Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 0}, {4, 1})); }),
        hostile::expect<ShapeError>("cross_entropy on empty logits", {"cross_entropy", "(0,3)", "empty"},
                                    [] { ce(normal({0, 3}), labels({})); }),
        hostile::expect<ShapeError>("cross_entropy with zero classes", {"cross_entropy", "(2,0)", "empty"},
                                    [] { ce(normal({2, 0}), labels({0, 0})); }),
        hostile::expect<ShapeError>("cross_entropy class_weight of 4 for 3 classes",
                                    {"cross_entropy", "class_weight", "(4)", "3 classes"},
                                    [] { ce_weighted(normal({2, 3}), labels({0, 1}), normal({4})); }),
        hostile::expect<ShapeError>("cross_entropy class_weight of shape (1,3)", {"cross_entropy", "class_weight", "(1,3)"},
                                    [] { ce_weighted(normal({2, 3}), labels({0, 1}), normal({1, 3})); }),
        hostile::expect<DTypeError>("cross_entropy float64 class_weight for float32 logits",
                                    {"cross_entropy", "class_weight", "float64", "float32"},
                                    [] { ce_weighted(normal({2, 3}), labels({0, 1}), normal({3}, DType::f64)); }),
        hostile::expect<DTypeError>("cross_entropy int64 class_weight", {"cross_entropy", "class_weight", "int64"},
                                    [] { ce_weighted(normal({2, 3}), labels({0, 1}), labels({1, 1, 1})); }),
        hostile::expect<ValueError>("cross_entropy label_smoothing -0.1", {"cross_entropy", "label_smoothing", "-0.1"},
                                    [] { ce(normal({2, 3}), labels({0, 1}), {.label_smoothing = -0.1}); }),
        hostile::expect<ValueError>("cross_entropy label_smoothing 1.5", {"cross_entropy", "label_smoothing", "1.5"},
                                    [] { ce(normal({2, 3}), labels({0, 1}), {.label_smoothing = 1.5}); }),
        hostile::expect<ValueError>("cross_entropy label_smoothing NaN", {"cross_entropy", "label_smoothing", "nan"},
                                    [] { ce(normal({2, 3}), labels({0, 1}), {.label_smoothing = kNaN}); }),
        hostile::expect<IndexError>("cross_entropy label C", {"cross_entropy", "label 3", "row 1", "3 classes"},
                                    [] { ce(normal({2, 3}), labels({0, 3})); }),
        hostile::expect<IndexError>("cross_entropy label -1 with the default ignore_index",
                                    {"cross_entropy", "label -1", "ignore_index -100"},
                                    [] { ce(normal({2, 3}), labels({-1, 0})); }),
        hostile::expect<IndexError>("cross_entropy label -100 with ignore_index -1",
                                    {"cross_entropy", "label -100", "ignore_index -1"},
                                    [] { ce(normal({2, 3}), labels({-100, 0}), {.ignore_index = -1}); }),
        hostile::expect<IndexError>("cross_entropy weighted, label INT64_MAX",
                                    {"cross_entropy", "9223372036854775807"},
                                    [] {
                                        ce_weighted(normal({2, 3}), labels({0, std::numeric_limits<std::int64_t>::max()}),
                                                    normal({3}));
                                    }),
        hostile::expect<ValueError>("cross_entropy reduction outside the enum", {"cross_entropy", "reduction", "7"},
                                    [] { ce(normal({2, 3}), labels({0, 1}), {.reduction = static_cast<Reduction>(7)}); }),
        hostile::expect<ValueError>("cross_entropy class_weight that requires grad",
                                    {"cross_entropy", "class_weight", "no gradient"},
                                    [] {
                                        ComputeGraph g;
                                        Var loss = cross_entropy(g.input(normal({2, 3}), "logits", true),
                                                                 g.input(labels({0, 2})),
                                                                 g.input(Tensor::ones({3}), "weight", true));
                                        g.backward(loss);
                                    }),
        hostile::expect<IndexError>("cross_entropy labels changed to out of range before backward",
                                    {"cross_entropy", "label 5", "3 classes"},
                                    [] {
                                        ComputeGraph g;
                                        Tensor targets = labels({0, 1});
                                        Var loss = cross_entropy(g.input(normal({2, 3}), "logits", true), g.input(targets));
                                        targets.data<std::int64_t>()[1] = 5;  // no version bump: a raw write
                                        g.backward(loss);
                                    }),
        // ---- nll_loss ----
        hostile::expect<ShapeError>("nll_loss with 3-D log_probs and 1-D labels",
                                    {"nll_loss", "labels (2)", "(2,3,4)", "expected (2,4)"},
                                    [] { nll(normal({2, 3, 4}), labels({0, 1})); }),
        hostile::expect<DTypeError>("nll_loss with float labels", {"nll_loss", "labels", "int64"},
                                    [] { nll(normal({2, 3}), normal({2})); }),
        hostile::expect<DTypeError>("nll_loss with int64 log_probs", {"nll_loss", "log_probs", "int64"},
                                    [] { nll_loss(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2}, {2, 3}), labels({0, 1})); }),
        hostile::expect<ShapeError>("nll_loss labels (3) for a batch of 2", {"nll_loss", "labels", "(3)", "(2,4)"},
                                    [] { nll(normal({2, 4}), labels({0, 1, 2})); }),
        hostile::expect<IndexError>("nll_loss label 7 of 4 classes", {"nll_loss", "label 7", "4 classes"},
                                    [] { nll(normal({2, 4}), labels({7, 1})); }),
        hostile::expect<IndexError>("nll_loss label -100 when ignore_index is 0", {"nll_loss", "label -100"},
                                    [] { nll(normal({2, 4}), labels({-100, 0}), {.ignore_index = 0}); }),
        hostile::expect<ShapeError>("nll_loss class_weight (2,3)", {"nll_loss", "class_weight", "(2,3)"},
                                    [] {
                                        ComputeGraph g;
                                        nll_loss(g.input(normal({2, 3})), g.input(labels({0, 1})),
                                                 g.input(normal({2, 3})));
                                    }),
        hostile::expect<ValueError>("nll_loss given label_smoothing through eager attributes",
                                    {"nll_loss", "label_smoothing", "0.2"},
                                    [] {
                                        OpAttrs attrs;
                                        attrs.label_smoothing = 0.2;
                                        eager(OpType::NllLoss, {normal({2, 3}), labels({0, 1})}, attrs);
                                    }),
        hostile::expect<ValueError>("nll_loss class_weight that requires grad", {"nll_loss", "class_weight", "no gradient"},
                                    [] {
                                        ComputeGraph g;
                                        Var loss = nll_loss(g.input(normal({2, 3}), "log_probs", true),
                                                            g.input(labels({0, 2})),
                                                            g.input(Tensor::ones({3}), "weight", true));
                                        g.backward(loss);
                                    }),
        hostile::expect<ValueError>("nll_loss reduction outside the enum", {"nll_loss", "reduction", "3"},
                                    [] { nll(normal({2, 3}), labels({0, 1}), {.reduction = static_cast<Reduction>(3)}); }),
        // ---- binary_cross_entropy_with_logits ----
        hostile::expect<ShapeError>("bce target of another shape",
                                    {"binary_cross_entropy_with_logits", "target", "(3,4)", "(4,3)"},
                                    [] { bce(normal({4, 3}), normal({3, 4})); }),
        hostile::expect<ShapeError>("bce target that would broadcast", {"binary_cross_entropy_with_logits", "target", "(3)"},
                                    [] { bce(normal({4, 3}), normal({3})); }),
        hostile::expect<DTypeError>("bce int64 target", {"binary_cross_entropy_with_logits", "target", "int64"},
                                    [] { bce(normal({2}), labels({0, 1})); }),
        hostile::expect<DTypeError>("bce int64 logits", {"binary_cross_entropy_with_logits", "logits", "int64"},
                                    [] { binary_cross_entropy_with_logits(labels({0, 1}), normal({2})); }),
        hostile::expect<DTypeError>("bce float64 target for float32 logits",
                                    {"binary_cross_entropy_with_logits", "target", "float64", "float32"},
                                    [] { bce(normal({2}), normal({2}, DType::f64)); }),
        hostile::expect<ShapeError>("bce weight (4) for logits (4,3)",
                                    {"binary_cross_entropy_with_logits", "weight", "(4)", "(4,3)", "suffix"},
                                    [] { bce(normal({4, 3}), normal({4, 3}), normal({4})); }),
        hostile::expect<ShapeError>("bce weight (4,1), a broadcast along the last axis",
                                    {"binary_cross_entropy_with_logits", "weight", "(4,1)"},
                                    [] { bce(normal({4, 3}), normal({4, 3}), normal({4, 1})); }),
        hostile::expect<ShapeError>("bce pos_weight (2) for logits (4,3)",
                                    {"binary_cross_entropy_with_logits", "pos_weight", "(2)"},
                                    [] { bce(normal({4, 3}), normal({4, 3}), {}, normal({2})); }),
        hostile::expect<ShapeError>("bce pos_weight of higher rank than the logits",
                                    {"binary_cross_entropy_with_logits", "pos_weight", "(1,4,3)"},
                                    [] { bce(normal({4, 3}), normal({4, 3}), {}, normal({1, 4, 3})); }),
        hostile::expect<DTypeError>("bce float64 weight for float32 logits",
                                    {"binary_cross_entropy_with_logits", "weight", "float64"},
                                    [] { bce(normal({4, 3}), normal({4, 3}), normal({3}, DType::f64)); }),
        hostile::expect<DTypeError>("bce int64 pos_weight", {"binary_cross_entropy_with_logits", "pos_weight", "int64"},
                                    [] { bce(normal({2, 3}), normal({2, 3}), {}, labels({1, 1, 1})); }),
        hostile::expect<ShapeError>("bce mean of empty logits", {"binary_cross_entropy_with_logits", "(0,3)", "empty"},
                                    [] { bce(normal({0, 3}), normal({0, 3})); }),
        hostile::expect<ValueError>("bce reduction outside the enum", {"binary_cross_entropy_with_logits", "reduction"},
                                    [] { bce(normal({2}), normal({2}), {}, {}, static_cast<Reduction>(9)); }),
        hostile::expect<ValueError>("bce pos_weight that requires grad",
                                    {"binary_cross_entropy_with_logits", "pos_weight", "no gradient"},
                                    [] {
                                        ComputeGraph g;
                                        Var loss = binary_cross_entropy_with_logits(
                                            g.input(normal({2, 3}), "logits", true), g.input(normal({2, 3})), Var(),
                                            g.input(Tensor::ones({3}), "pos_weight", true));
                                        g.backward(loss);
                                    }),
        hostile::expect<ValueError>("bce weight that requires grad",
                                    {"binary_cross_entropy_with_logits", "weight", "no gradient"},
                                    [] {
                                        ComputeGraph g;
                                        Var loss = binary_cross_entropy_with_logits(
                                            g.input(normal({2, 3}), "logits", true), g.input(normal({2, 3})),
                                            g.input(Tensor::ones({2, 3}), "weight", true), Var());
                                        g.backward(loss);
                                    }),
        // ---- l1_loss, smooth_l1_loss ----
        hostile::expect<ShapeError>("l1_loss of different shapes", {"l1_loss", "prediction", "target", "(2,3)", "(3,2)"},
                                    [] { l1(normal({2, 3}), normal({3, 2})); }),
        hostile::expect<DTypeError>("l1_loss float64 target for float32 prediction",
                                    {"l1_loss", "target", "float64", "float32"},
                                    [] { l1(normal({3}), normal({3}, DType::f64)); }),
        hostile::expect<DTypeError>("l1_loss int64 prediction", {"l1_loss", "prediction", "int64"},
                                    [] { l1_loss(labels({1, 2}), labels({1, 2})); }),
        hostile::expect<ShapeError>("l1_loss mean of nothing", {"l1_loss", "empty", "mean"},
                                    [] { l1(normal({0}), normal({0})); }),
        hostile::expect<ValueError>("smooth_l1_loss beta -1", {"smooth_l1_loss", "beta", "-1"},
                                    [] { smooth_l1(normal({3}), normal({3}), -1.0); }),
        hostile::expect<ValueError>("smooth_l1_loss beta NaN", {"smooth_l1_loss", "beta", "nan"},
                                    [] { smooth_l1(normal({3}), normal({3}), kNaN); }),
        hostile::expect<ValueError>("smooth_l1_loss beta infinite", {"smooth_l1_loss", "beta", "inf"},
                                    [] { smooth_l1(normal({3}), normal({3}), kInf); }),
        hostile::expect<ShapeError>("smooth_l1_loss of different shapes", {"smooth_l1_loss", "(4)", "(5)"},
                                    [] { smooth_l1(normal({4}), normal({5}), 1.0); }),
        // ---- eager ----
        hostile::expect<IndexError>("eager cross_entropy with label 4 of 4 classes",
                                    {"cross_entropy", "eager", "label 4"},
                                    [] { cross_entropy(normal({3, 4}), labels({0, 4, 1})); }),
        hostile::expect<ShapeError>("eager l1_loss of different shapes", {"l1_loss", "eager", "(2)", "(3)"},
                                    [] { l1_loss(normal({2}), normal({3})); }),
        hostile::expect<ShapeError>("eager nll_loss with a class_weight of 2 for 3 classes",
                                    {"nll_loss", "eager", "class_weight"},
                                    [] { nll_loss(normal({2, 3}), labels({0, 1}), normal({2})); }),
        hostile::expect<ShapeError>("eager bce with a pos_weight (4) for logits (2,3)",
                                    {"binary_cross_entropy_with_logits", "eager", "pos_weight"},
                                    [] { binary_cross_entropy_with_logits(normal({2, 3}), normal({2, 3}), Tensor(), normal({4})); }),
    });

}  // namespace
