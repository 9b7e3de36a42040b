// Captured training steps with every training feature (issue 15, parts 3–4): AdamW, schedules, dropout,
// clip_grad_norm and GradScaler inside cuda::CapturedStep give, replay after replay, exactly what the same
// steps give eagerly; the capture guard names the first tensor of a non-capturable step that differs. At the end:
// activation checkpointing (graph/checkpoint.h) in a captured step, and the GPT's per-block option on the GPU.
//
// Without a CUDA device (or in a CPU-only build) the executable prints why and exits 77 (CTest: skipped).
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <array>
#include <memory>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/ops/dropout_mask.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

const Device kGpu = Device::cuda(0);
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

Tensor labels_on_gpu(std::int64_t n, std::int64_t classes, Generator& gen) {
    std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
    for (auto& label : labels) label = static_cast<std::int64_t>(gen.engine()() % static_cast<std::uint64_t>(classes));
    return Tensor::from_vector(labels, {n}).to(kGpu);
}

// Switches deterministic mode on for one test (cuDNN/cuBLAS algorithms and reductions fixed).
struct Deterministic {
    bool previous = cuda::deterministic();
    Deterministic() { cuda::set_deterministic(true); }
    ~Deterministic() { cuda::set_deterministic(previous); }
};

// nn/models.h's lenet with dropout before the classifier:
// conv 1→20, pool, conv 20→50, pool, flatten (800), linear 800→500 + ReLU, dropout 0.5, linear 500→10.
struct LenetWithDropout {
    Generator gen;
    Sequential net;
    Dropout drop;
    LenetWithDropout(std::uint64_t seed, std::uint64_t dropout_seed) : gen(seed), drop(0.5, dropout_seed) {
        net.add(Conv2d(1, 20, {5, 5}, {}, true, gen)).add([](const Var& x) { return max_pool2d(x, {2, 2}); });
        net.add(Conv2d(20, 50, {5, 5}, {}, true, gen)).add([](const Var& x) { return max_pool2d(x, {2, 2}); });
        net.add([](const Var& x) { return flatten(x); });
        net.add(Linear(800, 500, true, gen, Activation::Relu)).add(drop).add(Linear(500, 10, true, gen));
        net.to(kGpu);
    }
};

// One training run: the model, AdamW, a warm-up + cosine schedule, clipping, optional loss scaling.
struct Trainer {
    LenetWithDropout model;
    AdamW opt;
    WarmupCosineLR schedule;
    GradScaler scaler;
    bool scaled;
    bool fused;  // Optimizer::clip_grad_norm_and_step instead of clip_grad_norm + step()

    Trainer(std::uint64_t seed, bool scaled, std::int64_t total, bool fused = false)
        : model(seed, seed + 1),
          opt(model.net.parameters(), {.lr = 2e-3, .weight_decay = 0.01}),
          schedule(opt, total / 10, total, 1e-5),
          scaler({.init_scale = 1024.0, .growth_interval = 3}),
          scaled(scaled),
          fused(fused) {}

    Tensor step(std::span<const Tensor> in) {
        ComputeGraph graph;
        Var loss = cross_entropy(model.net(graph.input(in[0])), graph.input(in[1]));
        if (scaled) {
            graph.backward(scaler.scale(loss));
            scaler.unscale(opt);
            clip_grad_norm(opt.parameters(), 1.0);
            scaler.step(opt);
            scaler.update();
        } else if (fused) {
            graph.backward(loss);
            opt.clip_grad_norm_and_step(1.0);
        } else {
            graph.backward(loss);
            clip_grad_norm(opt.parameters(), 1.0);
            opt.step();
        }
        schedule.step();
        opt.zero_grad();
        return loss.value();
    }

    // Every tensor a step changes, for the capture guard.
    NamedTensors state() const {
        NamedTensors out;
        const std::vector<Parameter> params = opt.parameters();
        for (std::size_t i = 0; i < params.size(); ++i) {
            out.emplace_back(params[i].name(), params[i].value());
            for (const auto& [name, t] : opt.state_tensors(i)) out.emplace_back(params[i].name() + "." + name, t);
        }
        for (const auto& [name, t] : opt.device_scalars()) out.emplace_back("optimizer." + name, t);
        for (const auto& [name, t] : schedule.device_scalars()) out.emplace_back("schedule." + name, t);
        for (const auto& [name, t] : scaler.state_tensors()) out.emplace_back("scaler." + name, t);
        out.emplace_back("dropout.counter", model.drop.seeds().counter());
        return out;
    }
};

// Batches of 28×28 images; in `poisoned` ones one pixel is inf, so the scaled backward overflows.
std::vector<std::vector<Tensor>> batches(int count, std::int64_t rows, std::uint64_t seed,
                                         const std::vector<int>& poisoned = {}) {
    Generator gen(seed);
    std::vector<std::vector<Tensor>> out;
    for (int i = 0; i < count; ++i) {
        Tensor x = Tensor::normal({rows, 1, 28, 28}, 0.0, 1.0, gen);
        for (const int p : poisoned)
            if (p == i) x.data<float>()[17] = std::numeric_limits<float>::infinity();
        out.push_back({x.to(kGpu), labels_on_gpu(rows, 10, gen)});
    }
    return out;
}

template <typename AnyTrainer>  // Trainer, CheckpointTrainer: a model and its AdamW `opt`
void check_same_parameters(const AnyTrainer& eager, const AnyTrainer& captured) {
    const std::vector<Parameter> a = eager.opt.parameters(), b = captured.opt.parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].name());
        CHECK(a[i].value().to_vector() == b[i].value().to_vector());  // bit for bit
        CHECK(eager.opt.exp_avg_sq(i).to_vector() == captured.opt.exp_avg_sq(i).to_vector());
    }
}

