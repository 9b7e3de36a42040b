// Bad inputs: each is a typed exception whose message names the op, the shapes, dtypes or devices
// involved and where the node was created. The library never aborts: every case here is caught.
#include <cmath>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::labels;
using dgtest::ApproxVector;
using dgtest::MessageHas;

namespace {
dgtest::NormalDraws randn(1234, DType::f32);
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
    if (cuda_compiled()) DG_SKIP("only meaningful in a build without the CUDA backend");
    CHECK_THROWS_MATCHES(Tensor::zeros({2, 2}, DType::f32, Device::cuda(0)), DeviceError,
                         MessageHas({"cuda:0", "CUDA"}));
    CHECK_THROWS_AS(randn({2}).to(Device::cuda(0)), DeviceError);
}

TEST_CASE("inputs on different devices", "[errors][device]") {
    if (cuda_device_count() == 0) DG_SKIP("needs a CUDA device");
    ComputeGraph graph;
    Var a = graph.input(randn({2, 2}), "a");
    Var b = graph.input(randn({2, 2}).to(Device::cuda(0)), "b");
    CHECK_THROWS_MATCHES(add(a, b), DeviceError, MessageHas({"add", "cpu", "cuda:0"}));
    CHECK_THROWS_MATCHES(matmul(b, a), DeviceError, MessageHas({"matmul", "cpu", "cuda:0"}));
}

// ---- every op family: shapes that do not fit ----

TEST_CASE("conv2d shapes that do not fit", "[errors][shape][conv]") {
    ComputeGraph graph;
    Var x = graph.input(randn({2, 3, 8, 8}), "x", true);
    SECTION("channel mismatch") {
        Var w = graph.input(randn({4, 2, 3, 3}), "w");
        CHECK_THROWS_MATCHES(conv2d(x, w), ShapeError,
                             MessageHas({"conv2d", "input has 3 channels, weight expects 2", "(2,3,8,8)", "(4,2,3,3)",
                                         "test_errors.cpp"}));
    }
    SECTION("output channels that do not split into the groups") {
        Var w = graph.input(randn({5, 1, 3, 3}), "w");
        CHECK_THROWS_MATCHES(conv2d(x, w, {.groups = 3}), ShapeError,
                             MessageHas({"conv2d", "5 output channels do not split into 3 groups"}));
    }
    SECTION("bias of the wrong length") {
        Var w = graph.input(randn({4, 3, 3, 3}), "w");
        Var b = graph.input(randn({5}), "b");
        CHECK_THROWS_MATCHES(conv2d(x, w, b), ShapeError, MessageHas({"conv2d", "bias (5) for 4 output channels"}));
    }
    SECTION("window larger than the input") {
        Var w = graph.input(randn({4, 3, 9, 3}), "w");
        CHECK_THROWS_MATCHES(conv2d(x, w), ShapeError,
                             MessageHas({"conv2d", "height", "window 9", "larger than the padded input 8"}));
        Var dilated = graph.input(randn({4, 3, 3, 3}), "dilated");
        CHECK_THROWS_MATCHES(conv2d(x, dilated, {.dilation = {1, 4}}), ShapeError,
                             MessageHas({"conv2d", "width", "window 9", "dilation 4"}));
    }
    SECTION("ranks") {
        Var image = graph.input(randn({3, 8, 8}), "image");
        Var w = graph.input(randn({4, 3, 3, 3}), "w");
        CHECK_THROWS_MATCHES(conv2d(image, w), ShapeError, MessageHas({"conv2d", "(N,C,H,W)", "(3,8,8)"}));
    }
    SECTION("dtypes") {
        Var w = graph.input(randn({4, 3, 3, 3}, DType::f64), "w");
        CHECK_THROWS_MATCHES(conv2d(x, w), DTypeError, MessageHas({"conv2d", "float32", "float64", "weight"}));
    }
}

