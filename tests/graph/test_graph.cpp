// Graph semantics with real ops: accumulation at fan-out, parameters across graphs, grad modes,
// retain_graph / retain_grads, deep graphs, stale handles and debug names.
#include <cmath>
#include <string>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::f64;
using dgtest::Approx;
using dgtest::ApproxVector;
using dgtest::MessageHas;

TEST_CASE("fan-out accumulates gradients", "[graph][fanout]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, -2, 3}), "x", true);

    SECTION("y = x + x") {
        graph.backward(sum(x + x));
        CHECK_THAT(x.grad().to_vector(), ApproxVector({2, 2, 2}));
    }
    SECTION("y = x * x") {
        graph.backward(sum(x * x));
        CHECK_THAT(x.grad().to_vector(), ApproxVector({2, -4, 6}));
    }
    SECTION("diamond a -> b, c -> d") {
        Var b = x * 2.0;        // 2a
        Var c = x * x;          // a²
        Var d = mul(b, c);      // 2a³: dd/da = 6a²
        Var e = add(d, b);      // + 2a: de/da = 6a² + 2
        graph.backward(sum(e));
        CHECK_THAT(x.grad().to_vector(), ApproxVector({8, 26, 56}));
    }
    SECTION("one input used by many ops at once") {
        Var y = sum(x * x * x - x * 3.0 + exp(x) * 0.0 + x / 2.0);  // d/dx: 3x² - 3 + 0.5
        graph.backward(y);
        CHECK_THAT(x.grad().to_vector(), ApproxVector({0.5, 9.5, 24.5}));
    }
}

TEST_CASE("broadcast gradients are reduced to the input shape", "[graph][broadcast]") {
    ComputeGraph graph;
    Var m = graph.input(Tensor::ones({2, 3}, DType::f64), "m", true);
    Var bias = graph.input(f64({1, 2, 3}), "bias", true);
    Var column = graph.input(Tensor::from_vector(std::vector<double>{10, 20}, {2, 1}, DType::f64), "column", true);
    Var y = sum((m + bias) * column);  // y = Σ_ij (m_ij + bias_j) · column_i
    graph.backward(y);
    CHECK(bias.grad().shape() == Shape{3});
    CHECK_THAT(bias.grad().to_vector(), ApproxVector({30, 30, 30}));
    CHECK(column.grad().shape() == Shape{2, 1});
    CHECK_THAT(column.grad().to_vector(), ApproxVector({9, 9}));
    CHECK_THAT(m.grad().to_vector(), ApproxVector({10, 10, 10, 20, 20, 20}));
}

TEST_CASE("parameters shared across graphs accumulate until zero_grad", "[graph][parameter]") {
    Parameter w(f64({1, 2, 3}), "w");
    CHECK_FALSE(w.grad().defined());

    ComputeGraph first;
    Var x = first.input(f64({4, 5, 6}), "x");
    first.backward(sum(first.parameter(w) * x));  // d/dw = x
    CHECK_THAT(w.grad().to_vector(), ApproxVector({4, 5, 6}));

    ComputeGraph second;
    Var wv = second.parameter(w);
    second.backward(sum(wv * wv));  // d/dw = 2w, added to the first graph's gradient
    CHECK_THAT(w.grad().to_vector(), ApproxVector({6, 9, 12}));
    // The node's own gradient is only this graph's contribution.
    CHECK_THAT(wv.grad().to_vector(), ApproxVector({2, 4, 6}));

    // Copies of a Parameter share state.
    Parameter alias = w;
    CHECK(alias.grad().shares_storage_with(w.grad()));
    alias.zero_grad();
    CHECK_FALSE(w.grad().defined());

    ComputeGraph third;
    third.backward(sum(third.parameter(w) * 3.0));
    CHECK_THAT(w.grad().to_vector(), ApproxVector({3, 3, 3}));
    CHECK(w.name() == "w");
    CHECK(w.value().to_vector() == std::vector<double>{1, 2, 3});
}

