// Recurrent layers (ops/rnn.h) beyond the table-driven checks: the rnn op against the same networks
// composed from our own ops (an independent statement of the equations and the weight layout), the
// named weight layout, the layers, narrow/concat values, and the errors for bad inputs. With a CUDA
// device, also the cuDNN path: float64, inference vs training forwards, and a second backward.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

std::int64_t gates_of(RnnMode mode) {
    return mode == RnnMode::Lstm ? 4 : mode == RnnMode::Gru ? 3 : 1;
}

// w[offset : offset + numel(shape)] as `shape`.
Var take(const Var& w, std::int64_t offset, const Shape& shape) {
    return reshape(narrow(w, 0, offset, numel(shape)), shape);
}

// The network rnn() computes, written out step by step with matmul-level ops. The weight offsets are
// computed here from the layout documented in ops/rnn.h, not from rnn_weight_layout().
RnnResult composed_rnn(RnnMode mode, const Var& x, const Var& w, const RnnOptions& o, std::optional<Var> h0,
                       std::optional<Var> c0) {
    ComputeGraph& graph = x.graph();
    const std::int64_t T = x.shape()[0], N = x.shape()[1], I = x.shape()[2];
    const std::int64_t H = o.hidden_size, G = gates_of(mode), D = o.bidirectional ? 2 : 1;
    const auto zeros = [&] { return graph.constant(Tensor::zeros({N, H}, x.dtype())); };
    const auto state = [&](const std::optional<Var>& s, std::int64_t p) {
        return s ? reshape(narrow(*s, 0, p, 1), {N, H}) : zeros();
    };
    const auto gate = [&](const Var& a, std::int64_t k) { return narrow(a, 1, k * H, H); };

    std::vector<Var> layer_in;
    for (std::int64_t t = 0; t < T; ++t) layer_in.push_back(reshape(narrow(x, 0, t, 1), {N, I}));
    std::vector<Var> h_n, c_n;
    // All matrices first (per pseudo-layer: W_ih, W_hh), then all biases (per pseudo-layer: b_ih, b_hh).
    std::int64_t matrices = 0;
    for (std::int64_t l = 0; l < o.num_layers; ++l) matrices += D * G * H * ((l == 0 ? I : D * H) + H);
    std::int64_t offset = 0;
    for (std::int64_t l = 0; l < o.num_layers; ++l) {
        const std::int64_t in = l == 0 ? I : D * H;
        std::vector<std::vector<Var>> outs(D, std::vector<Var>(T));
        for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t p = l * D + d;
            const Var w_ih = take(w, offset, {G * H, in});
            const Var w_hh = take(w, offset + G * H * in, {G * H, H});
            const Var b_ih = take(w, matrices + 2 * G * H * p, {G * H});
            const Var b_hh = take(w, matrices + 2 * G * H * p + G * H, {G * H});
            offset += G * H * (in + H);
            Var h = state(h0, p);
            Var c = state(c0, p);
            for (std::int64_t s = 0; s < T; ++s) {
                const std::int64_t t = d == 0 ? s : T - 1 - s;
                const Var gi = linear(layer_in[t], w_ih, b_ih);
                const Var gh = linear(h, w_hh, b_hh);
                switch (mode) {
                    case RnnMode::RnnTanh: h = tanh(gi + gh); break;
                    case RnnMode::RnnRelu: h = relu(gi + gh); break;
                    case RnnMode::Lstm: {
                        const Var i = sigmoid(gate(gi, 0) + gate(gh, 0));
                        const Var f = sigmoid(gate(gi, 1) + gate(gh, 1));
                        const Var g = tanh(gate(gi, 2) + gate(gh, 2));
                        const Var og = sigmoid(gate(gi, 3) + gate(gh, 3));
                        c = f * c + i * g;
                        h = og * tanh(c);
                        break;
                    }
                    case RnnMode::Gru: {
                        const Var r = sigmoid(gate(gi, 0) + gate(gh, 0));
                        const Var z = sigmoid(gate(gi, 1) + gate(gh, 1));
                        const Var n = tanh(gate(gi, 2) + r * gate(gh, 2));
                        h = n + z * (h - n);  // (1 − z)·n + z·h
                        break;
                    }
                }
                outs[d][t] = h;
            }
            h_n.push_back(reshape(h, {1, N, H}));
            c_n.push_back(reshape(c, {1, N, H}));
        }
        for (std::int64_t t = 0; t < T; ++t) layer_in[t] = D == 1 ? outs[0][t] : concat({outs[0][t], outs[1][t]}, 1);
    }
    std::vector<Var> steps;
    for (const Var& y : layer_in) steps.push_back(reshape(y, {1, N, D * H}));
    RnnResult result;
    result.output = concat(steps, 0);
    result.h_n = concat(h_n, 0);
    if (mode == RnnMode::Lstm) result.c_n = concat(c_n, 0);
    return result;
}

