// Issue 11, classes 6, 7 and 10: the op contract checked where the engine calls every op (a user op
// that breaks its own shape rule or throws a non-std exception), NaN propagation through every ReLU
// variant and the precision of the saturating derivatives, and error messages that name the right thing.
#include <cmath>
#include <limits>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- user ops that break the contract, each in one way ----

OutputSpec same_shape(OpType, std::span<const Tensor> in, const OpAttrs&) { return {in[0].shape(), in[0].dtype()}; }
OutputSpec negative_shape(OpType, std::span<const Tensor> in, const OpAttrs&) {
    return {{in[0].size(0), -3}, in[0].dtype()};
}
OutputSpec throws_int_shape(OpType, std::span<const Tensor>, const OpAttrs&) { throw 42; }

Tensor copy_forward(const ForwardArgs& args) { return args.inputs[0].clone(); }
Tensor undefined_forward(const ForwardArgs&) { return Tensor(); }
Tensor flat_forward(const ForwardArgs& args) { return args.inputs[0].clone().reshaped({args.inputs[0].numel()}); }
Tensor f32_forward(const ForwardArgs& args) { return args.inputs[0].to(DType::f32); }
Tensor throws_int_forward(const ForwardArgs&) { throw 42; }

std::vector<Tensor> copy_backward(const BackwardArgs& args) { return {args.grad_output.clone()}; }
std::vector<Tensor> throws_int_backward(const BackwardArgs&) { throw 42; }
// A (2,2) gradient for a (5) input: it neither matches nor broadcasts.
std::vector<Tensor> square_gradient_backward(const BackwardArgs& args) {
    return {Tensor::ones({2, 2}, args.inputs[0].dtype())};
}

CustomOp define(const char* name, InferFn infer, ForwardFn forward, BackwardFn backward = copy_backward) {
    return CustomOp::define({.name = name, .arity = 1, .infer = infer, .cpu = {forward, backward}});
}

Tensor random(const Shape& shape, Generator& gen, DType dtype = DType::f64) {
    return Tensor::normal(shape, 0, 1, gen, dtype);
}

// Relative error of a float32 value against the float64 one.
double relative_error(double f32, double f64) { return std::abs(f32 - f64) / std::abs(f64); }

}  // namespace

// ---- class 6: the op contract ----

TEST_CASE("a custom forward whose output disagrees with its shape rule is refused at record time",
          "[trust][custom_op]") {
    static const CustomOp flat = define("flat_output", same_shape, flat_forward);
    static const CustomOp wrong_dtype = define("f32_output", same_shape, f32_forward);
    static const CustomOp undefined = define("undefined_output", same_shape, undefined_forward);
    Generator gen(61);
    ComputeGraph g;
    Var x = g.input(random({3, 4}, gen), "x", true);
    CHECK_THROWS_MATCHES(flat({x}), GraphError,
                         MessageHas({"custom op 'flat_output'", "its forward returned (12) float64",
                                     "its shape rule gave (3,4) float64"}));
    CHECK_THROWS_MATCHES(wrong_dtype({x}), GraphError,
                         MessageHas({"custom op 'f32_output'", "returned (3,4) float32", "gave (3,4) float64"}));
    // Class 10: an undefined output used to be recorded and blamed later on free_values.
    CHECK_THROWS_MATCHES(undefined({x}), GraphError,
                         MessageHas({"custom op 'undefined_output': its forward returned an undefined tensor",
                                     "(3,4) float64 cpu"}) &&
                             !MessageHas({"free_values"}));
    // Nothing was recorded: the graph still works.
    CHECK(g.size() == 1);
    CHECK_NOTHROW(g.backward(sum(mul(x, x))));
}

TEST_CASE("a shape rule returning a negative dimension is refused", "[trust][custom_op]") {
    static const CustomOp op = define("negative_rule", negative_shape, copy_forward);
    Generator gen(62);
    ComputeGraph g;
    Var x = g.input(random({2, 5}, gen));
    CHECK_THROWS_MATCHES(op({x}), ShapeError,
                         MessageHas({"custom op 'negative_rule'", "shape rule returned shape (2,-3)", "negative"}));
}

TEST_CASE("a non-std exception from a user's shape rule, forward or backward becomes dyngrad::Error",
          "[trust][custom_op]") {
    static const CustomOp in_infer = define("throws_in_infer", throws_int_shape, copy_forward);
    static const CustomOp in_forward = define("throws_in_forward", same_shape, throws_int_forward);
    static const CustomOp in_backward = define("throws_in_backward", same_shape, copy_forward, throws_int_backward);
    Generator gen(63);
    ComputeGraph g;
    Var x = g.input(random({4}, gen), "x", true);
    CHECK_THROWS_MATCHES(in_infer({x}), Error,
                         MessageHas({"custom op 'throws_in_infer'", "its shape rule threw", "not a std::exception"}));
    CHECK_THROWS_MATCHES(in_forward({x}), Error,
                         MessageHas({"custom op 'throws_in_forward'", "its forward threw", "not a std::exception"}));
    Var y = sum(in_backward({x}));
    CHECK_THROWS_MATCHES(g.backward(y), Error,
                         MessageHas({"backward of throws_in_backward", "custom op 'throws_in_backward'",
                                     "its backward threw", "not a std::exception"}));
}

