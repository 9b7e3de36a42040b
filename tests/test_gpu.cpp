// GPU tests: every op-table case and large cases of the same ops against the float64 CPU replay
// (graph/verify.h), verify() on a small MLP, the device's failure modes (out of memory, memory
// accounting, mixed devices, errors reported by kernels) and captured steps (cuda::CapturedStep).
//
// Without a CUDA device (or in a CPU-only build) the executable prints why and exits 77, which CTest
// counts as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <utility>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

constexpr double kTolerance = 1e-5;
constexpr std::uint64_t kSeedBase = 7'000'000;
const Device kGpu = Device::cuda(0);

std::string describe_result(const CheckResult& r) {
    return str(r.check, " of ", r.op, " '", r.case_label, "' shapes ", r.shapes, ": max rel err ", r.max_rel_err,
               " (tolerance ", r.tolerance, "), max abs err ", r.max_abs_err, ", gpu ", r.gpu_ms, " ms, cpu ",
               r.cpu_ms, " ms, ", r.detail);
}

OpAttrs axes_attr(std::vector<std::int64_t> axes) {
    OpAttrs attrs;
    attrs.axes = std::move(axes);
    return attrs;
}
OpAttrs axis_attr(std::int64_t axis) {
    OpAttrs attrs;
    attrs.axis = axis;
    return attrs;
}
OpAttrs loss_attr(Reduction reduction, double label_smoothing = 0.0, double beta = 0.0) {
    OpAttrs attrs;
    attrs.reduction = reduction;
    attrs.label_smoothing = label_smoothing;
    attrs.scalar = beta;
    return attrs;
}

struct LargeCase {
    const char* op;
    OpCase op_case;
};

// Under compute-sanitizer (scripts/gpu-sanitize.sh sets DYNGRAD_UNDER_SANITIZER) the large cases shrink
// sixteenfold and the deliberate out-of-memory test is left out: the tools make them take minutes.
bool under_sanitizer() { return std::getenv("DYNGRAD_UNDER_SANITIZER") != nullptr; }

// Sizes that cover many blocks, grid-stride loops, ragged tails and big reductions.
std::vector<LargeCase> large_cases() {
    const std::int64_t scale = under_sanitizer() ? 4 : 1;  // per dimension; sizes stay odd where they were
    const std::int64_t k16M = (std::int64_t{1} << 24) / (scale * scale);
    const std::int64_t kOdd = 1'000'003 / (scale * scale) | 1;
    const std::int64_t k2048 = 2048 / scale, k4096 = 4096 / scale, k4099 = 4099 / scale | 1;
    using D = InputDomain;
    return {
        {"add", {"16M", {{k16M}, {k16M}}, {}, {}}},
        {"add", {"1,000,003", {{kOdd}, {kOdd}}, {}, {}}},
        {"add", {"row broadcast (4096,4099)", {{k4096, k4099}, {k4099}}, {}, {}}},
        {"mul", {"16M", {{k16M}, {k16M}}, {}, {}}},
        {"mul", {"1,000,003", {{kOdd}, {kOdd}}, {}, {}}},
        {"relu", {"16M", {{k16M}}, {}, {D::AwayFromZero}}},
        {"relu", {"1,000,003", {{kOdd}}, {}, {D::AwayFromZero}}},
        {"sigmoid", {"16M", {{k16M}}, {}, {}}},
        {"sigmoid", {"1,000,003", {{kOdd}}, {}, {}}},
        {"matmul", {"2048x2048x2048", {{k2048, k2048}, {k2048, k2048}}, {}, {}}},
        {"matmul", {"batched 16x(257,384)x(384,200)", {{16, 257, 384}, {16, 384, 200}}, {}, {}}},
        {"sum", {"(4096,4096) axis 0", {{k4096, k4096}}, axes_attr({0}), {}}},
        {"sum", {"(4096,4096) axis 1", {{k4096, k4096}}, axes_attr({1}), {}}},
        {"sum", {"(4096,4096) all", {{k4096, k4096}}, axes_attr({}), {}}},
        {"mean", {"(1000,4097) axis 1", {{1000, 4097}}, axes_attr({1}), {}}},
        {"mean", {"(64,3,224,224) axes 0,2,3", {{64 / scale, 3, 224 / scale, 224 / scale}}, axes_attr({0, 2, 3}), {}}},
        {"max", {"(4096,1000) axis 1", {{k4096, 1000}}, axis_attr(1), {}}},
        {"softmax", {"(4096,1000)", {{k4096, 1000}}, axis_attr(-1), {}}},
        {"log_softmax", {"(4096,1000)", {{k4096, 1000}}, axis_attr(-1), {}}},
        {"cross_entropy", {"(4096,1000)", {{k4096, 1000}, {k4096}}, {}, {D::Any, D::Labels}}},
        {"cross_entropy", {"(4096,1000) smoothing, weights, ignored", {{k4096, 1000}, {k4096}, {1000}},
                           loss_attr(Reduction::Mean, 0.1), {D::Any, D::LabelsIgnored, D::Constant}}},
        {"cross_entropy", {"(1000,4097) none", {{1000, k4099}, {1000}}, loss_attr(Reduction::None),
                           {D::Any, D::LabelsIgnored}}},
        {"nll_loss", {"(4096,1000) weights, ignored", {{k4096, 1000}, {k4096}, {1000}}, loss_attr(Reduction::Mean),
                      {D::Any, D::LabelsIgnored, D::Constant}}},
        {"binary_cross_entropy_with_logits", {"(4096,4099) pos_weight", {{k4096, k4099}, {k4096, k4099}, {}, {k4099}},
                                              loss_attr(Reduction::Mean), {D::Any, D::Positive, D::Constant, D::Constant}}},
        {"l1_loss", {"1,000,003 none", {{kOdd}, {kOdd}}, loss_attr(Reduction::None), {}}},
        {"smooth_l1_loss", {"16M sum", {{k16M}, {k16M}}, loss_attr(Reduction::Sum, 0.0, 1.0), {}}},
        {"transpose", {"(1025,2049)", {{1025, 2049}}, axes_attr({0, 1}), {}}},
    };
}

