// Activation checkpointing (graph/checkpoint.h): first-order gradients bitwise equal to the run without it (CPU,
// deterministic) for plain segments, dropout and autocast; second order through a checkpointed segment (equal up
// to the grouping of float sums), the GPT with every block checkpointed, fewer live tensors after the forward, the
// segment released again after its backward, and the typed errors of bad calls.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "catch.h"
#include "check_reporting.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

std::uint64_t seed_base() { return dgtest::seed_base("test_checkpoint", 20261128); }

Tensor random(const Shape& shape, Generator& gen, DType dtype = DType::f32) {
    return Tensor::normal(shape, 0.0, 1.0, gen, dtype);
}

// Two Linear layers with a tanh and dropout between them: a segment with parameters, an RNG op and saved values.
struct Mlp {
    Linear fc1, fc2;
    Mlp(std::int64_t width, Generator& gen) : fc1(width, 2 * width, true, gen), fc2(2 * width, width, true, gen) {}
    Var operator()(const Var& x, double p, std::uint64_t seed) const {
        return fc2(dropout(tanh(fc1(x)), p, p > 0, seed));
    }
    std::vector<Parameter> parameters() const {
        std::vector<Parameter> all = fc1.parameters();
        for (const Parameter& q : fc2.parameters()) all.push_back(q);
        return all;
    }
};

struct Gradients {
    std::vector<std::vector<double>> values;
    bool operator==(const Gradients&) const = default;
};

// loss = sum(w · f(f(x))) for two stacked segments; returns the input's and every parameter's gradient.
Gradients run_stack(const Mlp& a, const Mlp& b, const Tensor& x, const Tensor& w, bool use_checkpoint, double p,
                    GraphMemory* after_forward = nullptr) {
    for (Parameter q : a.parameters()) q.zero_grad();
    for (Parameter q : b.parameters()) q.zero_grad();
    ComputeGraph g;
    const Var in = g.input(x, "x", true);
    const auto segment = [&](const Mlp& m, std::uint64_t seed) {
        return [&m, p, seed](const Var& v) { return m(v, p, seed); };
    };
    Var h = use_checkpoint ? checkpoint(segment(a, 11), in) : a(in, p, 11);
    h = use_checkpoint ? checkpoint(segment(b, 12), h) : b(h, p, 12);
    const Var loss = sum(mul(h, g.constant(w)));
    if (after_forward != nullptr) *after_forward = graph_memory(g);
    g.backward(loss);
    Gradients out;
    out.values.push_back(in.grad().to_vector());
    for (const Mlp* m : {&a, &b})
        for (const Parameter& q : m->parameters()) out.values.push_back(q.grad().to_vector());
    return out;
}

}  // namespace

TEST_CASE("checkpoint: gradients bitwise equal to the plain run, with and without dropout", "[checkpoint]") {
    const std::uint64_t seed = seed_base();
    INFO("seed " << seed);
    Generator gen(seed);
    const Mlp a(8, gen), b(8, gen);
    const Tensor x = random({5, 8}, gen), w = random({5, 8}, gen);
    for (const double p : {0.0, 0.3}) {
        INFO("dropout p " << p);
        const Gradients plain = run_stack(a, b, x, w, false, p);
        const Gradients checkpointed = run_stack(a, b, x, w, true, p);
        CHECK(plain.values.size() == checkpointed.values.size());
        CHECK(plain == checkpointed);
    }
    // The masks matter: with p > 0 the gradient differs from p = 0's, so equality above is not vacuous.
    CHECK(run_stack(a, b, x, w, true, 0.3) != run_stack(a, b, x, w, true, 0.0));
}

