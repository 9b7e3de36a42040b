#include "dyngrad/graph/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dyngrad/graph/custom_op.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/higher_order.h"

namespace dyngrad {

namespace {

std::string shapes_text(const OpCase& c) {
    std::string out;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) {
        out += i ? " " : "";
        out += to_string(c.shapes[i]);
    }
    return out;
}

// How much an op's formulas amplify the rounding of its inputs and output beyond the few u of one rounding:
// 1 for most ops. Set from the measured errors (docs/verification.md), never to hide a wrong kernel: a wrong
// formula is off by O(1), far above 8 u x this.
double reduced_precision_conditioning(OpType op) {
    // Attention's backward reads the rounded output O and output gradient dO twice over (D = rowsum(dO·O), then
    // dS = P·(dP − D), a difference of nearly equal terms for peaked rows) and its dropout masks scale by 1/(1−p):
    // measured on the H100 up to 7.4 u in bf16 and 11 u in f16 on the op-table cases
    // (tests/precision/test_gpu_reduced.cpp, 2026-11-25), against at most 2 u for every other op.
    return op == OpType::ScaledDotProductAttention ? 4.0 : 1.0;
}

CheckResult start_result(const OpDef& def, const OpCase& c, const char* check, double tolerance) {
    CheckResult r;
    r.op = def.name;
    r.case_label = c.label;
    r.shapes = shapes_text(c);
    r.check = check;
    r.tolerance = tolerance;
    return r;
}

// Runs `compare` (which folds the compared tensors into r) and decides r.pass by r.tolerance; anything it throws
// fails the check with the message as its detail.
template <typename Compare>
CheckResult run_check(CheckResult r, Compare&& compare) {
    try {
        compare(r);
        r.pass = r.max_rel_err <= r.tolerance;
    } catch (const std::exception& e) {
        r.pass = false;
        r.max_rel_err = std::numeric_limits<double>::infinity();
        r.detail = str("threw: ", e.what());
    }
    return r;
}

// Folds one compared tensor into the result, remembering the worst.
void compare_into(CheckResult& r, const std::string& what, const Tensor& actual, const Tensor& reference) {
    const double rel = relative_norm_error(actual, reference);
    const double abs_err = max_abs_error(actual, reference);
    if (r.detail.empty() || !(rel <= r.max_rel_err)) r.detail = str("worst: ", what);
    r.max_rel_err = std::max(r.max_rel_err, std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel);
    r.max_abs_err = std::max(r.max_abs_err, std::isnan(abs_err) ? std::numeric_limits<double>::infinity() : abs_err);
}

double weighted_sum(const Tensor& output, const Tensor& weights) {
    const std::vector<double> y = output.to_vector();
    const std::vector<double> w = weights.to_vector();
    double total = 0;
    for (std::size_t i = 0; i < y.size(); ++i) total += y[i] * w[i];
    return total;
}

}  // namespace

double relative_norm_error(const Tensor& actual, const Tensor& reference) {
    if (actual.shape() != reference.shape()) return std::numeric_limits<double>::infinity();
    const std::vector<double> a = actual.to_vector();
    const std::vector<double> b = reference.to_vector();
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
        diff += (a[i] - b[i]) * (a[i] - b[i]);
        norm += b[i] * b[i];
    }
    constexpr double kTiny = 1e-30;
    return std::sqrt(diff) / std::max(std::sqrt(norm), kTiny);
}

double max_abs_error(const Tensor& actual, const Tensor& reference) {
    if (actual.shape() != reference.shape()) return std::numeric_limits<double>::infinity();
    const std::vector<double> a = actual.to_vector();
    const std::vector<double> b = reference.to_vector();
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(a[i] - b[i]);
        if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
        worst = std::max(worst, d);
    }
    return worst;
}

std::uint64_t seed_for_name(std::uint64_t base, std::string_view name) {
    std::uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits
    for (const char c : name) {
        hash ^= static_cast<unsigned char>(c);
        hash *= 1099511628211ull;
    }
    return base ^ hash;
}

