// ZeRO-3's kept forward (ZeroOptions::recompute = false, the default; distributed/zero3.cpp): a unit's forward is
// recorded once into a graph of its own that the caller's node keeps, its gathered memory freed until the backward.
// Part of test_dist_zero3 (its helpers in zero3_support.h; run alone and under mpirun -np 2 and 3). Fresh inputs
// each run (rank 0's seed, broadcast).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "catch.h"
#include "dist_support.h"
#include "test_support.h"
#include "zero3_support.h"

using namespace dyngrad;
using namespace zero3test;
using dgtest::MessageHas;
using dgtest::relative;

namespace {

std::int64_t padded_mlp(int world) {
    const auto padded = [&](std::int64_t n) { return (n + world - 1) / world * world; };
    return padded(416) + padded(528) + padded(119);
}

// A ZeRO-3 optimizer over factory's f64 units beside the single-process reference it must match: both built from
// rank 0's seed, AdamW with kAdam on the reference. (Unpacked by the tests in member order.)
struct AgainstReference {
    AgainstReference(UnitsFactory factory, bool recompute)
        : zero(units(factory), g, kAdam, {.stage = 3, .recompute = recompute}), reference(units(factory)),
          adam(parameters_of(reference), kAdam) {}
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::uint64_t seed = dgtest::shared_seed(g);
    dist::ZeroOptimizer zero;
    const std::vector<dist::ZeroUnit> reference;
    AdamW adam;

private:
    std::vector<dist::ZeroUnit> units(UnitsFactory factory) const {
        Generator init(seed + 1);
        return factory(init, DType::f64);
    }
};

void check_equal(dist::ZeroOptimizer& zero, const std::vector<dist::ZeroUnit>& reference, double tolerance) {
    const auto full = zero.full_parameters();
    const auto ref = parameters_of(reference);
    REQUIRE(full.size() == ref.size());
    for (std::size_t i = 0; i < full.size(); ++i) {
        INFO(full[i].first);
        CHECK(relative(full[i].second.to_vector(), ref[i].value().to_vector()) <= tolerance);
    }
}

}  // namespace

// Two forwards of every unit before their backwards: the micro-batches' losses summed into one backward (both
// recorded forwards share the unit's nested graph). (Two graphs pending at once are refused for any model: a
// Parameter belongs to one pending forward pass, graph/graph.h; the units' anchors are parameters.)
TEST_CASE("ZeRO-3: two forwards before the backward == the single-process sum", "[dist][zero3][keep]") {
    const bool recompute = GENERATE(false, true);
    AgainstReference setup(mlp_units, recompute);
    auto& [g, world, seed, zero, reference, adam] = setup;
    INFO("seed " << seed << ", recompute " << recompute);
    for (int step = 0; step < 2; ++step) {
        const Pair all1 = mlp_batch(seed + 10 + 2 * static_cast<std::uint64_t>(step), 2 * world);
        const Pair all2 = mlp_batch(seed + 11 + 2 * static_cast<std::uint64_t>(step), 2 * world);
        const Pair mine1 = rows_of(all1, g.rank(), world), mine2 = rows_of(all2, g.rank(), world);
        {
            ComputeGraph graph;
            const Var l1 = classify(zero.forward(graph.input(mine1.x)), graph.input(mine1.y));
            const Var l2 = classify(zero.forward(graph.input(mine2.x)), graph.input(mine2.y));
            CHECK(zero.memory().released_bytes == (recompute ? 0 : 2 * padded_mlp(world) * 8));  // per forward
            zero.backward(graph, l1 + l2);
        }
        CHECK(zero.memory().kept_activation_bytes + zero.memory().released_bytes == 0);
        zero.step();
        zero.zero_grad();
        ComputeGraph ref_graph;
        ref_graph.backward(classify(run_units(reference, ref_graph.input(all1.x)), ref_graph.input(all1.y)) +
                           classify(run_units(reference, ref_graph.input(all2.x)), ref_graph.input(all2.y)));
        adam.step();
        adam.zero_grad();
    }
    check_equal(zero, reference, 1e-11);
}

