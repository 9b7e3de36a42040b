// vjp, jvp, hvp, jacobian, hessian (graph/functional_ad.h): each a few grad() calls on a graph of its own. The
// contractions <g, v> are recorded as mul and sum nodes directly (the graph layer sits below the op functions).
#include "dyngrad/graph/functional_ad.h"

namespace dyngrad {

namespace {

struct Recorded {
    ComputeGraph graph;
    std::vector<Var> inputs;
    Var output;
};

// f on fresh leaves that require grad (sharing the callers' storage; nothing writes them).
void record_function(Recorded& r, const AdFunction& f, const std::vector<Tensor>& inputs, const char* who) {
    if (inputs.empty()) throw ValueError(str(who, ": needs at least one input"));
    for (std::size_t i = 0; i < inputs.size(); ++i) r.inputs.push_back(r.graph.input(inputs[i], str("input", i), true));
    r.output = f(r.inputs);
    if (!r.output.defined() || &r.output.graph() != &r.graph)
        throw GraphError(str(who, ": the function must return a Var recorded from its inputs"));
}

Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype(), t.device()); }

// Σ_i sum(g_i · v_i), each v_i a constant of the graph, over the defined gradients that depend on the inputs;
// undefined when none does.
Var contract(ComputeGraph& graph, const std::vector<Var>& g, const std::vector<Tensor>& v) {
    const auto here = std::source_location::current();
    Var total;
    for (std::size_t i = 0; i < g.size(); ++i) {
        if (!g[i].defined() || !g[i].requires_grad()) continue;
        const Var term =
            graph.record(OpType::Sum, {graph.record(OpType::Mul, {g[i], graph.constant(v[i])}, {}, here)}, {}, here);
        total = total.defined() ? graph.record(OpType::Add, {total, term}, {}, here) : term;
    }
    return total;
}

std::vector<Tensor> values_or_zeros(const std::vector<Var>& g, const std::vector<Var>& like) {
    std::vector<Tensor> out;
    for (std::size_t i = 0; i < like.size(); ++i)
        out.push_back(i < g.size() && g[i].defined() ? g[i].value() : zeros_like(like[i].value()));
    return out;
}

void check_directions(const std::vector<Tensor>& inputs, const std::vector<Tensor>& v, const char* who) {
    if (v.size() != inputs.size())
        throw ValueError(str(who, ": ", v.size(), " directions for ", inputs.size(), " inputs"));
    for (std::size_t i = 0; i < v.size(); ++i)
        if (!v[i].defined() || v[i].shape() != inputs[i].shape() || v[i].dtype() != inputs[i].dtype())
            throw ShapeError(str(who, ": direction ", i, " ", describe(v[i]), " does not match input ", i, " ",
                                 describe(inputs[i])));
}

// Rows of the Jacobian of `y` (a Var of r.graph) by one reverse pass per element of y with a one-hot seed,
// assembled on the CPU: J[i] of shape y.shape + inputs[i].shape.
std::vector<Tensor> jacobian_of(Recorded& r, const Var& y) {
    const std::int64_t n = y.value().numel();
    std::vector<std::vector<double>> rows(r.inputs.size());
    for (std::int64_t k = 0; k < n; ++k) {
        std::vector<double> one_hot(static_cast<std::size_t>(n), 0.0);
        one_hot[static_cast<std::size_t>(k)] = 1.0;
        const Var seed = r.graph.constant(Tensor::from_vector(one_hot, y.shape(), y.dtype(), y.device()));
        std::vector<Var> g;
        if (y.requires_grad())
            g = grad(std::span<const Var>(&y, 1), r.inputs, std::span<const Var>(&seed, 1),
                     {.retain_graph = true, .allow_unused = true});
        const std::vector<Tensor> values = values_or_zeros(g, r.inputs);
        for (std::size_t i = 0; i < r.inputs.size(); ++i) {
            const std::vector<double> row = values[i].to(Device::cpu()).to_vector();
            rows[i].insert(rows[i].end(), row.begin(), row.end());
        }
    }
    std::vector<Tensor> out;
    for (std::size_t i = 0; i < r.inputs.size(); ++i) {
        Shape shape = y.shape();
        const Shape& in = r.inputs[i].shape();
        shape.insert(shape.end(), in.begin(), in.end());
        out.push_back(Tensor::from_vector(rows[i], shape, r.inputs[i].dtype(), r.inputs[i].device()));
    }
    return out;
}

}  // namespace

