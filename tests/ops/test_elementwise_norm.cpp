// The elementwise ops and norms of issue 13 beyond what the op table checks (finite differences, float32,
// PyTorch goldens): the tie and boundary rules of maximum/minimum and clamp, float32 precision of gelu and
// log_sigmoid where a naive formula cancels, the eager Tensor overloads, layer_norm's and rms_norm's optional
// parameters and default eps, and the layers LayerNorm, RMSNorm, GELU and SiLU.
#include <cmath>
#include <limits>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::max_abs_diff;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor random(const Shape& shape, Generator& gen, DType dtype = DType::f64) {
    return Tensor::normal(shape, 0, 1, gen, dtype);
}

// y = f(x) for float32 x and the float64 evaluation of the same rounded x; each value's relative error.
template <typename F>
double worst_f32_relative_error(const std::vector<double>& xs, F f) {
    const Tensor x64 = Tensor::from_vector(xs, {static_cast<std::int64_t>(xs.size())}).to(DType::f32).to(DType::f64);
    const std::vector<double> y32 = f(x64.to(DType::f32)).to_vector();
    const std::vector<double> y64 = f(x64).to_vector();
    double worst = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
        REQUIRE(y64[i] != 0);
        worst = std::max(worst, std::abs(y32[i] - y64[i]) / std::abs(y64[i]));
    }
    return worst;
}

// d(Σ y)/dx of a unary op on float32 x: the derivative at each x.
template <typename F>
Tensor derivative_at(const Tensor& x, F f) {
    ComputeGraph g;
    Var v = g.input(x, "x", true);
    g.backward(sum(f(v)));
    return v.grad();
}

}  // namespace

TEST_CASE("maximum and minimum split the gradient half and half at ties, as PyTorch", "[elementwise][minmax]") {
    Generator gen(1301);
    const Tensor a = random({6, 5}, gen);
    // b: a copy of a with every other element moved up or down, the rest tied
    std::vector<double> bv = a.to_vector();
    const std::vector<double> shift = random({30}, gen).to_vector();
    for (std::size_t i = 0; i < bv.size(); i += 2) bv[i] += shift[i];
    const Tensor b = Tensor::from_vector(bv, {6, 5}, DType::f64);
    const std::vector<double> av = a.to_vector();
    for (const bool is_max : {true, false}) {
        ComputeGraph g;
        Var va = g.input(a, "a", true), vb = g.input(b, "b", true);
        const Var y = is_max ? maximum(va, vb) : minimum(va, vb);
        g.backward(sum(y));
        const std::vector<double> ga = va.grad().to_vector(), gb = vb.grad().to_vector(), yv = y.value().to_vector();
        for (std::size_t i = 0; i < av.size(); ++i) {
            INFO((is_max ? "maximum" : "minimum") << " element " << i << ": a " << av[i] << ", b " << bv[i]);
            const bool a_wins = is_max ? av[i] > bv[i] : av[i] < bv[i];
            CHECK(yv[i] == (a_wins ? av[i] : bv[i]));
            if (av[i] == bv[i]) {
                CHECK(ga[i] == 0.5);
                CHECK(gb[i] == 0.5);
            } else {
                CHECK(ga[i] == (a_wins ? 1.0 : 0.0));
                CHECK(gb[i] == (a_wins ? 0.0 : 1.0));
            }
        }
    }
}

TEST_CASE("maximum and minimum propagate NaN from either operand and broadcast", "[elementwise][minmax]") {
    const Tensor a = Tensor::from_vector(std::vector<double>{kNaN, 1.0, 2.0}, {3}, DType::f64);
    const Tensor b = Tensor::from_vector(std::vector<double>{0.5, kNaN, -1.0}, {3}, DType::f64);
    for (const Tensor& y : {maximum(a, b), minimum(a, b)}) {
        const std::vector<double> v = y.to_vector();
        CHECK(std::isnan(v[0]));
        CHECK(std::isnan(v[1]));
        CHECK_FALSE(std::isnan(v[2]));
    }
    Generator gen(1302);
    const Tensor rows = random({4, 3}, gen), row = random({3}, gen);
    const std::vector<double> r = rows.to_vector(), c = row.to_vector(), y = maximum(rows, row).to_vector();
    for (std::size_t i = 0; i < r.size(); ++i) CHECK(y[i] == std::max(r[i], c[i % 3]));
}

