// Higher-order gradients (graph/higher_order.h): the table-driven float64 second-order check of every op row with
// a differentiable backward (gradgradcheck: the first-order gradient, built with create_graph, differentiated by the
// engine and by central differences along random directions), third order for the elementwise and linear-algebra
// rows, analytic derivatives of known functions, and the typed errors of the hostile cases.
#include <cmath>
#include <set>
#include <string>

#include "catch.h"
#include "check_reporting.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/ops/differentiable_backward.h"

using namespace dyngrad;

namespace {

constexpr double kSecondOrderTolerance = 1e-6;
constexpr double kThirdOrderTolerance = 1e-5;

std::uint64_t seed_base() { return dgtest::seed_base("test_higher_order", 20261127); }

// The differentiable rows that are first-order only, each with the typed error it gives (docs/ops.md): none.
const std::set<std::string> kFirstOrderOnly = {};

bool elementwise_or_linalg(const OpDef& def) {
    return def.differentiable_backward == unary_differentiable_backward ||
           def.differentiable_backward == binary_differentiable_backward ||
           def.differentiable_backward == softmax_differentiable_backward || def.op == OpType::Matmul ||
           def.op == OpType::Linear || def.op == OpType::Transpose || def.op == OpType::Reshape;
}

Tensor random_tensor(const Shape& shape, Generator& gen) { return Tensor::normal(shape, 0.0, 1.0, gen, DType::f64); }

// A random float64 input of `graph` that requires grad, and its value (for the expected derivatives).
struct RandomInput {
    Tensor value;
    Var var;
};
RandomInput random_input(ComputeGraph& graph, const Shape& shape, const char* name, Generator& gen) {
    Tensor value = random_tensor(shape, gen);
    return {value, graph.input(value, name, true)};
}

double value_at(const Tensor& t, std::int64_t i) { return t.to_vector()[static_cast<std::size_t>(i)]; }

}  // namespace

// Runs higher_order_check of `order` on every case of every row with a differentiable backward that `pick` takes.
template <typename Pick>
void check_rows(int order, double tolerance, std::uint64_t base, Pick pick) {
    for (const OpDef& def : op_table()) {
        if (def.differentiable_backward == nullptr || !pick(def)) continue;
        for (const OpCase& op_case : def.cases()) {
            DYNAMIC_SECTION(def.name << ": " << op_case.label) {
                const std::uint64_t seed = seed_for_name(base, def.name);
                INFO("op " << def.name << ", case '" << op_case.label << "', order " << order << ", seed " << seed);
                Generator gen(seed);
                const CheckResult r = higher_order_check(def, op_case, gen, order, tolerance);
                INFO(dgtest::describe_result(r));
                CHECK(r.pass);
                CHECK(r.check == (order == 2 ? "second_order" : "third_order"));
            }
        }
    }
}

TEST_CASE("every op row with a differentiable backward passes the float64 second-order check", "[higher_order]") {
    check_rows(2, kSecondOrderTolerance, seed_base(), [](const OpDef&) { return true; });
}

TEST_CASE("elementwise and linear-algebra rows pass the float64 third-order check", "[higher_order]") {
    check_rows(3, kThirdOrderTolerance, seed_base() + 3, elementwise_or_linalg);
}

TEST_CASE("the first-order-only rows are exactly the documented ones", "[higher_order][table]") {
    std::set<std::string> first_order_only;
    for (const OpDef& def : op_table())
        if (def.differentiable && def.op != OpType::Leaf && def.op != OpType::Custom &&
            def.differentiable_backward == nullptr)
            first_order_only.insert(def.name);
    CHECK(first_order_only == kFirstOrderOnly);
}

