// The training surface of issue 13 (model layer): optimizer parameter groups, frozen parameters, gradient
// clipping, optimizer and schedule state in checkpoints (a resumed run is bitwise the uninterrupted one),
// and PyTorch's default initialisation of Linear, Conv2d and the recurrent layers.
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "catch.h"
#include "temp_file.h"
#include "dyngrad/dyngrad.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::f64;
using dgtest::quadratic_step;
using dgtest::MessageHas;

namespace {

// A file path under the system temp dir, removed at the end of the test.
// A temporary file of this test file.
struct TempFile : dgtest::TempFile {
    explicit TempFile(const std::string& name) : dgtest::TempFile("nn_surface", name) {}
};

std::vector<double> values_of(const std::vector<Parameter>& params) {
    std::vector<double> out;
    for (const Parameter& p : params)
        for (const double v : p.value().to_vector()) out.push_back(v);
    return out;
}

}  // namespace

// ---- parameter groups ----

TEST_CASE("parameter groups have their own lr and weight decay; unset settings take the options",
          "[nn][optim][groups]") {
    Parameter a(f64({1, -2}), "a");
    Parameter b(f64({4}), "b");
    SECTION("SGD: group 0 lr 0.1, group 1 lr 0.5 and weight decay 1") {
        SGD opt({{.parameters = {a}}, {.parameters = {b}, .lr = 0.5, .weight_decay = 1.0}}, {.lr = 0.1});
        REQUIRE(opt.group_count() == 2);
        CHECK(opt.lr(0) == 0.1);
        CHECK(opt.options(1).weight_decay == 1.0);
        quadratic_step(opt, {a, b});
        // a ← a − 0.1·a;  b ← b − 0.5·(b + 1·b) = 0
        CHECK(a.value().to_vector() == std::vector<double>{0.9, -1.8});
        CHECK(b.value().to_vector() == std::vector<double>{0.0});
        CHECK(opt.group_parameters(1).size() == 1);
        CHECK(opt.step_count(0) == 1);
    }
    SECTION("Adam: a group with its own betas moves by its own rule") {
        Adam opt({{.parameters = {a}}, {.parameters = {b}, .lr = 0.2, .beta1 = 0.5}}, {.lr = 0.1});
        quadratic_step(opt, {a, b});
        quadratic_step(opt, {a, b});
        // The same two steps by a single-group Adam with group 1's settings.
        Parameter b2(f64({4}), "b2");
        Adam reference({b2}, {.lr = 0.2, .beta1 = 0.5});
        quadratic_step(reference, {b2});
        quadratic_step(reference, {b2});
        CHECK(b.value().to_vector() == b2.value().to_vector());
        Parameter a2(f64({1, -2}), "a2");
        Adam reference_a({a2}, {.lr = 0.1});
        quadratic_step(reference_a, {a2});
        quadratic_step(reference_a, {a2});
        CHECK(a.value().to_vector() == a2.value().to_vector());
    }
    SECTION("schedules scale every group's own base lr") {
        SGD opt({{.parameters = {a}, .lr = 1.0}, {.parameters = {b}, .lr = 0.2}});
        StepLR schedule(opt, 1, 0.5);
        schedule.step();
        CHECK(opt.lr(0) == 0.5);
        CHECK(opt.lr(1) == 0.1);
        CHECK(schedule.lr_at(2, 1) == Approx(0.05));
        opt.set_lr(1, 0.3);
        CHECK(opt.lr(1) == 0.3);
        opt.set_lr(0.7);
        CHECK((opt.lr(0) == 0.7 && opt.lr(1) == 0.7));
    }
    SECTION("a setting the optimizer does not have, a bad value, a repeated parameter") {
        CHECK_THROWS_MATCHES(SGD({{.parameters = {a}, .beta1 = 0.5}}), ValueError, MessageHas({"SGD", "group 0", "beta1"}));
        CHECK_THROWS_MATCHES(Adam({{.parameters = {a}, .momentum = 0.5}}), ValueError, MessageHas({"Adam", "momentum"}));
        CHECK_THROWS_MATCHES(SGD({{.parameters = {a}}, {.parameters = {b}, .lr = -1}}), ValueError,
                             MessageHas({"SGD group 1", "lr"}));
        CHECK_THROWS_MATCHES(SGD({{.parameters = {a}}, {.parameters = {a}}}), ValueError, MessageHas({"'a'", "twice"}));
        SGD opt({a});
        CHECK_THROWS_AS(opt.lr(1), IndexError);
        CHECK_THROWS_AS(opt.set_lr(0, std::numeric_limits<double>::infinity()), ValueError);
    }
}

