// Training utilities: initialisation statistics, modules and layers, optimizer steps against
// hand-computed values, learning-rate schedules, a small model that learns, and the safetensors files
// (round trips, and malformed files that must fail cleanly without changing their destination).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <string>
#include <unistd.h>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::f64;
using dgtest::quadratic_step;
using dgtest::Approx;
using dgtest::ApproxVector;
using dgtest::MessageHas;

namespace {

// Element-wise agreement to `relative` (plus a tiny margin for values near 0), much tighter than
// ApproxVector's float tolerance; for float64 arithmetic checked against hand-computed values.
auto Close(const std::vector<double>& expected, double relative = 1e-12) {
    auto matcher = Catch::Matchers::Approx(expected);
    matcher.epsilon(relative);
    matcher.margin(1e-15);
    return matcher;
}

double mean_of(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
}
double variance_of(const std::vector<double>& v) {
    const double m = mean_of(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return s / static_cast<double>(v.size());
}

// A folder under the system temp dir, removed with its contents at the end of the test.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        static int counter = 0;
        path = std::filesystem::temp_directory_path() /
               ("dyngrad_test_training_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
    std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

// Writes a file in the safetensors layout from parts: the 8-byte length (header.size() unless given),
// the header text and the data bytes.
void write_raw(const std::filesystem::path& path, const std::string& header, const std::string& data,
               std::uint64_t length) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), sizeof length);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
}
void write_raw(const std::filesystem::path& path, const std::string& header, const std::string& data) {
    write_raw(path, header, data, header.size());
}
std::string bytes_of(const std::vector<float>& values) {
    return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}
std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// PyTorch's Adam / AdamW for one scalar, written out independently of the library's code.
struct ScalarAdam {
    double lr, beta1, beta2, eps, weight_decay;
    bool decoupled;
    double m = 0, v = 0;
    int t = 0;
    double step(double w, double g) {
        ++t;
        if (decoupled) w *= 1 - lr * weight_decay;
        else g += weight_decay * w;
        m = beta1 * m + (1 - beta1) * g;
        v = beta2 * v + (1 - beta2) * g * g;
        const double m_hat = m / (1 - std::pow(beta1, t));
        const double v_hat = v / (1 - std::pow(beta2, t));
        return w - lr * m_hat / (std::sqrt(v_hat) + eps);
    }
};

}  // namespace

// ---- initialisation ----

TEST_CASE("fans of dense and convolution weights", "[training][init]") {
    CHECK(compute_fans({10, 20}).in == 20);
    CHECK(compute_fans({10, 20}).out == 10);
    CHECK(compute_fans({8, 3, 5, 5}).in == 75);
    CHECK(compute_fans({8, 3, 5, 5}).out == 200);
    CHECK_THROWS_AS(compute_fans({7}), ShapeError);
    Generator gen(1);
    CHECK_THROWS_AS(kaiming_uniform({4, 0}, gen), ValueError);
}

TEST_CASE("initialisers draw the documented mean and variance", "[training][init]") {
    Generator gen(2024);
    struct Case {
        const char* name;
        Tensor value;
        double variance;
        double bound;  // uniform: every value within ±bound; normal: 0
    };
    const Shape dense{256, 512};      // fan_in 512, fan_out 256
    const Shape conv{64, 32, 3, 3};  // fan_in 288, fan_out 576
    const double relu = 2.0;
    const std::vector<Case> cases = {
        {"kaiming_uniform", kaiming_uniform(dense, gen, kReluGain, DType::f64), relu / 512, std::sqrt(3 * relu / 512)},
        {"kaiming_normal", kaiming_normal(dense, gen, kReluGain, DType::f64), relu / 512, 0},
        {"kaiming_uniform conv", kaiming_uniform(conv, gen, 1.0, DType::f64), 1.0 / 288, std::sqrt(3.0 / 288)},
        {"xavier_uniform", xavier_uniform(dense, gen, 1.0, DType::f64), 2.0 / 768, std::sqrt(6.0 / 768)},
        {"xavier_normal conv", xavier_normal(conv, gen, 1.0, DType::f64), 2.0 / 864, 0},
        {"xavier_normal gain", xavier_normal(dense, gen, 3.0, DType::f64), 9 * 2.0 / 768, 0},
    };
    for (const Case& c : cases) {
        INFO(c.name);
        const std::vector<double> v = c.value.to_vector();
        const double n = static_cast<double>(v.size());
        CHECK(std::abs(mean_of(v)) < 5 * std::sqrt(c.variance / n));
        CHECK(variance_of(v) == Approx(c.variance).epsilon(0.03));
        double largest = 0;
        for (double x : v) largest = std::max(largest, std::abs(x));
        if (c.bound > 0) CHECK(largest <= c.bound);
    }
    // Seeded: the same seed draws the same tensor; the dtype and device arguments are honoured.
    Generator a(7), b(7);
    CHECK(kaiming_normal({3, 4}, a).to_vector() == kaiming_normal({3, 4}, b).to_vector());
    CHECK(xavier_uniform({3, 4}, a).dtype() == DType::f32);
}

