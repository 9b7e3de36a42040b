// Recurrent ops (ops/rnn.h): user functions, the weight layout, the shape rule and the CPU kernels
// (Eigen; backpropagation through time over activations saved by the forward). GPU: ops/rnn.cu.
// The layers: nn/recurrent.cpp.
#include "dyngrad/ops/rnn.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <Eigen/Core>

#include "dyngrad/core/checked.h"
#include "dyngrad/ops/argument_rules.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/linalg.h"

namespace dyngrad {

namespace {

std::int64_t gate_count(RnnMode mode) {
    switch (mode) {
        case RnnMode::Lstm: return 4;
        case RnnMode::Gru: return 3;
        case RnnMode::RnnTanh:
        case RnnMode::RnnRelu: return 1;
    }
    throw ValueError(str("unknown rnn mode ", static_cast<int>(mode)));
}

std::vector<const char*> gate_names(RnnMode mode) {
    switch (mode) {
        case RnnMode::Lstm: return {"i", "f", "g", "o"};
        case RnnMode::Gru: return {"r", "z", "n"};
        case RnnMode::RnnTanh:
        case RnnMode::RnnRelu: return {nullptr};
    }
    throw ValueError(str("unknown rnn mode ", static_cast<int>(mode)));
}

RnnOptions options_of(const OpAttrs& attrs) {
    return {attrs.hidden_size, attrs.num_layers, attrs.bidirectional};
}

// Sizes of one rnn call; offsets into the flat weight and the packed output.
struct RnnDims {
    RnnMode mode;
    std::int64_t gates, dirs, layers, hidden, steps, batch, input;

    RnnDims(RnnMode mode, const RnnOptions& options, std::int64_t steps, std::int64_t batch, std::int64_t input)
        : mode(mode), gates(gate_count(mode)), dirs(options.bidirectional ? 2 : 1), layers(options.num_layers),
          hidden(options.hidden_size), steps(steps), batch(batch), input(input) {}