TEST_CASE("pooling windows larger than the input", "[errors][shape][pool]") {
    ComputeGraph graph;
    Var x = graph.input(randn({1, 2, 3, 5}), "x", true);
    CHECK_THROWS_MATCHES(max_pool2d(x, {4, 2}), ShapeError,
                         MessageHas({"max_pool2d", "height", "window 4", "padded input 3", "(1,2,3,5)",
                                     "test_errors.cpp"}));
    CHECK_THROWS_MATCHES(avg_pool2d(x, {2, 6}), ShapeError,
                         MessageHas({"avg_pool2d", "width", "window 6", "padded input 5"}));
    // Padding widens the input: the same window then fits.
    CHECK(max_pool2d(x, {4, 2}, {1, 1}, {2, 0}).shape() == Shape{1, 2, 4, 4});
    Var flat = graph.input(randn({2, 5}), "flat");
    CHECK_THROWS_MATCHES(max_pool2d(flat, {2, 2}), ShapeError, MessageHas({"max_pool2d", "(N,C,H,W)", "(2,5)"}));
    Var ints = graph.input(Tensor::zeros({1, 1, 4, 4}, DType::i64), "ints");
    CHECK_THROWS_MATCHES(avg_pool2d(ints, {2, 2}), DTypeError, MessageHas({"avg_pool2d", "int64"}));
}

TEST_CASE("batch_norm parameters that do not match the channels", "[errors][shape][norm]") {
    ComputeGraph graph;
    Var x = graph.input(randn({4, 3}), "x", true);
    Var gamma = graph.input(Tensor::ones({3}), "gamma", true);
    Var beta = graph.input(Tensor::zeros({3}), "beta", true);
    const Tensor mean = Tensor::zeros({3}), var = Tensor::ones({3});
    Var short_gamma = graph.input(Tensor::ones({2}), "gamma2", true);
    CHECK_THROWS_MATCHES(batch_norm(x, short_gamma, beta, mean, var, true), ShapeError,
                         MessageHas({"batch_norm", "gamma (2) does not match x (4,3)", "expected (3)",
                                     "test_errors.cpp"}));
    CHECK_THROWS_MATCHES(batch_norm(x, gamma, beta, Tensor::zeros({4}), var, false), ShapeError,
                         MessageHas({"batch_norm", "running_mean (4)"}));
    Var volume = graph.input(randn({2, 3, 4}), "volume");
    CHECK_THROWS_MATCHES(batch_norm(volume, gamma, beta, mean, var, true), ShapeError,
                         MessageHas({"batch_norm", "(N,C) or (N,C,H,W)", "(2,3,4)"}));
    Var gamma64 = graph.input(Tensor::ones({3}, DType::f64), "gamma64");
    CHECK_THROWS_MATCHES(batch_norm(x, gamma64, beta, mean, var, true), DTypeError,
                         MessageHas({"batch_norm", "gamma is float64 but x is float32"}));
    Var one = graph.input(randn({1, 3}), "one");
    CHECK_THROWS_MATCHES(batch_norm(one, gamma, beta, mean, var, true), ValueError,
                         MessageHas({"batch_norm", "N·H·W > 1"}));
}

TEST_CASE("more dtype mismatches name both dtypes", "[errors][dtype]") {
    ComputeGraph graph;
    Var x = graph.input(randn({5, 4}), "x");
    Var w = graph.input(randn({3, 4}, DType::f64), "w");
    Var b = graph.input(randn({3}), "b");
    CHECK_THROWS_MATCHES(linear(x, w, b), DTypeError,
                         MessageHas({"linear", "x is float32 but weight is float64", "test_errors.cpp"}));
    Var logits = graph.input(randn({2, 3}), "logits");
    CHECK_THROWS_MATCHES(cross_entropy(logits, logits), DTypeError,
                         MessageHas({"cross_entropy", "labels must be int64, got float32"}));
    Var rank3 = graph.input(randn({2, 3, 4}), "rank3");
    CHECK_THROWS_MATCHES(cross_entropy(rank3, graph.input(labels({0, 1}))), ShapeError,
                         MessageHas({"cross_entropy at test_errors.cpp:", "labels (2) do not match input (2,3,4)",
                                     "expected (2,4)"}));
}