// ---- modules ----

namespace {
struct Mlp : Module {
    Linear fc1, fc2;
    explicit Mlp(Generator& gen) : fc1(3, 5, true, gen), fc2(5, 2, false, gen) {
        register_module("fc1", fc1);
        register_module("fc2", fc2);
    }
    Var operator()(const Var& x) const { return fc2(relu(fc1(x))); }
};
}  // namespace

TEST_CASE("modules name, order and move their tensors", "[training][module]") {
    Generator gen(3);
    Mlp mlp(gen);
    std::vector<std::string> names;
    for (const Parameter& p : mlp.parameters()) names.push_back(p.name());
    CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight"});
    CHECK(mlp.fc1.weight.value().shape() == Shape{5, 3});
    for (const double b : mlp.fc1.bias.value().to_vector()) CHECK(std::abs(b) <= 1 / std::sqrt(3.0));  // PyTorch's init
    CHECK_FALSE(mlp.fc2.bias.defined());

    SECTION("nesting prefixes every level; a module is a handle") {
        Module outer;
        outer.register_module("body", mlp);
        CHECK(outer.parameters().front().name() == "body.fc1.weight");
        CHECK(mlp.fc1.weight.name() == "body.fc1.weight");  // the same Parameter
        Mlp copy = mlp;
        copy.fc1.weight.value().fill(1.0);
        CHECK(mlp.fc1.weight.value().at({0, 0}) == 1.0);
    }
    SECTION("train / eval reach every child") {
        CHECK(mlp.fc1.is_training());
        mlp.eval();
        CHECK_FALSE(mlp.is_training());
        CHECK_FALSE(mlp.fc2.is_training());
        mlp.train();
        CHECK(mlp.fc2.is_training());
    }
    SECTION("to(dtype) converts and drops gradients") {
        ComputeGraph graph;
        graph.backward(sum(mlp(graph.input(Tensor::ones({2, 3})))));
        CHECK(mlp.fc1.weight.grad().defined());
        mlp.to(DType::f64);
        CHECK(mlp.fc1.weight.value().dtype() == DType::f64);
        CHECK_FALSE(mlp.fc1.weight.grad().defined());
        CHECK_THROWS_AS(mlp.to(DType::i64), DTypeError);
    }
    SECTION("bad registrations") {
        Module m;
        m.register_parameter("w", Tensor::ones({2}));
        CHECK_THROWS_MATCHES(m.register_parameter("w", Tensor::ones({2})), ValueError, MessageHas({"'w'"}));
        CHECK_THROWS_AS(m.register_buffer("a.b", Tensor::ones({2})), ValueError);
        Module child;
        m.register_module("child", child);
        CHECK_THROWS_MATCHES(child.register_module("parent", m), ValueError, MessageHas({"cycle"}));
        CHECK_THROWS_MATCHES(m.register_module("self", m), ValueError, MessageHas({"cycle"}));
    }
    SECTION("an existing Parameter keeps its identity, value and gradient") {
        // A Module over parameters owned elsewhere (the Python binding builds one for DistributedDataParallel).
        Parameter own(Tensor::ones({2}));
        Module outer, inner;
        inner.register_parameter("w", own);
        outer.register_module("inner", inner);
        const auto named = outer.named_parameters();
        REQUIRE(named.size() == 1);
        CHECK(named[0].first == "inner.w");
        CHECK(named[0].second.identity() == own.identity());
        CHECK(own.name() == "inner.w");
        ComputeGraph graph;
        graph.backward(sum(graph.parameter(own)));
        CHECK(named[0].second.grad().defined());
        CHECK_THROWS_MATCHES(inner.register_parameter("v", Parameter()), ValueError, MessageHas({"undefined"}));
    }
    SECTION("a shared layer is listed once") {
        Module twice;
        twice.register_module("a", mlp.fc1);
        twice.register_module("b", mlp.fc1);
        CHECK(twice.parameters().size() == 2);
        CHECK(twice.parameters().front().name() == "a.weight");
    }
}