// ---- freezing ----

TEST_CASE("a frozen parameter gets no gradient and the optimizer leaves it alone", "[nn][optim][freeze]") {
    Generator gen(5);
    Parameter frozen(Tensor::uniform({3}, -1, 1, gen, DType::f64), "frozen");
    Parameter live(Tensor::uniform({3}, -1, 1, gen, DType::f64), "live");
    SGD opt({frozen, live}, {.lr = 0.1});
    quadratic_step(opt, {frozen, live});  // both trainable: both have a gradient
    REQUIRE(frozen.grad().defined());
    frozen.set_requires_grad(false);
    CHECK_FALSE(frozen.requires_grad());
    const std::vector<double> before = frozen.value().to_vector();
    {
        ComputeGraph graph;
        Var w = graph.parameter(frozen);
        CHECK_FALSE(w.requires_grad());
        Var loss = sum(w * graph.parameter(live));
        graph.backward(loss);  // the stale gradient of frozen stays as it was; no new one is added
    }
    opt.step();  // frozen keeps its stale gradient, but is skipped
    CHECK(frozen.value().to_vector() == before);
    CHECK(opt.step_count(0) == 1);
    CHECK(opt.step_count(1) == 2);
    // Unfrozen, it trains again.
    frozen.set_requires_grad(true);
    quadratic_step(opt, {frozen});
    CHECK(frozen.value().to_vector() != before);
    CHECK_THROWS_AS(Parameter().set_requires_grad(false), ValueError);
}

// ---- clipping ----

TEST_CASE("clip_grad_norm scales by min(1, max_norm / (norm + eps)) and returns the norm", "[nn][clip]") {
    Generator gen(17);
    Parameter a(Tensor::uniform({4, 3}, -2, 2, gen, DType::f64), "a");
    Parameter b(Tensor::uniform({5}, -2, 2, gen, DType::f64), "b");
    const auto with_grads = [&] {
        // loss = Σ c·w with fixed random c: the gradients are those c.
        ComputeGraph graph;
        Var loss = sum(graph.parameter(a) * graph.input(Tensor::uniform({4, 3}, -3, 3, gen, DType::f64))) +
                   sum(graph.parameter(b) * graph.input(Tensor::uniform({5}, -3, 3, gen, DType::f64)));
        a.zero_grad();
        b.zero_grad();
        graph.backward(loss);
        std::vector<double> g = a.grad().to_vector();
        for (const double v : b.grad().to_vector()) g.push_back(v);
        return g;
    };
    for (const double p : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
        INFO("norm_type " << p);
        const std::vector<double> g = with_grads();
        double total = 0;
        for (const double v : g) total = std::isinf(p) ? std::max(total, std::abs(v)) : total + std::pow(std::abs(v), p);
        const double norm = std::isinf(p) ? total : std::pow(total, 1 / p);
        const double max_norm = norm / 3;  // clips
        const Tensor returned = clip_grad_norm({a, b}, max_norm, p);
        CHECK(returned.shape() == Shape{});
        CHECK(returned.dtype() == DType::f64);
        CHECK(returned.item() == Approx(norm).epsilon(1e-12));
        const double scale = max_norm / (norm + 1e-6);
        std::vector<double> clipped = a.grad().to_vector();
        for (const double v : b.grad().to_vector()) clipped.push_back(v);
        for (std::size_t i = 0; i < g.size(); ++i) CHECK(clipped[i] == Approx(g[i] * scale).epsilon(1e-12));
        // Under the limit: unchanged, bit for bit.
        const std::vector<double> again = clipped;
        clip_grad_norm({a, b}, norm, p);
        std::vector<double> now = a.grad().to_vector();
        for (const double v : b.grad().to_vector()) now.push_back(v);
        CHECK(now == again);
    }
    SECTION("no gradients: norm 0; frozen parameters are left out") {
        a.zero_grad();
        b.zero_grad();
        CHECK(clip_grad_norm({a, b}, 1.0).item() == 0);
        with_grads();
        b.set_requires_grad(false);
        const std::vector<double> b_grad = b.grad().to_vector();
        double total = 0;
        for (const double v : a.grad().to_vector()) total += v * v;
        CHECK(clip_grad_norm({a, b}, 0.5).item() == Approx(std::sqrt(total)));
        CHECK(b.grad().to_vector() == b_grad);
    }
    SECTION("a gradient shared with another tensor is not scaled through it") {
        ComputeGraph graph;
        Var w = graph.parameter(a);
        Var loss = sum(w);  // the gradient of a may alias the graph's ones
        a.zero_grad();
        graph.backward(loss, {.retain_graph = true});
        const Tensor before = a.grad();
        const std::vector<double> ones = before.to_vector();
        clip_grad_norm({a}, 0.1);
        CHECK(before.to_vector() == ones);  // the handle taken before clipping still reads the unclipped values
    }
    SECTION("bad arguments") {
        with_grads();
        CHECK_THROWS_MATCHES(clip_grad_norm({a}, -1), ValueError, MessageHas({"clip_grad_norm", "max_norm"}));
        CHECK_THROWS_MATCHES(clip_grad_norm({a}, 1, 0), ValueError, MessageHas({"clip_grad_norm", "norm_type"}));
        CHECK_THROWS_AS(clip_grad_norm({a}, std::nan("")), ValueError);
        CHECK_THROWS_AS(clip_grad_norm({Parameter()}, 1), ValueError);
    }
}

