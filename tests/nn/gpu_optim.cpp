// The fused optimizer steps (SGD, Adam, AdamW; parameter groups, mixed step counts) and gradient clipping on
// the GPU against the CPU's updates.
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp); the helpers several of its files share are in tests/support/gpu_support.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;

namespace {

// ---- fused optimizer steps against the CPU updates ----

// cuda/optim.cu's kStepChunk: one block updates at most this many elements of one tensor.
constexpr std::int64_t kOptimizerChunk = std::int64_t{1} << 15;

struct TwinSpec {
    const char* name;
    Shape shape;
    DType dtype;
};
// f32 and f64 mixed in one optimizer (one launch group per dtype), most larger than one chunk, with ragged
// tails, one of exactly one chunk and one far below.
const TwinSpec kTwinSpecs[] = {
    {"f32 3 chunks + 123", {3 * kOptimizerChunk + 123}, DType::f32},
    {"f64 (250,300)", {250, 300}, DType::f64},
    {"f32 one chunk", {kOptimizerChunk}, DType::f32},
    {"f64 small", {7}, DType::f64},
    {"f32 late", {kOptimizerChunk + 1}, DType::f32},
    {"f64 skipping", {2 * kOptimizerChunk + 5}, DType::f64},
};
constexpr int kOptimizerSteps = 7;

// Whether parameter i gets a gradient at step s: the optimizer skips a parameter without one, so the
// parameters reach different step counts (Adam launches one group per (dtype, step count)): "late" first
// gets one at step 3, "skipping" misses every third step, "small" every other one.
bool gets_gradient(std::size_t i, int step) {
    switch (i) {
        case 3: return step % 2 == 0;
        case 4: return step >= 3;
        case 5: return step % 3 != 1;
        default: return true;
    }
}

// max |gpu − cpu| over max(1, max |cpu|): both tensors on the same scale; +inf for NaN or a shape mismatch.
double scaled_difference(const Tensor& gpu, const Tensor& cpu) {
    const std::vector<double> reference = cpu.to_vector();
    double scale = 1;
    for (const double v : reference) scale = std::max(scale, std::abs(v));
    return max_abs_error(gpu.to(Device::cpu()), cpu) / scale;
}

// Both backends apply the same formulas in the same order and precision, with the per-step scalars computed
// in double on the host and cast identically (nn/optim_internal.h); they differ only where nvcc contracts
// a·b + c into one FMA (one rounding instead of two): about one ulp of the largest term per operation, five
// operations per update, over seven steps ~40 ulps of the tensor's largest magnitude (momentum buffers reach
// ~10× the gradient; Adam's m/√v is bounded by 1/√(1−β2)). The bounds leave a few times that; a wrong
// formula, step count or weight decay moves values by ≥ 1e-4 of their scale (lr·wd per step alone is 5e-4).
double optimizer_tolerance(DType dtype) { return dtype == DType::f32 ? 2e-5 : 1e-13; }

// The gradient g of p, through a backward of Σ p·g (exact: the seed is 1, and 1·g = g on both backends).
void give_gradient(const Parameter& p, const Tensor& g) {
    ComputeGraph graph;
    graph.backward(sum(mul(graph.parameter(p), graph.input(g))));
}

struct OptimizerPair {
    std::vector<Parameter> cpu, gpu;
    std::unique_ptr<Optimizer> on_cpu, on_gpu;
};

// Runs kOptimizerSteps steps on identical copies, the same gradients on both, and returns them for comparison.
template <typename Make>
OptimizerPair run_twin_optimizers(std::uint64_t seed, Make make) {
    Generator gen(seed);
    OptimizerPair pair;
    for (const TwinSpec& spec : kTwinSpecs) {
        const Tensor value = Tensor::normal(spec.shape, 0.0, 1.0, gen, spec.dtype);
        pair.cpu.emplace_back(value.clone(), spec.name);
        pair.gpu.emplace_back(value.to(kGpu), spec.name);
    }
    pair.on_cpu = make(pair.cpu);
    pair.on_gpu = make(pair.gpu);
    for (int step = 0; step < kOptimizerSteps; ++step) {
        pair.on_cpu->zero_grad();
        pair.on_gpu->zero_grad();
        for (std::size_t i = 0; i < pair.cpu.size(); ++i) {
            if (!gets_gradient(i, step)) continue;
            const Tensor g = Tensor::normal(kTwinSpecs[i].shape, 0.0, 1.0, gen, kTwinSpecs[i].dtype);
            give_gradient(pair.cpu[i], g);
            give_gradient(pair.gpu[i], g.to(kGpu));
        }
        pair.on_cpu->step();
        pair.on_gpu->step();
    }
    return pair;
}

int gradient_steps(std::size_t i) {
    int count = 0;
    for (int step = 0; step < kOptimizerSteps; ++step) count += gets_gradient(i, step) ? 1 : 0;
    return count;
}

// Parameters (and, where defined, each state tensor from `states`) of the two runs agree; every parameter moved.
template <typename States>
void check_twins(const OptimizerPair& pair, States states) {
    for (std::size_t i = 0; i < pair.cpu.size(); ++i) {
        const TwinSpec& spec = kTwinSpecs[i];
        INFO("parameter '" << spec.name << "' " << to_string(spec.shape) << " " << dtype_name(spec.dtype) << ", "
                           << gradient_steps(i) << " steps with a gradient");
        const double tolerance = optimizer_tolerance(spec.dtype);
        CHECK(pair.gpu[i].value().device() == kGpu);
        CHECK(pair.gpu[i].value().dtype() == spec.dtype);
        CHECK(scaled_difference(pair.gpu[i].value(), pair.cpu[i].value()) <= tolerance);
        const std::vector<std::pair<Tensor, Tensor>> state_pairs = states(i);
        for (std::size_t k = 0; k < state_pairs.size(); ++k) {
            INFO("state " << k);
            const auto& [on_gpu, on_cpu] = state_pairs[k];
            REQUIRE(on_cpu.defined());
            REQUIRE(on_gpu.defined());
            CHECK(on_gpu.device() == kGpu);
            CHECK(scaled_difference(on_gpu, on_cpu) <= tolerance);
        }
    }
}

}  // namespace

