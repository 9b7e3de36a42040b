// bf16/f16 on tensor cores (issue 15): matmul, batched matmul, linear (+ReLU, its bias/bias-gradient epilogues)
// and conv2d (+bias, +ReLU) forward and backward against the float64 CPU replay of the same rounded inputs; short
// bf16 and f16 training runs under autocast (f16 with a GradScaler) whose loss falls and stays finite; a captured
// autocast step, and a host read inside one.
//
// Tolerances: the GPU accumulates in f32 and rounds the result once to bf16 (8 significant bits: relative error
// up to 2^-8 = 3.9e-3 per element) or f16 (11 bits: 4.9e-4); measured against the largest reference magnitude.
//
// Without a CUDA device (or in a CPU-only build) the executable prints why and exits 77 (CTest: skipped).
#include <cmath>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

const Device kGpu = Device::cuda(0);

double tolerance(DType dtype) { return dtype == DType::bf16 ? 1.2e-2 : 2e-3; }

// max |got − want| / max |want|, both read as f64.
double relative_error(const Tensor& got, const Tensor& want) {
    const std::vector<double> g = got.to(Device::cpu()).to(DType::f64).to_vector();
    const std::vector<double> w = want.to(Device::cpu()).to(DType::f64).to_vector();
    REQUIRE(g.size() == w.size());
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
        scale = std::max(scale, std::abs(w[i]));
        worst = std::max(worst, std::abs(g[i] - w[i]));
    }
    return worst / std::max(scale, 1e-30);
}

// Random values rounded to `dtype` (the GPU's inputs) and the same values in f64 on the CPU (the reference's).
struct Rounded {
    Tensor gpu, cpu64;
};
Rounded rounded_normal(const Shape& shape, DType dtype, Generator& gen, double stddev = 1.0) {
    const Tensor reduced = Tensor::normal(shape, 0.0, stddev, gen).to(dtype);
    return {reduced.to(kGpu), reduced.to(DType::f64)};
}

// Runs `op` on the reduced GPU inputs and on their f64 CPU copies, back-propagates the same random seed
// gradient (rounded to the dtype) through both, and compares the output and every input's gradient.
template <typename Op>
void check_against_f64(DType dtype, const std::vector<Shape>& shapes, Op op, std::uint64_t seed) {
    Generator gen(seed);
    std::vector<Rounded> inputs;
    for (const Shape& s : shapes) inputs.push_back(rounded_normal(s, dtype, gen, 0.5));
    ComputeGraph gpu, cpu;
    std::vector<Var> gpu_vars, cpu_vars;
    for (const Rounded& r : inputs) {
        gpu_vars.push_back(gpu.input(r.gpu, "", true));
        cpu_vars.push_back(cpu.input(r.cpu64, "", true));
    }
    const Var y_gpu = op(gpu_vars);
    const Var y_cpu = op(cpu_vars);
    REQUIRE(y_gpu.dtype() == dtype);
    CHECK(relative_error(y_gpu.value(), y_cpu.value()) < tolerance(dtype));
    const Tensor seed_grad = Tensor::normal(y_cpu.shape(), 0.0, 1.0, gen).to(dtype);
    gpu.backward(y_gpu, seed_grad.to(kGpu));
    cpu.backward(y_cpu, seed_grad.to(DType::f64));
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        INFO("gradient of input " << i);
        REQUIRE(gpu_vars[i].grad().dtype() == dtype);
        CHECK(relative_error(gpu_vars[i].grad(), cpu_vars[i].grad()) < tolerance(dtype));
    }
}

}  // namespace

TEST_CASE("bf16/f16 matmul and batched matmul on tensor cores match the f64 replay", "[gpu][amp][gemm]") {
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        check_against_f64(dtype, {{33, 70}, {70, 45}}, [](const std::vector<Var>& v) { return matmul(v[0], v[1]); },
                          1);
        check_against_f64(dtype, {{3, 17, 64}, {3, 64, 24}},
                          [](const std::vector<Var>& v) { return matmul(v[0], v[1]); }, 2);
    }
}

TEST_CASE("bf16/f16 linear (bias epilogue, ReLU, bias-gradient epilogue) matches the f64 replay", "[gpu][amp][gemm]") {
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        // Aligned sizes take the cuBLASLt epilogues; odd ones may take the cuBLAS path.
        for (const auto& [n, in, out] : {std::array<std::int64_t, 3>{64, 128, 32}, {37, 29, 11}}) {
            check_against_f64(dtype, {{n, in}, {out, in}, {out}},
                              [](const std::vector<Var>& v) { return linear(v[0], v[1], v[2]); }, 3);
            check_against_f64(dtype, {{n, in}, {out, in}, {out}},
                              [](const std::vector<Var>& v) { return linear(v[0], v[1], v[2], Activation::Relu); },
                              4);
        }
    }
}

