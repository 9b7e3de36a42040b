// Generated kernels on the GPU against the unfused kernels (docs/fusion.md, "What must run on the GPU"): a graph
// recorded on the device runs its ops' own kernels; each fused group's generated kernel then runs on the same
// inputs and its outputs are compared with the values the unfused kernels stored. The CUDA build only (the loader
// uses the driver API); without a device the executable exits 77 (CTest: skipped).
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <random>
#include <vector>

#include "catch.h"
#include "dyngrad/cuda/capture.h"
#include "dyngrad/cuda/fused_kernel.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/graph/fusion_replay.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/fusion_source.h"

using namespace dyngrad;
using namespace dyngrad::fusion;

namespace {

const Device kGpu = Device::cuda(0);

Tensor random(const Shape& shape, DType dtype, Generator& gen) {
    return Tensor::uniform(shape, -2.0, 2.0, gen).to(dtype).to(kGpu);
}

// Runs the generated kernel of `group` on the values the graph holds and returns its outputs, in the order of
// FusedKernelSource::outputs.
std::vector<Tensor> run_generated(const ComputeGraph& graph, const FusionGroup& group) {
    const FusedKernelSource source = generate_fused_source(graph, group);
    const cuda::CompiledKernel compiled = cuda::compile_fused_kernel(
        source.source, source.name, {.arch = cuda::device_arch(0), .kind = cuda::ImageKind::Cubin, .cache_dir = {},
                                     .use_cache = false});
    const cuda::FusedKernel kernel(compiled, 0);
    std::vector<void*> pointers;
    for (NodeId id : source.inputs) pointers.push_back(graph.node(id).value.raw_data());
    std::vector<Tensor> outputs;
    for (NodeId id : source.outputs) {
        const Tensor& value = graph.node(id).value;
        outputs.push_back(Tensor::empty(value.shape(), value.dtype(), kGpu));
        pointers.push_back(outputs.back().raw_data());
    }
    std::vector<std::vector<std::byte>> scalars;  // as the hook passes them (UnaryScalars, DropoutScalars)
    for (const ScalarArgument& scalar : source.scalars)
        scalars.push_back(member_scalar_bytes(graph.node(scalar.node), group.double_precision));
    std::vector<void*> arguments;
    for (void*& pointer : pointers) arguments.push_back(&pointer);
    for (std::vector<std::byte>& scalar : scalars) arguments.push_back(scalar.data());
    kernel.launch(source.numel, arguments);
    return outputs;
}

// Compares every output of every group with the unfused kernels' value: equal within `ulps` units in the last
// place of the output's dtype; reports how many elements differ at all and the first few that do. With
// `every_member`, each group's kernel writes every member (as the captured-step hook runs it), all compared.
void check_plan(const ComputeGraph& graph, double ulps, bool every_member = false) {
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE_FALSE(plan.groups.empty());
    for (const FusionGroup& planned : plan.groups) {
        const FusionGroup group = every_member ? with_every_member_written(planned) : planned;
        const std::vector<Tensor> outputs = run_generated(graph, group);
        for (std::size_t j = 0; j < outputs.size(); ++j) {
            const Tensor& expected_value = graph.node(group.outputs[j].node).value;
            const std::vector<double> got = outputs[j].to(Device::cpu()).to(DType::f64).to_vector();
            const std::vector<double> expected = expected_value.to(Device::cpu()).to(DType::f64).to_vector();
            REQUIRE(got.size() == expected.size());
            const DType dtype = expected_value.dtype();
            const double epsilon = dtype == DType::bf16 ? 0x1p-7 : dtype == DType::f16 ? 0x1p-10
                                   : dtype == DType::f32 ? 0x1p-23 : 0x1p-52;
            std::size_t differing = 0, beyond = 0;
            std::string first;
            for (std::size_t i = 0; i < got.size(); ++i) {
                if (got[i] == expected[i] || (std::isnan(got[i]) && std::isnan(expected[i]))) continue;
                if (++differing <= 3) first += str(" [", i, "] ", got[i], " against ", expected[i], ";");
                if (std::abs(got[i] - expected[i]) > ulps * epsilon * std::max(1.0, std::abs(expected[i]))) ++beyond;
            }
            WARN("group output #" << group.outputs[j].node << " (" << dtype_name(dtype) << "): " << differing << " of "
                                   << got.size() << " elements differ from the unfused kernels" << first);
            CHECK(beyond == 0);
        }
    }
}

}  // namespace

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "generated-kernel GPU tests"); }

TEST_CASE("generated kernel of bias add + ReLU equals the unfused kernels", "[gpu][fusion]") {
    Generator gen(std::random_device{}());
    for (std::int64_t batch : {1, 3, 64, 4097}) {  // vector path, tail, misaligned shapes
        ComputeGraph graph;
        const Var x = graph.input(random({batch, 256}, DType::f32, gen), "x");
        const Var w = graph.input(random({256, 96}, DType::f32, gen), "w", true);
        const Var b = graph.input(random({96}, DType::f32, gen), "b", true);
        const Var h = relu(add(matmul(x, w), b));
        REQUIRE(h.defined());
        check_plan(graph, 0.0);  // add and relu are exact: bitwise
    }
}

