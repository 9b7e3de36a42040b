// One training step of LeNet-5 on one 1×1×28×28 sample: the loss before, the update of every
// parameter, a fresh forward pass and the loss after, which must be lower (exit status 1 otherwise).
// The sample is the first Fashion-MNIST test image when the data set is installed, else a seeded
// random image.
//
//   lenet_step [--device cpu|cuda] [--data DIR] [--lr X]
#include <dyngrad/dyngrad.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>

#include "../cli/command_line.h"

using namespace dyngrad;

namespace {

// conv 1→6 5×5, ReLU, max-pool 2, conv 6→16 5×5, ReLU, max-pool 2, FC 256→120, ReLU, FC 120→10.
struct LeNet5 : Module {
    Conv2d conv1, conv2;
    Linear fc1, fc2;

    explicit LeNet5(Generator& gen)
        : conv1(1, 6, {5, 5}, {}, true, gen), conv2(6, 16, {5, 5}, {}, true, gen), fc1(16 * 4 * 4, 120, true, gen),
          fc2(120, 10, true, gen) {
        register_module("conv1", conv1);
        register_module("conv2", conv2);
        register_module("fc1", fc1);
        register_module("fc2", fc2);
    }

    // x (N,1,28,28) -> logits (N,10)
    Var operator()(const Var& x) const {
        const Var h1 = max_pool2d(relu(conv1(x)), {2, 2});   // (N,6,12,12)
        const Var h2 = max_pool2d(relu(conv2(h1)), {2, 2});  // (N,16,4,4)
        return fc2(relu(fc1(flatten(h2))));
    }
};

struct Sample {
    Tensor image;  // (1,1,28,28)
    Tensor label;  // (1)
    std::string source;
};

Sample first_sample(const std::string& directory) {
    if (std::filesystem::is_directory(directory)) {
        const MnistData data = load_mnist(directory);
        const Dataset first = data.test.head(1);
        return {first.images, first.labels,
                str("the first test image of ", directory, " (label ", first.labels.at({0}), ")")};
    }
    Generator gen(7);
    return {Tensor::normal({1, 1, 28, 28}, 0.0, 1.0, gen), Tensor::from_vector(std::vector<std::int64_t>{3}, {1}),
            str("a random image (seed 7, label 3): ", directory, " is not installed")};
}

struct Forward {
    Var loss;
    double probability = 0;  // softmax probability of the true class
};

Forward forward(const LeNet5& model, const Tensor& image, const Tensor& label, std::int64_t y, ComputeGraph& graph) {
    const Var logits = model(graph.input(image, "image"));
    const Var loss = cross_entropy(logits, graph.input(label, "label"));
    return {loss, softmax(logits).value().to(Device::cpu()).at({0, y})};
}

double norm(const std::vector<double>& values) {
    double sum = 0;
    for (const double v : values) sum += v * v;
    return std::sqrt(sum);
}

int run(Device device, const std::string& directory, double lr) {
    const Sample sample = first_sample(directory);
    const Tensor image = sample.image.to(device), label = sample.label.to(device);
    std::printf("sample: %s, on %s\n", sample.source.c_str(), device.to_string().c_str());

    Generator gen(0);
    LeNet5 model(gen);
    model.to(device);
    SGD optimizer(model.parameters(), {.lr = lr});

    const auto y = static_cast<std::int64_t>(sample.label.at({0}));
    ComputeGraph graph;
    const Forward before_step = forward(model, image, label, y, graph);
    const double loss_before = before_step.loss.item();
    std::printf("loss before: %.6f   p(label) %.4f\n", loss_before, before_step.probability);

    graph.backward(before_step.loss);
    std::vector<Tensor> before;
    for (const Parameter& p : model.parameters()) before.push_back(p.value().to(Device::cpu()).clone());
    optimizer.step();

    std::printf("SGD step, lr %g:\n  %-14s %-14s %12s %12s %12s\n", lr, "parameter", "shape", "|value|", "|grad|",
                "|change|");
    std::size_t i = 0;
    for (const Parameter& p : model.parameters()) {
        const std::vector<double> old_values = before[i++].to_vector();
        std::vector<double> change = p.value().to_vector();
        for (std::size_t k = 0; k < change.size(); ++k) change[k] -= old_values[k];
        std::printf("  %-14s %-14s %12.6f %12.6f %12.6f\n", p.name().c_str(), to_string(p.value().shape()).c_str(),
                    norm(old_values), norm(p.grad().to_vector()), norm(change));
    }

    ComputeGraph fresh;
    const Forward after = forward(model, image, label, y, fresh);
    const double loss_after = after.loss.item();
    std::printf("loss after:  %.6f   p(label) %.4f\n", loss_after, after.probability);
    if (!(loss_after < loss_before)) {
        std::printf("FAIL: the loss did not decrease\n");
        return 1;
    }
    std::printf("the loss decreased by %.6f\n", loss_before - loss_after);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Device device = Device::cpu();
    std::string directory = kDefaultMnistDirectory;
    double lr = 0.01;
    const char* const usage = "usage: lenet_step [--device cpu|cuda] [--data DIR] [--lr X]\n";
    try {  // every argument is checked before the data is read (command_line.h)
        const cli::Arguments args(argc, argv, {.options = {"--device", "--data", "--lr"}});
        if (args.help()) {
            std::fputs(usage, stdout);
            return 0;
        }
        if (auto v = args.value("--device")) device = cli::parse_device("--device", *v, {"cpu", "cuda"});
        if (auto v = args.value("--lr")) lr = cli::parse_real("--lr", *v, 0, std::numeric_limits<double>::max());
        // Without --data a missing default directory means a random image; a named one must exist.
        if (auto v = args.value("--data")) directory = cli::existing_directory("--data", *v);
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "lenet_step: %s\n%s", e.what(), usage);
        return 2;
    }
    try {
        return run(device, directory, lr);
    } catch (const std::exception& error) {
        std::fprintf(stderr, "lenet_step: error: %s\n", error.what());
        return 1;
    }
}