std::vector<Tensor> make_case_inputs(const OpCase& c, DType dtype, Generator& gen, Device device) {
    std::vector<Tensor> inputs;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) {
        const Shape& shape = c.shapes[i];
        const InputDomain domain = i < c.domains.size() ? c.domains[i] : InputDomain::Any;
        const auto n = static_cast<std::size_t>(numel(shape));
        std::vector<double> values(n);
        switch (domain) {
            case InputDomain::Any: {
                std::normal_distribution<double> dist(0.0, 1.0);
                for (auto& v : values) v = dist(gen.engine());
                break;
            }
            case InputDomain::Positive:
            case InputDomain::Constant: {
                std::uniform_real_distribution<double> dist(0.5, 2.0);
                for (auto& v : values) v = dist(gen.engine());
                break;
            }
            case InputDomain::AwayFromZero: {
                std::uniform_real_distribution<double> dist(0.2, 2.0);
                std::bernoulli_distribution sign(0.5);
                for (auto& v : values) v = sign(gen.engine()) ? dist(gen.engine()) : -dist(gen.engine());
                break;
            }
            case InputDomain::Labels:
            case InputDomain::LabelsIgnored: {
                if (c.shapes.empty() || c.shapes[0].size() < 2)
                    throw ValueError(str("case '", c.label, "': Labels need input 0 of rank >= 2 (N,C)"));
                std::uniform_int_distribution<std::int64_t> dist(0, c.shapes[0][1] - 1);
                std::vector<std::int64_t> labels(n);
                for (auto& v : labels) v = dist(gen.engine());
                // Fixed positions, no extra draws: the inputs after this one stay those of a Labels case.
                if (domain == InputDomain::LabelsIgnored)
                    for (std::size_t k = 1; k < n; k += 4) labels[k] = c.attrs.ignore_index;
                inputs.push_back(Tensor::from_vector(labels, shape, device));
                continue;
            }
            case InputDomain::Indices: {
                if (c.shapes.empty() || c.shapes[0].empty())
                    throw ValueError(str("case '", c.label, "': Indices need input 0 of rank >= 1"));
                const std::int64_t size = c.shapes[0][normalize_axis(c.attrs.axis, c.shapes[0].size())];
                if (size < 1) throw ValueError(str("case '", c.label, "': Indices need a non-empty axis of input 0"));
                std::uniform_int_distribution<std::int64_t> dist(0, size - 1);
                std::vector<std::int64_t> indices(n);
                for (auto& v : indices) v = dist(gen.engine());
                inputs.push_back(Tensor::from_vector(indices, shape, device));
                continue;
            }
            case InputDomain::Mask: {
                std::bernoulli_distribution coin(0.5);
                for (auto& v : values) v = coin(gen.engine()) ? 1.0 : 0.0;
                break;
            }
        }
        inputs.push_back(Tensor::from_vector(values, shape, dtype, device));
    }
    return inputs;
}

bool gradient_checked(const OpCase& c, std::size_t input, const Tensor& value) {
    const InputDomain domain = input < c.domains.size() ? c.domains[input] : InputDomain::Any;
    return is_floating(value.dtype()) && domain != InputDomain::Labels && domain != InputDomain::LabelsIgnored &&
           domain != InputDomain::Constant && domain != InputDomain::Indices && domain != InputDomain::Mask;
}

OpRun run_op(const OpDef& def, const OpCase& c, const std::vector<Tensor>& inputs, const Tensor& grad_output) {
    ComputeGraph graph;
    std::vector<Var> vars;
    for (std::size_t i = 0; i < inputs.size(); ++i)
        vars.push_back(graph.input(inputs[i], str("input", i), gradient_checked(c, i, inputs[i])));
    OpAttrs attrs = c.attrs;
    if (def.op == OpType::Custom) attrs.custom_id = custom_op_id(def);
    Var y = graph.record(def.op, vars, attrs, std::source_location::current());
    OpRun run;
    run.output = y.value();
    if (!grad_output.defined()) return run;
    if (!y.requires_grad()) {  // a non-differentiable op (OpDef::differentiable) or no input checked
        run.grads.resize(vars.size());
        return run;
    }
    graph.backward(y, grad_output);
    for (const Var& v : vars) run.grads.push_back(v.requires_grad() ? v.grad() : Tensor());
    return run;
}