TEST_CASE("clamp's gradient passes strictly between the bounds, as PyTorch", "[elementwise][clamp]") {
    Generator gen(1303);
    std::vector<double> xs = random({40}, gen).to_vector();
    xs[0] = -0.5;  // exactly at the bounds, and NaN
    xs[1] = 0.25;
    xs[2] = kNaN;
    const Tensor x = Tensor::from_vector(xs, {40}, DType::f64);
    struct Bounds {
        std::optional<double> min, max;
    };
    for (const Bounds bounds : {Bounds{-0.5, 0.25}, Bounds{-0.5, std::nullopt}, Bounds{std::nullopt, 0.25}}) {
        const double lo = bounds.min.value_or(-INFINITY), hi = bounds.max.value_or(INFINITY);
        ComputeGraph g;
        Var v = g.input(x, "x", true);
        const Var y = clamp(v, bounds.min, bounds.max);
        g.backward(sum(y));
        const std::vector<double> yv = y.value().to_vector(), gv = v.grad().to_vector();
        for (std::size_t i = 0; i < xs.size(); ++i) {
            INFO("x " << xs[i] << " in [" << lo << ", " << hi << "]");
            if (std::isnan(xs[i])) {
                CHECK(std::isnan(yv[i]));
                CHECK(gv[i] == 0.0);
                continue;
            }
            CHECK(yv[i] == std::min(std::max(xs[i], lo), hi));
            CHECK(gv[i] == (xs[i] > lo && xs[i] < hi ? 1.0 : 0.0));
        }
    }
}

TEST_CASE("log_sigmoid and gelu keep float32 precision where the naive formulas cancel", "[elementwise][precision]") {
    // log(σ(x)) rounds to 0 for x > 17 in float32 and to -inf for x < -88; 1 + erf(x/√2) and 1 + tanh(u) round
    // to 0 for x below about -6, which makes gelu's output and derivative 0 there instead of tiny.
    const std::vector<double> xs = {-100.0, -30.0, -9.5, -1.0, 0.3, 17.5, 30.0, 60.0};
    const auto log_sigmoid_value = [](const Tensor& x) { return log_sigmoid(x); };
    const auto log_sigmoid_slope = [](const Tensor& x) {
        return derivative_at(x, [](const Var& v) { return log_sigmoid(v); });
    };
    CHECK(worst_f32_relative_error(xs, log_sigmoid_value) < 1e-6);
    CHECK(worst_f32_relative_error(xs, log_sigmoid_slope) < 1e-6);

    const std::vector<double> negatives = {-9.0, -7.5, -6.25, -3.0, -0.5, 0.5, 2.0};
    for (const GeluApproximation form : {GeluApproximation::None, GeluApproximation::Tanh}) {
        INFO("gelu form " << static_cast<int>(form));
        const auto value = [form](const Tensor& x) { return gelu(x, form); };
        const auto slope = [form](const Tensor& x) {
            return derivative_at(x, [form](const Var& v) { return gelu(v, form); });
        };
        // exp(-x²/2) near -9 is 1e-18 in float32 with a few ulp of error from the argument's rounding
        CHECK(worst_f32_relative_error(negatives, value) < 1e-4);
        CHECK(worst_f32_relative_error(negatives, slope) < 1e-4);
    }
}

TEST_CASE("the Tensor overloads compute what the recorded ops compute", "[elementwise][eager]") {
    Generator gen(1304);
    const Tensor x = random({3, 7}, gen, DType::f32), other = random({7}, gen, DType::f32);
    ComputeGraph g;
    const Var v = g.input(x, "x"), o = g.input(other, "other");
    CHECK(max_abs_diff(sin(x), sin(v).value()) == 0);
    CHECK(max_abs_diff(cos(x), cos(v).value()) == 0);
    CHECK(max_abs_diff(silu(x), silu(v).value()) == 0);
    CHECK(max_abs_diff(log_sigmoid(x), log_sigmoid(v).value()) == 0);
    CHECK(max_abs_diff(gelu(x, GeluApproximation::Tanh), gelu(v, GeluApproximation::Tanh).value()) == 0);
    CHECK(max_abs_diff(clamp(x, -0.3, std::nullopt), clamp(v, -0.3, std::nullopt).value()) == 0);
    CHECK(max_abs_diff(maximum(x, other), maximum(v, o).value()) == 0);
    CHECK(max_abs_diff(minimum(x, other), minimum(v, o).value()) == 0);
    const Tensor w = random({7}, gen, DType::f32), b = random({7}, gen, DType::f32);
    CHECK(max_abs_diff(layer_norm(x, {7}, w, b), layer_norm(v, {7}, g.input(w), g.input(b)).value()) == 0);
    CHECK(max_abs_diff(rms_norm(x, {7}, w), rms_norm(v, {7}, g.input(w)).value()) == 0);
    // Errors name the op and the call site
    CHECK_THROWS_AS(clamp(x, 1.0, -1.0), ValueError);
    CHECK_THROWS_AS(layer_norm(x, {3}), ShapeError);
}

TEST_CASE("layer_norm normalises each row; a bias alone gets a weight of ones and a gradient",
          "[norm][layer_norm]") {
    Generator gen(1305);
    const Tensor x = random({4, 2, 3}, gen), bias = random({2, 3}, gen);
    ComputeGraph g;
    Var vx = g.input(x, "x", true), vb = g.input(bias, "bias", true);
    const Var plain = layer_norm(vx, {2, 3});
    const Var shifted = layer_norm(vx, {2, 3}, Var(), vb);
    // each row of 6 values: mean 0, biased variance 1 (up to eps)
    const std::vector<double> y = plain.value().to_vector();
    for (std::size_t row = 0; row < 4; ++row) {
        double mean = 0, square = 0;
        for (std::size_t j = 0; j < 6; ++j) mean += y[row * 6 + j] / 6;
        for (std::size_t j = 0; j < 6; ++j) square += (y[row * 6 + j] - mean) * (y[row * 6 + j] - mean) / 6;
        CHECK(std::abs(mean) < 1e-12);
        CHECK(std::abs(square - 1) < 1e-4);
    }
    CHECK(max_abs_diff(sub(shifted, vb).value(), plain.value()) < 1e-12);
    g.backward(sum(shifted));
    const std::vector<double> db = vb.grad().to_vector();
    for (const double d : db) CHECK(d == 4.0);  // Σ over the 4 rows of dy = 1
}