TEST_CASE("derivatives of any order match the analytic ones", "[higher_order]") {
    Generator gen(seed_base());
    ComputeGraph graph;
    const auto [xv, x] = random_input(graph, {7}, "x", gen);
    SECTION("x³: 3x², 6x, 6") {
        const Var y = sum(pow(x, 3.0));
        const Var d1 = grad({y}, {x}, {}, {.create_graph = true})[0];
        const Var d2 = grad({sum(d1)}, {x}, {}, {.create_graph = true})[0];
        const Var d3 = grad({sum(d2)}, {x}, {}, {.create_graph = true})[0];
        for (std::int64_t i = 0; i < 7; ++i) {
            const double v = value_at(xv, i);
            CHECK(value_at(d1.value(), i) == Approx(3 * v * v).epsilon(1e-12));
            CHECK(value_at(d2.value(), i) == Approx(6 * v).epsilon(1e-12));
            CHECK(value_at(d3.value(), i) == Approx(6.0).epsilon(1e-12));
        }
    }
    SECTION("sin: the fourth derivative is sin again") {
        Var d = sum(sin(x));
        std::vector<Var> derivative;
        for (int k = 0; k < 4; ++k) {
            derivative.push_back(grad({d}, {x}, {}, {.create_graph = true})[0]);
            d = sum(derivative.back());
        }
        for (std::int64_t i = 0; i < 7; ++i) {
            const double v = value_at(xv, i);
            CHECK(value_at(derivative[0].value(), i) == Approx(std::cos(v)).margin(1e-12));
            CHECK(value_at(derivative[1].value(), i) == Approx(-std::sin(v)).margin(1e-12));
            CHECK(value_at(derivative[2].value(), i) == Approx(-std::cos(v)).margin(1e-12));
            CHECK(value_at(derivative[3].value(), i) == Approx(std::sin(v)).margin(1e-12));
        }
    }
    SECTION("backward with create_graph: the leaf's gradient is a Var; tanh'' = -2·tanh·sech²") {
        graph.backward(sum(tanh(x)), {.create_graph = true});
        const Var g = x.grad_var();
        REQUIRE(g.requires_grad());
        const Tensor second = grad({sum(g)}, {x})[0].value();
        for (std::int64_t i = 0; i < 7; ++i) {
            const double t = std::tanh(value_at(xv, i));
            CHECK(value_at(x.grad(), i) == Approx(1 - t * t).margin(1e-12));
            CHECK(value_at(second, i) == Approx(-2 * t * (1 - t * t)).margin(1e-12));
        }
    }
}

TEST_CASE("the Hessian of a quadratic form and a mixed partial through matmul", "[higher_order]") {
    Generator gen(seed_base() + 1);
    ComputeGraph graph;
    const auto [av, a] = random_input(graph, {4, 4}, "A", gen);
    const auto [xv, x] = random_input(graph, {4, 1}, "x", gen);
    // f = xᵀ A x: ∇x f = (A + Aᵀ) x; the Hessian in x is A + Aᵀ; ∂²f/∂x∂A_ij contracted with v gives v_i x_j + x_i v_j
    const Var f = sum(matmul(transpose(x), matmul(a, x)));
    const Var gx = grad({f}, {x}, {}, {.create_graph = true})[0];
    const Tensor vv = random_tensor({4, 1}, gen);
    const Var v = graph.constant(vv);
    const std::vector<Var> second = grad({sum(mul(gx, v))}, {x, a});
    const std::vector<double> A = av.to_vector(), X = xv.to_vector(), V = vv.to_vector();
    for (int i = 0; i < 4; ++i) {
        double hv = 0;
        for (int j = 0; j < 4; ++j) hv += (A[i * 4 + j] + A[j * 4 + i]) * V[j];
        CHECK(value_at(second[0].value(), i) == Approx(hv).margin(1e-12));
        for (int j = 0; j < 4; ++j)
            CHECK(value_at(second[1].value(), i * 4 + j) == Approx(V[i] * X[j] + X[i] * V[j]).margin(1e-12));
    }
}