CheckResult finite_difference_check(const OpDef& def, const OpCase& c, Generator& gen, double tolerance) {
    return run_check(start_result(def, c, "finite_diff", tolerance), [&](CheckResult& r) {
        std::vector<Tensor> inputs = make_case_inputs(c, DType::f64, gen);
        const Tensor probe = run_op(def, c, inputs, Tensor()).output;
        // L = Σ w·y with random w: every output element matters (Σ softmax alone would be constant).
        const Tensor weights = Tensor::normal(probe.shape(), 0.0, 1.0, gen, DType::f64);
        const OpRun analytic = run_op(def, c, inputs, weights);
        constexpr double kStep = 1e-6;
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            if (!gradient_checked(c, i, inputs[i])) continue;
            Tensor numeric = Tensor::zeros(inputs[i].shape(), DType::f64);
            double* x = inputs[i].data<double>();
            for (std::int64_t k = 0; k < inputs[i].numel(); ++k) {
                const double saved = x[k];
                x[k] = saved + kStep;
                const double plus = weighted_sum(run_op(def, c, inputs, Tensor()).output, weights);
                x[k] = saved - kStep;
                const double minus = weighted_sum(run_op(def, c, inputs, Tensor()).output, weights);
                x[k] = saved;
                numeric.data<double>()[k] = (plus - minus) / (2 * kStep);
            }
            compare_into(r, str("d input", i), analytic.grads[i], numeric);
        }
    });
}

CheckResult float32_check(const OpDef& def, const OpCase& c, Generator& gen, double tolerance) {
    return run_check(start_result(def, c, "f32_vs_f64", tolerance), [&](CheckResult& r) {
        const std::vector<Tensor> inputs64 = make_case_inputs(c, DType::f64, gen);
        std::vector<Tensor> inputs32;
        for (const Tensor& t : inputs64) inputs32.push_back(is_floating(t.dtype()) ? t.to(DType::f32) : t);
        // Round through float32 first so both runs see identical input values.
        std::vector<Tensor> reference_inputs;
        for (const Tensor& t : inputs32) reference_inputs.push_back(is_floating(t.dtype()) ? t.to(DType::f64) : t);
        const Tensor probe = run_op(def, c, reference_inputs, Tensor()).output;
        const Tensor weights64 = Tensor::normal(probe.shape(), 0.0, 1.0, gen, DType::f32).to(DType::f64);
        const OpRun reference = run_op(def, c, reference_inputs, weights64);
        // The output gradient in the single run's output dtype (float32, but cast's is its target dtype).
        const DType single_out = run_op(def, c, inputs32, Tensor()).output.dtype();
        const OpRun single = run_op(def, c, inputs32, weights64.to(is_floating(single_out) ? single_out : DType::f32));
        compare_into(r, "output", single.output, reference.output);
        for (std::size_t i = 0; i < inputs32.size(); ++i)
            if (reference.grads[i].defined()) compare_into(r, str("d input", i), single.grads[i], reference.grads[i]);
    });
}