TEST_CASE("generated kernels of reduced-precision chains with casts and scalar arguments", "[gpu][fusion]") {
    Generator gen(std::random_device{}());
    for (DType dtype : {DType::bf16, DType::f16}) {
        ComputeGraph graph;
        const Var x = graph.input(random({33, 70}, dtype, gen), "x", true);
        const Var b = graph.input(random({70}, dtype, gen), "b", true);
        const Var y = to_dtype(gelu(add(x, b), GeluApproximation::Tanh), DType::f32);
        const Var z = to_dtype(mul_scalar(sigmoid(clamp(y, -1.5, 1.5)), 0.75), dtype);
        REQUIRE(z.defined());
        check_plan(graph, 1.0);
    }
    ComputeGraph graph;
    const Var x = graph.input(random({17, 9}, DType::f64, gen), "x", true);
    const Var z = softplus(leaky_relu(mul(exp(x), x), 0.2));
    REQUIRE(z.defined());
    check_plan(graph, 4.0);
}

TEST_CASE("generated kernels with dropout: the dropout kernels' masks and values, seed input or attribute",
          "[gpu][fusion][dropout]") {
    Generator gen(std::random_device{}());
    DropoutSeeds seeds(std::random_device{}());
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        INFO(dtype_name(dtype));
        for (std::int64_t rows : {1, 7, 64}) {  // tails and the vector path
            ComputeGraph graph;
            const Var x = graph.input(random({rows, 130}, dtype, gen), "x", true);
            const Var r = graph.input(random({rows, 130}, dtype, gen), "r", true);
            const Var seed = graph.constant(seeds.next(kGpu));  // drawn on the device, as the Dropout layer's
            const Var a = dropout(relu(x), 0.35, true, seed);
            const Var b = dropout(add(a, r), 0.1, true, std::uint64_t{0x5eed} + static_cast<std::uint64_t>(rows));
            REQUIRE(mul_scalar(b, 2.0).defined());
            // The same dropout_apply and roundings: bitwise, whether the kernel stores its last member only (ptxas
            // then sees products no store needs: the rounding barrier must hold) or every member (as the hook's do).
            check_plan(graph, 0.0);
            check_plan(graph, 0.0, /*every_member=*/true);
        }
    }
}

// ---- the captured-step hook (graph/fusion_replay.h): generated kernels inside a CUDA graph ----
namespace {

struct StepResult {
    std::vector<Tensor> values;  // the output of the last run, then every parameter, on the CPU
    std::size_t kernels = 0;     // CapturedStep::last_graph_counts().kernels
    ReplayStats stats;
    std::size_t chains_run = 0;  // backward chains the step's sweeps ran
};

// Five runs of a captured step on `x` (warm-up, capture, three replays): the last output, then every parameter, the
// kernels of a replay, the replay counters and the chains run since `chains_before`. Turns fusion off afterwards.
StepResult five_runs(cuda::CapturedStep& step, const Tensor& x, const std::vector<Parameter>& params,
                     std::size_t chains_before) {
    Tensor output;
    for (int run = 0; run < 5; ++run) output = step.run(std::span<const Tensor>(&x, 1));
    cuda::synchronize(0);
    StepResult result;
    result.values.push_back(output.to(Device::cpu()));
    for (const Parameter& p : params) result.values.push_back(p.value().to(Device::cpu()));
    result.kernels = step.last_graph_counts().kernels;
    result.stats = replay_stats();
    result.chains_run = result.stats.backward_chains_run - chains_before;
    set_fusion_enabled(false);
    return result;
}

// The two-layer MLP's parameters (48 -> 96 -> 24), fresh from `gen`.
std::vector<Parameter> mlp_parameters(Generator& gen) {
    const auto parameter = [&](const Shape& shape, const char* name) {
        return Parameter(Tensor::uniform(shape, -0.3, 0.3, gen).to(kGpu), name);
    };
    return {parameter({48, 96}, "w1"), parameter({96}, "b1"), parameter({96, 24}, "w2"), parameter({24}, "b2")};
}

// Two layers with their bias adds, activations and a scalar multiply written out as pointwise ops, so that each
// forms a group ({add, relu, mul_scalar} and {add, sigmoid, mul}; under autocast the casts join them), trained by SGD
// in a captured step: warm-up, capture, then three replays.
StepResult mlp_step(bool fusion, std::optional<DType> autocast, std::uint64_t seed) {
    set_fusion_enabled(fusion);
    const std::size_t chains_before = replay_stats().backward_chains_run;
    Generator gen(seed);
    const std::vector<Parameter> params = mlp_parameters(gen);
    SGD sgd(params, {.lr = 0.05});
    cuda::CapturedStep step([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        Var loss;
        {
            std::optional<AutocastGuard> guard;
            if (autocast) guard.emplace(*autocast);
            const Var x = graph.input(in[0], "x");
            const Var h = mul_scalar(relu(add(matmul(x, graph.parameter(params[0])), graph.parameter(params[1]))), 0.5);
            const Var o = sigmoid(add(matmul(h, graph.parameter(params[2])), graph.parameter(params[3])));
            loss = mean(mul(o, o));
        }
        graph.backward(loss);
        sgd.step();
        sgd.zero_grad();
        return loss.value();
    });
    return five_runs(step, Tensor::uniform({33, 48}, -1.0, 1.0, gen).to(kGpu), params, chains_before);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() &&
           std::memcmp(a.raw_data(), b.raw_data(), a.numel() * dtype_size(a.dtype())) == 0;
}

// A loss whose mean a generated kernel computed (its group ends in the row reduction): the same sum in another
// order of additions, so equal to rounding (backward_mismatch's rule for sums in another order), not bitwise. The
// gradients do not read it: they stay bitwise.
bool equal_to_rounding(const Tensor& a, const Tensor& b) {
    return backward_mismatch(a.to(kGpu), b.to(kGpu), /*same_order=*/false).empty();
}

}  // namespace

