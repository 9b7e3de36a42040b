// libFuzzer target: bytes -> a random graph of op-table ops on small float64 CPU tensors (random shapes,
// attributes and operands, some invalid on purpose), then forward and backward. Every misuse must come
// out as a dyngrad::Error: any other exception, a crash, a sanitizer finding or a leak fails the run.
// On graphs that build, the gradient of L = Σ w·y along random directions v of the inputs must match
// central differences of L(x + t·v), else __builtin_trap().
//
// Finite differences are only judged where they can be: never across a kink or a singularity (the
// "region" of every kink/singular op input, and the argmax pattern of max and max_pool2d, must be the
// same at every evaluation point), never on non-finite or huge values, never through a value rounded to less
// than float64 (a cast), and only once they converge
// (two step sizes agree with each other better than with the analytic value).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <source_location>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "dyngrad/core/error.h"
#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/ops/elementwise.h"

using namespace dyngrad;

namespace {

// Reads the input front to back; past its end every byte reads as 0, so any input decodes.
class Bytes {
public:
    Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
    std::uint8_t next() { return pos_ < size_ ? data_[pos_++] : 0; }
    int pick(int n) { return next() % n; }  // in [0, n)
    bool one_in(int n) { return pick(n) == 0; }
    template <typename T, std::size_t N>
    T from(const std::array<T, N>& values) { return values[static_cast<std::size_t>(pick(static_cast<int>(N)))]; }
    std::uint32_t u32() {
        std::uint32_t value = 0;
        for (int i = 0; i < 4; ++i) value = (value << 8) | next();
        return value;
    }

private:
    const std::uint8_t* data_;
    std::size_t size_;
    std::size_t pos_ = 0;
};

// What a program's value k is: a leaf (the tensor is cloned into every graph built from the program, so
// in-place updates of batch_norm's running statistics never leak from one evaluation into the next) or
// the output of an op applied to earlier values.
struct Item {
    bool is_leaf = true;
    Tensor leaf;
    bool requires_grad = false;  // float leaves: the inputs whose gradients are checked
    bool constant = false;       // batch_norm running statistics
    OpType op = OpType::Leaf;
    std::vector<int> inputs;
    OpAttrs attrs;
    bool built = true;  // false for an op that threw (invalid): evaluations leave it out too
};
using Program = std::vector<Item>;

const std::vector<const OpDef*>& fuzzed_ops() {
    static const std::vector<const OpDef*> ops = [] {
        std::vector<const OpDef*> out;
        for (const OpDef& def : op_table())
            if (def.op != OpType::Leaf && def.op != OpType::Custom) out.push_back(&def);
        return out;
    }();
    return ops;
}

// ---- decoding: shapes, values, attributes ----

constexpr std::array<double, 10> kScalars = {0.5, 2.0, -1.5, 3.0, 0.0, 1e-3, -0.7, 2.5, 1.0, -2.0};

Shape random_shape(Bytes& in) {
    Shape shape(static_cast<std::size_t>(in.pick(5)));
    for (auto& d : shape) d = in.one_in(8) ? 0 : 1 + in.pick(4);
    return shape;
}

Tensor random_values(const Shape& shape, Bytes& in, Generator& gen) {
    const DType dtype = in.one_in(32) ? DType::f32 : DType::f64;  // a dtype mismatch on purpose
    Tensor t = Tensor::normal(shape, 0.0, 1.0, gen, DType::f64);
    if (t.numel() > 0 && in.one_in(16)) {
        constexpr std::array<double, 6> kSpecial = {NAN, INFINITY, -INFINITY, 0.0, 1e300, -1e-300};
        t.data<double>()[in.pick(static_cast<int>(std::min<std::int64_t>(t.numel(), 256)))] = in.from(kSpecial);
    }
    return dtype == DType::f64 ? t : t.to(dtype);
}

// A shape for operand `slot` of `op` that mostly fits the shapes of the operands before it.
Shape fitting_shape(OpType op, int slot, const std::vector<Shape>& before, Bytes& in) {
    const Shape& x = before.front();
    const std::size_t r = x.size();
    switch (op) {
        case OpType::Add: case OpType::Sub: case OpType::Mul: case OpType::Div:
        case OpType::Eq: case OpType::Ne: case OpType::Lt: case OpType::Le: case OpType::Gt: case OpType::Ge: {
            Shape s(x.begin() + in.pick(static_cast<int>(r) + 1), x.end());  // drop leading axes
            for (auto& d : s)
                if (in.one_in(3)) d = 1;
            return s;
        }
        case OpType::Matmul:
            if (r == 2) return {x[1], 1 + in.pick(4)};
            if (r == 3) return {x[0], x[2], 1 + in.pick(4)};
            break;
        case OpType::Linear:
            if (slot == 1 && r >= 1) return {1 + in.pick(4), x[r - 1]};
            if (slot == 2 && before.size() > 1 && !before[1].empty()) return {before[1][0]};
            break;
        case OpType::Conv2d:
            if (slot == 1 && r == 4) {
                const std::int64_t groups = x[1] % 2 == 0 && in.one_in(3) ? 2 : 1;
                return {groups * (1 + in.pick(2)), x[1] / groups, 1 + in.pick(3), 1 + in.pick(3)};
            }
            if (slot == 2 && before.size() > 1 && !before[1].empty()) return {before[1][0]};
            break;
        case OpType::BatchNorm:
            if (r >= 2) return {x[1]};
            break;
        default:
            break;
    }
    return x;
}

// A value for one field of the op's row (graph/op_def.h's field table), by the field's kind; mostly valid. The
// fields whose valid range depends on the op or on x get values that mostly fit (pow's exponent, dropout's p,
// reshape/expand's shape from x's size, transpose's axis pair, narrow's window, a convolution's stride).
void random_field(OpAttrs& a, const AttrField& field, OpType op, const Shape& x, Bytes& in) {
    const auto pair = [&](int low, int spread) {
        return std::array<std::int64_t, 2>{low + in.pick(spread), low + in.pick(spread)};
    };
    const std::string_view name = field.name;
    std::visit(
        [&](auto member) {
            auto& out = a.*member;
            using T = std::remove_cvref_t<decltype(out)>;
            if constexpr (std::is_same_v<T, double>) {
                if (op == OpType::PowScalar) out = in.from(std::array{2.0, 3.0, 0.5, -1.0, 2.5, -1.5});
                else if (op == OpType::Dropout) out = in.from(std::array{0.0, 0.3, 0.5, 0.9, 1.0, -0.1});
                else if (name == "eps") out = in.from(std::array{1e-5, 1e-3, 0.0, -1.0});
                else if (name == "momentum") out = in.from(std::array{0.1, 0.5, 1.0});
                else out = in.from(kScalars);
            } else if constexpr (std::is_same_v<T, std::optional<double>>) {
                out = in.one_in(3) ? std::nullopt : std::optional<double>(in.from(kScalars));
            } else if constexpr (std::is_same_v<T, bool>) {
                out = in.pick(2) == 1;
            } else if constexpr (std::is_same_v<T, std::uint64_t>) {
                out = in.u32();
            } else if constexpr (std::is_same_v<T, std::int64_t>) {
                if (name == "start") out = in.one_in(16) ? -1 : in.pick(3);
                else if (name == "length") out = in.pick(3);
                else if (name == "groups") out = in.one_in(8) ? in.pick(4) - 1 : 1;
                else out = in.pick(9) - 4;  // axes, sizes and indices: mostly small, now and then negative
            } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
                if (name == "shape") {
                    const std::int64_t n = numel(x);
                    switch (in.pick(5)) {
                        case 0: out = {n}; break;
                        case 1: out = {-1}; break;
                        case 2: out = {1, n, 1}; break;
                        case 3: out = {n > 0 && n % 2 == 0 ? 2 : 1, -1}; break;
                        default: out = random_shape(in); break;
                    }
                } else if (op == OpType::Transpose && !in.one_in(8)) {
                    out = {in.pick(5) - 2, in.pick(5) - 2};
                } else {
                    out.clear();
                    for (int n = in.pick(3); n > 0; --n) out.push_back(in.pick(9) - 4);
                }
            } else if constexpr (std::is_same_v<T, std::array<std::int64_t, 2>>) {
                if (in.one_in(16)) out = pair(-1, 2);
                else if (name == "kernel") out = pair(1, 3);
                else if (name == "stride") out = pair(op == OpType::Conv2d ? 1 : 0, 3);
                else if (name == "dilation") out = pair(1, 2);
                else out = pair(0, 2);
            } else if constexpr (std::is_enum_v<T>) {
                out = static_cast<T>(in.pick(static_cast<int>(choice_names(T{}).size())));
            } else {
                static_assert(std::is_same_v<T, std::uint32_t>, "a new kind of field: give it a generator");
            }
        },
        field.member);
}