TEST_CASE("fused optimizer steps match the CPU updates over many chunks and step counts", "[gpu][nn][optim]") {
    std::uint64_t seed = kSeedBase + 5000;
    struct SgdMode {
        const char* name;
        SgdOptions options;
    };
    const SgdMode sgd_modes[] = {
        {"plain with weight decay", {.lr = 0.05, .weight_decay = 0.01}},
        {"momentum", {.lr = 0.05, .momentum = 0.9}},
        {"Nesterov with weight decay", {.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01}},
    };
    for (const SgdMode& mode : sgd_modes) {
        ++seed;
        DYNAMIC_SECTION("SGD " << mode.name) {
            const OptimizerPair pair = run_twin_optimizers(seed, [&](const std::vector<Parameter>& params) {
                return std::unique_ptr<Optimizer>(new SGD(params, mode.options));
            });
            const auto& cpu = dynamic_cast<const SGD&>(*pair.on_cpu);
            const auto& gpu = dynamic_cast<const SGD&>(*pair.on_gpu);
            check_twins(pair, [&](std::size_t i) {
                std::vector<std::pair<Tensor, Tensor>> states;
                if (mode.options.momentum == 0) {
                    CHECK_FALSE(cpu.momentum_buffer(i).defined());
                    CHECK_FALSE(gpu.momentum_buffer(i).defined());
                } else {
                    states.emplace_back(gpu.momentum_buffer(i), cpu.momentum_buffer(i));
                }
                return states;
            });
        }
    }
    struct AdamMode {
        const char* name;
        bool decoupled;
        AdamOptions options;
    };
    const AdamMode adam_modes[] = {
        {"Adam", false, {.lr = 1e-2}},
        {"Adam with L2 weight decay", false, {.lr = 1e-2, .weight_decay = 0.05}},
        {"AdamW", true, {.lr = 1e-2, .weight_decay = 0.05}},
    };
    for (const AdamMode& mode : adam_modes) {
        ++seed;
        DYNAMIC_SECTION(mode.name) {
            const OptimizerPair pair = run_twin_optimizers(seed, [&](const std::vector<Parameter>& params) {
                if (mode.decoupled) return std::unique_ptr<Optimizer>(new AdamW(params, mode.options));
                return std::unique_ptr<Optimizer>(new Adam(params, mode.options));
            });
            const auto& cpu = dynamic_cast<const Adam&>(*pair.on_cpu);
            const auto& gpu = dynamic_cast<const Adam&>(*pair.on_gpu);
            check_twins(pair, [&](std::size_t i) {
                CHECK(cpu.step_count(i) == gradient_steps(i));
                CHECK(gpu.step_count(i) == gradient_steps(i));
                return std::vector<std::pair<Tensor, Tensor>>{{gpu.exp_avg(i), cpu.exp_avg(i)},
                                                              {gpu.exp_avg_sq(i), cpu.exp_avg_sq(i)}};
            });
        }
    }
}

namespace {
// Parameters on `device` from one seed: float32 and float64, one larger than a fused-step chunk (32768).
std::vector<Parameter> group_test_parameters(Device device) {
    Generator gen(4242);
    const auto make = [&](const Shape& shape, DType dtype, const char* name) {
        return Parameter(Tensor::normal(shape, 0, 1, gen, dtype).to(device), name);
    };
    return {make({70001}, DType::f32, "big"), make({33, 5}, DType::f32, "w"), make({7}, DType::f64, "b64"),
            make({129}, DType::f32, "tail")};
}
// loss = Σ c·w² with fixed random c (one graph per dtype): gradients 2·c·w; parameter 3 is left out of
// every second step.
void group_test_step(Optimizer& opt, std::int64_t step) {
    Generator gen(900 + static_cast<std::uint64_t>(step));
    const std::vector<Parameter>& params = opt.parameters();
    const Device device = params[0].value().device();
    opt.zero_grad();
    for (const DType dtype : {DType::f32, DType::f64}) {
        ComputeGraph graph;
        Var loss;
        for (std::size_t i = 0; i < params.size(); ++i) {
            if ((i == 3 && step % 2 == 1) || params[i].value().dtype() != dtype) continue;
            Var w = graph.parameter(params[i]);
            const Tensor c = Tensor::uniform(params[i].value().shape(), 0.5, 1.5, gen, dtype).to(device);
            Var term = sum(graph.input(c) * w * w);
            loss = loss.defined() ? loss + term : term;
        }
        if (loss.defined()) graph.backward(loss);
    }
    opt.step();
}
}  // namespace

