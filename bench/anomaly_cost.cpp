// dyngrad-anomaly-cost: what anomaly mode (graph/anomaly.h) costs on one training step of an MLP
// (784-256-128-10, relu, cross_entropy, SGD; float32). Blocks of steps run alternately without and with
// AnomalyModeGuard; the median block of each gives the time per step. Recorded in docs/reliability.md.
//
//   dyngrad-anomaly-cost [--device cpu|cuda:N] [--batch N] [--steps N] [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <dyngrad/dyngrad.h>

#include "../cli/command_line.h"

using namespace dyngrad;

namespace {

struct Options {
    Device device = Device::cpu();
    std::int64_t batch = 64;
    int steps = 20;    // per timed block
    int repeats = 7;   // blocks of each kind
};

// Every argument is checked before the first step (cli/command_line.h).
Options parse(int argc, char** argv) {
    const cli::Arguments args(argc, argv, {.options = {"--device", "--batch", "--steps", "--repeats"}});
    if (args.help()) {
        std::puts("usage: dyngrad-anomaly-cost [--device cpu|cuda:N] [--batch N] [--steps N] [--repeats N]");
        std::exit(0);
    }
    Options o;
    if (auto v = args.value("--device")) o.device = cli::parse_device("--device", *v);
    if (auto v = args.value("--batch")) o.batch = cli::parse_int("--batch", *v, 1, 1 << 24);
    if (auto v = args.value("--steps")) o.steps = static_cast<int>(cli::parse_int("--steps", *v, 1, 1 << 30));
    if (auto v = args.value("--repeats")) o.repeats = static_cast<int>(cli::parse_int("--repeats", *v, 1, 1 << 20));
    return o;
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    return cli::guarded_main("dyngrad-anomaly-cost", [&] {
        const Options o = parse(argc, argv);
        Generator gen(0);
        Sequential model;
        model.add(Linear(784, 256, true, gen)).add([](const Var& h) { return relu(h); });
        model.add(Linear(256, 128, true, gen)).add([](const Var& h) { return relu(h); });
        model.add(Linear(128, 10, true, gen));
        model.to(o.device);
        SGD optimizer(model.parameters(), {.lr = 0.01});
        const Tensor images = Tensor::uniform({o.batch, 784}, 0.0, 1.0, gen, DType::f32, o.device);
        std::vector<std::int64_t> label_values(static_cast<std::size_t>(o.batch));
        for (std::size_t i = 0; i < label_values.size(); ++i) label_values[i] = static_cast<std::int64_t>(i % 10);
        const Tensor labels = Tensor::from_vector(label_values, {o.batch}, o.device);

        const auto step = [&] {
            ComputeGraph graph;
            const Var loss = cross_entropy(model(graph.input(images, "images")), graph.input(labels, "labels"));
            optimizer.zero_grad();
            graph.backward(loss);
            optimizer.step();
        };
        const auto block_ms = [&](bool anomaly) {
            const AnomalyModeGuard guard(anomaly);
            if (o.device.is_cuda()) cuda::synchronize(o.device.index);
            const auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < o.steps; ++i) step();
            if (o.device.is_cuda()) cuda::synchronize(o.device.index);
            const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
            return elapsed.count() / o.steps;
        };

        block_ms(false);  // warm-up: allocations, caches
        block_ms(true);
        std::vector<double> plain, checked;
        for (int r = 0; r < o.repeats; ++r) {
            plain.push_back(block_ms(false));
            checked.push_back(block_ms(true));
        }
        const double off = median(plain), on = median(checked);
        std::printf("MLP 784-256-128-10 float32, batch %lld, %s: %d blocks of %d steps each\n",
                    static_cast<long long>(o.batch), o.device.to_string().c_str(), o.repeats, o.steps);
        std::printf("  anomaly mode off: %8.3f ms/step\n", off);
        std::printf("  anomaly mode on:  %8.3f ms/step  (x%.2f, +%.0f%%)\n", on, on / off, 100.0 * (on / off - 1.0));
        return 0;
    }, " (--help shows the usage)");
}
