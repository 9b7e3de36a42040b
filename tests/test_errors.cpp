// Bad inputs: each is a typed exception whose message names the op, the shapes, dtypes or devices
// involved and where the node was created. The library never aborts: every case here is caught.
#include <cmath>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::ApproxVector;
using dgtest::MessageHas;

namespace {
Tensor randn(const Shape& shape, DType dtype = DType::f32) {
    static Generator gen(1234);
    return Tensor::normal(shape, 0.0, 1.0, gen, dtype);
}
Tensor labels(std::vector<std::int64_t> values) {
    const auto n = static_cast<std::int64_t>(values.size());
    return Tensor::from_vector(values, {n});
}
}  // namespace

TEST_CASE("shapes that do not broadcast", "[errors][shape]") {
    ComputeGraph graph;
    Var a = graph.input(randn({3, 4}), "a", true);
    Var b = graph.input(randn({5}), "b");
    CHECK_THROWS_MATCHES(add(a, b), ShapeError, MessageHas({"add", "(3,4)", "(5)", "test_errors.cpp"}));
    CHECK_THROWS_MATCHES(a * b, ShapeError, MessageHas({"mul", "(3,4)", "(5)"}));
    Var c = graph.input(randn({2, 1, 4}), "c");
    Var d = graph.input(randn({3, 2}), "d");
    CHECK_THROWS_MATCHES(sub(c, d), ShapeError, MessageHas({"sub", "(2,1,4)", "(3,2)"}));
    // A failed op leaves the graph usable.
    const std::size_t nodes = graph.size();
    CHECK_THROWS_AS(div(a, b), ShapeError);
    CHECK(graph.size() == nodes);
    CHECK(add(a, a).shape() == Shape{3, 4});
}

TEST_CASE("matrix products with mismatched dims", "[errors][shape]") {
    ComputeGraph graph;
    SECTION("matmul inner dims") {
        Var a = graph.input(randn({2, 3}), "a");
        Var b = graph.input(randn({4, 5}), "b");
        CHECK_THROWS_MATCHES(matmul(a, b), ShapeError, MessageHas({"matmul", "inner", "3", "4", "(2,3)", "(4,5)"}));
    }
    SECTION("matmul batch dims and ranks") {
        Var a = graph.input(randn({2, 3, 4}), "a");
        Var b = graph.input(randn({3, 4, 5}), "b");
        CHECK_THROWS_MATCHES(matmul(a, b), ShapeError, MessageHas({"matmul", "batch"}));
        Var m = graph.input(randn({4, 5}), "m");
        CHECK_THROWS_MATCHES(matmul(a, m), ShapeError, MessageHas({"matmul", "(2,3,4)", "(4,5)"}));
    }
    SECTION("linear weight and bias") {
        Var x = graph.input(randn({5, 4}), "x");
        Var w = graph.input(randn({3, 6}), "w");
        Var b = graph.input(randn({3}), "b");
        CHECK_THROWS_MATCHES(linear(x, w, b), ShapeError, MessageHas({"linear", "(5,4)", "(3,6)", "4", "6"}));
        Var w_ok = graph.input(randn({3, 4}), "w_ok");
        Var b_bad = graph.input(randn({2}), "b_bad");
        CHECK_THROWS_MATCHES(linear(x, w_ok, b_bad), ShapeError, MessageHas({"linear", "(2)"}));
        CHECK(linear(x, w_ok, b).shape() == Shape{5, 3});
        CHECK(linear(x, w_ok).shape() == Shape{5, 3});
    }
}

TEST_CASE("inputs of different dtypes", "[errors][dtype]") {
    ComputeGraph graph;
    Var a = graph.input(randn({2, 2}, DType::f32), "a");
    Var b = graph.input(randn({2, 2}, DType::f64), "b");
    CHECK_THROWS_MATCHES(add(a, b), DTypeError, MessageHas({"add", "float32", "float64"}));
    CHECK_THROWS_MATCHES(matmul(a, b), DTypeError, MessageHas({"matmul", "float32", "float64"}));
    CHECK_THROWS_MATCHES(mse_loss(a, b), DTypeError, MessageHas({"mse_loss", "float32", "float64"}));
}

TEST_CASE("int64 tensors into float ops", "[errors][dtype]") {
    ComputeGraph graph;
    Var i = graph.input(Tensor::from_vector(std::vector<std::int64_t>{1, -2, 3}, {3}), "ints");
    CHECK_THROWS_MATCHES(relu(i), DTypeError, MessageHas({"relu", "int64"}));
    CHECK_THROWS_MATCHES(exp(i), DTypeError, MessageHas({"exp", "int64"}));
    CHECK_THROWS_MATCHES(sum(i), DTypeError, MessageHas({"sum", "int64"}));
    CHECK_THROWS_MATCHES(add(i, i), DTypeError, MessageHas({"add", "int64"}));
    CHECK_THROWS_AS(graph.input(Tensor::zeros({2}, DType::i64), "labels", true), DTypeError);
    CHECK_THROWS_AS(Parameter(Tensor::zeros({2}, DType::i64), "w"), DTypeError);
    CHECK_THROWS_AS(Parameter(Tensor(), "w"), ValueError);
}