TEST_CASE("Optimizer::clip_grad_norm_and_step equals clip_grad_norm then step(), bit for bit, and leaves the "
          "gradients clipped", "[nn][clip]") {
    Generator gen(29);
    const auto make = [&] {
        std::vector<Parameter> params{Parameter(Tensor::normal({7, 5}, 0, 1, gen), "w"),
                                      Parameter(Tensor::normal({5}, 0, 1, gen), "b"),
                                      Parameter(Tensor::normal({4}, 0, 1, gen, DType::f64), "d")};
        return params;
    };
    const std::vector<Parameter> a = make();
    std::vector<Parameter> b;
    for (const Parameter& p : a) b.emplace_back(p.value().clone(), p.name());
    // loss = Σ c·w² with fresh random c per step: gradients 2·c·w.
    const auto backward = [&](const std::vector<Parameter>& params, const std::vector<Tensor>& c) {
        ComputeGraph graph;
        Var loss;
        for (std::size_t i = 0; i < params.size(); ++i) {
            Var w = graph.parameter(params[i]);
            const Var term = to_dtype(sum(w * w * graph.input(c[i])), DType::f64);
            loss = i == 0 ? term : loss + term;
        }
        graph.backward(loss);
    };
    const auto grads_of = [](const std::vector<Parameter>& params) {
        std::vector<std::vector<double>> out;
        for (const Parameter& p : params) out.push_back(p.grad().to_vector());
        return out;
    };
    AdamW opt_a(a, {.lr = 0.01, .weight_decay = 0.1}), opt_b(b, {.lr = 0.01, .weight_decay = 0.1});
    for (int step = 0; step < 4; ++step) {
        std::vector<Tensor> c;
        for (const Parameter& p : a) c.push_back(Tensor::uniform(p.value().shape(), -3, 3, gen, p.value().dtype()));
        backward(a, c);
        backward(b, c);
        const double max_norm = step % 2 == 0 ? 0.5 : 1e6;  // clips, then does not
        const Tensor separate = clip_grad_norm(a, max_norm);
        const std::vector<std::vector<double>> clipped = grads_of(a);  // read between clip and step
        opt_a.step();
        const Tensor fused = opt_b.clip_grad_norm_and_step(max_norm);
        CHECK(fused.item() == separate.item());
        CHECK(fused.dtype() == separate.dtype());
        CHECK(grads_of(b) == clipped);  // the fused call leaves the gradients clipped too
        CHECK(grads_of(a) == clipped);
        for (std::size_t i = 0; i < a.size(); ++i) {
            INFO(a[i].name());
            CHECK(a[i].value().to_vector() == b[i].value().to_vector());
            CHECK(opt_a.exp_avg_sq(i).to_vector() == opt_b.exp_avg_sq(i).to_vector());
        }
        opt_a.zero_grad();
        opt_b.zero_grad();
    }
    SECTION("bad arguments change nothing") {
        std::vector<Tensor> c;
        for (const Parameter& p : b) c.push_back(Tensor::uniform(p.value().shape(), -3, 3, gen, p.value().dtype()));
        backward(b, c);
        const std::vector<double> before = b[0].value().to_vector();
        const std::vector<std::vector<double>> grads = grads_of(b);
        CHECK_THROWS_MATCHES(opt_b.clip_grad_norm_and_step(-1), ValueError,
                             MessageHas({"clip_grad_norm_and_step", "max_norm"}));
        CHECK_THROWS_MATCHES(opt_b.clip_grad_norm_and_step(1, 0), ValueError, MessageHas({"norm_type"}));
        CHECK_THROWS_MATCHES(opt_b.clip_grad_norm_and_step(1, 2, -1), ValueError, MessageHas({"eps"}));
        CHECK(b[0].value().to_vector() == before);
        CHECK(grads_of(b) == grads);
        CHECK(opt_b.step_count(0) == 4);
    }
}