// Fills `values` with labels in [0, classes).
Tensor random_labels(std::int64_t n, std::int64_t classes, Generator& gen, Device device) {
    std::uniform_int_distribution<std::int64_t> dist(0, classes - 1);
    std::vector<std::int64_t> values(static_cast<std::size_t>(n));
    for (auto& v : values) v = dist(gen.engine());
    return Tensor::from_vector(values, {n}, device);
}

}  // namespace

TEST_CASE("every op-table case matches the CPU on the GPU", "[gpu][table]") {
    for (const OpDef& def : op_table()) {
        for (const OpCase& op_case : def.cases()) {
            DYNAMIC_SECTION(def.name << ": " << op_case.label) {
                const std::uint64_t seed = seed_for_name(kSeedBase, def.name);
                Generator gen(seed);
                const CheckResult r = gpu_vs_cpu_check(def, op_case, gen, kTolerance);
                INFO("seed " << seed << ": " << describe_result(r));
                CHECK(r.pass);
            }
        }
    }
}

TEST_CASE("large cases match the CPU on the GPU", "[gpu][large]") {
    CHECK_FALSE(cuda::allow_tf32());  // float32 GEMMs at full precision by default
    const std::vector<LargeCase> cases = large_cases();
    for (std::size_t index = 0; index < cases.size(); ++index) {
        const LargeCase& large = cases[index];
        DYNAMIC_SECTION(large.op << ": " << large.op_case.label) {
            const OpDef* def = find_op(large.op);
            REQUIRE(def != nullptr);
            const std::uint64_t seed = kSeedBase + 1000 + index;
            Generator gen(seed);
            const CheckResult r = gpu_vs_cpu_check(*def, large.op_case, gen, kTolerance);
            INFO("seed " << seed << ": " << describe_result(r));
            CHECK(r.pass);
        }
    }
}

TEST_CASE("verify() replays a small MLP built on the GPU", "[gpu][verify]") {
    Generator gen(kSeedBase + 2000);
    Parameter w1(Tensor::normal({32, 20}, 0.0, 0.3, gen, DType::f32, kGpu), "w1");
    Parameter b1(Tensor::normal({32}, 0.0, 0.1, gen, DType::f32, kGpu), "b1");
    Parameter w2(Tensor::normal({10, 32}, 0.0, 0.3, gen, DType::f32, kGpu), "w2");
    Parameter b2(Tensor::normal({10}, 0.0, 0.1, gen, DType::f32, kGpu), "b2");

    ComputeGraph graph;
    Var x = graph.input(Tensor::normal({64, 20}, 0.0, 1.0, gen, DType::f32, kGpu), "x");
    Var y = graph.input(random_labels(64, 10, gen, kGpu), "labels");
    Var h = relu(linear(x, graph.parameter(w1), graph.parameter(b1)));
    h.name("h");
    Var logits = linear(h, graph.parameter(w2), graph.parameter(b2));
    Var loss = cross_entropy(logits, y);
    CHECK(loss.device() == kGpu);

    SECTION("after a backward with retain_grads") {
        graph.backward(loss, BackwardOptions{.retain_grads = true});
        const VerifyReport report = verify(graph, loss);
        INFO(report.summary() << "\n" << report.table());
        CHECK(report.pass);
        CHECK(report.first_divergence == -1);
        CHECK(report.tolerance == kTolerance);
        CHECK(report.nodes.size() == 10);
        for (const NodeCheck& node : report.nodes) {
            INFO(node.name);
            CHECK(node.pass);
        }
        CHECK(w1.grad().device() == kGpu);
        CHECK(w1.grad().shape() == Shape{32, 20});
    }
    SECTION("verify runs the backward itself") {
        const VerifyReport report = verify(graph, loss);
        INFO(report.summary());
        CHECK(report.pass);
        CHECK(h.grad().shape() == Shape{64, 32});
    }
}