TEST_CASE("checks made before a node is recorded name the call site", "[errors][graph]") {
    ComputeGraph graph;
    Var v = graph.input(randn({3}), "v");
    CHECK_THROWS_MATCHES(flatten(v), ShapeError, MessageHas({"flatten at test_errors.cpp:", "rank >= 2", "(3)"}));
    CHECK_THROWS_MATCHES(div_scalar(v, 0.0), ValueError, MessageHas({"div_scalar at test_errors.cpp:", "zero"}));
    CHECK_THROWS_MATCHES(graph.parameter(Parameter()), ValueError,
                         MessageHas({"parameter at test_errors.cpp:", "undefined"}));
}

// ---- conv/pool attributes ----

TEST_CASE("conv and pool attributes that are negative or zero", "[errors][value]") {
    ComputeGraph graph;
    Var x = graph.input(randn({1, 2, 6, 6}), "x");
    Var w = graph.input(randn({2, 2, 3, 3}), "w");
    SECTION("conv2d") {
        CHECK_THROWS_MATCHES(conv2d(x, w, {.stride = {0, 1}}), ValueError,
                             MessageHas({"conv2d", "stride (0,1) must be positive", "test_errors.cpp"}));
        CHECK_THROWS_MATCHES(conv2d(x, w, {.stride = {1, -2}}), ValueError, MessageHas({"conv2d", "stride (1,-2)"}));
        CHECK_THROWS_MATCHES(conv2d(x, w, {.padding = {-1, 0}}), ValueError,
                             MessageHas({"conv2d", "padding (-1,0) must not be negative"}));
        CHECK_THROWS_MATCHES(conv2d(x, w, {.dilation = {0, 1}}), ValueError,
                             MessageHas({"conv2d", "dilation (0,1) must be positive"}));
        CHECK_THROWS_MATCHES(conv2d(x, w, {.groups = 0}), ValueError,
                             MessageHas({"conv2d", "groups must be positive, got 0"}));
        CHECK_THROWS_MATCHES(conv2d(x, w, {.groups = -2}), ValueError, MessageHas({"conv2d", "got -2"}));
    }
    SECTION("pooling") {
        CHECK_THROWS_MATCHES(max_pool2d(x, {0, 2}), ValueError,
                             MessageHas({"max_pool2d", "kernel (0,2) must be positive", "test_errors.cpp"}));
        CHECK_THROWS_MATCHES(avg_pool2d(x, {2, -3}), ValueError, MessageHas({"avg_pool2d", "kernel (2,-3)"}));
        CHECK_THROWS_MATCHES(max_pool2d(x, {2, 2}, {-1, 1}), ValueError,
                             MessageHas({"max_pool2d", "stride (-1,1) must be positive"}));
        CHECK_THROWS_MATCHES(avg_pool2d(x, {2, 2}, {2, 2}, {-1, 0}), ValueError,
                             MessageHas({"avg_pool2d", "padding (-1,0)", "[0, kernel/2]"}));
        CHECK_THROWS_MATCHES(max_pool2d(x, {2, 2}, {2, 2}, {2, 0}), ValueError,
                             MessageHas({"max_pool2d", "padding (2,0)", "kernel (2,2)"}));
        // A zero stride is the documented shorthand for stride = kernel.
        CHECK(max_pool2d(x, {3, 3}, {0, 0}).shape() == Shape{1, 2, 2, 2});
    }
}

// ---- empty tensors and zero-size batches ----
//
// The policy, the same on every backend (the shape rules decide it): an op whose result is defined on
// zero elements returns it — an empty tensor, or the zeros of a sum or of a product over an empty inner
// dimension — and its backward returns empty (or zero) gradients. An op that would average over zero
// elements throws ShapeError naming the empty shape: mean over an empty axis, cross_entropy and mse_loss
// (means over the batch), batch_norm's batch statistics in training; so does max over an empty axis
// (there is no maximum of nothing) and conv2d with zero channels (a weight with no fan-in).

