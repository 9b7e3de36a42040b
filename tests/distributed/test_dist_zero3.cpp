// ZeRO stage 3 (distributed/zero.h, distributed/zero3.cpp) on the CPU through MPI. CTest runs this binary alone (a group of one)
// and under `mpirun -np 2` and `-np 3` (dist_zero3_mpi2, dist_zero3_mpi3: 3 divides none of the units' sizes, so
// every flat is padded). Inputs are fresh each run: rank 0 draws a seed and broadcasts it (printed on a failure);
// every rank rebuilds the global batch from it and computes the single-process reference with nn/optim.h's AdamW.
// The equivalence cases run both ways of ZeroOptions::recompute (the kept forward, the default, and the recomputed
// one); test_dist_zero3_keep.cpp (the same binary) has the kept forward's own cases.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>

#include "catch.h"
#include "dist_support.h"
#include "test_support.h"
#include "dyngrad/distributed/process_group.h"
#include "dyngrad/distributed/zero.h"
#include "dyngrad/dyngrad.h"
#include "zero3_support.h"

using namespace dyngrad;
using dgtest::MessageHas;
using dgtest::Rows;
using dgtest::relative;
using dgtest::shard;

using namespace zero3test;

namespace {

// `steps` ZeRO-3 steps against single-process AdamW on the concatenated batch; parameters gathered from the shards.
void check_against_single_process(UnitsFactory factory, Pair (*batch)(std::uint64_t, std::int64_t), LossFn loss,
                                  int steps, bool clip, double tolerance, bool recompute) {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::uint64_t seed = dgtest::shared_seed(group());
    INFO("seed " << seed << ", world " << world << ", clip " << clip << ", recompute " << recompute);
    Generator init(seed + 1 + static_cast<std::uint64_t>(g.rank()));  // differs per rank: the broadcast fixes it
    dist::ZeroOptimizer zero(factory(init, DType::f64), g, kAdam, {.stage = 3, .recompute = recompute});
    Generator init0(seed + 1);
    const auto reference = factory(init0, DType::f64);
    AdamW adam(parameters_of(reference), kAdam);
    for (int step = 0; step < steps; ++step) {
        const Pair all = batch(seed + 100 + static_cast<std::uint64_t>(step), 2 * world);
        const Pair mine = rows_of(all, g.rank(), world);
        ComputeGraph graph;
        zero.backward(graph, loss(zero.forward(graph.input(mine.x)), graph.input(mine.y)));
        for (const auto& [name, p] : zero.module().named_parameters()) {
            INFO(name);
            CHECK(p.value().numel() == 0);   // freed after the backward
            CHECK_FALSE(p.grad().defined());  // only the shard's gradient is kept
        }
        Tensor norm;
        if (clip) norm = zero.clip_grad_norm(0.5);
        zero.step();
        zero.zero_grad();

        ComputeGraph ref_graph;
        ref_graph.backward(loss(run_units(reference, ref_graph.input(all.x)), ref_graph.input(all.y)));
        if (clip) {
            const Tensor want = clip_grad_norm(parameters_of(reference), 0.5);
            CHECK(std::abs(norm.item() - want.item()) <= 1e-12 * want.item());
        }
        adam.step();
        adam.zero_grad();
    }
    const auto full = zero.full_parameters();
    const auto ref = parameters_of(reference);
    REQUIRE(full.size() == ref.size());
    for (std::size_t i = 0; i < full.size(); ++i) {
        INFO(full[i].first);
        const Tensor every = g.all_gather(full[i].second);  // bitwise the same on every rank
        for (int r = 1; r < world; ++r) CHECK(every.select(0, r).to_vector() == every.select(0, 0).to_vector());
        const double error = relative(full[i].second.to_vector(), ref[i].value().to_vector());
        INFO("relative error " << std::scientific << error);
        CHECK(error <= tolerance);
    }
    CHECK(zero.optimizer().step_count(0) == steps);
}

}  // namespace