TEST_CASE("create_graph gradients accumulate at fan-out and reduce broadcasts as recorded ops", "[higher_order]") {
    Generator gen(seed_base() + 2);
    ComputeGraph graph;
    const auto [xv, x] = random_input(graph, {3, 1}, "x", gen);
    const auto [bv, b] = random_input(graph, {1, 5}, "b", gen);
    // f = Σ_ij exp(x_i · b_j) · x_i: x is used twice (fan-out) and broadcast along j
    const Var f = sum(mul(exp(mul(x, b)), x));
    const Var gx = grad({f}, {x}, {}, {.create_graph = true})[0];
    REQUIRE(gx.shape() == Shape{3, 1});
    const Tensor d2 = grad({sum(gx)}, {x})[0].value();
    const std::vector<double> X = xv.to_vector(), B = bv.to_vector();
    for (int i = 0; i < 3; ++i) {
        double first = 0, second = 0;  // d/dx [e^{xb} x] = e^{xb}(b x + 1);  d²/dx² = e^{xb}(b² x + 2b)
        for (int j = 0; j < 5; ++j) {
            const double e = std::exp(X[i] * B[j]);
            first += e * (B[j] * X[i] + 1);
            second += e * (B[j] * B[j] * X[i] + 2 * B[j]);
        }
        CHECK(value_at(gx.value(), i) == Approx(first).epsilon(1e-12));
        CHECK(value_at(d2, i) == Approx(second).epsilon(1e-12));
    }
}

TEST_CASE("create_graph adds into Parameter gradients and leaves first order untouched", "[higher_order]") {
    Generator gen(seed_base() + 4);
    Parameter w(random_tensor({5}, gen), "w");
    ComputeGraph graph;
    const Var wv = graph.parameter(w);
    graph.backward(sum(mul(wv, wv)), {.create_graph = true});
    const std::vector<double> W = w.value().to_vector();
    for (int i = 0; i < 5; ++i) CHECK(value_at(w.grad(), i) == Approx(2 * W[i]).epsilon(1e-12));
    // grad() leaves leaf and Parameter gradients alone, as torch.autograd.grad
    const Tensor before = w.grad().clone();
    (void)grad({sum(wv.grad_var())}, {wv});
    for (int i = 0; i < 5; ++i) CHECK(value_at(w.grad(), i) == value_at(before, i));
}

TEST_CASE("hostile: create_graph over a freed graph is a HigherOrderError", "[higher_order][errors]") {
    Generator gen(seed_base() + 5);
    ComputeGraph graph;
    const Var x = graph.input(random_tensor({4}, gen), "x", true);
    const Var y = sum(exp(x));
    graph.backward(y);  // releases the saved tensors
    CHECK_THROWS_AS((graph.backward(y, {.create_graph = true})), HigherOrderError);
    CHECK_THROWS_AS((grad({y}, {x}, {}, {.create_graph = true})), HigherOrderError);
    CHECK_THROWS_WITH((grad({y}, {x}, {}, {.create_graph = true})), dgtest::Contains("released"));
}

