// dyngrad-rnn-bench: an LSTM forward + backward on the GPU, two ways, side by side with PyTorch's
// nn.LSTM (bench/torch_lstm.py, run by scripts/run-rnn-bench.sh):
//   (a) `lstm`: one recorded node, cuDNN's persistent RNN kernels (ops/rnn.cu);
//   (b) the same LSTM composed from dyngrad's own ops, recorded in the graph: per layer one GEMM for the
//       input projections of all time steps, then per step a recurrent GEMM (linear), the gate slices
//       (narrow) and the elementwise gate arithmetic; the layer's outputs joined with concat.
// Both read the same flat weight (ops/rnn.h layout), so before timing the bench checks (b) against (a) on
// the GPU: outputs and the gradients of the input and of the weight.
//
// Default workload (the seeds'): sequence 512, 4 layers, hidden 512, input 512, batch 32..256 step 32,
// float32 (TF32 off). GFLOP/s counts the gate GEMMs only: 2·4H·(in + H) per sequence, step and layer
// forward, times 3 for forward + backward (backward data + backward weights).
//
// Usage: dyngrad-rnn-bench [--batches 32,64,...] [--seq T] [--layers L] [--hidden H] [--input I]
//                          [--repetitions R] [--tf32] [--skip-composed] [--json FILE]
#include <dyngrad/dyngrad.h>

#include "../cli/command_line.h"
#include "../cli/timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

using namespace dyngrad;

namespace {

struct Options {
    std::vector<std::int64_t> batches{32, 64, 96, 128, 160, 192, 224, 256};
    std::int64_t seq = 512, layers = 4, hidden = 512, input = 512;
    int repetitions = 5;
    bool tf32 = false;
    bool composed = true;
    std::string json;
};

// Every argument is checked before anything runs (cli/command_line.h).
Options parse(int argc, char** argv) {
    const cli::Arguments args(argc, argv,
                              {.flags = {"--tf32", "--skip-composed"},
                               .options = {"--batches", "--seq", "--layers", "--hidden", "--input", "--repetitions",
                                           "--json"}});
    if (args.help()) {
        std::puts("usage: dyngrad-rnn-bench [--batches 32,64,...] [--seq T] [--layers L] [--hidden H] [--input I]\n"
                  "                         [--repetitions R] [--tf32] [--skip-composed] [--json FILE]");
        std::exit(0);
    }
    Options o;
    if (auto v = args.value("--batches")) o.batches = cli::parse_int_list("--batches", *v, 1, 1 << 20);
    if (auto v = args.value("--seq")) o.seq = cli::parse_int("--seq", *v, 1, 1 << 20);
    if (auto v = args.value("--layers")) o.layers = cli::parse_int("--layers", *v, 1, 1024);
    if (auto v = args.value("--hidden")) o.hidden = cli::parse_int("--hidden", *v, 1, 1 << 20);
    if (auto v = args.value("--input")) o.input = cli::parse_int("--input", *v, 1, 1 << 20);
    if (auto v = args.value("--repetitions")) o.repetitions = static_cast<int>(cli::parse_int("--repetitions", *v, 1, 1 << 20));
    o.tf32 = args.has("--tf32");
    o.composed = !args.has("--skip-composed");
    if (auto v = args.value("--json")) o.json = cli::output_file("--json", *v);
    return o;
}

double lstm_gflop(const Options& o, std::int64_t batch) {
    double forward = 0;
    for (std::int64_t l = 0; l < o.layers; ++l) {
        const double in = l == 0 ? double(o.input) : double(o.hidden);
        forward += 2.0 * double(o.seq) * double(batch) * 4.0 * double(o.hidden) * (in + double(o.hidden));
    }
    return 3.0 * forward / 1e9;
}

Var weight_block(const Var& w, const RnnWeightEntry& entry) {
    return reshape(narrow(w, 0, entry.offset, numel(entry.shape)), entry.shape);
}

// (b): the LSTM of ops/rnn.h from dyngrad's own ops, reading the blocks of the same flat weight.
Var composed_lstm(const Var& x, const Var& w, const Options& o, std::int64_t batch) {
    const std::int64_t H = o.hidden, N = batch, T = o.seq;
    const std::vector<RnnWeightEntry> layout = rnn_weight_layout(RnnMode::Lstm, {H, o.layers, false}, o.input);
    auto block = [&](std::int64_t layer, const std::string& kind) {
        const std::string name = str("l", layer, ".fwd.", kind);
        // The layout lists one block per gate; the four gate blocks of a matrix are adjacent (i, f, g, o).
        const auto first = std::find_if(layout.begin(), layout.end(),
                                        [&](const RnnWeightEntry& e) { return e.name.rfind(name, 0) == 0; });
        if (first == layout.end()) throw ValueError(str("no weight block ", name));
        Shape shape = first->shape;
        shape[0] *= 4;
        return weight_block(w, {name, first->offset, shape});
    };
    ComputeGraph& graph = x.graph();
    Var layer_input = reshape(x, {T * N, o.input});
    for (std::int64_t l = 0; l < o.layers; ++l) {
        const Var input_gates = linear(layer_input, block(l, "W_ih"), block(l, "b_ih"));  // (T·N, 4H)
        const Var w_hh = block(l, "W_hh"), b_hh = block(l, "b_hh");
        Var h = graph.constant(Tensor::zeros({N, H}, x.dtype(), x.device()));
        Var c = graph.constant(Tensor::zeros({N, H}, x.dtype(), x.device()));
        std::vector<Var> outputs;
        outputs.reserve(static_cast<std::size_t>(T));
        for (std::int64_t t = 0; t < T; ++t) {
            const Var gates = add(narrow(input_gates, 0, t * N, N), linear(h, w_hh, b_hh));  // (N, 4H)
            const Var i = sigmoid(narrow(gates, 1, 0, H));
            const Var f = sigmoid(narrow(gates, 1, H, H));
            const Var g = tanh(narrow(gates, 1, 2 * H, H));
            const Var out_gate = sigmoid(narrow(gates, 1, 3 * H, H));
            c = add(mul(f, c), mul(i, g));
            h = mul(out_gate, tanh(c));
            outputs.push_back(h);
        }
        layer_input = concat(outputs, 0);  // (T·N, H)
    }
    return reshape(layer_input, {T, N, H});
}

double max_relative_difference(const Tensor& a, const Tensor& b) {
    const std::vector<double> va = a.to_vector(), vb = b.to_vector();
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < va.size(); ++i) {
        diff = std::max(diff, std::abs(va[i] - vb[i]));
        scale = std::max(scale, std::abs(vb[i]));
    }
    return diff / std::max(scale, 1e-30);
}

