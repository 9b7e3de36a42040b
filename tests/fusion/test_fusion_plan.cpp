// The fusion compiler's grouping pass and source generation on the CPU (graph/fusion_plan.h, ops/fusion_source.h,
// docs/fusion.md): which groups form for fixed graphs, what must be written to memory, the backward chains, a new
// plan for new shapes, and the structure of the generated source. Compiling that source with NVRTC:
// tests/fusion/test_fusion_nvrtc.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/fusion_source.h"
#include "fusion_test_support.h"

using namespace dyngrad;
using namespace dyngrad::fusion;
using namespace fusion_test;

namespace {

Generator fresh_generator() { return Generator(std::random_device{}()); }

Materialise why(const FusionGroup& group, NodeId id) {
    for (const GroupOutput& o : group.outputs)
        if (o.node == id) return o.why;
    FAIL("node " << id << " is not an output of the group");
    return Materialise::StepResult;
}

// The MLP layer of the brief: matmul, bias add, ReLU, dropout, then the next layer and a loss.
struct Mlp {
    ComputeGraph graph;
    Var x, w1, b1, pre, biased, hidden, dropped, out, loss;
    Mlp(std::int64_t batch, Generator& gen) {
        x = graph.input(random({batch, 32}, gen), "x");
        w1 = graph.input(random({32, 16}, gen), "w1", true);
        b1 = graph.input(random({16}, gen), "b1", true);
        const Var w2 = graph.input(random({16, 8}, gen), "w2", true);
        pre = matmul(x, w1);
        biased = add(pre, b1);
        hidden = relu(biased);
        dropped = dropout(hidden, 0.25, true, std::uint64_t{1234});
        out = matmul(dropped, w2);
        loss = mean(out);
    }
};

}  // namespace

TEST_CASE("fusion fuses captured steps by default; the switch and DYNGRAD_FUSION's values", "[fusion]") {
    const FusionMode from_environment = fusion_settings().mode;
    if (const char* set = std::getenv("DYNGRAD_FUSION"); set == nullptr || *set == 0) CHECK(from_environment == FusionMode::Captured);
    CHECK(parse_fusion_mode("") == FusionMode::Captured);
    CHECK(parse_fusion_mode("captured") == FusionMode::Captured);
    CHECK(parse_fusion_mode("0") == FusionMode::Off);
    CHECK(parse_fusion_mode("off") == FusionMode::Off);
    CHECK(parse_fusion_mode("1") == FusionMode::All);
    CHECK(parse_fusion_mode("all") == FusionMode::All);
    CHECK(std::string(fusion_mode_name(FusionMode::Captured)) == "captured");
    set_fusion_enabled(true);
    CHECK(fusion_settings().mode == FusionMode::All);
    CHECK((fusion_settings().enabled && fusion_settings().eager));
    set_fusion_mode(FusionMode::Captured);
    CHECK((fusion_settings().enabled && !fusion_settings().eager));
    set_fusion_enabled(false);
    CHECK_FALSE(fusion_settings().enabled);
    CHECK_FALSE(fusion_settings().eager);
    set_fusion_mode(from_environment);
}

TEST_CASE("every pointwise row names a functor of the embedded formulas", "[fusion]") {
    const std::string text(elementwise_math_source());
    int pointwise = 0;
    for (const OpDef& def : op_table()) {
        if (def.pointwise == nullptr) continue;
        ++pointwise;
        INFO(def.name);
        const PointwiseFormula::Form form = def.pointwise->form;
        if (form == PointwiseFormula::Form::Cast || form == PointwiseFormula::Form::Where ||
            form == PointwiseFormula::Form::MaskedFill)
            continue;  // written by the generator itself (a rounding, a selection)
        if (form == PointwiseFormula::Form::Dropout) {  // math::dropout_apply, of the embedded ops/dropout_mask.h
            CHECK(std::string(dropout_mask_source()).find("DG_HOST_DEVICE T dropout_apply(") != std::string::npos);
            continue;
        }
        REQUIRE(def.pointwise->functor != nullptr);
        CHECK(text.find(str("struct ", def.pointwise->functor, " {")) != std::string::npos);
        if (def.pointwise->tanh_functor != nullptr)
            CHECK(text.find(str("struct ", def.pointwise->tanh_functor, " {")) != std::string::npos);
    }
    CHECK(pointwise >= 30);  // the elementwise family, the activations and cast
    CHECK(op_def(OpType::Matmul).pointwise == nullptr);
    // The embedded part is the formulas only: what NVRTC cannot compile (the standard library, the engine's types)
    // stays out of its code.
    const std::string code = std::regex_replace(text, std::regex("//[^\n]*"), "");
    CHECK(code.find("struct ReluOp {") != std::string::npos);
    CHECK(code.find("std::") == std::string::npos);
    CHECK(code.find("OpAttrs") == std::string::npos);
}