// f32: each member's result is rounded and kept apart as its unfused kernel stores it, so bitwise. bf16 under
// autocast: the same kernels' roundings (the casts are members, rounded to bf16 as the unfused cast kernel does),
// so bitwise is expected too and asserted.
TEST_CASE("a captured MLP step runs its generated kernels: the same values, fewer launches", "[gpu][fusion][capture]") {
    const std::uint64_t seed = std::random_device{}();
    for (const std::optional<DType> autocast : {std::optional<DType>{}, std::optional<DType>{DType::bf16}}) {
        INFO((autocast ? "autocast bf16" : "f32") << ", seed " << seed);
        cuda::clear_fusion_log();
        const StepResult unfused = mlp_step(false, autocast, seed);
        const std::size_t captures = replay_stats().captures;
        const StepResult fused = mlp_step(true, autocast, seed);
        for (const cuda::FusionLogEntry& entry : cuda::fusion_log()) {  // no group fell back
            INFO(entry.kernel << ": " << entry.reason);
            CHECK(entry.kind != cuda::FusionLogEntry::Kind::CompileFallback);
            CHECK(entry.kind != cuda::FusionLogEntry::Kind::CheckMismatch);
        }
        REQUIRE(fused.stats.captures == captures + 1);
        CHECK(fused.stats.last_groups >= 2);
        CHECK(fused.stats.last_launches_saved >= 3);
        // The forward saves launches_saved() kernels; the backward chains save more (each replaces its members'
        // backward kernels and the sums between them by one kernel).
        WARN((autocast ? "autocast bf16" : "f32") << " kernels per captured step: " << unfused.kernels << " unfused, "
                                                   << fused.kernels << " fused (the forward's groups save "
                                                   << fused.stats.last_launches_saved << ")");
        CHECK(unfused.kernels > fused.kernels + fused.stats.last_launches_saved);
        // Two chains in each sweep: the warm-up's and the capture's (replays run no host code).
        CHECK(fused.chains_run == 4);
        REQUIRE(fused.values.size() == unfused.values.size());
        CHECK(equal_to_rounding(fused.values[0], unfused.values[0]));  // the step's output: the mean
        for (std::size_t i = 1; i < fused.values.size(); ++i) {
            INFO("parameter " << i - 1);
            CHECK(bitwise_equal(fused.values[i], unfused.values[i]));
        }
    }
}

namespace {

// The two-layer MLP with a Dropout layer after each activation (the layer draws its seed on the device; a fused
// dropout's draw runs as its own one-thread kernel, ahead of its group's kernel), trained by SGD in a captured step:
// warm-up, capture, three replays, each replay with fresh masks.
StepResult dropout_mlp_step(bool fusion, std::optional<DType> autocast, std::uint64_t seed) {
    set_fusion_enabled(fusion);
    Generator gen(seed);
    const std::vector<Parameter> params = mlp_parameters(gen);
    SGD sgd(params, {.lr = 0.05});
    const Dropout first(0.3, seed ^ 0x1111), second(0.2, seed ^ 0x2222);
    cuda::CapturedStep step([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        Var loss;
        {
            std::optional<AutocastGuard> guard;
            if (autocast) guard.emplace(*autocast);
            const Var x = graph.input(in[0], "x");
            const Var h = first(relu(add(matmul(x, graph.parameter(params[0])), graph.parameter(params[1]))));
            const Var o = second(sigmoid(add(matmul(h, graph.parameter(params[2])), graph.parameter(params[3]))));
            loss = mean(mul(o, o));
        }
        graph.backward(loss);
        sgd.step();
        sgd.zero_grad();
        return loss.value();
    });
    const Tensor x = Tensor::uniform({33, 48}, -1.0, 1.0, gen).to(kGpu);
    std::vector<Tensor> outputs;
    for (int run = 0; run < 5; ++run) outputs.push_back(step.run(std::span<const Tensor>(&x, 1)).to(Device::cpu()));
    cuda::synchronize(0);
    StepResult result;
    result.values = outputs;  // every run's loss: the masks change from run to run
    for (const Parameter& p : params) result.values.push_back(p.value().to(Device::cpu()));
    result.kernels = step.last_graph_counts().kernels;
    result.stats = replay_stats();
    CHECK(first.seeds().draws() == 5);
    CHECK(second.seeds().draws() == 5);
    set_fusion_enabled(false);
    return result;
}

}  // namespace