TEST_CASE("layers compute what their ops compute", "[training][module]") {
    Generator gen(5);
    ComputeGraph graph;

    SECTION("Sequential names modules by index and passes callables through") {
        Sequential seq;
        seq.add(Linear(4, 3, true, gen)).add([](const Var& x) { return relu(x); }).add(Linear(3, 2, true, gen));
        CHECK(seq.size() == 3);
        std::vector<std::string> names;
        for (const Parameter& p : seq.parameters()) names.push_back(p.name());
        CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
        Var y = seq(graph.input(Tensor::ones({5, 4})));
        CHECK(y.shape() == Shape{5, 2});
        Sequential alias = seq;  // a handle: layers added through it belong to seq too
        alias.add([](const Var& x) { return sigmoid(x); });
        CHECK(seq.size() == 4);
    }
    SECTION("a ReLU fused into Linear computes relu(linear) and skip_index keeps the later names") {
        Sequential fused;
        fused.add(Linear(4, 3, true, gen, Activation::Relu)).skip_index().add(Linear(3, 2, true, gen));
        CHECK(fused.size() == 2);
        std::vector<std::string> names;
        for (const Parameter& p : fused.parameters()) names.push_back(p.name());
        CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
        const std::vector<Parameter> params = fused.parameters();
        Var x = graph.input(Tensor::normal({5, 4}, 0.0, 1.0, gen), "x");
        const Var separate = linear(relu(linear(x, graph.parameter(params[0]), graph.parameter(params[1]))),
                                    graph.parameter(params[2]), graph.parameter(params[3]));
        CHECK(fused(x).value().to_vector() == separate.value().to_vector());
    }
    SECTION("a ReLU fused into conv2d computes relu(conv2d), gradients included; Conv2d takes it as an option") {
        const Tensor x = Tensor::normal({2, 2, 5, 6}, 0.0, 1.0, gen), w = Tensor::normal({3, 2, 3, 3}, 0.0, 1.0, gen);
        const Tensor b = Tensor::normal({3}, 0.0, 1.0, gen), dy = Tensor::normal({2, 3, 5, 6}, 0.0, 1.0, gen);
        std::vector<std::vector<double>> results[2];  // [fused]: y, dx, dw, db
        for (const bool fused : {false, true}) {
            ComputeGraph g;
            const Var vx = g.input(x, "x", true), vw = g.input(w, "w", true), vb = g.input(b, "b", true);
            const Var y = fused ? conv2d(vx, vw, vb, {.padding = {1, 1}, .activation = Activation::Relu})
                                : relu(conv2d(vx, vw, vb, {.padding = {1, 1}}));
            g.backward(y, dy);
            results[fused] = {y.value().to_vector(), vx.grad().to_vector(), vw.grad().to_vector(),
                              vb.grad().to_vector()};
        }
        CHECK(results[1] == results[0]);
        Sequential model;
        model.add(Conv2d(2, 3, {3, 3}, {.activation = Activation::Relu}, true, gen)).skip_index();
        model.add(Conv2d(3, 1, {1, 1}, {}, true, gen));
        std::vector<std::string> names;
        for (const Parameter& p : model.parameters()) names.push_back(p.name());
        CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
    }
    SECTION("Conv2d + BatchNorm: shapes, parameters, buffers and running statistics") {
        Conv2d conv(2, 4, {3, 3}, {.padding = {1, 1}}, true, gen);
        BatchNorm bn(4);
        CHECK(conv.weight.value().shape() == Shape{4, 2, 3, 3});
        Var x = graph.input(Tensor::normal({3, 2, 5, 5}, 1.0, 2.0, gen));
        Var y = bn(conv(x));
        CHECK(y.shape() == Shape{3, 4, 5, 5});
        CHECK(bn.running_mean->to_vector() != std::vector<double>(4, 0.0));  // training updates them
        const std::vector<double> frozen = bn.running_var->to_vector();
        bn.eval();
        bn(conv(x));
        CHECK(bn.running_var->to_vector() == frozen);
        std::vector<std::string> buffers;
        for (const auto& [name, value] : bn.buffers()) buffers.push_back(name);
        CHECK(buffers == std::vector<std::string>{"running_mean", "running_var"});
        CHECK_THROWS_AS(Conv2d(3, 4, {3, 3}, {.groups = 2}, true, gen), ValueError);
    }
    SECTION("Dropout draws a new mask per call and is the identity in eval mode") {
        Dropout drop(0.5, 99);
        Var x = graph.input(Tensor::ones({64}));
        const std::vector<double> first = drop(x).value().to_vector();
        const std::vector<double> second = drop(x).value().to_vector();
        CHECK(first != second);
        Dropout same(0.5, 99);
        CHECK(same(x).value().to_vector() == first);  // seeded: runs repeat
        drop.eval();
        CHECK(drop(x).value().to_vector() == std::vector<double>(64, 1.0));
        CHECK_THROWS_AS(Dropout(1.0, 0), ValueError);
    }
}