// Checks (b) against (a) on a small problem; returns the largest relative difference seen.
double check_composed(const Options& o) {
    Options small = o;
    small.seq = 7;
    small.layers = std::min<std::int64_t>(o.layers, 2);
    const std::int64_t batch = 3;
    const Device gpu = Device::cuda(0);
    Generator gen(7);
    const RnnOptions ro{small.hidden, small.layers, false};
    const Tensor x = Tensor::normal({small.seq, batch, small.input}, 0, 1, gen).to(gpu);
    const Tensor dy = Tensor::normal({small.seq, batch, small.hidden}, 0, 1, gen).to(gpu);
    const double bound = 1.0 / std::sqrt(double(small.hidden));
    const Tensor w = Tensor::uniform({rnn_weight_size(RnnMode::Lstm, ro, small.input)}, -bound, bound, gen).to(gpu);
    double worst = 0;
    Tensor y_ref, dx_ref, dw_ref;
    for (const bool composed : {false, true}) {
        ComputeGraph graph;
        const Var vx = graph.input(x, "x", true), vw = graph.input(w, "w", true);
        const Var y = composed ? composed_lstm(vx, vw, small, batch) : lstm(vx, vw, ro).output;
        graph.backward(y, dy);
        if (!composed) {
            y_ref = y.value().clone(), dx_ref = vx.grad().clone(), dw_ref = vw.grad().clone();
            continue;
        }
        worst = std::max({max_relative_difference(y.value(), y_ref), max_relative_difference(vx.grad(), dx_ref),
                          max_relative_difference(vw.grad(), dw_ref)});
    }
    return worst;
}