TEST_CASE("empty tensors through linear algebra", "[errors][empty]") {
    ComputeGraph graph;
    SECTION("zero-size batch") {
        Var x = graph.input(Tensor::zeros({0, 4}, DType::f64), "x", true);
        Var w = graph.input(randn({3, 4}, DType::f64), "w", true);
        Var b = graph.input(randn({3}, DType::f64), "b", true);
        Var y = linear(x, w, b);
        CHECK(y.shape() == Shape{0, 3});
        CHECK(matmul(x, transpose(w)).shape() == Shape{0, 3});
        graph.backward(sum(y));
        CHECK(x.grad().shape() == Shape{0, 4});
        CHECK_THAT(w.grad().to_vector(), ApproxVector(std::vector<double>(12, 0.0)));
        CHECK_THAT(b.grad().to_vector(), ApproxVector({0, 0, 0}));
    }
    SECTION("empty inner dimension: the product is zeros") {
        Var a = graph.input(Tensor::zeros({2, 0}, DType::f64), "a", true);
        Var b = graph.input(Tensor::zeros({0, 3}, DType::f64), "b", true);
        Var y = matmul(a, b);
        CHECK(y.shape() == Shape{2, 3});
        CHECK(y.value().to_vector() == std::vector<double>(6, 0.0));
        graph.backward(sum(y));
        CHECK(a.grad().shape() == Shape{2, 0});
        CHECK(b.grad().shape() == Shape{0, 3});
    }
    SECTION("batched, transpose, reshape, flatten") {
        Var a = graph.input(Tensor::zeros({0, 2, 3}), "a");
        Var b = graph.input(Tensor::zeros({0, 3, 4}), "b");
        CHECK(matmul(a, b).shape() == Shape{0, 2, 4});
        CHECK(transpose(a, 0, 2).shape() == Shape{3, 2, 0});
        CHECK(reshape(a, {-1, 3}).shape() == Shape{0, 3});
        CHECK(flatten(a).shape() == Shape{0, 6});
        CHECK_THROWS_MATCHES(reshape(a, {-1, 0}), ShapeError, MessageHas({"reshape", "(0,2,3)"}));
    }
}

TEST_CASE("empty tensors through reductions and losses", "[errors][empty]") {
    ComputeGraph graph;
    Var x = graph.input(Tensor::zeros({0, 3}, DType::f64), "x", true);
    CHECK(sum(x).item() == 0);
    CHECK(mean(x, {1}).shape() == Shape{0});
    CHECK_THROWS_MATCHES(mean(x), ShapeError,
                         MessageHas({"mean", "all axes of (0,3) averages zero elements", "test_errors.cpp"}));
    CHECK_THROWS_MATCHES(mean(x, {0}), ShapeError, MessageHas({"mean", "axes (0)", "zero elements"}));
    CHECK(max(x, 1).shape() == Shape{0});
    CHECK_THROWS_MATCHES(max(x, 0), ShapeError, MessageHas({"max", "axis 0 of (0,3) is empty"}));
    CHECK(softmax(x).shape() == Shape{0, 3});
    CHECK(log_softmax(x, 0).shape() == Shape{0, 3});
    Var no_classes = graph.input(Tensor::zeros({2, 0}, DType::f64), "no_classes");
    CHECK(softmax(no_classes, 1).shape() == Shape{2, 0});

    Var logits = graph.input(Tensor::zeros({0, 5}), "logits", true);
    Var y = graph.input(labels({}), "labels");
    CHECK_THROWS_MATCHES(cross_entropy(logits, y), ShapeError, MessageHas({"cross_entropy", "(0,5)", "empty"}));
    Var p = graph.input(Tensor::zeros({0, 2}), "p", true);
    CHECK_THROWS_MATCHES(mse_loss(p, p), ShapeError, MessageHas({"mse_loss", "empty", "(0,2)"}));

    graph.backward(sum(softmax(x)));
    CHECK(x.grad().shape() == Shape{0, 3});
}

