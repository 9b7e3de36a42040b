// The recorded backward sweep (create_graph) and the functional grad(): the same reverse sweep over creation
// order as ComputeGraph::sweep (graph/graph.cpp), but each node's gradient is a Var. With create_graph the
// gradients are recorded nodes appended to the graph (ids above every node they come from, so creation order
// stays a topological order and a later backward sweeps them like any other node); without it, grad() runs the
// kernels and wraps their results as constants. Kept apart from graph.cpp so that the first-order sweep is
// untouched: it pays one test of BackwardOptions::create_graph per backward call.
#include "dyngrad/graph/higher_order.h"

#include <algorithm>
#include <unordered_set>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/graph/backend.h"
#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/graph/through_f32.h"

namespace dyngrad {

namespace {

Var record_op(const Var& first, OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs = {}) {
    return first.graph().record(op, inputs, attrs, std::source_location::current());
}

// Broadcast gradients summed back to the input's shape, as recorded ops (sum over the leading axes the
// broadcast added and the axes it stretched from 1, then a reshape): the engine's sum_to (graph/backend.h) for Vars.
Var sum_to_var(const Var& g, const Shape& shape, const std::string& where) {
    const Shape& from = g.shape();
    if (from.size() < shape.size())
        throw ShapeError(str(where, ": a gradient of shape ", to_string(from), " cannot be summed to ", to_string(shape)));
    const std::size_t lead = from.size() - shape.size();
    OpAttrs sum;
    sum.keepdim = true;
    for (std::size_t i = 0; i < from.size(); ++i) {
        if (i < lead || (shape[i - lead] == 1 && from[i] != 1)) {
            sum.axes.push_back(static_cast<std::int64_t>(i));
        } else if (shape[i - lead] != from[i]) {
            throw ShapeError(str(where, ": a gradient of shape ", to_string(from), " for an input of shape ",
                                 to_string(shape), "; a gradient must have its input's shape or one it broadcasts to"));
        }
    }
    Var out = sum.axes.empty() ? g : record_op(g, OpType::Sum, {g}, sum);
    if (out.shape() != shape) {
        OpAttrs reshape;
        reshape.shape = shape;
        out = record_op(out, OpType::Reshape, {out}, reshape);
    }
    return out;
}

// Accumulation at fan-out as a recorded add (a plain move for the first contribution).
void accumulate_var(Var& slot, Var g) {
    slot = slot.defined() ? record_op(slot, OpType::Add, {slot, g}) : std::move(g);
}

// Sets this thread's grad mode for a scope: on while recording a backward, off for grad() without create_graph
// (its op calls then run eagerly and record constant leaves).
std::string describe_inputs_text(std::span<const Tensor> inputs) {
    std::string out;
    for (const Tensor& t : inputs) out += (out.empty() ? "" : ", ") + describe(t);
    return out;
}

class GradModeScope {
public:
    explicit GradModeScope(bool enabled) : previous_(detail::exchange_grad_enabled(enabled)) {}
    ~GradModeScope() { detail::exchange_grad_enabled(previous_); }
    GradModeScope(const GradModeScope&) = delete;
    GradModeScope& operator=(const GradModeScope&) = delete;

private:
    bool previous_;
};

}  // namespace

namespace detail {

std::vector<Var> HigherOrder::sweep(ComputeGraph& graph, std::span<const NodeId> roots, std::span<const Var> seeds,
                                    std::span<const NodeId> wanted, bool create_graph, bool retain_graph,
                                    const BackwardOptions* leaf_options, std::optional<NodeId> floor) {
    auto& nodes = graph.nodes_;
    const NodeId top = *std::max_element(roots.begin(), roots.end());
    if (graph.saved_released_)
        throw HigherOrderError(str(create_graph ? "backward with create_graph" : "grad", " from ",
                                   graph.describe_node(top), ": this graph was already back-propagated and its ",
                                   "saved tensors were released; pass retain_graph (or create_graph) to the earlier ",
                                   "backward to differentiate through it again"));
    // Nodes below `lo` are never expanded (a composition's sweep: everything up to the op's node), so its arrays
    // cover [lo, top] only and the wanted nodes below lo (the op's inputs) get their gradients in `below`: a nested
    // sweep costs the size of the composition, not of the graph.
    const NodeId lo = floor ? *floor + 1 : 0;
    const std::size_t span_size = top + 1 - lo;
    std::vector<std::pair<NodeId, Var>> below;
    for (NodeId w : wanted)
        if (w < lo) below.emplace_back(w, Var());
    const auto wanted_below = [&](NodeId id) {
        return std::any_of(below.begin(), below.end(), [&](const auto& b) { return b.first == id; });
    };
    // reaches[id - lo]: a wanted node is reachable from id through inputs that require grad (a wanted node reaches
    // itself). Only such nodes get a backward: a first-order-only op that leads to nothing wanted is no error.
    std::vector<char> reaches(span_size, 0), is_wanted(span_size, 0);
    for (NodeId w : wanted)
        if (w >= lo && w <= top) reaches[w - lo] = is_wanted[w - lo] = 1;
    const auto reaches_input = [&](NodeId in) {
        return nodes[in]->requires_grad && (in >= lo ? reaches[in - lo] != 0 : wanted_below(in));
    };
    for (NodeId id = lo; id <= top; ++id)
        for (NodeId in : nodes[id]->inputs)
            if (reaches_input(in)) reaches[id - lo] = 1;
    std::vector<char> needed(span_size, 0);
    for (NodeId r : roots) needed[r - lo] = reaches[r - lo];
    for (NodeId id = top + 1; id-- > lo;) {
        if (!needed[id - lo]) continue;
        for (NodeId in : nodes[id]->inputs)
            if (in >= lo && reaches_input(in)) needed[in - lo] = 1;
    }
    const auto needs = [&](NodeId in) { return in >= lo ? needed[in - lo] != 0 : wanted_below(in); };

    const GradModeScope mode(create_graph);
    std::vector<Var> grads(span_size);
    const auto slot = [&](NodeId id) -> Var& {
        if (id >= lo) return grads[id - lo];
        return std::find_if(below.begin(), below.end(), [&](const auto& b) { return b.first == id; })->second;
    };
    for (std::size_t k = 0; k < roots.size(); ++k)
        if (needed[roots[k] - lo]) accumulate_var(grads[roots[k] - lo], seeds[k]);

    std::vector<Tensor> input_values;
    std::vector<Var> input_vars;
    std::vector<char> needs_grad_storage;
    for (NodeId id = top + 1; id-- > lo;) {
        ComputeNode& n = *nodes[id];  // nodes live behind unique_ptrs: recording more keeps this reference valid
        if (!needed[id - lo] || !grads[id - lo].defined() || n.op == OpType::Leaf) continue;
        const OpDef& def = op_def(n.op, n.attrs);
        input_values.clear();
        input_vars.clear();
        needs_grad_storage.assign(n.inputs.size(), 0);
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
            input_values.push_back(nodes[n.inputs[i]]->value);
            input_vars.push_back(graph.handle(n.inputs[i]));
            needs_grad_storage[i] = needs(n.inputs[i]);
        }
        const std::span<const bool> needs_grad(reinterpret_cast<const bool*>(needs_grad_storage.data()),
                                               needs_grad_storage.size());
        graph.check_versions(id, input_values);  // an in-place write between the forward and this backward
        std::vector<Var> in_grads;
        if (create_graph) {
            if (def.differentiable_backward == nullptr)
                throw HigherOrderError(str("create_graph: ", graph.describe_node(id), " with inputs ",
                                           describe_inputs_text(input_values), ": op '", def.name,
                                           "' has no differentiable backward (first-order only, docs/ops.md); its ",
                                           "gradient cannot be differentiated again"));
            const Var output = graph.handle(id);
            in_grads = def.differentiable_backward(
                DiffBackwardArgs{n.op, input_vars, output, grads[id - lo], n.attrs, needs_grad});
        } else {
            const BackendKernels& k = n.value.device().is_cpu() ? def.cpu : def.cuda;
            if (!k.backward)
                throw DeviceError(str(graph.describe_node(id), ": no backward kernel on ", n.value.device().to_string()));
            const Tensor grad_output = grads[id - lo].value();
            const std::vector<Tensor> tensors = run_backward_kernel(
                k, BackwardArgs{n.op, input_values, n.value, grad_output, n.attrs, n.saved, needs_grad});
            // A weight gradient a backward left to a backend's side work is read by ops next: its pending writes
            // first (core/device_memory.h), as the first-order sweep does where it reads a gradient.
            for (const Tensor& t : tensors) device_memory::await_writes(t);
            for (const Tensor& t : tensors) in_grads.push_back(t.defined() ? graph.constant(t) : Var());
        }
        if (in_grads.size() != n.inputs.size())
            throw GraphError(str("backward of ", graph.describe_node(id), " returned ", in_grads.size(),
                                 " gradients for ", n.inputs.size(), " inputs"));
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
            if (!needs_grad_storage[i]) continue;
            Var& g = in_grads[i];
            const Tensor& in = input_values[i];
            const auto where = [&] { return str("backward of ", graph.describe_node(id), ", input ", i); };
            if (!g.defined()) throw GraphError(str(where(), ": the differentiable backward returned no gradient"));
            if (g.dtype() != in.dtype() || g.device() != in.device())
                throw GraphError(str(where(), ": gradient ", describe(g.value()), " does not match the input ",
                                     describe(in)));
            if (g.shape() != in.shape()) g = sum_to_var(g, in.shape(), where());
            accumulate_var(slot(n.inputs[i]), std::move(g));
        }
        if (!retain_graph) {
            n.saved.clear();
            n.saved_versions.clear();
        }
        if (!is_wanted[id - lo]) grads[id - lo] = Var();  // spent (a Var holds no reference: this only tidies)
    }

