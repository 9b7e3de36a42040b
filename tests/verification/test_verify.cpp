// Replay verification on the CPU: a float32 graph replayed in float64 (every value and gradient
// compared), the report's first diverging node, the shadow verifier, and user-defined ops, which go
// through the same machinery as built-in ones.
#include <dyngrad/dyngrad.h>

#include "catch.h"

using namespace dyngrad;

namespace {

Tensor random(const Shape& shape, Generator& gen, DType dtype = DType::f32) {
    return Tensor::normal(shape, 0.0, 1.0, gen, dtype);
}

// A small MLP step: linear → relu → linear → cross_entropy.
Var mlp_loss(ComputeGraph& graph, const Parameter& w1, const Parameter& b1, const Parameter& w2, const Tensor& x,
             const Tensor& labels) {
    Var h = relu(linear(graph.input(x, "x"), graph.parameter(w1), graph.parameter(b1)));
    h.name("hidden");
    return cross_entropy(linear(h, graph.parameter(w2)), graph.input(labels, "labels"));
}

// That MLP's parameters (8 → 16 → 5) and a batch of 4 rows with fixed labels, drawn from `gen` in `dtype`.
struct Mlp {
    Parameter w1, b1, w2;
    Tensor x, labels;
    Var loss(ComputeGraph& graph) const { return mlp_loss(graph, w1, b1, w2, x, labels); }
};
Mlp random_mlp(Generator& gen, DType dtype = DType::f32) {
    return {Parameter(random({16, 8}, gen, dtype), "w1"), Parameter(random({16}, gen, dtype), "b1"),
            Parameter(random({5, 16}, gen, dtype), "w2"), random({4, 8}, gen, dtype),
            Tensor::from_vector(std::vector<std::int64_t>{0, 3, 4, 1}, {4})};
}

// A user op whose backward is deliberately wrong (gradient 3x instead of 2x), to see verify blame it.
OutputSpec same_shape(OpType, std::span<const Tensor> in, const OpAttrs&) { return {in[0].shape(), in[0].dtype()}; }
template <int kFactor>
std::vector<Tensor> square_backward(const BackwardArgs& args) {
    return dispatch_floating(args.grad_output.dtype(), "square", [&]<typename T>() {
        Tensor dx = Tensor::empty(args.inputs[0].shape(), args.inputs[0].dtype());
        for (std::int64_t i = 0; i < dx.numel(); ++i)
            dx.data<T>()[i] = T(kFactor) * args.inputs[0].data<T>()[i] * args.grad_output.data<T>()[i];
        return std::vector<Tensor>{dx};
    });
}
Tensor square_forward(const ForwardArgs& args) {
    return dispatch_floating(args.out.dtype, "square", [&]<typename T>() {
        Tensor y = Tensor::empty(args.out.shape, args.out.dtype);
        for (std::int64_t i = 0; i < y.numel(); ++i) y.data<T>()[i] = args.inputs[0].data<T>()[i] * args.inputs[0].data<T>()[i];
        return y;
    });
}
std::vector<OpCase> square_cases() { return {{"matrix", {{3, 4}}, {}, {}}}; }

}  // namespace

TEST_CASE("verify replays a float32 CPU graph in float64 and passes", "[verify]") {
    Generator gen(11);
    const Mlp mlp = random_mlp(gen);
    ComputeGraph graph;
    Var loss = mlp.loss(graph);
    const VerifyReport report = verify(graph, loss);
    INFO(report.table());
    CHECK(report.pass);
    CHECK(report.first_divergence == -1);
    CHECK(report.tolerance == 1e-5);
    CHECK(report.nodes.size() == graph.size());
    std::size_t with_grad = 0;
    for (const NodeCheck& n : report.nodes) with_grad += n.has_grad;
    CHECK(with_grad >= 6);  // w1 b1 w2, both linears, relu, and the loss
    CHECK_THAT(report.summary(), dgtest::Contains("PASS"));
    CHECK_THAT(report.table(), dgtest::Contains("'hidden'"));
    // verify ran the backward itself: the parameters got their gradients.
    CHECK(mlp.w1.grad().defined());
}

TEST_CASE("verify replays a bf16 and an f16 CPU graph in float64 within their default tolerance", "[verify][reduced]") {
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        Generator gen(12);
        const Mlp mlp = random_mlp(gen, dtype);
        ComputeGraph graph;
        Var loss = mlp.loss(graph);
        const VerifyReport report = verify(graph, loss);
        INFO(report.table());
        CHECK(report.pass);
        CHECK(report.tolerance == 16 * unit_roundoff(dtype));
        CHECK(mlp.w1.grad().dtype() == dtype);
    }
}

TEST_CASE("verify follows the recorded run's choice where float32 rounding ties a max", "[verify]") {
    // p = x·s: in float64 p1 = 3·float(1/3) = 1.0000000298 beats p0 = 1, in float32 both round to 1 and the
    // first wins. The replay must route the gradient as the recorded run did; it still checks p's values.
    ComputeGraph graph;
    Var x = graph.input(Tensor::from_vector(std::vector<float>{1.0f, 3.0f}, {1, 1, 1, 2}), "x");
    Var s = graph.input(Tensor::from_vector(std::vector<float>{1.0f, 1.0f / 3.0f}, {1, 1, 1, 2}), "s", true);
    Var p = x * s;
    REQUIRE(p.value().to_vector() == std::vector<double>{1.0, 1.0});
    Var loss = sum(max_pool2d(p, {1, 2}));
    const VerifyReport report = verify(graph, loss);
    INFO(report.summary());
    CHECK(report.pass);
    CHECK(s.grad().to_vector() == std::vector<double>{1.0, 0.0});  // the first of the tied pair
}

