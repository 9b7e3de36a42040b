// The fusion compiler's NVRTC back end (cuda/nvrtc_compiler.h, docs/fusion.md) without a GPU: generated sources
// compile to PTX and to an sm_90 cubin, the disk cache hits on the second compile and writes atomically, an
// unwritable or corrupt cache still compiles (logged once), and a source NVRTC rejects is a typed error or, through
// try_compile_fused_kernel, a logged fallback. Built wherever the CUDA toolkit is found (tests/CMakeLists.txt).
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "catch.h"
#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/ops/fusion_source.h"

using namespace dyngrad;
using namespace dyngrad::fusion;
using dyngrad::cuda::FusedKernelCompileOptions;
using dyngrad::cuda::ImageKind;

namespace {

namespace fs = std::filesystem;

Generator fresh_generator() { return Generator(std::random_device{}()); }
Tensor random(const Shape& shape, Generator& gen) { return Tensor::uniform(shape, -1.0, 1.0, gen); }

// A layer norm and a softmax written out of pointwise ops and row reductions over x (33, 70): two row programs with
// the max between them. The norm's 1 / sqrt(var + eps) (a row member) and the probabilities.
struct WrittenNormSoftmax {
    Var inverse, probs;
};
WrittenNormSoftmax written_norm_softmax(ComputeGraph& graph, DType dtype, Generator& gen) {
    const Var x = graph.input(random({33, 70}, gen).to(dtype), "x", true);
    const Var weight = graph.input(random({70}, gen).to(dtype), "weight", true);
    const Var centred = sub(x, mean(x, {-1}, true));
    const Var inverse = pow(add_scalar(mean(mul(centred, centred), {-1}, true), 1e-5), -0.5);
    const Var normed = mul(mul(centred, inverse), weight);
    const Var exps = exp(sub(normed, max(normed, -1, true)));
    return {inverse, div(exps, sum(exps, {-1}, true))};
}

// A fresh directory under the system's temporary one, removed at the end of the test.
struct TemporaryDirectory {
    fs::path path;
    TemporaryDirectory() {
        path = fs::temp_directory_path() / str("dyngrad-fusion-test-", std::random_device{}(), "-", std::random_device{}());
        fs::create_directories(path);
    }
    ~TemporaryDirectory() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
    }
};

// The kernel of the first group of a small graph: bias add, GELU (tanh form), a scalar multiply, in `dtype`.
FusedKernelSource sample_kernel(DType dtype, std::int64_t batch = 64, bool every_member = false) {
    Generator gen = fresh_generator();
    ComputeGraph graph;
    const Var x = graph.input(random({batch, 48}, gen).to(dtype), "x", true);
    const Var b = graph.input(random({48}, gen).to(dtype), "b", true);
    const Var y = mul_scalar(gelu(add(x, b), GeluApproximation::Tanh), 0.5);
    const Var z = clamp(leaky_relu(y, 0.1), -2.0, std::nullopt);
    // Over the batch: a column sum, which the group's kernel does not end in (an elementwise kernel).
    const Var loss = sum(to_dtype(z, DType::f64 == dtype ? DType::f64 : DType::f32), {0});
    const FusionPlan plan = plan_fusion(graph);
    REQUIRE(plan.groups.size() == 1);
    REQUIRE(plan.groups[0].reductions.empty());
    REQUIRE(loss.defined());
    return generate_fused_source(graph, every_member ? with_every_member_written(plan.groups[0]) : plan.groups[0]);
}

std::size_t count_entries(const fs::path& dir, const std::string& suffix) {
    std::size_t count = 0;
    for (const auto& entry : fs::directory_iterator(dir)) count += entry.path().string().ends_with(suffix);
    return count;
}

bool logged(cuda::FusionLogEntry::Kind kind) {
    for (const auto& entry : cuda::fusion_log())
        if (entry.kind == kind) return true;
    return false;
}

}  // namespace