TEST_CASE("an LSTM's gradient differentiates again: the input Hessian is symmetric", "[higher_order]") {
    // The rnn row's cases are checked against central differences above; here a loss with fan-out through h_n and
    // the output, where uᵀ·H·v = vᵀ·H·u must hold for the engine's Hessian-vector products.
    Generator gen(seed_base() + 6);
    ComputeGraph graph;
    const RnnOptions options{.hidden_size = 3, .num_layers = 2};
    const Var x = graph.input(random_tensor({3, 2, 2}, gen), "x", true);  // (T,N,I)
    const Var w = graph.input(random_tensor({rnn_weight_size(RnnMode::Lstm, options, 2)}, gen), "w", true);
    const RnnResult r = lstm(x, w, options);
    const Var y = add(sum(tanh(r.output)), sum(mul(r.h_n, r.c_n)));
    const Var gx = grad({y}, {x}, {}, {.create_graph = true})[0];
    REQUIRE(gx.requires_grad());
    const Tensor u = random_tensor({3, 2, 2}, gen), v = random_tensor({3, 2, 2}, gen);
    const Tensor hu = grad({sum(mul(gx, graph.constant(u)))}, {x}, {}, {.retain_graph = true})[0].value();
    const Tensor hv = grad({sum(mul(gx, graph.constant(v)))}, {x}, {}, {.retain_graph = true})[0].value();
    double u_hv = 0, v_hu = 0, scale = 0;
    for (std::int64_t i = 0; i < 12; ++i) {
        u_hv += value_at(u, i) * value_at(hv, i);
        v_hu += value_at(v, i) * value_at(hu, i);
        scale += std::abs(value_at(u, i) * value_at(hv, i));
    }
    CHECK(scale > 0);
    CHECK(u_hv == Approx(v_hu).margin(1e-12 * scale));
    // Without create_graph the same graph differentiates once through the kernels, to the same gradient.
    const Tensor first = grad({y}, {x}, {}, {.retain_graph = true})[0].value();
    CHECK(relative_norm_error(first, gx.value()) < 1e-12);
}

TEST_CASE("hostile: a custom op without a differentiable backward names itself", "[higher_order][errors]") {
    static const CustomOp twice = CustomOp::define({
        .name = "twice_no_second_order",
        .arity = 1,
        .infer = [](OpType, std::span<const Tensor> in, const OpAttrs&) { return OutputSpec{in[0].shape(), in[0].dtype()}; },
        .cpu = {[](const ForwardArgs& a) { return a.inputs[0] * 2.0; },
                [](const BackwardArgs& a) { return std::vector<Tensor>{a.grad_output * 2.0}; }},
    });
    Generator gen(seed_base() + 7);
    ComputeGraph graph;
    const Var x = graph.input(random_tensor({3}, gen), "x", true);
    const Var y = sum(twice({x}));
    CHECK_THROWS_AS((graph.backward(y, {.create_graph = true})), HigherOrderError);
    CHECK_THROWS_WITH((grad({y}, {x}, {}, {.create_graph = true})),
                      dgtest::Contains("twice_no_second_order"));
    CHECK(grad({y}, {x})[0].value().to_vector() == std::vector<double>{2.0, 2.0, 2.0});
}

TEST_CASE("hostile: an in-place change between the passes is a GraphError", "[higher_order][errors]") {
    Generator gen(seed_base() + 8);
    ComputeGraph graph;
    Tensor xv = random_tensor({4}, gen);
    const Var x = graph.input(xv, "x", true);
    const Var g = grad({sum(pow(x, 3.0))}, {x}, {}, {.create_graph = true})[0];
    xv.fill(0.5);  // the second pass would read the new x through pow's node
    CHECK_THROWS_AS((grad({sum(g)}, {x})), GraphError);
    CHECK_THROWS_WITH((grad({sum(g)}, {x})), dgtest::Contains("modified in place"));
}

TEST_CASE("a custom op with a differentiable backward differentiates twice", "[higher_order]") {
    // cube: y = x³, dy·3x² written with op functions, so the second derivative 6x·dy comes from the engine
    static const CustomOp cube = CustomOp::define({
        .name = "cube_second_order",
        .arity = 1,
        .infer = [](OpType, std::span<const Tensor> in, const OpAttrs&) { return OutputSpec{in[0].shape(), in[0].dtype()}; },
        .cpu = {[](const ForwardArgs& a) { return a.inputs[0] * a.inputs[0] * a.inputs[0]; },
                [](const BackwardArgs& a) {
                    return std::vector<Tensor>{a.grad_output * a.inputs[0] * a.inputs[0] * 3.0};
                }},
        .differentiable_backward = [](const DiffBackwardArgs& a) {
            return std::vector<Var>{mul(a.grad_output, mul_scalar(mul(a.inputs[0], a.inputs[0]), 3.0))};
        },
    });
    Generator gen(seed_base() + 9);
    ComputeGraph graph;
    const auto [xv, x] = random_input(graph, {5}, "x", gen);
    const Var d1 = grad({sum(cube({x}))}, {x}, {}, {.create_graph = true})[0];
    const Tensor d2 = grad({sum(d1)}, {x})[0].value();
    for (std::int64_t i = 0; i < 5; ++i) CHECK(value_at(d2, i) == Approx(6 * value_at(xv, i)).epsilon(1e-12));
}