TEST_CASE("ZeRO-3: an MLP's AdamW steps == single-process AdamW on the concatenated batch (f64)", "[dist][zero3]") {
    // 1e-11: AdamW divides each gradient element by its own running magnitude, so the rounding difference of the
    // two summation orders on elements near zero becomes a step of full size (1.3e-12 relative seen with
    // DYNGRAD_TEST_SEED=108289169 on 2 ranks, well under 1e-12 on most seeds).
    for (const bool recompute : {false, true}) check_against_single_process(mlp_units, mlp_batch, classify, 5, false, 1e-11, recompute);
}

TEST_CASE("ZeRO-3: a tiny transformer's AdamW steps with clipping == single-process AdamW (f64)", "[dist][zero3]") {
    // 1e-10: the key projection's bias has a zero gradient in exact arithmetic (softmax ignores a shift of a
    // query's scores), so its entries are rounding noise of either order of summation, moved by AdamW to ~1e-13
    // against the others' ~1e-1 (1.3e-12 relative seen).
    for (const bool recompute : {false, true})
        check_against_single_process(transformer_units, sequence_batch, regress, 4, true, 1e-10, recompute);
}

TEST_CASE("ZeRO-3: gradient accumulation over two micro-batches == one step on both", "[dist][zero3][accumulate]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::uint64_t seed = dgtest::shared_seed(group());
    for (const bool recompute : {false, true}) {
        INFO("seed " << seed << ", recompute " << recompute);
        Generator init(seed + 1);
        dist::ZeroOptimizer zero(mlp_units(init, DType::f64), g, kAdam, {.stage = 3, .recompute = recompute});
        Generator init0(seed + 1);
        const auto reference = mlp_units(init0, DType::f64);
        AdamW adam(parameters_of(reference), kAdam);
        for (int micro = 0; micro < 2; ++micro) {
            const Pair all = mlp_batch(seed + 10 + static_cast<std::uint64_t>(micro), 2 * world);
            const Pair mine = rows_of(all, g.rank(), world);
            ComputeGraph graph;
            zero.backward(graph, classify(zero.forward(graph.input(mine.x)), graph.input(mine.y)));
            ComputeGraph ref_graph;
            ref_graph.backward(classify(run_units(reference, ref_graph.input(all.x)), ref_graph.input(all.y)));
        }
        zero.step();
        adam.step();
        const auto full = zero.full_parameters();
        const auto ref = parameters_of(reference);
        for (std::size_t i = 0; i < full.size(); ++i)
            CHECK(relative(full[i].second.to_vector(), ref[i].value().to_vector()) <= 1e-12);
    }
}