    std::vector<Var> out;
    for (NodeId w : wanted) out.push_back(w <= top ? slot(w) : Var());
    if (leaf_options != nullptr) {
        // backward(): every needed leaf gets its gradient as a tensor (summed over passes) and as a Var; a
        // Parameter adds this pass's into its own gradient.
        std::unordered_set<const void*> seen;
        std::vector<const Parameter*> ready;
        for (NodeId id = 0; id <= top; ++id) {
            ComputeNode& n = *nodes[id];
            if (!needed[id] || n.op != OpType::Leaf || !grads[id].defined()) continue;  // lo == 0 here
            Var g = grads[id];
            Tensor value = g.value().clone();  // the caller may write a leaf's gradient; the node's value stays
            if (n.grad_node != 0 && n.grad.defined()) g = record_op(g, OpType::Add, {g, graph.handle(n.grad_node)});
            n.grad_node = g.id();
            accumulate_into(n.grad, value);
            if (n.parameter.defined()) {
                accumulate_into(n.parameter.grad_slot(), value.clone());
                if (seen.insert(n.parameter.identity()).second) ready.push_back(&n.parameter);
            }
        }
        if (leaf_options->on_parameter_ready)
            for (const Parameter* p : ready) leaf_options->on_parameter_ready(*p);
    }
    if (!retain_graph) {
        graph.saved_released_ = true;
        graph.release_parameters();
    }
    return out;
}