TEST_CASE("gradients accumulate over backward calls of cleared graphs", "[graph][parameter]") {
    Parameter w(f64({0.5, -1}), "w");
    ComputeGraph graph;
    for (int step = 0; step < 3; ++step) {
        Var x = graph.input(f64({2, 4}), "x");
        graph.backward(sum(graph.parameter(w) * x));
        graph.clear();
        CHECK(graph.size() == 0);
    }
    CHECK_THAT(w.grad().to_vector(), ApproxVector({6, 12}));
    w.zero_grad();
    Var x = graph.input(f64({2, 4}), "x");
    graph.backward(sum(graph.parameter(w) * x));
    CHECK_THAT(w.grad().to_vector(), ApproxVector({2, 4}));
}

TEST_CASE("no_grad records no history", "[graph][no_grad]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, -1}), "x", true);
    Parameter w(f64({2, 2}), "w");
    CHECK(grad_enabled());
    {
        NoGradGuard guard;
        CHECK_FALSE(grad_enabled());
        Var y = relu(x * 2.0);
        Var p = graph.parameter(w);
        Var loss = sum(y * p);
        CHECK_FALSE(y.requires_grad());
        CHECK_FALSE(p.requires_grad());
        CHECK_FALSE(loss.requires_grad());
        CHECK(y.node().op == OpType::Leaf);
        CHECK(loss.item() == Approx(4));
        CHECK_THROWS_MATCHES(graph.backward(loss), GraphError, MessageHas({"does not require grad"}));
        {
            NoGradGuard nested;
            CHECK_FALSE(grad_enabled());
        }
        CHECK_FALSE(grad_enabled());
    }
    CHECK(grad_enabled());
    Var z = sum(x * 2.0);
    CHECK(z.requires_grad());
    graph.backward(z);
    CHECK_THAT(x.grad().to_vector(), ApproxVector({2, 2}));
    CHECK_FALSE(w.grad().defined());
}

TEST_CASE("detach stops the gradient", "[graph][detach]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, 2, 3}), "x", true);
    Var doubled = x * 2.0;
    Var d = detach(doubled);
    CHECK_FALSE(d.requires_grad());
    CHECK(d.value().shares_storage_with(doubled.value()));
    graph.backward(sum(d * x));  // d/dx (d·x) with d constant = d = 2x (not 4x)
    CHECK_THAT(x.grad().to_vector(), ApproxVector({2, 4, 6}));
    CHECK_THROWS_AS(d.grad(), GraphError);
}

TEST_CASE("backward twice needs retain_graph", "[graph][retain_graph]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, 2}), "x", true);
    Var loss = sum(exp(x) * x);

    SECTION("without retain_graph the second backward throws") {
        graph.backward(loss);
        CHECK_THROWS_MATCHES(graph.backward(loss), GraphError, MessageHas({"retain_graph"}));
    }
    SECTION("with retain_graph leaf gradients accumulate") {
        graph.backward(loss, BackwardOptions{.retain_graph = true});
        const std::vector<double> once = x.grad().to_vector();
        // d/dx (x eˣ) = (x + 1) eˣ
        CHECK_THAT(once, ApproxVector({2 * std::exp(1.0), 3 * std::exp(2.0)}));
        graph.backward(loss);
        CHECK_THAT(x.grad().to_vector(), ApproxVector({2 * once[0], 2 * once[1]}));
        CHECK_THROWS_MATCHES(graph.backward(loss), GraphError, MessageHas({"retain_graph"}));
    }
}