TEST_CASE("bf16/f16 conv2d (+bias, +ReLU) through cuDNN matches the f64 replay", "[gpu][amp][conv]") {
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        check_against_f64(dtype, {{4, 3, 12, 12}, {8, 3, 3, 3}, {8}},
                          [](const std::vector<Var>& v) { return conv2d(v[0], v[1], v[2], {.padding = {1, 1}}); }, 5);
        check_against_f64(
            dtype, {{2, 16, 9, 9}, {16, 16, 5, 5}, {16}},
            [](const std::vector<Var>& v) { return conv2d(v[0], v[1], v[2], {.activation = Activation::Relu}); }, 6);
    }
}

TEST_CASE("bf16/f16 scaled_dot_product_attention matches the f64 replay", "[gpu][amp][attention]") {
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        check_against_f64(dtype, {{2, 4, 16, 32}, {2, 4, 16, 32}, {2, 4, 16, 32}},
                          [](const std::vector<Var>& v) {
                              return scaled_dot_product_attention(v[0], v[1], v[2], {.is_causal = true});
                          },
                          7);
    }
}

namespace {

// A 2-layer MLP on a fixed random regression batch, trained `steps` steps under autocast into `dtype`; the losses.
std::vector<double> train_mlp(DType dtype, int steps) {
    Generator gen(21);
    Linear fc1(64, 128, true, gen), fc2(128, 10, true, gen);
    fc1.to(kGpu);
    fc2.to(kGpu);
    std::vector<Parameter> params = fc1.parameters();
    for (const Parameter& p : fc2.parameters()) params.push_back(p);
    const Tensor x = Tensor::normal({256, 64}, 0.0, 1.0, gen).to(kGpu);
    const Tensor y = Tensor::normal({256, 10}, 0.0, 1.0, gen).to(kGpu);
    Adam adam(params, {.lr = 3e-3});
    GradScaler scaler({.enabled = dtype == DType::f16});
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(dtype);
            loss = mse_loss(fc2(relu(fc1(graph.input(x)))), graph.input(y));
        }
        REQUIRE(loss.dtype() == DType::f32);
        graph.backward(scaler.scale(loss));
        scaler.step(adam);
        scaler.update();
        adam.zero_grad();
        losses.push_back(loss.item());
    }
    for (const Parameter& p : params) CHECK(p.value().dtype() == DType::f32);  // master weights stay f32
    return losses;
}

// The peak bytes in use (cuda::memory_stats, absolute, as dyngrad-perf measures it) over one steady-state
// training step of a 6-layer MLP (width 1024, batch 256, cross_entropy, SGD) under autocast `dtype`, f16 with a
// GradScaler; the graph stays alive through the optimizer step, as in dyngrad-perf's step.
std::size_t mlp_step_peak(DType dtype) {
    constexpr std::int64_t kWidth = 1024, kBatch = 256, kLayers = 6;
    Generator gen(41);
    std::vector<Linear> layers;
    std::vector<Parameter> params;
    for (std::int64_t i = 0; i < kLayers; ++i) {
        layers.emplace_back(kWidth, kWidth, true, gen);
        layers.back().to(kGpu);
        for (const Parameter& p : layers.back().parameters()) params.push_back(p);
    }
    const Tensor x = Tensor::uniform({kBatch, kWidth}, -1, 1, gen).to(kGpu);
    std::vector<std::int64_t> classes(static_cast<std::size_t>(kBatch));
    for (std::int64_t& c : classes) c = static_cast<std::int64_t>(gen.engine()() % kWidth);
    const Tensor labels = Tensor::from_vector(classes, {kBatch}).to(kGpu);
    SGD sgd(params, {.lr = 0.01});
    GradScaler scaler({.enabled = dtype == DType::f16});
    const auto step = [&] {
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(dtype);
            Var h = graph.input(x);
            for (std::size_t i = 0; i + 1 < layers.size(); ++i) h = relu(layers[i](h));
            loss = cross_entropy(layers.back()(h), graph.input(labels));
        }
        const Tensor loss_value = loss.value();  // with loss scaling an inner node, which free_values releases
        graph.backward(scaler.scale(loss), {.free_values = true});
        scaler.step(sgd);
        scaler.update();
        sgd.zero_grad();
        REQUIRE(std::isfinite(loss_value.item()));
    };
    step();  // warm-up: the scaler's state and the optimizer's table are placed on the device
    cuda::synchronize(0);
    cuda::reset_peak_memory(0);
    step();
    cuda::synchronize(0);
    return cuda::memory_stats(0).peak_bytes_in_use;
}

}  // namespace