// Under bf16 autocast the backward's recomputation must run the forward's function (the node restores the
// autocast dtype; recomputed in f32, the unit's output would not even match its gradient's dtype). eps = 1e3 makes
// AdamW's update ≈ lr·g/eps, linear in the gradient, so the updates compare within bf16 rounding. Three steps: the
// first forward learns which parameters autocast casts, the later ones cast each unit's span of them in one
// conversion whose windows autocast takes (the same bits as casting each parameter).
TEST_CASE("ZeRO-3 under bf16 autocast == the same autocast on one process", "[dist][zero3][autocast]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::uint64_t seed = dgtest::shared_seed(group());
    const bool recompute = GENERATE(false, true);
    INFO("seed " << seed << ", recompute " << recompute);
    const AdamOptions linear{.lr = 1.0, .eps = 1e3, .weight_decay = 0.0};
    Generator init(seed + 1);
    dist::ZeroOptimizer zero(mlp_units(init, DType::f32), g, linear, {.stage = 3, .recompute = recompute});
    Generator init0(seed + 1);
    const auto reference = mlp_units(init0, DType::f32);
    std::vector<std::vector<double>> before;
    for (const Parameter& p : parameters_of(reference)) before.push_back(p.value().to_vector());
    AdamW adam(parameters_of(reference), linear);
    for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    const Rows all = dgtest::global_batch(seed + 5 + static_cast<std::uint64_t>(step), {12}, 8 * world, DType::f32, 7);
    const Rows mine = shard(all, g.rank(), world);
    {
        ComputeGraph graph;
        Var loss;
        std::int64_t copies_used = 0;
        {
            const AutocastGuard autocast(DType::bf16);
            loss = classify(zero.forward(graph.input(mine.x)), graph.input(mine.y));
            copies_used = autocast_cache_stats().copies_used;  // counted since the guard began
        }
        // Between the forward and the backward no gathered parameter nor a 16-bit cast of one is resident: the
        // kept forward freed the padded f32 buffers and the bf16 casts of all 1063 elements (weights and biases):
        // in the first step one cast each, later as each unit's span (rounded out to 8 elements, at most the
        // padded flat), whose windows autocast took for all 6 parameters.
        const dist::ZeroMemory m = zero.memory();
        CHECK(m.gathered_bytes == 0);
        CHECK(m.kept_parameter_bytes == 0);
        if (recompute) {
            CHECK(m.released_bytes == 0);
        } else if (step == 0) {
            CHECK(m.released_bytes == m.padded * 4 + 1063 * 2);
            CHECK(copies_used == 0);
        } else {
            CHECK(m.released_bytes >= m.padded * 4 + 1063 * 2);
            CHECK(m.released_bytes <= m.padded * 4 + m.padded * 2);
            CHECK(copies_used == 6);
        }
        zero.backward(graph, loss);
        zero.step();
        zero.zero_grad();
    }
    {
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(DType::bf16);
            loss = classify(run_units(reference, graph.input(all.x)), graph.input(all.y));
        }
        graph.backward(loss);
        adam.step();
        adam.zero_grad();
    }
    }
    const auto full = zero.full_parameters();
    const auto ref = parameters_of(reference);
    for (std::size_t i = 0; i < full.size(); ++i) {
        INFO(full[i].first);
        std::vector<double> got = full[i].second.to_vector(), want = ref[i].value().to_vector();
        for (std::size_t k = 0; k < got.size(); ++k) {
            got[k] -= before[i][k];
            want[k] -= before[i][k];
        }
        CHECK(relative(got, want) <= 3e-2);
    }
}

TEST_CASE("ZeRO-3: per-rank memory against the formulas", "[dist][zero3][memory]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    // Kept with the default prefetch, kept without it, recomputed (where the default is off).
    const int mode = GENERATE(0, 1, 2);
    const bool recompute = mode == 2;
    INFO("mode " << mode);
    Generator init(5);
    dist::ZeroOptimizer zero(mlp_units(init, DType::f32), g, kAdam,
                             {.stage = 3,
                              .recompute = recompute,
                              .prefetch = mode == 1 ? std::optional<bool>(false) : std::nullopt});
    const Rows all = dgtest::global_batch(9, {12}, 2 * world, DType::f32, 7);
    const Rows mine = shard(all, g.rank(), world);
    const auto padded = [&](std::int64_t n) { return (n + world - 1) / world; };
    {
        ComputeGraph graph;
        const Var loss = classify(zero.forward(graph.input(mine.x)), graph.input(mine.y));
        // Between the forward and the backward: nothing gathered; kept, the units' padded buffers freed.
        const dist::ZeroMemory between = zero.memory();
        CHECK(between.gathered_bytes == 0);
        CHECK(between.kept_parameter_bytes == 0);
        CHECK(between.released_bytes == (recompute ? 0 : (padded(416) + padded(528) + padded(119)) * world * 4));
        // Each of the MLP's units is one node (Linear with its activation: its output is all it keeps), so the
        // kept forward holds nothing inside them here; test_dist_zero3_keep.cpp's transformer blocks do.
        CHECK(between.kept_activation_bytes == 0);
        zero.backward(graph, loss);
    }
    zero.step();
    const dist::ZeroMemory m = zero.memory();
    CHECK(m.gathered_bytes == 0);  // after the backward, nothing kept either way
    CHECK(m.kept_parameter_bytes + m.released_bytes + m.kept_activation_bytes == 0);
    const std::int64_t shards = padded(416) + padded(528) + padded(119);  // one flat per unit
    CHECK(m.parameters == 1063);
    CHECK(m.padded == shards * world);
    CHECK(m.parameter_bytes == m.formula_parameter_bytes);  // only the shards: the model holds 0 elements
    CHECK(m.formula_parameter_bytes == shards * 4);
    CHECK(m.gradient_bytes == m.formula_gradient_bytes);
    CHECK(m.formula_gradient_bytes == shards * 4);
    CHECK(m.optimizer_bytes == m.formula_optimizer_bytes);
    CHECK(m.formula_optimizer_bytes == 2 * shards * 4);
    // One unit at a time, forward and backward: the largest; prefetching, the largest neighbouring pair.
    const bool prefetching = mode == 0 && world > 1;
    CHECK(m.formula_gathered_bytes == (prefetching ? padded(416) + padded(528) : padded(528)) * world * 4);
    CHECK(m.gathered_peak_bytes == m.formula_gathered_bytes);
    if (g.rank() == 0 && mode == 1)
        std::cout << "| " << world << " | " << m.parameter_bytes << " + "
                  << m.gathered_peak_bytes << " | " << m.gradient_bytes << " | " << m.optimizer_bytes << " | "
                  << m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes + m.gathered_peak_bytes << " | "
                  << m.ddp_bytes << " |\n";
}