TEST_CASE("free_values releases intermediate values during backward", "[graph][free_values]") {
    auto run = [](bool free_values, std::vector<double>& dx, Tensor& h_value_after) {
        ComputeGraph graph;
        Var x = graph.input(f64({0.5, -1.5, 2}), "x", true);
        Var h = exp(x * 2.0).name("h");
        Var loss = sum(h * x);
        graph.backward(loss, BackwardOptions{.free_values = free_values});
        dx = x.grad().to_vector();
        CHECK(loss.item() == Approx(0.5 * std::exp(1.0) - 1.5 * std::exp(-3.0) + 2 * std::exp(4.0)));
        CHECK(x.value().numel() == 3);  // leaves keep their values
        if (free_values) {
            CHECK_THROWS_MATCHES(h.value(), GraphError, MessageHas({"'h'", "free_values"}));
            CHECK_THROWS_MATCHES(h + 1.0, GraphError, MessageHas({"input 0", "'h'", "free_values"}));
        } else {
            h_value_after = h.value();
        }
    };
    std::vector<double> kept, freed;
    Tensor h_value;
    run(false, kept, h_value);
    run(true, freed, h_value);
    CHECK(freed == kept);  // the same gradients, bit for bit
    CHECK(h_value.numel() == 3);
}

TEST_CASE("retain_grads keeps intermediate gradients", "[graph][retain_grads]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, -2}), "x", true);
    Var h = x * 2.0;
    Var loss = sum(h * h);

    SECTION("off: intermediates drop their gradient") {
        graph.backward(loss);
        CHECK_THROWS_MATCHES(h.grad(), GraphError, MessageHas({"retain_grads"}));
        CHECK_THAT(x.grad().to_vector(), ApproxVector({8, -16}));
    }
    SECTION("on: every node keeps it") {
        graph.backward(loss, BackwardOptions{.retain_grads = true});
        CHECK_THAT(h.grad().to_vector(), ApproxVector({4, -8}));
        CHECK(loss.grad().item() == 1);
        CHECK_THAT(x.grad().to_vector(), ApproxVector({8, -16}));
    }
}

TEST_CASE("a chain of a million nodes back-propagates without recursion", "[graph][deep]") {
    constexpr int kDepth = 1'000'000;
    ComputeGraph graph;
    Var x = graph.input(Tensor::full({}, 0.5, DType::f64), "x", true);
    Var y = x;
    for (int i = 0; i < kDepth; ++i) y = add_scalar(y, 1.0);
    y = y * 3.0;
    CHECK(graph.size() == kDepth + 2);
    CHECK(y.item() == Approx(3 * (0.5 + kDepth)));
    graph.backward(y);
    CHECK(x.grad().item() == 3);
    graph.clear();
    CHECK(graph.size() == 0);
}

TEST_CASE("backward of a non-scalar output", "[graph][backward]") {
    ComputeGraph graph;
    Var x = graph.input(Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64), "x", true);
    Var y = x * 3.0;

    SECTION("without a gradient it names the shape") {
        CHECK_THROWS_MATCHES(graph.backward(y), GraphError, MessageHas({"(2,3)", "explicit gradient"}));
    }
    SECTION("with an explicit gradient") {
        const Tensor g = Tensor::from_vector(std::vector<double>{1, 0, -1, 2, 0.5, 0}, {2, 3}, DType::f64);
        graph.backward(y, g);
        CHECK(x.grad().shape() == Shape{2, 3});
        CHECK_THAT(x.grad().to_vector(), ApproxVector({3, 0, -3, 6, 1.5, 0}));
    }
    SECTION("a gradient of another shape or dtype is refused") {
        CHECK_THROWS_AS(graph.backward(y, Tensor::ones({3, 2}, DType::f64)), GraphError);
        CHECK_THROWS_AS(graph.backward(y, Tensor::ones({2, 3}, DType::f32)), GraphError);
        CHECK_THROWS_AS(graph.backward(y, Tensor()), GraphError);
    }
    SECTION("a one-element output of any rank is a loss") {
        Var s = sum(y, {0, 1}, true);
        CHECK(s.shape() == Shape{1, 1});
        graph.backward(s);
        CHECK_THAT(x.grad().to_vector(), ApproxVector({3, 3, 3, 3, 3, 3}));
    }
}

