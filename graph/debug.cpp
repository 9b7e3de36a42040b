// Graph lint and Graphviz output (graph/debug.h).
#include "dyngrad/graph/debug.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "dyngrad/graph/verify.h"

namespace dyngrad {

namespace {

const char* kind_name(LintIssue::Kind kind) {
    switch (kind) {
        case LintIssue::Kind::UnusedParameter: return "unused parameter";
        case LintIssue::Kind::MissingBackward: return "missing backward";
        case LintIssue::Kind::UnusedNode: return "unused node";
    }
    return "unknown";
}

// Nodes `root` depends on (root included); with `grad_only`, only through nodes that require grad:
// the nodes backward(root) visits.
std::vector<char> ancestors(const ComputeGraph& graph, NodeId root, bool grad_only) {
    std::vector<char> marked(graph.size(), 0);
    marked[root] = 1;
    for (NodeId id = root + 1; id-- > 0;) {
        if (!marked[id]) continue;
        for (NodeId in : graph.node(id).inputs)
            if (!grad_only || graph.node(in).requires_grad) marked[in] = 1;
    }
    return marked;
}

// Escapes a DOT string's quotes and backslashes; newlines become DOT's "\n".
std::string dot_escape(const std::string& text) {
    std::string out;
    for (const char c : text) {
        if (c == '"' || c == '\\') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

}  // namespace

std::size_t LintReport::count(LintIssue::Kind kind) const {
    std::size_t n = 0;
    for (const LintIssue& issue : issues) n += issue.kind == kind;
    return n;
}

std::string LintReport::to_string() const {
    if (issues.empty()) return "lint: clean";
    std::string out = str("lint: ", issues.size(), issues.size() == 1 ? " issue" : " issues", " (",
                          count(LintIssue::Kind::UnusedParameter), " unused parameter, ",
                          count(LintIssue::Kind::MissingBackward), " missing backward, ",
                          count(LintIssue::Kind::UnusedNode), " unused node)");
    for (const LintIssue& issue : issues) out += str("\n  ", kind_name(issue.kind), ": ", issue.message);
    return out;
}

LintReport lint(const ComputeGraph& graph, const Var& loss) {
    if (&loss.graph() != &graph) throw GraphError("lint: the loss belongs to another graph");
    const NodeId root = loss.id();
    const std::vector<char> reaches = ancestors(graph, root, false);
    const std::vector<char> visited = graph.node(root).requires_grad ? ancestors(graph, root, true)
                                                                     : std::vector<char>(graph.size(), 0);
    LintReport report;

    // A parameter recorded several times gets a gradient when any of its leaves is visited. Copies of a
    // Parameter share one value tensor, so its address identifies the parameter.
    std::map<const Tensor*, std::vector<NodeId>> parameter_leaves;
    for (NodeId id = 0; id < graph.size(); ++id) {
        const ComputeNode& n = graph.node(id);
        if (n.op == OpType::Leaf && n.parameter.defined()) parameter_leaves[&n.parameter.value()].push_back(id);
    }
    for (const auto& [value, leaves] : parameter_leaves) {
        bool gets_grad = false, any_requires_grad = false;
        for (NodeId id : leaves) {
            gets_grad = gets_grad || visited[id];
            any_requires_grad = any_requires_grad || graph.node(id).requires_grad;
        }
        if (gets_grad) continue;
        const NodeId first = leaves.front();
        const char* why = any_requires_grad ? "it does not reach the loss" : "it was recorded under NoGradGuard";
        report.issues.push_back({LintIssue::Kind::UnusedParameter, first,
                                     str("parameter '", graph.node(first).parameter.name(), "' (",
                                         graph.describe_node(first), ") receives no gradient from ",
                                         graph.describe_node(root), ": ", why)});
    }

    for (NodeId id = 0; id < graph.size(); ++id) {
        const ComputeNode& n = graph.node(id);
        if (n.op == OpType::Leaf || id == root) continue;
        if (!reaches[id]) {
            report.issues.push_back({LintIssue::Kind::UnusedNode, id,
                                     str(graph.describe_node(id), " ", describe(n.value),
                                         " does not contribute to ", graph.describe_node(root))});
            continue;
        }
        if (!visited[id]) continue;
        const OpDef& def = op_def(n.op, n.attrs);
        const Device device = n.value.device();
        if ((device.is_cpu() ? def.cpu : def.cuda).backward) continue;
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
            if (!graph.node(n.inputs[i]).requires_grad) continue;
            report.issues.push_back({LintIssue::Kind::MissingBackward, id,
                                     str(graph.describe_node(id), " has no backward kernel on ", device.to_string(),
                                         ", but its input ", i, " (", graph.describe_node(n.inputs[i]),
                                         ") needs a gradient")});
            break;
        }
    }
    std::stable_sort(report.issues.begin(), report.issues.end(),
                     [](const LintIssue& a, const LintIssue& b) { return a.node < b.node; });
    return report;
}

std::string to_dot(const ComputeGraph& graph, const VerifyReport* report) {
    std::map<NodeId, const NodeCheck*> checks;
    if (report)
        for (const NodeCheck& check : report->nodes) checks[check.id] = &check;

    std::ostringstream out;
    out << "digraph dyngrad {\n";
    out << "  node [shape=box, fontname=\"monospace\", fontsize=10];\n";
    for (NodeId id = 0; id < graph.size(); ++id) {
        const ComputeNode& n = graph.node(id);
        std::string label = str(graph.describe_node(id), "\n", describe(n.value));
        std::string style = n.op == OpType::Leaf ? "shape=ellipse" : "";
        const auto found = checks.find(id);
        if (found != checks.end()) {
            const NodeCheck& c = *found->second;
            // verify does not compare leaves' values (they are the replay's inputs), only their gradients.
            std::ostringstream errors;
            errors.precision(2);
            errors << std::scientific;
            if (n.op != OpType::Leaf) errors << "value err " << c.value_rel_err << (c.has_grad ? ", " : "");
            if (c.has_grad) errors << "grad err " << c.grad_rel_err;
            if (!c.pass) errors << "  FAIL";
            if (!errors.str().empty()) label += str("\n", errors.str());
            if (!c.pass) style += str(style.empty() ? "" : ", ", "color=red, fontcolor=red, penwidth=2");
        }
        out << "  n" << id << " [label=\"" << dot_escape(label) << "\"" << (style.empty() ? "" : ", ") << style
            << "];\n";
    }
    for (NodeId id = 0; id < graph.size(); ++id)
        for (NodeId in : graph.node(id).inputs) out << "  n" << in << " -> n" << id << ";\n";
    out << "}\n";
    return out.str();
}

}  // namespace dyngrad