TEST_CASE("ZeRO-3: sharded checkpoint resumes exactly, and reloads on another world size", "[dist][zero3][checkpoint]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::uint64_t seed = dgtest::shared_seed(group());
    INFO("seed " << seed << ", world " << world);
    const auto folder = std::filesystem::temp_directory_path() / str("dyngrad_zero3_ckpt_", seed);
    const auto train = [&](dist::ZeroOptimizer& z, int from, int to) {
        for (int step = from; step < to; ++step) {
            const Pair all = mlp_batch(seed + 300 + static_cast<std::uint64_t>(step), 2 * world);
            const Pair mine = rows_of(all, z.group().rank(), z.group().world_size());
            ComputeGraph graph;
            z.backward(graph, classify(z.forward(graph.input(mine.x)), graph.input(mine.y)));
            z.step();
            z.zero_grad();
        }
    };
    Generator init(seed + 1);
    dist::ZeroOptimizer zero(mlp_units(init, DType::f64), g, kAdam, {.stage = 3});
    train(zero, 0, 3);
    zero.save_checkpoint(folder);
    CHECK(std::filesystem::exists(folder / "model.safetensors"));

    Generator other(seed + 77);
    dist::ZeroOptimizer resumed(mlp_units(other, DType::f64), g, kAdam, {.stage = 3});
    resumed.load_checkpoint(folder);
    CHECK(resumed.optimizer().step_count(0) == 3);
    // Another world size: on every rank a group of one reshards the world-W checkpoint.
    Generator third(seed + 99);
    dist::ZeroOptimizer alone(mlp_units(third, DType::f64), dist::ProcessGroup::single(), kAdam, {.stage = 3});
    alone.load_checkpoint(folder);
    CHECK(alone.optimizer().step_count(0) == 3);

    train(zero, 3, 5);
    train(resumed, 3, 5);
    train(alone, 3, 5);  // the whole global batch on one process
    const auto a = zero.full_parameters(), b = resumed.full_parameters(), c = alone.full_parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].first);
        CHECK(a[i].second.to_vector() == b[i].second.to_vector());
        CHECK(relative(c[i].second.to_vector(), a[i].second.to_vector()) <= 1e-12);
    }
    // A stage-2 optimizer of the same layers cannot read it (another layout: a flat per unit).
    Generator fourth(seed + 5);
    Module flat_model;  // the same parameter names as the units'
    for (auto& unit : mlp_units(fourth, DType::f64)) flat_model.register_module(unit.name, unit.module);
    dist::ZeroOptimizer stage2(flat_model, dist::ProcessGroup::single(), kAdam, {.stage = 2});
    CHECK_THROWS_MATCHES(stage2.load_checkpoint(folder), ValueError, MessageHas({"another model"}));
    g.barrier();
    if (g.rank() == 0) std::filesystem::remove_all(folder);
}