TEST_CASE("handles into cleared or other graphs are refused", "[graph][handles]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, 2}), "x", true);
    Var y = relu(x);

    SECTION("stale Var after clear()") {
        graph.clear();
        CHECK_THROWS_MATCHES(y.value(), GraphError, MessageHas({"cleared"}));
        CHECK_THROWS_AS(x.grad(), GraphError);
        CHECK_THROWS_AS(relu(x), GraphError);
        CHECK_THROWS_AS(graph.backward(y), GraphError);
        // New nodes reuse the ids, but the old handles stay stale.
        Var fresh = graph.input(f64({5}), "fresh");
        CHECK(fresh.id() == x.id());
        CHECK_THROWS_AS(x.value(), GraphError);
        CHECK(fresh.value().item() == 5);
    }
    SECTION("Var from another graph") {
        ComputeGraph other;
        Var z = other.input(f64({3, 4}), "z", true);
        CHECK_THROWS_MATCHES(add(x, z), GraphError, MessageHas({"add", "another graph"}));
        CHECK_THROWS_MATCHES(graph.backward(sum(z)), GraphError, MessageHas({"another graph"}));
    }
    SECTION("undefined Var") {
        const Var none;
        CHECK_FALSE(none.defined());
        CHECK_THROWS_AS(none.value(), GraphError);
        CHECK_THROWS_AS(add(x, none), GraphError);
    }
}

TEST_CASE("subgraphs that need no gradient are skipped", "[graph][requires_grad]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, 2}), "x", true);
    Var c = graph.input(f64({3, 4}), "c");
    Var k = graph.constant(f64({0.5, 0.5}));
    Var ck = exp(c) * k;  // nothing under it requires grad
    CHECK_FALSE(c.requires_grad());
    CHECK_FALSE(ck.requires_grad());
    Var y = sum(x * c + ck);
    CHECK(y.requires_grad());
    graph.backward(y, BackwardOptions{.retain_grads = true});
    CHECK_THAT(x.grad().to_vector(), ApproxVector({3, 4}));
    CHECK_THROWS_MATCHES(c.grad(), GraphError, MessageHas({"has no gradient"}));
    CHECK_THROWS_AS(k.grad(), GraphError);
    CHECK_THROWS_AS(ck.grad(), GraphError);
    CHECK_THROWS_AS(graph.input(Tensor::of({1, 2}, DType::i64), "labels", true), DTypeError);
}

TEST_CASE("float32 graphs give float32 gradients", "[graph][dtype]") {
    ComputeGraph graph;
    Var x = graph.input(Tensor::of({0.5, -1.5}), "x", true);
    graph.backward(sum(tanh(x) * x));
    CHECK(x.grad().dtype() == DType::f32);
    // d/dx (x tanh x) = tanh x + x (1 - tanh² x)
    const auto expected = [](double v) { return std::tanh(v) + v * (1 - std::tanh(v) * std::tanh(v)); };
    CHECK_THAT(x.grad().to_vector(), ApproxVector({expected(0.5), expected(-1.5)}, 1e-6));
}

TEST_CASE("nodes carry debug names and creation sites", "[graph][names]") {
    ComputeGraph graph;
    Var x = graph.input(f64({1, 2}), "pixels", true);
    Var h = relu(x);
    const int relu_line = __LINE__ - 1;
    h.name("hidden");
    Var s = x + h;
    const int plus_line = __LINE__ - 1;
    Parameter w(f64({1, 1}), "weight");
    Var wv = graph.parameter(w);

    const std::string relu_text = graph.describe_node(h.id());
    INFO(relu_text);
    CHECK_THAT(relu_text, dgtest::Contains("relu"));
    CHECK_THAT(relu_text, dgtest::Contains(str("#", h.id())));
    CHECK_THAT(relu_text, dgtest::Contains("'hidden'"));
    CHECK_THAT(relu_text, dgtest::Contains(str("test_graph.cpp:", relu_line)));
    CHECK(h.node().name == "hidden");

    const std::string plus_text = graph.describe_node(s.id());
    INFO(plus_text);
    CHECK_THAT(plus_text, dgtest::Contains("add"));
    CHECK_THAT(plus_text, dgtest::Contains(str("test_graph.cpp:", plus_line)));

    CHECK_THAT(graph.describe_node(x.id()), dgtest::Contains("leaf"));
    CHECK_THAT(graph.describe_node(x.id()), dgtest::Contains("'pixels'"));
    CHECK_THAT(graph.describe_node(wv.id()), dgtest::Contains("'weight'"));
    CHECK_THROWS_AS(graph.describe_node(1000), GraphError);
    CHECK(graph.handle(h.id()).value().shares_storage_with(h.value()));
}

