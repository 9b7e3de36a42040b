#include "dyngrad/graph/verify.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <limits>
#include <sstream>

#include "dyngrad/cuda/runtime.h"
#include "dyngrad/graph/custom_op.h"

namespace dyngrad {

namespace {

using Clock = std::chrono::steady_clock;

double elapsed_ms(Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Waits for queued GPU work so wall-clock timings cover it.
void wait_for(Device device) {
    if (device.is_cuda()) cuda::synchronize(device.index);
}

double default_tolerance(DType dtype) {
    if (dtype == DType::f64) return 1e-10;
    // Each node is compared with the replay from the leaves, so roundings compound along the graph: 16 unit
    // roundoffs cover a few ops of 4 u each (reduced_precision_tolerance); a deeper graph sets its own.
    if (is_reduced_precision(dtype)) return 16 * unit_roundoff(dtype);
    return cuda::allow_tf32() ? 1e-3 : 1e-5;
}

// Ids of the nodes `root` depends on (itself included), ascending.
std::vector<NodeId> reachable_from(const ComputeGraph& graph, NodeId root) {
    std::vector<char> marked(root + 1, 0);
    marked[root] = 1;
    for (NodeId id = root + 1; id-- > 0;) {
        if (!marked[id]) continue;
        for (NodeId in : graph.node(id).inputs) marked[in] = 1;
    }
    std::vector<NodeId> ids;
    for (NodeId id = 0; id <= root; ++id)
        if (marked[id]) ids.push_back(id);
    return ids;
}

Tensor to_reference(const Tensor& t, DType reference_dtype) {
    const Tensor host = t.to(Device::cpu());
    return is_floating(host.dtype()) ? host.to(reference_dtype) : host;
}

// Ops whose gradient goes to the input element that compares largest (max pooling, max). Where two
// candidates lie within the device's rounding of each other, the float64 replay may pick the other one and
// route that gradient to a neighbour: one such flip among the 737,280 outputs of lenet's first convolution
// at batch 64 moves the gradient's relative norm by ~3e-3, far above any tolerance, though both are right.
bool decides_by_order(OpType op) { return op == OpType::MaxPool2d || op == OpType::Max; }

// x_replay + (x_device - x_replay), the difference a constant: the replay's max then compares the device's
// own values and picks the device's element, while the gradient still flows to x_replay unchanged. The
// value of x itself is still checked at its own node.
Var anchored(ComputeGraph& replay, const Var& x_replay, const Tensor& x_device, const VerifyOptions& options,
             std::source_location where) {
    Var device_values = replay.constant(to_reference(x_device, options.reference_dtype), where);
    Var difference;
    {
        const NoGradGuard constant;
        difference = replay.record(OpType::Sub, {device_values, x_replay}, OpAttrs{}, where);
    }
    return replay.record(OpType::Add, {x_replay, difference}, OpAttrs{}, where);
}

}  // namespace

VerifyReport verify(ComputeGraph& graph, const Var& output, const Tensor& grad_output, const VerifyOptions& options) {
    const NodeId root = output.id();
    const ComputeNode& out_node = output.node();
    VerifyReport report;
    report.tolerance = options.tolerance > 0 ? options.tolerance : default_tolerance(out_node.value.dtype());

    Tensor seed = grad_output;
    if (!seed.defined()) {
        if (out_node.value.numel() != 1)
            throw GraphError(str("verify: ", graph.describe_node(root), " has shape ",
                                 to_string(out_node.value.shape()), "; pass the gradient to seed backward with"));
        seed = Tensor::ones(out_node.value.shape(), out_node.value.dtype(), out_node.value.device());
    }
    // The seed seeds both the graph's backward and the replay's: a wrong one is the caller's argument.
    if (seed.shape() != out_node.value.shape() || seed.dtype() != out_node.value.dtype() ||
        seed.device() != out_node.value.device())
        throw GraphError(str("verify: the output gradient grad_output ", describe(seed), " does not match the output ",
                             graph.describe_node(root), " of ", describe(out_node.value),
                             "; it needs the output's shape, dtype and device"));
    if (out_node.requires_grad && !out_node.grad.defined()) {
        try {
            graph.backward(output, seed, BackwardOptions{.retain_graph = false, .retain_grads = true});
        } catch (...) {
            rethrow_with_context(str("verify: the backward it runs from ", graph.describe_node(root), " failed (it ",
                                     "compares gradients of a graph not yet back-propagated, or of a backward run ",
                                     "with BackwardOptions{.retain_grads = true})"));
        }
    }

    // Replay every reachable node on the CPU from copies of the leaves.
    const std::vector<NodeId> ids = reachable_from(graph, root);
    const auto replay_start = Clock::now();
    ComputeGraph replay;
    std::vector<Var> mapped(root + 1);
    for (NodeId id : ids) {
        const ComputeNode& n = graph.node(id);
        if (n.op == OpType::Leaf) {
            mapped[id] = replay.input(to_reference(n.value, options.reference_dtype), n.name, n.requires_grad, n.where);
            continue;
        }
        std::vector<Var> inputs;
        for (NodeId in : n.inputs) inputs.push_back(mapped[in]);
        if (decides_by_order(n.op)) inputs[0] = anchored(replay, inputs[0], graph.node(n.inputs[0]).value, options, n.where);
        mapped[id] = replay.record(n.op, inputs, n.attrs, n.where);
        mapped[id].name(n.name);
    }
    if (out_node.requires_grad)
        replay.backward(mapped[root], to_reference(seed, options.reference_dtype),
                        BackwardOptions{.retain_graph = false, .retain_grads = true});
    report.cpu_ms = elapsed_ms(replay_start);

    report.pass = true;
    for (NodeId id : ids) {
        const ComputeNode& n = graph.node(id);
        const ComputeNode& ref = replay.node(mapped[id].id());
        NodeCheck check;
        check.id = id;
        check.op = op_def(n.op, n.attrs).name;
        check.name = graph.describe_node(id);
        check.shape = to_string(n.value.shape());
        // Leaves are the replay's inputs, copied: their values are not compared (an op may have
        // updated one in place since, as batch_norm does with its running statistics).
        if (n.op != OpType::Leaf) {
            check.value_rel_err = relative_norm_error(n.value, ref.value);
            check.value_abs_err = max_abs_error(n.value, ref.value);
        }
        check.pass = check.value_rel_err <= report.tolerance;
        if (ref.grad.defined()) {
            check.has_grad = true;
            if (n.grad.defined()) {
                check.grad_rel_err = relative_norm_error(n.grad, ref.grad);
                check.grad_abs_err = max_abs_error(n.grad, ref.grad);
            } else {
                check.grad_rel_err = check.grad_abs_err = std::numeric_limits<double>::infinity();
            }
            check.pass = check.pass && check.grad_rel_err <= report.tolerance;
        }
        if (!check.pass && report.first_divergence < 0)
            report.first_divergence = static_cast<std::int64_t>(report.nodes.size());
        report.pass = report.pass && check.pass;
        report.nodes.push_back(std::move(check));
    }
    return report;
}

std::string VerifyReport::summary() const {
    double worst_value = 0, worst_grad = 0;
    for (const NodeCheck& c : nodes) {
        worst_value = std::max(worst_value, c.value_rel_err);
        worst_grad = std::max(worst_grad, c.grad_rel_err);
    }
    std::ostringstream out;
    out << std::scientific << std::setprecision(2);
    out << (pass ? "PASS" : "FAIL") << ": " << nodes.size() << " nodes, tolerance " << tolerance
        << ", worst value error " << worst_value << ", worst gradient error " << worst_grad;
    if (first_divergence >= 0) {
        const NodeCheck& c = nodes[static_cast<std::size_t>(first_divergence)];
        out << "; first diverging node: " << c.name << " " << c.shape << " (value " << c.value_rel_err
            << ", gradient " << c.grad_rel_err << ")";
    }
    return out.str();
}

std::string VerifyReport::table() const {
    std::ostringstream out;
    out << std::left << std::setw(48) << "node" << std::setw(18) << "shape" << std::setw(12) << "value err"
        << std::setw(12) << "grad err" << "pass\n";
    out << std::scientific << std::setprecision(2);
    for (const NodeCheck& c : nodes) {
        out << std::setw(48) << c.name << std::setw(18) << c.shape << std::setw(12) << c.value_rel_err;
        if (c.has_grad)
            out << std::setw(12) << c.grad_rel_err;
        else
            out << std::setw(12) << "-";
        out << (c.pass ? "yes" : "NO") << "\n";
    }
    return out.str();
}

ShadowVerifier::ShadowVerifier(std::int64_t every_k_steps, VerifyOptions options, bool throw_on_failure)
    : every_(every_k_steps), options_(options), throw_on_failure_(throw_on_failure) {
    if (every_k_steps < 0) throw ValueError(str("ShadowVerifier: every_k_steps must be >= 0, got ", every_k_steps));
}

BackwardOptions ShadowVerifier::backward_options(std::int64_t step) const {
    return BackwardOptions{.retain_graph = false, .retain_grads = due(step)};
}

const VerifyReport& ShadowVerifier::check(ComputeGraph& graph, const Var& loss) {
    last_ = verify(graph, loss, Tensor(), options_);
    ++checks_;
    if (!last_.pass) {
        ++failures_;
        if (throw_on_failure_) throw GraphError(str("shadow verification failed: ", last_.summary()));
    }
    return last_;
}

CheckResult gpu_vs_cpu_check(const OpDef& def, const OpCase& op_case, Generator& gen, double tolerance,
                             Device device) {
    CheckResult r;
    r.op = def.name;
    r.case_label = op_case.label;
    for (std::size_t i = 0; i < op_case.shapes.size(); ++i) {
        r.shapes += i ? " " : "";
        r.shapes += to_string(op_case.shapes[i]);
    }
    r.check = "gpu_vs_cpu";
    r.tolerance = tolerance;
    try {
        std::vector<Tensor> inputs;
        for (const Tensor& t : make_case_inputs(op_case, DType::f32, gen)) inputs.push_back(t.to(device));
        auto run_on_device = [&](ComputeGraph& graph, const Tensor* weights) {
            std::vector<Var> vars;
            for (std::size_t i = 0; i < inputs.size(); ++i)
                vars.push_back(graph.input(inputs[i], str("input", i), gradient_checked(op_case, i, inputs[i])));
            OpAttrs attrs = op_case.attrs;
            if (def.op == OpType::Custom) attrs.custom_id = custom_op_id(def);
            Var y = graph.record(def.op, vars, attrs, std::source_location::current());
            if (weights && y.requires_grad()) graph.backward(y, *weights, BackwardOptions{.retain_graph = false, .retain_grads = true});
            return y;
        };
        // Warm-up: first use of a shape may create handles, plans and pool memory.
        Tensor weights;
        {
            ComputeGraph warm;
            const Var y = run_on_device(warm, nullptr);
            // A non-differentiable op's output (an int64 argmax) gets no backward; verify() still wants a seed of its dtype.
            // In the output's dtype: float32, but cast's is its target dtype.
            weights = y.requires_grad() ? Tensor::normal(y.shape(), 0.0, 1.0, gen, DType::f32).to(y.dtype()).to(device)
                                        : Tensor::zeros(y.shape(), y.dtype(), device);
            ComputeGraph warm_backward;
            run_on_device(warm_backward, &weights);
        }
        ComputeGraph graph;
        wait_for(device);
        const auto start = Clock::now();
        const Var y = run_on_device(graph, &weights);
        wait_for(device);
        r.gpu_ms = elapsed_ms(start);

        const VerifyReport report = verify(graph, y, weights, VerifyOptions{.tolerance = tolerance});
        r.cpu_ms = report.cpu_ms;
        for (const NodeCheck& c : report.nodes) {
            if (c.op == std::string_view("leaf") && !c.has_grad) continue;
            const double rel = std::max(c.value_rel_err, c.grad_rel_err);
            if (r.detail.empty() || rel > r.max_rel_err) r.detail = str("worst: ", c.name);
            r.max_rel_err = std::max(r.max_rel_err, rel);
            r.max_abs_err = std::max({r.max_abs_err, c.value_abs_err, c.grad_abs_err});
        }
        r.pass = report.pass;
        if (!report.pass) r.detail = report.summary();
    } catch (const std::exception& e) {
        r.pass = false;
        r.max_rel_err = std::numeric_limits<double>::infinity();
        r.detail = str("threw: ", e.what());
    }
    return r;
}

}  // namespace dyngrad