namespace {

// linear(x, w, b, activation) forward, then backward of `dy`; inputs on one device. db is undefined
// without a bias.
struct LinearRun {
    Tensor y, dx, dw, db;
};
LinearRun run_linear(const std::vector<Tensor>& inputs, const Tensor& dy, bool with_bias, Activation activation) {
    ComputeGraph graph;
    const Var x = graph.input(inputs[0], "x", true);
    const Var w = graph.input(inputs[1], "w", true);
    const Var b = with_bias ? graph.input(inputs[2], "b", true) : Var();
    const Var y = linear(x, w, b, activation);
    graph.backward(y, dy);
    return {y.value(), x.grad(), w.grad(), with_bias ? b.grad() : Tensor()};
}

// normal(0, 1) rounded to multiples of 1/256 in (-8, 8): 11 significant bits, which TF32 holds exactly, so a
// TF32 GEMM's products are exact and no pre-activation crosses the ReLU's kink by TF32 rounding alone.
Tensor tf32_exact_normal(const Shape& shape, Generator& gen) {
    std::vector<double> values = Tensor::normal(shape, 0.0, 1.0, gen, DType::f64).to_vector();
    for (double& v : values) v = std::clamp(std::round(v * 256.0), -2047.0, 2047.0) / 256.0;
    return Tensor::from_vector(values, shape, DType::f64);
}

// cuda::set_allow_tf32 for one scope.
struct Tf32Scope {
    explicit Tf32Scope(bool allow) { cuda::set_allow_tf32(allow); }
    ~Tf32Scope() { cuda::set_allow_tf32(false); }
    Tf32Scope(const Tf32Scope&) = delete;
    Tf32Scope& operator=(const Tf32Scope&) = delete;
};

}  // namespace

// float32 linear runs through cuBLASLt (bias or bias + ReLU epilogue forward, weight and bias gradients in
// one GEMM backward), float64 through cuBLAS and small kernels. Shapes off the multiples of 8 and 16 that
// GEMM kernels tile by, and empty ones; against the float64 CPU on the same inputs.
TEST_CASE("linear matches the CPU on odd shapes: bias, fused ReLU, float32, TF32, float64", "[gpu][linear]") {
    struct Dims {
        std::int64_t rows, in, out;
    };
    const Dims all_dims[] = {{7, 13, 5}, {1, 1, 1}, {33, 17, 65}, {257, 129, 67}, {0, 7, 3}, {4, 0, 3}};
    struct Mode {
        const char* name;
        DType dtype;
        bool tf32;
        double tolerance;
    };
    const Mode modes[] = {{"float32", DType::f32, false, 1e-5}, {"TF32", DType::f32, true, 1e-4},
                          {"float64", DType::f64, false, 1e-12}};
    std::uint64_t seed = kSeedBase + 3000;
    for (const Dims& d : all_dims)
        for (const Mode& mode : modes)
            for (const bool with_bias : {true, false})
                for (const Activation activation : {Activation::None, Activation::Relu}) {
                    ++seed;
                    DYNAMIC_SECTION(d.rows << "x" << d.in << " @ " << d.in << "x" << d.out << " " << mode.name
                                           << (with_bias ? " bias" : " no bias")
                                           << (activation == Activation::Relu ? " relu" : "")) {
                        Generator gen(seed);
                        const std::vector<Tensor> reference_inputs = {tf32_exact_normal({d.rows, d.in}, gen),
                                                                      tf32_exact_normal({d.out, d.in}, gen),
                                                                      tf32_exact_normal({d.out}, gen)};
                        const Tensor reference_dy = tf32_exact_normal({d.rows, d.out}, gen);
                        const LinearRun reference = run_linear(reference_inputs, reference_dy, with_bias, activation);
                        std::vector<Tensor> inputs;
                        for (const Tensor& t : reference_inputs) inputs.push_back(t.to(mode.dtype).to(kGpu));
                        LinearRun gpu;
                        {
                            const Tf32Scope tf32(mode.tf32);
                            gpu = run_linear(inputs, reference_dy.to(mode.dtype).to(kGpu), with_bias, activation);
                        }
                        CHECK(gpu.y.device() == kGpu);
                        CHECK(gpu.y.dtype() == mode.dtype);
                        CHECK(relative_norm_error(gpu.y, reference.y) <= mode.tolerance);
                        CHECK(relative_norm_error(gpu.dx, reference.dx) <= mode.tolerance);
                        CHECK(relative_norm_error(gpu.dw, reference.dw) <= mode.tolerance);
                        if (with_bias) CHECK(relative_norm_error(gpu.db, reference.db) <= mode.tolerance);
                    }
                }
}