struct Row {
    std::int64_t batch;
    double cudnn_ms, composed_ms, gflop;
};

Row measure(const Options& o, std::int64_t batch) {
    const Device gpu = Device::cuda(0);
    Generator gen(static_cast<std::uint64_t>(batch));
    const RnnOptions ro{o.hidden, o.layers, false};
    const Tensor x = Tensor::normal({o.seq, batch, o.input}, 0, 1, gen).to(gpu);
    const Tensor dy = Tensor::normal({o.seq, batch, o.hidden}, 0, 1, gen).to(gpu);
    const double bound = 1.0 / std::sqrt(double(o.hidden));
    const Tensor w = Tensor::uniform({rnn_weight_size(RnnMode::Lstm, ro, o.input)}, -bound, bound, gen).to(gpu);
    auto step = [&](bool composed) {
        ComputeGraph graph;
        const Var vx = graph.input(x, "x", true), vw = graph.input(w, "w", true);
        const Var y = composed ? composed_lstm(vx, vw, o, batch) : lstm(vx, vw, ro).output;
        graph.backward(y, dy);
    };
    Row row{batch, 0, 0, lstm_gflop(o, batch)};
    row.cudnn_ms = cli::median_ms([&] { step(false); }, 1, o.repetitions);
    if (o.composed) row.composed_ms = cli::median_ms([&] { step(true); }, 1, std::max(3, o.repetitions / 2));
    return row;
}

}  // namespace

int main(int argc, char** argv) {
    return cli::guarded_main("dyngrad-rnn-bench", [&] {
        const Options o = parse(argc, argv);
        if (cli::no_cuda_device("dyngrad-rnn-bench")) return 77;
        cuda::set_allow_tf32(o.tf32);
        std::printf("device: %s\nLSTM: sequence %lld, %lld layers, hidden %lld, input %lld, float32%s\n",
                    cuda::device_name(0).c_str(), (long long)o.seq, (long long)o.layers, (long long)o.hidden,
                    (long long)o.input, o.tf32 ? " (TF32 allowed)" : " (TF32 off)");
        double check = 0;
        if (o.composed) {
            check = check_composed(o);
            std::printf("composed vs cudnn lstm (T=7, N=3): max relative difference %.2e over output, dx, dw\n",
                        check);
            if (!(check < 1e-4)) throw NumericalError("the composed LSTM disagrees with the cuDNN-backed lstm");
        }
        std::printf("%6s %14s %10s %14s %10s %12s\n", "batch", "(a) lstm ms", "GFLOP/s", "(b) composed ms", "GFLOP/s",
                    "(a)/(b) time");
        std::vector<Row> rows;
        for (const std::int64_t batch : o.batches) {
            const Row row = measure(o, batch);
            rows.push_back(row);
            std::printf("%6lld %14.3f %10.1f %14.3f %10.1f %12.3f\n", (long long)row.batch, row.cudnn_ms,
                        row.gflop / (row.cudnn_ms * 1e-3), row.composed_ms,
                        o.composed ? row.gflop / (row.composed_ms * 1e-3) : 0.0,
                        o.composed ? row.cudnn_ms / row.composed_ms : 0.0);
            std::fflush(stdout);
        }
        if (!o.json.empty()) {
            std::ofstream out(o.json);
            out << "{\"device\": \"" << cuda::device_name(0) << "\", \"seq\": " << o.seq << ", \"layers\": " << o.layers
                << ", \"hidden\": " << o.hidden << ", \"input\": " << o.input
                << ", \"tf32\": " << (o.tf32 ? "true" : "false") << ", \"composed_check\": " << check << ", \"rows\": [";
            for (std::size_t i = 0; i < rows.size(); ++i)
                out << (i ? ", " : "") << "{\"batch\": " << rows[i].batch << ", \"cudnn_ms\": " << rows[i].cudnn_ms
                    << ", \"composed_ms\": " << rows[i].composed_ms << ", \"gflop\": " << rows[i].gflop << "}";
            out << "]}\n";
        }
        return 0;
    }, "", 2);
}