TEST_CASE("checkpoint: fewer live tensors after the forward; the segment is dropped again after its backward",
          "[checkpoint][memory]") {
    Generator gen(seed_base() + 1);
    const Mlp a(16, gen), b(16, gen);
    const Tensor x = random({32, 16}, gen), w = random({32, 16}, gen);
    GraphMemory plain, checkpointed;
    run_stack(a, b, x, w, false, 0.2, &plain);
    run_stack(a, b, x, w, true, 0.2, &checkpointed);
    INFO("plain: " << plain.tensors << " tensors, " << plain.bytes << " bytes; checkpointed: " << checkpointed.tensors
                   << " tensors, " << checkpointed.bytes << " bytes");
    CHECK(checkpointed.tensors < plain.tensors);
    // Each segment keeps its output (32x16) instead of fc1, tanh, dropout (32x32 each) and fc2 (32x16).
    CHECK(checkpointed.bytes * 2 < plain.bytes);

    ComputeGraph g;
    const Var in = g.input(x, "x", true);
    const Var y = checkpoint([&](const Var& v) { return a(v, 0.2, 5); }, in);
    const Var loss = sum(mul(y, g.constant(w)));
    const GraphMemory before = graph_memory(g);
    g.backward(loss, {.retain_graph = true});
    CHECK(graph_memory(g).bytes == before.bytes);  // replayed, used, dropped again
    const std::vector<double> first = in.grad().to_vector();
    g.backward(loss);  // a retained graph replays the segment again
    const std::vector<double> twice = in.grad().to_vector();
    REQUIRE(twice.size() == first.size());
    for (std::size_t i = 0; i < first.size(); ++i) CHECK(twice[i] == 2 * first[i]);
}

TEST_CASE("checkpoint under autocast (CPU bf16): the recorded casts replay, gradients bitwise equal",
          "[checkpoint][autocast]") {
    Generator gen(seed_base() + 2);
    const Mlp a(8, gen), b(8, gen);
    const Tensor x = random({4, 8}, gen), w = random({4, 8}, gen);
    const auto run = [&](bool use_checkpoint) {
        const AutocastGuard autocast(DType::bf16);
        return run_stack(a, b, x, w, use_checkpoint, 0.25);
    };
    const Gradients plain = run(false);
    CHECK(plain == run(true));
    // Autocast did something: the f32 run's gradients differ.
    CHECK(plain != run_stack(a, b, x, w, false, 0.25));
}

TEST_CASE("checkpoint composes with create_graph: second order through a checkpointed segment", "[checkpoint][hvp]") {
    Generator gen(seed_base() + 3);
    const Mlp a(6, gen);
    const Tensor x = random({3, 6}, gen, DType::f32), w = random({3, 6}, gen), v = random({3, 6}, gen);
    const auto second_order = [&](bool use_checkpoint) {
        for (Parameter q : a.parameters()) q.zero_grad();
        ComputeGraph g;
        const Var in = g.input(x, "x", true);
        const auto f = [&](const Var& u) { return a(u, 0.2, 9); };
        const Var y = use_checkpoint ? checkpoint(f, in) : f(in);
        const Var loss = sum(mul(tanh(y), g.constant(w)));
        const std::vector<Var> dx = grad({loss}, {in}, {}, {.create_graph = true});
        // A Hessian-vector product: d/dx <dL/dx, v>, and the parameters' second-order gradient with it.
        g.backward(sum(mul(dx[0], g.constant(v))));
        std::vector<std::vector<double>> out{dx[0].value().to_vector(), in.grad().to_vector()};
        for (const Parameter& q : a.parameters()) out.push_back(q.grad().to_vector());
        return out;
    };
    const auto plain = second_order(false);
    const auto checkpointed = second_order(true);
    REQUIRE(plain.size() == checkpointed.size());
    CHECK(plain[0] == checkpointed[0]);  // the first-order gradient: bitwise
    // Second order: the output marker sums what reaches the segment's output before it meets the segment's own
    // contributions, so float32 sums may group differently (an ulp or so).
    double largest = 0;
    for (std::size_t k = 1; k < plain.size(); ++k) {
        REQUIRE(plain[k].size() == checkpointed[k].size());
        for (std::size_t i = 0; i < plain[k].size(); ++i) {
            CHECK(std::abs(plain[k][i] - checkpointed[k][i]) <= 1e-5 * std::abs(plain[k][i]) + 1e-6);
            largest = std::max(largest, std::abs(plain[k][i]));
        }
    }
    CHECK(largest > 1e-3);  // the second-order gradients are not trivially zero
}