namespace {

// A zero-size batch through conv2d, both poolings, batch_norm (eval) and dropout, then backward: empty
// outputs and input gradients, zero parameter gradients. Shared by the CPU and the GPU test.
void check_empty_batch_network(Device device, DType dtype) {
    ComputeGraph graph;
    Var x = graph.input(Tensor::zeros({0, 2, 6, 6}, dtype, device), "x", true);
    Var w = graph.input(randn({3, 2, 3, 3}, dtype).to(device), "w", true);
    Var b = graph.input(randn({3}, dtype).to(device), "b", true);
    Var c = conv2d(x, w, b, {.padding = {1, 1}});
    CHECK(c.shape() == Shape{0, 3, 6, 6});
    Var m = max_pool2d(c, {2, 2});
    CHECK(m.shape() == Shape{0, 3, 3, 3});
    Var a = avg_pool2d(m, {3, 3});
    CHECK(a.shape() == Shape{0, 3, 1, 1});
    Var gamma = graph.input(Tensor::ones({3}, dtype, device), "gamma", true);
    Var beta = graph.input(Tensor::zeros({3}, dtype, device), "beta", true);
    const Tensor mean = Tensor::zeros({3}, dtype, device), var = Tensor::ones({3}, dtype, device);
    Var n = batch_norm(a, gamma, beta, mean, var, false);
    CHECK(n.shape() == Shape{0, 3, 1, 1});
    CHECK_THROWS_MATCHES(batch_norm(a, gamma, beta, mean, var, true), ShapeError,
                         MessageHas({"batch_norm", "non-empty batch", "(0,3,1,1)", "test_errors.cpp"}));
    Var d = dropout(n, 0.5, true, 7);
    CHECK(d.shape() == Shape{0, 3, 1, 1});
    Var flat = flatten(d);
    Var fc = graph.input(randn({4, 3}, dtype).to(device), "fc", true);
    Var logits = linear(flat, fc, graph.input(Tensor::zeros({4}, dtype, device), "fc_bias", true));
    CHECK(logits.shape() == Shape{0, 4});
    Var total = sum(log_softmax(logits));
    CHECK(total.item() == 0);
    graph.backward(total);
    CHECK(x.grad().shape() == Shape{0, 2, 6, 6});
    CHECK(x.grad().device() == device);
    CHECK_THAT(w.grad().to_vector(), ApproxVector(std::vector<double>(54, 0.0)));
    CHECK_THAT(b.grad().to_vector(), ApproxVector({0, 0, 0}));
    CHECK_THAT(gamma.grad().to_vector(), ApproxVector({0, 0, 0}));
    CHECK_THAT(fc.grad().to_vector(), ApproxVector(std::vector<double>(12, 0.0)));
    // An empty inner dimension: the product is zeros.
    Var k0 = matmul(graph.input(Tensor::zeros({2, 0}, dtype, device)),
                    graph.input(Tensor::zeros({0, 3}, dtype, device)));
    CHECK(k0.value().to_vector() == std::vector<double>(6, 0.0));
}

}  // namespace

TEST_CASE("empty tensors through conv, pool, batch_norm and dropout", "[errors][empty]") {
    SECTION("zero-size batch") { check_empty_batch_network(Device::cpu(), DType::f64); }
    SECTION("empty planes and channels") {
        ComputeGraph graph;
        Var no_rows = graph.input(Tensor::zeros({1, 1, 0, 4}), "no_rows");
        CHECK_THROWS_MATCHES(max_pool2d(no_rows, {2, 2}), ShapeError,
                             MessageHas({"max_pool2d", "window 2", "padded input 0"}));
        Var no_channels = graph.input(Tensor::zeros({1, 0, 4, 4}), "no_channels");
        Var w = graph.input(Tensor::zeros({2, 0, 3, 3}), "w");
        CHECK_THROWS_MATCHES(conv2d(no_channels, w), ShapeError, MessageHas({"conv2d", "at least one channel"}));
        CHECK(avg_pool2d(no_channels, {2, 2}).shape() == Shape{1, 0, 2, 2});
    }
}

TEST_CASE("empty tensors on the GPU", "[errors][empty][device]") {
    if (cuda_device_count() == 0) DG_SKIP("needs a CUDA device");
    check_empty_batch_network(Device::cuda(0), DType::f32);
}

// ---- labels, NaN and Inf ----