TEST_CASE("cross_entropy label checks", "[errors][loss]") {
    ComputeGraph graph;
    Var logits = graph.input(randn({2, 3}), "logits", true);
    SECTION("label out of range") {
        Var y = graph.input(labels({0, 7}), "labels");
        CHECK_THROWS_MATCHES(cross_entropy(logits, y), IndexError, MessageHas({"cross_entropy", "7", "3"}));
    }
    SECTION("negative label") {
        Var y = graph.input(labels({-1, 2}), "labels");
        CHECK_THROWS_MATCHES(cross_entropy(logits, y), IndexError, MessageHas({"cross_entropy", "-1"}));
    }
    SECTION("labels of the wrong dtype") {
        Var y = graph.input(Tensor::of({0, 1}), "labels");
        CHECK_THROWS_MATCHES(cross_entropy(logits, y), DTypeError, MessageHas({"cross_entropy", "int64", "float32"}));
    }
    SECTION("labels of the wrong length") {
        Var y = graph.input(labels({0, 1, 2}), "labels");
        CHECK_THROWS_MATCHES(cross_entropy(logits, y), ShapeError, MessageHas({"cross_entropy", "(3)", "(2,3)"}));
    }
    SECTION("valid labels work") {
        Var y = graph.input(labels({2, 0}), "labels");
        Var loss = cross_entropy(logits, y);
        CHECK(std::isfinite(loss.item()));
        graph.backward(loss);
        CHECK(logits.grad().shape() == Shape{2, 3});
    }
}

TEST_CASE("axes and shapes out of range", "[errors][shape]") {
    ComputeGraph graph;
    Var x = graph.input(randn({2, 3}), "x");
    CHECK_THROWS_MATCHES(reshape(x, {4, 2}), ShapeError, MessageHas({"reshape", "(2,3)", "(4,2)"}));
    CHECK_THROWS_AS(reshape(x, {-1, 4}), ShapeError);
    CHECK(reshape(x, {3, -1}).shape() == Shape{3, 2});
    CHECK_THROWS_MATCHES(sum(x, {2}), ShapeError, MessageHas({"sum", "axis 2"}));
    CHECK_THROWS_AS(sum(x, {-3}), ShapeError);
    CHECK_THROWS_AS(mean(x, {0, 5}), ShapeError);
    CHECK_THROWS_MATCHES(softmax(x, 2), ShapeError, MessageHas({"softmax", "axis"}));
    CHECK_THROWS_AS(log_softmax(x, -3), ShapeError);
    CHECK_THROWS_AS(max(x, 4), ShapeError);
    CHECK_THROWS_AS(transpose(x, 0, 2), ShapeError);
    Var y = graph.input(randn({3, 2}), "y");
    CHECK_THROWS_MATCHES(mse_loss(x, y), ShapeError, MessageHas({"mse_loss", "(2,3)", "(3,2)"}));
}

TEST_CASE("bad attribute values", "[errors][value]") {
    ComputeGraph graph;
    Var x = graph.input(randn({2, 3}), "x");
    CHECK_THROWS_AS(div_scalar(x, 0.0), ValueError);
    CHECK_THROWS_AS(clipped_relu(x, -1.0), ValueError);
    CHECK_THROWS_MATCHES(graph.record(OpType::Add, {x}, OpAttrs{}, std::source_location::current()), GraphError,
                         MessageHas({"add", "2 inputs"}));
}

TEST_CASE("log of negative numbers is NaN, not an error", "[errors][nan]") {
    ComputeGraph graph;
    Var x = graph.input(Tensor::of({-1, 2, 0}, DType::f64), "x", true);
    Var y = log(x);
    const std::vector<double> values = y.value().to_vector();
    CHECK(std::isnan(values[0]));
    CHECK(values[1] == dgtest::Approx(std::log(2.0)));
    CHECK(std::isinf(values[2]));
    Var total = sum(y);
    CHECK(std::isnan(total.item()));
    REQUIRE_NOTHROW(graph.backward(total));
    const std::vector<double> grad = x.grad().to_vector();
    CHECK(grad[0] == -1);
    CHECK(grad[1] == 0.5);
    CHECK(std::isinf(grad[2]));
}

TEST_CASE("empty tensors flow through ops", "[errors][empty]") {
    ComputeGraph graph;
    Var x = graph.input(Tensor::zeros({0, 3}, DType::f64), "x", true);
    Var b = graph.input(Tensor::of({1, 2, 3}, DType::f64), "b", true);
    Var s = add(x, x);
    CHECK(s.shape() == Shape{0, 3});
    CHECK(add(x, b).shape() == Shape{0, 3});
    Var r = relu(s);
    CHECK(r.shape() == Shape{0, 3});
    CHECK(r.value().numel() == 0);
    Var total = sum(r);
    CHECK(total.shape() == Shape{});
    CHECK(total.item() == 0);
    Var columns = sum(x, {0});
    CHECK(columns.shape() == Shape{3});
    CHECK(columns.value().to_vector() == std::vector<double>{0, 0, 0});
    CHECK(sum(x, {1}).shape() == Shape{0});
    graph.backward(sum(add(r, b)));
    CHECK(x.grad().shape() == Shape{0, 3});
    CHECK_THAT(b.grad().to_vector(), ApproxVector({0, 0, 0}));
}

TEST_CASE("CUDA tensors in a CPU-only build", "[errors][device]") {
    if (cuda_compiled()) return;  // only meaningful without the CUDA backend
    CHECK_THROWS_MATCHES(Tensor::zeros({2, 2}, DType::f32, Device::cuda(0)), DeviceError,
                         MessageHas({"cuda:0", "CUDA"}));
    CHECK_THROWS_AS(randn({2}).to(Device::cuda(0)), DeviceError);
}

TEST_CASE("inputs on different devices", "[errors][device]") {
    if (cuda_device_count() == 0) return;  // needs a GPU
    ComputeGraph graph;
    Var a = graph.input(randn({2, 2}), "a");
    Var b = graph.input(randn({2, 2}).to(Device::cuda(0)), "b");
    CHECK_THROWS_MATCHES(add(a, b), DeviceError, MessageHas({"add", "cpu", "cuda:0"}));
    CHECK_THROWS_MATCHES(matmul(b, a), DeviceError, MessageHas({"matmul", "cpu", "cuda:0"}));
}