TEST_CASE("linear with TF32 on unrounded inputs stays within TF32 accuracy", "[gpu][linear]") {
    OpAttrs attrs;  // no activation: TF32 rounding may flip a ReLU's mask where the pre-activation is tiny
    const OpCase op_case{"TF32 257x129 @ 129x67", {{257, 129}, {67, 129}, {67}}, attrs, {}};
    Generator gen(kSeedBase + 3500);
    const Tf32Scope tf32(true);
    const CheckResult r = gpu_vs_cpu_check(*find_op("linear"), op_case, gen, 5e-3);
    INFO(describe_result(r));
    CHECK(r.pass);
}

TEST_CASE("out of memory is an exception and the device stays usable", "[gpu][memory]") {
    if (under_sanitizer()) {
        WARN("left out under compute-sanitizer: its allocation tracking makes a failed 1 TiB allocation take minutes");
        return;
    }
    CHECK_THROWS_AS(Tensor::empty({1LL << 40}, DType::f32, kGpu), OutOfMemory);
    CHECK_THROWS_AS(Tensor::zeros({1LL << 38, 4}, DType::f64, kGpu), OutOfMemory);

    ComputeGraph graph;
    Var a = graph.input(Tensor::of({1, 2, 3}).to(kGpu), "a", true);
    Var b = graph.input(Tensor::of({4, 5, 6}).to(kGpu), "b");
    Var loss = sum(relu(a * b));
    CHECK(loss.item() == 32);
    graph.backward(loss);
    CHECK(a.grad().to_vector() == std::vector<double>{4, 5, 6});
}

TEST_CASE("memory in use returns to its earlier value", "[gpu][memory]") {
    auto workload = [] {
        Generator gen(kSeedBase + 3000);
        ComputeGraph graph;
        Var x = graph.input(Tensor::normal({256, 512}, 0.0, 1.0, gen, DType::f32, kGpu), "x", true);
        Var w = graph.input(Tensor::normal({128, 512}, 0.0, 1.0, gen, DType::f32, kGpu), "w", true);
        Var y = graph.input(random_labels(256, 128, gen, kGpu), "labels");
        Var loss = cross_entropy(softmax(tanh(linear(x, w)), -1), y) + sum(x * x);
        graph.backward(loss);
        return loss.item();
    };
    workload();  // first use creates handles and plans
    cuda::synchronize(0);
    const std::size_t before = cuda::memory_stats(0).bytes_in_use;
    {
        const Tensor big = Tensor::zeros({1 << 22}, DType::f32, kGpu);
        CHECK(cuda::memory_stats(0).bytes_in_use >= before + big.nbytes());
        CHECK(cuda::memory_stats(0).peak_bytes_in_use >= before + big.nbytes());
        CHECK(std::isfinite(workload()));
    }
    cuda::synchronize(0);
    CHECK(cuda::memory_stats(0).bytes_in_use == before);
    cuda::reset_peak_memory(0);
    CHECK(cuda::memory_stats(0).peak_bytes_in_use == cuda::memory_stats(0).bytes_in_use);
}

TEST_CASE("inputs on different devices are a DeviceError", "[gpu][device]") {
    ComputeGraph graph;
    Var on_cpu = graph.input(Tensor::of({1, 2}), "on_cpu");
    Var on_gpu = graph.input(Tensor::of({3, 4}).to(kGpu), "on_gpu");
    CHECK_THROWS_MATCHES(add(on_cpu, on_gpu), DeviceError, MessageHas({"add", "cpu", "cuda:0"}));
    CHECK_THROWS_MATCHES(mul(on_gpu, on_cpu), DeviceError, MessageHas({"mul", "cpu", "cuda:0"}));
    CHECK(add(on_gpu, on_gpu).value().to_vector() == std::vector<double>{6, 8});
}

TEST_CASE("a label out of range on the GPU raises IndexError at the next sync", "[gpu][device]") {
    ComputeGraph graph;
    Var logits = graph.input(Tensor::zeros({4, 5}, DType::f32, kGpu), "logits", true);
    Var bad = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 9, 2}, {4}, kGpu), "labels");
    // The kernel records the error; the host sees it when it waits for the stream (reading the loss).
    CHECK_THROWS_MATCHES(cross_entropy(logits, bad).item(), IndexError, MessageHas({"9"}));

    // The error record was cleared: the next ops run normally.
    Var good = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 4, 2}, {4}, kGpu), "labels");
    Var loss = cross_entropy(logits, good);
    CHECK(loss.item() == dgtest::Approx(std::log(5.0)).epsilon(1e-6));
    CHECK_NOTHROW(cuda::synchronize(0));
}