// `steps` steps of `eager` and of `step` (capturing `captured`) over `data` in turn: one graph, the same last loss
// and the same parameters and state, bit for bit.
template <typename AnyTrainer>
void check_captured_equals_eager(AnyTrainer& eager, AnyTrainer& captured, cuda::CapturedStep& step,
                                 const std::vector<std::vector<Tensor>>& data, int steps) {
    Tensor eager_loss, captured_loss;
    for (int i = 0; i < steps; ++i) {
        const std::vector<Tensor>& batch = data[static_cast<std::size_t>(i) % data.size()];
        eager_loss = eager.step(batch);
        captured_loss = step.run(batch);
    }
    CHECK(step.variants() == 1);
    CHECK(captured_loss.item() == eager_loss.item());
    check_same_parameters(eager, captured);
}

// One eager step of `opt` over `model`: clip_grad_norm + step(), or the fused clip_grad_norm_and_step. The
// norm and every gradient as the step left them (clipped).
struct ClippedStep {
    std::vector<double> norm;
    std::vector<std::vector<double>> grads;
};
ClippedStep clipped_step(LenetWithDropout& model, Optimizer& opt, std::span<const Tensor> in, double max_norm,
                         bool fused) {
    ComputeGraph graph;
    graph.backward(cross_entropy(model.net(graph.input(in[0])), graph.input(in[1])));
    Tensor norm;
    if (fused) {
        norm = opt.clip_grad_norm_and_step(max_norm);
    } else {
        norm = clip_grad_norm(opt.parameters(), max_norm);
        opt.step();
    }
    ClippedStep out{norm.to_vector(), {}};
    for (const Parameter& p : opt.parameters()) out.grads.push_back(p.grad().to_vector());
    opt.zero_grad();
    return out;
}

void check_same_state(const std::vector<Parameter>& a, const std::vector<Parameter>& b, const Optimizer& opt_a,
                      const Optimizer& opt_b) {
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].name());
        CHECK(a[i].value().to_vector() == b[i].value().to_vector());  // bit for bit
        const auto sa = opt_a.state_tensors(i), sb = opt_b.state_tensors(i);
        REQUIRE(sa.size() == sb.size());
        for (std::size_t k = 0; k < sa.size(); ++k) CHECK(sa[k].second.to_vector() == sb[k].second.to_vector());
    }
}

// Six steps of model `a` with clip_grad_norm + step() beside the same model `b` with the fused
// clip_grad_norm_and_step, over `data` in turn: the same norm and clipped gradients every step, then the same
// parameters and state. `check_clipped`: every step's norm exceeds max_norm (it did clip).
void check_fused_clip_equals_separate(LenetWithDropout& a, Optimizer& opt_a, LenetWithDropout& b, Optimizer& opt_b,
                                      const std::vector<std::vector<Tensor>>& data, double max_norm,
                                      bool check_clipped) {
    for (int i = 0; i < 6; ++i) {
        const auto& batch = data[static_cast<std::size_t>(i) % data.size()];
        const ClippedStep separate = clipped_step(a, opt_a, batch, max_norm, false);
        const ClippedStep fused = clipped_step(b, opt_b, batch, max_norm, true);
        CHECK(fused.norm == separate.norm);
        CHECK(fused.grads == separate.grads);
        if (check_clipped) CHECK(separate.norm[0] > max_norm);
    }
    check_same_state(a.net.parameters(), b.net.parameters(), opt_a, opt_b);
}

}  // namespace

TEST_CASE("clip_grad_norm_and_step on the GPU gives clip_grad_norm + step() bit for bit: parameters, state, norm "
          "and the clipped gradients", "[gpu][clip][deterministic]") {
    const Deterministic deterministic;
    const auto data = batches(3, 32, 9100);
    // 0.05 clips every step (lenet's first gradients have a norm near 1); 1e6 never does. (The loops are inside
    // the sections: Catch enters a section once per run.)
    SECTION("AdamW") {
        for (const double max_norm : {0.05, 1e6}) {
            INFO("max_norm " << max_norm);
            LenetWithDropout a(91, 92), b(91, 92);
            AdamW opt_a(a.net.parameters(), {.lr = 2e-3, .weight_decay = 0.01});
            AdamW opt_b(b.net.parameters(), {.lr = 2e-3, .weight_decay = 0.01});
            check_fused_clip_equals_separate(a, opt_a, b, opt_b, data, max_norm, /*check_clipped=*/max_norm < 1);
            CHECK(opt_b.step_count(0) == 6);
        }
    }
    SECTION("SGD with Nesterov momentum and weight decay") {
        for (const double max_norm : {0.05, 1e6}) {
            INFO("max_norm " << max_norm);
            LenetWithDropout a(93, 94), b(93, 94);
            const SgdOptions options{.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3};
            SGD opt_a(a.net.parameters(), options), opt_b(b.net.parameters(), options);
            check_fused_clip_equals_separate(a, opt_a, b, opt_b, data, max_norm, /*check_clipped=*/false);
        }
    }
}

TEST_CASE("a captured clip_grad_norm_and_step trains lenet (dropout, AdamW, warm-up + cosine) exactly as eager "
          "clip_grad_norm + step()", "[gpu][capture][clip][deterministic]") {
    const Deterministic deterministic;
    constexpr int kSteps = 30;
    Trainer eager(33, false, kSteps), captured(33, false, kSteps, /*fused=*/true);
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return captured.step(in); },
                            {.guard_replays = 2, .guard_state = [&] { return captured.state(); }});
    check_captured_equals_eager(eager, captured, step, batches(4, 64, 3300), kSteps);
    CHECK(captured.opt.step_count(0) == kSteps);
}