struct Config {
    RnnMode mode;
    RnnOptions options;
    bool with_h0, with_c0;
};

std::string describe(const Config& c) {
    return str(rnn_mode_name(c.mode), " L", c.options.num_layers, c.options.bidirectional ? " bidir" : " uni",
               c.with_h0 ? " h0" : "", c.with_c0 ? " c0" : "");
}

std::vector<Config> configs() {
    std::vector<Config> out;
    for (RnnMode mode : {RnnMode::Lstm, RnnMode::Gru, RnnMode::RnnTanh, RnnMode::RnnRelu}) {
        const bool lstm = mode == RnnMode::Lstm;
        out.push_back({mode, {3, 1, false}, true, lstm});
        out.push_back({mode, {2, 2, true}, false, false});
        out.push_back({mode, {2, 2, true}, true, lstm});
    }
    return out;
}

// Inputs of one configuration: x (T,N,I), w, h0, c0, and weights for the loss terms.
struct Inputs {
    Tensor x, w, h0, c0, wy, wh, wc;
};

Inputs make_inputs(const Config& c, std::int64_t T, std::int64_t N, std::int64_t I, Generator& gen,
                   DType dtype = DType::f64, Device device = Device::cpu()) {
    const std::int64_t D = c.options.bidirectional ? 2 : 1, H = c.options.hidden_size;
    const Shape state{c.options.num_layers * D, N, H};
    const auto normal = [&](const Shape& s, double sd) { return Tensor::normal(s, 0.0, sd, gen, dtype, device); };
    Inputs in;
    in.x = normal({T, N, I}, 1.0);
    in.w = normal({rnn_weight_size(c.mode, c.options, I)}, 0.5);
    in.h0 = normal(state, 0.5);
    in.c0 = normal(state, 0.5);
    in.wy = normal({T, N, D * H}, 1.0);
    in.wh = normal(state, 1.0);
    in.wc = normal(state, 1.0);
    return in;
}

struct Run {
    Tensor output, h_n, c_n, dx, dw, dh0, dc0;
};

// L = Σ wy·output + Σ wh·h_n (+ Σ wc·c_n), then backward; `use_op` picks rnn() or the composition.
Run run(const Config& c, const Inputs& in, bool use_op, int backwards = 1) {
    ComputeGraph graph;
    const Var x = graph.input(in.x, "x", true);
    const Var w = graph.input(in.w, "w", true);
    std::optional<Var> h0, c0;
    if (c.with_h0) h0 = graph.input(in.h0, "h0", true);
    if (c.with_c0) c0 = graph.input(in.c0, "c0", true);
    const RnnResult r = use_op ? rnn(c.mode, x, w, c.options, h0, c0) : composed_rnn(c.mode, x, w, c.options, h0, c0);
    Var loss = sum(r.output * graph.constant(in.wy)) + sum(r.h_n * graph.constant(in.wh));
    if (c.mode == RnnMode::Lstm) loss = loss + sum(r.c_n * graph.constant(in.wc));
    Run out;
    out.output = r.output.value();
    out.h_n = r.h_n.value();
    if (c.mode == RnnMode::Lstm) out.c_n = r.c_n.value();
    // Leaves accumulate: after k backwards over the retained graph their gradients are k times one.
    for (int i = 0; i < backwards; ++i) graph.backward(loss, BackwardOptions{.retain_graph = i + 1 < backwards});
    out.dx = x.grad();
    out.dw = w.grad();
    if (h0) out.dh0 = h0->grad();
    if (c0) out.dc0 = c0->grad();
    return out;
}

