// PyTorch's semantics where a libtorch user expects them (issue 29): linear over (*, in), the class losses over
// (N,C,d1,...) and (C), max/min with their indices, reshaped's -1, to(device, dtype), clip_grad_norm's
// error_if_nonfinite and DataLoader's defaults. The composites are checked against the 2-D ops they reshape
// around and against central finite differences in float64.
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "catch.h"
#include "test_support.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

Tensor random(const Shape& shape, Generator& gen) { return Tensor::normal(shape, 0.0, 1.0, gen, DType::f64); }

// The worst error of analytic gradients of the scalar `f(inputs)` against central differences, over every
// element of every input (all float64, each differentiated).
double worst_gradient_error(std::vector<Tensor> inputs, const std::function<Var(ComputeGraph&, std::vector<Var>&)>& f) {
    std::vector<Tensor> analytic;
    {
        ComputeGraph g;
        std::vector<Var> vars;
        for (const Tensor& t : inputs) vars.push_back(g.input(t, "", true));
        g.backward(f(g, vars));
        for (const Var& v : vars) analytic.push_back(v.grad().clone());
    }
    const auto value = [&] {
        ComputeGraph g;
        std::vector<Var> vars;
        for (const Tensor& t : inputs) vars.push_back(g.input(t));
        return f(g, vars).item();
    };
    constexpr double h = 1e-6;
    double worst = 0;
    for (std::size_t k = 0; k < inputs.size(); ++k)
        for (std::int64_t i = 0; i < inputs[k].numel(); ++i) {
            double* x = inputs[k].data<double>() + i;
            const double saved = *x;
            *x = saved + h;
            const double up = value();
            *x = saved - h;
            const double down = value();
            *x = saved;
            const double numeric = (up - down) / (2 * h);
            worst = std::max(worst, std::abs(numeric - analytic[k].data<double>()[i]) / (1 + std::abs(numeric)));
        }
    return worst;
}

Tensor labels_in(const Shape& shape, std::int64_t classes, Generator& gen) {
    std::vector<std::int64_t> values(static_cast<std::size_t>(numel(shape)));
    const Tensor u = Tensor::uniform({static_cast<std::int64_t>(values.size())}, 0.0, 1.0, gen, DType::f64);
    for (std::size_t i = 0; i < values.size(); ++i)
        values[i] = std::min<std::int64_t>(classes - 1, static_cast<std::int64_t>(u.data<double>()[i] * classes));
    return Tensor::from_vector(values, shape);
}

}  // namespace