TEST_CASE("clip_grad_norm on the GPU over 130 gradients of mixed sizes (two launches, slices of large tensors) "
          "matches the CPU", "[gpu][clip]") {
    Generator gen(95);
    std::vector<Parameter> gpu, cpu;
    const auto add = [&](Shape shape, DType dtype) {
        std::string name = "p";  // appended, not "p" + ...: GCC 12 warns (-Wrestrict) on that temporary
        name += std::to_string(cpu.size());
        const Tensor value = Tensor::normal(shape, 0.0, 1.0, gen, dtype);
        const Tensor grad = Tensor::normal(shape, 0.0, 0.01, gen, dtype);
        Parameter on_cpu(value, name), on_gpu(value.to(kGpu), name);
        on_cpu.grad_slot() = grad.clone();
        on_gpu.grad_slot() = grad.to(kGpu);
        cpu.push_back(on_cpu);
        gpu.push_back(on_gpu);
    };
    for (int i = 0; i < 125; ++i) add({1 + (i * 37) % 300}, DType::f32);  // small: one slice each
    add({3, 100003}, DType::f32);  // 147 slices, the last one partial
    add({2049}, DType::f32);
    add({0}, DType::f32);  // empty: no block
    add({70001}, DType::f64);
    add({5}, DType::f64);
    for (const double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
        INFO("norm_type " << norm_type);
        const std::vector<std::vector<double>> before = [&] {
            std::vector<std::vector<double>> out;
            for (const Parameter& p : cpu) out.push_back(p.grad().to_vector());
            return out;
        }();
        const Tensor cpu_norm = clip_grad_norm(cpu, 0.5, norm_type);
        const Tensor gpu_norm = clip_grad_norm(gpu, 0.5, norm_type);
        CHECK(gpu_norm.dtype() == DType::f64);
        CHECK(gpu_norm.item() == dgtest::Approx(cpu_norm.item()).epsilon(1e-12));
        for (std::size_t i = 0; i < gpu.size(); ++i) {
            INFO(cpu[i].name());
            const std::vector<double> g = gpu[i].grad().to_vector(), c = cpu[i].grad().to_vector();
            REQUIRE(g.size() == c.size());
            for (std::size_t k = 0; k < g.size(); ++k) REQUIRE(std::abs(g[k] - c[k]) <= 1e-6 * std::abs(c[k]) + 1e-12);
        }
        // Restore the unclipped gradients for the next norm type.
        for (std::size_t i = 0; i < cpu.size(); ++i) {
            const Tensor grad = Tensor::from_vector(before[i], cpu[i].value().shape(), cpu[i].value().dtype());
            cpu[i].grad_slot() = grad.clone();
            gpu[i].grad_slot() = grad.to(kGpu);
        }
    }
    // Twice in a row (the last block reset the shared counter) and only empty gradients (the norm is 0).
    CHECK(clip_grad_norm(gpu, 1e9).item() == dgtest::Approx(clip_grad_norm(cpu, 1e9).item()).epsilon(1e-12));
    CHECK(clip_grad_norm({gpu[127]}, 1.0).item() == 0);
}

TEST_CASE("lenet with dropout, AdamW, a warm-up + cosine schedule and clipping: 100 captured steps equal 100 "
          "eager steps bit for bit", "[gpu][capture][deterministic]") {
    const Deterministic deterministic;
    constexpr int kSteps = 100;
    Trainer eager(31, false, kSteps), captured(31, false, kSteps);
    REQUIRE(eager.model.net.parameters()[0].value().to_vector() == captured.model.net.parameters()[0].value().to_vector());
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return captured.step(in); });
    const std::vector<double> initial = eager.opt.parameters()[4].value().to_vector();
    check_captured_equals_eager(eager, captured, step, batches(4, 64, 3100), kSteps);
    // Replays advanced what the host ran only twice (warm-up and capture): step counts, schedule, dropout.
    CHECK(captured.opt.step_count(0) == kSteps);
    CHECK(captured.schedule.epoch() == kSteps);
    CHECK(captured.opt.lr() == eager.opt.lr());
    CHECK(captured.opt.lr() == Approx(1e-5).epsilon(1e-12));  // the end of the cosine
    CHECK(captured.model.drop.seeds().draws() == kSteps);
    CHECK(eager.opt.parameters()[4].value().to_vector() != initial);  // it trained
}

TEST_CASE("GradScaler inside a captured step skips overflowing steps and grows the scale as eagerly",
          "[gpu][capture][amp]") {
    const Deterministic deterministic;
    constexpr int kSteps = 12;
    Trainer eager(41, true, kSteps), captured(41, true, kSteps);
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return captured.step(in); });
    const auto data = batches(kSteps, 32, 4100, {4, 9});  // steps 4 and 9 overflow
    for (int i = 0; i < kSteps; ++i) {
        eager.step(data[static_cast<std::size_t>(i)]);
        step.run(data[static_cast<std::size_t>(i)]);
    }
    check_same_parameters(eager, captured);
    // 1024: +3 clean → 2048, skip at 4 → 1024, 5..7 → 2048, 8 → tracker 1, skip at 9 → 1024, 10..11 → tracker 2.
    CHECK(eager.scaler.scale_value() == 1024.0);
    CHECK(captured.scaler.scale_value() == 1024.0);
    CHECK(captured.scaler.growth_tracker() == 2);
    CHECK(captured.opt.step_count(0) == kSteps - 2);  // the skipped steps did not count
    CHECK(eager.opt.step_count(0) == kSteps - 2);
}

TEST_CASE("the capture guard passes a capturable step and names the first tensor of one that is not",
          "[gpu][capture][guard]") {
    const Deterministic deterministic;
    const auto data = batches(2, 32, 5100);
    SECTION("capturable: AdamW, schedule, dropout, clipping, loss scaling") {
        Trainer eager(51, true, 20), captured(51, true, 20);
        cuda::CapturedStep step([&](std::span<const Tensor> in) { return captured.step(in); },
                                {.guard_replays = 3, .guard_state = [&] { return captured.state(); }});
        for (int i = 0; i < 8; ++i) {
            eager.step(data[static_cast<std::size_t>(i) % 2]);
            REQUIRE_NOTHROW(step.run(data[static_cast<std::size_t>(i) % 2]));
        }
        check_same_parameters(eager, captured);
    }
    SECTION("a host-side counter sets the lr: frozen into the graph") {
        Trainer captured(52, false, 20);
        int host_calls = 0;
        cuda::CapturedStep step(
            [&](std::span<const Tensor> in) {
                captured.opt.set_lr(1e-3 * ++host_calls);  // not capturable: a replay repeats the captured lr
                return captured.step(in);
            },
            {.guard_replays = 2, .guard_state = [&] { return captured.state(); }});
        step.run(data[0]);  // eager warm-up
        step.run(data[1]);  // captured and launched
        CHECK_THROWS_MATCHES(step.run(data[0]), GraphError,
                             MessageHas({"guard", "replay 1", "'0.weight'", "not capturable"}));
    }
    CHECK_THROWS_MATCHES(cuda::CapturedStep([](std::span<const Tensor> in) { return in[0]; }, {.guard_replays = 1}),
                         ValueError, MessageHas({"guard_state"}));
}