// A graph destroyed (or cleared) without its backward takes the units' recorded forwards with it: nothing stays
// gathered, kept or bound, and the next step is the single-process one.
TEST_CASE("ZeRO-3: a forward whose graph goes without a backward leaves nothing behind", "[dist][zero3][keep]") {
    const bool recompute = GENERATE(false, true);
    AgainstReference setup(transformer_units, recompute);
    auto& [g, world, seed, zero, reference, adam] = setup;
    INFO("seed " << seed << ", recompute " << recompute);
    const Pair all = sequence_batch(seed + 3, 2 * world);
    const Pair mine = rows_of(all, g.rank(), world);
    {
        ComputeGraph graph;
        zero.forward(graph.input(mine.x));
        const dist::ZeroMemory m = zero.memory();
        CHECK(m.gathered_bytes == 0);
        CHECK(m.kept_parameter_bytes == 0);
        CHECK(m.released_bytes == (recompute ? 0 : m.padded * 8));  // every unit's padded f64 buffer
        CHECK((m.kept_activation_bytes > 0) == !recompute);         // the blocks' insides
    }
    {
        ComputeGraph graph;
        zero.forward(graph.input(mine.x));
        graph.clear();
    }
    const dist::ZeroMemory after = zero.memory();
    CHECK(after.gathered_bytes == 0);
    CHECK(after.kept_parameter_bytes + after.released_bytes + after.kept_activation_bytes == 0);
    ComputeGraph graph;  // the parameters are free to be recorded again
    zero.backward(graph, regress(zero.forward(graph.input(mine.x)), graph.input(mine.y)));
    zero.step();
    ComputeGraph ref_graph;
    ref_graph.backward(regress(run_units(reference, ref_graph.input(all.x)), ref_graph.input(all.y)));
    adam.step();
    check_equal(zero, reference, 1e-11);
}

// The kept forward is back-propagated once: a second backward through it (retain_graph) is a typed error naming the
// option that allows it; recomputed, the unit runs again.
TEST_CASE("ZeRO-3: retain_graph's second backward through a kept unit is refused", "[dist][zero3][keep]") {
    dist::ProcessGroup& g = group();
    const bool recompute = GENERATE(false, true);
    INFO("recompute " << recompute);
    Generator init(3);
    dist::ZeroOptimizer zero(mlp_units(init, DType::f64), g, kAdam, {.stage = 3, .recompute = recompute});
    const Pair b = mlp_batch(4, 2);
    ComputeGraph graph;
    const Var loss = classify(zero.forward(graph.input(b.x)), graph.input(b.y));
    graph.backward(loss, {.retain_graph = true});
    if (recompute)
        CHECK_NOTHROW(graph.backward(loss));
    else
        CHECK_THROWS_MATCHES(graph.backward(loss), GraphError, MessageHas({"fc2", "second backward", "recompute"}));
    CHECK(zero.memory().gathered_bytes == 0);
}

namespace {

const GPTConfig kDropoutGpt{.vocab_size = 11, .context = 8, .layers = 2, .heads = 2, .width = 8, .dropout = 0.25,
                            .seed = 9};

Tensor tokens(std::uint64_t seed, std::int64_t rows, std::int64_t t) {
    Generator gen(seed);
    std::vector<std::int64_t> values;
    for (std::int64_t i = 0; i < rows * t; ++i) values.push_back(static_cast<std::int64_t>(gen.engine()() % 11));
    return Tensor::from_vector(values, {rows, t});
}

Var lm_loss(const Var& logits, const Var& targets) {
    const Shape s = logits.shape();
    return cross_entropy(reshape(logits, {s[0] * s[1], s[2]}), reshape(targets, {s[0] * s[1]}));
}

}  // namespace