TEST_CASE("generated kernels compile with NVRTC for f32, bf16, f16 and f64", "[fusion][nvrtc]") {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        const FusedKernelSource k = sample_kernel(dtype);
        INFO(dtype_name(dtype) << "\n" << k.source);
        const cuda::CompiledKernel ptx =
            cuda::compile_fused_kernel(k.source, k.name, {.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false});
        CHECK_FALSE(ptx.from_cache);
        CHECK(ptx.image.find(str(".entry ", k.name)) != std::string::npos);
        CHECK(ptx.compile_ms > 0.0);
    }
    // A cubin for the H200's architecture: what the CUDA build loads (no JIT at load time).
    const FusedKernelSource k = sample_kernel(DType::f32);
    const cuda::CompiledKernel cubin = cuda::compile_fused_kernel(k.source, k.name, {.arch = 90, .kind = ImageKind::Cubin, .cache_dir = {}, .use_cache = false});
    REQUIRE(cubin.image.size() > 4);
    CHECK(cubin.image.compare(0, 4, "\x7f" "ELF") == 0);
}

TEST_CASE("the disk cache: a miss compiles and writes atomically, a hit reads the same image", "[fusion][nvrtc]") {
    cuda::clear_fusion_log();
    TemporaryDirectory dir;
    const FusedKernelSource k = sample_kernel(DType::bf16);
    const FusedKernelCompileOptions options{.arch = 90, .kind = ImageKind::Ptx, .cache_dir = dir.path.string()};
    const cuda::CompiledKernel cold = cuda::compile_fused_kernel(k.source, k.name, options);
    CHECK_FALSE(cold.from_cache);
    CHECK(count_entries(dir.path, ".ptx") == 1);
    CHECK(count_entries(dir.path, ".tmp") == 0);  // no temporary left behind
    const cuda::CompiledKernel warm = cuda::compile_fused_kernel(k.source, k.name, options);
    CHECK(warm.from_cache);
    CHECK(warm.image == cold.image);
    // Another shape is another source: another entry, never the cached kernel of the first.
    const FusedKernelSource other = sample_kernel(DType::bf16, 32);
    CHECK(other.name != k.name);
    const cuda::CompiledKernel other_kernel = cuda::compile_fused_kernel(other.source, other.name, options);
    CHECK_FALSE(other_kernel.from_cache);
    CHECK(other_kernel.image.find(str(".entry ", other.name)) != std::string::npos);
    CHECK(count_entries(dir.path, ".ptx") == 2);

    // A truncated entry reads as a miss (logged), is compiled again and rewritten.
    for (const auto& entry : fs::directory_iterator(dir.path)) fs::resize_file(entry.path(), 20);
    const cuda::CompiledKernel again = cuda::compile_fused_kernel(k.source, k.name, options);
    CHECK_FALSE(again.from_cache);
    CHECK(again.image == cold.image);
    CHECK(logged(cuda::FusionLogEntry::Kind::CacheReadFailed));
    CHECK(cuda::compile_fused_kernel(k.source, k.name, options).from_cache);
}

TEST_CASE("an unwritable cache directory compiles in memory and logs once", "[fusion][nvrtc]") {
    cuda::clear_fusion_log();
    TemporaryDirectory dir;
    // A directory below a regular file can never be created, whoever runs the test (root included).
    const fs::path blocker = dir.path / "not-a-directory";
    std::ofstream(blocker) << "x";
    const FusedKernelSource k = sample_kernel(DType::f32);
    const FusedKernelCompileOptions options{.arch = 90, .kind = ImageKind::Ptx,
                                            .cache_dir = (blocker / "cache").string()};
    for (int i = 0; i < 2; ++i) {
        const cuda::CompiledKernel compiled = cuda::compile_fused_kernel(k.source, k.name, options);
        CHECK_FALSE(compiled.from_cache);
        CHECK(compiled.image.find(str(".entry ", k.name)) != std::string::npos);
    }
    int unwritable = 0;
    for (const auto& entry : cuda::fusion_log()) unwritable += entry.kind == cuda::FusionLogEntry::Kind::CacheUnwritable;
    CHECK(unwritable == 1);
}