void check_close(const char* what, const Tensor& actual, const Tensor& reference, double tolerance) {
    INFO(what << ": " << describe(actual) << " vs " << describe(reference));
    REQUIRE(actual.defined() == reference.defined());
    if (!actual.defined()) return;
    CHECK(actual.shape() == reference.shape());
    CHECK(relative_norm_error(actual.to(Device::cpu()).to(DType::f64), reference.to(Device::cpu()).to(DType::f64)) <=
          tolerance);
}

void check_runs(const Run& actual, const Run& reference, double tolerance) {
    check_close("output", actual.output, reference.output, tolerance);
    check_close("h_n", actual.h_n, reference.h_n, tolerance);
    check_close("c_n", actual.c_n, reference.c_n, tolerance);
    check_close("dx", actual.dx, reference.dx, tolerance);
    check_close("dw", actual.dw, reference.dw, tolerance);
    check_close("dh0", actual.dh0, reference.dh0, tolerance);
    check_close("dc0", actual.dc0, reference.dc0, tolerance);
}

// One section per configuration of the table, each given inputs of `sizes` (sequence, batch, input features)
// drawn from a generator seeded `seed + k` for the k-th configuration.
template <typename Body>
void for_each_config(std::uint64_t seed, const std::array<std::int64_t, 3>& sizes, Body body) {
    const std::vector<Config> all = configs();
    for (std::size_t k = 0; k < all.size(); ++k) {
        DYNAMIC_SECTION(describe(all[k])) {
            Generator gen(seed + k);
            body(all[k], make_inputs(all[k], sizes[0], sizes[1], sizes[2], gen));
        }
    }
}

}  // namespace

TEST_CASE("the rnn op equals the same network composed from our ops", "[rnn][composite]") {
    for_each_config(500, {4, 3, 5}, [](const Config& c, const Inputs& in) {
        const Run op = run(c, in, true);
        const Run composed = run(c, in, false);
        check_runs(op, composed, 1e-12);
        // Not a vacuous comparison: the loss reaches every input.
        CHECK(relative_norm_error(op.dw, Tensor::zeros(op.dw.shape(), DType::f64)) > 0);
    });
}

TEST_CASE("a second backward over a retained rnn graph doubles the gradients", "[rnn][retain]") {
    const Config c{RnnMode::Lstm, {2, 2, true}, true, true};
    Generator gen(42);
    const Inputs in = make_inputs(c, 3, 2, 3, gen);
    const Run once = run(c, in, true, 1);
    const Run twice = run(c, in, true, 2);
    CHECK(relative_norm_error(twice.dw, once.dw.to(DType::f64)) == dgtest::Approx(1.0).epsilon(1e-9));
}