TEST_CASE("clip_grad_value clamps every gradient element", "[nn][clip]") {
    Generator gen(23);
    Parameter a(Tensor::uniform({50}, -1, 1, gen), "a");
    ComputeGraph graph;
    const Tensor c = Tensor::uniform({50}, -3, 3, gen);
    graph.backward(sum(graph.parameter(a) * graph.input(c)));
    clip_grad_value({a}, 1.5);
    const std::vector<double> g = a.grad().to_vector(), expected = c.to_vector();
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == std::clamp(expected[i], -1.5, 1.5));
    CHECK_THROWS_MATCHES(clip_grad_value({a}, -0.5), ValueError, MessageHas({"clip_grad_value"}));
}

// ---- checkpoints ----

namespace {

struct Net : Module {
    Linear fc1, fc2;
    explicit Net(std::uint64_t seed) : Net(Generator(seed)) {}
    explicit Net(Generator&& gen) : Net(gen) {}
    explicit Net(Generator& gen) : fc1(4, 8, true, gen), fc2(8, 2, true, gen) {
        register_module("fc1", fc1);
        register_module("fc2", fc2);
    }
    Var operator()(const Var& x) const { return fc2(tanh(fc1(x))); }
};

// Batch `step` of a fixed synthetic regression: the same inputs for the same step in every run.
void train_step(Net& net, Optimizer& opt, std::int64_t step) {
    Generator gen(1000 + static_cast<std::uint64_t>(step));
    ComputeGraph graph;
    Var x = graph.input(Tensor::uniform({16, 4}, -1, 1, gen));
    Var y = graph.input(Tensor::uniform({16, 2}, -1, 1, gen));
    Var loss = mse_loss(net(x), y);
    opt.zero_grad();
    graph.backward(loss);
    opt.step();
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(Net&)>;
using MakeSchedule = std::function<std::unique_ptr<LRScheduler>(Optimizer&)>;

// Trains `steps` steps from `from`, stepping the schedule every second step.
void train(Net& net, Optimizer& opt, LRScheduler& schedule, std::int64_t from, std::int64_t steps) {
    for (std::int64_t s = from; s < from + steps; ++s) {
        train_step(net, opt, s);
        if (s % 2 == 1) schedule.step();
    }
}

}  // namespace

TEST_CASE("a run resumed from a checkpoint continues bit for bit as the uninterrupted one", "[nn][checkpoint]") {
    struct Case {
        const char* name;
        MakeOptimizer optimizer;
        MakeSchedule schedule;
    };
    const std::vector<Case> cases = {
        {"SGD momentum + StepLR",
         [](Net& n) {
             return std::make_unique<SGD>(std::vector<ParamGroup>{{.parameters = n.fc1.parameters()},
                                                                  {.parameters = n.fc2.parameters(), .lr = 0.02}},
                                          SgdOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3});
         },
         [](Optimizer& o) { return std::make_unique<StepLR>(o, 2, 0.5); }},
        {"Adam + cosine",
         [](Net& n) { return std::make_unique<Adam>(n.parameters(), AdamOptions{.lr = 0.01, .weight_decay = 1e-2}); },
         [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 5, 1e-4); }},
        {"AdamW + StepLR",
         [](Net& n) {
             return std::make_unique<AdamW>(std::vector<ParamGroup>{{.parameters = n.fc1.parameters()},
                                                                    {.parameters = n.fc2.parameters(), .weight_decay = 0}},
                                            AdamOptions{.lr = 0.01, .weight_decay = 0.05});
         },
         [](Optimizer& o) { return std::make_unique<StepLR>(o, 1, 0.7); }},
        {"AdamW + cosine",
         [](Net& n) { return std::make_unique<AdamW>(n.parameters(), AdamOptions{.lr = 0.02, .weight_decay = 0.01}); },
         [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 3); }},
    };
    constexpr std::int64_t kSteps = 12;
    for (const Case& c : cases) {
        INFO(c.name);
        Net straight(7);
        auto straight_opt = c.optimizer(straight);
        auto straight_schedule = c.schedule(*straight_opt);
        train(straight, *straight_opt, *straight_schedule, 0, kSteps);

        TempFile file("resume.safetensors");
        {
            Net first(7);
            auto opt = c.optimizer(first);
            auto schedule = c.schedule(*opt);
            train(first, *opt, *schedule, 0, kSteps / 2);
            save_checkpoint(file.path, first, *opt, schedule.get());
        }
        Net resumed(99);  // another initialisation: everything must come from the file
        auto opt = c.optimizer(resumed);
        auto schedule = c.schedule(*opt);
        load_checkpoint(file.path, resumed, *opt, schedule.get());
        CHECK(schedule->epoch() == kSteps / 4);
        train(resumed, *opt, *schedule, kSteps / 2, kSteps / 2);

        CHECK(values_of(resumed.parameters()) == values_of(straight.parameters()));
        CHECK(opt->lr(0) == straight_opt->lr(0));
        CHECK(opt->step_count(0) == kSteps);
        // A resume without the checkpoint diverges: the comparison above can fail.
        Net fresh(99);
        auto fresh_opt = c.optimizer(fresh);
        auto fresh_schedule = c.schedule(*fresh_opt);
        load_parameters(fresh, file.path);  // the weights alone: the model's part of a checkpoint
        train(fresh, *fresh_opt, *fresh_schedule, kSteps / 2, kSteps / 2);
        CHECK(values_of(fresh.parameters()) != values_of(straight.parameters()));
    }
}