TEST_CASE("higher_order_check catches a wrong second derivative element by element and by projections",
          "[higher_order][errors]") {
    // cube_wrong's differentiable backward treats 3x² as a constant: first order right, second order 0 instead of
    // 6x·dy. 16 elements are differentiated one by one, 600 along random projections (graph/gradcheck.h).
    const auto cube = [](const char* name, bool right) {
        return CustomOp::define({
            .name = name,
            .arity = 1,
            .infer = [](OpType, std::span<const Tensor> in, const OpAttrs&) {
                return OutputSpec{in[0].shape(), in[0].dtype()};
            },
            .cpu = {[](const ForwardArgs& a) { return a.inputs[0] * a.inputs[0] * a.inputs[0]; },
                    [](const BackwardArgs& a) {
                        return std::vector<Tensor>{a.grad_output * a.inputs[0] * a.inputs[0] * 3.0};
                    }},
            .differentiable_backward =
                right ? +[](const DiffBackwardArgs& a) {
                    return std::vector<Var>{mul(a.grad_output, mul_scalar(mul(a.inputs[0], a.inputs[0]), 3.0))};
                }
                      : +[](const DiffBackwardArgs& a) {
                    const Tensor slope = a.inputs[0].value() * a.inputs[0].value() * 3.0;
                    return std::vector<Var>{mul(a.grad_output, a.grad_output.graph().constant(slope))};
                },
        });
    };
    static const CustomOp right = cube("cube_right_second_order", true);
    static const CustomOp wrong = cube("cube_wrong_second_order", false);
    Generator gen(seed_base() + 12);
    for (const std::int64_t n : {16, 600}) {
        INFO(n << " elements");
        const OpCase op_case{"vector", {{n}}, {}, {}};
        const CheckResult good = higher_order_check(right.def(), op_case, gen, 2, kSecondOrderTolerance);
        CHECK(good.pass);
        CHECK(good.max_rel_err < kSecondOrderTolerance);
        const CheckResult bad = higher_order_check(wrong.def(), op_case, gen, 2, kSecondOrderTolerance);
        CHECK_FALSE(bad.pass);
        CHECK(bad.max_rel_err > 0.1);
        CHECK_THAT(bad.detail, dgtest::Contains(n > 32 ? "d2 input0 (16 random projections)" : "d2 input0"));
    }
}