TEST_CASE("the f16 step with a GradScaler peaks no higher than the bf16 step", "[gpu][amp][memory]") {
    // The scaler adds a few scalars (scale, inv_scale, flags, the scaled loss and its gradient): 1 MiB is far
    // above them and far below one more copy of the gradients (24 MiB here), which the inf check made while
    // the graph still shared every gradient (the f16 MLP 4096 step peaked 96 MiB above bf16's, 864 MiB
    // against PyTorch's 833).
    constexpr std::size_t kBound = std::size_t{1} << 20;
    const std::size_t bf16 = mlp_step_peak(DType::bf16);
    const std::size_t f16 = mlp_step_peak(DType::f16);
    INFO("peak bytes: bf16 " << bf16 << ", f16 " << f16);
    CHECK(f16 <= bf16 + kBound);
}

TEST_CASE("a short bf16 and f16 autocast training run: the loss falls and stays finite", "[gpu][amp][training]") {
    const std::vector<double> reference = train_mlp(DType::f32, 60);
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        const std::vector<double> losses = train_mlp(dtype, 60);
        for (const double l : losses) REQUIRE(std::isfinite(l));
        CHECK(losses.back() < 0.7 * losses.front());
        // Within a few per cent of the f32 run's final loss.
        CHECK(std::abs(losses.back() - reference.back()) < 0.1 * reference.back() + 1e-3);
    }
}

TEST_CASE("an autocast bf16 step captures and replays like the eager step; a host read inside is a GraphError",
          "[gpu][amp][capture]") {
    Generator gen(22);
    Linear fc(32, 16, true, gen);
    fc.to(kGpu);
    SGD sgd(fc.parameters(), {.lr = 0.05});
    const Tensor x = Tensor::normal({64, 32}, 0.0, 1.0, gen).to(kGpu);
    const Tensor y = Tensor::normal({64, 16}, 0.0, 1.0, gen).to(kGpu);
    cuda::CapturedStep step([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(DType::bf16);
            loss = mse_loss(fc(graph.input(in[0])), graph.input(in[1]));
        }
        graph.backward(loss);
        sgd.step();
        sgd.zero_grad();
        return loss.value();
    });
    const Tensor inputs[] = {x, y};
    double previous = step.run(inputs).item();  // eager warm-up
    for (int i = 0; i < 5; ++i) {
        const double loss = step.run(inputs).item();  // capture, then replays
        CHECK(std::isfinite(loss));
        CHECK(loss < previous);
        previous = loss;
    }
    cuda::CapturedStep reading([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        const AutocastGuard autocast(DType::bf16);
        const Var loss = mse_loss(fc(graph.input(in[0])), graph.input(in[1]));
        static_cast<void>(loss.item());  // not inside CHECK: Catch would swallow the exception
        return loss.value();
    });
    reading.run(inputs);
    CHECK_THROWS_MATCHES(reading.run(inputs), GraphError, MessageHas({"captured"}));
}

namespace {

// A two-layer bf16 step (linear: input, weight and bias cast) trained by AdamW in a captured step: warm-up,
// capture, then three replays; with or without autocast's kept parameter copies.
struct CopiesRun {
    std::vector<Tensor> values;  // the last loss, then every parameter, on the CPU
    std::size_t kernels = 0;     // of the captured graph
    std::int64_t copies_used = 0;
};
CopiesRun captured_with_copies(bool keep, std::uint64_t seed) {
    set_autocast_parameter_copies(keep);
    Generator gen(seed);
    Linear fc1(48, 96, true, gen), fc2(96, 24, true, gen);
    fc1.to(kGpu);
    fc2.to(kGpu);
    std::vector<Parameter> params = fc1.parameters();
    for (const Parameter& p : fc2.parameters()) params.push_back(p);
    AdamW opt(params, {.lr = 0.01});
    const AutocastGuard autocast(DType::bf16);  // alive across the runs: the copies_used count spans them
    cuda::CapturedStep step([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var loss = mse_loss(fc2(relu(fc1(graph.input(in[0])))), graph.input(in[1]));
        graph.backward(loss);
        opt.step();
        opt.zero_grad();
        return loss.value();
    });
    const Tensor inputs[] = {Tensor::normal({33, 48}, 0.0, 1.0, gen).to(kGpu), Tensor::normal({33, 24}, 0.0, 1.0, gen).to(kGpu)};
    Tensor loss;
    for (int run = 0; run < 5; ++run) loss = step.run(inputs);
    cuda::synchronize(0);
    CopiesRun out;
    out.values.push_back(loss.to(Device::cpu()));
    for (const Parameter& p : params) out.values.push_back(p.value().to(Device::cpu()));
    out.kernels = step.last_graph_counts().kernels;
    out.copies_used = autocast_cache_stats().copies_used;
    set_autocast_parameter_copies(true);
    return out;
}

}  // namespace