namespace {

// One training-style step of a small CNN (conv, batch_norm, relu, pools, linear, cross_entropy);
// returns every parameter gradient, copied to the CPU.
std::vector<std::vector<double>> cnn_gradients(std::uint64_t seed) {
    Generator gen(seed);
    auto on_gpu = [&](const Shape& shape) { return Tensor::normal(shape, 0.0, 0.5, gen).to(kGpu); };
    const Parameter conv_w(on_gpu({8, 3, 3, 3}), "conv.w"), conv_b(on_gpu({8}), "conv.b");
    const Parameter gamma(on_gpu({8}), "bn.gamma"), beta(on_gpu({8}), "bn.beta");
    const Parameter fc_w(on_gpu({10, 8 * 4 * 4}), "fc.w"), fc_b(on_gpu({10}), "fc.b");
    Tensor running_mean = Tensor::zeros({8}, DType::f32, kGpu), running_var = Tensor::ones({8}, DType::f32, kGpu);
    const Tensor images = on_gpu({32, 3, 16, 16});
    const Tensor labels = random_labels(32, 10, gen, kGpu);
    ComputeGraph graph;
    Var h = conv2d(graph.input(images), graph.parameter(conv_w), graph.parameter(conv_b), {.padding = {1, 1}});
    h = relu(batch_norm(h, graph.parameter(gamma), graph.parameter(beta), running_mean, running_var, true));
    h = avg_pool2d(max_pool2d(h, {2, 2}), {2, 2});
    Var loss = cross_entropy(linear(flatten(h), graph.parameter(fc_w), graph.parameter(fc_b)), graph.input(labels));
    graph.backward(loss);
    std::vector<std::vector<double>> grads;
    for (const Parameter* p : {&conv_w, &conv_b, &gamma, &beta, &fc_w, &fc_b}) grads.push_back(p->grad().to_vector());
    return grads;
}

}  // namespace

TEST_CASE("deterministic mode gives bitwise-identical gradients over two runs", "[gpu][deterministic]") {
    const bool previous = cuda::deterministic();
    cuda::set_deterministic(true);
    const auto first = cnn_gradients(77);
    const auto second = cnn_gradients(77);
    cuda::set_deterministic(previous);
    REQUIRE(first.size() == second.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
        INFO("parameter " << i);
        CHECK(first[i] == second[i]);  // exact equality: bit for bit
    }
}

namespace {

// A small model trained with SGD (momentum) on the GPU. Built twice from one seed, it is stepped eagerly
// once and through a cuda::CapturedStep once, and the two must agree.
std::vector<Parameter> model_parameters(bool cnn, std::uint64_t seed) {
    Generator gen(seed);
    auto t = [&](const Shape& shape) { return Tensor::normal(shape, 0.0, 0.3, gen).to(kGpu); };
    if (cnn) return {Parameter(t({4, 3, 3, 3}), "conv.w"), Parameter(t({4}), "conv.b"),
                     Parameter(t({10, 4 * 4 * 4}), "fc.w"), Parameter(t({10}), "fc.b")};
    return {Parameter(t({32, 20}), "w1"), Parameter(t({32}), "b1"), Parameter(t({10, 32}), "w2"),
            Parameter(t({10}), "b2")};
}

struct Model {
    bool cnn;
    std::vector<Parameter> params;
    SGD optimizer;

    Model(bool cnn, std::uint64_t seed)
        : cnn(cnn), params(model_parameters(cnn, seed)), optimizer(params, {.lr = 0.05, .momentum = 0.9}) {}

    // x (N,20) or (N,3,8,8) -> logits (N,10)
    Var forward(ComputeGraph& graph, const Var& x) const {
        auto p = [&](std::size_t i) { return graph.parameter(params[i]); };
        if (!cnn) return linear(relu(linear(x, p(0), p(1))), p(2), p(3));
        Var h = max_pool2d(relu(conv2d(x, p(0), p(1), {.padding = {1, 1}})), {2, 2});
        return linear(flatten(h), p(2), p(3));
    }
    // The training step: forward, loss, backward, update; returns the loss.
    Tensor step(std::span<const Tensor> in) {
        ComputeGraph graph;
        Var loss = cross_entropy(forward(graph, graph.input(in[0])), graph.input(in[1]));
        graph.backward(loss);
        optimizer.step();
        optimizer.zero_grad();
        return loss.value();
    }
};

std::vector<Tensor> model_batch(bool cnn, std::int64_t rows, std::uint64_t seed) {
    Generator gen(seed);
    const Shape x_shape = cnn ? Shape{rows, 3, 8, 8} : Shape{rows, 20};
    return {Tensor::normal(x_shape, 0.0, 1.0, gen).to(kGpu), random_labels(rows, 10, gen, kGpu)};
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    REQUIRE(x.size() == y.size());
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    return worst;
}

}  // namespace

namespace {

void check_captured_matches_eager(bool cnn) {
    Model eager(cnn, 11), captured(cnn, 11);
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return captured.step(in); });
    // Shape 64 warms up, is captured, then replays; shape 32 gets its own variant on the way.
    const std::int64_t rows[] = {64, 64, 64, 32, 32, 64, 32, 64, 32, 64};
    for (std::size_t i = 0; i < std::size(rows); ++i) {
        const std::vector<Tensor> batch = model_batch(cnn, rows[i], 500 + i);
        const double eager_loss = eager.step(batch).item();
        const Tensor loss = step.run({{batch[0], batch[1]}});
        INFO("step " << i << " rows " << rows[i]);
        CHECK(loss.numel() == 1);
        CHECK(loss.item() == dgtest::Approx(eager_loss).epsilon(1e-6));
    }
    CHECK(step.variants() == 2);
    for (std::size_t i = 0; i < eager.params.size(); ++i) {
        INFO(eager.params[i].name());
        CHECK(max_abs_difference(eager.params[i].value(), captured.params[i].value()) <= 1e-6);
    }
}

}  // namespace