TEST_CASE("a captured MLP step with Dropout layers: the unfused masks and values, fresh masks every replay",
          "[gpu][fusion][capture][dropout]") {
    const std::uint64_t seed = std::random_device{}();
    for (const std::optional<DType> autocast : {std::optional<DType>{}, std::optional<DType>{DType::bf16}}) {
        INFO((autocast ? "autocast bf16" : "f32") << ", seed " << seed);
        cuda::clear_fusion_log();
        const StepResult unfused = dropout_mlp_step(false, autocast, seed);
        const std::size_t captures = replay_stats().captures;
        const StepResult fused = dropout_mlp_step(true, autocast, seed);
        for (const cuda::FusionLogEntry& entry : cuda::fusion_log()) {
            INFO(entry.kernel << ": " << entry.reason);
            CHECK(entry.kind != cuda::FusionLogEntry::Kind::CompileFallback);
            CHECK(entry.kind != cuda::FusionLogEntry::Kind::CheckMismatch);
            CHECK(entry.kind != cuda::FusionLogEntry::Kind::GraphDiffers);
        }
        REQUIRE(fused.stats.captures == captures + 1);
        WARN((autocast ? "autocast bf16" : "f32") << " with dropout, kernels per captured step: " << unfused.kernels
                                                   << " unfused, " << fused.kernels << " fused");
        CHECK(fused.kernels < unfused.kernels);
        REQUIRE(fused.values.size() == unfused.values.size());
        for (std::size_t i = 0; i < fused.values.size(); ++i) {
            INFO("value " << i << (i < 5 ? " (a run's loss)" : " (a parameter)"));
            if (i < 5) CHECK(equal_to_rounding(fused.values[i], unfused.values[i]));
            else CHECK(bitwise_equal(fused.values[i], unfused.values[i]));
        }
        for (std::size_t i = 1; i < 5; ++i) CHECK_FALSE(bitwise_equal(unfused.values[i], unfused.values[i - 1]));
    }
}

namespace {

// A step whose host counter changes the graph its capture records (the second run) from its warm-up's (the first).
Tensor counted_step(ComputeGraph& graph, const Tensor& input, const Parameter& w, const Parameter& b, int call,
                    bool change_member) {
    const Var pre = add(matmul(graph.input(input), graph.parameter(w)), graph.parameter(b));
    Var h = mul_scalar(call == 2 && change_member ? sigmoid(pre) : relu(pre), 2.0);
    if (call == 2 && !change_member) h = neg(h);  // after the group: its kernel still computes what it planned
    const Var loss = mean(h);
    graph.backward(loss);
    return loss.value();
}

}  // namespace

// A capture that records another graph than its warm-up: a node after the groups (neg), or a member itself
// (sigmoid for relu, after the group's first member was recorded and its kernel skipped). Either way the plan's
// kernels run only where the capture matches, the skipped members get their values, and the step equals the same
// step captured without fusion, bit for bit; the difference is logged.
TEST_CASE("a capture that differs from its warm-up lets its plan go where it differs: the unfused values",
          "[gpu][fusion][capture]") {
    for (const bool change_member : {false, true}) {
        const std::uint64_t seed = std::random_device{}();
        INFO((change_member ? "a member differs" : "a node after the groups differs") << ", seed " << seed);
        const auto run = [&](bool fusion) {
            set_fusion_enabled(fusion);
            Generator gen(seed);
            const Parameter w(Tensor::uniform({16, 32}, -0.5, 0.5, gen).to(kGpu), "w");
            const Parameter b(Tensor::uniform({32}, -0.5, 0.5, gen).to(kGpu), "b");
            int calls = 0;
            cuda::CapturedStep step([&](std::span<const Tensor> in) {
                ComputeGraph graph;
                return counted_step(graph, in[0], w, b, ++calls, change_member);
            });
            const Tensor x = Tensor::uniform({8, 16}, -1.0, 1.0, gen).to(kGpu);
            step.run(std::span<const Tensor>(&x, 1));
            step.run(std::span<const Tensor>(&x, 1));  // the capture records the other graph
            const Tensor out = step.run(std::span<const Tensor>(&x, 1)).to(Device::cpu());
            std::vector<Tensor> values{out, w.grad().to(Device::cpu()), b.grad().to(Device::cpu())};
            set_fusion_enabled(false);
            return values;
        };
        cuda::clear_fusion_log();
        const std::vector<Tensor> unfused = run(false);
        const std::vector<Tensor> fused = run(true);
        bool differs_logged = false;
        for (const cuda::FusionLogEntry& entry : cuda::fusion_log())
            differs_logged = differs_logged || (entry.kind == cuda::FusionLogEntry::Kind::GraphDiffers &&
                                                entry.reason.find(change_member ? "sigmoid" : "neg") != std::string::npos);
        CHECK(differs_logged);
        CHECK(equal_to_rounding(fused[0], unfused[0]));  // the loss, a mean
        for (std::size_t i = 1; i < fused.size(); ++i) {
            INFO("value " << i);
            CHECK(bitwise_equal(fused[i], unfused[i]));
        }
    }
}

