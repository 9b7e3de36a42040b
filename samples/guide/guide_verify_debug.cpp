#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    bool ok = true;
    // Anomaly mode: the first NaN or Inf of a forward or backward throws, naming the node that made it.
    {
        AnomalyModeGuard anomaly;
        ComputeGraph graph;
        Var x = graph.input(Tensor::of({4.0, -1.0, 9.0}), "x", true);
        try {
            sqrt(x);  // sqrt(-1) is NaN: throws here, at the op that made it
            ok = false;
        } catch (const NumericalError& e) {
            std::cout << "anomaly mode: " << e.what() << "\n\n";
        }
    }

    // lint(): what backward(loss) would silently get wrong, before running it.
    Parameter used(Tensor::of({1.0, 2.0}), "used"), forgotten(Tensor::of({3.0}), "forgotten");
    ComputeGraph graph;
    Var loss = sum(graph.parameter(used) * 2.0).name("loss");
    graph.parameter(forgotten) * 3.0;  // computed, but never added to the loss
    const LintReport lint_report = lint(graph, loss);
    std::cout << lint_report.to_string() << "\n";
    ok = ok && lint_report.count(LintIssue::Kind::UnusedParameter) == 1 &&
         lint_report.count(LintIssue::Kind::UnusedNode) == 1;

    // to_dot(): the graph for Graphviz (`dot -Tsvg graph.dot -o graph.svg`); verify()'s report colours it.
    const VerifyReport report = verify(graph, loss);
    const std::string dot = to_dot(graph, &report);
    const auto path = std::filesystem::temp_directory_path() / "guide_graph.dot";
    std::ofstream(path) << dot;
    std::cout << "wrote " << path.string() << " (" << dot.size() << " bytes)\n";
    std::filesystem::remove(path);
    return ok && dot.starts_with("digraph") ? 0 : 1;
}