TEST_CASE("verify names the first node whose gradient diverges", "[verify]") {
    static const CustomOp wrong_square = CustomOp::define(
        {.name = "wrong_square", .arity = 1, .infer = same_shape, .cpu = {square_forward, square_backward<3>}});
    Generator gen(12);
    ComputeGraph graph;
    Var x = graph.input(random({3, 4}, gen), "x", true);
    Var y = wrong_square({tanh(x)});
    Var loss = sum(exp(y));
    // The replay uses the same (wrong) kernel, so values and gradients agree: verify compares two
    // backends, and the finite-difference check is what catches a wrong formula.
    CHECK(verify(graph, loss).pass);
    const CheckResult fd = finite_difference_check(wrong_square.def(), {"matrix", {{3, 4}}, {}, {}}, gen);
    CHECK_FALSE(fd.pass);
    CHECK(fd.max_rel_err > 0.1);
}

TEST_CASE("verify reports a divergence when the recorded run differs from the replay", "[verify]") {
    Generator gen(13);
    ComputeGraph graph;
    Var x = graph.input(random({5}, gen), "x", true);
    Var h = sigmoid(x);
    Var loss = sum(mul(h, h));
    graph.backward(loss, BackwardOptions{.retain_graph = false, .retain_grads = true});
    // Corrupt the recorded gradient of h: verify must blame h (the sigmoid node), not an earlier node.
    const_cast<ComputeNode&>(h.node()).grad.fill(123.0);
    const VerifyReport report = verify(graph, loss);
    REQUIRE_FALSE(report.pass);
    REQUIRE(report.first_divergence >= 0);
    const NodeCheck& first = report.nodes[static_cast<std::size_t>(report.first_divergence)];
    CHECK(first.op == "sigmoid");
    CHECK_THAT(report.summary(), dgtest::Contains("first diverging node: sigmoid"));
}

TEST_CASE("verify never passes NaN", "[verify]") {
    ComputeGraph graph;
    Var x = graph.input(Tensor::of({-1.0, 2.0}), "x", true);
    Var loss = sum(sqrt(x));  // sqrt(-1) = NaN in both runs
    const VerifyReport report = verify(graph, loss);
    CHECK_FALSE(report.pass);
}

TEST_CASE("verify needs the gradients of every node", "[verify]") {
    Generator gen(14);
    ComputeGraph graph;
    Var x = graph.input(random({3}, gen), "x", true);
    Var loss = sum(exp(x));
    graph.backward(loss);  // without retain_grads: intermediate gradients are gone
    CHECK_THROWS_MATCHES(verify(graph, loss), GraphError, dgtest::MessageHas({"retain_grads"}));
}

TEST_CASE("the shadow verifier checks every k-th training step", "[verify][shadow]") {
    Generator gen(15);
    Parameter w1(random({16, 8}, gen), "w1"), b1(random({16}, gen), "b1"), w2(random({5, 16}, gen), "w2");
    const Tensor labels = Tensor::from_vector(std::vector<std::int64_t>{0, 3, 4, 1}, {4});
    ShadowVerifier shadow(3);
    for (std::int64_t step = 0; step < 7; ++step) {
        ComputeGraph graph;
        Var loss = mlp_loss(graph, w1, b1, w2, random({4, 8}, gen), labels);
        graph.backward(loss, shadow.backward_options(step));
        if (shadow.due(step)) CHECK(shadow.check(graph, loss).pass);
        for (Parameter* p : {&w1, &b1, &w2}) p->zero_grad();
    }
    CHECK(shadow.checks() == 3);  // steps 0, 3, 6
    CHECK(shadow.failures() == 0);
    CHECK_THROWS_AS(ShadowVerifier(-1), ValueError);
}

TEST_CASE("a user-defined op is recorded, differentiated and checked like a built-in op", "[custom]") {
    static const CustomOp square = CustomOp::define({.name = "square",
                                                     .arity = 1,
                                                     .infer = same_shape,
                                                     .cpu = {square_forward, square_backward<2>},
                                                     .cases = square_cases});
    Generator gen(16);
    for (const OpCase& c : square.def().cases()) {
        CHECK(finite_difference_check(square.def(), c, gen).pass);
        CHECK(float32_check(square.def(), c, gen).pass);
    }
    ComputeGraph graph;
    Var x = graph.input(Tensor::of({1.0, -2.0, 3.0}, DType::f64), "x", true);
    Var y = square({x});
    CHECK_THAT(graph.describe_node(y.id()), dgtest::Contains("square"));
    CHECK_THAT(graph.describe_node(y.id()), dgtest::Contains("test_verify.cpp"));
    graph.backward(sum(y));
    CHECK(x.grad().to_vector() == std::vector<double>{2.0, -4.0, 6.0});

    ComputeGraph replayed;
    Var x2 = replayed.input(random({2, 3}, gen), "x", true);
    CHECK(verify(replayed, sum(square({x2}))).pass);
}

TEST_CASE("custom op definitions are validated", "[custom]") {
    CHECK_THROWS_AS(CustomOp::define({.name = "", .arity = 1, .infer = same_shape, .cpu = {square_forward, square_backward<2>}}),
                    ValueError);
    CHECK_THROWS_AS(CustomOp::define({.name = "no_backward", .arity = 1, .infer = same_shape, .cpu = {square_forward, nullptr}}),
                    ValueError);
    CHECK_THROWS_AS(custom_op_def(1u << 30), GraphError);
}