TEST_CASE("dropout on the GPU draws the masks of the CPU from the device-resident seed stream", "[gpu][dropout]") {
    Generator gen(61);
    const Tensor x = Tensor::normal({33, 65}, 0.0, 1.0, gen, DType::f64);
    Dropout layer(0.3, 9);
    ComputeGraph graph;
    Var xv = graph.input(x.to(kGpu), "x", true);
    Var first = layer(xv);
    Var second = layer(xv);
    CHECK(first.value().to_vector() == dropout(x, 0.3, true, math::dropout_draw_seed(9, 1)).to_vector());
    CHECK(second.value().to_vector() == dropout(x, 0.3, true, math::dropout_draw_seed(9, 2)).to_vector());
    const Var loss = sum(first * second);
    graph.backward(loss, BackwardOptions{.retain_grads = true});
    // The CPU replay reads each node's seed input back: the same masks, values and gradients.
    const VerifyReport report = verify(graph, loss);
    INFO(report.summary() << "\n" << report.table());
    CHECK(report.pass);
    CHECK(layer.seeds().draws() == 2);
}

// Native bf16 dropout (ops/dropout.cu) inside a captured step: each replay draws the next seed of the layer's
// device-resident stream, so its masks are fresh and exactly those the same number of eager steps draw; and the
// step runs as many kernels as in f32 (no conversion through f32 around dropout, forward or backward).
TEST_CASE("a captured step with bf16 dropout replays fresh masks equal to eager's, in as many kernels as f32",
          "[gpu][capture][dropout][reduced]") {
    constexpr double kP = 0.2;
    constexpr std::uint64_t kDropoutSeed = 13;
    constexpr int kRuns = 5;
    Generator gen(63);
    const Tensor x64 = Tensor::normal({33, 65}, 0.0, 1.0, gen, DType::f64);
    const Tensor w64 = Tensor::normal({33, 65}, 0.0, 1.0, gen, DType::f64);
    // One step: y = dropout(x), back-propagating w; returns y and dx stacked (rows 0-32: y, 33-65: dx). No
    // loss reduction: its kernels differ between f32 and bf16, dropout's must not.
    auto step_with = [](const Dropout& layer, const Tensor& w) {
        return [&layer, w](std::span<const Tensor> in) {
            ComputeGraph graph;
            const Var xv = graph.input(in[0], "x", true);
            const Var y = layer(xv);
            graph.backward(y, w);
            return concat({y.value(), xv.grad()});
        };
    };
    std::size_t f32_kernels = 0;
    for (const DType dtype : {DType::f32, DType::bf16}) {
        INFO(dtype_name(dtype));
        const Tensor x = x64.to(dtype).to(kGpu), w = w64.to(dtype).to(kGpu);
        const Dropout eager_layer(kP, kDropoutSeed), captured_layer(kP, kDropoutSeed);
        const auto eager_step = step_with(eager_layer, w);
        cuda::CapturedStep captured(step_with(captured_layer, w));
        const std::vector<double> xs = x.to_vector();
        std::vector<double> previous;
        for (int run = 1; run <= kRuns; ++run) {
            INFO("run " << run);
            const Tensor eager_out = eager_step(std::span<const Tensor>(&x, 1));
            const std::vector<double> out = captured.run(std::span<const Tensor>(&x, 1)).to_vector();
            REQUIRE(eager_out.dtype() == dtype);
            CHECK(out == eager_out.to_vector());  // bit for bit
            // Run n drew the n-th seed of the stream: the CPU's mask for it, fresh on every replay.
            const std::uint64_t seed = math::dropout_draw_seed(kDropoutSeed, static_cast<std::uint64_t>(run));
            std::size_t mismatches = 0;
            for (std::size_t i = 0; i < xs.size(); ++i)
                if (xs[i] != 0 && (out[i] != 0) != math::dropout_keep(seed, i, kP)) ++mismatches;
            CHECK(mismatches == 0);
            CHECK(out != previous);
            previous = out;
        }
        CHECK(captured.variants() == 1);
        CHECK(captured_layer.seeds().draws() == kRuns);
        CHECK(eager_layer.seeds().draws() == kRuns);
        const std::size_t kernels = captured.last_graph_counts().kernels;
        CHECK(kernels > 0);
        if (dtype == DType::f32)
            f32_kernels = kernels;
        else
            CHECK(kernels == f32_kernels);  // through f32 would add 2 conversions forward and 4 backward
    }
}

TEST_CASE("a collapsing loss scale on the GPU raises NumericalError at the next synchronisation", "[gpu][amp]") {
    Trainer trainer(71, false, 20);
    GradScaler scaler({.init_scale = 4.0, .min_scale = 1.0, .max_consecutive_skips = 3});
    const auto data = batches(1, 16, 7100, {0});  // every step overflows
    for (int i = 0; i < 3; ++i) {
        ComputeGraph graph;
        graph.backward(scaler.scale(cross_entropy(trainer.model.net(graph.input(data[0][0])), graph.input(data[0][1]))));
        scaler.step(trainer.opt);
        scaler.update();
        trainer.opt.zero_grad();
    }
    CHECK_THROWS_MATCHES(cuda::synchronize(0), NumericalError,
                         MessageHas({"GradScaler", "collapsed", "0.5", "3 consecutive skipped steps"}));
    CHECK(scaler.scale_value() == 0.5);  // the record was cleared; the device stays usable
    CHECK(trainer.opt.step_count(0) == 0);
}

