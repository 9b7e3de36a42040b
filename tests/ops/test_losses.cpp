// The losses' edge cases that the op table's random cases do not reach: every row ignored, extreme logits,
// empty inputs under Sum and None, the eager overloads against the graph ops, and PyTorch's identities
// (cross_entropy = nll_loss(log_softmax), smooth_l1 with beta 0 = l1).
#include <cmath>
#include <limits>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::labels;

namespace {

}  // namespace

TEST_CASE("every row ignored: the mean is NaN as in PyTorch, the sum 0, the gradient 0", "[losses]") {
    Generator gen(11);
    const Tensor logits = Tensor::normal({3, 4}, 0.0, 1.0, gen, DType::f64);
    const Tensor ignored = labels({-100, -100, -100});
    CHECK(std::isnan(cross_entropy(logits, ignored).item()));
    CHECK(std::isnan(nll_loss(logits, ignored).item()));
    CHECK(cross_entropy(logits, ignored, {.reduction = Reduction::Sum}).item() == 0.0);
    ComputeGraph graph;
    Var x = graph.input(logits, "logits", true);
    graph.backward(cross_entropy(x, graph.input(ignored), {.reduction = Reduction::Sum, .label_smoothing = 0.3}));
    for (const double g : x.grad().to_vector()) CHECK(g == 0.0);
}

TEST_CASE("cross_entropy equals nll_loss of log_softmax, with weights, ignored rows and every reduction",
          "[losses]") {
    Generator gen(12);
    const Tensor logits = Tensor::normal({6, 5}, 0.0, 2.0, gen, DType::f64);
    const Tensor weight = Tensor::uniform({5}, 0.5, 2.0, gen, DType::f64);
    const Tensor targets = labels({0, 4, 2, 2, 1, 3});
    for (const Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
        const Tensor ce = cross_entropy(logits, targets, weight, {.reduction = reduction, .ignore_index = 2});
        const Tensor nll =
            nll_loss(log_softmax(logits, 1), targets, weight, {.reduction = reduction, .ignore_index = 2});
        const std::vector<double> a = ce.to_vector(), b = nll.to_vector();
        REQUIRE(a.size() == b.size());
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).epsilon(1e-12));
    }
}

TEST_CASE("the stable forms stay finite for extreme logits", "[losses]") {
    const Tensor logits = Tensor::from_vector(std::vector<double>{-1000.0, 1000.0, 0.0, 80.0}, {4});
    const Tensor target = Tensor::from_vector(std::vector<double>{1.0, 0.0, 0.5, 1.0}, {4});
    const Tensor pos_weight = Tensor::from_vector(std::vector<double>{3.0}, {1});
    const Tensor loss =
        binary_cross_entropy_with_logits(logits, target, Tensor(), pos_weight, Reduction::None);
    const std::vector<double> l = loss.to_vector();
    CHECK(l[0] == Approx(3.0 * 1000.0));  // pos_weight · softplus(1000)
    CHECK(l[1] == Approx(1000.0));
    CHECK(l[2] == Approx(0.5 * 0.0 + (1.0 + 2.0 * 0.5) * std::log(2.0)));
    CHECK(std::isfinite(l[3]));
    const Tensor wide = Tensor::from_vector(std::vector<double>{1000.0, -1000.0, 0.0}, {1, 3});
    CHECK(cross_entropy(wide, labels({1}), {.label_smoothing = 0.1}).item() ==
          Approx(0.9 * 2000.0 + 0.1 / 3.0 * (0.0 + 2000.0 + 1000.0)));
}

TEST_CASE("empty inputs: Sum is 0 and None is empty (the Mean is a ShapeError)", "[losses]") {
    const Tensor empty = Tensor::zeros({0, 3}, DType::f64);
    CHECK(l1_loss(empty, empty, Reduction::Sum).item() == 0.0);
    CHECK(smooth_l1_loss(empty, empty, Reduction::None).shape() == Shape{0, 3});
    CHECK(binary_cross_entropy_with_logits(empty, empty, Reduction::Sum).item() == 0.0);
    CHECK_THROWS_AS(l1_loss(empty, empty), ShapeError);
    ComputeGraph graph;
    Var p = graph.input(empty, "prediction", true);
    Var t = graph.input(empty, "target", true);
    Var loss = sum(l1_loss(p, t, Reduction::None));
    graph.backward(loss);
    CHECK(p.grad().shape() == Shape{0, 3});
}

TEST_CASE("smooth_l1 with beta 0 is l1; eager results equal the recorded ones", "[losses]") {
    Generator gen(13);
    const Tensor a = Tensor::normal({5, 7}, 0.0, 1.0, gen);
    const Tensor b = Tensor::normal({5, 7}, 0.0, 1.0, gen);
    CHECK(smooth_l1_loss(a, b, Reduction::Sum, 0.0).item() == l1_loss(a, b, Reduction::Sum).item());
    ComputeGraph graph;
    const Var pa = graph.input(a), pb = graph.input(b);
    CHECK(smooth_l1_loss(pa, pb, Reduction::Mean, 0.7).item() == smooth_l1_loss(a, b, Reduction::Mean, 0.7).item());
    CHECK(binary_cross_entropy_with_logits(pa, pb).item() == binary_cross_entropy_with_logits(a, b).item());
}