TEST_CASE("a checkpoint that does not fit gives a typed error and changes nothing", "[nn][checkpoint]") {
    Net net(3);
    Adam adam(net.parameters(), {.lr = 0.01});
    StepLR schedule(adam, 1, 0.5);
    train(net, adam, schedule, 0, 3);
    TempFile file("bad.safetensors");
    save_checkpoint(file.path, net, adam, &schedule);
    SafetensorsMetadata metadata;
    const TensorMap good = load_safetensors(file.path, &metadata);

    Net other(4);
    Adam target(other.parameters(), {.lr = 0.5});
    StepLR target_schedule(target, 1, 0.5);
    const std::vector<double> before = values_of(other.parameters());
    const auto write = [&](TensorMap tensors, SafetensorsMetadata meta) {
        save_safetensors(file.path, tensors, meta);
    };
    const auto unchanged = [&] {
        CHECK(values_of(other.parameters()) == before);
        CHECK(target.lr() == 0.5);
        CHECK(target.step_count(0) == 0);
        CHECK(target_schedule.epoch() == 0);
    };
    SECTION("a missing moment") {
        TensorMap t = good;
        t.erase("@optimizer.state.0.exp_avg_sq");
        write(t, metadata);
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, target, &target_schedule), IoError,
                             MessageHas({"@optimizer.state.0.exp_avg_sq", "fc1.weight"}));
        unchanged();
    }
    SECTION("a moment of the wrong shape") {
        TensorMap t = good;
        t["@optimizer.state.1.exp_avg"] = Tensor::zeros({3});
        write(t, metadata);
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, target, &target_schedule), ShapeError,
                             MessageHas({"@optimizer.state.1.exp_avg", "(3)", "(8)"}));
        unchanged();
    }
    SECTION("another optimizer type") {
        SGD sgd(other.parameters(), {.lr = 0.5, .momentum = 0.9});
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, sgd), ValueError, MessageHas({"Adam", "SGD"}));
        CHECK(values_of(other.parameters()) == before);
        AdamW adamw(other.parameters());
        CHECK_THROWS_MATCHES(adamw.load_state(good, metadata, "f"), ValueError, MessageHas({"Adam", "AdamW"}));
    }
    SECTION("another schedule type, another group layout, a model weight of another shape") {
        CosineAnnealingLR cosine(target, 3);
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, target, &cosine), ValueError,
                             MessageHas({"StepLR", "CosineAnnealingLR"}));
        Adam grouped({{.parameters = other.fc1.parameters()}, {.parameters = other.fc2.parameters()}});
        // Another number of groups is another group layout: ValueError, as the header says (issue 35).
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, grouped), ValueError,
                             MessageHas({"group_sizes", "1 Adam parameter groups there and 2 here"}));
        TensorMap t = good;
        t["fc2.bias"] = Tensor::zeros({3});
        write(t, metadata);
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, target, &target_schedule), ShapeError,
                             MessageHas({"fc2.bias"}));
        unchanged();
    }
    SECTION("weights only, a schedule of another optimizer, an unexpected state entry") {
        save_parameters(net, file.path);
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, target), IoError, MessageHas({"no optimizer state"}));
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, adam, &target_schedule), ValueError,
                             MessageHas({"another optimizer"}));
        TensorMap t = good;
        t["@optimizer.state.0.momentum_buffer"] = Tensor::zeros({8, 4});
        write(t, metadata);
        CHECK_THROWS_MATCHES(load_checkpoint(file.path, other, target, &target_schedule), IoError,
                             MessageHas({"momentum_buffer"}));
        unchanged();
    }
}