// ---- eager steps: the forward's generated kernels once a graph's signature repeats ----
namespace {

struct EagerRun {
    std::vector<Tensor> values;  // each step's early-read member, then the parameters, on the CPU
    std::vector<Tensor> losses;  // each step's (a mean: the generated kernel's own order of additions)
    ReplayStats stats;
};

// Six eager SGD steps of the two-layer MLP of mlp_step. `read_member`: from step 3 on, the ReLU's output (a member
// whose group has one more member, the scalar multiply) is read before that member is recorded. `diverge_at`: that
// step records sigmoid in place of the ReLU (the plan made from the earlier steps no longer applies).
EagerRun eager_mlp(bool fusion, std::uint64_t seed, bool read_member, int diverge_at) {
    set_fusion_enabled(fusion);
    const ReplayStats before = replay_stats();
    Generator gen(seed);
    const std::vector<Parameter> params = mlp_parameters(gen);
    SGD sgd(params, {.lr = 0.05});
    const Tensor x = Tensor::uniform({33, 48}, -1.0, 1.0, gen).to(kGpu);
    EagerRun out;
    for (int step = 1; step <= 6; ++step) {
        ComputeGraph graph;
        const Var pre = add(matmul(graph.input(x, "x"), graph.parameter(params[0])), graph.parameter(params[1]));
        const Var act = step == diverge_at ? sigmoid(pre) : relu(pre);
        if (read_member && step >= 3) out.values.push_back(act.value().to(Device::cpu()));
        const Var h = mul_scalar(act, 0.5);
        const Var o = sigmoid(add(matmul(h, graph.parameter(params[2])), graph.parameter(params[3])));
        const Var loss = mean(mul(o, o));
        graph.backward(loss);
        sgd.step();
        sgd.zero_grad();
        out.losses.push_back(loss.value().to(Device::cpu()));
    }
    for (const Parameter& p : params) out.values.push_back(p.value().to(Device::cpu()));
    cuda::synchronize(0);
    const ReplayStats after = replay_stats();
    out.stats.eager_graphs_fused = after.eager_graphs_fused - before.eager_graphs_fused;
    out.stats.plans_let_go = after.plans_let_go - before.plans_let_go;
    set_fusion_enabled(false);
    return out;
}

}  // namespace

TEST_CASE("eager steps run the generated forward once their graph repeats: the unfused values bit for bit",
          "[gpu][fusion][eager]") {
    const std::uint64_t seed = std::random_device{}();
    struct Case {
        const char* what;
        bool read_member;
        int diverge_at;
        std::size_t fused_graphs;  // of the six steps: the third on (the second backward makes the signature repeat)
        std::size_t let_go;
    };
    for (const Case& c : {Case{"plain", false, 0, 4, 0}, Case{"a member read early", true, 0, 4, 0},
                          Case{"step 4 records sigmoid for the ReLU", false, 4, 3, 1}}) {
        INFO(c.what << ", seed " << seed);
        const EagerRun unfused = eager_mlp(false, seed, c.read_member, c.diverge_at);
        const EagerRun fused = eager_mlp(true, seed, c.read_member, c.diverge_at);
        CHECK(unfused.stats.eager_graphs_fused == 0);
        CHECK(fused.stats.eager_graphs_fused == c.fused_graphs);
        CHECK(fused.stats.plans_let_go == c.let_go);
        REQUIRE(fused.values.size() == unfused.values.size());
        for (std::size_t i = 0; i < fused.values.size(); ++i) {
            INFO("value " << i);
            CHECK(bitwise_equal(fused.values[i], unfused.values[i]));
        }
        for (std::size_t i = 0; i < fused.losses.size(); ++i) {
            INFO("the loss of step " << i + 1);
            CHECK(equal_to_rounding(fused.losses[i], unfused.losses[i]));
        }
    }
}