TEST_CASE("rnn_weight_layout names every block of the flat weight once", "[rnn][layout]") {
    for (const Config& c : configs()) {
        for (std::int64_t input : {1, 5}) {
            INFO(describe(c) << " input " << input);
            const std::vector<RnnWeightEntry> entries = rnn_weight_layout(c.mode, c.options, input);
            const std::int64_t D = c.options.bidirectional ? 2 : 1;
            CHECK(static_cast<std::int64_t>(entries.size()) == c.options.num_layers * D * 4 * gates_of(c.mode));
            std::set<std::string> names;
            std::int64_t end = 0;
            for (const RnnWeightEntry& e : entries) {
                INFO(e.name);
                CHECK(names.insert(e.name).second);
                CHECK(e.offset == end);  // in memory order, no gap, no overlap
                end = e.offset + numel(e.shape);
            }
            CHECK(end == rnn_weight_size(c.mode, c.options, input));
        }
    }
    const std::vector<RnnWeightEntry> lstm2 = rnn_weight_layout(RnnMode::Lstm, {2, 2, true}, 3);
    const auto find = [&](const std::string& name) {
        for (const RnnWeightEntry& e : lstm2)
            if (e.name == name) return e;
        FAIL("no entry " << name);
        return RnnWeightEntry{};
    };
    CHECK(find("l0.fwd.W_ih.i").offset == 0);
    CHECK(find("l0.fwd.W_ih.f").offset == 6);
    CHECK(find("l0.fwd.W_ih.o").shape == Shape{2, 3});
    CHECK(find("l0.fwd.W_hh.i").offset == 24);
    CHECK(find("l0.fwd.W_hh.g").shape == Shape{2, 2});
    CHECK(find("l0.bwd.W_ih.i").offset == 40);
    CHECK(find("l1.fwd.W_ih.i").offset == 80);
    CHECK(find("l1.fwd.W_ih.i").shape == Shape{2, 4});  // layer 1 reads both directions
    CHECK(find("l1.bwd.W_ih.i").offset == 128);
    CHECK(find("l0.fwd.b_ih.i").offset == 176);  // the biases follow every matrix
    CHECK(find("l0.fwd.b_hh.o").offset == 190);
    CHECK(find("l0.bwd.b_ih.i").offset == 192);
    CHECK(find("l1.bwd.b_hh.o").offset + 2 == rnn_weight_size(RnnMode::Lstm, {2, 2, true}, 3));
    CHECK(rnn_weight_size(RnnMode::Lstm, {2, 2, true}, 3) == 240);
    CHECK(rnn_weight_layout(RnnMode::RnnTanh, {4, 1, false}, 3)[1].name == "l0.fwd.W_hh");
    CHECK(rnn_weight_layout(RnnMode::Gru, {4, 1, false}, 3)[2].name == "l0.fwd.W_ih.n");
    CHECK_THROWS_AS(rnn_weight_layout(RnnMode::Gru, {0, 1, false}, 3), ValueError);
    CHECK_THROWS_AS(rnn_weight_size(RnnMode::Gru, {2, 0, false}, 3), ValueError);
    CHECK_THROWS_AS(rnn_weight_size(RnnMode::Gru, {2, 1, false}, 0), ValueError);
}

TEST_CASE("a gate matrix set by name changes exactly that gate", "[rnn][layout]") {
    // rnn_tanh with one step from h0 = 0: output = tanh(W_ih x + b_ih + b_hh); set W_ih to the identity.
    const RnnOptions options{2, 1, false};
    Tensor w = Tensor::zeros({rnn_weight_size(RnnMode::RnnTanh, options, 2)}, DType::f64);
    for (const RnnWeightEntry& e : rnn_weight_layout(RnnMode::RnnTanh, options, 2))
        if (e.name == "l0.fwd.W_ih") {
            w.set({e.offset}, 1.0);
            w.set({e.offset + 3}, 1.0);
        }
    ComputeGraph graph;
    const Var x = graph.input(Tensor::from_vector({0.5, -0.25}, {1, 1, 2}, DType::f64));
    const RnnResult r = rnn_tanh(x, graph.input(w), options);
    CHECK_THAT(r.output.value().to_vector(), dgtest::ApproxVector({std::tanh(0.5), std::tanh(-0.25)}));
    CHECK_THAT(r.h_n.value().to_vector(), dgtest::ApproxVector({std::tanh(0.5), std::tanh(-0.25)}));
    CHECK_FALSE(r.c_n.defined());
}

TEST_CASE("LSTM, GRU and RNN layers hold one flat weight", "[rnn][layers]") {
    Generator gen(9);
    LSTM lstm_layer(5, {4, 2, true}, gen);
    GRU gru_layer(5, {4, 1, false}, gen);
    RNN relu_layer(5, {4, 1, false}, true, gen);
    const auto params = lstm_layer.named_parameters();
    REQUIRE(params.size() == 1);
    CHECK(params[0].first == "weight");
    CHECK(params[0].second.value().shape() == Shape{rnn_weight_size(RnnMode::Lstm, {4, 2, true}, 5)});
    double largest = 0;
    for (double v : params[0].second.value().to_vector()) largest = std::max(largest, std::abs(v));
    CHECK(largest <= 0.5);  // 1/√4
    CHECK(largest > 0.4);   // and not some smaller range
    CHECK(relu_layer.mode == RnnMode::RnnRelu);

    ComputeGraph graph;
    const Var x = graph.input(Tensor::normal({6, 3, 5}, 0, 1, gen));
    const RnnResult a = lstm_layer(x);
    CHECK(a.output.shape() == Shape{6, 3, 8});
    CHECK(a.h_n.shape() == Shape{4, 3, 4});
    CHECK(a.c_n.shape() == Shape{4, 3, 4});
    const RnnResult b = gru_layer(x, graph.input(Tensor::zeros({1, 3, 4})));
    CHECK(b.output.shape() == Shape{6, 3, 4});
    CHECK_FALSE(b.c_n.defined());
    graph.backward(sum(a.output) + sum(b.h_n) + sum(relu_layer(x).output));
    CHECK(lstm_layer.weight.grad().shape() == lstm_layer.weight.value().shape());
    CHECK(gru_layer.weight.grad().defined());
}

