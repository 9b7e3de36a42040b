// The host logic of capturable training (issue 15, parts 3–4), on the CPU: GradScaler (skips on inf/NaN,
// growth after the interval, backoff, collapse, checkpoints, the fused unscale), the gated optimizer step,
// WarmupCosineLR, and dropout's device-resident seed stream (DropoutSeeds, the seed-tensor form of the op).
// The GPU halves (captured == eager, bit for bit; the guard) are in tests/capture/test_gpu_capture.cpp.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include "catch.h"
#include "temp_file.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/ops/dropout_mask.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

// A temporary file of this test file.
struct TempFile : dgtest::TempFile {
    explicit TempFile(const std::string& name) : dgtest::TempFile("capturable", name) {}
};

// A small regression model and a fresh batch per step, all from one seed.
struct Tiny {
    Generator gen;
    Linear layer;
    explicit Tiny(std::uint64_t seed) : gen(seed), layer(6, 3, true, gen) {}

    // loss of the batch of step `step` (inputs drawn from the step number, the same for two Tiny of a seed)
    Var loss(ComputeGraph& graph, int step) const {
        Generator data(1000 + static_cast<std::uint64_t>(step));
        const Tensor x = Tensor::normal({8, 6}, 0.0, 1.0, data);
        const Tensor y = Tensor::normal({8, 3}, 0.0, 1.0, data);
        return mse_loss(layer(graph.input(x)), graph.input(y));
    }
};

std::vector<std::vector<double>> values_of(const std::vector<Parameter>& params) {
    std::vector<std::vector<double>> out;
    for (const Parameter& p : params) out.push_back(p.value().to_vector());
    return out;
}

// Puts an inf into the first gradient, as an overflowing reduced-precision backward would.
void poison_gradient(const Parameter& p) {
    Tensor& grad = const_cast<Parameter&>(p).grad_slot();
    grad = grad.clone();
    grad.data<float>()[0] = std::numeric_limits<float>::infinity();
}

}  // namespace

TEST_CASE("a scaled step equals the plain step when nothing overflows, bit for bit", "[amp]") {
    // Power-of-two scales multiply every gradient exactly, so scale → backward → unscale is the identity.
    Tiny plain(3), scaled(3);
    AdamW plain_opt(plain.layer.parameters(), {.lr = 0.01, .weight_decay = 0.01});
    AdamW scaled_opt(scaled.layer.parameters(), {.lr = 0.01, .weight_decay = 0.01});
    GradScaler scaler({.growth_interval = 2});
    for (int step = 0; step < 6; ++step) {
        ComputeGraph a;
        a.backward(plain.loss(a, step));
        plain_opt.step();
        plain_opt.zero_grad();
        ComputeGraph b;
        b.backward(scaler.scale(scaled.loss(b, step)));
        scaler.step(scaled_opt);
        scaler.update();
        scaled_opt.zero_grad();
        CHECK_FALSE(scaler.last_step_skipped());
    }
    CHECK(values_of(plain.layer.parameters()) == values_of(scaled.layer.parameters()));
    CHECK(scaler.scale_value() == 65536.0 * 8);  // grew after steps 2, 4 and 6
    CHECK(scaled_opt.step_count(0) == 6);
}