TEST_CASE("fused optimizer steps with parameter groups and mixed step counts match the CPU", "[gpu][nn][optim]") {
    using Make = std::function<std::unique_ptr<Optimizer>(const std::vector<Parameter>&)>;
    const auto groups = [](const std::vector<Parameter>& p, ParamGroup second) {
        second.parameters = {p[2], p[3]};
        return std::vector<ParamGroup>{{.parameters = {p[0], p[1]}}, std::move(second)};
    };
    const std::vector<std::pair<const char*, Make>> cases = {
        {"SGD", [&](const std::vector<Parameter>& p) {
             return std::make_unique<SGD>(groups(p, {.lr = 0.01, .weight_decay = 0.1, .nesterov = false}),
                                          SgdOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
         }},
        {"Adam", [&](const std::vector<Parameter>& p) {
             return std::make_unique<Adam>(groups(p, {.lr = 0.02, .beta1 = 0.5}), AdamOptions{.lr = 0.01});
         }},
        {"AdamW", [&](const std::vector<Parameter>& p) {
             return std::make_unique<AdamW>(groups(p, {.weight_decay = 0.3}), AdamOptions{.lr = 0.01, .weight_decay = 0.01});
         }},
    };
    for (const auto& [name, make] : cases) {
        INFO(name);
        const std::vector<Parameter> gpu = group_test_parameters(kGpu), cpu = group_test_parameters(Device::cpu());
        auto gpu_opt = make(gpu);
        auto cpu_opt = make(cpu);
        StepLR gpu_schedule(*gpu_opt, 1, 0.8), cpu_schedule(*cpu_opt, 1, 0.8);
        for (std::int64_t step = 0; step < 4; ++step) {
            group_test_step(*gpu_opt, step);
            group_test_step(*cpu_opt, step);
            gpu_schedule.step();
            cpu_schedule.step();
        }
        CHECK(gpu_opt->step_count(3) == 2);
        for (std::size_t i = 0; i < gpu.size(); ++i) {
            INFO(gpu[i].name());
            const std::vector<double> g = gpu[i].value().to_vector(), c = cpu[i].value().to_vector();
            for (std::size_t k = 0; k < g.size(); ++k) REQUIRE(std::abs(g[k] - c[k]) <= 1e-5 * (1 + std::abs(c[k])));
        }
    }
}

TEST_CASE("clip_grad_norm and clip_grad_value on the GPU match the CPU", "[gpu][nn][clip]") {
    for (const double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
        INFO("norm_type " << norm_type);
        const std::vector<Parameter> gpu = group_test_parameters(kGpu), cpu = group_test_parameters(Device::cpu());
        SGD gpu_opt(gpu, {.lr = 0}), cpu_opt(cpu, {.lr = 0});  // lr 0: the steps only make gradients
        group_test_step(gpu_opt, 0);
        group_test_step(cpu_opt, 0);
        const Tensor cpu_norm = clip_grad_norm(cpu, 0.5, norm_type);
        const Tensor gpu_norm = clip_grad_norm(gpu, 0.5, norm_type);
        CHECK(gpu_norm.device() == kGpu);
        CHECK(gpu_norm.dtype() == DType::f64);  // one gradient is float64
        CHECK(gpu_norm.item() == dgtest::Approx(cpu_norm.item()).epsilon(1e-9));
        for (std::size_t i = 0; i < gpu.size(); ++i) {
            const std::vector<double> g = gpu[i].grad().to_vector(), c = cpu[i].grad().to_vector();
            for (std::size_t k = 0; k < g.size(); ++k) REQUIRE(std::abs(g[k] - c[k]) <= 1e-6 * (1 + std::abs(c[k])));
        }
        clip_grad_value(gpu, 1e-3);
        clip_grad_value(cpu, 1e-3);
        for (std::size_t i = 0; i < gpu.size(); ++i) {
            const std::vector<double> g = gpu[i].grad().to_vector(), c = cpu[i].grad().to_vector();
            for (std::size_t k = 0; k < g.size(); ++k) {
                REQUIRE(std::abs(g[k]) <= 1e-3 * (1 + 1e-7));
                REQUIRE(std::abs(g[k] - c[k]) <= 1e-6 * (1 + std::abs(c[k])));
            }
        }
    }
}