TEST_CASE("GPT with every block checkpointed: loss and gradients bitwise equal, fewer bytes kept",
          "[checkpoint][gpt]") {
    const auto run = [](bool use_checkpoint, GraphMemory& memory) {
        Generator gen(seed_base() + 4);
        GPTConfig config{.vocab_size = 11, .context = 8, .layers = 2, .heads = 2, .width = 16, .dropout = 0.1,
                         .seed = 3};
        config.checkpoint = use_checkpoint;
        GPT model(config, gen);
        model.train(true);
        ComputeGraph g;
        std::vector<std::int64_t> tokens;
        for (int i = 0; i < 2 * 7; ++i) tokens.push_back((i * 5 + 3) % 11);
        const Var logits = model(g.input(Tensor::from_vector(tokens, {2, 7})));
        const Var loss = sum(mul(logits, g.constant(random(logits.shape(), gen))));
        memory = graph_memory(g);
        g.backward(loss);
        std::vector<std::vector<double>> out{{loss.item()}};
        for (const Parameter& q : model.parameters()) out.push_back(q.grad().to_vector());
        return out;
    };
    GraphMemory plain, checkpointed;
    const auto expected = run(false, plain);
    CHECK(expected == run(true, checkpointed));
    INFO("plain " << plain.bytes << " bytes, checkpointed " << checkpointed.bytes << " bytes");
    CHECK(checkpointed.bytes < plain.bytes);
}

TEST_CASE("checkpoint: batch_norm's running statistics move once per step, not again in the replay",
          "[checkpoint][batch_norm]") {
    const auto run = [](bool use_checkpoint) {
        BatchNorm bn(4);
        bn.train(true);
        Generator gen(seed_base() + 5);
        ComputeGraph g;
        const Var x = g.input(random({6, 4}, gen), "x", true);
        const auto f = [&](const Var& u) { return tanh(bn(u)); };
        const Var y = use_checkpoint ? checkpoint(f, x) : f(x);
        g.backward(sum(mul(y, g.constant(random({6, 4}, gen)))));
        return std::vector<std::vector<double>>{x.grad().to_vector(), bn.running_mean->to_vector(),
                                                bn.running_var->to_vector()};
    };
    CHECK(run(false) == run(true));
}

TEST_CASE("checkpoint: bad calls get typed errors", "[checkpoint][errors]") {
    Generator gen(seed_base() + 6);
    ComputeGraph g;
    const Var x = g.input(random({2, 3}, gen), "x", true);
    const Var c = g.input(random({2, 3}, gen), "c", false);
    // The segment returns nothing.
    CHECK_THROWS_AS(checkpoint([](std::span<const Var>) { return std::vector<Var>{}; }, std::vector<Var>{x}),
                    CheckpointError);
    // Nothing differentiable: no output requires grad.
    CHECK_THROWS_AS(checkpoint([](const Var& u) { return tanh(u); }, c), CheckpointError);
    // No input at all; an undefined input; an undefined output; inputs of two graphs.
    CHECK_THROWS_AS(checkpoint([](std::span<const Var>) { return std::vector<Var>{}; }, std::vector<Var>{}),
                    CheckpointError);
    CHECK_THROWS_AS(checkpoint([](const Var& u) { return u; }, Var()), CheckpointError);
    CHECK_THROWS_AS(checkpoint([](const Var&) { return Var(); }, x), CheckpointError);
    ComputeGraph other;
    const Var y = other.input(random({2, 3}, gen), "y", true);
    CHECK_THROWS_AS(checkpoint([](std::span<const Var> in) { return std::vector<Var>{add(in[0], in[1])}; },
                               std::vector<Var>{x, y}),
                    CheckpointError);
    CHECK_THROWS_AS(checkpoint([&](const Var&) { return y; }, x), CheckpointError);
    // An input that does not require grad next to one that does: it gets no gradient, the other one does.
    const std::vector<Var> out =
        checkpoint([](std::span<const Var> in) { return std::vector<Var>{mul(in[0], in[1])}; }, std::vector<Var>{x, c});
    g.backward(sum(out[0]));
    CHECK(x.grad().to_vector() == c.value().to_vector());
    CHECK_THROWS_AS(c.grad(), GraphError);
    // Under NoGradGuard the segment simply runs.
    const NoGradGuard no_grad;
    const Var z = checkpoint([](const Var& u) { return tanh(u); }, x);
    CHECK_FALSE(z.requires_grad());
}