TEST_CASE("GradScaler::step only reads the gradients: none is copied while the graph still shares it", "[amp]") {
    // A parameter's gradient is shared with its leaf in the graph until the graph goes. The inf check of step()
    // read it through gradient_targets, which made every gradient exclusive by copying it: the whole gradient
    // size again at the step (256 MiB of the f16 MLP 4096 step's peak) and a copy each. unscale() writes the
    // gradients in place, so it still makes them exclusive.
    Tiny model(9);
    SGD sgd(model.layer.parameters(), {.lr = 0.01});
    GradScaler scaler({.init_scale = 256.0});
    for (int step = 0; step < 2; ++step) {
        ComputeGraph graph;
        graph.backward(scaler.scale(model.loss(graph, step)));
        std::vector<const void*> storage;
        std::vector<std::vector<double>> scaled;
        for (const Parameter& p : model.layer.parameters()) {
            REQUIRE_FALSE(p.grad().owns_storage_exclusively());  // the graph's leaf holds it too
            storage.push_back(p.grad().raw_data());
            scaled.push_back(p.grad().to_vector());
        }
        if (step == 0) {
            scaler.step(sgd);
            for (std::size_t i = 0; i < storage.size(); ++i) {
                INFO("parameter " << i);
                CHECK(model.layer.parameters()[i].grad().raw_data() == storage[i]);
                CHECK(model.layer.parameters()[i].grad().to_vector() == scaled[i]);  // read, not unscaled
            }
        } else {
            scaler.unscale(sgd);
            for (std::size_t i = 0; i < storage.size(); ++i) {
                INFO("parameter " << i);
                CHECK(model.layer.parameters()[i].grad().raw_data() != storage[i]);
                CHECK(model.layer.parameters()[i].grad().owns_storage_exclusively());
            }
            scaler.step(sgd);
        }
        CHECK_FALSE(scaler.last_step_skipped());
        scaler.update();
        sgd.zero_grad();
    }
    CHECK(sgd.step_count(0) == 2);
}

TEST_CASE("a step whose gradients hold inf or NaN is skipped whole and the scale backs off", "[amp]") {
    Tiny model(4);
    Adam adam(model.layer.parameters(), {.lr = 0.05});
    GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
    ComputeGraph warm;
    warm.backward(scaler.scale(model.loss(warm, 0)));
    scaler.step(adam);
    scaler.update();
    adam.zero_grad();
    REQUIRE(scaler.growth_tracker() == 1);

    const auto before = values_of(model.layer.parameters());
    const auto m_before = adam.exp_avg(0).to_vector();
    ComputeGraph graph;
    graph.backward(scaler.scale(model.loss(graph, 1)));
    SECTION("inf") { poison_gradient(model.layer.parameters()[1]); }
    SECTION("NaN") {
        Tensor& grad = const_cast<Parameter&>(model.layer.parameters()[0]).grad_slot();
        grad = grad.clone();
        grad.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
    }
    scaler.step(adam);
    CHECK(scaler.last_step_skipped());
    CHECK(values_of(model.layer.parameters()) == before);
    CHECK(adam.exp_avg(0).to_vector() == m_before);  // the moments did not move either
    CHECK(adam.step_count(0) == 1);                  // nor the step count (bias corrections)
    scaler.update();
    CHECK(scaler.scale_value() == 512.0);
    CHECK(scaler.growth_tracker() == 0);
    CHECK(scaler.consecutive_skips() == 1);
    adam.zero_grad();

    // The next clean step updates again, from the same bias correction as if the skip never happened.
    ComputeGraph next;
    next.backward(scaler.scale(model.loss(next, 2)));
    scaler.step(adam);
    scaler.update();
    CHECK(adam.step_count(0) == 2);
    CHECK(values_of(model.layer.parameters()) != before);
    CHECK(scaler.consecutive_skips() == 0);
    CHECK(scaler.growth_tracker() == 1);
}

TEST_CASE("the scale grows by growth_factor after growth_interval clean steps", "[amp]") {
    Tiny model(5);
    SGD sgd(model.layer.parameters(), {.lr = 0.01});
    GradScaler scaler({.init_scale = 8.0, .growth_factor = 4.0, .growth_interval = 3});
    const double expected[] = {8, 8, 32, 32, 32, 128};
    for (int step = 0; step < 6; ++step) {
        ComputeGraph graph;
        graph.backward(scaler.scale(model.loss(graph, step)));
        scaler.step(sgd);
        scaler.update();
        sgd.zero_grad();
        INFO("step " << step);
        CHECK(scaler.scale_value() == expected[step]);
        CHECK(scaler.growth_tracker() == (step + 1) % 3);
    }
}