TEST_CASE("narrow and concat move the expected elements", "[rnn][layout]") {
    ComputeGraph graph;
    const Var a = graph.input(Tensor::arange(0, 12, 1, DType::f64).reshaped({3, 4}), "a", true);
    const Var b = graph.input(Tensor::arange(100, 106, 1, DType::f64).reshaped({3, 2}), "b", true);
    CHECK(narrow(a, 1, 1, 2).value().to_vector() == std::vector<double>{1, 2, 5, 6, 9, 10});
    CHECK(narrow(a, 0, 2, 1).value().to_vector() == std::vector<double>{8, 9, 10, 11});
    CHECK(concat({b, a}, -1).value().to_vector() ==
          std::vector<double>{100, 101, 0, 1, 2, 3, 102, 103, 4, 5, 6, 7, 104, 105, 8, 9, 10, 11});
    const Var labels = graph.input(Tensor::from_vector(std::vector<std::int64_t>{4, 5, 6}, {3}));
    CHECK(narrow(labels, 0, 1, 2).value().to_vector() == std::vector<double>{5, 6});  // any dtype
    const Var y = concat({narrow(a, 1, 3, 1), b, narrow(a, 1, 0, 1)}, 1);
    graph.backward(sum(y * y));
    CHECK(a.grad().to_vector() == std::vector<double>{0, 0, 0, 6, 8, 0, 0, 14, 16, 0, 0, 22});
    CHECK(b.grad().to_vector() == std::vector<double>{200, 202, 204, 206, 208, 210});
}