// ---- optimizers ----

TEST_CASE("SGD steps match hand-computed values", "[training][optim]") {
    Parameter w(f64({1, -2}), "w");
    SECTION("plain, lr 0.1: w ← 0.9·w") {
        SGD opt({w}, {.lr = 0.1});
        quadratic_step(opt, {w});
        quadratic_step(opt, {w});
        CHECK_THAT(w.value().to_vector(), Close({0.81, -1.62}));
    }
    SECTION("momentum 0.9") {
        // buf = g = (1,-2), w = (0.9,-1.8); buf = 0.9·(1,-2) + (0.9,-1.8) = (1.8,-3.6), w = (0.72,-1.44)
        SGD opt({w}, {.lr = 0.1, .momentum = 0.9});
        quadratic_step(opt, {w});
        CHECK_THAT(w.value().to_vector(), Close({0.9, -1.8}));
        quadratic_step(opt, {w});
        CHECK_THAT(w.value().to_vector(), Close({0.72, -1.44}));
    }
    SECTION("Nesterov momentum 0.9") {
        // step 1: d = g + 0.9·buf = (1.9,-3.8), w = (0.81,-1.62)
        // step 2: buf = (1.71,-3.42), d = (2.349,-4.698), w = (0.5751,-1.1502)
        SGD opt({w}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
        quadratic_step(opt, {w});
        CHECK_THAT(w.value().to_vector(), Close({0.81, -1.62}));
        quadratic_step(opt, {w});
        CHECK_THAT(w.value().to_vector(), Close({0.5751, -1.1502}));
    }
    SECTION("weight decay 0.5: g = 1.5·w, w ← 0.85·w") {
        SGD opt({w}, {.lr = 0.1, .weight_decay = 0.5});
        quadratic_step(opt, {w});
        quadratic_step(opt, {w});
        CHECK_THAT(w.value().to_vector(), Close({0.7225, -1.445}));
    }
    SECTION("float32 follows the same rule") {
        Parameter w32(Tensor::of({1, -2}), "w32");
        SGD opt({w32}, {.lr = 0.1, .momentum = 0.9});
        quadratic_step(opt, {w32});
        quadratic_step(opt, {w32});
        CHECK_THAT(w32.value().to_vector(), ApproxVector({0.72, -1.44}, 1e-6));
    }
    SECTION("bad options") {
        CHECK_THROWS_AS(SGD({w}, {.lr = -1}), ValueError);
        CHECK_THROWS_AS(SGD({w}, {.nesterov = true}), ValueError);
        CHECK_THROWS_MATCHES(SGD({w, w}), ValueError, MessageHas({"'w'", "twice"}));
    }
}

TEST_CASE("Adam and AdamW steps match hand-computed values", "[training][optim]") {
    struct Case {
        const char* name;
        double weight_decay;
        bool decoupled;
    };
    for (const Case& c : {Case{"Adam", 0.0, false}, Case{"Adam L2", 0.3, false}, Case{"AdamW", 0.3, true}}) {
        INFO(c.name);
        Parameter w(f64({1, -2, 0.5}), "w");
        const AdamOptions options{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = c.weight_decay};
        std::unique_ptr<Optimizer> opt;
        if (c.decoupled) opt = std::make_unique<AdamW>(std::vector<Parameter>{w}, options);
        else opt = std::make_unique<Adam>(std::vector<Parameter>{w}, options);
        std::vector<ScalarAdam> reference(3, ScalarAdam{0.1, 0.9, 0.999, 1e-8, c.weight_decay, c.decoupled});
        std::vector<double> expected = {1, -2, 0.5};
        for (int step = 0; step < 2; ++step) {
            quadratic_step(*opt, {w});
            for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = reference[i].step(expected[i], expected[i]);
            CHECK_THAT(w.value().to_vector(), Close(expected));
        }
    }
    // Step 1 by hand: m̂ = g, v̂ = g², so w moves by lr·g/(|g| + eps) ≈ lr against the gradient's sign.
    Parameter w(f64({1, -2}), "w");
    Adam opt({w}, {.lr = 0.1});
    quadratic_step(opt, {w});
    CHECK_THAT(w.value().to_vector(), ApproxVector({0.9, -1.9}, 1e-8));
}

TEST_CASE("parameters without a gradient are skipped, with their own step count", "[training][optim]") {
    Parameter a(f64({1, -2}), "a");
    Parameter b(f64({3}), "b");
    Adam opt({a, b}, {.lr = 0.1});
    quadratic_step(opt, {a});
    quadratic_step(opt, {a});
    CHECK(b.value().to_vector() == std::vector<double>{3});
    // b's first update is its step 1: m̂ = g, v̂ = g², so it moves by lr (up to eps).
    quadratic_step(opt, {a, b});
    CHECK_THAT(b.value().to_vector(), ApproxVector({2.9}, 1e-8));

    const std::vector<double> a_before = a.value().to_vector();
    SGD sgd({a, b}, {.lr = 0.1, .momentum = 0.9});
    sgd.zero_grad();
    sgd.step();  // no gradients at all: nothing changes
    CHECK(a.value().to_vector() == a_before);
}

namespace {

// The optimizer's lr before a schedule's first step and after each of `steps` steps.
std::vector<double> lrs_over(LRScheduler& schedule, const Optimizer& opt, int steps) {
    std::vector<double> seen = {opt.lr()};
    for (int step = 0; step < steps; ++step) {
        schedule.step();
        seen.push_back(opt.lr());
    }
    return seen;
}

}  // namespace

TEST_CASE("learning-rate schedules", "[training][optim]") {
    Parameter w(f64({1}), "w");
    SGD opt({w}, {.lr = 1.0});
    SECTION("StepLR") {
        StepLR schedule(opt, 2, 0.5);
        CHECK_THAT(lrs_over(schedule, opt, 5), ApproxVector({1, 1, 0.5, 0.5, 0.25, 0.25}));
        CHECK(schedule.epoch() == 5);
        CHECK_THROWS_AS(StepLR(opt, 0), ValueError);
    }
    SECTION("CosineAnnealingLR") {
        CosineAnnealingLR schedule(opt, 4, 0.1);
        const double h = 0.45 * std::numbers::sqrt2 / 2;  // 0.9/2 · cos(π/4)
        CHECK_THAT(lrs_over(schedule, opt, 4), ApproxVector({1.0, 0.55 + h, 0.55, 0.55 - h, 0.1}));
        CHECK(schedule.lr_at(8) == Approx(1.0));  // a full period
    }
}

TEST_CASE("a Linear-ReLU-Linear model learns a small regression", "[training][optim]") {
    // y = x0·x1 + 0.5·x2 on 64 random points in [-1, 1]³.
    Generator gen(11);
    const Tensor x = Tensor::uniform({64, 3}, -1, 1, gen);
    std::vector<double> targets;
    for (std::int64_t i = 0; i < 64; ++i) targets.push_back(x.at({i, 0}) * x.at({i, 1}) + 0.5 * x.at({i, 2}));
    const Tensor y = Tensor::from_vector(targets, {64, 1});

    for (const bool use_adam : {true, false}) {
        INFO((use_adam ? "Adam" : "SGD momentum"));
        Sequential model;
        model.add(Linear(3, 32, true, gen)).add([](const Var& h) { return relu(h); }).add(Linear(32, 1, true, gen));
        std::unique_ptr<Optimizer> opt;
        if (use_adam) opt = std::make_unique<Adam>(model.parameters(), AdamOptions{.lr = 0.01});
        else opt = std::make_unique<SGD>(model.parameters(), SgdOptions{.lr = 0.05, .momentum = 0.9});
        double first = 0, last = 0;
        for (int step = 0; step < 300; ++step) {
            ComputeGraph graph;
            Var loss = mse_loss(model(graph.input(x)), graph.input(y));
            if (step == 0) first = loss.item();
            last = loss.item();
            opt->zero_grad();
            graph.backward(loss);
            opt->step();
        }
        CHECK(last < 0.05 * first);
    }
}

// ---- safetensors ----

TEST_CASE("safetensors round trip", "[training][safetensors]") {
    TempDir dir;
    const auto path = dir / "round.safetensors";
    Generator gen(21);
    TensorMap tensors = {
        {"scalar", Tensor::full({}, 2.5, DType::f64)},
        {"vector.f32", Tensor::normal({7}, 0, 1, gen)},
        {"matrix", Tensor::normal({3, 5}, 0, 1, gen, DType::f64)},
        {"labels", Tensor::from_vector(std::vector<std::int64_t>{-3, 0, 1LL << 40, 9}, {2, 2})},
        {"rank4", Tensor::normal({2, 1, 3, 2}, 0, 1, gen)},
        {"empty", Tensor::zeros({0, 4})},
        {"quote\"back\\slash\ttab é", Tensor::ones({1})},
    };
    const SafetensorsMetadata metadata = {{"format", "pt"}, {"note", "line\nbreak"}};
    save_safetensors(path, tensors, metadata);

    SafetensorsMetadata loaded_metadata;
    const TensorMap loaded = load_safetensors(path, &loaded_metadata);
    CHECK(loaded_metadata == metadata);
    REQUIRE(loaded.size() == tensors.size());
    for (const auto& [name, tensor] : tensors) {
        INFO(name);
        REQUIRE(loaded.count(name) == 1);
        const Tensor& back = loaded.at(name);
        CHECK(back.shape() == tensor.shape());
        CHECK(back.dtype() == tensor.dtype());
        CHECK(std::memcmp(back.raw_data(), tensor.raw_data(), tensor.nbytes()) == 0);
    }

    // The layout: length, a space-padded JSON header in 8-byte units, names in sorted order, and
    // every tensor aligned to its element size.
    const std::string bytes = read_file(path);
    std::uint64_t length = 0;
    std::memcpy(&length, bytes.data(), 8);
    CHECK(length % 8 == 0);
    const std::string header = bytes.substr(8, length);
    CHECK(header.front() == '{');
    CHECK(header.find("\"__metadata__\":{\"format\":\"pt\",\"note\":\"line\\u000abreak\"}") != std::string::npos);
    CHECK(header.find("\"empty\"") < header.find("\"labels\""));
    CHECK(header.find("\"labels\"") < header.find("\"matrix\""));
    CHECK(header.find("\"labels\":{\"dtype\":\"I64\",\"shape\":[2,2],\"data_offsets\":[0,32]}") != std::string::npos);
    CHECK(header.find("\"scalar\":{\"dtype\":\"F64\",\"shape\":[],") != std::string::npos);
    CHECK(bytes.size() == 8 + length + 32 + 15 * 8 + 8 + 7 * 4 + 12 * 4 + 4);

    SECTION("saving replaces the file atomically and leaves no temporary behind") {
        save_safetensors(path, {{"only", Tensor::ones({2})}});
        CHECK(load_safetensors(path).size() == 1);
        CHECK_FALSE(std::filesystem::exists(dir / "round.safetensors.tmp"));
    }
    SECTION("bad arguments") {
        CHECK_THROWS_AS(save_safetensors(path, {{"__metadata__", Tensor::ones({1})}}), ValueError);
        CHECK_THROWS_AS(save_safetensors(path, {{"undefined", Tensor()}}), ValueError);
        CHECK_THROWS_AS(save_safetensors(dir / "no_such_dir" / "x.safetensors", tensors), IoError);
    }
}

TEST_CASE("malformed safetensors files throw IoError and change nothing", "[training][safetensors]") {
    TempDir dir;
    const auto path = dir / "bad.safetensors";
    const std::string data = bytes_of({1, 2, 3, 4});  // 16 bytes
    const std::string entry = R"("t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
    struct Case {
        const char* name;
        std::string header;
        std::string data;
        const char* message;
    };
    const std::vector<Case> cases = {
        {"not JSON", "hello", data, "expected '{'"},
        {"unterminated object", "{" + entry, data, "expected '}'"},
        {"trailing comma", "{" + entry + ",}", data, "expected '\"'"},
        {"trailing bytes", "{" + entry + "}x", data, "unexpected bytes"},
        {"unknown dtype", R"({"t":{"dtype":"F8_E5M2","shape":[2,2],"data_offsets":[0,16]}})", data, "'F8_E5M2'"},
        {"dtype not a string", R"({"t":{"dtype":32,"shape":[2,2],"data_offsets":[0,16]}})", data, "expected '\"'"},
        {"negative dim", R"({"t":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", data, "non-negative"},
        {"fraction", R"({"t":{"dtype":"F32","shape":[2.0,2],"data_offsets":[0,16]}})", data, "fraction"},
        {"leading zero", R"({"t":{"dtype":"F32","shape":[02,2],"data_offsets":[0,16]}})", data, "leading zero"},
        {"huge dim", R"({"t":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,16]}})", data,
         "out of range"},
        {"missing key", R"({"t":{"dtype":"F32","shape":[2,2]}})", data, "lacks data_offsets"},
        {"unknown key", R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16],"x":1}})", data, "unknown key"},
        {"repeated key", R"({"t":{"dtype":"F32","dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", data,
         "appears twice"},
        {"duplicate name", "{" + entry + "," + entry + "}", data, "'t' appears twice"},
        {"bad escape", R"({"\q":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", data, "invalid escape"},
        {"three offsets", R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8,16]}})", data, "2 integers"},
        {"size mismatch", R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", data, "needs 16"},
        {"reversed offsets", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", data, "reversed"},
        {"past the data", R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}})", data, "run past"},
        {"gap at the end", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data, "belong to no tensor"},
        {"gap at the start", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data,
         "belong to no tensor"},
        {"overlap", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
         data, "overlap"},
        {"truncated data", "{" + entry + "}", data.substr(0, 10), "run past"},
        {"metadata not strings", R"({"__metadata__":{"a":1}})", "", "expected '\"'"},
        {"invalid UTF-8", "{\"\xff\":{}}", "", "UTF-8"},
    };
    TensorMap destination = {{"keep", Tensor::ones({2})}};
    for (const Case& c : cases) {
        INFO(c.name);
        write_raw(path, c.header, c.data);
        CHECK_THROWS_MATCHES(destination = load_safetensors(path), IoError, MessageHas({"bad.safetensors", c.message}));
    }
    SECTION("lengths and sizes") {
        std::ofstream(path, std::ios::binary) << "abc";
        CHECK_THROWS_MATCHES(load_safetensors(path), IoError, MessageHas({"3 bytes", "8-byte"}));
        write_raw(path, "{}", "", 1000);
        CHECK_THROWS_MATCHES(load_safetensors(path), IoError, MessageHas({"header length 1000", "past the end"}));
        const std::string padding(16, ' ');
        write_raw(path, padding, "", 16);
        CHECK_THROWS_MATCHES(load_safetensors(path), IoError, MessageHas({"found the end"}));
        CHECK_THROWS_MATCHES(load_safetensors(dir / "missing.safetensors"), IoError, MessageHas({"missing.safetensors"}));
    }
    CHECK(destination.size() == 1);
    CHECK(destination.at("keep").to_vector() == std::vector<double>{1, 1});

    // A well-formed file by the same helper loads, padding and an empty metadata object included.
    write_raw(path, R"({"__metadata__":{},"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}   )", data);
    CHECK(load_safetensors(path).at("t").to_vector() == std::vector<double>{1, 2, 3, 4});
}