TEST_CASE("unscale() gives the true gradients for clipping, and step() then uses them as they are", "[amp]") {
    Tiny plain(6), scaled(6);
    SGD plain_opt(plain.layer.parameters(), {.lr = 0.1, .momentum = 0.9});
    SGD scaled_opt(scaled.layer.parameters(), {.lr = 0.1, .momentum = 0.9});
    GradScaler scaler;
    for (int step = 0; step < 3; ++step) {
        ComputeGraph a;
        a.backward(plain.loss(a, step));
        const double plain_norm = clip_grad_norm(plain.layer.parameters(), 0.05).item();
        plain_opt.step();
        plain_opt.zero_grad();
        ComputeGraph b;
        b.backward(scaler.scale(scaled.loss(b, step)));
        scaler.unscale(scaled_opt);
        CHECK_THROWS_MATCHES(scaler.unscale(scaled_opt), ValueError, MessageHas({"unscale", "once per step"}));
        const double scaled_norm = clip_grad_norm(scaled.layer.parameters(), 0.05).item();
        CHECK(scaled_norm == plain_norm);
        scaler.step(scaled_opt);
        scaler.update();
        scaled_opt.zero_grad();
    }
    CHECK(values_of(plain.layer.parameters()) == values_of(scaled.layer.parameters()));
}

TEST_CASE("a collapsing loss scale is a NumericalError after max_consecutive_skips skips", "[amp]") {
    Tiny model(7);
    SGD sgd(model.layer.parameters(), {.lr = 0.01});
    GradScaler scaler({.init_scale = 4.0, .min_scale = 1.0, .max_consecutive_skips = 3});
    const auto skipped_step = [&] {
        ComputeGraph graph;
        graph.backward(scaler.scale(model.loss(graph, 0)));
        poison_gradient(model.layer.parameters()[0]);
        scaler.step(sgd);
        sgd.zero_grad();
    };
    skipped_step();
    scaler.update();  // 2
    skipped_step();
    scaler.update();  // 1: not below min_scale
    skipped_step();
    CHECK_THROWS_MATCHES(scaler.update(), NumericalError,
                         MessageHas({"GradScaler", "at step 3 ", "collapsed", "0.5", "3 consecutive skipped steps"}));
    CHECK(scaler.scale_value() == 0.5);
}

TEST_CASE("GradScaler refuses bad options and a misordered update", "[amp]") {
    CHECK_THROWS_MATCHES(GradScaler({.init_scale = 0}), ValueError, MessageHas({"init_scale"}));
    CHECK_THROWS_MATCHES(GradScaler({.growth_factor = 1}), ValueError, MessageHas({"growth_factor"}));
    CHECK_THROWS_MATCHES(GradScaler({.backoff_factor = 1}), ValueError, MessageHas({"backoff_factor"}));
    CHECK_THROWS_MATCHES(GradScaler({.growth_interval = 0}), ValueError, MessageHas({"growth_interval"}));
    GradScaler scaler;
    CHECK_THROWS_MATCHES(scaler.update(), ValueError, MessageHas({"update", "step()"}));
    GradScaler off({.enabled = false});
    Tiny model(8);
    ComputeGraph graph;
    Var loss = model.loss(graph, 0);
    CHECK(off.scale(loss).id() == loss.id());  // disabled: the identity
}