TEST_CASE("each row's derivative-reads flags cover what its derivative formula reads", "[fusion]") {
    // The plan writes only the values a derivative reads: a flag that is missing would drop a value the backward
    // needs. Evaluated on points of both signs; a formula that changes with x (or y) must have the flag.
    const std::vector<double> points = {-1.7, -0.6, 0.3, 0.7, 1.3, 2.1};
    const auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
    for (const OpDef& def : op_table()) {
        if (def.pointwise == nullptr || def.pointwise->form == PointwiseFormula::Form::Cast) continue;
        INFO(def.name);
        if (def.pointwise->form == PointwiseFormula::Form::Where || def.pointwise->form == PointwiseFormula::Form::MaskedFill ||
            def.pointwise->form == PointwiseFormula::Form::Dropout)
            continue;  // their gradients route dy by the condition (dropout: by its mask) alone: the next case
        for (GeluApproximation form : {GeluApproximation::None, GeluApproximation::Tanh}) {
            OpAttrs attrs;
            attrs.scalar = 0.5;
            attrs.clamp_min = -1.0;
            attrs.clamp_max = 1.0;
            attrs.gelu_approximation = form;
            bool reads_x = false, reads_y = false;
            if (def.pointwise->form == PointwiseFormula::Form::Unary) {
                math::visit_unary(def.op, attrs, [&](auto op) {
                    using Op = decltype(op);
                    const math::UnaryScalars<double> p = math::unary_scalars<double>(attrs);
                    for (double a : points)
                        for (double b : points) {
                            reads_x |= !same(math::apply_derivative<Op>(a, 0.9, p), math::apply_derivative<Op>(b, 0.9, p));
                            reads_y |= !same(math::apply_derivative<Op>(0.8, a, p), math::apply_derivative<Op>(0.8, b, p));
                        }
                });
            } else {
                math::visit_binary(def.op, [&](auto op) {
                    using Op = decltype(op);
                    for (double a : points)
                        for (double b : points)
                            reads_x |= !same(Op::d_a(a, 0.9), Op::d_a(b, 0.9)) || !same(Op::d_a(0.8, a), Op::d_a(0.8, b)) ||
                                       !same(Op::d_b(a, 0.9), Op::d_b(b, 0.9)) || !same(Op::d_b(0.8, a), Op::d_b(0.8, b));
                });
            }
            if (reads_x) CHECK(def.pointwise->derivative_reads_inputs);
            if (reads_y) CHECK(def.pointwise->derivative_reads_output);
        }
    }
    // The flags are not vacuous: some rows read nothing, some their inputs, some their output.
    CHECK_FALSE(op_def(OpType::Add).pointwise->derivative_reads_inputs);
    CHECK(op_def(OpType::Relu).pointwise->derivative_reads_inputs);
    CHECK(op_def(OpType::Exp).pointwise->derivative_reads_output);
}

TEST_CASE("where and masked_fill group with the comparisons that make their masks; their backward reads the masks only",
          "[fusion]") {
    // The flags say so: each routes dy by its condition and reads nothing else.
    const PointwiseFormula& where_formula = *op_def(OpType::Where).pointwise;
    const PointwiseFormula& fill_formula = *op_def(OpType::MaskedFill).pointwise;
    CHECK(derivative_reads_input(where_formula, 0));
    CHECK_FALSE(derivative_reads_input(where_formula, 1));
    CHECK_FALSE(derivative_reads_input(where_formula, 2));
    CHECK_FALSE(derivative_reads_input(fill_formula, 0));
    CHECK(derivative_reads_input(fill_formula, 1));
    CHECK(derivative_reads_input(*op_def(OpType::Relu).pointwise, 0));
    CHECK_FALSE(derivative_reads_input(*op_def(OpType::Add).pointwise, 1));

    Generator gen = fresh_generator();
    ComputeGraph graph;
    const Var x = graph.input(random({24, 40}, gen), "x", true);
    const Var y = graph.input(random({40}, gen), "y", true);
    const Var mask = graph.input(gt(random({24, 1}, gen), Tensor::zeros({1})), "mask");
    const Var positive = gt(x, y);                       // not differentiable: no gradient, but where reads it
    const Var leaky = mul_scalar(x, 0.1);
    const Var selected = where(positive, x, leaky);      // leaky ReLU against a per-column threshold
    const Var filled = masked_fill(selected, mask, -2.5);  // whole rows masked
    const Var out = tanh(filled);
    const Var loss = sum(out);
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const FusionGroup& group = plan.groups[0];
    CHECK(group.members == ids({positive, leaky, selected, filled, out, loss}));  // it ends in the loss's sum
    CHECK(group.inputs == ids({x, y, mask}));
    // Written: the sum, the condition where's gradient routes by, and tanh's input (its derivative reads it).
    // Neither value where selects among is: its gradient does not read them.
    CHECK(output_nodes(group) == ids({positive, filled, loss}));
    CHECK(why(group, positive.id()) == Materialise::NeededByBackward);
    CHECK(why(group, filled.id()) == Materialise::NeededByBackward);

    REQUIRE(plan.backward.size() == 1);
    const BackwardChain& chain = plan.backward[0];
    CHECK(chain.members == ids({loss, out, filled, selected, leaky}));  // the comparison requires no grad
    CHECK(chain.saved_reads == ids({mask, positive, filled}));

    const FusedKernelSource forward = generate_fused_source(graph, group);
    INFO(forward.source);
    CHECK(forward.source.find(str("const float t", selected.id(), " = dg_as_float32((t", positive.id(),
                                  " != float(0) ? v0 : t", leaky.id(), "));")) != std::string::npos);
    CHECK(forward.source.find(str("const float t", filled.id(), " = dg_as_float32((v2 != float(0) ? s1.s : t",
                                  selected.id(), "));")) != std::string::npos);
    REQUIRE(forward.scalars.size() == 2);  // mul_scalar's 0.1, masked_fill's -2.5
    CHECK(forward.scalars[1].node == filled.id());

    const std::vector<char> reached = reached_by_backward(graph, loss.id());
    const std::optional<BackwardLaunch> launch = backward_launch(graph, plan, 0, reached, loss.id());
    REQUIRE(launch.has_value());
    CHECK(launch->gradients_out == ids({x}));  // y reaches the loss only through the comparison
    CHECK(launch->saved_reads == ids({mask, positive, filled}));
    const FusedBackwardSource backward = generate_backward_source(graph, group, *launch);
    INFO(backward.source);
    // masked_fill passes dy where the mask is 0; where routes it to x where the comparison holds, to leaky elsewhere,
    // and x sums both (where's and mul_scalar's part), in the sweep's order.
    CHECK(backward.source.find(str("(x", mask.id(), " != float(0) ? float(0) : ")) != std::string::npos);
    CHECK(backward.source.find(str("(x", positive.id(), " != float(0) ? g")) != std::string::npos);
    CHECK(backward.source.find(str("(x", positive.id(), " != float(0) ? float(0) : g")) != std::string::npos);
    CHECK(backward.scalars.size() == 1);  // mul_scalar's: masked_fill's value has no part in a gradient
    REQUIRE(backward.results.size() == 1);
    CHECK(backward.results[0].input == x.id());
    CHECK(backward.results[0].contributions == 2);
}