TEST_CASE("a source NVRTC rejects: a typed error, or a logged fallback to the unfused kernels", "[fusion][nvrtc]") {
    cuda::clear_fusion_log();
    const FusedKernelSource k = sample_kernel(DType::f32);
    // The test hook: a deliberately broken generated source (an undeclared name in the kernel body).
    std::string broken = k.source;
    const std::string marker = "constexpr long long n = ";
    broken.insert(broken.find(marker), "    undeclared_in_generated_source += 1;\n");
    const FusedKernelCompileOptions options{.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false};
    try {
        cuda::compile_fused_kernel(broken, k.name, options);
        FAIL("NVRTC accepted a broken source");
    } catch (const cuda::FusionCompileError& error) {
        CHECK(error.kernel() == k.name);
        CHECK(error.log().find("undeclared_in_generated_source") != std::string::npos);
    }
    CHECK_THROWS_AS(cuda::compile_fused_kernel(broken, k.name, options), CudaError);
    CHECK_FALSE(cuda::try_compile_fused_kernel(broken, k.name, options).has_value());
    const auto log = cuda::fusion_log();
    REQUIRE(log.size() == 1);
    CHECK(log[0].kind == cuda::FusionLogEntry::Kind::CompileFallback);
    CHECK(log[0].kernel == k.name);
    CHECK(log[0].reason.find("unfused") != std::string::npos);
    CHECK(log[0].reason.find("undeclared_in_generated_source") != std::string::npos);
    // The intact source still compiles.
    CHECK(cuda::try_compile_fused_kernel(k.source, k.name, options).has_value());
}

TEST_CASE("the default cache directory follows the environment", "[fusion][nvrtc]") {
    const std::string dir = cuda::default_fusion_cache_dir();
    if (const char* explicit_dir = std::getenv("DYNGRAD_FUSION_CACHE_DIR"); explicit_dir && *explicit_dir)
        CHECK(dir == explicit_dir);
    else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
        CHECK(dir == str(xdg, "/dyngrad/fusion"));
    else if (const char* home = std::getenv("HOME"); home && *home)
        CHECK(dir == str(home, "/.cache/dyngrad/fusion"));
    CHECK_FALSE(cuda::nvrtc_version().empty());
}

TEST_CASE("the captured-step hook's kernels, every member written, compile for every dtype", "[fusion][nvrtc]") {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        const FusedKernelSource planned = sample_kernel(dtype);
        const FusedKernelSource all = sample_kernel(dtype, 64, true);
        INFO(dtype_name(dtype) << "\n" << all.source);
        CHECK(all.outputs.size() == 6);  // add, gelu, mul_scalar, leaky_relu, clamp, the cast
        CHECK(all.outputs.size() > planned.outputs.size());
        CHECK(all.name != planned.name);
        CHECK(all.source.find("out5") != std::string::npos);
        const cuda::CompiledKernel ptx = cuda::compile_fused_kernel(
            all.source, all.name, {.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false});
        CHECK(ptx.image.find(all.name) != std::string::npos);
    }
}

