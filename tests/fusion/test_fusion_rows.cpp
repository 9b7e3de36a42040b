// Row programs of the fusion compiler on the CPU (graph/fusion_plan.h, ops/fusion_source.h, docs/fusion.md "Row
// programs"): a reduction read back over its own rows joins its readers into one kernel of several passes (a norm
// and a softmax written out of pointwise ops, sums and means), the groups stay the backward's segments, and what may
// not join (other rows, a reduction broadcast along the other axis) stays apart. Compiling the sources with NVRTC:
// tests/fusion/test_fusion_nvrtc.cpp.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/ops/fusion_source.h"
#include "fusion_test_support.h"

using namespace dyngrad;
using namespace dyngrad::fusion;
using namespace fusion_test;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A layer norm over the last axis written out: mean, centre, variance, 1 / sqrt(var + eps), scale and shift.
struct WrittenNorm {
    Var x, weight, bias, mu, centred, squared, variance, shifted, inverse, normalised, scaled, y;
    WrittenNorm(ComputeGraph& graph, const Shape& shape, Generator& gen) {
        x = graph.input(random(shape, gen), "x", true);
        weight = graph.input(random({shape.back()}, gen), "weight", true);
        bias = graph.input(random({shape.back()}, gen), "bias", true);
        mu = mean(x, {-1}, true);
        centred = sub(x, mu);
        squared = mul(centred, centred);
        variance = mean(squared, {-1}, true);
        shifted = add_scalar(variance, 1e-5);
        inverse = pow(shifted, -0.5);
        normalised = mul(centred, inverse);
        scaled = mul(normalised, weight);
        y = add(scaled, bias);
    }
};

// The backward launch of a plan's one kernel, a row program, from `loss`; nullopt (after a failed check) otherwise.
std::optional<BackwardLaunch> only_program_launch(const ComputeGraph& graph, const FusionPlan& plan, const Var& loss) {
    REQUIRE(plan.groups.size() == 1);
    return program_backward_launch(graph, plan, 0, reached_by_backward(graph, loss.id()), loss.id());
}

}  // namespace