TEST_CASE("a sum's or mean's backward joins the chain of the member it reduces", "[fusion][backward]") {
    Generator gen = fresh_generator();
    SECTION("matmul, ReLU, sum: one kernel computes the ReLU and the sum; one the sum's expand and ReLU's derivative") {
        ComputeGraph graph;
        const Var x = graph.input(random({12, 10}, gen), "x", true);
        const Var w = graph.input(random({10, 6}, gen), "w", true);
        const Var product = matmul(x, w);
        const Var activated = relu(product);
        const Var loss = sum(activated);
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        REQUIRE(plan.groups.size() == 1);
        CHECK(plan.groups[0].members == ids({activated, loss}));
        REQUIRE(plan.groups[0].reductions.size() == 1);
        CHECK_FALSE(plan.groups[0].row_program);
        CHECK(plan.groups[0].reductions[0].node == loss.id());
        CHECK(plan.groups[0].reductions[0].input == activated.id());
        CHECK(plan.groups[0].reductions[0].rows == 1);  // every axis: one row
        CHECK(plan.groups[0].reductions[0].row_length == 72);
        CHECK(plan.groups[0].member_shape(loss.id()) == Shape{});
        CHECK(plan.launches_saved() == 1);
        // Only the sum is written: the ReLU's derivative reads the product, nothing outside reads the ReLU.
        CHECK(output_nodes(plan.groups[0]) == ids({loss}));
        const FusedKernelSource forward = generate_fused_source(graph, plan.groups[0]);
        INFO(forward.source);
        CHECK(forward.numel == 256);  // one block: one row
        CHECK(forward.outputs == ids({loss}));
        CHECK(forward.source.find("constexpr long long row_length = 72LL;") != std::string::npos);
        CHECK(forward.source.find(str("acc", loss.id(), " = acc", loss.id(), " + t", activated.id(), ";")) != std::string::npos);
        CHECK(forward.source.find(str("out0[row] = dg_store_float32(t", loss.id(), ");")) != std::string::npos);
        CHECK(forward.source.find("// pass 1") == std::string::npos);  // one loop over the row
        CHECK(forward.source.find("out0[i]") == std::string::npos);  // the ReLU is not stored
        const std::vector<char> reached = reached_by_backward(graph, loss.id());
        const std::optional<BackwardLaunch> launch = backward_launch(graph, plan, 0, reached, loss.id());
        REQUIRE(launch.has_value());
        CHECK(launch->members == ids({loss, activated}));
        CHECK(launch->gradients_in == ids({loss}));  // the root's seed
        CHECK(launch->saved_reads == ids({product}));
        CHECK(launch->gradients_out == ids({product}));
        CHECK(launch->run_before == loss.id());
        const FusedBackwardSource source = generate_backward_source(graph, plan.groups[0], *launch);
        INFO(source.source);
        // The seed (one element) is loaded for every element: the expand kernel's broadcast.
        CHECK(source.source.find("const float d" + std::to_string(loss.id()) + " = dg_load(in1[0]);") != std::string::npos);
        CHECK(source.source.find(str("apply_derivative<dyngrad::math::ReluOp>(x", product.id())) != std::string::npos);
        REQUIRE(source.results.size() == 1);
        CHECK(source.results[0].input == product.id());
        CHECK(source.results[0].store == 0);
    }
    SECTION("a mean over the last axis: its gradient broadcast along the rows, times 1/count as reduce_backward") {
        ComputeGraph graph;
        const Var x = graph.input(random({8, 24}, gen), "x", true);
        const Var scaled = mul_scalar(x, 2.0);
        const Var squashed = tanh(scaled);
        const Var row_means = mean(squashed, {-1});  // (8): the axis is not kept
        const Var product = mul(row_means, row_means);
        const Var loss = sum(product);
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        REQUIRE(plan.groups.size() == 2);  // the product too, with the loss's sum
        CHECK(plan.groups[0].members == ids({scaled, squashed, row_means}));
        REQUIRE(plan.groups[0].reductions.size() == 1);
        CHECK(plan.groups[0].reductions[0].rows == 8);
        CHECK(plan.groups[0].reductions[0].row_length == 24);
        CHECK(plan.groups[0].reductions[0].mean);
        CHECK(plan.groups[1].members == ids({product, loss}));
        const std::vector<char> reached = reached_by_backward(graph, loss.id());
        const std::optional<BackwardLaunch> launch = backward_launch(graph, plan, 0, reached, loss.id());
        REQUIRE(launch.has_value());
        CHECK(launch->members == ids({row_means, squashed, scaled}));
        CHECK(launch->gradients_in == ids({row_means}));
        CHECK(launch->gradients_out == ids({x}));
        // The chain runs once the product, the mean's one reader, has given the mean its gradient.
        CHECK(launch->run_before == product.id() - 1);
        const FusedBackwardSource source = generate_backward_source(graph, plan.groups[0], *launch);
        INFO(source.source);
        CHECK(source.source.find(str("const float d", row_means.id(), " = dg_load(in1[(i / 24LL)]);")) != std::string::npos);
        CHECK(source.source.find(str("dg_as_float32(d", row_means.id(), " * (float(1) / float(24LL)))")) != std::string::npos);
    }
    SECTION("a member read by the sum and by another node outside: both gradients come into the chain") {
        ComputeGraph graph;
        const Var x = graph.input(random({6, 5}, gen), "x", true);
        const Var halved = mul_scalar(x, 0.5);
        const Var squashed = tanh(halved);
        const Var total = sum(squashed);
        const Var loss = add(total, sum(matmul(squashed, graph.input(random({5, 2}, gen), "w"))));
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        REQUIRE(plan.groups.size() == 1);
        REQUIRE(plan.groups[0].reductions.size() == 1);
        CHECK(plan.groups[0].reductions[0].node == total.id());
        // tanh's input for its derivative, the tanh for the matmul, the sum for the add.
        CHECK(output_nodes(plan.groups[0]) == ids({halved, squashed, total}));
        const std::vector<char> reached = reached_by_backward(graph, loss.id());
        const std::optional<BackwardLaunch> launch = backward_launch(graph, plan, 0, reached, loss.id());
        REQUIRE(launch.has_value());
        CHECK(launch->gradients_in == ids({total, squashed}));
    }
    SECTION("reductions a kernel does not end in: a column sum, a few long rows; one read back is a kernel apart") {
        ComputeGraph graph;
        const Var x = graph.input(random({6, 5}, gen), "x", true);
        const Var squashed = tanh(x);
        const Var columns = sum(squashed, {0});
        const Var row_means = mean(squashed, {-1}, true);
        const Var centred = sub(squashed, row_means);  // softmax's shape: the mean read back over its rows
        const Var long_rows = sum(exp(graph.input(random({2, 20000}, gen), "y")), {-1});
        static_cast<void>(sum(add(columns, sum(centred))) + sum(long_rows));
        const FusionPlan plan = plan_fusion(graph);
        INFO(plan.describe(graph));
        for (const FusionGroup& group : plan.groups)
            for (const RowReduction& r : group.reductions) CHECK((r.node != columns.id() && r.node != long_rows.id()));
        // The tanh's kernel ends in the row mean; the subtraction, which reads it back, is in a kernel after it.
        REQUIRE_FALSE(plan.groups.empty());
        CHECK(plan.groups[0].members == ids({squashed, row_means}));
        const auto has = [](const std::vector<NodeId>& list, NodeId id) {
            return std::find(list.begin(), list.end(), id) != list.end();
        };
        for (const FusionGroup& group : plan.groups)
            if (has(group.members, centred.id())) CHECK(has(group.inputs, row_means.id()));
    }
    SECTION("a lone node whose reader is not a sum or mean still forms no group") {
        ComputeGraph graph;
        const Var x = graph.input(random({6, 5}, gen), "x", true);
        static_cast<void>(sum(matmul(relu(x), graph.input(random({5, 2}, gen), "w"))));
        CHECK(plan_fusion(graph).groups.empty());
    }
}