TEST_CASE("labels out of range name the node, in forward and in backward", "[errors][loss]") {
    ComputeGraph graph;
    Var logits = graph.input(randn({2, 3}), "logits", true);
    Tensor label_values = labels({0, 7});
    CHECK_THROWS_MATCHES(cross_entropy(logits, graph.input(label_values, "labels")), IndexError,
                         MessageHas({"cross_entropy", "label 7 at row 1", "3 classes", "test_errors.cpp",
                                     "(2,3) float32 cpu", "(2) int64 cpu"}));
    // A label changed in place after the forward is an in-place write the backward refuses (version counter)...
    Tensor changing = labels({0, 2});
    Var loss = cross_entropy(logits, graph.input(changing, "labels"));
    changing.set({1}, 3);
    CHECK_THROWS_MATCHES(graph.backward(loss), GraphError,
                         MessageHas({"backward of cross_entropy", "'labels'", "modified in place"}));
    // ...and the backward still checks the labels it reads: one written through a raw pointer is caught there.
    changing.data<std::int64_t>()[1] = 2;
    Var raw_loss = cross_entropy(logits, graph.input(changing, "labels"));
    changing.data<std::int64_t>()[1] = 3;
    CHECK_THROWS_MATCHES(graph.backward(raw_loss), IndexError,
                         MessageHas({"backward of cross_entropy", "test_errors.cpp", "label 3 at row 1"}));
    // The GPU kernels report the same through the device error record: tests/gpu/test_gpu.cpp.
}

TEST_CASE("NaN and Inf inputs propagate by default", "[errors][nan]") {
    // Without anomaly mode (tests/graph/test_anomaly.cpp) a NaN or Inf is a value like any other: no op throws,
    // and it reaches the outputs and the gradients it touches.
    const double nan = std::nan(""), inf = HUGE_VAL;
    ComputeGraph graph;
    Var x = graph.input(Tensor::from_vector(std::vector<double>{1, nan, 2, inf}, {2, 2}, DType::f64), "x", true);
    Var w = graph.input(Tensor::ones({2, 2}, DType::f64), "w", true);
    const auto has_nan = [](const Var& v) {
        for (double e : v.value().to_vector())
            if (std::isnan(e)) return true;
        return false;
    };
    CHECK(has_nan(x + w));
    CHECK(has_nan(matmul(x, w)));
    CHECK(has_nan(softmax(x)));
    CHECK(std::isnan(max(x, 1).value().at({0})));
    CHECK(std::isinf(exp(x).value().at({1, 1})));
    CHECK(std::isnan(sub(x, x).value().at({1, 1})));  // inf - inf
    Var image = reshape(x, {1, 1, 2, 2});
    CHECK(has_nan(max_pool2d(image, {2, 2})));
    CHECK(has_nan(conv2d(image, reshape(w, {1, 1, 2, 2}))));
    Var loss = mse_loss(x, w);
    CHECK(std::isnan(loss.item()));
    REQUIRE_NOTHROW(graph.backward(loss));
    CHECK(std::isnan(w.grad().at({0, 1})));
    CHECK(std::isinf(w.grad().at({1, 1})));
    CHECK(x.grad().at({1, 0}) == dgtest::Approx(0.5));  // 2 (x - w) / 4 where both are finite
}

// ---- graph misuse ----

TEST_CASE("backward on a non-scalar without a gradient names the node", "[errors][graph]") {
    ComputeGraph graph;
    Var x = graph.input(randn({2, 3}), "x", true);
    Var y = x * 3.0;
    const int line = __LINE__ - 1;
    CHECK_THROWS_MATCHES(graph.backward(y), GraphError,
                         MessageHas({"backward", "mul_scalar", str("test_errors.cpp:", line), "(2,3)",
                                     "explicit gradient"}));
}

TEST_CASE("backward twice over freed intermediates names the node", "[errors][graph]") {
    ComputeGraph graph;
    Var x = graph.input(randn({3}), "x", true);
    Var loss = sum(exp(x));
    const int line = __LINE__ - 1;
    graph.backward(loss);
    CHECK_THROWS_MATCHES(graph.backward(loss), GraphError,
                         MessageHas({"backward from sum", str("test_errors.cpp:", line), "already back-propagated",
                                     "retain_graph"}));
}