TEST_CASE("linear takes (*, in) as libtorch: rows of the 2-D op, gradients by finite differences", "[semantics][linear]") {
    Generator gen(101);
    const Tensor x = random({2, 3, 4}, gen), w = random({5, 4}, gen), b = random({5}, gen);
    for (const bool with_bias : {true, false}) {
        const Tensor y = with_bias ? linear(x, w, b) : linear(x, w);
        REQUIRE(y.shape() == Shape{2, 3, 5});
        const Tensor rows = with_bias ? linear(x.reshaped({6, 4}), w, b) : linear(x.reshaped({6, 4}), w);
        CHECK(relative_norm_error(y.reshaped({6, 5}), rows) == 0.0);
    }
    const Tensor weights = random({2, 3, 5}, gen);
    CHECK(worst_gradient_error({x, w, b}, [&](ComputeGraph& g, std::vector<Var>& v) {
              return sum(mul(linear(v[0], v[1], v[2]), g.constant(weights)));
          }) < 1e-6);
    CHECK(worst_gradient_error({x, w}, [&](ComputeGraph& g, std::vector<Var>& v) {
              return sum(mul(linear(v[0], v[1]), g.constant(weights)));
          }) < 1e-6);
    // A fused ReLU keeps working over leading dims (the kernel's mask on the rows).
    const Tensor relu_y = linear(x, w, b, Activation::Relu);
    CHECK(relative_norm_error(relu_y, relu(linear(x, w, b))) == 0.0);

    SECTION("1-D input (in) gives (out); 4-D keeps its leading dims") {
        const Tensor v = random({4}, gen);
        const Tensor out = linear(v, w, b);
        REQUIRE(out.shape() == Shape{5});
        CHECK(relative_norm_error(out, linear(v.reshaped({1, 4}), w, b).reshaped({5})) == 0.0);
        CHECK(worst_gradient_error({v, w, b}, [&](ComputeGraph&, std::vector<Var>& vars) {
                  return sum(mul(linear(vars[0], vars[1], vars[2]), linear(vars[0], vars[1], vars[2])));
              }) < 1e-6);
        CHECK(linear(random({2, 1, 3, 4}, gen), w).shape() == Shape{2, 1, 3, 5});
        CHECK(linear(random({0, 3, 4}, gen), w, b).shape() == Shape{0, 3, 5});
    }
    SECTION("no rows: the backward gives zero weight and bias gradients (PyTorch's sums over an empty batch)") {
        ComputeGraph g;
        const Var vx = g.input(Tensor::zeros({0, 4}, DType::f64), "x", true);
        const Var vw = g.input(w, "w", true), vb = g.input(b, "b", true);
        g.backward(sum(linear(vx, vw, vb)));
        CHECK(vx.grad().shape() == Shape{0, 4});
        CHECK(vw.grad().to_vector() == std::vector<double>(20, 0.0));
        CHECK(vb.grad().to_vector() == std::vector<double>(5, 0.0));
    }
    SECTION("the nn layer over (B, T, E); wrong in-features stay a ShapeError") {
        Linear layer(4, 5, true, gen);
        ComputeGraph g;
        CHECK(layer(g.input(x.to(DType::f32))).shape() == Shape{2, 3, 5});
        CHECK_THROWS_AS(linear(random({2, 3, 6}, gen), w, b), ShapeError);
        CHECK_THROWS_AS(linear(Tensor::full({}, 1.0, DType::f64), w, b), ShapeError);
    }
    SECTION("a refused (*, in) call records nothing: the 2-D op's checks run before the rows' reshape") {
        ComputeGraph g;
        const Var vx = g.input(random({2, 3, 6}, gen), "x", true);
        const Var vw = g.input(w, "w", true), vb = g.input(b, "b", true), vb_f32 = g.input(b.to(DType::f32));
        const std::size_t nodes = g.size();
        CHECK_THROWS_MATCHES(linear(vx, vw, vb), ShapeError, dgtest::MessageHas({"linear"}));
        CHECK_THROWS_MATCHES(linear(vx, vw, Var()), ShapeError, dgtest::MessageHas({"matmul"}));
        CHECK_THROWS_AS(linear(g.input(random({2, 3, 4}, gen)), vw, vb_f32), DTypeError);
        CHECK(g.size() == nodes + 1);  // the last call's x only
        CHECK(linear(g.input(random({2, 3, 4}, gen)), vw, vb).shape() == Shape{2, 3, 5});
    }
}

TEST_CASE("gelu_mlp takes (*, in) as linear; bad shapes, dtypes and GELU forms are typed errors naming the op",
          "[semantics][gelu_mlp]") {
    using dgtest::max_abs_diff;
    using dgtest::MessageHas;
    Generator gen(17);
    const auto normal = [&](Shape shape) { return Tensor::normal(shape, 0.0, 1.0, gen, DType::f64); };
    ComputeGraph g;
    const Var x = g.input(normal({2, 5, 3}), "x", true), rows = g.input(normal({10, 3}), "rows", true);
    const Var w1 = g.input(normal({7, 3}), "w1", true), b1 = g.input(normal({7}), "b1", true);
    const Var w2 = g.input(normal({4, 7}), "w2", true), b2 = g.input(normal({4}), "b2", true);
    const Var w1_wide = g.input(normal({7, 4})), b1_short = g.input(normal({6})), w2_flat = g.input(normal({28}));
    const Var b2_f32 = g.input(normal({4}).to(DType::f32)), rows_int = g.input(Tensor::zeros({10, 3}, DType::i64));
    const std::size_t nodes = g.size();
    CHECK_THROWS_MATCHES(gelu_mlp(rows, w1_wide, b1, w2, b2), ShapeError,
                         MessageHas({"gelu_mlp", "do not chain", "(7,4)"}));
    CHECK_THROWS_MATCHES(gelu_mlp(rows, w1, b1_short, w2, b2), ShapeError, MessageHas({"gelu_mlp", "b1 (6)"}));
    CHECK_THROWS_MATCHES(gelu_mlp(rows, w1, b1, w2_flat, b2), ShapeError,
                         MessageHas({"gelu_mlp", "w2 (out,hidden)"}));
    CHECK_THROWS_MATCHES(gelu_mlp(rows, w1, b1, w2, b2_f32), DTypeError, MessageHas({"gelu_mlp", "b2 is float32"}));
    CHECK_THROWS_AS(gelu_mlp(rows_int, w1, b1, w2, b2), DTypeError);
    CHECK_THROWS_AS(gelu_mlp(rows, w1, b1, w2, b2, static_cast<GeluApproximation>(7)), ValueError);
    // With leading dims the refusal is the same op's, checked before the rows' reshape is recorded.
    CHECK_THROWS_MATCHES(gelu_mlp(x, w1_wide, b1, w2, b2), ShapeError, MessageHas({"gelu_mlp", "do not chain"}));
    CHECK_THROWS_MATCHES(gelu_mlp(x, w1, b1, w2, b2_f32), DTypeError, MessageHas({"gelu_mlp", "b2 is float32"}));
    CHECK(g.size() == nodes);  // no refused call left a node
    // (2,5,3) -> (2,5,4), equal to the composition it stands for, values and gradients.
    const Var y = gelu_mlp(x, w1, b1, w2, b2, GeluApproximation::Tanh);
    REQUIRE(y.shape() == Shape{2, 5, 4});
    const Var composed = linear(gelu(linear(x, w1, b1), GeluApproximation::Tanh), w2, b2);
    CHECK(max_abs_diff(y.value(), composed.value()) <= 1e-12);
    const Var upstream = g.constant(normal({2, 5, 4}));
    const std::vector<Var> fused = grad({y}, {x, w1, b1, w2, b2}, {upstream}, {.retain_graph = true});
    const std::vector<Var> reference = grad({composed}, {x, w1, b1, w2, b2}, {upstream});
    for (std::size_t i = 0; i < fused.size(); ++i) CHECK(max_abs_diff(fused[i].value(), reference[i].value()) <= 1e-12);
}