TEST_CASE("MLP: bias add, ReLU and dropout form one group; matmul ends it", "[fusion]") {
    Generator gen = fresh_generator();
    Mlp mlp(64, gen);
    const FusionPlan plan = plan_fusion(mlp.graph);
    INFO(plan.describe(mlp.graph));
    REQUIRE(plan.groups.size() == 1);
    const FusionGroup& group = plan.groups[0];
    CHECK(group.members == ids({mlp.biased, mlp.hidden, mlp.dropped}));
    CHECK(group.inputs == ids({mlp.pre, mlp.b1}));  // the mask seed is an attribute here: no seed input
    CHECK(group.shape == Shape{64, 16});
    CHECK_FALSE(group.double_precision);
    // dropout's output goes to the matmul; the bias add's is read by ReLU's derivative (requires grad); ReLU's is
    // read by dropout alone, whose derivative reads only its seed: not written.
    CHECK(output_nodes(group) == ids({mlp.biased, mlp.dropped}));
    CHECK(why(group, mlp.dropped.id()) == Materialise::ConsumedOutside);
    CHECK(why(group, mlp.biased.id()) == Materialise::NeededByBackward);
    CHECK(plan.launches_saved() == 2);

    REQUIRE(plan.backward.size() == 1);
    const BackwardChain& chain = plan.backward[0];
    CHECK(chain.group == 0);
    CHECK(chain.members == ids({mlp.dropped, mlp.hidden, mlp.biased}));
    CHECK(chain.gradients_in == ids({mlp.dropped}));
    CHECK(chain.saved_reads == ids({mlp.biased}));  // add's derivative reads nothing, relu's its input
    CHECK(chain.gradients_out == ids({mlp.pre, mlp.b1}));
    CHECK(chain.reduced == ids({mlp.b1}));  // the bias gradient is a sum over the batch: not pointwise
}