TEST_CASE("GradScaler refuses calls out of order and changes nothing (issue 35)", "[amp]") {
    Tiny model(12);
    SGD sgd(model.layer.parameters(), {.lr = 0.1});
    GradScaler scaler({.init_scale = 1024.0});
    const auto before = values_of(model.layer.parameters());
    {
        // A backward of the unscaled loss: stepping through the scaler would divide these true gradients by
        // 1024 (a step 1024 times too short, silently).
        ComputeGraph graph;
        graph.backward(model.loss(graph, 0));
        CHECK_THROWS_MATCHES(scaler.step(sgd), ValueError, MessageHas({"GradScaler::step", "scale(loss)"}));
        CHECK_THROWS_MATCHES(scaler.unscale(sgd), ValueError, MessageHas({"GradScaler::unscale", "scale(loss)"}));
        CHECK(values_of(model.layer.parameters()) == before);
        CHECK(sgd.step_count(0) == 0);
        sgd.zero_grad();
    }
    {
        ComputeGraph graph;
        graph.backward(scaler.scale(model.loss(graph, 1)));
        // A state loaded now would divide gradients scaled by 1024 by the loaded scale.
        TensorMap saved;
        SafetensorsMetadata metadata;
        GradScaler({.init_scale = 4.0}).save_state(saved, metadata);
        CHECK_THROWS_MATCHES(scaler.load_state(saved, metadata, "mid-step"), ValueError,
                             MessageHas({"mid-step", "between scale() and step()"}));
        CHECK(scaler.scale_value() == 1024.0);
        scaler.unscale(sgd);
        // A second scaled loss after unscale() would leave its gradients scaled among unscaled ones.
        ComputeGraph second;
        CHECK_THROWS_MATCHES(scaler.scale(model.loss(second, 2)), ValueError,
                             MessageHas({"GradScaler::scale", "unscale()", "step()"}));
        scaler.step(sgd);
        CHECK_THROWS_MATCHES(scaler.step(sgd), ValueError, MessageHas({"GradScaler::step", "update()"}));
        CHECK(sgd.step_count(0) == 1);
        scaler.update();
        sgd.zero_grad();
    }
    // The order scale, backward, step, update works again, and a scaled step equals the plain one.
    Tiny plain(12);
    SGD plain_sgd(plain.layer.parameters(), {.lr = 0.1});
    plain_sgd.step();  // no gradients: nothing moves, as the refused steps above
    {
        ComputeGraph graph;
        graph.backward(plain.loss(graph, 1));
        plain_sgd.step();
        plain_sgd.zero_grad();
    }
    CHECK(values_of(model.layer.parameters()) == values_of(plain.layer.parameters()));
    ComputeGraph graph;
    graph.backward(scaler.scale(model.loss(graph, 3)));
    scaler.step(sgd);
    scaler.update();
    CHECK(sgd.step_count(0) == 2);
}

TEST_CASE("every schedule refuses an lr at a negative epoch (issue 35)", "[schedule]") {
    Tiny model(13);
    SGD sgd(model.layer.parameters(), {.lr = 0.1});
    WarmupCosineLR warmup(sgd, 4, 12);
    StepLR step(sgd, 3);
    CosineAnnealingLR cosine(sgd, 5);
    // The warm-up's closed form at epoch -3 is base · (-2) / 5: a negative rate.
    CHECK_THROWS_MATCHES(warmup.lr_at(-3), ValueError, MessageHas({"WarmupCosineLR", "epoch -3", "negative"}));
    CHECK_THROWS_MATCHES(step.lr_at(-1), ValueError, MessageHas({"StepLR", "epoch -1"}));
    CHECK_THROWS_MATCHES(cosine.lr_at(-7, 0), ValueError, MessageHas({"CosineAnnealingLR", "epoch -7"}));
    CHECK(warmup.lr_at(0) > 0);
}

TEST_CASE("an empty captured step is a ValueError in every build (issue 35)", "[capture]") {
    CHECK_THROWS_MATCHES(cuda::CapturedStep(cuda::CapturedStep::StepFn{}), ValueError,
                         MessageHas({"CapturedStep", "step function is empty"}));
    CHECK_THROWS_MATCHES(cuda::CapturedStep(nullptr, {.guard_replays = 1}), ValueError, MessageHas({"CapturedStep"}));
}

