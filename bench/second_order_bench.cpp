// dyngrad-second-order-bench: the second-order workloads of issue 31, timed the way bench/torch_second_order.py
// times PyTorch's (scripts/run-second-order-bench.sh runs both in one command and writes the report):
//   hvp_mlp     a Hessian-vector product of an MLP's loss with respect to all its weights: 4 layers of width W
//               (W→W tanh, three times, then W→10), batch B, cross-entropy; the double-backward recipe
//               (grad with create_graph, then the gradient of <g, v>), as torch.autograd.grad twice.
//   hvp_mlp_api the same through dyngrad::hvp (graph/functional_ad.h), which records f on fresh leaves.
//   pinn_step   one training step of the 1-D Poisson PINN of samples/pinn_poisson.cpp at bench size: u(x) an MLP
//               1→H→H→H→1 (tanh) on N collocation points; u' and u'' by grad with create_graph, the residual
//               loss plus the boundary term, backward through both derivatives, one Adam step.
// Float32, TF32 off on both sides. Timing: W warm-up iterations, then R repetitions of K iterations each (K sized
// by a probe so that a repetition lasts ≥ 20 ms), each repetition timed on the host clock from a synchronised
// device to the end of a device synchronisation; the figure is the median over repetitions of ms per iteration.
// Before timing, hvp_mlp and hvp_mlp_api are checked against each other (same H·v), and H·v against a central
// finite difference of the gradient along v in float64 on the CPU at a small size (the bench's own sanity check).
//
//   dyngrad-second-order-bench [--device cuda|cpu] [--width 1024] [--batch 256] [--points 4096] [--hidden 128]
//                              [--repetitions 7] [--json FILE] [--quick]
#include <dyngrad/dyngrad.h>

#include "../cli/command_line.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

using namespace dyngrad;

namespace {

struct Options {
    Device device = Device::cuda();
    std::int64_t width = 1024, batch = 256, points = 4096, hidden = 128;
    int repetitions = 7;
    bool quick = false;
    std::string json;
};

void settle(const Device& device) {
    if (device.is_cuda()) cuda::synchronize(device.index);
}

struct Timing {
    double ms = 0;  // median over repetitions of ms per iteration
    int iterations = 0;
    std::vector<double> samples_ms;
};

Timing time_it(const std::function<void()>& body, const Options& o) {
    const int warmups = o.quick ? 2 : 5;
    for (int i = 0; i < warmups; ++i) body();
    settle(o.device);
    const auto ms_of = [&](int k) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < k; ++i) body();
        settle(o.device);
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    const double probe = ms_of(3) / 3;
    Timing t;
    t.iterations = std::clamp(static_cast<int>(std::ceil(20.0 / std::max(probe, 1e-3))), 3, o.quick ? 5 : 100);
    for (int r = 0; r < o.repetitions; ++r) t.samples_ms.push_back(ms_of(t.iterations) / t.iterations);
    std::vector<double> sorted = t.samples_ms;
    std::sort(sorted.begin(), sorted.end());
    t.ms = sorted[sorted.size() / 2];
    return t;
}

// ---- hvp_mlp ----

struct MlpProblem {
    std::vector<Tensor> weights;  // w1, b1, ..., w4, b4 (PyTorch's Linear layout: (out, in))
    std::vector<Tensor> direction;  // v, one per weight
    Tensor x, labels;
};