TEST_CASE("dropout with a seed input joins a group; the seed is an input of its kernels; eval ends it", "[fusion]") {
    Generator gen = fresh_generator();
    ComputeGraph graph;
    const Var x = graph.input(random({8, 24}, gen), "x", true);
    const Var r = graph.input(random({8, 24}, gen), "r", true);
    const Var seed = graph.constant(Tensor::from_vector(std::vector<std::int64_t>{0x5eed1234}, {1}));
    const Var scaled = mul_scalar(x, 1.5);
    const Var dropped = dropout(scaled, 0.3, true, seed);
    const Var out = add(dropped, r);
    const Var kept = dropout(out, 0.3, false, seed);  // eval: a copy, not a member
    const Var loss = mean(matmul(kept, graph.input(random({24, 4}, gen), "w")));
    graph.backward(loss, {.retain_graph = true});
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const FusionGroup& group = plan.groups[0];
    CHECK(group.members == ids({scaled, dropped, out}));
    CHECK(group.inputs == ids({x, seed, r}));
    REQUIRE(plan.backward.size() == 1);
    CHECK(plan.backward[0].saved_reads == ids({seed}));  // the mask is recomputed from the seed
    CHECK(plan.backward[0].gradients_out == ids({x, r}));

    const FusedKernelSource k = generate_fused_source(graph, with_every_member_written(group));
    INFO(k.source);
    // The seed's bits, read as an int64 element; the mask and scale by the same function the dropout kernels call.
    CHECK(k.source.find("const long long* __restrict__ in1") != std::string::npos);
    CHECK(k.source.find("const unsigned long long v1 = static_cast<unsigned long long>(in1[0]);") != std::string::npos);
    CHECK(k.source.find(str("dyngrad::math::dropout_apply(t", scaled.id(), ", v1, static_cast<unsigned long long>(i), s1.p)")) !=
          std::string::npos);
    CHECK(k.source.find("DG_HOST_DEVICE bool dropout_keep(") != std::string::npos);  // the embedded mask
    CHECK(k.source.find("dyngrad::math::DropoutScalars s1") != std::string::npos);
    REQUIRE(k.scalars.size() == 2);  // mul_scalar's, dropout's
    CHECK(k.scalars[1].node == dropped.id());
    CHECK(std::regex_replace(std::string(dropout_mask_source()), std::regex("//[^\n]*"), "").find("std::") ==
          std::string::npos);  // what NVRTC compiles: no standard library

    const std::vector<char> reached = reached_by_backward(graph, loss.id());
    const std::optional<BackwardLaunch> launch = backward_launch(graph, plan, 0, reached, loss.id());
    REQUIRE(launch.has_value());
    const FusedBackwardSource b = generate_backward_source(graph, group, *launch);
    INFO(b.source);
    CHECK(b.saved == ids({seed}));
    CHECK(b.source.find(str("const unsigned long long x", seed.id(), " = static_cast<unsigned long long>(in0[0]);")) !=
          std::string::npos);
    CHECK(b.source.find(str(", x", seed.id(), ", static_cast<unsigned long long>(i), s")) != std::string::npos);

    // A dropout that does not drop (p = 0) is a copy too: it ends the group as eval does.
    ComputeGraph other;
    const Var y = other.input(random({8, 24}, gen), "y", true);
    const Var z = dropout(relu(y), 0.0, true, std::uint64_t{3});
    other.backward(sum(exp(z)));
    for (const FusionGroup& g : plan_fusion(other).groups)
        CHECK(std::find(g.members.begin(), g.members.end(), z.id()) == g.members.end());
}

TEST_CASE("LeNet-like step: only the input normalisation groups; lone activations between convolutions do not",
          "[fusion]") {
    Generator gen = fresh_generator();
    ComputeGraph graph;
    const Var image = graph.input(random({4, 1, 28, 28}, gen), "image");
    const Var c1w = graph.input(random({6, 1, 5, 5}, gen), "c1.w", true);
    const Var c1b = graph.input(random({6}, gen), "c1.b", true);
    const Var c2w = graph.input(random({16, 6, 5, 5}, gen), "c2.w", true);
    const Var c2b = graph.input(random({16}, gen), "c2.b", true);
    const Var fw = graph.input(random({10, 400}, gen), "fc.w", true);
    const Var fb = graph.input(random({10}, gen), "fc.b", true);
    const Var labels = graph.input(Tensor::from_vector(std::vector<std::int64_t>{1, 7, 3, 9}, {4}), "labels");
    const Var shifted = add_scalar(image, -0.1307);
    const Var normalised = mul_scalar(shifted, 1.0 / 0.3081);
    const Var h1 = max_pool2d(relu(conv2d(normalised, c1w, c1b, Conv2dOptions{.padding = {2, 2}})), {2, 2});
    const Var h2 = max_pool2d(relu(conv2d(h1, c2w, c2b)), {2, 2});
    const Var loss = cross_entropy(linear(reshape(h2, {4, 400}), fw, fb), labels);
    const Var scaled = mul_scalar(loss, 1024.0);  // loss scaling: one op, nothing to fuse it with
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    CHECK(plan.groups[0].members == ids({shifted, normalised}));
    CHECK(plan.groups[0].inputs == ids({image}));
    // No gradient is wanted for the image: only what the convolution reads is written.
    CHECK(output_nodes(plan.groups[0]) == ids({normalised}));
    CHECK(plan.backward.empty());
    CHECK(scaled.defined());
}

TEST_CASE("bf16 autocast chain: the casts fold into the group", "[fusion]") {
    Generator gen = fresh_generator();
    ComputeGraph graph;
    const Var x = graph.input(random({8, 32}, gen), "x");
    const Var w = graph.input(random({16, 32}, gen), "w", true);
    const Var b = graph.input(random({16}, gen), "b", true);
    Var h, e, scaled, back;
    {
        AutocastGuard autocast(DType::bf16);
        h = linear(x, w, b);          // reduced: bf16 out
        e = exp(h);                   // float32 policy: a cast of h to f32 is recorded first
        scaled = mul_scalar(e, 0.5);  // follow: f32
        back = to_dtype(scaled, DType::bf16);
    }
    const Var y = sigmoid(back);  // bf16, outside autocast
    const Var loss = sum(to_dtype(y, DType::f32), {0});  // over the batch: not a reduction the kernel ends in
    REQUIRE(h.dtype() == DType::bf16);
    REQUIRE(e.dtype() == DType::f32);
    const NodeId cast_in = graph.node(e.id()).inputs[0].id;
    REQUIRE(graph.node(cast_in).op == OpType::Cast);
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    const FusionGroup& group = plan.groups[0];
    const NodeId cast_out = graph.node(loss.id()).inputs[0].id;
    CHECK(group.members == std::vector<NodeId>{cast_in, e.id(), scaled.id(), back.id(), y.id(), cast_out});
    CHECK(group.inputs == ids({h}));  // the linear's bf16 output: the only tensor read
    // exp's derivative reads its output, sigmoid's its input; the casts' and mul_scalar's read nothing.
    CHECK(output_nodes(group) == std::vector<NodeId>{e.id(), back.id(), cast_out});
    CHECK(why(group, e.id()) == Materialise::NeededByBackward);
    CHECK(why(group, back.id()) == Materialise::NeededByBackward);
    CHECK(why(group, cast_out) == Materialise::ConsumedOutside);  // the sum
    CHECK(y.dtype() == DType::bf16);

    const FusedKernelSource source = generate_fused_source(graph, group);
    INFO(source.source);
    CHECK(source.source.find("const dg_bf16* __restrict__ in0") != std::string::npos);
    CHECK(source.source.find("dg_as_bfloat16(") != std::string::npos);  // the cast to bf16 rounds in registers
    CHECK(source.source.find("float* __restrict__ out") != std::string::npos);
    CHECK(source.vector_width == 4);  // f32 outputs are the widest full-shape tensors
}