TEST_CASE("saving and loading a model's parameters", "[training][safetensors]") {
    TempDir dir;
    const auto path = dir / "model.safetensors";
    Generator gen(31);
    Mlp saved(gen);
    Module with_bn;
    BatchNorm bn(5);
    with_bn.register_module("mlp", saved);
    with_bn.register_module("bn", bn);
    bn.running_mean->fill(0.25);
    save_parameters(with_bn, path);
    CHECK(load_safetensors(path).count("bn.running_mean") == 1);

    Mlp restored(gen);
    Module restored_with_bn;
    BatchNorm restored_bn(5);
    restored_with_bn.register_module("mlp", restored);
    restored_with_bn.register_module("bn", restored_bn);
    CHECK(restored.fc1.weight.value().to_vector() != saved.fc1.weight.value().to_vector());
    load_parameters(restored_with_bn, path);
    CHECK(restored.fc1.weight.value().to_vector() == saved.fc1.weight.value().to_vector());
    CHECK(restored.fc2.weight.value().to_vector() == saved.fc2.weight.value().to_vector());
    CHECK(restored_bn.running_mean->to_vector() == std::vector<double>(5, 0.25));

    SECTION("a list of parameters, converted to the destination's dtype") {
        save_parameters(saved.parameters(), path);
        Mlp other(gen);
        Module wrapper;
        wrapper.register_module("mlp", other);
        other.to(DType::f64);
        load_parameters(wrapper.parameters(), path);
        CHECK(other.fc1.weight.value().dtype() == DType::f64);
        CHECK_THAT(other.fc1.weight.value().to_vector(), ApproxVector(saved.fc1.weight.value().to_vector()));
        CHECK_THROWS_MATCHES(save_parameters({Parameter(Tensor::ones({1}))}, path), ValueError, MessageHas({"no name"}));
    }
    SECTION("mismatches change nothing") {
        Mlp fresh(gen);
        const std::vector<double> before = fresh.fc2.weight.value().to_vector();
        const std::vector<double> first_before = fresh.fc1.weight.value().to_vector();
        // Names: the file lacks the wrapper's prefix.
        save_parameters(saved, path);
        Module wrapped;
        wrapped.register_module("net", fresh);
        CHECK_THROWS_MATCHES(load_parameters(wrapped, path), IoError, MessageHas({"no tensor 'net.fc1.weight'"}));
        // Shapes: fc1 matches and comes first, fc2 does not; fc1 must stay untouched too.
        TensorMap file = load_safetensors(path);
        file["net.fc1.weight"] = file["fc1.weight"];
        file["net.fc1.bias"] = file["fc1.bias"];
        file["net.fc2.weight"] = Tensor::zeros({3, 5});
        file.erase("fc1.weight");
        file.erase("fc1.bias");
        file.erase("fc2.weight");
        save_safetensors(path, file);
        CHECK_THROWS_MATCHES(load_parameters(wrapped, path), ShapeError,
                             MessageHas({"'net.fc2.weight'", "(3,5)", "(2,5)"}));
        file["net.fc2.weight"] = Tensor::zeros({2, 5});
        file["extra"] = Tensor::zeros({1});
        save_safetensors(path, file);
        CHECK_THROWS_MATCHES(load_parameters(wrapped, path), IoError, MessageHas({"'extra'"}));
        write_raw(path, "{", "");
        CHECK_THROWS_AS(load_parameters(wrapped, path), IoError);
        CHECK(fresh.fc1.weight.value().to_vector() == first_before);
        CHECK(fresh.fc2.weight.value().to_vector() == before);
    }
}
