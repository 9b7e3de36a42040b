// The captured-step hook's pure parts (graph/fusion_replay.h): where each group's generated kernel launches as a
// step records its nodes, and the error a capture that records another graph than its warm-up gets. The hook
// itself runs only while a CUDA graph is captured: tests/fusion/test_gpu_fusion.cpp.
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_replay.h"

using namespace dyngrad;
using namespace dyngrad::fusion;

namespace {

Tensor random(const Shape& shape, Generator& gen) { return Tensor::uniform(shape, -1.0, 1.0, gen); }

FusionPlan plan_of(std::vector<std::vector<NodeId>> groups) {
    FusionPlan plan;
    for (auto& members : groups) {
        FusionGroup group;
        group.members = std::move(members);
        plan.groups.push_back(std::move(group));
    }
    return plan;
}

std::vector<std::vector<NodeId>> node_inputs(const ComputeGraph& graph) {
    std::vector<std::vector<NodeId>> out;
    for (NodeId id = 0; id < graph.size(); ++id) {
        out.emplace_back();
        for (const NodeInput& input : graph.node(id).inputs) out.back().push_back(input.id);
    }
    return out;
}

std::vector<std::string> node_signatures(const ComputeGraph& graph) {
    std::vector<std::string> out;
    for (NodeId id = 0; id < graph.size(); ++id) out.push_back(node_signature(graph, id));
    return out;
}

}  // namespace

TEST_CASE("a group launches right after its last member when nothing outside reads it earlier", "[fusion][replay]") {
    // 0, 1 leaves; 2 = f(0, 1), 3 = g(2) form the group; 4 reads 3.
    const FusionPlan plan = plan_of({{2, 3}});
    const std::vector<std::vector<NodeId>> inputs = {{}, {}, {0, 1}, {2}, {3}};
    CHECK(schedule_launches(plan, inputs) == std::vector<LaunchEvent>{{0, 3, false}});
    // Nothing reads the group: still launched after its last member (a step result).
    CHECK(schedule_launches(plan, std::span(inputs).first(4)) == std::vector<LaunchEvent>{{0, 3, false}});
}

TEST_CASE("an outside reader between two members launches the group before it, once", "[fusion][replay]") {
    // 2 and 4 form the group, 3 (outside) reads 2: the kernel must have run before 3, so it launches there (4's
    // output is allocated then; its node takes it when recorded), and not again after 4.
    const FusionPlan plan = plan_of({{2, 4}});
    const std::vector<std::vector<NodeId>> inputs = {{}, {}, {0, 1}, {2}, {2, 1}, {4}};
    CHECK(schedule_launches(plan, inputs) == std::vector<LaunchEvent>{{0, 3, true}});
    LaunchTracker tracker(plan);
    CHECK(tracker.group_of(2) == 0);
    CHECK(tracker.group_of(3) == -1);
    CHECK(tracker.group_of(40) == -1);
    CHECK(tracker.before(2, inputs[2]).empty());  // a member reading the group's external inputs
    CHECK_FALSE(tracker.after(2));                // not the last member
    CHECK(tracker.before(3, inputs[3]) == std::vector<std::size_t>{0});
    CHECK(tracker.launched(0));
    CHECK(tracker.before(4, inputs[4]).empty());
    CHECK_FALSE(tracker.after(4));  // already launched
}

TEST_CASE("members interleaved with unrelated nodes launch once, after the last member", "[fusion][replay]") {
    // Group {2, 5, 7}; 3, 4 and 6 read only the leaves; 8 reads 5 and 7.
    const FusionPlan plan = plan_of({{2, 5, 7}});
    const std::vector<std::vector<NodeId>> inputs = {{}, {}, {0}, {1}, {3}, {2, 1}, {4}, {5, 6}, {5, 7}};
    CHECK(schedule_launches(plan, inputs) == std::vector<LaunchEvent>{{0, 7, false}});
}

TEST_CASE("a member of one group reading a member of another launches that one first", "[fusion][replay]") {
    // Group 0 {2, 4}, group 1 {3, 5}; 3 reads 2 (another group's member): group 0 launches before 3, group 1
    // after 5; 6 reads both, already launched.
    const FusionPlan plan = plan_of({{2, 4}, {3, 5}});
    const std::vector<std::vector<NodeId>> inputs = {{}, {}, {0}, {2, 1}, {2}, {3}, {4, 5}};
    CHECK(schedule_launches(plan, inputs) == std::vector<LaunchEvent>{{0, 3, true}, {1, 5, false}});
}