TEST_CASE("cross_entropy and nll_loss over (N,C,d1,d2) are the 2-D ops over the positions, as PyTorch",
          "[semantics][losses]") {
    Generator gen(102);
    const Tensor logits = random({2, 4, 3, 2}, gen);
    Tensor labels = labels_in({2, 3, 2}, 4, gen);
    labels.set({1, 2, 0}, -100);  // an ignored position
    const Tensor weight = Tensor::uniform({4}, 0.5, 2.0, gen, DType::f64);
    // The positions as rows, built element by element (not by the permute the function uses).
    Tensor rows = Tensor::zeros({12, 4}, DType::f64);
    for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t i = 0; i < 3; ++i)
            for (std::int64_t j = 0; j < 2; ++j)
                for (std::int64_t c = 0; c < 4; ++c) rows.set({n * 6 + i * 2 + j, c}, logits.at({n, c, i, j}));
    const Tensor flat_labels = labels.reshaped({12});
    for (const Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
        const CrossEntropyOptions options{.reduction = reduction, .label_smoothing = 0.2};
        const Tensor got = cross_entropy(logits, labels, weight, options);
        const Tensor want = cross_entropy(rows, flat_labels, weight, options);
        CHECK(got.shape() == (reduction == Reduction::None ? Shape{2, 3, 2} : Shape{}));
        CHECK(relative_norm_error(got.reshaped({-1}), want.reshaped({-1})) < 1e-15);
        const Tensor log_probs = log_softmax(logits, 1);
        const Tensor nll = nll_loss(log_probs, labels, weight, {.reduction = reduction});
        const Tensor nll_rows = nll_loss(log_softmax(rows, 1), flat_labels, weight, {.reduction = reduction});
        CHECK(relative_norm_error(nll.reshaped({-1}), nll_rows.reshaped({-1})) < 1e-15);
    }
    const Tensor weights = random({2, 3, 2}, gen);
    CHECK(worst_gradient_error({logits}, [&](ComputeGraph& g, std::vector<Var>& v) {
              return sum(mul(cross_entropy(v[0], g.constant(labels), {.reduction = Reduction::None}),
                             g.constant(weights)));
          }) < 1e-6);
    CHECK(worst_gradient_error({logits}, [&](ComputeGraph& g, std::vector<Var>& v) {
              return nll_loss(log_softmax(v[0], 1), g.constant(labels), g.constant(weight));
          }) < 1e-6);
    SECTION("(N,C,d) and (C) with a 0-d label") {
        const Tensor l3 = random({3, 5, 4}, gen);
        const Tensor y3 = labels_in({3, 4}, 5, gen);
        CHECK(cross_entropy(l3, y3, {.reduction = Reduction::None}).shape() == Shape{3, 4});
        const Tensor vec = random({5}, gen);
        const Tensor label = Tensor::from_vector(std::vector<std::int64_t>{3}, {});
        const Tensor one = cross_entropy(vec, label);
        CHECK(one.shape() == Shape{});
        CHECK(one.item() == cross_entropy(vec.reshaped({1, 5}), label.reshaped({1})).item());
        CHECK(cross_entropy(vec, label, {.reduction = Reduction::None}).shape() == Shape{});
        CHECK(worst_gradient_error({vec}, [&](ComputeGraph& g, std::vector<Var>& v) {
                  return cross_entropy(v[0], g.constant(label), {.label_smoothing = 0.1});
              }) < 1e-6);
    }
    SECTION("labels that do not match the positions are a ShapeError naming both shapes") {
        try {
            cross_entropy(logits, labels_in({2, 2, 3}, 4, gen));
            FAIL("no error");
        } catch (const ShapeError& e) {
            CHECK_THAT(e.what(), dgtest::Contains("cross_entropy") && dgtest::Contains("(2,2,3)") &&
                                     dgtest::Contains("(2,3,2)"));
        }
        CHECK_THROWS_AS(nll_loss(random({5}, gen), labels_in({1}, 5, gen)), ShapeError);
    }
}