// Attributes for `def`: a value for every field its row says it reads; the others keep their defaults.
OpAttrs random_attrs(const OpDef& def, const Shape& x, Bytes& in) {
    OpAttrs a;
    for (std::size_t i = 0; i < kAttrFieldCount; ++i)
        if (def.attrs.contains(i) && !kAttrFields[i].keywords[0].empty())  // not the library's own (custom_id)
            random_field(a, kAttrFields[i], def.op, x, in);
    return a;
}

// ---- building ----

Var add_leaf(ComputeGraph& graph, const Item& item, const Tensor& value) {
    if (item.constant) return graph.constant(value);
    return graph.input(value, "", item.requires_grad);
}

// Decodes the program while building it into `graph` (one Var per item in `vars`, undefined where an op
// threw): each op is recorded at once, so later ops pick their operands among values that exist.
Program decode(Bytes& in, ComputeGraph& graph, std::vector<Var>& vars, Generator& gen) {
    Program program;
    // Items other ops may take as operands. Not batch_norm's running statistics: updated in place by a
    // forward in training mode, they would carry a dependence on its input that no gradient follows.
    std::vector<int> available;
    const auto leaf = [&](Tensor value, bool constant) {
        Item item;
        item.leaf = value;
        item.constant = constant;
        item.requires_grad = !constant && is_floating(value.dtype());
        vars.push_back(add_leaf(graph, item, value.clone()));
        program.push_back(std::move(item));
        const int index = static_cast<int>(program.size() - 1);
        if (!constant) available.push_back(index);
        return index;
    };
    for (int n = 1 + in.pick(3); n > 0; --n) leaf(random_values(random_shape(in), in, gen), false);

    const auto& ops = fuzzed_ops();
    for (int steps = in.pick(10); steps > 0; --steps) {
        const OpDef& def = *ops[static_cast<std::size_t>(in.pick(static_cast<int>(ops.size())))];
        int arity = def.arity == kVariadic ? 1 + in.pick(3)
                                           : def.arity - (def.optional_inputs > 0 && in.pick(2) == 1 ? def.optional_inputs : 0);
        if (in.one_in(32)) arity = in.pick(4);  // a wrong number of inputs on purpose
        std::vector<int> inputs;
        std::vector<Shape> shapes;
        for (int slot = 0; slot < arity; ++slot) {
            int value = -1;
            const Shape* first = shapes.empty() ? nullptr : &shapes.front();
            if (def.op == OpType::CrossEntropy && slot == 1 && first) {
                // labels (N) in [0, C), now and then one out of range
                const std::int64_t rows = first->empty() ? 1 : (*first)[0];
                const std::int64_t classes = first->size() < 2 ? 1 : (*first)[1];
                std::vector<std::int64_t> labels(static_cast<std::size_t>(std::max<std::int64_t>(rows, 0)));
                const int valid = static_cast<int>(std::max<std::int64_t>(classes, 1));
                for (auto& l : labels) l = in.one_in(32) ? classes : in.pick(valid);
                value = leaf(Tensor::from_vector(labels, {static_cast<std::int64_t>(labels.size())}), false);
            } else if (def.op == OpType::BatchNorm && slot >= 3 && first) {
                const Shape channels = fitting_shape(def.op, slot, shapes, in);
                value = leaf(Tensor::uniform(channels, 0.5, 2.0, gen, DType::f64), true);
            } else if (const int mode = in.pick(4); mode < 2) {
                value = available[static_cast<std::size_t>(in.pick(static_cast<int>(available.size())))];
            } else {
                const Shape shape = mode == 2 && first ? fitting_shape(def.op, slot, shapes, in) : random_shape(in);
                value = leaf(random_values(shape, in, gen), false);
            }
            inputs.push_back(value);
            shapes.push_back(vars[static_cast<std::size_t>(value)].shape());
        }
        Item item;
        item.is_leaf = false;
        item.op = def.op;
        item.inputs = inputs;
        item.attrs = random_attrs(def, shapes.empty() ? Shape{} : shapes.front(), in);
        std::vector<Var> operands;
        for (const int i : inputs) operands.push_back(vars[static_cast<std::size_t>(i)]);
        Var out;
        try {
            out = graph.record(def.op, operands, item.attrs, std::source_location::current());
        } catch (const Error&) {
            item.built = false;  // invalid on purpose (or by chance): the op is left out
        }
        vars.push_back(out);
        program.push_back(std::move(item));
        if (out.defined()) available.push_back(static_cast<int>(program.size() - 1));
    }
    return program;
}