TEST_CASE("the scaler's state travels in a checkpoint; a resumed run continues exactly", "[amp][checkpoint]") {
    Tiny first(9);
    Adam adam(first.layer.parameters(), {.lr = 0.01});
    GradScaler scaler({.init_scale = 256.0, .growth_interval = 4});
    const auto train = [](Tiny& m, Adam& opt, GradScaler& s, int from, int to) {
        for (int step = from; step < to; ++step) {
            ComputeGraph graph;
            graph.backward(s.scale(m.loss(graph, step)));
            if (step == 2) poison_gradient(m.layer.parameters()[0]);  // one skip on the way
            s.step(opt);
            s.update();
            opt.zero_grad();
        }
    };
    train(first, adam, scaler, 0, 3);
    TempFile file("scaler.safetensors");
    save_checkpoint(file.path, first.layer, adam, nullptr, &scaler);
    train(first, adam, scaler, 3, 9);

    Tiny resumed(99);
    Adam resumed_opt(resumed.layer.parameters(), {.lr = 0.01});
    GradScaler resumed_scaler({.init_scale = 256.0, .growth_interval = 4});
    load_checkpoint(file.path, resumed.layer, resumed_opt, nullptr, &resumed_scaler);
    CHECK(resumed_scaler.scale_value() == 128.0);
    CHECK(resumed_scaler.growth_tracker() == 0);
    CHECK(resumed_scaler.consecutive_skips() == 1);
    train(resumed, resumed_opt, resumed_scaler, 3, 9);
    CHECK(values_of(resumed.layer.parameters()) == values_of(first.layer.parameters()));
    CHECK(resumed_scaler.scale_value() == scaler.scale_value());

    // A checkpoint without scaler state is an IoError for a scaler, and changes nothing.
    TempFile bare("bare.safetensors");
    save_checkpoint(bare.path, first.layer, adam);
    GradScaler untouched({.init_scale = 32.0});
    CHECK_THROWS_MATCHES(load_checkpoint(bare.path, resumed.layer, resumed_opt, nullptr, &untouched), IoError,
                         MessageHas({"GradScaler"}));
    CHECK(untouched.scale_value() == 32.0);
}

TEST_CASE("WarmupCosineLR: linear warm-up, half cosine to min_lr, then min_lr", "[schedule]") {
    Tiny model(10);
    AdamW opt(model.layer.parameters(), {.lr = 0.1});
    WarmupCosineLR schedule(opt, 4, 12, 0.01);
    const double pi = 3.141592653589793;
    const auto expected = [&](std::int64_t e) {
        if (e < 4) return 0.1 * static_cast<double>(e + 1) / 5.0;
        if (e >= 12) return 0.01;
        return 0.01 + (0.1 - 0.01) * (1 + std::cos(pi * static_cast<double>(e - 4) / 8.0)) / 2;
    };
    CHECK(opt.lr() == Approx(expected(0)).epsilon(1e-15));  // the constructor sets epoch 0's lr
    for (std::int64_t e = 1; e <= 15; ++e) {
        schedule.step();
        INFO("epoch " << e);
        CHECK(opt.lr() == Approx(expected(e)).epsilon(1e-15));
        CHECK(schedule.lr_at(e) == opt.lr());
    }
    CHECK(schedule.lr_at(4) == Approx(0.1).epsilon(1e-15));  // the peak at the end of the warm-up
    CHECK_THROWS_MATCHES(WarmupCosineLR(opt, 5, 5), ValueError, MessageHas({"total_steps", "warmup_steps"}));
    CHECK_THROWS_MATCHES(WarmupCosineLR(opt, -1, 5), ValueError, MessageHas({"warmup_steps"}));
    CHECK_THROWS_MATCHES(WarmupCosineLR(opt, 1, 5, -0.5), ValueError, MessageHas({"min_lr"}));
}

TEST_CASE("a WarmupCosineLR run resumed from a checkpoint continues with the same lrs", "[schedule][checkpoint]") {
    Tiny model(11);
    SGD opt(model.layer.parameters(), {.lr = 0.2});
    WarmupCosineLR schedule(opt, 3, 10);
    for (int i = 0; i < 5; ++i) schedule.step();
    TempFile file("warmup.safetensors");
    save_checkpoint(file.path, model.layer, opt, &schedule);
    SGD other(model.layer.parameters(), {.lr = 0.2});
    WarmupCosineLR resumed(other, 3, 10);
    load_checkpoint(file.path, model.layer, other, &resumed);
    CHECK(resumed.epoch() == 5);
    schedule.step();
    resumed.step();
    CHECK(other.lr() == opt.lr());
}