namespace {

// One evaluation of a higher-order check: F (the directional derivative of order - 1), and when `gradients`, the
// engine's gradient of F for each checked input and for w (zeros where F does not depend on it: its derivative in w
// is J·v, which checks a linear op's differentiable backward as a function of its output gradient), and the
// first-order gradient of <y, w> that the create_graph sweep computed (its values, checked against finite
// differences: an op whose gradient does not depend on its inputs has a second derivative of 0 in them).
struct DirectionalRun {
    double value = 0;
    std::vector<Tensor> grads;  // one per checked input, then w's
    std::vector<Tensor> first;  // one per checked input
};
DirectionalRun directional_run(const OpDef& def, const OpCase& c, const std::vector<Tensor>& inputs,
                               const Tensor& weights, const std::vector<std::vector<Tensor>>& directions,
                               bool gradients) {
    ComputeGraph graph;
    std::vector<Var> vars, checked;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        vars.push_back(graph.input(inputs[i], str("input", i), gradient_checked(c, i, inputs[i])));
        if (vars.back().requires_grad()) checked.push_back(vars.back());
    }
    OpAttrs attrs = c.attrs;
    if (def.op == OpType::Custom) attrs.custom_id = custom_op_id(def);
    const auto here = std::source_location::current();
    const Var y = graph.record(def.op, vars, attrs, here);
    const Var w = graph.input(weights, "w", true);
    // F_1 = <y, w>; F_{k+1} = Σ_i <∂F_k/∂x_i, v_k,i>, each gradient recorded (create_graph).
    Var f = graph.record(OpType::Sum, {graph.record(OpType::Mul, {y, w}, {}, here)}, {}, here);
    DirectionalRun run;
    for (std::size_t k = 0; k < directions.size(); ++k) {
        const std::vector<Var> g =
            grad(std::span<const Var>(&f, 1), checked, {}, {.create_graph = true, .allow_unused = true});
        if (k == 0 && gradients)
            for (std::size_t i = 0; i < checked.size(); ++i)
                run.first.push_back(g[i].defined() ? g[i].value() : Tensor::zeros(checked[i].shape(), checked[i].dtype(),
                                                                                  checked[i].device()));
        Var next;
        for (std::size_t i = 0; i < g.size(); ++i) {
            if (!g[i].defined()) continue;
            const Var term = graph.record(
                OpType::Sum, {graph.record(OpType::Mul, {g[i], graph.constant(directions[k][i])}, {}, here)}, {}, here);
            next = next.defined() ? graph.record(OpType::Add, {next, term}, {}, here) : term;
        }
        if (!next.defined()) next = graph.constant(Tensor::zeros({}, y.dtype(), y.device()));
        f = next;
    }
    run.value = f.item();
    if (!gradients) return run;
    std::vector<Var> wrt = checked;
    wrt.push_back(w);
    std::vector<Var> g;
    if (f.requires_grad()) g = grad(std::span<const Var>(&f, 1), wrt, {}, {.allow_unused = true});
    for (std::size_t i = 0; i < wrt.size(); ++i)
        run.grads.push_back(i < g.size() && g[i].defined()
                                ? g[i].value()
                                : Tensor::zeros(wrt[i].shape(), wrt[i].dtype(), wrt[i].device()));
    return run;
}

}  // namespace