VjpResult vjp(const AdFunction& f, const std::vector<Tensor>& inputs, const Tensor& v) {
    Recorded r;
    record_function(r, f, inputs, "vjp");
    VjpResult result{r.output.value(), {}};
    if (!r.output.requires_grad()) {
        result.vjp = values_or_zeros({}, r.inputs);
        return result;
    }
    const Var seed = v.defined() ? r.graph.constant(v) : Var();
    const std::vector<Var> g = grad(std::span<const Var>(&r.output, 1), r.inputs, std::span<const Var>(&seed, 1),
                                    {.allow_unused = true});
    result.vjp = values_or_zeros(g, r.inputs);
    return result;
}

JvpResult jvp(const AdFunction& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v) {
    check_directions(inputs, v, "jvp");
    Recorded r;
    record_function(r, f, inputs, "jvp");
    JvpResult result{r.output.value(), zeros_like(r.output.value())};
    if (!r.output.requires_grad()) return result;
    // g(u) = Jᵀu is linear in u; <g(u), v> differentiated in u is J·v, whatever u is (zeros here).
    const Var u = r.graph.input(zeros_like(r.output.value()), "u", true);
    const std::vector<Var> g = grad(std::span<const Var>(&r.output, 1), r.inputs, std::span<const Var>(&u, 1),
                                    {.create_graph = true, .allow_unused = true});
    const Var total = contract(r.graph, g, v);
    if (!total.defined() || !total.requires_grad()) return result;
    const std::vector<Var> ju = grad({total}, {u}, {}, {.allow_unused = true});
    if (ju[0].defined()) result.jvp = ju[0].value();
    return result;
}

HvpResult hvp(const AdFunction& f, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v) {
    check_directions(inputs, v, "hvp");
    Recorded r;
    record_function(r, f, inputs, "hvp");
    if (r.output.value().numel() != 1)
        throw ShapeError(str("hvp: the function's output has shape ", to_string(r.output.shape()), "; expected one element"));
    HvpResult result{r.output.value(), values_or_zeros({}, r.inputs)};
    if (!r.output.requires_grad()) return result;
    const std::vector<Var> g = grad(std::span<const Var>(&r.output, 1), r.inputs, {},
                                    {.create_graph = true, .allow_unused = true});
    const Var total = contract(r.graph, g, v);
    if (!total.defined() || !total.requires_grad()) return result;
    result.hvp = values_or_zeros(grad(std::span<const Var>(&total, 1), r.inputs, {}, {.allow_unused = true}), r.inputs);
    return result;
}

std::vector<Tensor> jacobian(const AdFunction& f, const std::vector<Tensor>& inputs) {
    Recorded r;
    record_function(r, f, inputs, "jacobian");
    return jacobian_of(r, r.output);
}

std::vector<std::vector<Tensor>> hessian(const AdFunction& f, const std::vector<Tensor>& inputs) {
    Recorded r;
    record_function(r, f, inputs, "hessian");
    if (r.output.value().numel() != 1)
        throw ShapeError(str("hessian: the function's output has shape ", to_string(r.output.shape()),
                             "; expected one element"));
    std::vector<Var> g(r.inputs.size());
    if (r.output.requires_grad())
        g = grad(std::span<const Var>(&r.output, 1), r.inputs, {}, {.create_graph = true, .allow_unused = true});
    std::vector<std::vector<Tensor>> out;
    for (std::size_t i = 0; i < r.inputs.size(); ++i) {
        // A gradient that is undefined or constant in every input gives zero blocks.
        const Var gi = g[i].defined() ? g[i] : r.graph.constant(zeros_like(r.inputs[i].value()));
        out.push_back(jacobian_of(r, gi));
    }
    return out;
}

}  // namespace dyngrad