TEST_CASE("dropout's seed tensor gives the mask of the same seed passed as a value", "[dropout]") {
    Generator gen(12);
    const Tensor x = Tensor::normal({7, 9}, 0.0, 1.0, gen, DType::f64);
    const std::uint64_t seed = 0x9E3779B97F4A7C15ull ^ 12345;  // above 2^63: the tensor carries its bits
    const Tensor seed_tensor = Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(seed)}, {1});
    CHECK(dropout(x, 0.4, true, seed_tensor).to_vector() == dropout(x, 0.4, true, seed).to_vector());

    // The backward recomputes the mask from the recorded seed input.
    ComputeGraph graph;
    Var xv = graph.input(x, "x", true);
    Var y = dropout(xv, 0.4, true, graph.constant(seed_tensor));
    graph.backward(sum(y));
    const std::vector<double> dx = xv.grad().to_vector(), yv = y.value().to_vector(), xs = x.to_vector();
    for (std::size_t i = 0; i < dx.size(); ++i) CHECK(yv[i] == dx[i] * xs[i]);  // y = x · mask, dx = mask
}

TEST_CASE("DropoutSeeds draws the stream the Dropout layer always drew", "[dropout]") {
    DropoutSeeds seeds(77);
    for (std::uint64_t n = 1; n <= 3; ++n) {
        const Tensor s = seeds.next(Device::cpu());
        CHECK(static_cast<std::uint64_t>(s.data<std::int64_t>()[0]) == math::dropout_draw_seed(77, n));
        CHECK(static_cast<std::uint64_t>(s.data<std::int64_t>()[0]) == math::splitmix64_mix(77 + n * math::kSplitMixGamma));
    }
    CHECK(seeds.draws() == 3);

    // The layer: call n draws the mask of seed dropout_draw_seed(seed, n); copies share the counter.
    Dropout layer(0.3, 5);
    const Dropout copy = layer;
    Generator gen(13);
    const Tensor x = Tensor::normal({4, 10}, 0.0, 1.0, gen);
    ComputeGraph graph;
    const Var first = layer(graph.input(x));
    const Var second = copy(graph.input(x));
    CHECK(first.value().to_vector() == dropout(x, 0.3, true, math::dropout_draw_seed(5, 1)).to_vector());
    CHECK(second.value().to_vector() == dropout(x, 0.3, true, math::dropout_draw_seed(5, 2)).to_vector());
    CHECK(layer.seeds().draws() == 2);
}

TEST_CASE("dropout refuses a seed tensor that is not one int64", "[dropout]") {
    const Tensor x = Tensor::ones({3, 3});
    CHECK_THROWS_MATCHES(dropout(x, 0.5, true, Tensor::zeros({1}, DType::f32)), DTypeError,
                         MessageHas({"seed", "int64", "float32"}));
    CHECK_THROWS_MATCHES(dropout(x, 0.5, true, Tensor::zeros({2}, DType::i64)), ShapeError,
                         MessageHas({"seed", "one element"}));
}

TEST_CASE("a gated optimizer step refuses missing flags and changes nothing", "[amp]") {
    Tiny model(14);
    SGD sgd(model.layer.parameters(), {.lr = 0.01});
    ComputeGraph graph;
    graph.backward(model.loss(graph, 0));
    const auto before = values_of(model.layer.parameters());
    CHECK_THROWS_MATCHES(sgd.step(Optimizer::Gate{}), ValueError, MessageHas({"inv_scale", "found_inf"}));
    CHECK(values_of(model.layer.parameters()) == before);
    CHECK(sgd.step_count(0) == 0);
}