CheckResult higher_order_check(const OpDef& def, const OpCase& c, Generator& gen, int order, double tolerance) {
    const char* name = order == 2 ? "second_order" : order == 3 ? "third_order" : nullptr;
    const std::string check = name ? name : str("order_", order);
    CheckResult r = start_result(def, c, check.c_str(), tolerance);
    r.check = check;
    return run_check(std::move(r), [&](CheckResult& r) {
        if (order < 2) throw ValueError(str("higher_order_check: order ", order, " (the first order is finite_diff)"));
        std::vector<Tensor> inputs = make_case_inputs(c, DType::f64, gen);
        const Tensor probe = run_op(def, c, inputs, Tensor()).output;
        Tensor weights = Tensor::normal(probe.shape(), 0.0, 1.0, gen, DType::f64);
        std::vector<std::size_t> checked;
        for (std::size_t i = 0; i < inputs.size(); ++i)
            if (gradient_checked(c, i, inputs[i])) checked.push_back(i);
        std::vector<std::vector<Tensor>> directions(static_cast<std::size_t>(order - 1));
        for (auto& v : directions)
            for (std::size_t i : checked) v.push_back(Tensor::normal(inputs[i].shape(), 0.0, 1.0, gen, DType::f64));
        const DirectionalRun analytic = directional_run(def, c, inputs, weights, directions, true);
        // Central differences of F in every checked input and in w. F is itself a derivative: a larger step than
        // finite_diff's keeps the rounding of F (relative 1e-16 / step) down.
        constexpr double kStep = 1e-5;
        // Compares `analytic` (the gradient of `evaluate` in t) with central differences. Up to kElementwise
        // elements, every element's; a larger t along kProjections random unit directions u instead: <analytic, u>
        // against (F(t + h u) - F(t - h u)) / 2h, as PyTorch's fast gradcheck does. Each evaluation runs a double
        // backward, so 2 per element made this check the suite's slowest (the long rows, the RNNs' and convolutions'
        // weights). A wrong element moves almost every projection; the relative norm over the projections
        // estimates the elementwise one.
        constexpr std::int64_t kElementwise = 32;
        constexpr std::int64_t kProjections = 16;
        const auto compare_derivative = [&](const std::string& what, const Tensor& analytic, Tensor& t,
                                            const auto& evaluate) {
            double* x = t.data<double>();
            const auto central = [&](const auto& shift) {  // shift(sign) moves x by ±h along the direction
                shift(1.0);
                const double plus = evaluate();
                shift(-2.0);
                const double minus = evaluate();
                shift(1.0);
                return (plus - minus) / (2 * kStep);
            };
            if (t.numel() <= kElementwise) {
                Tensor numeric = Tensor::zeros(t.shape(), DType::f64);
                for (std::int64_t e = 0; e < t.numel(); ++e) {
                    const double saved = x[e];
                    numeric.data<double>()[e] = central([&](double sign) { x[e] += sign * kStep; });
                    x[e] = saved;
                }
                compare_into(r, what, analytic, numeric);
                return;
            }
            const std::vector<double> a = analytic.to_vector();
            const std::vector<double> saved(x, x + t.numel());
            Tensor projected_analytic = Tensor::zeros({kProjections}, DType::f64);
            Tensor projected_numeric = Tensor::zeros({kProjections}, DType::f64);
            for (std::int64_t j = 0; j < kProjections; ++j) {
                std::vector<double> u = Tensor::normal({t.numel()}, 0.0, 1.0, gen, DType::f64).to_vector();
                double norm = 0;
                for (double v : u) norm += v * v;
                norm = std::sqrt(norm);
                double dot = 0;
                for (std::size_t e = 0; e < u.size(); ++e) dot += a[e] * (u[e] /= norm);
                projected_analytic.data<double>()[j] = dot;
                projected_numeric.data<double>()[j] = central([&](double sign) {
                    for (std::size_t e = 0; e < u.size(); ++e) x[e] += sign * kStep * u[e];
                });
                std::copy(saved.begin(), saved.end(), x);
            }
            compare_into(r, what + str(" (", kProjections, " random projections)"), projected_analytic,
                         projected_numeric);
        };
        const auto f_value = [&] { return directional_run(def, c, inputs, weights, directions, false).value; };
        const auto first_value = [&] { return weighted_sum(run_op(def, c, inputs, Tensor()).output, weights); };
        for (std::size_t k = 0; k < checked.size(); ++k) {
            compare_derivative(str("d", order, " input", checked[k]), analytic.grads[k], inputs[checked[k]], f_value);
            compare_derivative(str("create_graph d1 input", checked[k]), analytic.first[k], inputs[checked[k]],
                               first_value);
        }
        compare_derivative(str("d", order, " output weights"), analytic.grads[checked.size()], weights, f_value);
    });
}

CheckResult gpu_second_order_check(const OpDef& def, const OpCase& c, Generator& gen, double tolerance, Device device) {
    return run_check(start_result(def, c, "gpu_second_order", tolerance), [&](CheckResult& r) {
        // Inputs, weights and direction rounded through float32, so both runs see identical values.
        const auto round = [](const Tensor& t) { return is_floating(t.dtype()) ? t.to(DType::f32).to(DType::f64) : t; };
        std::vector<Tensor> reference;
        for (const Tensor& t : make_case_inputs(c, DType::f64, gen)) reference.push_back(round(t));
        const Tensor probe = run_op(def, c, reference, Tensor()).output;
        const Tensor weights = round(Tensor::normal(probe.shape(), 0.0, 1.0, gen, DType::f64));
        std::vector<std::vector<Tensor>> directions(1);
        for (std::size_t i = 0; i < reference.size(); ++i)
            if (gradient_checked(c, i, reference[i]))
                directions[0].push_back(round(Tensor::normal(reference[i].shape(), 0.0, 1.0, gen, DType::f64)));
        const DirectionalRun exact = directional_run(def, c, reference, weights, directions, true);
        const auto on_device = [&](const Tensor& t) { return (is_floating(t.dtype()) ? t.to(DType::f32) : t).to(device); };
        std::vector<Tensor> inputs;
        for (const Tensor& t : reference) inputs.push_back(on_device(t));
        std::vector<std::vector<Tensor>> device_directions(1);
        for (const Tensor& t : directions[0]) device_directions[0].push_back(on_device(t));
        // The weights in the device output's dtype: an op whose output dtype is not its input's (cast to f64) has
        // f64 outputs from the f32 inputs.
        const Tensor device_output = run_op(def, c, inputs, Tensor()).output;
        const Tensor device_weights =
            is_floating(device_output.dtype()) ? weights.to(device_output.dtype()).to(device) : weights.to(device);
        const DirectionalRun single = directional_run(def, c, inputs, device_weights, device_directions, true);
        for (std::size_t k = 0; k < exact.grads.size(); ++k)
            compare_into(r, k + 1 < exact.grads.size() ? str("d2 checked input ", k) : std::string("d2 output weights"),
                         single.grads[k].to(Device::cpu()).to(DType::f64), exact.grads[k]);
    });
}