TEST_CASE("a layer norm written out: one row program of three passes; its groups stay the backward's", "[fusion][rows]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const WrittenNorm norm(graph, {24, 40}, gen);
    const Var loss = sum(matmul(norm.y, graph.input(random({40, 3}, gen), "w")));
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const FusionGroup& kernel = plan.groups[0];
    CHECK(kernel.row_program);
    CHECK(kernel.members == ids({norm.mu, norm.centred, norm.squared, norm.variance, norm.shifted, norm.inverse,
                                 norm.normalised, norm.scaled, norm.y}));
    CHECK(kernel.shape == Shape{24, 40});
    CHECK(kernel.row_shape == Shape{24, 1});
    CHECK(kernel.row_members == ids({norm.shifted, norm.inverse}));
    REQUIRE(kernel.reductions.size() == 2);
    CHECK(kernel.reductions[0].node == norm.mu.id());
    CHECK(kernel.reductions[0].input == norm.x.id());  // an external input summed in the first pass
    CHECK(kernel.reductions[1].node == norm.variance.id());
    CHECK(kernel.reductions[0].rows == 24);
    CHECK(kernel.reductions[0].row_length == 40);
    CHECK(kernel.passes == 3);  // the mean; the variance; the output
    CHECK(member_passes(graph, kernel) == std::vector<int>{0, 1, 1, 1, 2, 2, 2, 2, 2});
    CHECK(kernel.inputs == ids({norm.x, norm.weight, norm.bias}));
    CHECK(plan.launches_saved() == 8);  // nine kernels become one
    // Written: what the unfused backward and the chains read (the centred values, the variance plus eps for pow's
    // derivative, the inverse, the normalised values for the weight's gradient) and the output the matmul reads.
    CHECK(output_nodes(kernel) == ids({norm.centred, norm.shifted, norm.inverse, norm.normalised, norm.y}));
    CHECK(kernel.member_shape(norm.mu.id()) == Shape{24, 1});
    CHECK(kernel.member_shape(norm.inverse.id()) == Shape{24, 1});
    CHECK(kernel.member_shape(norm.y.id()) == Shape{24, 40});
    // Three segments, each its own backward chain: the centring with the variance, the row values, the affine part.
    REQUIRE(plan.segments.size() == 3);
    CHECK(kernel.segments == std::vector<std::size_t>{0, 1, 2});
    CHECK(plan.segments[0].members == ids({norm.centred, norm.squared, norm.variance}));
    CHECK(plan.segments[1].members == ids({norm.shifted, norm.inverse}));
    CHECK(plan.segments[2].members == ids({norm.normalised, norm.scaled, norm.y}));
    for (const FusionGroup& segment : plan.segments) CHECK_FALSE(segment.row_program);
    const std::vector<char> reached = reached_by_backward(graph, loss.id());
    for (std::size_t s = 0; s < plan.segments.size(); ++s) {
        INFO("segment " << s);
        const std::optional<BackwardLaunch> launch = backward_launch(graph, plan, s, reached, loss.id());
        REQUIRE(launch.has_value());
        CHECK(launch->group == s);
        CHECK_NOTHROW(generate_backward_source(graph, plan.segments[s], *launch));
    }

    const FusedKernelSource source = generate_fused_source(graph, kernel);
    INFO(source.source);
    CHECK(source.numel == 24 * 256);  // a block per row
    CHECK(source.vector_width == 1);
    CHECK(source.outputs == output_nodes(kernel));
    CHECK(contains(source.source, "constexpr long long row_length = 40LL;"));
    CHECK(contains(source.source, "// pass 0"));
    CHECK(contains(source.source, "// pass 2"));
    CHECK_FALSE(contains(source.source, "// pass 3"));
    // The mean of x is summed from the loaded input, then every thread holds it for the next passes.
    CHECK(contains(source.source, str("acc", norm.mu.id(), " = acc", norm.mu.id(), " + v0;")));
    CHECK(contains(source.source, str("t", norm.mu.id(), " = dg_as_float32(partial[0] / float(40LL));")));
    CHECK(contains(source.source, str("acc", norm.variance.id(), " = acc", norm.variance.id(), " + t", norm.squared.id(), ";")));
    // The row values: computed once per row, stored by one thread.
    CHECK(contains(source.source, str("t", norm.inverse.id(), " = dg_as_float32(dyngrad::math::apply_forward<dyngrad::math::PowScalarOp>(t",
                                      norm.shifted.id())));
    const int inverse_store = static_cast<int>(std::find(source.outputs.begin(), source.outputs.end(), norm.inverse.id()) -
                                               source.outputs.begin());
    CHECK(contains(source.source, str("out", inverse_store, "[row] = dg_store_float32(t", norm.inverse.id(), ");")));
    // The output is stored in the last pass only; the centred values in the pass that first computes them.
    const int y_store = static_cast<int>(source.outputs.size()) - 1;
    const std::size_t last_pass = source.source.find("// pass 2");
    CHECK(source.source.find(str("out", y_store, "[i] = ")) > last_pass);
    CHECK(source.source.find(str("out0[i] = dg_store_float32(t", norm.centred.id(), ")")) < last_pass);
    CHECK(source.source.find(str("out0[i] = dg_store_float32(t", norm.centred.id(), ")"), last_pass) == std::string::npos);
    // Each member of the plan's kernel written (the hook's form) keeps one store per member.
    const FusedKernelSource every = generate_fused_source(graph, with_every_member_written(kernel));
    CHECK(every.outputs == kernel.members);
}

TEST_CASE("a softmax written out against its own max: subtraction, exp, sum and division in one kernel of two passes",
          "[fusion][rows]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const Var x = graph.input(random({8, 50}, gen), "x", true);
    const Var peak = max(x, -1, true);  // saves its argmax for its backward: its own kernel, an input of the program
    const Var shifted = sub(x, peak);
    const Var exps = exp(shifted);
    const Var total = sum(exps, {-1}, true);
    const Var probs = div(exps, total);
    const Var loss = sum(matmul(probs, graph.input(random({50, 4}, gen), "w")));
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const FusionGroup& kernel = plan.groups[0];
    CHECK(kernel.row_program);
    CHECK(kernel.members == ids({shifted, exps, total, probs}));
    CHECK(kernel.inputs == ids({x, peak}));
    CHECK(kernel.passes == 2);
    CHECK(kernel.row_members.empty());
    // The division is a lone node: not a segment, its backward runs unfused (it reads the exps and the sums).
    REQUIRE(plan.segments.size() == 1);
    CHECK(plan.segments[0].members == ids({shifted, exps, total}));
    const std::vector<NodeId> written = output_nodes(kernel);
    for (NodeId id : ids({exps, total, probs})) CHECK(std::find(written.begin(), written.end(), id) != written.end());
    const FusedKernelSource source = generate_fused_source(graph, kernel);
    INFO(source.source);
    CHECK(source.numel == 8 * 256);
    // The max is an input of the row's shape: read per element by the row index.
    CHECK(contains(source.source, "dg_load(in1[(i / 50LL)])"));
    CHECK(contains(source.source, "// pass 1"));
    CHECK(contains(source.source, str("dyngrad::math::DivOp::forward(t", exps.id(), ", t", total.id(), ")")));
    static_cast<void>(loss);
}

