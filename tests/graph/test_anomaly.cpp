// Anomaly mode (graph/anomaly.h): off by default; under AnomalyModeGuard the first NaN or Inf of a
// forward value or of a gradient throws NumericalError naming the node, its creation site and the
// statistics of the tensors involved. Plus the tensor statistics it is built on.
#include <cmath>
#include <thread>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::f64;
using dgtest::kInf;
using dgtest::kNaN;
using dgtest::MessageHas;

TEST_CASE("tensor statistics count NaN and Inf and bound the finite values", "[anomaly][stats]") {
    const TensorStats mixed = tensor_stats(f64({-1, kNaN, kInf, 2, -kInf, 0.5}));
    CHECK(mixed.numel == 6);
    CHECK(mixed.nan_count == 1);
    CHECK(mixed.inf_count == 2);
    CHECK(mixed.min == -1);
    CHECK(mixed.max == 2);
    CHECK_FALSE(mixed.all_finite());
    CHECK(to_string(mixed) == "min -1 max 2, 1 NaN, 2 Inf (of 6)");

    const TensorStats floats = tensor_stats(Tensor::of({3, -4, 1}));
    CHECK(floats.all_finite());
    CHECK(floats.min == -4);
    CHECK(floats.max == 3);

    const TensorStats none_finite = tensor_stats(f64({kNaN, kInf}));
    CHECK(std::isnan(none_finite.min));
    CHECK(std::isnan(none_finite.max));

    const TensorStats ints = tensor_stats(Tensor::from_vector(std::vector<std::int64_t>{7, -3, 9}, {3}));
    CHECK(ints.all_finite());
    CHECK(ints.min == -3);
    CHECK(ints.max == 9);

    const TensorStats empty = tensor_stats(Tensor::zeros({0, 4}));
    CHECK(empty.numel == 0);
    CHECK(empty.all_finite());
    CHECK_THROWS_AS(tensor_stats(Tensor()), ValueError);
}

TEST_CASE("anomaly mode is off by default: NaN propagates", "[anomaly]") {
    CHECK_FALSE(anomaly_mode_enabled());
    ComputeGraph graph;
    Var x = graph.input(f64({-1, 4}), "x", true);
    Var y = sum(log(x) + sqrt(x - 4.0));
    CHECK(std::isnan(y.item()));
    REQUIRE_NOTHROW(graph.backward(y));
    CHECK(std::isnan(x.grad().at({0})));
}

TEST_CASE("anomaly mode catches a NaN in the forward at the node that made it", "[anomaly]") {
    ComputeGraph graph;
    Var x = graph.input(f64({-1, 2, 3}), "x", true);
    Var h = x * 2.0;
    AnomalyModeGuard anomaly;
    CHECK(anomaly_mode_enabled());
    const std::size_t nodes = graph.size();
    const int line = __LINE__ + 1;
    CHECK_THROWS_MATCHES(log(h), NumericalError,
                         MessageHas({"log (new node #2", str("test_anomaly.cpp:", line), "anomaly mode",
                                     "output (3) float64 cpu: min 1.38629 max 1.79176, 1 NaN, 0 Inf (of 3)",
                                     "input 0 (3) float64 cpu: min -2 max 6, 0 NaN, 0 Inf (of 3)"}));
    CHECK(graph.size() == nodes);  // the failed node was not recorded
    // NumericalError is a dyngrad::Error like every other failure.
    CHECK_THROWS_AS(log(h), Error);
    // Finite values pass through.
    CHECK(log(x * x).shape() == Shape{3});
}

TEST_CASE("anomaly mode blames the first node, not the ones a NaN flows into", "[anomaly]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, 0}), "x", true);
    AnomalyModeGuard anomaly;
    Var y = x - 1.0;
    CHECK_THROWS_MATCHES(div(x, y), NumericalError, MessageHas({"div", "1 Inf"}));
    // An input that already holds a NaN (a leaf made outside the graph) shows up in the statistics.
    Var bad = graph.input(f64({kNaN, 1}), "bad");
    CHECK_THROWS_MATCHES(exp(bad), NumericalError,
                         MessageHas({"exp", "input 0 (2) float64 cpu: min 1 max 1, 1 NaN, 0 Inf (of 2)"}));
}

TEST_CASE("anomaly mode catches an Inf gradient in the backward kernel that made it", "[anomaly]") {
    ComputeGraph graph;
    Var x = graph.input(f64({0, 4}), "x", true);
    AnomalyModeGuard anomaly;
    Var root = sqrt(x);  // finite forward; d/dx sqrt(x) = 1 / (2 sqrt(x)) is Inf at 0
    const int line = __LINE__ - 1;
    root.name("root");
    Var loss = sum(root);
    CHECK_THROWS_MATCHES(graph.backward(loss), NumericalError,
                         MessageHas({"backward of sqrt #1 'root'", str("test_anomaly.cpp:", line),
                                     "gradient for input 0 (leaf #0 'x'", "holds NaN/Inf",
                                     "gradient (2) float64 cpu: min 0.25 max 0.25, 0 NaN, 1 Inf (of 2)",
                                     "output gradient (2) float64 cpu: min 1 max 1",
                                     "output (2) float64 cpu: min 0 max 2",
                                     "input 0 (2) float64 cpu: min 0 max 4"}));
}

TEST_CASE("anomaly mode checks an explicit backward seed", "[anomaly]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, 2}), "x", true);
    Var y = x * 3.0;
    AnomalyModeGuard anomaly;
    CHECK_THROWS_MATCHES(graph.backward(y, f64({1, kNaN})), NumericalError,
                         MessageHas({"seeding the backward of mul_scalar", "1 NaN"}));
}

TEST_CASE("anomaly mode changes no result of a clean run", "[anomaly]") {
    Generator gen(3);
    const Tensor x = Tensor::normal({8, 5}, 0, 1, gen, DType::f64);
    const Tensor labels = Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0, 1}, {8});
    Parameter w(Tensor::normal({3, 5}, 0, 1, gen, DType::f64), "w");
    Parameter b(Tensor::zeros({3}, DType::f64), "b");
    const auto step = [&] {
        w.zero_grad();
        b.zero_grad();
        ComputeGraph graph;
        Var loss = cross_entropy(tanh(linear(graph.input(x), graph.parameter(w), graph.parameter(b))),
                                 graph.input(labels));
        graph.backward(loss);
        return std::vector<double>{loss.item(), w.grad().at({1, 2}), b.grad().at({2})};
    };
    const std::vector<double> plain = step();
    AnomalyModeGuard anomaly;
    CHECK(step() == plain);
}

TEST_CASE("the anomaly guard nests and is per thread", "[anomaly]") {
    CHECK_FALSE(anomaly_mode_enabled());
    {
        AnomalyModeGuard on;
        CHECK(anomaly_mode_enabled());
        bool other_thread = true;
        std::thread([&] { other_thread = anomaly_mode_enabled(); }).join();
        CHECK_FALSE(other_thread);
        {
            AnomalyModeGuard off(false);
            CHECK_FALSE(anomaly_mode_enabled());
            ComputeGraph graph;
            Var x = graph.input(f64({-1}), "x");
            CHECK(std::isnan(log(x).item()));
        }
        CHECK(anomaly_mode_enabled());
    }
    CHECK_FALSE(anomaly_mode_enabled());
}