TEST_CASE("a parameter belongs to one pending forward pass at a time", "[graph][parameter][binding]") {
    Parameter w(f64({1, 2}), "w");
    ComputeGraph first, second;
    Var a = first.parameter(w);
    const int first_line = __LINE__ - 1;

    SECTION("a second graph is refused, naming the parameter and the first recording") {
        const std::size_t nodes = second.size();
        CHECK_THROWS_MATCHES(second.parameter(w), GraphError,
                             MessageHas({"parameter 'w'", "another graph's pending forward pass",
                                         str("test_graph.cpp:", first_line), "backward()", "clear()", "destroy"}));
        CHECK(second.size() == nodes);
        // Copies share the binding.
        Parameter alias = w;
        CHECK_THROWS_AS(second.parameter(alias), GraphError);
    }
    SECTION("the same graph may record it again") {
        Var b = first.parameter(w);
        first.backward(sum(a * b));  // d/dw (w·w) = 2w
        CHECK_THAT(w.grad().to_vector(), ApproxVector({2, 4}));
    }
    SECTION("recording under no_grad does not bind") {
        NoGradGuard no_grad;
        CHECK(second.parameter(w).value().shares_storage_with(w.value()));
    }
    SECTION("a backward without retain_graph releases it") {
        first.backward(sum(a));
        Var b = second.parameter(w);
        // Now bound to the second graph: the first may not record it again until that one is done.
        CHECK_THROWS_MATCHES(first.parameter(w), GraphError, MessageHas({"'w'", "another graph"}));
        second.backward(sum(b * 2.0));
        CHECK_THAT(w.grad().to_vector(), ApproxVector({3, 3}));
        CHECK_NOTHROW(first.parameter(w));
    }
    SECTION("a backward with retain_graph keeps it bound") {
        Var loss = sum(a * a);
        first.backward(loss, BackwardOptions{.retain_graph = true});
        CHECK_THROWS_AS(second.parameter(w), GraphError);
        first.backward(loss);
        CHECK_NOTHROW(second.parameter(w));
    }
    SECTION("clear() releases it") {
        first.clear();
        CHECK_NOTHROW(second.parameter(w));
    }
    SECTION("destroying the graph releases it") {
        first.clear();
        {
            ComputeGraph scoped;
            scoped.parameter(w);
            CHECK_THROWS_MATCHES(second.parameter(w), GraphError, MessageHas({"another graph"}));
        }
        CHECK_NOTHROW(second.parameter(w));
    }
}

TEST_CASE("a parameter recorded by no graph with grad is free everywhere", "[graph][parameter][binding]") {
    Parameter w(f64({1}), "w");
    {
        NoGradGuard no_grad;
        ComputeGraph first;
        first.parameter(w);
        ComputeGraph second;
        second.parameter(w);  // neither binds
    }
    ComputeGraph graph;
    Var v = graph.parameter(w);
    graph.backward(sum(v * 5.0));
    CHECK(w.grad().item() == 5);
}

TEST_CASE("profiling ranges switch on and off without changing results", "[graph][profiling]") {
    const bool previous = profiling_ranges();
    auto run = [] {
        ComputeGraph graph;
        Var x = graph.input(Tensor::of({1, -2, 3}), "x", true);
        graph.backward(sum(relu(x) * x));
        return x.grad().to_vector();
    };
    const std::vector<double> plain = run();
    set_profiling_ranges(true);
    CHECK(profiling_ranges());
    const std::vector<double> ranged = run();
    set_profiling_ranges(false);
    CHECK_FALSE(profiling_ranges());
    set_profiling_ranges(previous);
    CHECK(ranged == plain);
    CHECK(plain == std::vector<double>{2, 0, 6});
}

