// Verification by replay: the recorded nodes of a (GPU) graph are replayed on the Eigen CPU backend
// in float64 from copies of the leaves; every node value and every gradient is compared.
#pragma once
#include <string>
#include <vector>

#include "dyngrad/graph/gradcheck.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

struct VerifyOptions {
    DType reference_dtype = DType::f64;
    // Relative-norm tolerance; 0 picks by the run's dtype: 1e-5 for float32 (1e-3 with TF32 on), 1e-10 for float64,
    // 16 unit roundoffs for bfloat16 (6.3e-2) and float16 (7.8e-3): roundings compound along a graph.
    double tolerance = 0;
};

struct NodeCheck {
    NodeId id = 0;
    std::string op;
    std::string name;  // "relu #12 'h1' (model.cpp:42)"
    std::string shape;
    double value_rel_err = 0, value_abs_err = 0;
    double grad_rel_err = 0, grad_abs_err = 0;  // 0 when the node has no gradient
    bool has_grad = false;
    bool pass = false;
};

struct VerifyReport {
    std::vector<NodeCheck> nodes;  // reachable nodes in id order
    double tolerance = 0;
    bool pass = false;
    std::int64_t first_divergence = -1;  // index into nodes, -1 when everything passed
    double gpu_ms = 0;                     // forward+backward of the original run when measured by the caller
    double cpu_ms = 0;                     // replay forward+backward on the CPU
    std::string summary() const;           // one line: pass/fail, worst errors, first diverging node
    std::string table() const;             // one row per node
};

// `graph` must still hold the values of the nodes reachable from `output`. The gradients compared
// are those of the last backward from `output` run with BackwardOptions{.retain_grads = true};
// when none is present (no backward yet), verify runs that backward itself, seeding with
// `grad_output` (ones for a one-element output when undefined).
VerifyReport verify(ComputeGraph& graph, const Var& output, const Tensor& grad_output = Tensor(),
                    const VerifyOptions& options = {});

// Shadow verification for training loops: verify every k-th step of a real run at a chosen cost.
//   graph.backward(loss, shadow.backward_options(step));
//   if (shadow.due(step)) shadow.check(graph, loss);   // after backward, before the optimizer step
class ShadowVerifier {
public:
    explicit ShadowVerifier(std::int64_t every_k_steps, VerifyOptions options = {}, bool throw_on_failure = true);
    bool due(std::int64_t step) const { return every_ > 0 && step % every_ == 0; }
    // On due steps keeps every node's gradient for the comparison.
    BackwardOptions backward_options(std::int64_t step) const;
    // Replays and compares; throws GraphError carrying the report's summary on a failure when asked to.
    const VerifyReport& check(ComputeGraph& graph, const Var& loss);
    std::int64_t checks() const { return checks_; }
    std::int64_t failures() const { return failures_; }
    const VerifyReport& last_report() const { return last_; }

private:
    std::int64_t every_;
    VerifyOptions options_;
    bool throw_on_failure_;
    std::int64_t checks_ = 0, failures_ = 0;
    VerifyReport last_;
};

// gpu_vs_cpu check of one op-table row on one case: float32 on `device`, replayed in float64 on the CPU.
CheckResult gpu_vs_cpu_check(const OpDef& def, const OpCase& op_case, Generator& gen, double tolerance = 1e-5,
                             Device device = Device::cuda(0));

}  // namespace dyngrad
