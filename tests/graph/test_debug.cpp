// Graph lint and Graphviz output (graph/debug.h): what lint reports before a backward, and the structure
// and labels of to_dot's text, with and without a verify report.
#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::Contains;
using dgtest::MessageHas;

namespace {

dgtest::NormalDraws randn(77, DType::f64);

// A lint report of `count` issues, the first of `kind`, naming `node`, its message holding each of `message_parts`.
void check_first_issue(const LintReport& report, std::size_t count, LintIssue::Kind kind, const Var& node,
                       const std::vector<std::string>& message_parts) {
    REQUIRE(report.issues.size() == count);
    const LintIssue& issue = report.issues[0];
    CHECK(issue.kind == kind);
    CHECK(issue.node == node.id());
    for (const std::string& part : message_parts) CHECK_THAT(issue.message, Contains(part));
}

std::size_t count_matches(const std::string& text, const std::regex& pattern) {
    return static_cast<std::size_t>(
        std::distance(std::sregex_iterator(text.begin(), text.end(), pattern), std::sregex_iterator()));
}

OutputSpec same_shape(OpType, std::span<const Tensor> in, const OpAttrs&) { return {in[0].shape(), in[0].dtype()}; }
Tensor copy_forward(const ForwardArgs& args) { return args.inputs[0].clone(); }
std::vector<Tensor> copy_backward(const BackwardArgs& args) { return {args.grad_output}; }

}  // namespace

TEST_CASE("lint finds nothing in a sound graph", "[debug][lint]") {
    Parameter w(randn({3, 4}), "w"), b(randn({3}), "b");
    ComputeGraph graph;
    Var loss = sum(relu(linear(graph.input(randn({5, 4}), "x"), graph.parameter(w), graph.parameter(b))));
    const LintReport report = lint(graph, loss);
    INFO(report.to_string());
    CHECK(report.clean());
    CHECK(report.to_string() == "lint: clean");
    // lint changes nothing: the backward runs as before.
    graph.backward(loss);
    CHECK(w.grad().defined());
}

TEST_CASE("lint lists parameters that receive no gradient", "[debug][lint]") {
    Parameter used(randn({4}), "used"), unused(randn({4}), "unused"), detached(randn({4}), "detached"),
        frozen(randn({4}), "frozen"), twice(randn({4}), "twice");
    ComputeGraph graph;
    Var x = graph.input(randn({4}), "x");
    Var h = x * graph.parameter(used);
    Var spare = graph.parameter(unused);
    const int unused_line = __LINE__ - 1;
    h = h + detach(graph.parameter(detached) * 2.0);
    Var frozen_leaf = [&] {
        NoGradGuard no_grad;
        return graph.parameter(frozen);
    }();
    h = h * frozen_leaf;
    graph.parameter(twice);  // recorded once for nothing,
    h = h + graph.parameter(twice);  // and once where it counts: it gets a gradient
    Var loss = sum(h);
    const int loss_line = __LINE__ - 1;

    const LintReport report = lint(graph, loss);
    const std::string text = report.to_string();
    INFO(text);
    REQUIRE(report.count(LintIssue::Kind::UnusedParameter) == 3);
    std::vector<std::string> named;
    for (const LintIssue& issue : report.issues)
        if (issue.kind == LintIssue::Kind::UnusedParameter) named.push_back(graph.node(issue.node).parameter.name());
    CHECK(named == std::vector<std::string>{"unused", "detached", "frozen"});
    CHECK(report.issues.front().node == spare.id());
    CHECK_THAT(report.issues.front().message,
               Contains(str("parameter 'unused' (leaf #", spare.id(), " 'unused' (test_debug.cpp:", unused_line,
                            "))")));
    CHECK_THAT(report.issues.front().message, Contains(str("sum #", loss.id(), " (test_debug.cpp:", loss_line, ")")));
    CHECK_THAT(report.issues.front().message, Contains("it does not reach the loss"));
    CHECK_THAT(text, Contains("'frozen'"));
    CHECK_THAT(text, Contains("recorded under NoGradGuard"));
    CHECK_THAT(text, Contains("3 unused parameter"));
    // The mul_scalar under the detach computes a value, not a gradient path: an unused node.
    CHECK(report.count(LintIssue::Kind::UnusedNode) == 1);
}

TEST_CASE("lint lists computations that do not reach the loss", "[debug][lint]") {
    ComputeGraph graph;
    Var x = graph.input(randn({2, 3}), "x", true);
    Var h = tanh(x);
    Var forgotten = relu(h);
    const int forgotten_line = __LINE__ - 1;
    forgotten.name("forgotten");
    Var loss = mean(h);
    Var metric = softmax(h);  // computed after the loss, for a report: it does not feed the loss either
    const LintReport report = lint(graph, loss);
    INFO(report.to_string());
    check_first_issue(report, 2, LintIssue::Kind::UnusedNode, forgotten,
                      {str("relu #", forgotten.id(), " 'forgotten' (test_debug.cpp:", forgotten_line,
                           ") (2,3) float64 cpu"),
                       "does not contribute to mean"});
    CHECK(report.issues[1].node == metric.id());
    CHECK(report.count(LintIssue::Kind::UnusedParameter) == 0);
}