// backward(loss) seeds with a one each thread keeps per device and dtype (graph/graph.cpp, unit_seed): no fill
// kernel per step. A leaf whose gradient would be that very storage (the loss is the leaf, or reaches it through
// ops that pass the gradient on) gets a copy, so writing its gradient cannot change later seeds.
TEST_CASE("backward's kept unit seed never becomes a gradient its owner can write", "[gpu][capture]") {
    Generator gen(23);
    Parameter p(Tensor::normal({1}, 0.0, 1.0, gen).to(kGpu), "p");
    Parameter q(Tensor::normal({1}, 0.0, 1.0, gen).to(kGpu), "q");
    Parameter w(Tensor::normal({8}, 0.0, 1.0, gen).to(kGpu), "w");
    const Tensor x = Tensor::uniform({8}, 0.5, 1.5, gen).to(kGpu);
    // A backward seeded with a one gives w the gradient x.
    const auto check_seed_intact = [&] {
        w.zero_grad();
        ComputeGraph graph;
        graph.backward(sum(graph.parameter(w) * graph.constant(x)));
        CHECK(w.grad().to_vector() == x.to_vector());
    };
    for (int pass = 0; pass < 2; ++pass) {
        INFO("pass " << pass);
        p.zero_grad();
        q.zero_grad();
        {
            ComputeGraph graph;
            graph.backward(graph.parameter(p));  // the loss is the leaf itself
        }
        CHECK(p.grad().to_vector() == std::vector<double>{1.0});
        Tensor p_grad = p.grad();
        p_grad.fill(-7.0);  // its owner writes the gradient
        check_seed_intact();
        p.zero_grad();
        {
            ComputeGraph graph;
            graph.backward(graph.parameter(p) + graph.parameter(q));  // add passes its gradient on
        }
        CHECK(p.grad().to_vector() == std::vector<double>{1.0});
        CHECK(q.grad().to_vector() == std::vector<double>{1.0});
        Tensor q_grad = q.grad();
        q_grad.fill(-9.0);
        p_grad = p.grad();
        p_grad.fill(-5.0);
        check_seed_intact();
    }
}

TEST_CASE("what a captured step still cannot do is a GraphError; the device stays usable", "[gpu][capture]") {
    Trainer trainer(81, false, 20);
    const auto data = batches(1, 16, 8100);
    SECTION("a host read of the lr") {
        cuda::CapturedStep step([&](std::span<const Tensor> in) {
            Tensor loss = trainer.step(in);
            static_cast<void>(trainer.opt.lr());  // not inside CHECK: Catch would swallow the exception
            return loss;
        });
        step.run(data[0]);
        CHECK_THROWS_MATCHES(step.run(data[0]), GraphError, MessageHas({"captured"}));
    }
    SECTION("an optimizer's first GPU step") {
        AdamW fresh(trainer.opt.parameters(), {.lr = 1e-3});
        int calls = 0;
        cuda::CapturedStep step([&](std::span<const Tensor> in) {
            ComputeGraph graph;
            Var loss = cross_entropy(trainer.model.net(graph.input(in[0])), graph.input(in[1]));
            graph.backward(loss);
            if (calls++ > 0) fresh.step();  // the warm-up run skips it: its first step is captured
            fresh.zero_grad();
            return loss.value();
        });
        step.run(data[0]);
        CHECK_THROWS_MATCHES(step.run(data[0]), GraphError, MessageHas({"AdamW::step()", "first step", "eagerly"}));
    }
    ComputeGraph graph;
    Var a = graph.input(Tensor::of({1, 2, 3}).to(kGpu), "a", true);
    CHECK(sum(a * a).item() == 14);
    CHECK_NOTHROW(cuda::synchronize(0));
}

// ---- folded launches (step-fold): a schedule's step and a dropout seed draw launch no kernel of their own ----

namespace {

// An f64 parameter at 0 with gradient −1: a plain SGD step leaves it at exactly the lr the kernel used.
void zero_with_unit_gradient(Parameter& p) {
    p.value().fill(0.0);
    p.grad_slot() = Tensor::full({1}, -1.0, DType::f64).to(kGpu);
}

}  // namespace

// The lr of a scheduled GPU step is computed inside the optimizer's kernel from the schedule's rule and device
// epoch (LRScheduler::step launches nothing). Over 1000 steps of each kind, two groups: the lr the kernel used
// is the one lr() reported before the step, bit for bit (one device function computes both), and it equals the
// host's closed form lr_at(epoch) to within 8 ulps of the base lr: CUDA's double cos and pow are within 2 ulps
// and glibc's within 1, and the cosine's (1 + cos) carries cos's absolute error scaled by (base − min) / 2.
// Steps the GradScaler gate skips (every fifth) update nothing but still advance the schedule.
TEST_CASE("a schedule's lr computed inside the optimizer step equals the host schedule for 1000 steps of every kind",
          "[gpu][schedule]") {
    constexpr int kSteps = 1000;
    const std::vector<double> bases = {0.1, 0.03};
    const auto within_ulps = [](double device, double host, double base) {
        return std::abs(device - host) <= 8 * std::numeric_limits<double>::epsilon() * base;
    };
    for (int kind = 0; kind < 3; ++kind) {
        Parameter a(Tensor::zeros({1}, DType::f64, kGpu), "a"), b(Tensor::zeros({1}, DType::f64, kGpu), "b");
        SGD opt({{.parameters = {a}}, {.parameters = {b}, .lr = bases[1]}}, {.lr = bases[0]});
        std::unique_ptr<LRScheduler> schedule;
        if (kind == 0) schedule = std::make_unique<StepLR>(opt, 7, 0.9);
        else if (kind == 1) schedule = std::make_unique<CosineAnnealingLR>(opt, 300, 1e-4);
        else schedule = std::make_unique<WarmupCosineLR>(opt, 50, 800, 1e-5);
        INFO(schedule->name());
        const Optimizer::Gate skip{Tensor::ones({1}, DType::f32, kGpu), Tensor::ones({1}, DType::f32, kGpu)};
        std::size_t bitwise = 0;
        for (int step = 0; step < kSteps; ++step) {
            INFO("step " << step);
            REQUIRE(schedule->epoch() == step);
            std::array<double, 2> reported{};
            for (std::size_t g = 0; g < 2; ++g) {
                reported[g] = opt.lr(g);
                const double host = schedule->lr_at(step, g);
                REQUIRE(within_ulps(reported[g], host, bases[g]));
                bitwise += reported[g] == host ? 1 : 0;
            }
            zero_with_unit_gradient(a);
            zero_with_unit_gradient(b);
            const bool skipped = step % 5 == 3;
            if (skipped) opt.step(skip);
            else opt.step();
            REQUIRE(a.value().item() == (skipped ? 0.0 : reported[0]));  // the lr the kernel used
            REQUIRE(b.value().item() == (skipped ? 0.0 : reported[1]));
            schedule->step();
        }
        INFO(bitwise << " of " << 2 * kSteps << " lrs equal bit for bit");
        CHECK(bitwise > 0);
        CHECK(opt.step_count(0) == kSteps - kSteps / 5);  // the skipped steps did not count
    }
}

