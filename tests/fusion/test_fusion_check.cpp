// The fused-kernel check mode (graph/fusion_check.h): fused linear, conv2d and cross_entropy against their
// unfused compositions, forward and backward, on the CPU (CI) and on a GPU when one is present; a corrupted
// fused output must be caught.
#include <random>
#include <set>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

struct FusionCheckScope {
    FusionCheckScope() {
        clear_fusion_check_results();
        set_fusion_check(true);
    }
    ~FusionCheckScope() { set_fusion_check(false); }
};

// linear+ReLU, conv2d+bias+ReLU and cross_entropy, forward and backward on `device`, from fresh random inputs.
void run_fused_ops(Device device) {
    Generator gen(static_cast<std::uint64_t>(std::random_device{}()));
    ComputeGraph g;
    Var x = g.input(Tensor::normal({2, 3, 9, 8}, 0, 1, gen, DType::f32, device), "x", true);
    Var cw = g.input(Tensor::normal({4, 3, 3, 3}, 0, 0.3, gen, DType::f32, device), "cw", true);
    Var cb = g.input(Tensor::normal({4}, 0, 0.3, gen, DType::f32, device), "cb", true);
    Conv2dOptions relu;
    relu.padding = {1, 1};
    relu.activation = Activation::Relu;
    Var h = reshape(conv2d(x, cw, cb, relu), {2, 4 * 9 * 8});
    Var lw = g.input(Tensor::normal({5, 4 * 9 * 8}, 0, 0.1, gen, DType::f32, device), "lw", true);
    // A bias around 2 keeps the ReLU's outputs from all being zero (about 1 draw in 200 with a bias around 0,
    // which left nothing to compare: the check's scale was 0).
    Var lb = g.input(Tensor::normal({5}, 2.0, 0.1, gen, DType::f32, device), "lb", true);
    Var logits = linear(h, lw, lb, Activation::Relu);
    Var labels = g.input(Tensor::from_vector(std::vector<std::int64_t>{1, 4}, {2}, device));
    g.backward(cross_entropy(logits, labels));
}

void require_all_checked_and_agreeing() {
    const std::vector<FusionCheckResult> results = fusion_check_results();
    std::set<std::string> seen;
    for (const FusionCheckResult& r : results) {
        INFO(r.op << " " << r.pass << " " << r.key << ": " << r.max_abs_error << " of " << r.scale);
        CHECK(r.passed);
        CHECK(r.scale > 0);
        seen.insert(r.op + " " + (r.pass.starts_with("backward") ? "backward" : r.pass));
    }
    for (const char* expected : {"conv2d forward", "conv2d backward", "linear forward", "linear backward",
                                 "cross_entropy forward", "cross_entropy backward"})
        CHECK(seen.contains(expected));
}

}  // namespace

TEST_CASE("fusion check: fused ops agree with their unfused compositions on the CPU", "[fusion]") {
    const FusionCheckScope scope;
    run_fused_ops(Device::cpu());
    require_all_checked_and_agreeing();
    // First use per shape only: the same shapes again add no checks.
    const std::size_t count = fusion_check_results().size();
    run_fused_ops(Device::cpu());
    CHECK(fusion_check_results().size() == count);
}

TEST_CASE("fusion check: a wrong fused output is caught and named", "[fusion]") {
    const FusionCheckScope scope;
    Generator gen(static_cast<std::uint64_t>(std::random_device{}()));
    const Tensor x = Tensor::normal({4, 6}, 0, 1, gen, DType::f32);
    const Tensor w = Tensor::normal({3, 6}, 0, 1, gen, DType::f32);
    const Tensor b = Tensor::normal({3}, 0, 1, gen, DType::f32);
    const std::vector<Tensor> inputs{x, w, b};
    OpAttrs attrs;
    attrs.activation = Activation::Relu;
    // The right output, then one element off by 1% of the largest: the first must pass, the second throw.
    Tensor good = linear(x, w, b, Activation::Relu);
    std::vector<double> values = good.to_vector();
    REQUIRE_NOTHROW(detail::check_fused_forward(op_def(OpType::Linear), OpType::Linear, inputs, attrs, good));
    clear_fusion_check_results();
    double largest = 0;
    for (double v : values) largest = std::max(largest, std::fabs(v));
    values[values.size() / 2] += 0.01 * largest + 1e-3;
    const Tensor bad = Tensor::from_vector(values, good.shape(), DType::f32);
    REQUIRE_THROWS_MATCHES(detail::check_fused_forward(op_def(OpType::Linear), OpType::Linear, inputs, attrs, bad),
                           NumericalError, MessageHas({"fused-kernel check: linear forward", "disagrees"}));
    REQUIRE(fusion_check_results().size() == 1);
    CHECK_FALSE(fusion_check_results().front().passed);
}

TEST_CASE("fusion check: fused GPU kernels agree with their unfused compositions", "[fusion][gpu]") {
    if (cuda_device_count() == 0) DG_SKIP("no CUDA device");
    const FusionCheckScope scope;
    run_fused_ops(Device::cuda(0));
    require_all_checked_and_agreeing();
}