TEST_CASE("a captured training step matches the eager step, per batch shape", "[gpu][capture]") {
    SECTION("MLP (linear, relu, cross_entropy, SGD)") { check_captured_matches_eager(false); }
    SECTION("CNN (cuDNN conv2d and max_pool2d)") { check_captured_matches_eager(true); }
}

TEST_CASE("a host synchronisation inside a captured step is a GraphError; the device stays usable",
          "[gpu][capture]") {
    Model model(false, 12);
    const std::vector<Tensor> batch = model_batch(false, 16, 600);
    const std::vector<double> before = model.params[0].value().to_vector();
    SECTION("item()") {
        cuda::CapturedStep step([&](std::span<const Tensor> in) {
            Tensor loss = model.step(in);
            static_cast<void>(loss.item());  // not inside CHECK: Catch would swallow the exception
            return loss;
        });
        CHECK_NOTHROW(step.run(batch));  // the eager warm-up may read values
        CHECK_THROWS_MATCHES(step.run(batch), GraphError, MessageHas({"item()", "captured", "cuda:0"}));
        CHECK(step.variants() == 0);
    }
    SECTION("cuda::synchronize()") {
        cuda::CapturedStep step([&](std::span<const Tensor> in) {
            Tensor loss = model.step(in);
            cuda::synchronize(0);
            return loss;
        });
        step.run(batch);
        CHECK_THROWS_MATCHES(step.run(batch), GraphError, MessageHas({"cuda::synchronize()", "captured"}));
    }
    SECTION("an Adam step") {
        Adam adam(model.params);
        cuda::CapturedStep step([&](std::span<const Tensor> in) {
            ComputeGraph graph;
            Var loss = cross_entropy(model.forward(graph, graph.input(in[0])), graph.input(in[1]));
            graph.backward(loss);
            adam.step();
            adam.zero_grad();
            return loss.value();
        });
        step.run(batch);
        CHECK_THROWS_MATCHES(step.run(batch), GraphError, MessageHas({"Adam::step()", "step count"}));
    }
    // The capture was ended: eager work runs and syncs as before, and the failed capture changed nothing.
    ComputeGraph graph;
    Var a = graph.input(Tensor::of({1, 2, 3}).to(kGpu), "a", true);
    Var loss = sum(a * a);
    CHECK(loss.item() == 14);
    graph.backward(loss);
    CHECK(a.grad().to_vector() == std::vector<double>{2, 4, 6});
    CHECK_NOTHROW(cuda::synchronize(0));
    CHECK(model.params[0].value().to_vector() != before);  // the warm-up step did update
}

TEST_CASE("replays of a captured step allocate nothing", "[gpu][capture]") {
    Model model(false, 13);
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return model.step(in); });
    const std::vector<Tensor> batch = model_batch(false, 64, 700);
    step.run(batch);
    step.run(batch);  // captured and launched
    cuda::synchronize(0);
    const cuda::MemoryStats after_two = cuda::memory_stats(0);
    CHECK(after_two.capture_reserved_bytes > 0);
    double last = 0;
    for (int i = 0; i < 100; ++i) last = step.run(batch).item();
    CHECK(std::isfinite(last));
    const cuda::MemoryStats after_102 = cuda::memory_stats(0);
    CHECK(after_102.bytes_in_use == after_two.bytes_in_use);
    CHECK(after_102.capture_reserved_bytes == after_two.capture_reserved_bytes);
    CHECK(after_102.pool_reserved_bytes == after_two.pool_reserved_bytes);
}

TEST_CASE("a tensor returned by a captured step outlives the CapturedStep", "[gpu][capture]") {
    cuda::synchronize(0);
    const cuda::MemoryStats before = cuda::memory_stats(0);
    Tensor loss;
    std::vector<double> value;
    {
        Model model(false, 14);
        cuda::CapturedStep step([&](std::span<const Tensor> in) { return model.step(in); });
        const std::vector<Tensor> batch = model_batch(false, 8, 800);
        step.run(batch);
        loss = step.run(batch);
        value = loss.to_vector();
        CHECK(cuda::memory_stats(0).capture_reserved_bytes > before.capture_reserved_bytes);
    }
    // The step, its graph and the model are gone; the loss's block of the private pool is still held.
    CHECK(cuda::memory_stats(0).capture_reserved_bytes > before.capture_reserved_bytes);
    CHECK(loss.to_vector() == value);
    {
        ComputeGraph graph;
        CHECK(mul_scalar(graph.input(loss), 2.0).item() == dgtest::Approx(2 * value[0]));
    }
    loss = Tensor();  // the last block returns: the pool goes back to the driver
    cuda::synchronize(0);
    CHECK(cuda::memory_stats(0).capture_reserved_bytes == before.capture_reserved_bytes);
    CHECK(cuda::memory_stats(0).bytes_in_use == before.bytes_in_use);
}