TEST_CASE("an intermediate read outside the group is written; a path back into the group ends it", "[fusion]") {
    Generator gen = fresh_generator();
    ComputeGraph graph;
    const Var x = graph.input(random({16, 8}, gen), "x");
    const Var w = graph.input(random({8, 4}, gen), "w");
    const Var a = exp(x);
    const Var c = mul_scalar(a, 2.0);
    const Var p = matmul(a, w);         // reads a, outside the group
    const Var total = sum(a, {1}, true);  // (16, 1), computed from a member: the grouping pass's group ends in it
    const Var d = add(c, total);        // needs `total` before its rows are summed: a second pass over each row
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    // The group ends in the sum; the add, which reads the sum back, joins it as a row program's second pass.
    REQUIRE(plan.segments.size() == 1);
    CHECK(plan.segments[0].members == ids({a, c, total}));
    REQUIRE(plan.segments[0].reductions.size() == 1);
    CHECK(plan.segments[0].reductions[0].node == total.id());
    CHECK(output_nodes(plan.segments[0]) == ids({a, c, total}));
    CHECK(why(plan.segments[0], a.id()) == Materialise::ConsumedOutside);
    CHECK(why(plan.segments[0], c.id()) == Materialise::ConsumedOutside);
    REQUIRE(plan.groups.size() == 1);
    CHECK(plan.groups[0].members == ids({a, c, total, d}));
    CHECK(plan.groups[0].row_program);
    CHECK(plan.groups[0].passes == 2);
    CHECK(plan.groups[0].segments == std::vector<std::size_t>{0});
    CHECK(output_nodes(plan.groups[0]) == ids({a, d}));  // the matmul's input and the step's result
    CHECK(why(plan.groups[0], a.id()) == Materialise::ConsumedOutside);
    CHECK(why(plan.groups[0], d.id()) == Materialise::StepResult);
    CHECK(p.defined());
}

TEST_CASE("two producer groups merge through a residual add", "[fusion]") {
    Generator gen = fresh_generator();
    ComputeGraph graph;
    const Var x = graph.input(random({4, 6}, gen), "x", true);
    const Var y = graph.input(random({4, 6}, gen), "y", true);
    const Var s1 = mul_scalar(tanh(x), 3.0);
    const Var s2 = sigmoid(neg(y));
    const Var r = add(s1, s2);
    const Var loss = sum(r);
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE(plan.groups.size() == 1);
    CHECK(plan.groups[0].members.size() == 6);  // and the loss's sum, which the kernel ends in
    CHECK(plan.groups[0].inputs == ids({x, y}));
    CHECK(loss.defined());
}

TEST_CASE("a new shape is a new plan and a new kernel, never the old one", "[fusion]") {
    Generator gen = fresh_generator();
    FusionPlanCache cache;
    Mlp small(4, gen);
    Mlp large(8, gen);
    Mlp small_again(4, gen);
    CHECK(graph_signature(small.graph) != graph_signature(large.graph));
    CHECK(graph_signature(small.graph) == graph_signature(small_again.graph));
    const FusionPlan& a = cache.plan_for(small.graph);
    const FusionPlan& b = cache.plan_for(large.graph);
    CHECK(cache.size() == 2);
    const FusionPlan& c = cache.plan_for(small_again.graph);
    CHECK(&c == &a);
    CHECK(cache.size() == 2);
    REQUIRE(a.groups.size() == 1);
    REQUIRE(b.groups.size() == 1);
    CHECK(a.groups[0].shape == Shape{4, 16});
    CHECK(b.groups[0].shape == Shape{8, 16});
    const FusedKernelSource ka = generate_fused_source(small.graph, a.groups[0]);
    const FusedKernelSource kb = generate_fused_source(large.graph, b.groups[0]);
    CHECK(ka.hash != kb.hash);
    CHECK(ka.name != kb.name);
    CHECK(ka.source.find("constexpr long long n = 64LL;") != std::string::npos);
    CHECK(kb.source.find("constexpr long long n = 128LL;") != std::string::npos);
    // Same graph, same source, same kernel: the disk cache's key is stable.
    CHECK(generate_fused_source(small_again.graph, c.groups[0]).source == ka.source);
}