TEST_CASE("ZeRO-3: bad inputs are typed errors", "[dist][zero3][errors]") {
    dist::ProcessGroup& g = group();
    Generator init(5);
    Sequential model;
    model.add(Linear(4, 3, true, init));
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(model, g, kAdam, {.stage = 3}), ValueError, MessageHas({"stage 3", "units"}));
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(mlp_units(init, DType::f64), g, kAdam, {.stage = 2}), ValueError,
                         MessageHas({"stage 3"}));
    CHECK_THROWS_AS(dist::ZeroOptimizer(std::vector<dist::ZeroUnit>{}, g, kAdam), ValueError);
    auto twice = mlp_units(init, DType::f64);
    twice[1].name = twice[0].name;
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(twice, g, kAdam), ValueError, MessageHas({"used twice"}));
    auto shared = mlp_units(init, DType::f64);
    shared.push_back({"again", shared[0].module, shared[0].forward});
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(shared, g, kAdam), ValueError, MessageHas({"earlier unit"}));
    dist::ZeroOptimizer stage2(model, g, kAdam, {.stage = 2});
    {
        ComputeGraph graph;
        CHECK_THROWS_MATCHES(stage2.forward(graph.input(Tensor::ones({2, 4}))), ValueError, MessageHas({"stage 3"}));
    }

    // A parameter added to a unit after wrapping: every rank refuses in forward(), before any collective.
    Sequential grows;
    grows.add(Linear(12, 7, true, init));
    grows.to(DType::f64);
    dist::ZeroOptimizer zero(std::vector<dist::ZeroUnit>{{"body", grows, [grows](const Var& x) { return grows(x); }}}, g,
                             kAdam);
    grows.add(Linear(7, 3, true, init));
    grows.to(DType::f64);
    ComputeGraph graph;
    CHECK_THROWS_MATCHES(zero.forward(graph.input(Tensor::ones({2, 12}, DType::f64))), ValueError,
                         MessageHas({"after wrapping", "body.1.weight"}));
    CHECK_THROWS_MATCHES(zero.step(), ValueError, MessageHas({"after wrapping"}));
}

TEST_CASE("ZeRO-3: gpt_units composes to GPT::operator(); tied embeddings refused", "[dist][zero3][gpt]") {
    Generator gen(std::random_device{}());
    const GPTConfig config{.vocab_size = 11, .context = 8, .layers = 2, .heads = 2, .width = 8};
    const GPT model(config, gen);
    const std::vector<dist::ZeroUnit> units = dist::gpt_units(model);
    REQUIRE(units.size() == 4);
    CHECK(units.front().name == "embed");
    CHECK(units[1].name == "block0");
    CHECK(units.back().name == "head");
    std::vector<std::int64_t> tokens;
    for (int i = 0; i < 3 * 5; ++i) tokens.push_back(static_cast<std::int64_t>(gen.engine()() % 11));
    ComputeGraph graph;
    const Var x = graph.input(Tensor::from_vector(tokens, {3, 5}));
    Var piecewise = x;
    for (const dist::ZeroUnit& unit : units) piecewise = unit.forward(piecewise);
    const Tensor expected = model(x).value();
    REQUIRE(piecewise.shape() == expected.shape());
    CHECK(dgtest::max_abs_diff(piecewise.value(), expected) == 0.0);

    for (const dist::ZeroUnit& unit : units) CHECK_FALSE(unit.stochastic);
    GPTConfig tied = config;
    tied.tie_embeddings = true;
    CHECK_THROWS_MATCHES(dist::gpt_units(GPT(tied, gen)), ValueError, MessageHas({"gpt_units", "token embedding"}));
    GPTConfig reduced = config;
    reduced.reduced_residual = true;
    CHECK_THROWS_MATCHES(dist::gpt_units(GPT(reduced, gen)), ValueError, MessageHas({"gpt_units", "reduced_residual"}));
}

TEST_CASE("ZeRO-3: ranks with different models fail typed on every rank", "[dist][zero3][mismatch]") {
    dist::ProcessGroup& g = group();
    if (g.world_size() < 2) DG_SKIP("needs 2 ranks");
    Generator init(5);
    Linear layer(12, g.rank() == 1 ? 9 : 8, true, init);
    std::vector<dist::ZeroUnit> units{{"fc", layer, [layer](const Var& x) { return layer(x); }}};
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(units, g), ShapeError, MessageHas({"ZeroOptimizer", "differs across ranks"}));
}