// With a deferred schedule the update blocks store their group's lr and the launch's last block only the lrs of
// groups with no elements in the step (here b, which has no gradient): after each step every group's device lr
// is the one reported before it, bit for bit.
TEST_CASE("AdamW's step stores the schedule's lr of every group, also of a group without gradients",
          "[gpu][schedule]") {
    Generator gen(29);
    Parameter a(Tensor::normal({3000}, 0.0, 1.0, gen, DType::f32).to(kGpu), "a"),
        b(Tensor::zeros({5}, DType::f32, kGpu), "b");
    AdamW opt({{.parameters = {a}}, {.parameters = {b}, .lr = 0.02}}, {.lr = 0.1});
    WarmupCosineLR schedule(opt, 5, 40, 1e-4);
    for (int step = 0; step < 50; ++step) {
        INFO("step " << step);
        schedule.step();
        const std::array<double, 2> reported{opt.lr(0), opt.lr(1)};  // computed while the advance is deferred
        a.grad_slot() = Tensor::normal({3000}, 0.0, 1.0, gen, DType::f32).to(kGpu);
        opt.step();
        REQUIRE(opt.lr(0) == reported[0]);
        REQUIRE(opt.lr(1) == reported[1]);
    }
}

TEST_CASE("set_lr after a schedule's step overrides the schedule's lr for one step; a second schedule's step "
          "applies the first's", "[gpu][schedule]") {
    Parameter a(Tensor::zeros({1}, DType::f64, kGpu), "a");
    SGD opt({a}, {.lr = 0.1});
    StepLR halving(opt, 1, 0.5);
    const auto used_lr = [&] {
        zero_with_unit_gradient(a);
        opt.step();
        return a.value().item();
    };
    // The schedule's lrs come from the device's pow: equal to the host's to the last bits (see above).
    const auto host_lr = [](double lr) { return Approx(lr).epsilon(1e-15); };
    CHECK(used_lr() == 0.1);  // the first GPU step makes the device scalars
    halving.step();           // deferred into the next step: 0.05
    CHECK(opt.lr() == host_lr(0.05));
    CHECK(halving.epoch() == 1);
    opt.set_lr(0.3);
    CHECK(opt.lr() == 0.3);
    CHECK(used_lr() == 0.3);
    CHECK(halving.epoch() == 1);
    CHECK(opt.lr() == 0.3);
    halving.step();
    double reported = opt.lr();
    CHECK(reported == host_lr(0.025));  // 0.1 · 0.5²
    CHECK(used_lr() == reported);
    StepLR quarter(opt, 1, 0.25);  // base lr: the lr the last step used
    CHECK(quarter.base_lrs()[0] == reported);
    halving.step();                // epoch 3, deferred
    quarter.step();                // applies halving's (a kernel), defers its own
    CHECK(halving.epoch() == 3);
    CHECK(quarter.epoch() == 1);
    reported = opt.lr();
    CHECK(reported == host_lr(quarter.lr_at(1)));
    CHECK(used_lr() == reported);
    CHECK(opt.lr() == reported);
    CHECK(halving.epoch() == 3);
    CHECK(quarter.epoch() == 1);
}