    // Checked arithmetic throughout (core/checked.h): hidden sizes and layer counts are user attributes.
    static std::int64_t product(std::initializer_list<std::int64_t> factors) {
        std::int64_t out = 1;
        for (const std::int64_t f : factors) out = checked_mul(out, f, "rnn sizes");
        return out;
    }
    std::int64_t layer_input(std::int64_t layer) const { return layer == 0 ? input : product({dirs, hidden}); }
    // Where pseudo-layer p = l·D + d's W_ih (then its W_hh) and its b_ih (then b_hh) start: all matrices
    // come first, then all biases.
    // Closed form (a loop would run num_layers times just to find that it overflows): the D pseudo-layers of
    // layer 0 hold G·H·(I + H) each, every later one G·H·(D·H + H).
    std::int64_t matrix_offset(std::int64_t p) const {
        const std::int64_t first = std::min(p, dirs);
        const std::int64_t later = p - first;
        return checked_add(product({first, gates, hidden, checked_add(input, hidden, "rnn sizes")}),
                           product({later, gates, hidden, checked_add(layer_input(1), hidden, "rnn sizes")}),
                           "rnn sizes");
    }
    std::int64_t bias_offset(std::int64_t p) const {
        return checked_add(matrix_offset(product({layers, dirs})), product({2, gates, hidden, p}), "rnn sizes");
    }
    std::int64_t weight_size() const { return bias_offset(product({layers, dirs})); }
    std::int64_t output_size() const { return product({steps, batch, dirs, hidden}); }
    std::int64_t state_size() const { return product({layers, dirs, batch, hidden}); }
    std::int64_t packed_size() const {
        return checked_add(output_size(), product({state_size(), mode == RnnMode::Lstm ? 2 : 1}), "rnn sizes");
    }
};

std::string describe_config(RnnMode mode, const RnnOptions& options, std::int64_t input_size) {
    return str(rnn_mode_name(mode), " with input ", input_size, ", hidden ", options.hidden_size, ", ",
               options.num_layers, " layer(s), ", options.bidirectional ? "bidirectional" : "unidirectional");
}

void check_options(RnnMode mode, const RnnOptions& options, std::int64_t input_size) {
    gate_count(mode);
    if (options.hidden_size <= 0) throw ValueError(str("hidden size must be positive, got ", options.hidden_size));
    if (options.num_layers <= 0) throw ValueError(str("number of layers must be positive, got ", options.num_layers));
    if (input_size <= 0) throw ValueError(str("input size must be positive, got ", input_size));
    // A hidden size or layer count whose flat weight int64 cannot count (4·2^32·(1 + 2^32) wraps to 2^34).
    try {
        RnnDims(mode, options, 0, 0, input_size).weight_size();
    } catch (const ShapeError& e) {
        throw ShapeError(str(describe_config(mode, options, input_size), ": the flat weight's size: ", e.what()));
    }
}

}  // namespace

std::string_view rnn_mode_name(RnnMode mode) {
    switch (mode) {
        case RnnMode::Lstm: return "lstm";
        case RnnMode::Gru: return "gru";
        case RnnMode::RnnTanh: return "rnn_tanh";
        case RnnMode::RnnRelu: return "rnn_relu";
    }
    return "unknown";
}

std::vector<RnnWeightEntry> rnn_weight_layout(RnnMode mode, const RnnOptions& options, std::int64_t input_size) {
    check_options(mode, options, input_size);
    const RnnDims d(mode, options, 0, 0, input_size);
    const std::int64_t H = d.hidden;
    std::vector<RnnWeightEntry> entries;
    std::int64_t offset = 0;
    const auto add = [&](std::int64_t p, const char* what, const Shape& shape) {
        const std::string prefix = str("l", p / d.dirs, p % d.dirs == 0 ? ".fwd." : ".bwd.");
        for (const char* gate : gate_names(mode)) {
            entries.push_back({gate ? str(prefix, what, ".", gate) : prefix + what, offset, shape});
            offset += numel(shape);
        }
    };
    for (std::int64_t p = 0; p < d.layers * d.dirs; ++p) {
        add(p, "W_ih", {H, d.layer_input(p / d.dirs)});
        add(p, "W_hh", {H, H});
    }
    for (std::int64_t p = 0; p < d.layers * d.dirs; ++p) {
        add(p, "b_ih", {H});
        add(p, "b_hh", {H});
    }
    return entries;
}

std::int64_t rnn_weight_size(RnnMode mode, const RnnOptions& options, std::int64_t input_size) {
    check_options(mode, options, input_size);
    return RnnDims(mode, options, 0, 0, input_size).weight_size();
}

// The kernels receive what to save instead of reading engine state: the row's rule sets it from grad_enabled()
// for every caller (C++ and Python) unless the caller gave it.
void rnn_arguments(OpCall& call) {
    if (!call.gave(attr_field_index("save_for_backward"))) call.attrs.save_for_backward = grad_enabled();
}

RnnResult rnn(RnnMode mode, const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0,
              std::optional<Var> c0, std::source_location where) {
    const std::string at = str(rnn_mode_name(mode), " at ", describe_site(where));
    if (c0 && mode != RnnMode::Lstm) throw ValueError(str(at, ": c0 is for lstm only (no cell state)"));
    if (c0 && !h0) throw ValueError(str(at, ": c0 needs h0 (pass zeros for a zero initial hidden state)"));
    OpAttrs attrs;
    attrs.rnn_mode = mode;
    attrs.hidden_size = options.hidden_size;
    attrs.num_layers = options.num_layers;
    attrs.bidirectional = options.bidirectional;
    const Var packed = apply_op(OpType::Rnn, {x, w, h0.value_or(Var()), c0.value_or(Var())}, attrs, where);

    // The shape rule accepted x as (T,N,I): slice the packed value into its parts.
    const Shape& xs = x.shape();
    const RnnDims d(mode, options, xs[0], xs[1], xs[2]);
    const Shape state_shape{d.layers * d.dirs, d.batch, d.hidden};
    RnnResult result;
    result.output = reshape(narrow(packed, 0, 0, d.output_size(), where), {d.steps, d.batch, d.dirs * d.hidden}, where);
    result.h_n = reshape(narrow(packed, 0, d.output_size(), d.state_size(), where), state_shape, where);
    if (mode == RnnMode::Lstm)
        result.c_n = reshape(narrow(packed, 0, d.output_size() + d.state_size(), d.state_size(), where), state_shape,
                             where);
    return result;
}

RnnResult lstm(const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0, std::optional<Var> c0,
               std::source_location where) {
    return rnn(RnnMode::Lstm, x, w, options, std::move(h0), std::move(c0), where);
}
RnnResult gru(const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0,
              std::source_location where) {
    return rnn(RnnMode::Gru, x, w, options, std::move(h0), {}, where);
}
RnnResult rnn_tanh(const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0,
                   std::source_location where) {
    return rnn(RnnMode::RnnTanh, x, w, options, std::move(h0), {}, where);
}
RnnResult rnn_relu(const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0,
                   std::source_location where) {
    return rnn(RnnMode::RnnRelu, x, w, options, std::move(h0), {}, where);
}

// ---- differentiable backward (graph/higher_order.h) ----

// The packed [output | h_n | c_n] rebuilt from primitive ops on the node's inputs (x, w[, h0[, c0]]): the
// recurrence unrolled step by step (ops/rnn.h's equations) with linear, narrow, sigmoid, tanh, relu, mul and add,
// the weight's blocks as narrow + reshape of w. Zero initial states are constants.
Var rnn_composition(std::span<const Var> in, const OpAttrs& attrs) {
    const Var& x = in[0];
    const Var& w = in[1];
    const RnnDims d(attrs.rnn_mode, options_of(attrs), x.shape()[0], x.shape()[1], x.shape()[2]);
    const std::int64_t H = d.hidden, N = d.batch, GH = d.gates * d.hidden;
    const auto block = [&](std::int64_t offset, const Shape& shape) {
        return reshape(narrow(w, 0, offset, numel(shape)), shape);
    };
    const auto initial = [&](std::size_t input, std::int64_t p) {
        if (in.size() > input) return reshape(narrow(in[input], 0, p, 1), {N, H});
        return x.graph().constant(Tensor::zeros({N, H}, x.dtype(), x.device()));
    };
    const auto gate = [&](const Var& pre, std::int64_t k) { return narrow(pre, 1, k * H, H); };
    std::vector<Var> h_n, c_n;
    Var layer_in = x;
    for (std::int64_t l = 0; l < d.layers; ++l) {
        const std::int64_t in_l = d.layer_input(l);
        std::vector<Var> directions;
        for (std::int64_t dir = 0; dir < d.dirs; ++dir) {
            const std::int64_t p = l * d.dirs + dir;
            const Var w_ih = block(d.matrix_offset(p), {GH, in_l});
            const Var w_hh = block(d.matrix_offset(p) + GH * in_l, {GH, H});
            const Var b_ih = block(d.bias_offset(p), {GH}), b_hh = block(d.bias_offset(p) + GH, {GH});
            // Input projections of every step at once, as the kernels do.
            const Var projected = reshape(linear(reshape(layer_in, {d.steps * N, in_l}), w_ih, b_ih), {d.steps, N, GH});
            Var h = initial(2, p);
            Var c = d.mode == RnnMode::Lstm ? initial(3, p) : Var();
            std::vector<Var> steps(static_cast<std::size_t>(d.steps));
            for (std::int64_t s = 0; s < d.steps; ++s) {
                const std::int64_t t = dir == 0 ? s : d.steps - 1 - s;
                const Var a = reshape(narrow(projected, 0, t, 1), {N, GH});
                const Var rec = linear(h, w_hh, b_hh);
                switch (d.mode) {
                    case RnnMode::RnnTanh: h = tanh(add(a, rec)); break;
                    case RnnMode::RnnRelu: h = relu(add(a, rec)); break;
                    case RnnMode::Lstm: {
                        const Var pre = add(a, rec);
                        const Var i = sigmoid(gate(pre, 0)), f = sigmoid(gate(pre, 1));
                        const Var g = tanh(gate(pre, 2)), o = sigmoid(gate(pre, 3));
                        c = add(mul(f, c), mul(i, g));
                        h = mul(o, tanh(c));
                        break;
                    }
                    case RnnMode::Gru: {
                        const Var r = sigmoid(add(gate(a, 0), gate(rec, 0)));
                        const Var z = sigmoid(add(gate(a, 1), gate(rec, 1)));
                        const Var n = tanh(add(gate(a, 2), mul(r, gate(rec, 2))));
                        h = add(n, mul(z, sub(h, n)));  // (1 − z)·n + z·h
                        break;
                    }
                }
                steps[static_cast<std::size_t>(t)] = reshape(h, {1, N, H});
            }
            directions.push_back(concat(steps, 0));
            h_n.push_back(reshape(h, {N * H}));
            if (d.mode == RnnMode::Lstm) c_n.push_back(reshape(c, {N * H}));
        }
        layer_in = d.dirs == 1 ? directions[0] : concat(directions, 2);
    }
    std::vector<Var> packed{reshape(layer_in, {d.output_size()})};
    packed.insert(packed.end(), h_n.begin(), h_n.end());
    packed.insert(packed.end(), c_n.begin(), c_n.end());
    return concat(packed, 0);
}

namespace infer {

// x (T,N,I), w (weight size), h0, c0 (L·D,N,H) -> [output (T,N,D·H) | h_n (L·D,N,H) | c_n (L·D,N,H)]
OutputSpec rnn(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    const Tensor& w = inputs[1];
    require_float(x, "x");
    if (x.rank() != 3) throw ShapeError(str("x must be (T,N,I), got shape ", to_string(x.shape())));
    const RnnOptions options = options_of(attrs);
    check_options(attrs.rnn_mode, options, x.size(2));
    if (x.size(0) < 1 || x.size(1) < 1)
        throw ShapeError(str("x (T,N,I) needs at least one step and one sequence, got shape ", to_string(x.shape())));
    const RnnDims d(attrs.rnn_mode, options, x.size(0), x.size(1), x.size(2));
    const char* roles[] = {"x", "w", "h0", "c0"};
    for (std::size_t i = 1; i < inputs.size(); ++i) require_same_dtype(inputs[i], roles[i], x, "x");
    if (w.rank() != 1 || w.numel() != d.weight_size()) {
        // Only layer 0's W_ih depends on the input size I, so weight_size is const + per_feature·I: a weight
        // made for another I means x has the wrong number of features, not that w is wrong.
        const RnnDims no_input(attrs.rnn_mode, options, 0, 0, 0);
        const std::int64_t per_feature = d.gates * d.hidden * d.dirs;
        const std::int64_t rest = w.numel() - no_input.weight_size();
        if (w.rank() == 1 && rest > 0 && rest % per_feature == 0)
            throw ShapeError(str("x ", to_string(x.shape()), " has ", d.input, " features (x is (T,N,I)), but w ",
                                 to_string(w.shape()), " is the flat weight of ",
                                 describe_config(attrs.rnn_mode, options, rest / per_feature),
                                 ": feed x with ", rest / per_feature, " features, or make the weight for ", d.input));
        throw ShapeError(str("w has shape ", to_string(w.shape()), "; ",
                             describe_config(attrs.rnn_mode, options, d.input), " needs a flat weight of (",
                             d.weight_size(), ") (see rnn_weight_layout)"));
    }
    if (inputs.size() > 3 && attrs.rnn_mode != RnnMode::Lstm)
        throw ValueError(str("c0 is for lstm only, ", rnn_mode_name(attrs.rnn_mode), " has no cell state"));
    const Shape state{d.layers * d.dirs, d.batch, d.hidden};
    for (std::size_t i = 2; i < inputs.size(); ++i)
        if (inputs[i].shape() != state)
            throw ShapeError(str(roles[i], " has shape ", to_string(inputs[i].shape()), ", expected ", to_string(state),
                                 " = (layers·directions, N, hidden)"));
    return {{d.packed_size()}, x.dtype()};
}

}  // namespace infer

namespace cpu {

namespace {

// saved[l] (l < L): layer l's outputs (T,N,D·H); then per pseudo-layer p two tensors: the gate
// activations (T,N,G·H) and, for lstm, the cell states c_t (T,N,H), for gru R_n·h_{t-1} + b_Rn (T,N,H)
// (empty for the single-gate cells).
std::size_t gates_slot(const RnnDims& d, std::int64_t p) { return static_cast<std::size_t>(d.layers + 2 * p); }
std::size_t extra_slot(const RnnDims& d, std::int64_t p) { return gates_slot(d, p) + 1; }

// Pseudo-layer p's matrices and biases in a flat buffer of the weight's layout: the weight itself
// (E = const T) or its gradient (E = T).
template <typename E>
struct CellBlocks {
    using T = std::remove_const_t<E>;
    CellBlocks(const RnnDims& d, E* w, std::int64_t p)
        : in(d.layer_input(p / d.dirs)),
          w_ih(w + d.matrix_offset(p), d.gates * d.hidden, in),
          w_hh(w_ih.data() + d.gates * d.hidden * in, d.gates * d.hidden, d.hidden),
          b_ih(w + d.bias_offset(p), d.gates * d.hidden),
          b_hh(b_ih.data() + d.gates * d.hidden, d.gates * d.hidden) {}
    std::int64_t in;
    Eigen::Map<std::conditional_t<std::is_const_v<E>, const MatrixRM<T>, MatrixRM<T>>> w_ih, w_hh;
    Eigen::Map<std::conditional_t<std::is_const_v<E>, const RowVector<T>, RowVector<T>>> b_ih, b_hh;
};
template <typename T> using CellWeights = CellBlocks<const T>;
template <typename T> using CellGrads = CellBlocks<T>;

template <typename T> T logistic(T v) { return T(1) / (T(1) + std::exp(-v)); }

// State p of an optional (L·D,N,H) input, or zeros.
template <typename T>
MatrixRM<T> initial_state(const Tensor* state, const RnnDims& d, std::int64_t p) {
    if (!state) return MatrixRM<T>::Zero(d.batch, d.hidden);
    return ConstMatrixMap<T>(state->data<T>() + p * d.batch * d.hidden, d.batch, d.hidden);
}

template <typename T>
void forward_impl(const RnnDims& d, std::span<const Tensor> inputs, Tensor& out, std::vector<Tensor>& saved) {
    const std::int64_t H = d.hidden, N = d.batch, TN = d.steps * d.batch, GH = d.gates * d.hidden;
    const Tensor* h0 = inputs.size() > 2 ? &inputs[2] : nullptr;
    const Tensor* c0 = inputs.size() > 3 ? &inputs[3] : nullptr;
    const T* w = inputs[1].data<T>();
    T* h_n = out.data<T>() + d.output_size();
    T* c_n = h_n + d.state_size();
    const DType dtype = dtype_of<T>();
    saved.assign(static_cast<std::size_t>(d.layers + 2 * d.layers * d.dirs), Tensor());
    const bool has_extra = d.mode == RnnMode::Lstm || d.mode == RnnMode::Gru;
    for (std::int64_t l = 0; l < d.layers; ++l) {
        const Tensor& layer_in = l == 0 ? inputs[0] : saved[l - 1];
        const ConstMatrixMap<T> X(layer_in.data<T>(), TN, d.layer_input(l));
        saved[l] = Tensor::empty({d.steps, N, d.dirs * H}, dtype);
        MatrixMap<T> Y(saved[l].data<T>(), TN, d.dirs * H);
        for (std::int64_t dir = 0; dir < d.dirs; ++dir) {
            const std::int64_t p = l * d.dirs + dir;
            const CellWeights<T> cw(d, w, p);
            Tensor& gates = saved[gates_slot(d, p)] = Tensor::empty({d.steps, N, GH}, dtype);
            Tensor& extra = saved[extra_slot(d, p)] = Tensor::empty({has_extra ? d.steps : 0, N, H}, dtype);
            MatrixMap<T> A(gates.data<T>(), TN, GH);
            MatrixMap<T> E(extra.data<T>(), extra.size(0) * N, H);
            // Input projections of every step in one GEMM; each step turns its rows into activations.
            A.noalias() = X * cw.w_ih.transpose();
            A.rowwise() += cw.b_ih;
            MatrixRM<T> h = initial_state<T>(h0, d, p);
            MatrixRM<T> c = d.mode == RnnMode::Lstm ? initial_state<T>(c0, d, p) : MatrixRM<T>();
            MatrixRM<T> rec(N, GH);
            for (std::int64_t s = 0; s < d.steps; ++s) {
                const std::int64_t t = dir == 0 ? s : d.steps - 1 - s;
                rec.noalias() = h * cw.w_hh.transpose();
                rec.rowwise() += cw.b_hh;
                auto a = A.middleRows(t * N, N);
                // Pre-activations of gates [first, first + count): input side (in a) + recurrent side.
                const auto pre = [&](std::int64_t first, std::int64_t count) {
                    return a.middleCols(first * H, count * H).array() + rec.middleCols(first * H, count * H).array();
                };
                switch (d.mode) {
                    case RnnMode::RnnTanh:
                        a.array() = pre(0, 1).tanh();
                        h = a;
                        break;
                    case RnnMode::RnnRelu:
                        a.array() = pre(0, 1).max(T(0));
                        h = a;
                        break;
                    case RnnMode::Lstm: {
                        a.leftCols(2 * H).array() = pre(0, 2).unaryExpr(&logistic<T>);
                        a.middleCols(2 * H, H).array() = pre(2, 1).tanh();
                        a.rightCols(H).array() = pre(3, 1).unaryExpr(&logistic<T>);
                        const auto i = a.leftCols(H).array();
                        const auto f = a.middleCols(H, H).array();
                        const auto g = a.middleCols(2 * H, H).array();
                        const auto o = a.rightCols(H).array();
                        c.array() = f * c.array() + i * g;
                        E.middleRows(t * N, N) = c;
                        h.array() = o * c.array().tanh();
                        break;
                    }
                    case RnnMode::Gru: {
                        a.leftCols(2 * H).array() = pre(0, 2).unaryExpr(&logistic<T>);
                        E.middleRows(t * N, N) = rec.rightCols(H);
                        const auto r = a.leftCols(H).array();
                        const auto z = a.middleCols(H, H).array();
                        a.rightCols(H).array() = (a.rightCols(H).array() + r * rec.rightCols(H).array()).tanh();
                        const auto n = a.rightCols(H).array();
                        h.array() = (T(1) - z) * n + z * h.array();
                        break;
                    }
                }
                Y.block(t * N, dir * H, N, H) = h;
            }
            MatrixMap<T>(h_n + p * N * H, N, H) = h;
            if (d.mode == RnnMode::Lstm) MatrixMap<T>(c_n + p * N * H, N, H) = c;
        }
    }
    MatrixMap<T>(out.data<T>(), TN, d.dirs * H) = ConstMatrixMap<T>(saved[d.layers - 1].data<T>(), TN, d.dirs * H);
}

template <typename T>
std::vector<Tensor> backward_impl(const RnnDims& d, const BackwardArgs& args) {
    const std::int64_t H = d.hidden, N = d.batch, TN = d.steps * d.batch, GH = d.gates * d.hidden;
    const std::span<const Tensor> inputs = args.inputs;
    const std::span<const Tensor> saved = args.saved;
    const Tensor* h0 = inputs.size() > 2 ? &inputs[2] : nullptr;
    const Tensor* c0 = inputs.size() > 3 ? &inputs[3] : nullptr;
    const T* w = inputs[1].data<T>();
    const T* dh_n = args.grad_output.data<T>() + d.output_size();
    const T* dc_n = dh_n + d.state_size();
    std::vector<Tensor> grads(inputs.size());
    for (std::size_t i = 1; i < inputs.size(); ++i)
        if (args.needs_grad[i]) grads[i] = Tensor::zeros(inputs[i].shape(), inputs[i].dtype());
    T* dw = grads[1].defined() ? grads[1].data<T>() : nullptr;

    // dY: the gradient of the current layer's outputs, from the top layer down.
    MatrixRM<T> dY = ConstMatrixMap<T>(args.grad_output.data<T>(), TN, d.dirs * H);
    for (std::int64_t l = d.layers - 1; l >= 0; --l) {
        const Tensor& layer_in = l == 0 ? inputs[0] : saved[l - 1];
        const ConstMatrixMap<T> X(layer_in.data<T>(), TN, d.layer_input(l));
        const ConstMatrixMap<T> Y(saved[l].data<T>(), TN, d.dirs * H);
        const bool need_dx = l > 0 || args.needs_grad[0];
        MatrixRM<T> dX = need_dx ? MatrixRM<T>::Zero(TN, d.layer_input(l)) : MatrixRM<T>();
        for (std::int64_t dir = 0; dir < d.dirs; ++dir) {
            const std::int64_t p = l * d.dirs + dir;
            const CellWeights<T> cw(d, w, p);
            const ConstMatrixMap<T> A(saved[gates_slot(d, p)].data<T>(), TN, GH);
            const ConstMatrixMap<T> E(saved[extra_slot(d, p)].data<T>(), saved[extra_slot(d, p)].size(0) * N, H);
            MatrixRM<T> dA_in(TN, GH);  // gradients of the gates' pre-activations, input side
            MatrixRM<T> dA_rec(N, GH);  // the same on the recurrent side at one step (gru's n gate differs)
            MatrixRM<T> dh = ConstMatrixMap<T>(dh_n + p * N * H, N, H);
            MatrixRM<T> dc = d.mode == RnnMode::Lstm ? MatrixRM<T>(ConstMatrixMap<T>(dc_n + p * N * H, N, H)) : MatrixRM<T>();
            MatrixRM<T> h_prev(N, H), c_prev, dh_prev(N, H);
            for (std::int64_t s = d.steps - 1; s >= 0; --s) {
                const std::int64_t t = dir == 0 ? s : d.steps - 1 - s;
                const std::int64_t t_prev = dir == 0 ? t - 1 : t + 1;
                if (s == 0) {
                    h_prev = initial_state<T>(h0, d, p);
                    if (d.mode == RnnMode::Lstm) c_prev = initial_state<T>(c0, d, p);
                } else {
                    h_prev = Y.block(t_prev * N, dir * H, N, H);
                    if (d.mode == RnnMode::Lstm) c_prev = E.middleRows(t_prev * N, N);
                }
                dh += dY.block(t * N, dir * H, N, H);
                const auto a = A.middleRows(t * N, N);
                auto din = dA_in.middleRows(t * N, N);
                switch (d.mode) {
                    case RnnMode::RnnTanh:
                        din.array() = dh.array() * (T(1) - a.array().square());
                        dA_rec = din;
                        break;
                    case RnnMode::RnnRelu:
                        din.array() = dh.array() * (a.array() > T(0)).template cast<T>();
                        dA_rec = din;
                        break;
                    case RnnMode::Lstm: {
                        const auto i = a.leftCols(H).array();
                        const auto f = a.middleCols(H, H).array();
                        const auto g = a.middleCols(2 * H, H).array();
                        const auto o = a.rightCols(H).array();
                        using Array = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic>;
                        const Array tc = E.middleRows(t * N, N).array().tanh();
                        dc.array() += dh.array() * o * (T(1) - tc.square());
                        din.leftCols(H).array() = dc.array() * g * i * (T(1) - i);
                        din.middleCols(H, H).array() = dc.array() * c_prev.array() * f * (T(1) - f);
                        din.middleCols(2 * H, H).array() = dc.array() * i * (T(1) - g.square());
                        din.rightCols(H).array() = dh.array() * tc * o * (T(1) - o);
                        dc.array() *= f;
                        dA_rec = din;
                        break;
                    }
                    case RnnMode::Gru: {
                        const auto r = a.leftCols(H).array();
                        const auto z = a.middleCols(H, H).array();
                        const auto n = a.rightCols(H).array();
                        const auto hn = E.middleRows(t * N, N).array();
                        din.rightCols(H).array() = dh.array() * (T(1) - z) * (T(1) - n.square());
                        din.leftCols(H).array() = din.rightCols(H).array() * hn * r * (T(1) - r);
                        din.middleCols(H, H).array() = dh.array() * (h_prev.array() - n) * z * (T(1) - z);
                        dA_rec.leftCols(2 * H) = din.leftCols(2 * H);
                        dA_rec.rightCols(H).array() = din.rightCols(H).array() * r;
                        break;
                    }
                }
                if (dw) {
                    CellGrads<T> cg(d, dw, p);
                    cg.w_hh.noalias() += dA_rec.transpose() * h_prev;
                    cg.b_hh += dA_rec.colwise().sum();
                }
                dh_prev.noalias() = dA_rec * cw.w_hh;
                if (d.mode == RnnMode::Gru) dh_prev.array() += dh.array() * a.middleCols(H, H).array();
                dh.swap(dh_prev);
            }
            if (grads.size() > 2 && grads[2].defined()) MatrixMap<T>(grads[2].data<T>() + p * N * H, N, H) = dh;
            if (grads.size() > 3 && grads[3].defined()) MatrixMap<T>(grads[3].data<T>() + p * N * H, N, H) = dc;
            if (dw) {
                CellGrads<T> cg(d, dw, p);
                cg.w_ih.noalias() = dA_in.transpose() * X;
                cg.b_ih = dA_in.colwise().sum();
            }
            if (need_dx) dX.noalias() += dA_in * cw.w_ih;
        }
        if (l > 0) {
            dY = std::move(dX);
        } else if (args.needs_grad[0]) {
            grads[0] = Tensor::empty(inputs[0].shape(), inputs[0].dtype());
            MatrixMap<T>(grads[0].data<T>(), TN, d.input) = dX;
        }
    }
    return grads;
}

RnnDims dims_of(const Tensor& x, const OpAttrs& attrs) {
    return RnnDims(attrs.rnn_mode, options_of(attrs), x.size(0), x.size(1), x.size(2));
}

}  // namespace

// x (T,N,I)  w (flat)  h0, c0 (L·D,N,H) -> [y (T,N,D·H) | h_n | c_n]; saves every layer's outputs and
// gate activations for the backward
Tensor rnn_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor out = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    const RnnDims d = dims_of(x, args.attrs);
    dispatch_floating(x.dtype(), "rnn", [&]<typename T>() { forward_impl<T>(d, args.inputs, out, args.saved); });
    return out;
}

// d[y | h_n | c_n] -> dx, dw, dh0, dc0 by backpropagation through time, layer by layer from the top
std::vector<Tensor> rnn_backward(const BackwardArgs& args) {
    const RnnDims d = dims_of(args.inputs[0], args.attrs);
    return dispatch_floating(args.inputs[0].dtype(), "rnn backward",
                             [&]<typename T>() { return backward_impl<T>(d, args); });
}

}  // namespace cpu

}  // namespace dyngrad