TEST_CASE("generated source of the MLP group: formulas, loads, stores, no unused input", "[fusion]") {
    Generator gen = fresh_generator();
    Mlp mlp(64, gen);
    const FusionPlan plan = plan_fusion(mlp.graph);
    REQUIRE(plan.groups.size() == 1);
    const FusedKernelSource k = generate_fused_source(mlp.graph, plan.groups[0]);
    const std::string& s = k.source;
    INFO(s);
    CHECK(k.name == "dg_fused_" + cuda::hex64(k.hash));
    CHECK(k.hash == cuda::fnv1a64(std::regex_replace(s, std::regex(k.name), "DG_KERNEL_NAME")));
    CHECK(s.find(str("extern \"C\" __global__ void __launch_bounds__(256) ", k.name, "(")) != std::string::npos);
    CHECK(s.find("struct ReluOp {") != std::string::npos);  // the embedded formulas
    CHECK(s.find("dyngrad::math::AddOp::forward(v0, v1)") != std::string::npos);
    CHECK(s.find(str("apply_forward<dyngrad::math::ReluOp>(t", mlp.biased.id())) != std::string::npos);
    CHECK(k.inputs == ids({mlp.pre, mlp.b1}));
    CHECK(k.outputs == ids({mlp.biased, mlp.dropped}));
    REQUIRE(k.scalars.size() == 1);  // add and relu read no scalar; dropout its p and (attribute) seed
    CHECK(k.scalars[0].node == mlp.dropped.id());
    CHECK(s.find(str("dyngrad::math::dropout_apply(t", mlp.hidden.id(), ", s0.seed, static_cast<unsigned long long>(i), s0.p)")) !=
          std::string::npos);
    CHECK(k.numel == 64 * 16);
    CHECK(k.vector_width == 4);
    // The bias is broadcast along the batch: element i reads bias[i % 16], never a vector load.
    CHECK(s.find("dg_load(in1[(i % 16LL)])") != std::string::npos);
    CHECK(s.find("dg_load(l0.v[k])") != std::string::npos);
    CHECK(s.find("*reinterpret_cast<const dg_vec<float, 4>*>(in0 + base)") != std::string::npos);
    CHECK(s.find("l1") == std::string::npos);
    // Every parameter is used: each input loaded, each output stored, in both loops.
    for (std::size_t j = 0; j < k.inputs.size(); ++j) CHECK(s.find(str("in", j, "[")) != std::string::npos);
    for (std::size_t j = 0; j < k.outputs.size(); ++j) {
        CHECK(s.find(str("out", j, "[i] = dg_store_float32(")) != std::string::npos);
        CHECK(s.find(str("w", j, ".v[k] = dg_store_float32(")) != std::string::npos);
    }
    CHECK(s.find("in2") == std::string::npos);
    CHECK(s.find("out2") == std::string::npos);
    // 64-bit indices and a grid-stride loop.
    CHECK(s.find("for (long long i = tail + first; i < n; i += step)") != std::string::npos);
}

TEST_CASE("generated source: scalars are arguments, broadcasting over inner and outer axes, f64", "[fusion]") {
    Generator gen = fresh_generator();
    ComputeGraph graph;
    const Var x = graph.input(random({3, 5, 7}, gen).to(DType::f64), "x");
    const Var row = graph.input(random({3, 1, 7}, gen).to(DType::f64), "row");
    const Var one = graph.input(random({1}, gen).to(DType::f64), "one");
    const Var a = mul(x, row);
    const Var b = clamp(add_scalar(a, 0.25), -0.5, 0.5);
    const Var c = div(b, one);
    const FusionPlan plan = plan_fusion(graph);
    REQUIRE(plan.groups.size() == 1);
    CHECK(plan.groups[0].double_precision);
    const FusedKernelSource k = generate_fused_source(graph, plan.groups[0]);
    INFO(k.source);
    CHECK(k.scalars.size() == 2);  // add_scalar's scalar, clamp's bounds
    CHECK(k.source.find("dyngrad::math::UnaryScalars<double> s0") != std::string::npos);
    CHECK(k.source.find("dyngrad::math::UnaryScalars<double> s1") != std::string::npos);
    CHECK(k.source.find("0.25") == std::string::npos);  // the value is an argument, not in the source
    CHECK(k.source.find("dg_load(in1[((i / 35LL) % 3LL) * 7LL + (i % 7LL)])") == std::string::npos);
    CHECK(k.source.find("dg_load(in1[(i / 35LL) * 7LL + (i % 7LL)])") != std::string::npos);
    CHECK(k.source.find("dg_load(in2[0])") != std::string::npos);
    CHECK(k.vector_width == 2);
    CHECK(k.outputs == ids({c}));
}