namespace {

// dyngrad-perf's models (samples/models.cpp): lenet5 on 28×28 and the MLP 784-256-256-10.
Sequential perf_model(bool lenet5, Generator& gen) {
    Sequential model;
    const auto pool = [](const Var& x) { return max_pool2d(x, {2, 2}); };
    if (lenet5) {
        model.add(Conv2d(1, 6, {5, 5}, {.activation = Activation::Relu}, true, gen)).add(pool);
        model.add(Conv2d(6, 16, {5, 5}, {.activation = Activation::Relu}, true, gen)).add(pool);
        model.add([](const Var& x) { return flatten(x); });
        model.add(Linear(256, 120, true, gen, Activation::Relu)).add(Linear(120, 10, true, gen));
    } else {
        model.add(Linear(784, 256, true, gen, Activation::Relu)).add(Linear(256, 256, true, gen, Activation::Relu));
        model.add(Linear(256, 10, true, gen));
    }
    return model;
}

enum class PerfStep { Sgd, AdamW, Full };

// Kernels one replay of a captured training step of batch 64 launches, as dyngrad-perf's rows: SGD (lenet5_b64,
// mlp784_b64); dropout 0.1 on the logits, AdamW and a per-step WarmupCosineLR (*_adamw) and clipping too (*_full).
std::size_t captured_kernels(bool lenet5, PerfStep kind) {
    Generator gen(0);
    Sequential model;
    model.add(perf_model(lenet5, gen));
    if (kind != PerfStep::Sgd) model.add(Dropout(0.1, 1));
    model.to(kGpu);
    std::unique_ptr<Optimizer> opt;
    if (kind == PerfStep::Sgd) opt = std::make_unique<SGD>(model.parameters(), SgdOptions{.lr = 0.01});
    else opt = std::make_unique<AdamW>(model.parameters(), AdamOptions{.lr = 1e-3, .weight_decay = 0.01});
    WarmupCosineLR schedule(*opt, 100, 100'000, 1e-5);
    cuda::CapturedStep step([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var loss = cross_entropy(model(graph.input(in[0], "x")), graph.input(in[1], "labels"));
        graph.backward(loss, {.free_values = true});
        if (kind == PerfStep::Full) opt->clip_grad_norm_and_step(1.0);
        else opt->step();
        if (kind != PerfStep::Sgd) schedule.step();
        opt->zero_grad();
        return loss.value();
    });
    const Shape shape = lenet5 ? Shape{64, 1, 28, 28} : Shape{64, 784};
    const std::vector<Tensor> batch = {Tensor::uniform(shape, -1, 1, gen).to(kGpu), labels_on_gpu(64, 10, gen)};
    for (int run = 0; run < 3; ++run) step.run(batch);  // warm-up, capture, replay
    cuda::synchronize(0);
    return step.last_graph_counts().kernels;
}

}  // namespace

// The *_adamw and *_full rows of dyngrad-perf against the SGD rows (issue 15's "at least as fast"): AdamW's step
// is one kernel as SGD's, the schedule and the dropout seed draw add none, so only dropout (forward and backward)
// and the clip norm add kernels. (Before: + the schedule's kernel and the seed's: 38 / 30 against 33 / 25.)
TEST_CASE("captured AdamW + schedule + dropout steps launch only dropout's and the clip norm's kernels beyond SGD's",
          "[gpu][capture][schedule][dropout]") {
    for (const bool lenet5 : {true, false}) {
        INFO((lenet5 ? "lenet5, batch 64" : "MLP 784-256-256-10, batch 64"));
        const std::size_t sgd = captured_kernels(lenet5, PerfStep::Sgd);
        CHECK(sgd > 0);
        CHECK(captured_kernels(lenet5, PerfStep::AdamW) == sgd + 2);
        CHECK(captured_kernels(lenet5, PerfStep::Full) == sgd + 3);
    }
}

// Many dropout draws per step (the GPT draws 13): four layers, one of them called twice. Each replay draws the
// next seeds of every stream inside the dropout kernels, so its masks are fresh and exactly the eager run's and
// the CPU's for the same draw numbers, and the draws cost no kernel: the step launches as many as the same
// step with fixed seeds (the attribute form, nothing drawn).
TEST_CASE("many Dropout draws per captured step: every replay's masks equal the eager run's, with no kernel per draw",
          "[gpu][capture][dropout]") {
    constexpr int kRuns = 6;
    const std::vector<double> ps = {0.1, 0.25, 0.4, 0.5};
    const std::vector<std::uint64_t> seeds = {21, 22, 23, 24};
    const std::vector<std::size_t> calls = {0, 1, 2, 0, 3};  // layer 0 twice: draws 2 and 1 per stream and step
    Generator gen(64);
    const Tensor x64 = Tensor::normal({33, 65}, 0.0, 1.0, gen, DType::f64);
    const Tensor w = Tensor::normal({33, 65}, 0.0, 1.0, gen).to(kGpu);
    const Tensor x = x64.to(DType::f32).to(kGpu);
    // y_k = dropout_k(x) for each call, back-propagating w into each; returns every y and dx stacked by rows.
    const auto make_step = [&](std::vector<Dropout>& layers, bool fixed_seeds) {
        return [&layers, &calls, &ps, &w, fixed_seeds](std::span<const Tensor> in) {
            ComputeGraph graph;
            const Var xv = graph.input(in[0], "x", true);
            std::vector<Var> ys;
            for (std::size_t k = 0; k < calls.size(); ++k) {
                const std::size_t layer = calls[k];
                ys.push_back(fixed_seeds ? dropout(xv, ps[layer], true, std::uint64_t{1000 + k}) : layers[layer](xv));
            }
            Var loss = sum(ys[0] * graph.constant(w));
            for (std::size_t k = 1; k < ys.size(); ++k) loss = loss + sum(ys[k] * graph.constant(w));
            graph.backward(loss);
            std::vector<Tensor> out;
            for (const Var& y : ys) out.push_back(y.value());
            out.push_back(xv.grad());
            return concat(out);
        };
    };
    const auto layers_of = [&] {
        std::vector<Dropout> layers;
        for (std::size_t i = 0; i < ps.size(); ++i) layers.emplace_back(ps[i], seeds[i]);
        return layers;
    };
    std::vector<Dropout> eager_layers = layers_of(), captured_layers = layers_of(), unused = layers_of();
    const auto eager_step = make_step(eager_layers, false);
    cuda::CapturedStep captured(make_step(captured_layers, false));
    const std::vector<double> xs = x.to_vector();
    const auto n = static_cast<std::size_t>(x.numel());
    std::vector<double> previous;
    for (int run = 1; run <= kRuns; ++run) {
        INFO("run " << run);
        const std::vector<double> eager_out = eager_step(std::span<const Tensor>(&x, 1)).to_vector();
        const std::vector<double> out = captured.run(std::span<const Tensor>(&x, 1)).to_vector();
        REQUIRE(out.size() == (calls.size() + 1) * n);
        CHECK(out == eager_out);  // bit for bit
        // Call k of run r is draw number d of its stream: the CPU's mask for dropout_draw_seed(seed, d).
        std::vector<std::uint64_t> draws_so_far(ps.size(), 0);
        std::size_t mismatches = 0;
        for (std::size_t k = 0; k < calls.size(); ++k) {
            const std::size_t layer = calls[k];
            const std::uint64_t per_run = static_cast<std::uint64_t>(std::count(calls.begin(), calls.end(), layer));
            const std::uint64_t draw = static_cast<std::uint64_t>(run - 1) * per_run + ++draws_so_far[layer];
            const std::uint64_t seed = math::dropout_draw_seed(seeds[layer], draw);
            for (std::size_t i = 0; i < n; ++i)
                if (xs[i] != 0 && (out[k * n + i] != 0) != math::dropout_keep(seed, i, ps[layer])) ++mismatches;
        }
        CHECK(mismatches == 0);
        CHECK(out != previous);
        previous = out;
    }
    CHECK(captured_layers[0].seeds().draws() == 2 * kRuns);
    CHECK(captured_layers[3].seeds().draws() == kRuns);
    CHECK(eager_layers[0].seeds().draws() == 2 * kRuns);
    cuda::CapturedStep fixed(make_step(unused, true));
    for (int run = 0; run < 3; ++run) fixed.run(std::span<const Tensor>(&x, 1));
    // Unfused, each layer's dropout kernel draws its seed: no launch of its own. With the fusion compiler (on in
    // captured steps by default) each dropout is a member of a generated group and its draw is a one-thread
    // kernel ahead of the group's (ops/kernels.h, draw_pending_seed): one more node per layer call.
    const std::size_t draws = fusion::fusion_settings().enabled ? calls.size() : 0;
    CHECK(captured.last_graph_counts().kernels == fixed.last_graph_counts().kernels + draws);
    CHECK(unused[0].seeds().draws() == 0);
}

// ---- activation checkpointing (graph/checkpoint.h): a captured checkpointed step against eager plain steps, and
// the GPT with every block checkpointed against the plain GPT, f32 and bf16 autocast ----

namespace {

// Two residual blocks x + fc2(dropout(tanh(fc1(x)))), each optionally checkpointed, then a classifier.
struct CheckpointModel {
    Generator gen;
    Linear a1, a2, b1, b2, head;
    Dropout drop;
    bool use_checkpoint;
    CheckpointModel(std::uint64_t seed, bool use_checkpoint)
        : gen(seed), a1(32, 64, true, gen), a2(64, 32, true, gen), b1(32, 64, true, gen), b2(64, 32, true, gen),
          head(32, 10, true, gen), drop(0.3, seed + 1), use_checkpoint(use_checkpoint) {
        for (Linear* l : {&a1, &a2, &b1, &b2, &head}) l->to(kGpu);
    }
    std::vector<Parameter> parameters() const {
        std::vector<Parameter> out;
        for (const Linear* l : {&a1, &a2, &b1, &b2, &head})
            for (const Parameter& p : l->parameters()) out.push_back(p);
        return out;
    }
    Var block(const Linear& fc1, const Linear& fc2, const Var& x) const {
        const auto body = [&](const Var& h) { return add(h, fc2(drop(tanh(fc1(h))))); };
        return use_checkpoint ? checkpoint(body, x) : body(x);
    }
    Var operator()(const Var& x) const { return head(block(b1, b2, block(a1, a2, x))); }
};

struct CheckpointTrainer {
    CheckpointModel model;
    AdamW opt;
    CheckpointTrainer(std::uint64_t seed, bool use_checkpoint)
        : model(seed, use_checkpoint), opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01}) {}
    Tensor step(std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var loss = cross_entropy(model(graph.input(in[0])), graph.input(in[1]));
        graph.backward(loss);
        opt.step();
        opt.zero_grad();
        return loss.value();
    }
};