TEST_CASE("backward chains through every differentiable pointwise row compile for every dtype", "[fusion][nvrtc]") {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        Generator gen = fresh_generator();
        ComputeGraph graph;
        const Var x = graph.input(random({16, 40}, gen).to(dtype), "x", true);
        const Var b = graph.input(random({40}, gen).to(dtype), "b", true);
        Var t = add(x, b);
        for (Var (*unary)(const Var&, Loc) : {&neg<Var>, &exp<Var>, &log<Var>, &sqrt<Var>, &abs<Var>, &sin<Var>,
                                              &cos<Var>, &relu<Var>, &sigmoid<Var>, &tanh<Var>, &softplus<Var>,
                                              &silu<Var>, &log_sigmoid<Var>, &softsign<Var>})
            t = unary(t, Loc::current());
        t = clamp(gelu(gelu(clipped_relu(elu(leaky_relu(pow(mul_scalar(add_scalar(t, 0.5), 1.5), 2.0), 0.1), 0.9), 4.0)),
                       GeluApproximation::Tanh),
                  -1.0, 3.0);
        // where with a condition that requires grad (its gradient is zero), masked_fill with a comparison's mask
        t = masked_fill(where(add_scalar(t, -0.25), t, mul_scalar(t, 0.25)), gt(t, x), -2.0);
        t = minimum(maximum(div(mul(sub(t, x), x), x), x), b);
        if (dtype != DType::f64) t = to_dtype(to_dtype(t, dtype == DType::f32 ? DType::bf16 : DType::f32), dtype);
        const Var loss = sum(to_dtype(t, dtype == DType::f64 ? DType::f64 : DType::f32));
        const FusionPlan plan = plan_fusion(graph);
        INFO(dtype_name(dtype) << "\n" << plan.describe(graph));
        REQUIRE(plan.groups.size() == 1);
        const std::vector<char> reached = reached_by_backward(graph, loss.id());
        const std::optional<BackwardLaunch> launch = backward_launch(graph, plan, 0, reached, loss.id());
        REQUIRE(launch.has_value());
        // all but the comparison (no grad); the loss's sum is a member (the kernel ends in it)
        CHECK(launch->members.size() == plan.groups[0].members.size() - 1);
        const FusedBackwardSource source = generate_backward_source(graph, plan.groups[0], *launch);
        INFO(source.source);
        for (const char* functor : {"NegOp", "ExpOp", "LogOp", "SqrtOp", "AbsOp", "SinOp", "CosOp", "ReluOp", "SigmoidOp",
                                    "TanhOp", "SoftplusOp", "SiluOp", "LogSigmoidOp", "SoftsignOp", "MulScalarOp",
                                    "PowScalarOp", "LeakyReluOp", "EluOp", "ClippedReluOp", "GeluOp", "GeluTanhOp",
                                    "ClampOp"})
            CHECK(source.source.find(str("apply_derivative<dyngrad::math::", functor, ">")) != std::string::npos);
        CHECK(source.source.find("(the condition's gradient is zero)") != std::string::npos);
        CHECK(source.source.find("masked_fill #") != std::string::npos);
        for (const char* functor : {"SubOp::d_b", "MulOp::d_a", "MulOp::d_b", "DivOp::d_a", "DivOp::d_b",
                                    "MaximumOp::d_a", "MaximumOp::d_b", "MinimumOp::d_a", "MinimumOp::d_b"})
            CHECK(source.source.find(functor) != std::string::npos);
        // x gets its gradient from add, sub, mul, div and maximum; b from minimum, then add (broadcast).
        REQUIRE(source.results.size() == 2);
        CHECK(source.results[0].input == b.id());
        CHECK(source.results[0].contributions == 2);
        CHECK(source.results[1].input == x.id());
        CHECK(source.results[1].contributions == 5);
        const cuda::CompiledKernel ptx = cuda::compile_fused_kernel(
            source.source, source.name, {.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false});
        CHECK(ptx.image.find(str(".entry ", source.name)) != std::string::npos);
        // And the same group's forward, every member written (the hook's kernel).
        const FusedKernelSource forward = generate_fused_source(graph, with_every_member_written(plan.groups[0]));
        const cuda::CompiledKernel forward_ptx = cuda::compile_fused_kernel(
            forward.source, forward.name, {.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false});
        CHECK(forward_ptx.image.find(str(".entry ", forward.name)) != std::string::npos);
    }
}

TEST_CASE("a plan's kernels compile as one translation unit, each under its own name", "[fusion][nvrtc]") {
    std::vector<std::string> sources, names;
    for (const auto& [dtype, batch] : {std::pair{DType::f32, 64}, std::pair{DType::bf16, 64}, std::pair{DType::f16, 33},
                                       std::pair{DType::f32, 7}}) {
        const FusedKernelSource k = sample_kernel(dtype, batch, batch == 7);
        sources.push_back(k.source);
        names.push_back(k.name);
    }
    {  // and a backward chain
        Generator gen = fresh_generator();
        ComputeGraph graph;
        const Var x = graph.input(random({9, 12}, gen), "x", true);
        const Var loss = sum(mul_scalar(sigmoid(x), 3.0));
        const FusionPlan plan = plan_fusion(graph);
        REQUIRE(plan.groups.size() == 1);
        const std::vector<char> reached = reached_by_backward(graph, loss.id());
        const FusedBackwardSource chain =
            generate_backward_source(graph, plan.groups[0], *backward_launch(graph, plan, 0, reached, loss.id()));
        sources.push_back(chain.source);
        names.push_back(chain.name);
    }
    const std::string unit = combined_source(sources);
    INFO(unit);
    // The prelude and formulas once, every kernel after them.
    const std::string formulas(elementwise_math_source());
    CHECK(unit.find(formulas) != std::string::npos);
    CHECK(unit.find(formulas, unit.find(formulas) + 1) == std::string::npos);
    const cuda::CompiledKernel ptx = cuda::compile_fused_kernel(
        unit, "dg_plan_test", {.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false});
    for (const std::string& name : names) CHECK(ptx.image.find(str(".entry ", name)) != std::string::npos);
    CHECK_THROWS_AS(combined_source(std::vector<std::string>{}), ValueError);
    CHECK_THROWS_AS(combined_source(std::vector<std::string>{"int x;"}), ValueError);
}