// Run alone by dist_zero3_dead_peer (DYNGRAD_DIST_TIMEOUT=3): both ranks run the forward (its gathers), then rank 1
// leaves; rank 0's backward re-gathers the last unit and gets the typed timeout out of the sweep, no hang.
TEST_CASE("ZeRO-3: a peer that leaves before the backward's gather: a typed timeout, no hang", "[.dead_peer]") {
    dist::ProcessGroup& g = group();
    if (g.world_size() < 2) DG_SKIP("needs 2 ranks (mpirun -np 2)");
    Generator init(5);
    dist::ZeroOptimizer zero(mlp_units(init, DType::f64), g, kAdam, {.stage = 3});
    const Pair batch = mlp_batch(1, 4);
    ComputeGraph graph;
    const Var loss = classify(zero.forward(graph.input(batch.x)), graph.input(batch.y));
    if (g.rank() == 1) return;  // exits (finalizes MPI) without joining the backward's all_gather
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_MATCHES(zero.backward(graph, loss), DistributedError, MessageHas({"all_gather", "timed out", "rank 0/2"}));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

// ZeroOptions::prefetch makes the same collectives earlier (on the CPU at once; on CUDA on a communication stream),
// so the parameters after several steps are the same bits as without it: per step one forward and backward, then a
// step with two micro-batches recorded before one backward (the backward prefetches the latest pending forward of
// the previous unit, which may be the other micro-batch's: its restored memory waits for its own backward). With
// W > 1 two units' gathered parameters are resident at once, so the peak is at least the largest unit's.
TEST_CASE("ZeRO-3 with prefetch == without, bit for bit", "[dist][zero3][prefetch]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::uint64_t seed = dgtest::shared_seed(group());
    INFO("seed " << seed << ", world " << world);
    std::vector<std::vector<double>> results[2];
    std::int64_t peaks[2] = {0, 0}, formulas[2] = {0, 0};
    for (const bool prefetch : {false, true}) {
        Generator init(seed + 1);
        dist::ZeroOptimizer zero(transformer_units(init, DType::f64), g, kAdam, {.stage = 3, .prefetch = prefetch});
        for (int step = 0; step < 3; ++step) {
            const int micro_batches = step == 2 ? 2 : 1;
            ComputeGraph graph;
            Var total;
            for (int m = 0; m < micro_batches; ++m) {
                const Pair all = sequence_batch(seed + 100 + static_cast<std::uint64_t>(10 * step + m), 2 * world);
                const Pair mine = rows_of(all, g.rank(), world);
                const Var loss = regress(zero.forward(graph.input(mine.x)), graph.input(mine.y));
                total = m == 0 ? loss : total + loss;
            }
            zero.backward(graph, total);
            for (const auto& [name, p] : zero.module().named_parameters()) CHECK(p.value().numel() == 0);
            zero.step();
            zero.zero_grad();
        }
        const dist::ZeroMemory memory = zero.memory();
        peaks[prefetch] = memory.gathered_peak_bytes;
        formulas[prefetch] = memory.formula_gathered_bytes;
        CHECK(memory.gathered_bytes == 0);
        for (const auto& [name, value] : zero.full_parameters()) results[prefetch].push_back(value.to_vector());
    }
    REQUIRE(results[0].size() == results[1].size());
    for (std::size_t i = 0; i < results[0].size(); ++i) CHECK(results[1][i] == results[0][i]);
    CHECK(peaks[0] == formulas[0]);
    CHECK(peaks[1] == formulas[1]);
    if (world > 1) CHECK(formulas[1] > formulas[0]);  // the next unit's buffers beside the current one's
    else CHECK(formulas[1] == formulas[0]);           // a group of one prefetches nothing
    // Options: prefetch is for the kept forward of stage 3.
    Generator init(seed + 1);
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(transformer_units(init, DType::f64), g, kAdam,
                                             {.stage = 3, .recompute = true, .prefetch = true}),
                         ValueError, MessageHas({"prefetch is for the kept forward"}));
    Generator init2(seed + 1);
    Module model;
    for (auto& unit : transformer_units(init2, DType::f64)) model.register_module(unit.name, unit.module);
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(model, g, kAdam, {.stage = 2, .prefetch = true}), ValueError,
                         MessageHas({"prefetch", "is for stage 3"}));
}