MlpProblem make_mlp(std::int64_t width, std::int64_t batch, DType dtype, Device device, std::uint64_t seed) {
    Generator gen(seed);
    MlpProblem p;
    const std::int64_t classes = 10;
    const std::int64_t outs[4] = {width, width, width, classes};
    for (const std::int64_t out : outs) {
        const double bound = 1.0 / std::sqrt(static_cast<double>(width));
        p.weights.push_back(Tensor::uniform({out, width}, -bound, bound, gen, dtype, device));
        p.weights.push_back(Tensor::uniform({out}, -bound, bound, gen, dtype, device));
    }
    for (const Tensor& w : p.weights) p.direction.push_back(Tensor::normal(w.shape(), 0, 1, gen, dtype, device));
    p.x = Tensor::normal({batch, width}, 0, 1, gen, dtype, device);
    std::vector<std::int64_t> labels;
    for (std::int64_t i = 0; i < batch; ++i) labels.push_back((i * 7 + 3) % classes);
    p.labels = Tensor::from_vector(labels, {batch}, device);
    return p;
}

Var mlp_loss(ComputeGraph& graph, std::span<const Var> w, const MlpProblem& p) {
    Var h = graph.constant(p.x);
    for (std::size_t layer = 0; layer < 3; ++layer) h = tanh(linear(h, w[2 * layer], w[2 * layer + 1]));
    return cross_entropy(linear(h, w[6], w[7]), graph.constant(p.labels));
}

// H·v by double backward: g = ∂L/∂w with create_graph, then ∂<g, v>/∂w.
std::vector<Tensor> hvp_double_backward(const MlpProblem& p) {
    ComputeGraph graph;
    std::vector<Var> w;
    for (const Tensor& t : p.weights) w.push_back(graph.input(t, "", true));
    const Var loss = mlp_loss(graph, w, p);
    const std::vector<Var> g = grad(std::span<const Var>(&loss, 1), w, {}, {.create_graph = true});
    Var dot;
    for (std::size_t i = 0; i < g.size(); ++i) {
        const Var term = sum(mul(g[i], graph.constant(p.direction[i])));
        dot = i == 0 ? term : dot + term;
    }
    std::vector<Tensor> hv;
    for (const Var& d : grad(std::span<const Var>(&dot, 1), w)) hv.push_back(d.value());
    return hv;
}

std::vector<Tensor> hvp_api(const MlpProblem& p) {
    const AdFunction f = [&p](std::span<const Var> w) { return mlp_loss(w[0].graph(), w, p); };
    return hvp(f, p.weights, p.direction).hvp;
}

double max_relative(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const std::vector<double> x = a[i].to_vector(), y = b[i].to_vector();
        for (std::size_t k = 0; k < x.size(); ++k) {
            worst = std::max(worst, std::abs(x[k] - y[k]));
            scale = std::max(scale, std::abs(y[k]));
        }
    }
    return worst / std::max(scale, 1e-30);
}

// The bench's own check, before any timing: H·v against (∇L(w + εv) − ∇L(w − εv)) / 2ε in float64 on the CPU
// (width 16, batch 8), and the two dyngrad recipes against each other on the bench's device and size.
void check_hvp(const Options& o) {
    const MlpProblem small = make_mlp(16, 8, DType::f64, Device::cpu(), 3);
    const std::vector<Tensor> hv = hvp_double_backward(small);
    const double eps = 1e-5;
    std::vector<Tensor> fd;
    {
        const auto gradient_at = [&](double sign) {
            MlpProblem shifted = small;
            for (std::size_t i = 0; i < shifted.weights.size(); ++i) {
                std::vector<double> w = small.weights[i].to_vector(), v = small.direction[i].to_vector();
                for (std::size_t k = 0; k < w.size(); ++k) w[k] += sign * eps * v[k];
                shifted.weights[i] = Tensor::from_vector(w, small.weights[i].shape(), DType::f64);
            }
            ComputeGraph graph;
            std::vector<Var> w;
            for (const Tensor& t : shifted.weights) w.push_back(graph.input(t, "", true));
            const Var loss = mlp_loss(graph, w, shifted);
            std::vector<Tensor> g;
            for (const Var& d : grad(std::span<const Var>(&loss, 1), w)) g.push_back(d.value());
            return g;
        };
        const std::vector<Tensor> plus = gradient_at(1), minus = gradient_at(-1);
        for (std::size_t i = 0; i < plus.size(); ++i) {
            std::vector<double> a = plus[i].to_vector(), b = minus[i].to_vector();
            for (std::size_t k = 0; k < a.size(); ++k) a[k] = (a[k] - b[k]) / (2 * eps);
            fd.push_back(Tensor::from_vector(a, plus[i].shape(), DType::f64));
        }
    }
    const double fd_error = max_relative(hv, fd);
    std::printf("check: H·v against finite differences of the gradient (f64, CPU, width 16): %.2e\n", fd_error);
    if (fd_error > 1e-6) throw ValueError(str("H·v disagrees with finite differences: ", fd_error));
    const MlpProblem big = make_mlp(o.width, o.batch, DType::f32, o.device, 5);
    const double recipes = max_relative(hvp_double_backward(big), hvp_api(big));
    std::printf("check: double backward against dyngrad::hvp on %s (f32): %.2e\n", o.device.to_string().c_str(), recipes);
    if (recipes > 1e-4) throw ValueError(str("the two H·v recipes disagree: ", recipes));
}