// ---- finite differences ----

// Which side of each kink or singularity the inputs of op node `id` lie on, appended to `pattern`.
void append_pattern(const ComputeGraph& graph, NodeId id, std::vector<double>& pattern) {
    const ComputeNode& n = graph.node(id);
    if (!op_def(n.op, n.attrs).differentiable) {  // a step (comparison) or an index (argmax): its value is the side
        const std::vector<double> values = n.value.to_vector();
        pattern.insert(pattern.end(), values.begin(), values.end());
        return;
    }
    const auto regions = [&](std::size_t input, std::initializer_list<double> kinks) {
        for (const double x : graph.node(n.inputs[input]).value.to_vector())
            for (const double kink : kinks) pattern.push_back(x < kink ? -1 : x > kink ? 1 : 0);
    };
    switch (n.op) {
        case OpType::Abs: case OpType::Relu: case OpType::LeakyRelu: case OpType::Elu:
        case OpType::Log: case OpType::Sqrt: case OpType::PowScalar:
            regions(0, {0.0});
            break;
        case OpType::ClippedRelu: regions(0, {0.0, n.attrs.scalar}); break;
        case OpType::Div: regions(1, {0.0}); break;
        case OpType::Clamp:
            if (n.attrs.clamp_min) regions(0, {*n.attrs.clamp_min});
            if (n.attrs.clamp_max) regions(0, {*n.attrs.clamp_max});
            break;
        // any non-zero condition or mask counts as true: its side of 0 picks the branch
        case OpType::Where: regions(0, {0.0}); break;
        case OpType::MaskedFill: regions(1, {0.0}); break;
        case OpType::Minimum: case OpType::Maximum: case OpType::L1Loss: case OpType::SmoothL1Loss: {
            // the sign of a - b (broadcast, through eager math): which operand wins, or the side of |d|'s kink;
            // smooth_l1 also switches from quadratic to linear at |d| = beta
            const Tensor d = sub(graph.node(n.inputs[0]).value, graph.node(n.inputs[1]).value);
            for (const double x : d.to_vector()) {
                pattern.push_back(x < 0 ? -1 : x > 0 ? 1 : 0);
                if (n.op == OpType::SmoothL1Loss) pattern.push_back(std::fabs(x) < n.attrs.scalar ? -1 : 1);
            }
            break;
        }
        case OpType::Max: case OpType::MaxPool2d: {
            // where the gradient goes: the (first) maximum of every window
            ComputeGraph probe;
            const Var x = probe.input(graph.node(n.inputs[0]).value, "", true);
            const Var y = probe.record(n.op, {x}, n.attrs, std::source_location::current());
            probe.backward(y, Tensor::ones(y.shape(), y.dtype()));
            const std::vector<double> routed = x.grad().to_vector();
            pattern.insert(pattern.end(), routed.begin(), routed.end());
            break;
        }
        default: break;
    }
}

