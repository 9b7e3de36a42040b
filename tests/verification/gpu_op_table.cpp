// GPU against the float64 CPU replay (graph/verify.h): every op-table case, large cases of the same ops
// (many blocks, grid-stride loops, ragged tails, big reductions), and the GPU twin of test_gradcheck's
// [subsets] test.
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp); the helpers several of its files share are in tests/support/gpu_support.h.
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "input_subsets.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;

namespace {

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

OpAttrs normalized_attr(Shape normalized_shape) {
    OpAttrs attrs;
    attrs.shape = std::move(normalized_shape);
    attrs.eps = 1e-5;
    return attrs;
}

struct LargeCase {
    const char* op;
    OpCase op_case;
};

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
        // Indexing: many threads adding into few destinations (atomics by default).
        {"embedding", {"(50000,256) weight, (64,128) indices", {{50000 / scale, 256}, {64, 128}}, axis_attr(0),
                       {D::Any, D::Indices}}},
        {"embedding", {"100 rows, 65536 indices", {{100, 64}, {65536 / scale}}, axis_attr(0), {D::Any, D::Indices}}},
        {"gather", {"(4096,1000) axis 1", {{k4096, 1000}, {k4096, 513}}, axis_attr(1), {D::Any, D::Indices}}},
        {"index_select", {"(4096,1000) axis 0", {{k4096, 1000}, {5000 / scale}}, axis_attr(0), {D::Any, D::Indices}}},
        {"scatter_add", {"(4096,1000) axis 1", {{k4096, 1000}, {k4096, 2000}, {k4096, 2000}}, axis_attr(1),
                         {D::Any, D::Indices, D::Any}}},
        {"where", {"(4096,4099) broadcast", {{k4096, 1}, {k4096, k4099}, {k4099}}, {}, {D::Mask, D::Any, D::Any}}},
        {"permute", {"(64,3,224,224) to NHWC", {{64 / scale, 3, 224 / scale, 224 / scale}}, axes_attr({0, 2, 3, 1}), {}}},
        // One warp per row, vector loads, many row chunks for dweight/dbias; one block per row with the row
        // partly re-read from memory (longer than the registers hold); scalar loads of an odd row.
        {"layer_norm", {"(4096,1024) affine", {{k4096, 1024}, {1024}, {1024}}, normalized_attr({1024}), {}}},
        {"layer_norm", {"(64,10000) affine", {{64, 10000}, {10000}, {10000}}, normalized_attr({10000}), {}}},
        {"layer_norm", {"(300,3001) no affine", {{300, 3001}}, normalized_attr({3001}), {}}},
        {"rms_norm", {"(4096,1024) weight", {{k4096, 1024}, {1024}}, normalized_attr({1024}), {}}},
        {"rms_norm", {"(64,10000) weight", {{64, 10000}, {10000}}, normalized_attr({10000}), {}}},
    };
}

}  // namespace

TEST_CASE("every op-table case matches the CPU on the GPU", "[gpu][verification][table]") {
    for (const OpDef& def : op_table()) {
        for (const OpCase& op_case : def.cases()) {
            DYNAMIC_SECTION(def.name << ": " << op_case.label) {
                // A case returns every device block it took, its first run included: plans, handles and
                // caches own no device memory, which nothing would return before exit (compute-sanitizer's
                // leak check once found one block per cuDNN RNN plan).
                const std::size_t in_use_before = cuda::memory_stats(0).bytes_in_use;
                const std::uint64_t seed = seed_for_name(kSeedBase, def.name);
                Generator gen(seed);
                const CheckResult r = gpu_vs_cpu_check(def, op_case, gen, kTolerance);
                INFO("seed " << seed << ": " << describe_result(r));
                CHECK(r.pass);
                CHECK(cuda::memory_stats(0).bytes_in_use == in_use_before);
            }
        }
    }
}

TEST_CASE("large cases match the CPU on the GPU", "[gpu][verification][large]") {
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

// The GPU twin of test_gradcheck's [subsets] test: each non-empty proper subset of a case's differentiable
// inputs requires grad in turn, on the GPU in float32, and those inputs' gradients must equal the GPU's
// all-inputs run (which the [table] test compares with the float64 CPU) while the others get none.
TEST_CASE("every op-table case gives an input subset the all-inputs gradients on the GPU", "[gpu][verification][subsets]") {
    // Same kernels on the same float32 inputs: they differ at most by the order of atomic or split
    // reductions (cuDNN's weight gradients, our chunked sums), a few ulps of a sum's terms; a skipped or extra
    // term is an O(1) relative error.
    constexpr double kSubsetTolerance = 1e-5;
    const std::span<const OpDef> table = op_table();
    for (std::size_t index = 0; index < table.size(); ++index) {
        const OpDef& def = table[index];
        for (const OpCase& op_case : def.cases()) {
            Generator gen(kSeedBase + 6000 + index);
            std::vector<Tensor> inputs;
            for (const Tensor& t : make_case_inputs(op_case, DType::f32, gen)) inputs.push_back(t.to(kGpu));
            const std::vector<std::size_t> differentiable = dgtest::differentiable_inputs(op_case, inputs);
            if (differentiable.size() < 2) continue;
            DYNAMIC_SECTION(def.name << ": " << op_case.label) {
                INFO("seed " << kSeedBase + 6000 + index);
                Tensor weights;
                {
                    ComputeGraph probe;
                    std::vector<Var> vars;
                    for (const Tensor& t : inputs) vars.push_back(probe.input(t));
                    const Var y = probe.record(def.op, vars, op_case.attrs, std::source_location::current());
                    weights = Tensor::normal(y.shape(), 0.0, 1.0, gen, DType::f32).to(kGpu);
                }
                const dgtest::SubsetPlan plan = dgtest::plan_grad_subsets(def, op_case, inputs, differentiable, weights);
                for (const std::size_t i : differentiable) REQUIRE(plan.reference.has_grad[i]);
                for (const std::vector<bool>& wants : plan.others) {
                    const dgtest::SubsetRun run = dgtest::run_with_grad_subset(def, op_case, inputs, wants, weights);
                    for (const std::size_t i : differentiable) {
                        INFO("input " << i << (wants[i] ? " requires grad" : " does not") << "; with it: "
                                      << std::count(wants.begin(), wants.end(), true) << " inputs requiring grad");
                        CHECK(run.requires_grad[i] == wants[i]);
                        CHECK(run.has_grad[i] == wants[i]);
                        if (wants[i] && run.has_grad[i]) {
                            CHECK(run.grads[i].device() == kGpu);
                            CHECK(relative_norm_error(run.grads[i], plan.reference.grads[i]) <= kSubsetTolerance);
                        }
                    }
                }
            }
        }
    }
}