TEST_CASE("NVTX ranges around op dispatches can be switched on and off", "[gpu][nvtx]") {
    const bool previous = profiling_ranges();
    set_profiling_ranges(true);
    CHECK(profiling_ranges());
    Model model(false, 15);
    const double loss = model.step(model_batch(false, 16, 900)).item();  // every forward and backward in a range
    set_profiling_ranges(previous);
    CHECK(std::isfinite(loss));
}

namespace {

// conv2d(x, w, b, options) forward, then backward of `dy` unless dy is undefined, on the inputs' device.
// The gradients are undefined without a backward, db without a bias (inputs of size 2).
struct ConvRun {
    Tensor y, dx, dw, db;
};
ConvRun run_conv(const std::vector<Tensor>& inputs, const Tensor& dy, const Conv2dOptions& options) {
    ComputeGraph graph;
    const Var x = graph.input(inputs[0], "x", true);
    const Var w = graph.input(inputs[1], "w", true);
    const Var b = inputs.size() == 3 ? graph.input(inputs[2], "b", true) : Var();
    const Var y = conv2d(x, w, b, options);
    if (!dy.defined()) return {y.value(), Tensor(), Tensor(), Tensor()};
    graph.backward(y, dy);
    return {y.value(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

// dy where mask > 0, else 0 (float64, on the CPU).
Tensor masked(const Tensor& dy, const Tensor& mask) {
    std::vector<double> values = dy.to_vector();
    const std::vector<double> m = mask.to_vector();
    for (std::size_t i = 0; i < values.size(); ++i)
        if (!(m[i] > 0)) values[i] = 0;
    return Tensor::from_vector(values, dy.shape(), DType::f64);
}

}  // namespace

// conv2d with and without a fused ReLU: cuDNN plus our bias/activation kernels against the float64 CPU on
// the same inputs. The backward reference is the CPU's plain conv2d backward of dy masked with the GPU's
// own y > 0, so a pre-activation that float32 rounding moves across 0 cannot fail the check; y itself is
// compared with the CPU's fused forward. Shapes: odd sizes, stride 2, padding, groups, no bias, a bias
// gradient spread over many blocks per channel (lenet5's first layer, batch 64) and one with more channels
// than blocks wanted (one block per channel); the bias gradient must repeat bit for bit.
TEST_CASE("conv2d with a fused ReLU matches the CPU, bias gradient included", "[gpu][conv_relu]") {
    struct ConvCase {
        const char* label;
        Shape x, w;
        Conv2dOptions options;
        bool bias;
    };
    const ConvCase cases[] = {
        {"3x3 pad 1, odd sizes", {3, 5, 11, 9}, {7, 5, 3, 3}, {.padding = {1, 1}}, true},
        {"5x3 stride 2 pad 2,1", {2, 3, 13, 10}, {4, 3, 5, 3}, {.stride = {2, 2}, .padding = {2, 1}}, true},
        {"groups 3", {2, 6, 9, 7}, {9, 2, 3, 3}, {.padding = {1, 1}, .groups = 3}, true},
        {"no bias", {2, 3, 8, 8}, {5, 3, 3, 3}, {}, false},
        {"lenet5 conv1 batch 64", {64, 1, 28, 28}, {6, 1, 5, 5}, {}, true},
        {"1x1, 600 channels", {3, 16, 5, 7}, {600, 16, 1, 1}, {}, true},
    };
    struct Mode {
        const char* name;
        DType dtype;
        double tolerance;     // y, dx, db
        double dw_tolerance;  // dw sums up to 36,864 products per weight (lenet5's first layer at batch 64)
    };
    const Mode modes[] = {{"float32", DType::f32, 1e-4, 1e-4}, {"float64", DType::f64, 1e-10, 1e-10}};
    std::uint64_t seed = kSeedBase + 4000;
    for (const ConvCase& c : cases)
        for (const Mode& mode : modes)
            for (const Activation activation : {Activation::None, Activation::Relu}) {
                ++seed;
                DYNAMIC_SECTION(c.label << " " << mode.name << (activation == Activation::Relu ? " relu" : "")) {
                    Generator gen(seed);
                    Conv2dOptions options = c.options;
                    options.activation = activation;
                    // Inputs and dy in the mode's dtype, and the same values in float64 on the CPU.
                    std::vector<Tensor> inputs, reference_inputs;
                    std::vector<Shape> shapes = {c.x, c.w};
                    if (c.bias) shapes.push_back({c.w[0]});
                    for (const Shape& shape : shapes) {
                        const Tensor value = Tensor::normal(shape, 0.0, 1.0, gen, mode.dtype);
                        inputs.push_back(value.to(kGpu));
                        reference_inputs.push_back(value.to(DType::f64));
                    }
                    const Tensor probe = run_conv(reference_inputs, Tensor(), options).y;
                    const Tensor dy = Tensor::normal(probe.shape(), 0.0, 1.0, gen, mode.dtype);
                    const ConvRun gpu = run_conv(inputs, dy.to(kGpu), options);
                    CHECK(gpu.y.device() == kGpu);
                    CHECK(gpu.y.dtype() == mode.dtype);
                    CHECK(relative_norm_error(gpu.y, probe) <= mode.tolerance);
                    const Tensor dz =
                        activation == Activation::Relu ? masked(dy.to(DType::f64), gpu.y) : dy.to(DType::f64);
                    const ConvRun reference = run_conv(reference_inputs, dz, c.options);  // no activation
                    CHECK(relative_norm_error(gpu.dx, reference.dx) <= mode.tolerance);
                    CHECK(relative_norm_error(gpu.dw, reference.dw) <= mode.dw_tolerance);
                    if (c.bias) {
                        CHECK(relative_norm_error(gpu.db, reference.db) <= mode.tolerance);
                        CHECK(run_conv(inputs, dy.to(kGpu), options).db.to_vector() == gpu.db.to_vector());
                    }
                }
            }
}

int main(int argc, char* argv[]) {
    if (cuda_device_count() == 0) {
        std::cout << "dyngrad: no CUDA device: GPU tests skipped" << std::endl;
        return 77;
    }
    return dgtest::run_session(argc, argv);
}

// Issue 11 class 7: NaN propagates through relu, clipped_relu and the fused ReLU of linear (float32: the
// BIAS epilogue and our ReLU kernel, never cuBLASLt's RELU_BIAS) and conv2d, as on the CPU; the gradient
// passes dy at a NaN (PyTorch's threshold_backward).
TEST_CASE("every ReLU variant propagates NaN on the GPU as on the CPU", "[gpu][nan]") {
    constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    Generator gen(kSeedBase + 5000);
    for (const DType dtype : {DType::f32, DType::f64}) {
        DYNAMIC_SECTION(dtype_name(dtype)) {
            // Runs y = f(inputs) and dinputs[0] for dy = 1 on `device`; returns y and dx on the CPU.
            const auto run = [&](Device device, const std::vector<Tensor>& values, auto f) {
                ComputeGraph g;
                std::vector<Var> vars;
                for (const Tensor& v : values) vars.push_back(g.input(v.to(device), "", true));
                Var y = f(vars);
                g.backward(sum(y));
                return std::pair{y.value().to(Device::cpu()), vars[0].grad().to(Device::cpu())};
            };
            const auto same_nan_and_values = [](const Tensor& gpu, const Tensor& cpu) {
                const std::vector<double> a = gpu.to_vector(), b = cpu.to_vector();
                REQUIRE(a.size() == b.size());
                std::int64_t nan = 0;
                for (std::size_t i = 0; i < a.size(); ++i) {
                    CHECK(std::isnan(a[i]) == std::isnan(b[i]));
                    nan += std::isnan(a[i]);
                    if (!std::isnan(b[i])) CHECK(std::abs(a[i] - b[i]) <= 1e-4 * (1 + std::abs(b[i])));
                }
                return nan;
            };
            Tensor x = Tensor::normal({4, 33}, 0, 1, gen, dtype);
            x.set({1, 7}, kNaN);
            x.set({3, 30}, kNaN);
            const auto relus = [](const std::vector<Var>& v) { return add(relu(v[0]), clipped_relu(v[0], 0.5)); };
            const auto [y_gpu, dx_gpu] = run(kGpu, {x}, relus);
            const auto [y_cpu, dx_cpu] = run(Device::cpu(), {x}, relus);
            CHECK(same_nan_and_values(y_gpu, y_cpu) == 2);
            CHECK(same_nan_and_values(dx_gpu, dx_cpu) == 0);
            CHECK(dx_gpu.at({1, 7}) == 2);  // dy passes through both at a NaN

            const Tensor w = Tensor::normal({40, 33}, 0, 1, gen, dtype), b = Tensor::normal({40}, 0, 1, gen, dtype);
            const auto fused = [](const std::vector<Var>& v) { return linear(v[0], v[1], v[2], Activation::Relu); };
            CHECK(same_nan_and_values(run(kGpu, {x, w, b}, fused).first, run(Device::cpu(), {x, w, b}, fused).first) ==
                  80);

            Tensor image = Tensor::normal({2, 3, 9, 9}, 0, 1, gen, dtype);
            image.set({1, 2, 4, 4}, kNaN);
            const Tensor k = Tensor::normal({5, 3, 3, 3}, 0, 1, gen, dtype), kb = Tensor::normal({5}, 0, 1, gen, dtype);
            const auto conv = [](const std::vector<Var>& v) {
                return conv2d(v[0], v[1], v[2], {.padding = {1, 1}, .activation = Activation::Relu});
            };
            CHECK(same_nan_and_values(run(kGpu, {image, k, kb}, conv).first,
                                      run(Device::cpu(), {image, k, kb}, conv).first) == 45);
        }
    }
}