struct Evaluation {
    double loss = 0;              // Σ w·y
    std::vector<double> pattern;  // kink sides and argmax routing of every op node
    double largest = 0;           // largest |value| of any node
    bool finite = true;
    // Every floating value is float64: a cast to f32, bf16 or f16 rounds L to steps the differences cannot resolve
    // (piecewise constant at t = 1e-5 for 16-bit), while its gradient passes straight through, as PyTorch's does.
    bool exact = true;
};

// Builds `program` with every gradient-checked leaf moved by t·direction and evaluates it; nullopt when
// an op that built when decoded fails now.
std::optional<Evaluation> evaluate(const Program& program, int output, const std::vector<Tensor>& directions,
                                   double t, const Tensor& weights) {
    ComputeGraph graph;
    std::vector<Var> vars(program.size());
    Evaluation e;
    for (std::size_t k = 0; k <= static_cast<std::size_t>(output); ++k) {
        const Item& item = program[k];
        if (item.is_leaf) {
            Tensor value = item.leaf.clone();
            if (directions[k].defined()) {
                double* x = value.data<double>();
                const double* v = directions[k].data<double>();
                for (std::int64_t i = 0; i < value.numel(); ++i) x[i] += t * v[i];
            }
            vars[k] = add_leaf(graph, item, value);
            continue;
        }
        if (!item.built) continue;
        std::vector<Var> operands;
        for (const int i : item.inputs) operands.push_back(vars[static_cast<std::size_t>(i)]);
        try {
            vars[k] = graph.record(item.op, operands, item.attrs, std::source_location::current());
        } catch (const Error&) {
            return std::nullopt;
        }
        append_pattern(graph, vars[k].id(), e.pattern);
    }
    for (NodeId id = 0; id < graph.size(); ++id) {
        const Tensor& value = graph.node(id).value;
        e.exact = e.exact && (!is_floating(value.dtype()) || value.dtype() == DType::f64);
        for (const double x : value.to_vector()) {
            e.finite = e.finite && std::isfinite(x);
            e.largest = std::max(e.largest, std::fabs(x));
        }
    }
    const std::vector<double> y = vars[static_cast<std::size_t>(output)].value().to_vector();
    const std::vector<double> w = weights.to_vector();
    for (std::size_t i = 0; i < y.size(); ++i) e.loss += w[i] * y[i];
    return e;
}