// ---- backward chains in eager steps (graph/fusion_replay.h, BackwardFusion): every differentiable formula ----
namespace {

// No generated kernel failed to compile or disagreed with its unfused kernels (DYNGRAD_CHECK_FUSIONS=1) since the
// log was cleared.
void check_nothing_fell_back() {
    for (const cuda::FusionLogEntry& entry : cuda::fusion_log()) {
        INFO(entry.kernel << ": " << entry.reason);
        CHECK(entry.kind != cuda::FusionLogEntry::Kind::CheckMismatch);
        CHECK(entry.kind != cuda::FusionLogEntry::Kind::CompileFallback);
    }
}

struct EagerGradients {
    std::vector<Tensor> grads;  // the inputs', on the CPU
    Tensor value;               // the value compared (the chain's last, or the loss), on the CPU
    std::size_t chains_run = 0;
    std::size_t graphs_fused = 0;
};

// What one step records: the loss it back-propagates, the value compared, the inputs whose gradients are kept.
struct EagerStep {
    Var loss;
    Var value;
    std::vector<Var> inputs;
};

// Three eager steps of `record` with fusion on or off (the first backward plans and compiles, every backward runs
// the chains when fusion is on, the third step's forward runs the generated kernels: its signature has repeated):
// the third step's value and gradients and the replay counters' deltas.
EagerGradients three_eager_steps(bool fusion, const std::function<EagerStep(ComputeGraph&)>& record) {
    set_fusion_enabled(fusion);
    const ReplayStats before = replay_stats();
    EagerGradients out;
    for (int step = 0; step < 3; ++step) {
        ComputeGraph graph;
        const EagerStep recorded = record(graph);
        graph.backward(recorded.loss);
        if (step == 2) {
            out.value = recorded.value.value().to(Device::cpu());
            for (const Var& v : recorded.inputs) out.grads.push_back(v.grad().to(Device::cpu()));
        }
    }
    cuda::synchronize(0);
    out.chains_run = replay_stats().backward_chains_run - before.backward_chains_run;
    out.graphs_fused = replay_stats().eager_graphs_fused - before.eager_graphs_fused;
    set_fusion_enabled(false);
    return out;
}

// A chain through every differentiable pointwise row, its values kept in each formula's domain: the value compared
// is the chain's last.
EagerGradients every_formula_step(bool fusion, DType dtype, const std::vector<Tensor>& data) {
    return three_eager_steps(fusion, [&](ComputeGraph& graph) {
        const Var x = graph.input(data[0], "x", true);
        const Var b = graph.input(data[1], "b", true);
        const Var c = graph.input(data[2], "c", true);  // broadcast over the rows
        const Var d = graph.input(data[3], "d", true);  // in (1, 2): a safe divisor
        Var t = sigmoid(add(x, c));
        t = sqrt(log(add_scalar(exp(t), 1.0)));
        t = relu(cos(sin(abs(t))));
        t = softsign(log_sigmoid(silu(softplus(tanh(neg(t))))));
        t = clamp(gelu(gelu(clipped_relu(elu(leaky_relu(pow(mul_scalar(add_scalar(t, 0.5), 1.5), 2.0), 0.1), 0.9), 4.0)),
                       GeluApproximation::Tanh),
                  -1.0, 3.0);
        // Routed gradients: where by a comparison and by a condition that requires grad (a zero gradient for d),
        // masked_fill by a comparison's mask.
        t = masked_fill(where(gt(t, x), t, mul_scalar(t, 0.25)), lt(t, b), -0.75);
        t = where(add_scalar(d, -1.5), t, neg(t));
        t = minimum(maximum(div(mul(sub(t, x), x), d), x), b);
        if (dtype != DType::f64) t = to_dtype(to_dtype(t, dtype == DType::f32 ? DType::bf16 : DType::f32), dtype);
        const Var loss = sum(to_dtype(t, dtype == DType::f64 ? DType::f64 : DType::f32));
        return EagerStep{loss, t, {x, b, c, d}};
    });
}

}  // namespace