TEST_CASE("what does not join a row program: other rows, a reduction broadcast along the other axis, a row of one",
          "[fusion][rows]") {
    Generator gen(std::random_device{}());
    SECTION("a sum without its kept axis read back broadcasts along the columns: two kernels") {
        ComputeGraph graph;
        const Var x = graph.input(random({5, 5}, gen), "x", true);
        const Var squashed = tanh(x);
        const Var row_sums = sum(squashed, {-1});  // (5): broadcast against (5, 5) it runs along the columns
        const Var centred = sub(squashed, row_sums);
        static_cast<void>(sum(matmul(exp(centred), graph.input(random({5, 2}, gen), "w"))));
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        for (const FusionGroup& group : plan.groups) {
            CHECK_FALSE(group.row_program);
            const bool both = std::find(group.members.begin(), group.members.end(), row_sums.id()) != group.members.end() &&
                              std::find(group.members.begin(), group.members.end(), centred.id()) != group.members.end();
            CHECK_FALSE(both);
        }
    }
    SECTION("a mean over the last axis read back by a kernel that sums over every axis: two kernels") {
        ComputeGraph graph;
        const Var x = graph.input(random({6, 5}, gen), "x", true);
        const Var squashed = tanh(x);
        const Var centred = sub(squashed, mean(squashed, {-1}, true));
        static_cast<void>(sum(exp(centred)));
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        REQUIRE(plan.groups.size() == 2);
        for (const FusionGroup& group : plan.groups) CHECK_FALSE(group.row_program);
        CHECK(plan.segments.size() == 2);
    }
    SECTION("rows of one element: the kept shape is the full shape, no row program") {
        ComputeGraph graph;
        const Var x = graph.input(random({6, 1}, gen), "x", true);
        const Var squashed = tanh(x);
        const Var centred = sub(squashed, mean(squashed, {-1}, true));
        static_cast<void>(sum(matmul(exp(centred), graph.input(random({1, 2}, gen), "w"))));
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        for (const FusionGroup& group : plan.groups) CHECK_FALSE(group.row_program);
    }
}

TEST_CASE("a norm whose output is summed over the same rows: a reduction in the last pass", "[fusion][rows]") {
    Generator gen(std::random_device{}());
    ComputeGraph graph;
    const WrittenNorm norm(graph, {3, 64}, gen);
    const Var row_energy = mean(mul(norm.y, norm.y), {-1}, true);
    const Var loss = sum(matmul(row_energy, graph.input(random({1, 2}, gen), "w")));
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const FusionGroup& kernel = plan.groups[0];
    CHECK(kernel.passes == 3);
    REQUIRE(kernel.reductions.size() == 3);
    CHECK(kernel.reductions[2].node == row_energy.id());
    const std::vector<int> passes = member_passes(graph, kernel);
    CHECK(passes.back() == 2);  // summed in the pass that computes the output
    const FusedKernelSource source = generate_fused_source(graph, kernel);
    INFO(source.source);
    CHECK_FALSE(contains(source.source, "// pass 3"));
    CHECK(contains(source.source, str("out", source.outputs.size() - 1, "[row] = dg_store_float32(t", row_energy.id(), ");")));
    // Its backward: the row value read outside brings its gradient in, one per row, loaded by the row index.
    const std::vector<char> reached = reached_by_backward(graph, loss.id());
    const std::optional<BackwardLaunch> launch = program_backward_launch(graph, plan, 0, reached, loss.id());
    REQUIRE(launch.has_value());
    CHECK(launch->gradients_in == ids({row_energy}));
    const FusedBackwardSource backward = generate_backward_source(graph, kernel, *launch);
    INFO(backward.source);
    CHECK(contains(backward.source, str("const float d", row_energy.id(), " = dg_load(in")));
    CHECK(contains(backward.source, str("gr", row_energy.id(), " = d", row_energy.id(), ";")));
    CHECK(contains(backward.source, "// backward pass 2"));
}