// Dropout inside the units: kept, each unit's forward runs once, so the masks the backward uses are the forward's.
// The reference: the same GPT (same seeds, so the same masks for the same rows) on this rank's rows, its gradients
// averaged over the ranks, then AdamW.
TEST_CASE("ZeRO-3 with dropout in the units == the same masks on one process; refused with recompute",
          "[dist][zero3][keep][dropout]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::uint64_t seed = dgtest::shared_seed(g);
    INFO("seed " << seed << ", world " << world);
    Generator gen(seed), gen0(seed);
    GPT model(kDropoutGpt, gen), twin(kDropoutGpt, gen0);
    model.to(DType::f64);
    twin.to(DType::f64);
    {  // gpt_units is GPT::operator() in pieces, the embedding dropout included (the twin draws the same masks)
        const std::vector<dist::ZeroUnit> units = dist::gpt_units(model);
        for (std::size_t i = 0; i + 1 < units.size(); ++i) CHECK(units[i].stochastic);
        CHECK_FALSE(units.back().stochastic);
        ComputeGraph graph;
        Var piecewise = graph.input(tokens(seed + 1, 2, 5));
        for (const dist::ZeroUnit& unit : units) piecewise = unit.forward(piecewise);
        CHECK(dgtest::max_abs_diff(piecewise.value(), twin(graph.input(tokens(seed + 1, 2, 5))).value()) == 0.0);
        CHECK_THROWS_MATCHES(dist::ZeroOptimizer(dist::gpt_units(model), g, kAdam, {.stage = 3, .recompute = true}),
                             ValueError, MessageHas({"unit 'embed'", "stochastic", "recompute"}));
    }
    dist::ZeroOptimizer zero(dist::gpt_units(model), g, kAdam, {.stage = 3});
    AdamW adam(twin.parameters(), kAdam);
    for (int step = 0; step < 3; ++step) {
        const Tensor x = tokens(seed + 20 + static_cast<std::uint64_t>(step) + 100 * static_cast<std::uint64_t>(g.rank()), 2, 6);
        const Tensor y = tokens(seed + 50 + static_cast<std::uint64_t>(step) + 100 * static_cast<std::uint64_t>(g.rank()), 2, 6);
        ComputeGraph graph;
        zero.backward(graph, lm_loss(zero.forward(graph.input(x)), graph.input(y)));
        zero.step();
        zero.zero_grad();
        ComputeGraph ref_graph;
        ref_graph.backward(lm_loss(twin(ref_graph.input(x)), ref_graph.input(y)));
        for (Parameter& p : twin.parameters()) {
            Tensor grad = p.grad().defined() ? p.grad() : Tensor::zeros(p.value().shape(), p.value().dtype());
            g.all_reduce(grad, dist::ReduceOp::Avg);
            p.grad_slot() = grad;
        }
        adam.step();
        adam.zero_grad();
    }
    const auto full = zero.full_parameters();
    std::map<std::string, Tensor> want;
    for (const auto& [name, p] : twin.named_parameters()) want[name] = p.value();
    for (const auto& [name, value] : full) {
        INFO(name);
        // "embed.token_embedding.weight" -> "token_embedding.weight", "block0.x" -> "blocks.0.x", "head.ln_f.w" -> ...
        std::string path = name.substr(name.find('.') + 1);
        if (name.rfind("block", 0) == 0) path = str("blocks.", name.substr(5));
        REQUIRE(want.contains(path));
        CHECK(relative(value.to_vector(), want[path].to_vector()) <= 1e-10);
    }
}

// A recomputed unit that records a dropout without saying so (stochastic unset) is refused in its backward: the
// second draw would differentiate another function.
TEST_CASE("ZeRO-3 with recompute: an undeclared dropout in a unit is refused", "[dist][zero3][keep][dropout]") {
    dist::ProcessGroup& g = group();
    Generator init(7);
    Linear layer(12, 7, true, init);
    layer.to(DType::f64);
    const Dropout drop(0.5, 3);
    std::vector<dist::ZeroUnit> units{{"noisy", layer, [layer, drop](const Var& x) { return drop(layer(x)); }}};
    dist::ZeroOptimizer zero(units, g, kAdam, {.stage = 3, .recompute = true});
    const Pair b = mlp_batch(5, 2);
    ComputeGraph graph;
    const Var loss = classify(zero.forward(graph.input(b.x)), graph.input(b.y));
    CHECK_THROWS_MATCHES(zero.backward(graph, loss), ValueError, MessageHas({"unit 'noisy'", "dropout", "recompute"}));
}