// Compares the analytic directional derivative with central differences at two step sizes.
void check_gradients(const Program& program, int output, const Tensor& weights, const std::vector<Var>& vars,
                     Generator& gen) {
    std::vector<Tensor> directions(program.size());
    double analytic = 0;
    for (std::size_t k = 0; k <= static_cast<std::size_t>(output); ++k) {
        const Item& item = program[k];
        if (!item.is_leaf || !item.requires_grad || item.leaf.dtype() != DType::f64) continue;
        directions[k] = Tensor::normal(item.leaf.shape(), 0.0, 1.0, gen, DType::f64);
        const Tensor& grad = vars[k].node().grad;
        if (!grad.defined()) continue;  // no path to the output: a zero gradient
        const std::vector<double> g = grad.to_vector();
        const std::vector<double> v = directions[k].to_vector();
        for (std::size_t i = 0; i < g.size(); ++i) analytic += g[i] * v[i];
    }

    constexpr double kStep = 1e-5;
    const std::array<double, 5> points = {0.0, kStep, -kStep, kStep / 4, -kStep / 4};
    std::array<Evaluation, points.size()> at;
    for (std::size_t p = 0; p < points.size(); ++p) {
        std::optional<Evaluation> e = evaluate(program, output, directions, points[p], weights);
        if (!e || !e->finite || !e->exact) return;
        if (p > 0 && e->pattern != at[0].pattern) return;  // a kink or singularity lies in between
        at[p] = std::move(*e);
    }
    // Values this large leave central differences at the mercy of rounding.
    if (at[0].largest > 1e6 || !std::isfinite(analytic)) return;

    const double coarse = (at[1].loss - at[2].loss) / (2 * kStep);
    const double fine = (at[3].loss - at[4].loss) / (2 * (kStep / 4));
    double weight_sum = 0;
    for (const double w : weights.to_vector()) weight_sum += std::fabs(w);
    // Rounding of L (a few ulps of the largest value per output weight) divided by the step.
    const double noise = 256 * 2.3e-16 * std::max(at[0].largest, 1.0) * weight_sum / (2 * (kStep / 4));
    const double tolerance = 1e-5 * std::max(std::fabs(analytic), std::fabs(fine)) + noise;
    const double error = std::fabs(fine - analytic);
    if (error <= tolerance || std::fabs(coarse - analytic) <= tolerance) return;
    // Not converged (truncation error, no verdict) unless the two step sizes agree with each other better than with
    // the analytic value and to a tenth of their own size: cos(a / b) with b near 0 turns over many periods within
    // one step (2026-11-29: differences 4492 and 21249 against an analytic 3.87e6; the gradient was right).
    if (std::fabs(coarse - fine) > 0.25 * error || std::fabs(coarse - fine) > 0.1 * std::fabs(fine)) return;
    __builtin_trap();  // the differences agree with each other, not with the analytic gradient
}

void run(Bytes& in) {
    Generator gen(in.u32());
    ComputeGraph graph;
    std::vector<Var> vars;
    const Program program = decode(in, graph, vars, gen);

    int output = -1;
    for (int k = static_cast<int>(program.size()) - 1; k >= 0 && output < 0; --k)
        if (!program[static_cast<std::size_t>(k)].is_leaf && program[static_cast<std::size_t>(k)].built) output = k;
    if (output < 0) return;
    const Var y = vars[static_cast<std::size_t>(output)];
    if (!y.requires_grad() || !is_floating(y.dtype())) return;

    const Tensor weights = Tensor::normal(y.shape(), 0.0, 1.0, gen, y.dtype());
    const bool retain = in.one_in(4);
    graph.backward(y, weights, {.retain_graph = retain});
    if (y.dtype() == DType::f64) check_gradients(program, output, weights, vars, gen);

    // Misuse after a backward: each throws a dyngrad::Error (or, where allowed, works).
    try {
        switch (in.pick(4)) {
            case 0: graph.backward(y, weights); break;  // a second backward (GraphError unless retained)
            case 1: graph.backward(y); break;           // non-scalar without a gradient (unless one element)
            case 2: graph.clear(); static_cast<void>(y.value()); break;  // a handle from a cleared graph
            default: break;
        }
    } catch (const Error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    Bytes in(data, size);
    try {
        run(in);
    } catch (const Error&) {
        // every misuse the library detects: the only exception type allowed out of it
    }
    return 0;
}