double unit_roundoff(DType dtype) {
    switch (dtype) {
        case DType::bf16: return std::ldexp(1.0, -8);
        case DType::f16: return std::ldexp(1.0, -11);
        case DType::f32: return std::ldexp(1.0, -24);
        case DType::f64: return std::ldexp(1.0, -53);
        default: break;
    }
    throw DTypeError(str("unit_roundoff: ", dtype_name(dtype), " is not a floating dtype"));
}

double reduced_precision_tolerance(const OpDef& def, DType dtype) {
    // One rounding of the output (and of each gradient) is at most 1/2 ulp = 1 u per element, so at most 1 u in
    // relative norm; a backward that reads the rounded output or output gradient (exp, tanh, softmax) adds about
    // 1 u more. Measured on the CPU path through f32 over every op-table case: below 1 u for every op in bf16 and
    // f16 (docs/verification.md, "Per-dtype columns"). 4 u leaves a factor 2 for GPU kernels' f32 math and
    // summation order; a wrong formula is off by O(1), far above it.
    return 4 * unit_roundoff(dtype) * reduced_precision_conditioning(def.op);
}

CheckResult reduced_precision_check(const OpDef& def, const OpCase& c, Generator& gen, DType dtype, double tolerance,
                                    Device device) {
    const char* check = dtype == DType::bf16 ? "bf16_vs_f64" : "f16_vs_f64";
    return run_check(start_result(def, c, check, tolerance), [&](CheckResult& r) {
        if (!is_reduced_precision(dtype))
            throw DTypeError(str("reduced_precision_check: expects bfloat16 or float16, got ", dtype_name(dtype)));
        const std::vector<Tensor> inputs64 = make_case_inputs(c, DType::f64, gen);
        std::vector<Tensor> reduced, reference;
        for (const Tensor& t : inputs64) {
            const Tensor rounded = is_floating(t.dtype()) ? t.to(dtype) : t;
            reduced.push_back(rounded.to(device));
            reference.push_back(is_floating(t.dtype()) ? rounded.to(DType::f64) : t);
        }
        const Tensor probe = run_op(def, c, reference, Tensor()).output;
        // The output gradient in the low run's output dtype (cast's is not `dtype`), from values `dtype` holds.
        const Tensor weights = Tensor::normal(probe.shape(), 0.0, 1.0, gen, DType::f64).to(dtype).to(DType::f64);
        const DType low_output_dtype = run_op(def, c, reduced, Tensor()).output.dtype();
        const OpRun exact = run_op(def, c, reference, weights);
        const OpRun low = run_op(def, c, reduced, weights.to(low_output_dtype).to(device));
        // The output in `dtype`, but for cast (its attribute's dtype) and linear_cross_entropy, whose loss is
        // float32 for 16-bit inputs (docs/mixed_precision.md).
        const DType expected_output = def.op == OpType::LinearCrossEntropy ? DType::f32 : dtype;
        if (is_floating(probe.dtype()) && def.op != OpType::Cast && low.output.dtype() != expected_output)
            throw DTypeError(str("the output is ", dtype_name(low.output.dtype()), ", expected ",
                                 dtype_name(expected_output)));
        compare_into(r, "output", low.output, exact.output);
        for (std::size_t i = 0; i < reduced.size(); ++i) {
            if (!exact.grads[i].defined()) continue;
            if (low.grads[i].dtype() != reduced[i].dtype())
                throw DTypeError(str("the gradient of input ", i, " is ", dtype_name(low.grads[i].dtype()),
                                     ", its input ", dtype_name(reduced[i].dtype())));
            compare_into(r, str("d input", i), low.grads[i], exact.grads[i]);
        }
    });
}

}  // namespace dyngrad