void HigherOrder::backward(ComputeGraph& graph, NodeId root, const Tensor& seed, const BackwardOptions& options) {
    if (!graph.nodes_[root]->requires_grad)
        throw GraphError(str("backward: ", graph.describe_node(root), " does not require grad (no input or parameter ",
                             "that requires grad reaches it)"));
    std::vector<NodeId> leaves;
    for (NodeId id = 0; id <= root; ++id)
        if (graph.nodes_[id]->op == OpType::Leaf && graph.nodes_[id]->requires_grad) leaves.push_back(id);
    const NodeId roots[] = {root};
    const Var seeds[] = {graph.constant(seed.clone())};
    // The gradient's nodes read the saved tensors of the nodes it came from: the graph is retained.
    sweep(graph, roots, seeds, leaves, /*create_graph=*/true, /*retain_graph=*/true, &options, std::nullopt);
}

std::vector<Var> composition_gradients(const DiffBackwardArgs& args, const Var& composed) {
    if (composed.shape() != args.grad_output.shape())
        throw ShapeError(str("differentiable backward of ", op_def(args.op, args.attrs).name, ": the composition ",
                             "has shape ", to_string(composed.shape()), ", the op's output ",
                             to_string(args.grad_output.shape())));
    if (composed.id() <= args.output.id())
        throw GraphError(str("differentiable backward of ", op_def(args.op, args.attrs).name, ": the composition ",
                             "must record new nodes (it returned node #", composed.id(), ")"));
    ComputeGraph& graph = composed.graph();
    std::vector<NodeId> wanted;
    for (std::size_t i = 0; i < args.inputs.size(); ++i)
        if (args.needs_grad[i]) wanted.push_back(args.inputs[i].id());
    const NodeId roots[] = {composed.id()};
    const Var seeds[] = {args.grad_output};
    // A sweep over the composition's nodes only (every node above the op's inputs that reaches them is new):
    // one level deep, since the primitives a composition uses have differentiable backwards of their own.
    // Nodes up to the op's own are not expanded: an input that is a function of another input gets its gradient
    // from the composition alone, as the op's kernels give it.
    std::vector<Var> found = HigherOrder::sweep(graph, roots, seeds, wanted, grad_enabled(), /*retain_graph=*/true,
                                                nullptr, args.output.id());
    std::vector<Var> out(args.inputs.size());
    std::size_t k = 0;
    for (std::size_t i = 0; i < args.inputs.size(); ++i) {
        if (!args.needs_grad[i]) continue;
        out[i] = found[k++];
        // An input the composition reads as a constant (attention's mask, a loss's class weights): its derivative
        // is 0, as the op's kernels give it.
        if (!out[i].defined()) {
            const Tensor& value = args.inputs[i].value();
            out[i] = graph.constant(Tensor::zeros(value.shape(), value.dtype(), value.device()));
        }
    }
    return out;
}

}  // namespace detail