std::vector<std::vector<Tensor>> checkpoint_batches(int count, std::int64_t rows, std::uint64_t seed) {
    Generator gen(seed);
    std::vector<std::vector<Tensor>> out;
    for (int i = 0; i < count; ++i) {
        Tensor x = Tensor::normal({rows, 32}, 0.0, 1.0, gen).to(kGpu);
        out.push_back({x, labels_on_gpu(rows, 10, gen)});
    }
    return out;
}

}  // namespace

TEST_CASE("a captured checkpointed step equals the eager plain step bit for bit, replay after replay",
          "[gpu][capture][checkpoint][deterministic]") {
    const Deterministic deterministic;
    constexpr int kSteps = 30;
    CheckpointTrainer eager(41, false), captured(41, true);
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return captured.step(in); });
    check_captured_equals_eager(eager, captured, step, checkpoint_batches(3, 16, 4100), kSteps);
    CHECK(captured.model.drop.seeds().draws() == 2 * kSteps);  // the replays drew fresh masks
}

TEST_CASE("the GPT with every block checkpointed matches the plain GPT on the GPU, f32 and bf16 autocast",
          "[gpu][checkpoint][gpt]") {
    const Deterministic deterministic;
    for (const DType precision : {DType::f32, DType::bf16}) {
        INFO("precision " << dtype_name(precision));
        const auto run = [&](bool use_checkpoint) {
            Generator gen(43);
            GPTConfig config{.vocab_size = 13, .context = 16, .layers = 2, .heads = 2, .width = 32, .dropout = 0.1,
                             .seed = 5};
            config.checkpoint = use_checkpoint;
            GPT model(config, gen);
            model.to(kGpu);
            model.train(true);
            std::vector<std::int64_t> tokens;
            for (int i = 0; i < 2 * 15; ++i) tokens.push_back((i * 7 + 2) % 13);
            ComputeGraph g;
            Var loss;
            {
                const AutocastGuard autocast(precision);
                const Var logits = model(g.input(Tensor::from_vector(tokens, {2, 15}).to(kGpu)));
                loss = mean(mul(logits, logits));
            }
            g.backward(loss);
            std::vector<std::vector<double>> out{{loss.item()}};
            for (const Parameter& p : model.parameters()) out.push_back(p.grad().to_vector());
            return out;
        };
        CHECK(run(false) == run(true));
    }
}

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "GPU capture tests"); }