TEST_CASE("the schedule of a recorded graph's plan", "[fusion][replay]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const Var x = graph.input(random({16, 8}, gen), "x");
    const Var b = graph.input(random({8}, gen), "b", true);
    const Var a = add(x, b);                 // member
    const Var total = sum(a, {1}, true);     // reads a, outside the group
    const Var r = relu(a);                   // member, after the outside reader
    const Var scaled = mul_scalar(r, 0.5);   // member, the last
    const Var out = mul(scaled, total);      // broadcasts (16, 1) along its rows: with the sum, a row program
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 2);
    CHECK(plan.groups[0].members == std::vector<NodeId>{a.id(), r.id(), scaled.id()});
    CHECK(plan.groups[1].members == std::vector<NodeId>{total.id(), out.id()});
    CHECK(plan.groups[1].row_program);
    const auto inputs = node_inputs(graph);
    // The first kernel before the sum reads its member; the row program after its last member.
    CHECK(schedule_launches(plan, inputs) == std::vector<LaunchEvent>{{0, total.id(), true}, {1, out.id(), false}});
}

TEST_CASE("the message of a graph that differs from the one its plan was made from", "[fusion][replay]") {
    Generator gen(std::random_device{}());
    const auto step = [&](ComputeGraph& graph, std::int64_t width, bool extra) {
        const Var x = graph.input(random({4, width}, gen), "x", true);
        Var y = relu(mul_scalar(x, 2.0));
        if (extra) y = neg(y);
        return sum(y);
    };
    ComputeGraph warm_up, same, wider, longer;
    step(warm_up, 6, false);
    step(same, 6, false);
    step(wider, 7, false);
    step(longer, 6, true);
    CHECK(graph_signature(warm_up) == graph_signature(same));
    CHECK(graph_mismatch_message(node_signatures(warm_up), node_signatures(same)).empty());

    const std::string shape = graph_mismatch_message(node_signatures(warm_up), node_signatures(wider));
    INFO(shape);
    CHECK(shape.find("the graph recorded differs from the one its fusion plan was made from") != std::string::npos);
    CHECK(shape.find("(4 nodes recorded, 4 in the plan's graph)") != std::string::npos);
    CHECK(shape.find("node #0: '0 (4,7) float32 cpu g' recorded, '0 (4,6) float32 cpu g' in the plan's graph") !=
          std::string::npos);

    const std::string count = graph_mismatch_message(node_signatures(warm_up), node_signatures(longer));
    INFO(count);
    CHECK(count.find("(5 nodes recorded, 4 in the plan's graph)") != std::string::npos);
    CHECK(count.find("node #3: '") != std::string::npos);
    CHECK(count.find("neg") != std::string::npos);
    // A graph that stops early: the plan's node is named, the graph has none.
    std::vector<std::string> shorter = node_signatures(warm_up);
    shorter.pop_back();
    CHECK(graph_mismatch_message(node_signatures(warm_up), shorter).find("node #3: (none) recorded") !=
          std::string::npos);
}

TEST_CASE("graph_signature is every node's signature followed by ';'", "[fusion][replay]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const Var x = graph.input(random({3, 5}, gen), "x", true);
    const Var y = sum(exp(x));
    std::string joined;
    for (const std::string& node : node_signatures(graph)) joined += node + ";";
    CHECK(joined == graph_signature(graph));
    CHECK(node_signature(graph, y.id()).find("sum") != std::string::npos);
}

TEST_CASE("fusion on a CPU graph plans nothing and changes no result", "[fusion][replay]") {
    Generator gen(std::random_device{}());
    const Tensor xv = random({8, 6}, gen), bv = random({6}, gen);
    const auto gradient = [&](bool fusion) {
        set_fusion_enabled(fusion);
        ComputeGraph graph;
        const Var x = graph.input(xv, "x", true);
        const Var b = graph.input(bv, "b", true);
        graph.backward(sum(mul_scalar(relu(add(x, b)), 3.0)));
        return x.grad().to_vector();
    };
    const FusionMode from_environment = fusion_settings().mode;
    const ReplayStats before = replay_stats();
    const std::vector<double> fused = gradient(true);
    const std::vector<double> unfused = gradient(false);
    set_fusion_mode(from_environment);
    CHECK(fused == unfused);
    CHECK(replay_stats().plans == before.plans);  // only graphs on CUDA devices are planned
    CHECK_FALSE(fusion::detail::replay_armed());
}