// ---- pinn_step ----

struct Pinn : Module {
    Linear fc1, fc2, fc3, fc4;
    Pinn(std::int64_t hidden, Generator&& gen)
        : fc1(1, hidden, true, gen), fc2(hidden, hidden, true, gen), fc3(hidden, hidden, true, gen), fc4(hidden, 1, true, gen) {
        register_module("fc1", fc1);
        register_module("fc2", fc2);
        register_module("fc3", fc3);
        register_module("fc4", fc4);
    }
    Var operator()(const Var& x) const { return fc4(tanh(fc3(tanh(fc2(tanh(fc1(x))))))); }
};

struct PinnRun {
    Pinn model;
    Adam optimizer;
    Tensor x_inner, f_inner, x_boundary;
    double last_loss = 0;

    PinnRun(const Options& o)
        : model(o.hidden, Generator(7)), optimizer((model.to(o.device), model.parameters()), {.lr = 1e-3}) {
        const double pi = std::numbers::pi;
        std::vector<double> xs, fs;
        for (std::int64_t i = 0; i < o.points; ++i) {
            const double x = 0.02 + 0.96 * static_cast<double>(i) / static_cast<double>(o.points - 1);
            xs.push_back(x);
            fs.push_back(-pi * pi * std::sin(pi * x));
        }
        x_inner = Tensor::from_vector(xs, {o.points, 1}, DType::f32).to(o.device);
        f_inner = Tensor::from_vector(fs, {o.points, 1}, DType::f32).to(o.device);
        x_boundary = Tensor::from_vector(std::vector<double>{0.0, 1.0}, {2, 1}, DType::f32).to(o.device);
    }

    void step(bool read_loss) {
        ComputeGraph graph;
        const Var x = graph.input(x_inner, "x", true);
        const Var u = model(x);
        const Var du = grad({sum(u)}, {x}, {}, {.create_graph = true})[0];
        const Var d2u = grad({sum(du)}, {x}, {}, {.create_graph = true})[0];
        const Var residual = d2u - graph.constant(f_inner);
        const Var boundary = model(graph.input(x_boundary));
        const Var loss = mean(mul(residual, residual)) + mul_scalar(mean(mul(boundary, boundary)), 100.0);
        optimizer.zero_grad();
        graph.backward(loss);
        optimizer.step();
        if (read_loss) last_loss = loss.item();
    }
};

struct Row {
    std::string workload, description;
    Timing timing;
    double check = 0;
};