TEST_CASE("a wrong-shaped custom gradient is reported as the gradient's shape against the input's",
          "[trust][custom_op]") {
    static const CustomOp op = define("square_gradient", same_shape, copy_forward, square_gradient_backward);
    Generator gen(64);
    ComputeGraph g;
    Var x = g.input(random({5}, gen), "x", true);
    Var y = sum(op({x}));
    CHECK_THROWS_MATCHES(g.backward(y), ShapeError,
                         MessageHas({"custom op 'square_gradient'", "its backward returned a gradient of shape (2,2)",
                                     "for input 0 of shape (5)"}));
}

// ---- class 7: NaN propagates through every ReLU ----

TEST_CASE("relu and clipped_relu propagate NaN forward and pass dy at NaN as PyTorch does", "[trust][nan]") {
    for (const DType dtype : {DType::f32, DType::f64}) {
        ComputeGraph g;
        Var x = g.input(Tensor::of({kNaN, -1.5, 0.0, 0.75, 7.0}, dtype), "x", true);
        Var r = relu(x);
        Var c = clipped_relu(x, 6.0);
        CHECK(std::isnan(r.value().at({0})));
        CHECK(std::isnan(c.value().at({0})));
        CHECK(r.value().at({1}) == 0);
        CHECK(r.value().at({2}) == 0);
        CHECK(r.value().at({3}) == 0.75);
        CHECK(c.value().at({4}) == 6.0);
        // PyTorch: threshold_backward and hardtanh_backward are `x <= lo (|| x >= hi) ? 0 : dy`.
        g.backward(add(sum(mul_scalar(r, 3.0)), sum(mul_scalar(c, 5.0))));
        CHECK(x.grad().to_vector() == std::vector<double>{8, 0, 0, 8, 3});
    }
}

TEST_CASE("the fused ReLU of linear and conv2d propagates NaN on the CPU", "[trust][nan]") {
    Generator gen(71);
    for (const DType dtype : {DType::f32, DType::f64}) {
        ComputeGraph g;
        Tensor xv = random({3, 4}, gen, dtype);
        xv.set({1, 2}, kNaN);
        Var x = g.input(xv, "x", true);
        Var w = g.input(random({5, 4}, gen, dtype), "w", true);
        Var b = g.input(random({5}, gen, dtype), "b", true);
        Var y = linear(x, w, b, Activation::Relu);
        for (std::int64_t j = 0; j < 5; ++j) CHECK(std::isnan(y.value().at({1, j})));
        for (std::int64_t j = 0; j < 5; ++j) CHECK_FALSE(std::isnan(y.value().at({0, j})));

        Tensor image = random({1, 2, 5, 5}, gen, dtype);
        image.set({0, 1, 2, 2}, kNaN);
        Var xi = g.input(image, "image", true);
        Var k = g.input(random({3, 2, 3, 3}, gen, dtype), "k", true);
        Var kb = g.input(random({3}, gen, dtype), "kb", true);
        Var z = conv2d(xi, k, kb, {.padding = {1, 1}, .activation = Activation::Relu});
        // The NaN pixel reaches every output whose 3x3 window covers it: 9 positions in each of 3 channels.
        const TensorStats stats = tensor_stats(z.value());
        CHECK(stats.nan_count == 27);
    }
}

TEST_CASE("anomaly mode sees a NaN whose first consumer is a ReLU", "[trust][nan][anomaly]") {
    Generator gen(72);
    const AnomalyModeGuard anomaly;
    {
        ComputeGraph g;
        Tensor xv = random({6}, gen);
        xv.set({4}, kNaN);
        Var x = g.input(xv, "x");
        CHECK_THROWS_MATCHES(relu(x), NumericalError,
                             MessageHas({"relu", "output holds NaN/Inf", "input 0, leaf #0 'x'"}));
        CHECK_THROWS_AS(clipped_relu(x, 2.0), NumericalError);
    }
    {
        ComputeGraph g;
        Tensor xv = random({2, 3}, gen);
        xv.set({0, 1}, kNaN);
        Var x = g.input(xv, "batch");
        Var w = g.input(random({4, 3}, gen), "w");
        Var b = g.input(random({4}, gen), "b");
        CHECK_THROWS_MATCHES(linear(x, w, b, Activation::Relu), NumericalError,
                             MessageHas({"linear", "'batch'", "already held NaN/Inf"}));
    }
}

// ---- class 7: precision of the saturating derivatives ----