// BackwardOptions::on_parameter_ready (the hook data-parallel training launches all-reduces from): one call
// per reached parameter, in readiness order, each after that parameter's gradient for the pass is final.
TEST_CASE("on_parameter_ready: once per reached parameter, when its gradient is final", "[graph][parameter][hook]") {
    Generator gen(91);
    Parameter w1(Tensor::uniform({4, 3}, -1, 1, gen, DType::f64), "w1");
    Parameter w2(Tensor::uniform({2, 4}, -1, 1, gen, DType::f64), "w2");
    Parameter shared(Tensor::uniform({4}, -1, 1, gen, DType::f64), "shared");
    Parameter unused(Tensor::uniform({4}, -1, 1, gen, DType::f64), "unused");
    Parameter frozen(Tensor::uniform({2}, -1, 1, gen, DType::f64), "frozen");
    frozen.set_requires_grad(false);
    const Tensor x = Tensor::uniform({5, 3}, -1, 1, gen, DType::f64);

    std::vector<std::string> order;
    std::vector<std::vector<double>> grad_at_call;
    BackwardOptions options;
    options.on_parameter_ready = [&](const Parameter& p) {
        order.push_back(p.name());
        grad_at_call.push_back(p.grad().to_vector());
    };
    ComputeGraph graph;
    // `shared` is recorded twice (before w1's use and after it): its gradient is final only after both.
    const Var s1 = graph.parameter(shared);
    Var h = relu(linear(graph.input(x), graph.parameter(w1)) * s1);
    h = h + graph.parameter(shared);
    graph.parameter(unused);  // recorded, but nothing reaches the loss from it
    const Var y = linear(h, graph.parameter(w2)) + graph.parameter(frozen);
    graph.backward(sum(y * y), options);

    // Readiness order: w2 (recorded last), then w1, then shared (its first leaf is the earliest node).
    REQUIRE(order == std::vector<std::string>{"w2", "w1", "shared"});
    CHECK(grad_at_call[0] == w2.grad().to_vector());
    CHECK(grad_at_call[1] == w1.grad().to_vector());
    CHECK(grad_at_call[2] == shared.grad().to_vector());  // both contributions were in at the call
    CHECK_FALSE(unused.grad().defined());

    // A second pass (no zero_grad): the call sees the accumulated gradient, twice the first.
    order.clear();
    grad_at_call.clear();
    ComputeGraph again;
    const Var z = linear(again.input(x), again.parameter(w1));
    again.backward(sum(z * z), options);
    REQUIRE(order == std::vector<std::string>{"w1"});
    CHECK(grad_at_call[0] == w1.grad().to_vector());

    // Without the option, nothing is called and the gradients are the same as with it.
    Parameter plain(w2.value().clone(), "plain");
    ComputeGraph quiet;
    quiet.backward(sum(linear(quiet.input(Tensor::uniform({3, 4}, -1, 1, gen, DType::f64)), quiet.parameter(plain))));
    CHECK(plain.grad().defined());
}

TEST_CASE("on_parameter_ready: an exception from the callback ends the backward typed", "[graph][hook]") {
    Generator gen(92);
    Parameter w(Tensor::uniform({3, 3}, -1, 1, gen), "w");
    ComputeGraph graph;
    const Var y = linear(graph.input(Tensor::uniform({2, 3}, -1, 1, gen)), graph.parameter(w));
    BackwardOptions options;
    options.on_parameter_ready = [](const Parameter& p) { throw ValueError("refused " + p.name()); };
    CHECK_THROWS_MATCHES(graph.backward(sum(y), options), ValueError, MessageHas({"refused w"}));
}