TEST_CASE("a row program's backward is one kernel: the passes in reverse, the row values' gradients summed per row",
          "[fusion][rows][backward]") {
    Generator gen(std::random_device{}());
    SECTION("the layer norm: three passes back, the input's gradient stored in the last, the weight's summed later") {
        ComputeGraph graph;
        const WrittenNorm norm(graph, {24, 40}, gen);
        const Var product = matmul(norm.y, graph.input(random({40, 3}, gen), "w"));
        const Var loss = sum(product);
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        const std::optional<BackwardLaunch> launch = only_program_launch(graph, plan, loss);
        REQUIRE(launch.has_value());
        CHECK(launch->program);
        CHECK(&launch_group(plan, *launch) == &plan.groups[0]);
        std::vector<NodeId> reversed = plan.groups[0].members;
        std::reverse(reversed.begin(), reversed.end());
        CHECK(launch->members == reversed);
        CHECK(launch->gradients_in == ids({norm.y}));
        CHECK(launch->gradients_out == ids({norm.bias, norm.weight, norm.x}));
        CHECK(launch->run_before == product.id() - 1);
        const FusedBackwardSource source = generate_backward_source(graph, plan.groups[0], *launch);
        INFO(source.source);
        CHECK(source.numel == 24 * 256);
        CHECK(contains(source.source, "// backward pass 2"));
        CHECK(contains(source.source, "// backward pass 0"));
        CHECK_FALSE(contains(source.source, "// backward pass 3"));
        // The variance's gradient is a row sum of its readers' parts (pass 2 reads it), then the row members'
        // backward once per row; the mean's comes back through the centring in pass 1.
        CHECK(contains(source.source, str("gr", norm.inverse.id(), " = dg_as_float32(gr", norm.inverse.id(), " + partial[0]);")));
        CHECK(contains(source.source, str("gr", norm.mu.id(), " = dg_as_float32(gr", norm.mu.id(), " + partial[0]);")));
        CHECK(contains(source.source, str("gr", norm.variance.id(), " = dg_as_float32(gr", norm.variance.id())));
        REQUIRE(source.results.size() == 3);
        for (const FusedBackwardSource::Result& r : source.results) {
            CHECK_FALSE(r.row_summed);  // x in the group's shape; the weight and bias summed over rows by the sweep
            CHECK(r.store >= 0);
            CHECK(source.store_shapes.at(static_cast<std::size_t>(r.store)) == Shape{24, 40});
        }
        // Nothing is summed per row for an input: no magnitude stores even when asked.
        CHECK(generate_backward_source(graph, plan.groups[0], *launch, true).stores.size() == 3);
    }
    SECTION("the softmax: its max's gradient is a row sum stored per row, with its terms' magnitudes when checked") {
        ComputeGraph graph;
        const Var x = graph.input(random({8, 50}, gen), "x", true);
        const Var peak = max(x, -1, true);
        const Var exps = exp(sub(x, peak));
        const Var probs = div(exps, sum(exps, {-1}, true));
        const Var loss = sum(matmul(probs, graph.input(random({50, 4}, gen), "w")));
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        const std::optional<BackwardLaunch> launch = only_program_launch(graph, plan, loss);
        REQUIRE(launch.has_value());
        CHECK(launch->gradients_out == ids({x, peak}));  // the subtraction's operands, in order
        const FusedBackwardSource plain = generate_backward_source(graph, plan.groups[0], *launch);
        const FusedBackwardSource checked = generate_backward_source(graph, plan.groups[0], *launch, true);
        INFO(checked.source);
        REQUIRE(plain.results.size() == 2);
        CHECK_FALSE(plain.results[0].row_summed);
        CHECK(plain.results[1].row_summed);
        CHECK(plain.results[1].magnitude_store == -1);
        CHECK(plain.store_shapes.at(static_cast<std::size_t>(plain.results[1].store)) == Shape{8, 1});
        CHECK(plain.stores.size() == 2);
        REQUIRE(checked.results.size() == 2);
        const int magnitude = checked.results[1].magnitude_store;
        REQUIRE(magnitude >= 0);
        CHECK(checked.store_shapes.at(static_cast<std::size_t>(magnitude)) == Shape{8, 1});
        CHECK(checked.store_dtypes.at(static_cast<std::size_t>(magnitude)) == DType::f32);
        CHECK(contains(checked.source, "fabsf("));
        CHECK(plain.name != checked.name);
        CHECK(contains(plain.source, str("out", plain.results[1].store, "[row] = dg_store_float32(ge", peak.id(), ");")));
    }
    SECTION("no row program, or a row member's gradient to an input of another shape: no program launch") {
        ComputeGraph graph;
        const Var x = graph.input(random({6, 5}, gen), "x", true);
        const Var scale = graph.input(random({1}, gen), "scale", true);
        const Var total = sum(tanh(x), {-1}, true);
        const Var scaled = mul(total, scale);  // a row member reading a (1) input that requires grad
        const Var loss = sum(matmul(div(tanh(x), scaled), graph.input(random({5, 2}, gen), "w")));
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        const std::vector<char> reached = reached_by_backward(graph, loss.id());
        for (std::size_t g = 0; g < plan.groups.size(); ++g) {
            const std::optional<BackwardLaunch> launch = program_backward_launch(graph, plan, g, reached, loss.id());
            if (!plan.groups[g].row_program) CHECK_FALSE(launch.has_value());
            else if (std::find(plan.groups[g].members.begin(), plan.groups[g].members.end(), scaled.id()) !=
                     plan.groups[g].members.end())
                CHECK_FALSE(launch.has_value());
        }
    }
}