namespace {
// float32 and float64 gradients of sum(op(x)) at `points`.
template <typename Op>
std::pair<std::vector<double>, std::vector<double>> gradients_f32_f64(const std::vector<double>& points, Op op) {
    std::vector<double> grads[2];
    const DType dtypes[2] = {DType::f32, DType::f64};
    for (int k = 0; k < 2; ++k) {
        ComputeGraph g;
        Var x = g.input(Tensor::from_vector(points, {static_cast<std::int64_t>(points.size())}).to(dtypes[k]), "x",
                        true);
        g.backward(sum(op(x)));
        grads[k] = x.grad().to_vector();
    }
    return {grads[0], grads[1]};
}
}  // namespace

TEST_CASE("elu's float32 gradient keeps its relative accuracy for very negative inputs", "[trust][precision]") {
    const std::vector<double> points{-5, -10, -15, -20};
    const auto [f32, f64] = gradients_f32_f64(points, [](const Var& x) { return elu(x, 1.3); });
    for (std::size_t i = 0; i < points.size(); ++i) {
        INFO("x = " << points[i] << ": float32 " << f32[i] << ", float64 " << f64[i]);
        CHECK(f64[i] == dgtest::Approx(1.3 * std::exp(points[i])).epsilon(1e-12));
        CHECK(relative_error(f32[i], f64[i]) < 1e-6);
    }
    // And the forward near 0, where e^x - 1 cancels (expm1 does not).
    const std::vector<double> small{-1e-3, -1e-5, -1e-7};
    for (const double x : small) {
        ComputeGraph g;
        const double y32 = elu(g.input(Tensor::of({x}, DType::f32)), 1.0).value().at({0});
        INFO("x = " << x << ": float32 elu " << y32);
        CHECK(relative_error(y32, std::expm1(x)) < 1e-6);
    }
}

TEST_CASE("sigmoid's and tanh's float32 gradients keep their relative accuracy where they saturate",
          "[trust][precision]") {
    const std::vector<double> points{-20, -9, 9, 15, 20};
    const auto [s32, s64] = gradients_f32_f64(points, [](const Var& x) { return sigmoid(x); });
    const std::vector<double> tanh_points{-10, -6, 6, 8, 10};
    const auto [t32, t64] = gradients_f32_f64(tanh_points, [](const Var& x) { return tanh(x); });
    for (std::size_t i = 0; i < points.size(); ++i) {
        const double e = std::exp(-std::abs(points[i]));
        INFO("sigmoid' at " << points[i] << ": float32 " << s32[i] << ", float64 " << s64[i]);
        CHECK(s64[i] == dgtest::Approx(e / ((1 + e) * (1 + e))).epsilon(1e-12));
        CHECK(relative_error(s32[i], s64[i]) < 1e-5);
    }
    for (std::size_t i = 0; i < tanh_points.size(); ++i) {
        const double sech = 1 / std::cosh(tanh_points[i]);
        INFO("tanh' at " << tanh_points[i] << ": float32 " << t32[i] << ", float64 " << t64[i]);
        CHECK(t64[i] == dgtest::Approx(sech * sech).epsilon(1e-12));
        CHECK(relative_error(t32[i], t64[i]) < 1e-5);
    }
}

// ---- class 10: messages that name the right thing ----

TEST_CASE("verify with a wrong-shaped output gradient names that gradient, not retain_grads", "[trust][messages]") {
    Generator gen(81);
    ComputeGraph g;
    Var x = g.input(random({3, 4}, gen), "x", true);
    Var y = tanh(x);
    CHECK_THROWS_MATCHES(verify(g, y, Tensor::ones({4, 3}, DType::f64)), GraphError,
                         MessageHas({"output gradient grad_output (4,3) float64 cpu does not match the output",
                                     "(3,4)"}) &&
                             !MessageHas({"retain_grads"}));
}

TEST_CASE("an LSTM fed the wrong number of features says so instead of blaming the weight", "[trust][messages]") {
    Generator gen(82);
    const RnnOptions options{.hidden_size = 3};
    const LSTM layer(4, options, gen);
    ComputeGraph g;
    Var x = g.input(random({2, 3, 5}, gen, DType::f32), "x");
    CHECK_THROWS_MATCHES(layer(x), ShapeError,
                         MessageHas({"lstm layer", "x (2,3,5) has 5 features", "built for input size 4"}));
    // The functional form has no layer to ask: the shape rule recognises a weight made for another input size.
    Var w = g.parameter(layer.weight);
    CHECK_THROWS_MATCHES(lstm(x, w, options), ShapeError,
                         MessageHas({"has 5 features", "flat weight of lstm with input 4, hidden 3"}) &&
                             !MessageHas({"needs a flat weight"}));
}

TEST_CASE("anomaly mode with a NaN in a weight names the parameter, not linear's internal transpose",
          "[trust][messages][anomaly]") {
    Generator gen(83);
    Tensor weight = random({3, 4}, gen);
    weight.set({1, 1}, kNaN);
    Parameter w(weight, "fc.weight");
    const AnomalyModeGuard anomaly;
    ComputeGraph g;
    Var x = g.input(random({2, 4}, gen), "x");
    CHECK_THROWS_MATCHES(linear(x, g.parameter(w)), NumericalError,
                         MessageHas({"parameter 'fc.weight'", "already held NaN/Inf"}));
}