TEST_CASE("random graphs: every plan is legal, schedulable and writes what is read", "[fusion]") {
    std::mt19937_64 rng(std::random_device{}());
    Generator gen(rng());
    const auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    for (int trial = 0; trial < 300; ++trial) {
        ComputeGraph graph;
        std::vector<Var> vars = {graph.input(random({4, 5}, gen), "a", trial % 2 == 0),
                                 graph.input(random({4, 5}, gen), "b"), graph.input(random({5}, gen), "c", true),
                                 graph.input(random({4, 1}, gen), "d")};
        for (int step = 0; step < 24; ++step) {
            const Var& x = vars[pick(vars.size())];
            const Var& y = vars[pick(vars.size())];
            switch (pick(7)) {
                case 0: vars.push_back(tanh(x)); break;
                case 1: vars.push_back(mul_scalar(x, 0.5)); break;
                case 2: vars.push_back(add(x, y)); break;
                case 3: vars.push_back(mul(x, y)); break;
                case 4: vars.push_back(relu(x)); break;
                // Not pointwise: reductions that feed back into pointwise chains.
                case 5: vars.push_back(x.shape().size() == 2 ? sum(x, {1}, true) : sum(x, {}, true)); break;
                default: vars.push_back(x.shape().size() == 2 ? sum(x, {0}) : neg(x)); break;
            }
        }
        const FusionPlan plan = plan_fusion(graph);
        INFO("trial " << trial << "\n" << plan.describe(graph));
        const std::size_t n = graph.size();
        std::vector<std::vector<NodeId>> readers(n);
        for (NodeId id = 0; id < n; ++id)
            for (const NodeInput& input : graph.node(id).inputs) readers[input.id].push_back(id);
        std::vector<int> group_of(n, -1);
        for (std::size_t g = 0; g < plan.groups.size(); ++g) {
            const FusionGroup& group = plan.groups[g];
            REQUIRE(!group.members.empty());
            for (const RowReduction& r : group.reductions) {  // over rows of the group's shape: of a member or an input
                CHECK(std::find(group.members.begin(), group.members.end(), r.node) != group.members.end());
                CHECK(graph.node(r.node).inputs[0].id == r.input);
                CHECK(r.rows * r.row_length == numel(group.shape));
                CHECK(r.kept_shape == group.reductions[0].kept_shape);
            }
            if (group.reductions.size() > 1 || !group.row_members.empty()) CHECK(group.row_program);
            // A row program reads its row values back only in their kept shape (broadcast along their own rows).
            if (group.row_program)
                for (NodeId m : group.members) {
                    if (group.reduction_of(m) != nullptr) continue;
                    for (const NodeInput& input : graph.node(m).inputs)
                        if (group.reduction_of(input.id) != nullptr ||
                            std::find(group.row_members.begin(), group.row_members.end(), input.id) != group.row_members.end())
                            CHECK(graph.node(input.id).value.shape() == group.row_shape);
                }
            if (group.members.size() == 1) {  // kept alone only for a sum's backward its chain takes over
                const NodeId m = group.members[0];
                REQUIRE(graph.node(m).requires_grad);
                REQUIRE(readers[m].size() == 1);
                const ComputeNode& reader = graph.node(readers[m][0]);
                CHECK(reader.op == OpType::Sum);
                CHECK(reader.requires_grad);
                CHECK(reader.inputs.size() == 1);
            }
            CHECK(std::is_sorted(group.members.begin(), group.members.end()));
            for (NodeId m : group.members) {
                REQUIRE(group_of[m] == -1);  // one group per node
                group_of[m] = static_cast<int>(g);
                CHECK(graph.node(m).value.shape() == group.member_shape(m));
                if (group.reduction_of(m) == nullptr) CHECK(op_def(graph.node(m).op).pointwise != nullptr);
            }
        }
        for (std::size_t g = 0; g < plan.groups.size(); ++g) {
            const FusionGroup& group = plan.groups[g];
            std::set<NodeId> external;
            for (NodeId m : group.members)
                for (const NodeInput& input : graph.node(m).inputs)
                    if (group_of[input.id] != static_cast<int>(g)) external.insert(input.id);
            CHECK(std::set<NodeId>(group.inputs.begin(), group.inputs.end()) == external);
            CHECK(group.inputs.size() == external.size());
            const std::vector<NodeId> written = output_nodes(group);
            for (NodeId m : group.members) {
                const bool read_outside = std::any_of(readers[m].begin(), readers[m].end(), [&](NodeId r) {
                    return group_of[r] != static_cast<int>(g);
                });
                if (read_outside || readers[m].empty())
                    CHECK(std::find(written.begin(), written.end(), m) != written.end());
            }
        }
        // Every segment lies in the one kernel that names it.
        for (std::size_t g = 0; g < plan.groups.size(); ++g)
            for (std::size_t segment : plan.groups[g].segments)
                for (NodeId m : plan.segments.at(segment).members) CHECK(group_of[m] == static_cast<int>(g));
        // Schedulable: running any unit (a group, or a node outside every group) whose inputs are all computed
        // computes every node.
        std::vector<char> done(n, 0);
        for (NodeId id = 0; id < n; ++id) done[id] = graph.node(id).op == OpType::Leaf;
        bool progress = true;
        while (progress) {
            progress = false;
            for (NodeId id = 0; id < n; ++id) {
                if (done[id]) continue;
                std::vector<NodeId> unit = group_of[id] >= 0 ? plan.groups[group_of[id]].members
                                                             : std::vector<NodeId>{id};
                const bool ready = std::all_of(unit.begin(), unit.end(), [&](NodeId m) {
                    return std::all_of(graph.node(m).inputs.begin(), graph.node(m).inputs.end(),
                                       [&](const NodeInput& in) {
                                           return done[in.id] || (group_of[id] >= 0 && group_of[in.id] == group_of[id]);
                                       });
                });
                if (!ready) continue;
                for (NodeId m : unit) done[m] = 1;
                progress = true;
            }
        }
        CHECK(std::all_of(done.begin(), done.end(), [](char d) { return d != 0; }));
    }
}

TEST_CASE("GPT step: f32 forms no group; under bf16 autocast each residual add takes its branch's cast", "[fusion]") {
    // The char GPT's step as char_gpt records it (GPT::loss: the LM head fused with the loss). Every pointwise op of
    // the f32 step sits alone between fused ops (the residual adds between attention or gelu_mlp and layer_norm);
    // PyTorch's autocast recipe casts each branch's bf16 output back to f32 before its residual add: that pair groups.
    Generator gen = fresh_generator();
    GPTConfig config;
    config.vocab_size = 50;
    config.context = 16;
    config.layers = 2;
    config.heads = 2;
    config.width = 32;
    std::uniform_int_distribution<std::int64_t> token(0, config.vocab_size - 1);
    std::mt19937_64 pick(std::random_device{}());
    std::vector<std::int64_t> tokens(16), targets(16);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = token(pick), targets[i] = token(pick);
    for (const DType precision : {DType::f32, DType::bf16}) {
        GPT model(config, gen);
        ComputeGraph graph;
        Var loss;
        {
            AutocastGuard autocast(precision);
            loss = model.loss(graph.input(Tensor::from_vector(tokens, {2, 8})),
                              graph.input(Tensor::from_vector(targets, {16})));
        }
        const FusionPlan plan = plan_fusion(graph);
        INFO(dtype_name(precision) << ": " << plan.describe(graph));
        if (precision == DType::f32) {
            CHECK(plan.groups.empty());
            continue;
        }
        REQUIRE(plan.groups.size() == static_cast<std::size_t>(2 * config.layers));
        for (const FusionGroup& group : plan.groups) {
            REQUIRE(group.members.size() == 2);
            const ComputeNode& cast = graph.node(group.members[0]);
            const ComputeNode& add = graph.node(group.members[1]);
            CHECK(cast.op == OpType::Cast);
            CHECK(cast.value.dtype() == DType::f32);
            CHECK(add.op == OpType::Add);
            CHECK(group.shape == Shape{2, 8, config.width});
            // The branch's bf16 output and the f32 residual stream in; only the new residual stream out.
            REQUIRE(group.inputs.size() == 2);
            CHECK(graph.node(group.inputs[0]).value.dtype() == DType::bf16);
            CHECK(output_nodes(group) == std::vector<NodeId>{group.members[1]});
            CHECK(why(group, group.members[1]) == Materialise::ConsumedOutside);
        }
        CHECK(plan.launches_saved() == static_cast<std::size_t>(2 * config.layers));
    }
}