TEST_CASE("max_with_indices / min_with_indices: values as max/min, int64 indices as argmax/argmin",
          "[semantics][reduce]") {
    Generator gen(103);
    const Tensor x = random({3, 5, 2}, gen);
    for (const bool keepdim : {false, true}) {
        const auto [values, indices] = max_with_indices(x, 1, keepdim);
        CHECK(indices.dtype() == DType::i64);
        CHECK(values.shape() == (keepdim ? Shape{3, 1, 2} : Shape{3, 2}));
        CHECK(indices.shape() == values.shape());
        const auto [low, where] = min_with_indices(x, -2, keepdim);
        for (std::int64_t i = 0; i < 3; ++i)
            for (std::int64_t j = 0; j < 2; ++j) {
                const Shape at = keepdim ? Shape{i, 0, j} : Shape{i, j};
                const auto k = static_cast<std::int64_t>(indices.at(at));
                CHECK(x.at({i, k, j}) == values.at(at));
                const auto m = static_cast<std::int64_t>(where.at(at));
                CHECK(x.at({i, m, j}) == low.at(at));
                for (std::int64_t r = 0; r < 5; ++r) {
                    CHECK(x.at({i, r, j}) <= values.at(at));
                    CHECK(x.at({i, r, j}) >= low.at(at));
                }
            }
    }
    ComputeGraph g;
    Var v = g.input(x, "x", true);
    const auto [values, indices] = max_with_indices(v, 1);
    CHECK_FALSE(indices.requires_grad());
    g.backward(sum(values));
    // The gradient lands where the index points.
    const Tensor grad = v.grad();
    for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 2; ++j)
            CHECK(grad.at({i, static_cast<std::int64_t>(indices.value().at({i, j})), j}) == 1.0);
    CHECK(sum(grad).item() == 6.0);
}

TEST_CASE("comparisons take int64 operands: argmax against labels is an accuracy", "[semantics][elementwise]") {
    Generator gen(108);
    const Tensor logits = random({6, 4}, gen);
    const Tensor labels = labels_in({6}, 4, gen);
    const Tensor hits = eq(argmax(logits, 1), labels);
    CHECK(hits.dtype() == DType::f64);
    double expected = 0;
    for (std::int64_t i = 0; i < 6; ++i) {
        std::int64_t best = 0;
        for (std::int64_t c = 1; c < 4; ++c)
            if (logits.at({i, c}) > logits.at({i, best})) best = c;
        const double hit = best == static_cast<std::int64_t>(labels.at({i})) ? 1.0 : 0.0;
        CHECK(hits.at({i}) == hit);
        expected += hit / 6;
    }
    CHECK(mean(hits).item() == Approx(expected));
    // int64 beside float32 compares in float32, as PyTorch promotes; recorded, the int64 side is a constant.
    CHECK(lt(labels, Tensor::full({6}, 2.0)).dtype() == DType::f32);
    const Tensor small = Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2}, {3});
    CHECK((small >= 1.5).to_vector() == std::vector<double>{0, 0, 1});  // 1.5, not a truncated 1
    CHECK((small == 1.0).to_vector() == std::vector<double>{0, 1, 0});
    CHECK((small > small).to_vector() == std::vector<double>{0, 0, 0});
    ComputeGraph g;
    Var x = g.input(logits, "logits", true);
    const Var accuracy = mean(eq(argmax(x, 1), g.constant(labels)));
    CHECK_FALSE(accuracy.requires_grad());
    CHECK(accuracy.item() == Approx(expected));
}