// Each member's gradient is rounded as its unfused kernel stores it and the sums run in the sweep's order, so the
// gradients are expected bit for bit (c's is the add's gradient summed over the rows by the same sum_to).
TEST_CASE("eager steps through every formula: the generated forward and chains give the unfused values and gradients",
          "[gpu][fusion][backward]") {
    const std::uint64_t seed = std::random_device{}();
    Generator gen(seed);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        INFO(dtype_name(dtype) << ", seed " << seed);
        const std::vector<Tensor> data = {random({37, 130}, dtype, gen), random({37, 130}, dtype, gen),
                                          random({130}, dtype, gen),
                                          Tensor::uniform({37, 130}, 1.0, 2.0, gen).to(dtype).to(kGpu)};
        cuda::clear_fusion_log();
        const EagerGradients unfused = every_formula_step(false, dtype, data);
        const EagerGradients fused = every_formula_step(true, dtype, data);
        CHECK(unfused.chains_run == 0);
        // One chain in each of the three backward passes (DYNGRAD_CHECK_FUSIONS=1 compares it in the first and
        // would drop it on a difference), the generated forward in the third step.
        check_nothing_fell_back();
        CHECK(fused.chains_run == 3);
        CHECK(fused.graphs_fused == 1);
        CHECK(unfused.graphs_fused == 0);
        CHECK(backward_mismatch(fused.value.to(kGpu), unfused.value.to(kGpu), /*same_order=*/true).empty());
        for (std::size_t i = 0; i < 4; ++i) {
            const std::string mismatch =
                backward_mismatch(fused.grads[i].to(kGpu), unfused.grads[i].to(kGpu), /*same_order=*/true);
            INFO("the gradient of " << "xbcd"[i] << ": " << mismatch);
            CHECK(mismatch.empty());
        }
    }
}

namespace {

// matmul → ReLU → sum (the lone ReLU grouped for its backward) and a mean over the last axis of tanh(0.5·product),
// squared and summed: three eager steps, the last one's gradients.
EagerGradients reduction_steps(bool fusion, const Tensor& x_data, const Tensor& w_data) {
    return three_eager_steps(fusion, [&](ComputeGraph& graph) {
        const Var x = graph.input(x_data, "x", true);
        const Var w = graph.input(w_data, "w", true);
        const Var product = matmul(x, w);
        const Var row_means = mean(tanh(mul_scalar(product, 0.5)), {-1});
        const Var loss = add(sum(relu(product)), sum(mul(row_means, row_means)));
        return EagerStep{loss, loss, {x, w}};
    });
}

}  // namespace

// The reductions' expand runs inside the chains (ops/reduce.cu's expand_kernel is dy · scale rounded once, as the
// chain computes it), and from the third step the forward kernels end in the sums and means.
TEST_CASE("groups that end in a sum or mean, forward and backward: the unfused values to rounding",
          "[gpu][fusion][backward]") {
    const std::uint64_t seed = std::random_device{}();
    Generator gen(seed);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        INFO(dtype_name(dtype) << ", seed " << seed);
        const Tensor x = random({33, 70}, dtype, gen), w = random({70, 20}, dtype, gen);
        cuda::clear_fusion_log();
        const EagerGradients unfused = reduction_steps(false, x, w);
        const EagerGradients fused = reduction_steps(true, x, w);
        check_nothing_fell_back();
        CHECK(unfused.chains_run == 0);
        CHECK(fused.chains_run == 9);  // three chains a step: ReLU + sum, mul_scalar + tanh + mean, mul + sum
        CHECK(fused.graphs_fused == 1);  // the third step's forward: each group's kernel ends in its sum or mean
        // The sums and the means in the generated kernels add in their own order: the loss and, through the row
        // means, the gradients agree to rounding.
        CHECK(equal_to_rounding(fused.value, unfused.value));
        for (std::size_t i = 0; i < 2; ++i) {
            const std::string mismatch =
                backward_mismatch(fused.grads[i].to(kGpu), unfused.grads[i].to(kGpu), /*same_order=*/false);
            INFO("the gradient of " << "xw"[i] << ": " << mismatch);
            CHECK(mismatch.empty());
        }
    }
}

// ---- row programs: reductions read back over their rows (docs/fusion.md, "Row programs") ----
namespace {

// A layer norm written out, then a softmax written out against its own max, then a matmul and a sum: two row
// programs (three passes and two) with the max's kernel between them. The norm's 1 / sqrt(var + eps), a row member,
// is read outside too (through a matmul with v): its gradient comes into the norm's backward.
EagerGradients written_norm_softmax_steps(bool fusion, const Tensor& x_data, const Tensor& weight_data,
                                          const Tensor& w_data, const Tensor& v_data) {
    return three_eager_steps(fusion, [&](ComputeGraph& graph) {
        const Var x = graph.input(x_data, "x", true);
        const Var weight = graph.input(weight_data, "weight", true);
        const Var w = graph.input(w_data, "w", true);
        const Var centred = sub(x, mean(x, {-1}, true));
        const Var inverse = pow(add_scalar(mean(mul(centred, centred), {-1}, true), 1e-5), -0.5);
        const Var normed = mul(mul(centred, inverse), weight);
        const Var exps = exp(sub(normed, max(normed, -1, true)));
        const Var probs = div(exps, sum(exps, {-1}, true));
        const Var loss = add(sum(matmul(probs, w)), sum(matmul(inverse, graph.input(v_data, "v"))));
        return EagerStep{loss, probs, {x, weight, w}};
    });
}

}  // namespace