// The optimizer's kernel writes each parameter's bf16 copy as the cast kernel would (one rounding to nearest even),
// so the step with kept copies is bitwise the step without, with the four parameter casts gone from the graph.
TEST_CASE("kept parameter copies: a captured bf16 step launches no parameter cast, the same bits as without",
          "[gpu][amp][capture][copies]") {
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    const CopiesRun fresh = captured_with_copies(false, seed);
    const CopiesRun kept = captured_with_copies(true, seed);
    CHECK(fresh.copies_used == 0);
    CHECK(kept.copies_used == 4);  // the capture's four parameter casts (the warm-up made the copies)
    CHECK(fresh.kernels - kept.kernels == 4);
    REQUIRE(kept.values.size() == fresh.values.size());
    for (std::size_t i = 0; i < kept.values.size(); ++i) {
        INFO((i == 0 ? std::string("the loss") : "parameter " + std::to_string(i - 1)));
        const Tensor& a = kept.values[i];
        const Tensor& b = fresh.values[i];
        REQUIRE(a.numel() == b.numel());
        CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.numel() * dtype_size(a.dtype())) == 0);
    }
}

namespace {

// lenet5 (two convolutions, whose weight gradients may run on the side lane, and two linears) trained by SGD
// under bf16 autocast with kept copies: two eager steps, then a captured step's warm-up, capture and three
// replays; with the parameters' gradient casts batched or one at a time.
struct BatchedCastsRun {
    std::vector<Tensor> values;  // the eager gradients, then the last loss and the parameters, on the CPU
    std::size_t kernels = 0;     // of the captured graph
    std::int64_t batched = 0;    // casts the sweeps batched
    std::size_t parameters = 0;
};
BatchedCastsRun lenet_with_batched_casts(bool batch, std::uint64_t seed) {
    set_batched_gradient_casts(batch);
    Generator gen(seed);
    Sequential model = models::make_model("lenet5", 28, 28, gen);
    model.to(kGpu);
    SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
    const Tensor x = Tensor::normal({32, 1, 28, 28}, 0.0, 1.0, gen).to(kGpu);
    std::vector<std::int64_t> classes(32);
    for (std::size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<std::int64_t>((i * 7 + seed) % 10);
    const Tensor labels = Tensor::from_vector(classes, {32}).to(kGpu);
    const std::int64_t before = batched_gradient_cast_stats().casts;
    BatchedCastsRun out;
    const auto step = [&](std::span<const Tensor> in) {
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(DType::bf16);
            loss = cross_entropy(model(graph.input(in[0])), graph.input(in[1]));
        }
        graph.backward(loss);
        return loss.value();
    };
    const Tensor inputs[] = {x, labels};
    for (int eager = 0; eager < 2; ++eager) {
        step(inputs);
        for (const Parameter& p : model.parameters()) out.values.push_back(p.grad().to(Device::cpu()));
        opt.step();
        opt.zero_grad();
    }
    cuda::CapturedStep captured([&](std::span<const Tensor> in) {
        Tensor loss = step(in);
        opt.step();
        opt.zero_grad();
        return loss;
    });
    Tensor loss;
    for (int run = 0; run < 5; ++run) loss = captured.run(inputs);
    cuda::synchronize(0);
    out.values.push_back(loss.to(Device::cpu()));
    for (const Parameter& p : model.parameters()) out.values.push_back(p.value().to(Device::cpu()));
    out.kernels = captured.last_graph_counts().kernels;
    out.batched = batched_gradient_cast_stats().casts - before;
    out.parameters = model.parameters().size();
    set_batched_gradient_casts(true);
    return out;
}

}  // namespace

// The batched conversion rounds each element as the cast kernel does (bf16 -> f32 is exact): the gradients, the
// loss and the trained weights bitwise equal, with the step's eight gradient casts one launch.
TEST_CASE("batched parameter-gradient casts: lenet5 in bf16 gives the same bits, its captured step 7 kernels fewer",
          "[gpu][amp][capture][copies]") {
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    const BatchedCastsRun single = lenet_with_batched_casts(false, seed);
    const BatchedCastsRun batched = lenet_with_batched_casts(true, seed);
    const std::size_t parameters = 8;  // two convolutions and two linears, each with a bias
    REQUIRE(batched.parameters == parameters);
    CHECK(single.batched == 0);
    // Two eager steps, the captured step's warm-up and capture (its replays run no sweep).
    CHECK(batched.batched == static_cast<std::int64_t>(4 * parameters));
    CHECK(single.kernels - batched.kernels == parameters - 1);
    REQUIRE(batched.values.size() == single.values.size());
    for (std::size_t i = 0; i < batched.values.size(); ++i) {
        INFO("value " << i);
        const Tensor& a = batched.values[i];
        const Tensor& b = single.values[i];
        REQUIRE(a.numel() == b.numel());
        CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.numel() * dtype_size(a.dtype())) == 0);
    }
}

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "bf16/f16 GPU tests"); }