TEST_CASE("vjp, jvp, hvp, jacobian and hessian match analytic derivatives", "[higher_order][functional]") {
    Generator gen(seed_base() + 10);
    const Tensor av = random_tensor({3, 3}, gen);
    const Tensor xv = random_tensor({3}, gen);
    const Tensor v = random_tensor({3}, gen);
    const std::vector<double> A = av.to_vector(), X = xv.to_vector(), V = v.to_vector();
    // y = tanh(A·x) (3): J = diag(1 − y²)·A
    const AdFunction layer = [&](std::span<const Var> in) {
        const Var a = in[0].graph().constant(av);
        return tanh(reshape(matmul(a, reshape(in[0], {3, 1})), {3}));
    };
    std::vector<double> y(3), jac(9);
    for (int i = 0; i < 3; ++i) {
        double z = 0;
        for (int j = 0; j < 3; ++j) z += A[i * 3 + j] * X[j];
        y[i] = std::tanh(z);
        for (int j = 0; j < 3; ++j) jac[i * 3 + j] = (1 - y[i] * y[i]) * A[i * 3 + j];
    }
    SECTION("jacobian") {
        const Tensor j = jacobian(layer, {xv})[0];
        REQUIRE(j.shape() == Shape{3, 3});
        for (int k = 0; k < 9; ++k) CHECK(value_at(j, k) == Approx(jac[k]).margin(1e-12));
    }
    SECTION("vjp and jvp (double vjp)") {
        const VjpResult back = vjp(layer, {xv}, v);
        const JvpResult forward = jvp(layer, {xv}, {v});
        for (int i = 0; i < 3; ++i) {
            double vj = 0, jv = 0;
            for (int k = 0; k < 3; ++k) {
                vj += V[k] * jac[k * 3 + i];
                jv += jac[i * 3 + k] * V[k];
            }
            CHECK(value_at(back.output, i) == Approx(y[i]).margin(1e-12));
            CHECK(value_at(back.vjp[0], i) == Approx(vj).margin(1e-12));
            CHECK(value_at(forward.jvp, i) == Approx(jv).margin(1e-12));
        }
    }
    SECTION("hvp and hessian of f = Σ x_i³ + x0·x1: H = diag(6x) + the off-diagonal pair") {
        const AdFunction f = [](std::span<const Var> in) {
            return sum(pow(in[0], 3.0)) + sum(mul(narrow(in[0], 0, 0, 1), narrow(in[0], 0, 1, 1)));
        };
        std::vector<double> h(9, 0.0);
        for (int i = 0; i < 3; ++i) h[i * 3 + i] = 6 * X[i];
        h[1] = h[3] = 1.0;
        const Tensor hessian_x = hessian(f, {xv})[0][0];
        REQUIRE(hessian_x.shape() == Shape{3, 3});
        for (int k = 0; k < 9; ++k) CHECK(value_at(hessian_x, k) == Approx(h[k]).margin(1e-12));
        const HvpResult hv = hvp(f, {xv}, {v});
        for (int i = 0; i < 3; ++i) {
            double expected = 0;
            for (int k = 0; k < 3; ++k) expected += h[i * 3 + k] * V[k];
            CHECK(value_at(hv.hvp[0], i) == Approx(expected).margin(1e-12));
        }
    }
    SECTION("typed errors") {
        CHECK_THROWS_AS((hvp(layer, {xv}, {v})), ShapeError);  // not a one-element output
        CHECK_THROWS_AS((jvp(layer, {xv}, {})), ValueError);
    }
}

TEST_CASE("a deep chain differentiates twice without recursion", "[higher_order]") {
    // y = x·a^n through n = 20000 mul_scalar nodes, then squared: the create_graph sweep records ~2n nodes and the
    // second backward walks all of them (explicit loops: no stack depth grows with the chain).
    constexpr int kDepth = 20000;
    const double a = 1.0 + 1e-5;
    Generator gen(seed_base() + 11);
    ComputeGraph graph;
    const auto [xv, x] = random_input(graph, {3}, "x", gen);
    Var y = x;
    for (int i = 0; i < kDepth; ++i) y = mul_scalar(y, a);
    const Var f = sum(mul(y, y));  // f = c·Σx², c = a^(2n): ∇f = 2c·x, ∇²f = 2c·I
    const Var g = grad({f}, {x}, {}, {.create_graph = true})[0];
    const Tensor h = grad({sum(g)}, {x})[0].value();
    const double c = std::pow(a, 2.0 * kDepth);
    for (std::int64_t i = 0; i < 3; ++i) {
        CHECK(value_at(g.value(), i) == Approx(2 * c * value_at(xv, i)).epsilon(1e-9));
        CHECK(value_at(h, i) == Approx(2 * c).epsilon(1e-9));
    }
}