TEST_CASE("row programs (a norm and a softmax written out), forward and backward: the unfused values to rounding",
          "[gpu][fusion][rows]") {
    const std::uint64_t seed = std::random_device{}();
    Generator gen(seed);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        INFO(dtype_name(dtype) << ", seed " << seed);
        const Tensor x = random({37, 300}, dtype, gen), weight = random({300}, dtype, gen), w = random({300, 5}, dtype, gen),
                     v = random({1, 2}, dtype, gen);
        // The generated kernels alone on the unfused values: each pass-0 value bitwise, what follows a row's sums to
        // rounding (relative to the element or 1; the sums of 300 terms in another order).
        {
            set_fusion_enabled(false);
            ComputeGraph graph;
            const Var xv = graph.input(x, "x", true);
            const Var centred = sub(xv, mean(xv, {-1}, true));
            const Var inverse = pow(add_scalar(mean(mul(centred, centred), {-1}, true), 1e-5), -0.5);
            const Var normed = mul(mul(centred, inverse), graph.input(weight, "weight"));
            const Var exps = exp(sub(normed, max(normed, -1, true)));
            static_cast<void>(div(exps, sum(exps, {-1}, true)));
            const FusionPlan plan = plan_fusion(graph);
            REQUIRE(plan.groups.size() == 2);
            for (const FusionGroup& group : plan.groups) CHECK(group.row_program);
            check_plan(graph, dtype == DType::f32 || dtype == DType::f64 ? 512.0 : 4.0, /*every_member=*/true);
        }
        cuda::clear_fusion_log();
        const EagerGradients unfused = written_norm_softmax_steps(false, x, weight, w, v);
        const EagerGradients fused = written_norm_softmax_steps(true, x, weight, w, v);
        check_nothing_fell_back();
        CHECK(unfused.graphs_fused == 0);
        CHECK(fused.graphs_fused == 1);  // the third step's forward: two kernels for the two programs
        CHECK(fused.chains_run > 0);     // the programs' segments keep their backward chains
        CHECK(equal_to_rounding(fused.value, unfused.value));
        for (std::size_t i = 0; i < 3; ++i) {
            const std::string mismatch =
                backward_mismatch(fused.grads[i].to(kGpu), unfused.grads[i].to(kGpu), /*same_order=*/false);
            INFO("the gradient of " << (i == 0 ? "x" : i == 1 ? "weight" : "w") << ": " << mismatch);
            CHECK(mismatch.empty());
        }
    }
}

namespace {

// The written-out layer norm and softmax of written_norm_softmax_steps with a weight and a projection trained by SGD
// in a captured step: warm-up, capture, three replays.
StepResult written_norm_step(bool fusion, std::uint64_t seed) {
    set_fusion_mode(fusion ? FusionMode::Captured : FusionMode::Off);
    Generator gen(seed);
    const std::vector<Parameter> params = {Parameter(Tensor::uniform({300}, 0.5, 1.5, gen).to(kGpu), "weight"),
                                           Parameter(Tensor::uniform({300, 5}, -1.0, 1.0, gen).to(kGpu), "w")};
    SGD sgd(params, {.lr = 0.05});
    const std::size_t chains_before = replay_stats().backward_chains_run;
    cuda::CapturedStep step([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var x = graph.input(in[0], "x", true);
        const Var centred = sub(x, mean(x, {-1}, true));
        const Var inverse = pow(add_scalar(mean(mul(centred, centred), {-1}, true), 1e-5), -0.5);
        const Var normed = mul(mul(centred, inverse), graph.parameter(params[0]));
        const Var exps = exp(sub(normed, max(normed, -1, true)));
        const Var probs = div(exps, sum(exps, {-1}, true));
        const Var loss = sum(matmul(probs, graph.parameter(params[1])));
        graph.backward(loss);
        sgd.step();
        sgd.zero_grad();
        return loss.value();
    });
    return five_runs(step, Tensor::uniform({37, 300}, -2.0, 2.0, gen).to(kGpu), params, chains_before);
}

}  // namespace

TEST_CASE("a captured step of row programs: their forward and backward kernels, the unfused values to rounding",
          "[gpu][fusion][rows][capture]") {
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    cuda::clear_fusion_log();
    const StepResult unfused = written_norm_step(false, seed);
    const StepResult fused = written_norm_step(true, seed);
    check_nothing_fell_back();
    CHECK(fused.stats.last_groups == 2);
    // Each program's backward is one kernel in the warm-up's sweep and the capture's.
    CHECK(fused.chains_run == 4);
    WARN("row programs, kernels per captured step: " << unfused.kernels << " unfused, " << fused.kernels << " fused");
    CHECK(fused.kernels + 10 <= unfused.kernels);
    REQUIRE(fused.values.size() == unfused.values.size());
    for (std::size_t i = 0; i < fused.values.size(); ++i) {
        INFO("value " << i << " (the loss, then the weight and w after five SGD steps)");
        CHECK(equal_to_rounding(fused.values[i], unfused.values[i]));
    }
}
