// The fusion compiler's backward chains on the CPU (graph/fusion_plan.h BackwardLaunch, ops/fusion_source.h
// generate_backward_source, docs/fusion.md "Backward chains"): what one backward pass from a given root reaches of a
// group, where in the reverse sweep its kernel runs, and what the generated kernel loads, computes and stores.
// Compiling those sources: tests/fusion/test_fusion_nvrtc.cpp; running them against the unfused backward on a GPU:
// tests/fusion/test_gpu_fusion.cpp.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/ops/fusion_source.h"
#include "fusion_test_support.h"

using namespace dyngrad;
using namespace dyngrad::fusion;
using namespace fusion_test;

namespace {

BackwardLaunch launch_for(const ComputeGraph& graph, const FusionPlan& plan, std::size_t group, const Var& root) {
    const std::vector<char> reached = reached_by_backward(graph, root.id());
    const std::optional<BackwardLaunch> launch = backward_launch(graph, plan, group, reached, root.id());
    REQUIRE(launch.has_value());
    return *launch;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("backward chain of bias add + ReLU: one kernel reads the add's output and the ReLU's gradient",
          "[fusion][backward]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const Var x = graph.input(random({64, 32}, gen), "x");
    const Var w = graph.input(random({32, 16}, gen), "w", true);
    const Var b = graph.input(random({16}, gen), "b", true);
    const Var pre = matmul(x, w);
    const Var biased = add(pre, b);
    const Var hidden = relu(biased);
    const Var reader = matmul(hidden, graph.input(random({16, 8}, gen), "w2"));  // ends the group
    const Var loss = mean(reader);
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const BackwardLaunch launch = launch_for(graph, plan, 0, loss);
    CHECK(launch.members == ids({hidden, biased}));
    CHECK(launch.gradients_in == ids({hidden}));
    CHECK(launch.saved_reads == ids({biased}));
    CHECK(launch.gradients_out == ids({pre, b}));
    // It runs once the matmul (the only reader outside) has given ReLU's gradient, before anything older.
    CHECK(launch.run_before == reader.id() - 1);

    const FusedBackwardSource source = generate_backward_source(graph, plan.groups[0], launch);
    const std::string& s = source.source;
    INFO(s);
    CHECK(source.name == "dg_fused_" + cuda::hex64(source.hash));
    CHECK(source.saved == ids({biased}));
    CHECK(source.gradients_in == ids({hidden}));
    CHECK(contains(s, str("const float x", biased.id(), " = dg_load(")));
    CHECK(contains(s, str("const float d", hidden.id(), " = dg_load(")));
    CHECK(contains(s, str("dg_as_float32(d", hidden.id(), " * dyngrad::math::apply_derivative<dyngrad::math::ReluOp>(x",
                          biased.id(), ", x", biased.id())));
    // add passes its gradient through to both inputs: one store, which the matmul output and the bias share (the
    // sweep sums the bias's over the batch).
    REQUIRE(source.results.size() == 2);
    CHECK(source.stores == ids({pre}));
    CHECK(source.results[0].store == 0);
    CHECK(source.results[1].store == 0);
    CHECK(source.results[1].input == b.id());
    CHECK(source.results[0].contributions == 1);
    CHECK(contains(s, "float* __restrict__ out0"));
    CHECK_FALSE(contains(s, "out1"));
    CHECK(source.vector_width == 4);
    CHECK(contains(s, "dg_load(l0.v[k])"));
    CHECK(contains(s, "dg_load(l1.v[k])"));
}

TEST_CASE("backward chain: fan-out inside the group is summed in the sweep's order and rounded as it stores",
          "[fusion][backward]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const Var h = graph.input(random({8, 24}, gen), "h", true);
    const Var s = sigmoid(h);
    const Var m = mul(s, s);  // both inputs the same member: two gradients into s
    const Var scaled = mul_scalar(m, 3.0);
    const Var loss = sum(scaled);
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const BackwardLaunch launch = launch_for(graph, plan, 0, loss);
    CHECK(launch.members == ids({loss, scaled, m, s}));  // the loss's sum taken over
    CHECK(launch.gradients_in == ids({loss}));
    CHECK(launch.saved_reads == ids({h, s}));  // mul reads both operands (s), sigmoid its input
    CHECK(launch.gradients_out == ids({h}));
    const FusedBackwardSource source = generate_backward_source(graph, plan.groups[0], launch);
    const std::string& text = source.source;
    INFO(text);
    CHECK(contains(text, "MulScalarOp>(float(0), float(0), s0)"));  // its derivative is the scalar argument
    REQUIRE(source.scalars.size() == 1);
    CHECK(source.scalars[0].node == scaled.id());
    CHECK(contains(text, str("MulOp::d_a(x", s.id(), ", x", s.id(), ")")));
    CHECK(contains(text, str("MulOp::d_b(x", s.id(), ", x", s.id(), ")")));
    CHECK(contains(text, str("  // sum into #", s.id())));
    CHECK(contains(text, str("SigmoidOp>(x", h.id())));
    REQUIRE(source.results.size() == 1);
    CHECK(source.results[0].contributions == 1);
    CHECK(source.results[0].store == 0);
}

TEST_CASE("backward chain from another root: only what that pass reaches, the root's own gradient loaded",
          "[fusion][backward]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const Var x = graph.input(random({6, 10}, gen), "x", true);
    const Var c = graph.input(random({10}, gen), "c", true);
    const Var a = add(x, c);
    const Var r = relu(a);
    const Var d = mul_scalar(a, 2.0);  // a second output of the group
    const Var loss1 = sum(r);
    const Var loss2 = sum(d);
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    CHECK(plan.groups[0].members == ids({a, r, d, loss1}));  // it ends in r's sum (one reduction per group)
    SECTION("a backward from the first loss does not reach the second output") {
        const BackwardLaunch launch = launch_for(graph, plan, 0, loss1);
        CHECK(launch.members == ids({loss1, r, a}));  // r's one reader, a sum, is taken over
        CHECK(launch.gradients_in == ids({loss1}));
        CHECK(launch.run_before == loss1.id());
    }
    SECTION("a backward from the second loss reaches both outputs' chains through its reader") {
        const BackwardLaunch launch = launch_for(graph, plan, 0, loss2);
        CHECK(launch.members == ids({loss2, d, a}));
        CHECK(launch.gradients_in == ids({loss2}));
        CHECK(launch.gradients_out == ids({x, c}));
    }
    SECTION("a backward from a member: the root's seed is its incoming gradient, the chain runs first") {
        const BackwardLaunch launch = launch_for(graph, plan, 0, r);
        CHECK(launch.members == ids({r, a}));
        CHECK(launch.gradients_in == ids({r}));
        CHECK(launch.run_before == r.id());
    }
    SECTION("members that need no gradient are not in the chain") {
        ComputeGraph other;
        const Var u = other.input(random({4, 4}, gen), "u");  // no gradient wanted
        const Var v = relu(add_scalar(u, 1.0));
        const Var w = other.input(random({4, 4}, gen), "w", true);
        const Var product = mul(v, w);
        const Var total = sum(product);
        const FusionPlan p = plan_fusion(other);
        INFO(p.describe(other));
        REQUIRE(p.groups.size() == 1);
        CHECK(p.groups[0].members.size() == 4);  // add_scalar, relu, mul and the sum it ends in
        const BackwardLaunch launch = launch_for(other, p, 0, total);
        CHECK(launch.members == ids({total, product}));
        CHECK(launch.gradients_out == ids({w}));
        CHECK(launch.saved_reads == ids({v, w}));
        // A backward from a node the group does not feed reaches none of it.
        const Var separate = sum(w);
        const std::vector<char> reached = reached_by_backward(other, separate.id());
        CHECK_FALSE(backward_launch(other, p, 0, reached, separate.id()).has_value());
    }
}

TEST_CASE("backward chain of adds only: every gradient is an incoming one passed through, no kernel",
          "[fusion][backward]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const Var a = graph.input(random({5, 7}, gen), "a", true);
    const Var b = graph.input(random({5, 7}, gen), "b", true);
    const Var c = graph.input(random({7}, gen), "c", true);
    const Var total = add(add(a, b), c);
    const Var loss = sum(max(total, 1));  // max is not taken over: total's gradient comes in as it is
    const FusionPlan plan = plan_fusion(graph);
    REQUIRE(plan.groups.size() == 1);
    const BackwardLaunch launch = launch_for(graph, plan, 0, loss);
    const FusedBackwardSource source = generate_backward_source(graph, plan.groups[0], launch);
    CHECK(source.name.empty());
    CHECK(source.source.empty());
    REQUIRE(source.results.size() == 3);
    for (const FusedBackwardSource::Result& r : source.results) {
        CHECK(r.store < 0);
        CHECK(r.gradient_in == 0);
    }
    SECTION("under a sum the incoming gradient has one element: the chain stores it broadcast, once") {
        ComputeGraph other;
        const Var p = other.input(random({5, 7}, gen), "p", true);
        const Var q = other.input(random({5, 7}, gen), "q", true);
        const Var summed = sum(add(p, q));
        const FusionPlan plan2 = plan_fusion(other);
        REQUIRE(plan2.groups.size() == 1);
        const FusedBackwardSource stored =
            generate_backward_source(other, plan2.groups[0], launch_for(other, plan2, 0, summed));
        INFO(stored.source);
        CHECK_FALSE(stored.name.empty());
        REQUIRE(stored.results.size() == 2);
        for (const FusedBackwardSource::Result& r : stored.results) {
            CHECK(r.gradient_in < 0);
            CHECK(r.store == 0);
        }
    }
}

TEST_CASE("backward chain under bf16 autocast: each cast's gradient rounds to the input's dtype", "[fusion][backward]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const Var x = graph.input(random({8, 32}, gen), "x");
    const Var w = graph.input(random({16, 32}, gen), "w", true);
    const Var residual = graph.input(random({8, 16}, gen), "residual", true);
    Var stream;
    {
        AutocastGuard autocast(DType::bf16);
        const Var branch = linear(x, w);  // bf16
        stream = add(residual, to_dtype(branch, DType::f32));
    }
    const Var loss = sum(mul(stream, stream));
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const BackwardLaunch launch = launch_for(graph, plan, 0, loss);
    const FusedBackwardSource source = generate_backward_source(graph, plan.groups[0], launch);
    INFO(source.source);
    CHECK(contains(source.source, "dg_as_bfloat16("));        // the cast back to the branch's bf16
    CHECK(contains(source.source, "dg_bf16* __restrict__ out"));
    CHECK(contains(source.source, "const float* __restrict__ in"));
}