TEST_CASE("bad rnn, narrow and concat inputs are typed errors", "[rnn][errors]") {
    ComputeGraph graph;
    const RnnOptions two_layers{2, 2, false};
    const auto input = [&](const Shape& s, DType dtype = DType::f64) { return graph.input(Tensor::zeros(s, dtype)); };
    const Var x = input({3, 2, 3});
    const Var w = input({rnn_weight_size(RnnMode::Lstm, two_layers, 3)});
    const Var w_gru = input({rnn_weight_size(RnnMode::Gru, two_layers, 3)});
    const Var h0 = input({2, 2, 2});

    CHECK_NOTHROW(lstm(x, w, two_layers, h0, h0));
    // x with 4 features for a weight made for 3: the message blames x's features, not the weight.
    CHECK_THROWS_MATCHES(lstm(input({3, 2, 4}), w, two_layers), ShapeError,
                         MessageHas({"rnn", "x (3,2,4) has 4 features", "flat weight of lstm with input 3"}));
    CHECK_THROWS_MATCHES(lstm(x, input({7}), two_layers), ShapeError,
                         MessageHas({"rnn", "w has shape (7)", "input 3", "needs a flat weight"}));
    CHECK_THROWS_MATCHES(lstm(x, w, two_layers, input({1, 2, 2})), ShapeError,
                         MessageHas({"h0 has shape (1,2,2), expected (2,2,2)"}));
    CHECK_THROWS_MATCHES(lstm(x, w, two_layers, h0, input({2, 3, 2})), ShapeError,
                         MessageHas({"c0 has shape (2,3,2)"}));
    CHECK_THROWS_MATCHES(rnn(RnnMode::Gru, x, w_gru, two_layers, h0, h0), ValueError,
                         MessageHas({"c0 is for lstm only"}));
    OpAttrs gru_attrs;
    gru_attrs.rnn_mode = RnnMode::Gru;
    gru_attrs.hidden_size = 2;
    gru_attrs.num_layers = 2;
    CHECK_THROWS_MATCHES(graph.record(OpType::Rnn, {x, w_gru, h0, h0}, gru_attrs, std::source_location::current()),
                         ValueError, MessageHas({"c0 is for lstm only", "gru"}));
    CHECK_THROWS_MATCHES(lstm(x, w, two_layers, std::nullopt, h0), ValueError, MessageHas({"c0 needs h0"}));
    CHECK_THROWS_MATCHES(lstm(input({6, 3}), w, two_layers), ShapeError, MessageHas({"x must be (T,N,I)", "(6,3)"}));
    CHECK_THROWS_MATCHES(lstm(x, input({4, 30}), two_layers), ShapeError, MessageHas({"w has shape (4,30)"}));
    CHECK_THROWS_MATCHES(lstm(x, input({w.shape()[0]}, DType::f32), two_layers), DTypeError,
                         MessageHas({"w is float32 but x is float64"}));
    CHECK_THROWS_MATCHES(lstm(x, w, {0, 1, false}), ValueError, MessageHas({"hidden size must be positive"}));
    CHECK_THROWS_MATCHES(lstm(input({0, 2, 3}), w, two_layers), ShapeError, MessageHas({"at least one step"}));

    const Var m = input({3, 4});
    CHECK_THROWS_MATCHES(narrow(m, 1, 3, 2), IndexError, MessageHas({"narrow", "[3, 5)", "axis 1 of size 4"}));
    CHECK_THROWS_MATCHES(narrow(m, 0, -1, 1), IndexError, MessageHas({"narrow"}));
    CHECK_THROWS_MATCHES(narrow(m, 0, 0, -1), ValueError, MessageHas({"length -1 is negative"}));
    CHECK_THROWS_AS(narrow(m, 2, 0, 1), ShapeError);
    CHECK_THROWS_MATCHES(concat({m, input({3, 5})}, 0), ShapeError,
                         MessageHas({"concat", "input 1 of shape (3,5) does not fit input 0 of shape (3,4)"}));
    CHECK_NOTHROW(concat({m, input({3, 5})}, 1));
    CHECK_THROWS_MATCHES(concat({m, input({3, 4}, DType::f32)}, 0), DTypeError, MessageHas({"input 1 is float32"}));
    CHECK_THROWS_MATCHES(concat(std::vector<Var>{}, 0), ValueError, MessageHas({"at least one tensor"}));
    CHECK_THROWS_MATCHES(graph.record(OpType::Concat, std::vector<Var>{}, {}, std::source_location::current()),
                         GraphError, MessageHas({"takes 1 or more inputs, got 0"}));
}

TEST_CASE("rnn on the GPU matches the CPU in float64, in both forward modes and over two backwards",
          "[rnn][gpu]") {
    // On a CPU-only machine the table's gpu_vs_cpu checks cover the rest.
    if (cuda_device_count() == 0) DG_SKIP("needs a CUDA device");
    const Device gpu = Device::cuda(0);
    for_each_config(900, {5, 3, 4}, [&](const Config& c, const Inputs& cpu_in) {
        Inputs gpu_in = cpu_in;
        for (Tensor* t : {&gpu_in.x, &gpu_in.w, &gpu_in.h0, &gpu_in.c0, &gpu_in.wy, &gpu_in.wh, &gpu_in.wc})
            *t = t->to(gpu);
        const Run reference = run(c, cpu_in, true);
        check_runs(run(c, gpu_in, true), reference, 1e-10);
        // retain_graph: the second backward adds the same gradients again.
        const Run twice = run(c, gpu_in, true, 2);
        CHECK(relative_norm_error(twice.dw.to(Device::cpu()), reference.dw) == dgtest::Approx(1.0).epsilon(1e-9));
        // Inference mode (no reserve space) gives the training-mode values.
        NoGradGuard no_grad;
        ComputeGraph graph;
        const RnnResult r = rnn(c.mode, graph.input(gpu_in.x), graph.input(gpu_in.w), c.options,
                                c.with_h0 ? std::optional<Var>(graph.input(gpu_in.h0)) : std::nullopt,
                                c.with_c0 ? std::optional<Var>(graph.input(gpu_in.c0)) : std::nullopt);
        check_close("inference output", r.output.value(), reference.output, 1e-10);
        check_close("inference h_n", r.h_n.value(), reference.h_n, 1e-10);
    });
}