void write_json(const std::string& path, const Options& o, const std::vector<Row>& rows) {
    std::ofstream out(path);
    if (!out) throw IoError(str("--json: cannot write '", path, "'"));
    out.precision(9);
    out << "{\n  \"tool\": \"dyngrad-second-order-bench\",\n  \"device\": \""
        << (o.device.is_cuda() ? cuda::device_name(o.device.index) : std::string("cpu")) << "\",\n"
        << "  \"settings\": {\"width\": " << o.width << ", \"batch\": " << o.batch << ", \"points\": " << o.points
        << ", \"hidden\": " << o.hidden << ", \"repetitions\": " << o.repetitions << "},\n  \"rows\": [";
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        out << (i ? "," : "") << "\n    {\"workload\": \"" << r.workload << "\", \"description\": \"" << r.description
            << "\", \"ms\": " << r.timing.ms << ", \"iterations_per_repetition\": " << r.timing.iterations
            << ", \"samples_ms\": [";
        for (std::size_t k = 0; k < r.timing.samples_ms.size(); ++k) out << (k ? ", " : "") << r.timing.samples_ms[k];
        out << "]}";
    }
    out << "\n  ]\n}\n";
}

constexpr const char* kUsage =
    "usage: dyngrad-second-order-bench [--device cuda|cpu] [--width W] [--batch B] [--points N] [--hidden H]\n"
    "                                  [--repetitions R] [--json FILE] [--quick]\n";

}  // namespace

int main(int argc, char** argv) {
    Options o;
    try {
        const cli::Arguments args(argc, argv, {.flags = {"--quick"},
                                               .options = {"--device", "--width", "--batch", "--points", "--hidden",
                                                           "--repetitions", "--json"}});
        if (auto v = args.value("--device")) o.device = cli::parse_device("--device", *v);
        if (auto v = args.value("--width")) o.width = cli::parse_int("--width", *v, 2, 1 << 16);
        if (auto v = args.value("--batch")) o.batch = cli::parse_int("--batch", *v, 1, 1 << 20);
        if (auto v = args.value("--points")) o.points = cli::parse_int("--points", *v, 2, 1 << 24);
        if (auto v = args.value("--hidden")) o.hidden = cli::parse_int("--hidden", *v, 1, 1 << 16);
        if (auto v = args.value("--repetitions")) o.repetitions = static_cast<int>(cli::parse_int("--repetitions", *v, 1, 1000));
        if (auto v = args.value("--json")) o.json = cli::output_file("--json", *v);
        o.quick = args.has("--quick");
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "dyngrad-second-order-bench: %s\n%s", e.what(), kUsage);
        return 2;
    }
    try {
        if (o.device.is_cuda()) {
            cuda::set_allow_tf32(false);
            std::printf("device: %s\n", cuda::device_name(o.device.index).c_str());
        }
        check_hvp(o);
        std::vector<Row> rows;
        const MlpProblem p = make_mlp(o.width, o.batch, DType::f32, o.device, 11);
        const std::string mlp = str("MLP ", o.width, "x4 (tanh), batch ", o.batch, ", cross-entropy, f32");
        rows.push_back({"hvp_mlp", "H·v by double backward, " + mlp, time_it([&] { hvp_double_backward(p); }, o)});
        rows.push_back({"hvp_mlp_api", "dyngrad::hvp, " + mlp, time_it([&] { hvp_api(p); }, o)});
        PinnRun pinn(o);
        rows.push_back({"pinn_step",
                        str("1-D Poisson PINN step: MLP 1-", o.hidden, "-", o.hidden, "-", o.hidden, "-1 (tanh), ",
                            o.points, " points, u'' by two create_graph grads, Adam"),
                        time_it([&] { pinn.step(false); }, o)});
        pinn.step(true);
        std::printf("pinn loss after the timed steps: %.6g\n", pinn.last_loss);
        if (!std::isfinite(pinn.last_loss)) throw ValueError("the PINN's loss is not finite");
        for (const Row& r : rows) std::printf("%-12s %10.4f ms  (%s)\n", r.workload.c_str(), r.timing.ms, r.description.c_str());
        if (!o.json.empty()) write_json(o.json, o, rows);
    } catch (const Error& e) {
        std::fprintf(stderr, "dyngrad-second-order-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