TEST_CASE("reshaped infers one -1 as reshape does", "[semantics][tensor]") {
    Generator gen(104);
    const Tensor x = random({2, 3, 4}, gen);
    CHECK(x.reshaped({1, -1}).shape() == Shape{1, 24});
    CHECK(x.reshaped({-1, 4}).shape() == Shape{6, 4});
    CHECK(x.reshaped({-1}).raw_data() == x.raw_data());  // still a view
    CHECK(x.reshaped({2, -1, 3}).shape() == reshape(x, {2, -1, 3}).shape());
    CHECK_THROWS_AS(x.reshaped({-1, -1}), ValueError);
    CHECK_THROWS_AS(x.reshaped({5, -1}), ShapeError);
    CHECK_THROWS_AS(x.reshaped({-2, 12}), ValueError);
    CHECK_THROWS_AS(Tensor::zeros({0, 3}).reshaped({0, -1}), ShapeError);  // as reshape: -1 beside 0 is ambiguous
    CHECK_THROWS_AS(reshape(Tensor::zeros({0, 3}), {0, -1}), ShapeError);
    try {
        (void)x.reshaped({7, -1});
        FAIL("no error");
    } catch (const ShapeError& e) {
        CHECK_THAT(e.what(), dgtest::Contains("reshaped()") && dgtest::Contains("(2,3,4)"));
    }
}

TEST_CASE("Tensor::to(device, dtype) converts both; nothing to do shares the storage", "[semantics][tensor]") {
    Generator gen(105);
    const Tensor x = random({3, 2}, gen);
    const Tensor y = x.to(Device::cpu(), DType::f32);
    CHECK(y.dtype() == DType::f32);
    CHECK(relative_norm_error(y.to(DType::f64), x) < 1e-7);
    CHECK(x.to(Device::cpu(), DType::f64).raw_data() == x.raw_data());
    if (cuda_device_count() == 0) CHECK_THROWS_AS(x.to(Device::cuda(0), DType::f32), DeviceError);
}

TEST_CASE("clip_grad_norm with error_if_nonfinite: a NaN or inf norm throws and changes nothing",
          "[semantics][optim]") {
    Generator gen(106);
    for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
        for (const double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
            Parameter a(random({3, 2}, gen), "a"), b(random({4}, gen), "b");
            a.grad_slot() = random({3, 2}, gen);
            b.grad_slot() = random({4}, gen);
            b.grad_slot().set({2}, bad);
            const Tensor a_before = a.grad().clone(), b_before = b.grad().clone();
            CHECK_THROWS_AS(clip_grad_norm({a, b}, 0.1, norm_type, true), NumericalError);
            CHECK(relative_norm_error(a.grad(), a_before) == 0.0);
            CHECK(std::isnan(b.grad().at({2})) == std::isnan(bad));
            CHECK(b.grad().at({0}) == b_before.at({0}));
            CHECK_NOTHROW(clip_grad_norm({a, b}, 0.1, norm_type, false));  // PyTorch's default: no check
        }
    }
    Parameter p(random({5}, gen), "p");
    p.grad_slot() = random({5}, gen);
    Parameter q(p.value().clone(), "q");
    q.grad_slot() = p.grad().clone();
    const double checked = clip_grad_norm({p}, 0.5, 2.0, true).item();
    const double plain = clip_grad_norm({q}, 0.5, 2.0).item();
    CHECK(checked == plain);
    CHECK(relative_norm_error(p.grad(), q.grad()) == 0.0);
}

TEST_CASE("DataLoader's defaults are PyTorch's: batches of one, in order", "[semantics][data]") {
    Generator gen(107);
    const Tensor x = random({5, 2}, gen);
    DataLoader loader(std::make_shared<TensorDataset>(std::vector<Tensor>{x}), {});
    std::vector<Tensor> batch;
    std::int64_t row = 0;
    while (loader.next(batch)) {
        REQUIRE(batch[0].shape() == Shape{1, 2});
        CHECK(batch[0].at({0, 1}) == x.at({row, 1}));
        ++row;
    }
    CHECK(row == 5);
}