std::vector<Var> grad(std::span<const Var> outputs, std::span<const Var> inputs, std::span<const Var> grad_outputs,
                      const GradOptions& options, std::source_location where) {
    const std::string at = str("grad (", describe_site(where), ")");
    if (outputs.empty() || inputs.empty()) throw ValueError(str(at, ": needs at least one output and one input"));
    if (!grad_outputs.empty() && grad_outputs.size() != outputs.size())
        throw ValueError(str(at, ": ", grad_outputs.size(), " grad_outputs for ", outputs.size(), " outputs"));
    ComputeGraph& graph = outputs.front().graph();
    const auto check_member = [&](const Var& v, const char* role, std::size_t i) {
        if (!v.defined() || &v.graph() != &graph)
            throw GraphError(str(at, ": ", role, " ", i, " is ", v.defined() ? "from another graph" : "undefined"));
    };
    std::vector<NodeId> roots;
    std::vector<Var> seeds;
    for (std::size_t k = 0; k < outputs.size(); ++k) {
        const Var& y = outputs[k];
        check_member(y, "output", k);
        if (!y.requires_grad())
            throw GraphError(str(at, ": output ", k, " (", graph.describe_node(y.id()), ") does not require grad"));
        const Var* given = grad_outputs.empty() || !grad_outputs[k].defined() ? nullptr : &grad_outputs[k];
        if (given == nullptr && y.value().numel() != 1)
            throw GraphError(str(at, ": output ", k, " (", graph.describe_node(y.id()), ") has shape ",
                                 to_string(y.shape()), "; a non-scalar output needs a grad_output"));
        if (given != nullptr) {
            check_member(*given, "grad_output", k);
            if (given->shape() != y.shape() || given->dtype() != y.dtype())
                throw ShapeError(str(at, ": grad_output ", k, " ", describe(given->value()), " does not match output ",
                                     describe(y.value())));
        }
        roots.push_back(y.id());
        seeds.push_back(given ? *given : graph.constant(Tensor::ones(y.shape(), y.dtype(), y.device())));
    }
    std::vector<NodeId> wanted;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        check_member(inputs[i], "input", i);
        if (!inputs[i].requires_grad())
            throw GraphError(str(at, ": input ", i, " (", graph.describe_node(inputs[i].id()),
                                 ") does not require grad"));
        wanted.push_back(inputs[i].id());
    }
    const bool retain = options.retain_graph.value_or(options.create_graph);
    std::vector<Var> out =
        detail::HigherOrder::sweep(graph, roots, seeds, wanted, options.create_graph, retain, nullptr, std::nullopt);
    for (std::size_t i = 0; i < out.size(); ++i)
        if (!out[i].defined() && !options.allow_unused)
            throw GraphError(str(at, ": input ", i, " (", graph.describe_node(inputs[i].id()), ") is not reached ",
                                 "from the outputs; pass allow_unused to get an undefined Var for it"));
    return out;
}

std::vector<Var> grad(std::initializer_list<Var> outputs, std::initializer_list<Var> inputs,
                      std::initializer_list<Var> grad_outputs, const GradOptions& options, std::source_location where) {
    return grad(std::span<const Var>(outputs.begin(), outputs.size()), std::span<const Var>(inputs.begin(), inputs.size()),
                std::span<const Var>(grad_outputs.begin(), grad_outputs.size()), options, where);
}

Var Var::grad_var() const {
    const ComputeNode& n = node();
    if (n.grad_node == 0)
        throw GraphError(str(graph().describe_node(id_), ": no backward with create_graph has reached it; ",
                             "grad_var() is the gradient such a backward records"));
    return graph().handle(n.grad_node);
}

}  // namespace dyngrad