TEST_CASE("a handle from a cleared graph", "[errors][graph]") {
    ComputeGraph graph;
    Var x = graph.input(randn({3}), "x", true);
    Var y = relu(x);
    graph.clear();
    CHECK_THROWS_MATCHES(y.value(), GraphError, MessageHas({"Var #1", "cleared"}));
    CHECK_THROWS_MATCHES(relu(y), GraphError, MessageHas({"Var #1", "cleared"}));
    Var fresh = graph.input(randn({3}), "fresh", true);
    CHECK_THROWS_MATCHES(add(fresh, x), GraphError,
                         MessageHas({"add", "test_errors.cpp", "input 1 (Var #0)", "before this graph was cleared"}));
    CHECK_THROWS_MATCHES(graph.backward(y), GraphError, MessageHas({"backward", "loss (Var #1)", "cleared"}));
}

TEST_CASE("a parameter used in two graphs at once", "[errors][graph]") {
    // The rule and its releases in detail: tests/graph/test_graph.cpp.
    Parameter w(randn({2}), "w");
    ComputeGraph first, second;
    Var in_first = first.parameter(w);
    const int line = __LINE__ - 1;
    CHECK_THROWS_MATCHES(second.parameter(w), GraphError,
                         MessageHas({"parameter 'w' (2) float32 cpu", "test_errors.cpp",
                                     "another graph's pending forward pass",
                                     str("recorded there at test_errors.cpp:", line), "backward()", "clear()"}));
    first.backward(sum(in_first));
    CHECK_NOTHROW(second.parameter(w));
}

// ---- devices ----

TEST_CASE("CPU tensors into GPU ops", "[errors][device]") {
    if (cuda_device_count() == 0) DG_SKIP("needs a CUDA device");
    const Device gpu = Device::cuda(0);
    ComputeGraph graph;
    Var x = graph.input(randn({2, 3, 6, 6}).to(gpu), "x");
    Var w = graph.input(randn({4, 3, 3, 3}), "w");
    CHECK_THROWS_MATCHES(conv2d(x, w), DeviceError, MessageHas({"conv2d", "cpu", "cuda:0", "test_errors.cpp"}));
    Var logits = graph.input(randn({2, 3}).to(gpu), "logits");
    CHECK_THROWS_MATCHES(cross_entropy(logits, graph.input(labels({0, 1}), "labels")), DeviceError,
                         MessageHas({"cross_entropy", "(2,3) float32 cuda:0", "(2) int64 cpu"}));
    Parameter p(randn({4, 6}), "p");
    Var rows = graph.input(randn({5, 6}).to(gpu), "rows");
    CHECK_THROWS_MATCHES(linear(rows, graph.parameter(p)), DeviceError, MessageHas({"cpu", "cuda:0"}));
}

// Truncated and corrupt files (wrong magic, wrong sizes, truncated payload) are IoErrors naming the file
// and the problem: IDX in tests/data/test_data.cpp ("malformed IDX files throw IoError naming the file and the
// problem"), safetensors in tests/nn/test_training.cpp ("malformed safetensors files throw IoError and change
// nothing").

TEST_CASE("rethrow_with_context outside a catch block is a ValueError, not std::terminate (issue 35)", "[errors]") {
    CHECK_THROWS_MATCHES(rethrow_with_context("loading the model"), ValueError,
                         MessageHas({"rethrow_with_context", "loading the model", "no exception is being handled"}));
    // Inside a catch block it keeps the type, DistributedError included, and prepends the context.
    const auto rethrown = [](auto error) {
        try {
            throw error;
        } catch (...) {
            rethrow_with_context("step 3");
        }
    };
    CHECK_THROWS_MATCHES(rethrown(DistributedError("all_reduce timed out")), DistributedError,
                         MessageHas({"step 3: all_reduce timed out"}));
    CHECK_THROWS_MATCHES(rethrown(ShapeError("(2,3) vs (4)")), ShapeError, MessageHas({"step 3: (2,3)"}));
    CHECK_THROWS_MATCHES(rethrown(std::runtime_error("disk full")), Error, MessageHas({"step 3: disk full"}));
}