TEST_CASE("lint lists ops that have no backward kernel on their device", "[debug][lint]") {
    // No op the library accepts lacks a backward (CustomOp::define insists on one for each backend it has
    // a forward for), so this test removes the CPU backward from its own op's registered definition.
    static const CustomOp forward_only =
        CustomOp::define({.name = "forward_only", .arity = 1, .infer = same_shape,
                          .cpu = {copy_forward, copy_backward}});
    const_cast<OpDef&>(forward_only.def()).cpu.backward = nullptr;

    ComputeGraph graph;
    Var x = graph.input(randn({3}), "x", true);
    Var c = graph.input(randn({3}), "c");
    Var y = forward_only({x});
    const int line = __LINE__ - 1;
    Var constant_path = forward_only({c});  // needs no gradient: no issue
    Var loss = sum(y * constant_path);
    const LintReport report = lint(graph, loss);
    INFO(report.to_string());
    check_first_issue(report, 1, LintIssue::Kind::MissingBackward, y,
                      {str("forward_only #", y.id(), " (test_debug.cpp:", line, ") has no backward kernel on cpu"),
                       "input 0 (leaf #0 'x'"});
    // What lint predicted is what backward hits.
    CHECK_THROWS_MATCHES(graph.backward(loss), DeviceError, MessageHas({"forward_only", "no backward kernel on cpu"}));
}

TEST_CASE("lint needs a live loss of the same graph", "[debug][lint]") {
    ComputeGraph graph, other;
    Var loss = sum(graph.input(randn({2}), "x", true));
    Var foreign = sum(other.input(randn({2}), "y", true));
    CHECK_THROWS_MATCHES(lint(graph, foreign), GraphError, MessageHas({"lint", "another graph"}));
    graph.clear();
    CHECK_THROWS_MATCHES(lint(graph, loss), GraphError, MessageHas({"cleared"}));
    CHECK_THROWS_AS(lint(graph, Var()), GraphError);
}

TEST_CASE("to_dot writes one node per graph node and one edge per input", "[debug][dot]") {
    Parameter w(randn({3, 4}), "w");
    ComputeGraph graph;
    Var x = graph.input(randn({2, 4}), "x");
    Var h = relu(linear(x, graph.parameter(w)));  // leaf x, leaf w, transpose, matmul, relu
    h.name("hidden");
    Var loss = sum(h * h);
    const std::string dot = to_dot(graph);
    INFO(dot);
    CHECK(dot.starts_with("digraph dyngrad {\n"));
    CHECK(dot.ends_with("}\n"));
    CHECK(count_matches(dot, std::regex(R"(\n  n\d+ \[label=)")) == graph.size());
    std::size_t inputs = 0;
    for (NodeId id = 0; id < graph.size(); ++id) inputs += graph.node(id).inputs.size();
    CHECK(count_matches(dot, std::regex(R"(\n  n\d+ -> n\d+;)")) == inputs);
    // h * h: the same input twice, two edges.
    CHECK(count_matches(dot, std::regex(str("\n  n", h.id(), " -> n", h.id() + 1, ";"))) == 2);
    CHECK_THAT(dot, Contains(str("n", x.id(), " -> n", x.id() + 3, ";")));  // x feeds the matmul
    CHECK_THAT(dot, Contains(str("  n", h.id(), " [label=\"relu #", h.id(), " 'hidden' (test_debug.cpp:")));
    CHECK_THAT(dot, Contains("\\n(2,3) float64 cpu\"]"));
    CHECK_THAT(dot, Contains("leaf #1 'w'"));
    CHECK_THAT(dot, Contains("(3,4) float64 cpu\", shape=ellipse]"));
    CHECK_THAT(dot, Contains(str("sum #", loss.id())));
    CHECK_THAT(dot, Contains("\\n() float64 cpu"));
    CHECK(dot.find("err") == std::string::npos);  // no report, no errors
    CHECK(to_dot(ComputeGraph()) == "digraph dyngrad {\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n}\n");
}

TEST_CASE("to_dot escapes names and shows verify's errors", "[debug][dot]") {
    ComputeGraph graph;
    Var x = graph.input(randn({3}, DType::f32), "say \"hi\" \\ there", true);
    Var k = graph.input(randn({3}, DType::f32), "k");
    Var y = exp(x);
    Var loss = sum(y * k);
    const std::string escaped = to_dot(graph);
    CHECK_THAT(escaped, Contains("'say \\\"hi\\\" \\\\ there'"));

    const VerifyReport report = verify(graph, loss);
    REQUIRE(report.pass);
    const std::string checked = to_dot(graph, &report);
    INFO(checked);
    CHECK(report.nodes.size() == 5);
    CHECK(count_matches(checked, std::regex("value err")) == 3);  // leaves' values are not compared
    CHECK(count_matches(checked, std::regex("grad err")) == 4);   // k needs no gradient
    CHECK_THAT(checked, Contains("there' (test_debug.cpp:"));
    CHECK_THAT(checked, Contains("(3) float32 cpu\\ngrad err "));
    CHECK_THAT(checked, Contains(str("  n", k.id(), " [label=\"leaf #", k.id(), " 'k' (test_debug.cpp:")));
    CHECK(count_matches(checked, std::regex(R"(\(3\) float32 cpu", shape=ellipse\])")) == 1);  // k: nothing to add
    CHECK(checked.find("color=red") == std::string::npos);

    // A failed node is labelled and drawn red.
    VerifyReport failed = report;
    NodeCheck& bad =
        *std::find_if(failed.nodes.begin(), failed.nodes.end(), [&](const NodeCheck& c) { return c.id == y.id(); });
    bad.pass = false;
    bad.grad_rel_err = 0.5;
    const std::string red = to_dot(graph, &failed);
    INFO(red);
    CHECK(count_matches(red, std::regex(", color=red")) == 1);
    CHECK_THAT(red, Contains("grad err 5.00e-01  FAIL\", color=red, fontcolor=red, penwidth=2]"));
    CHECK_THAT(red, Contains(str("  n", y.id(), " [label=\"exp #", y.id())));
}