TEST_CASE("rms_norm's default eps is the machine epsilon of the input's dtype, as PyTorch", "[norm][rms_norm]") {
    Generator gen(1306);
    // values near 1e-4: mean(x²) ~ 1e-8, where eps 1e-5 would dominate and float32's epsilon (1.2e-7) matters
    for (const DType dtype : {DType::f32, DType::f64}) {
        const Tensor x = Tensor::normal({3, 5}, 0, 1e-4, gen, dtype);
        const double machine_eps =
            dtype == DType::f32 ? std::numeric_limits<float>::epsilon() : std::numeric_limits<double>::epsilon();
        CHECK(max_abs_diff(rms_norm(x, {5}), rms_norm(x, {5}, Tensor(), machine_eps)) == 0);
        CHECK(max_abs_diff(rms_norm(x, {5}), rms_norm(x, {5}, Tensor(), 1e-5)) > 0.1);
    }
}

TEST_CASE("LayerNorm: PyTorch's default init, named parameters, the op's result and gradients", "[layers][norm]") {
    Generator gen(1307);
    LayerNorm norm({3, 4});
    const auto named = norm.named_parameters();
    REQUIRE(named.size() == 2);
    CHECK(named[0].first == "weight");
    CHECK(named[1].first == "bias");
    for (const double w : norm.weight.value().to_vector()) CHECK(w == 1.0);
    for (const double b : norm.bias.value().to_vector()) CHECK(b == 0.0);
    CHECK(norm.weight.value().shape() == Shape{3, 4});

    // Parameters moved off their defaults: the layer is layer_norm with them.
    norm.weight.value().copy_from(random({3, 4}, gen, DType::f32));
    norm.bias.value().copy_from(random({3, 4}, gen, DType::f32));
    const Tensor x = random({2, 3, 4}, gen, DType::f32);
    ComputeGraph g;
    const Var y = norm(g.input(x));
    CHECK(max_abs_diff(y.value(), layer_norm(x, {3, 4}, norm.weight.value(), norm.bias.value())) == 0);
    g.backward(sum(mul(y, y)));
    CHECK(norm.weight.grad().shape() == Shape{3, 4});
    CHECK(norm.bias.grad().shape() == Shape{3, 4});

    CHECK(LayerNorm({5}, 1e-5, false).parameters().empty());
    CHECK(LayerNorm({5}, 1e-5, true, false).parameters().size() == 1);
    CHECK_THROWS_AS(LayerNorm({}), ValueError);
    CHECK_THROWS_AS(LayerNorm({4, 0}), ValueError);
    CHECK_THROWS_AS(LayerNorm({4}, -1.0), ValueError);
}

TEST_CASE("RMSNorm: weight of ones, optional, and the op's result", "[layers][norm]") {
    Generator gen(1308);
    RMSNorm norm({6});
    REQUIRE(norm.parameters().size() == 1);
    CHECK(norm.named_parameters()[0].first == "weight");
    for (const double w : norm.weight.value().to_vector()) CHECK(w == 1.0);
    norm.weight.value().copy_from(random({6}, gen, DType::f32));
    const Tensor x = random({5, 6}, gen, DType::f32);
    ComputeGraph g;
    const Var y = norm(g.input(x));
    CHECK(max_abs_diff(y.value(), rms_norm(x, {6}, norm.weight.value())) == 0);
    g.backward(sum(y));
    CHECK(norm.weight.grad().shape() == Shape{6});
    CHECK(RMSNorm({6}, 1e-6, false).parameters().empty());
    CHECK_THROWS_AS(RMSNorm({-2}), ValueError);
}

TEST_CASE("GELU and SiLU layers apply their functions inside a Sequential", "[layers][activation]") {
    Generator gen(1309);
    const Tensor x = random({4, 5}, gen, DType::f32);
    Sequential model;
    model.add(GELU(GeluApproximation::Tanh)).add(SiLU());
    CHECK(model.parameters().empty());
    ComputeGraph g;
    const Var y = model(g.input(x));
    CHECK(max_abs_diff(y.value(), silu(gelu(x, GeluApproximation::Tanh))) == 0);
    CHECK(max_abs_diff(GELU()(g.input(x)).value(), gelu(x)) == 0);
    CHECK(max_abs_diff(GELU()(g.input(x)).value(), gelu(x, GeluApproximation::Tanh)) > 0);
}