TEST_CASE("kernels that end in a row sum or mean compile for every dtype", "[fusion][nvrtc]") {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        Generator gen = fresh_generator();
        ComputeGraph graph;
        const Var x = graph.input(random({33, 70}, gen).to(dtype), "x", true);
        const Var row_means = mean(tanh(mul_scalar(x, 0.5)), {-1}, true);
        const FusionPlan plan = plan_fusion(graph);
        INFO(dtype_name(dtype) << "\n" << plan.describe(graph));
        REQUIRE(plan.groups.size() == 1);
        REQUIRE(plan.groups[0].reductions.size() == 1);
        CHECK(plan.groups[0].member_shape(row_means.id()) == Shape{33, 1});
        const FusedKernelSource k = generate_fused_source(graph, with_every_member_written(plan.groups[0]));
        INFO(k.source);
        CHECK(k.numel == 33 * 256);  // a block per row
        CHECK(k.source.find("__shared__") != std::string::npos);
        const cuda::CompiledKernel ptx = cuda::compile_fused_kernel(
            k.source, k.name, {.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false});
        CHECK(ptx.image.find(str(".entry ", k.name)) != std::string::npos);
    }
}

TEST_CASE("row programs (a layer norm and a softmax written out) compile for every dtype", "[fusion][nvrtc]") {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        Generator gen = fresh_generator();
        ComputeGraph graph;
        const Var probs = written_norm_softmax(graph, dtype, gen).probs;
        const FusionPlan plan = plan_fusion(graph);
        INFO(dtype_name(dtype) << "\n" << plan.describe(graph));
        REQUIRE(plan.groups.size() == 2);  // the max between them is its own kernel
        CHECK(plan.groups[0].passes == 3);
        CHECK(plan.groups[1].passes == 2);
        CHECK(plan.groups[1].members.back() == probs.id());
        std::vector<std::string> sources, names;
        for (const FusionGroup& group : plan.groups) {
            REQUIRE(group.row_program);
            const FusedKernelSource k = generate_fused_source(graph, with_every_member_written(group));
            sources.push_back(k.source);
            names.push_back(k.name);
        }
        const std::string unit = combined_source(sources);
        INFO(unit);
        const cuda::CompiledKernel ptx = cuda::compile_fused_kernel(
            unit, "dg_rows_test", {.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false});
        for (const std::string& name : names) CHECK(ptx.image.find(str(".entry ", name)) != std::string::npos);
    }
}

TEST_CASE("a row program's backward (a layer norm and a softmax written out) compiles for every dtype",
          "[fusion][nvrtc][backward]") {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        Generator gen = fresh_generator();
        ComputeGraph graph;
        const WrittenNormSoftmax written = written_norm_softmax(graph, dtype, gen);
        // A row member read outside too (through a matmul): its gradient comes in, one per row.
        const Var loss = add(sum(matmul(written.probs, graph.input(random({70, 3}, gen).to(dtype), "w"))),
                             sum(matmul(written.inverse, graph.input(random({1, 2}, gen).to(dtype), "v"))));
        const FusionPlan plan = plan_fusion(graph);
        INFO(dtype_name(dtype) << "\n" << plan.describe(graph));
        REQUIRE(plan.groups.size() == 2);
        const std::vector<char> reached = reached_by_backward(graph, loss.id());
        std::vector<std::string> sources, names;
        for (std::size_t g = 0; g < plan.groups.size(); ++g) {
            const std::optional<BackwardLaunch> launch = program_backward_launch(graph, plan, g, reached, loss.id());
            REQUIRE(launch.has_value());
            if (g == 0)
                CHECK(std::find(launch->gradients_in.begin(), launch->gradients_in.end(), written.inverse.id()) !=
                      launch->gradients_in.end());
            for (bool magnitudes : {false, true}) {  // the norm sums no input per row: one kernel either way
                const FusedBackwardSource k = generate_backward_source(graph, plan.groups[g], *launch, magnitudes);
                if (std::find(names.begin(), names.end(), k.name) != names.end()) continue;
                sources.push_back(k.source);
                names.push_back(k.name);
            }
        }
        CHECK(names.size() == 3);
        const std::string unit = combined_source(sources);
        INFO(unit);
        const cuda::CompiledKernel ptx = cuda::compile_fused_kernel(
            unit, "dg_rows_backward_test", {.arch = 90, .kind = ImageKind::Ptx, .cache_dir = {}, .use_cache = false});
        for (const std::string& name : names) CHECK(ptx.image.find(str(".entry ", name)) != std::string::npos);
    }
}