// ---- initialisation ----

TEST_CASE("Linear and Conv2d initialise as torch.nn does; the earlier scheme stays by name", "[nn][init]") {
    Generator gen(31);
    const auto check_bound = [](const Tensor& t, double bound) {
        const std::vector<double> v = t.to_vector();
        double sum = 0, squares = 0, largest = 0;
        for (const double x : v) {
            sum += x;
            squares += x * x;
            largest = std::max(largest, std::abs(x));
        }
        const auto n = static_cast<double>(v.size());
        CHECK(largest <= bound);
        CHECK(largest > 0.9 * bound);  // uniform over the whole range
        CHECK(std::abs(sum / n) < 0.05 * bound);
        CHECK(squares / n == Approx(bound * bound / 3).epsilon(0.05));  // the variance of uniform(±bound)
    };
    SECTION("Linear: uniform(±1/√in) for weight and bias") {
        Linear layer(200, 300, true, gen);
        check_bound(layer.weight.value(), 1 / std::sqrt(200.0));
        Linear wide(2000, 40, true, gen);  // 40 biases are too few for statistics: bounds only
        for (const double b : wide.bias.value().to_vector()) CHECK(std::abs(b) <= 1 / std::sqrt(2000.0));
        Linear many(30, 5000, true, gen);
        check_bound(many.bias.value(), 1 / std::sqrt(30.0));
    }
    SECTION("Conv2d: fan_in = C/groups·R·S") {
        Conv2d conv(8, 64, {3, 3}, {.padding = {1, 1}, .groups = 2}, true, gen);
        check_bound(conv.weight.value(), 1 / std::sqrt(4.0 * 9));
        Conv2d many(16, 3000, {1, 1}, {}, true, gen);
        check_bound(many.bias.value(), 1 / std::sqrt(16.0));
    }
    SECTION("Init::KaimingRelu: ReLU-gain weight, zero bias") {
        Linear layer(200, 300, true, gen, Activation::None, Init::KaimingRelu);
        check_bound(layer.weight.value(), std::sqrt(6.0 / 200));
        CHECK(layer.bias.value().to_vector() == std::vector<double>(300, 0.0));
        CHECK(leaky_relu_gain(0) == Approx(kReluGain));
        CHECK_THROWS_MATCHES(Linear(2, 2, true, gen, Activation::None, static_cast<Init>(9)), ValueError,
                             MessageHas({"Init"}));
    }
    SECTION("recurrent layers: uniform(±1/√hidden) over every weight and bias") {
        LSTM lstm(10, {.hidden_size = 64, .num_layers = 2}, gen);
        check_bound(lstm.weight.value(), 1 / std::sqrt(64.0));
        GRU gru(7, {.hidden_size = 25}, gen);
        check_bound(gru.weight.value(), 1 / std::sqrt(25.0));
    }
}
