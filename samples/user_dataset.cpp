// A user data set for regression, batched by DataLoader (nn/dataset.h) with a background prefetch thread:
// an MLP learns y = x0·x1 + 0.5·x2 with Adam, a StepLR schedule and gradient clipping, saves a
// checkpoint half way and resumes from it in a fresh model, optimizer and schedule (nn/optim.h).
//   user_dataset [--device cpu|cuda]
// Prints the mean training loss per epoch; exits 1 unless the last is below a fifth of the first.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "../cli/command_line.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

// The data set: sample i is a point x in [-1, 1]³ drawn from a generator seeded with i, and its target.
// get() runs on the loader's worker thread: it only reads its own constant state.
class Points : public SampleDataset {
public:
    explicit Points(std::int64_t n) : n_(n) {}
    std::int64_t size() const override { return n_; }
    std::vector<Tensor> get(std::int64_t i) const override {
        Generator gen(static_cast<std::uint64_t>(i));
        const Tensor x = Tensor::uniform({3}, -1, 1, gen);
        const double y = x.at({0}) * x.at({1}) + 0.5 * x.at({2});
        return {x, Tensor::full({1}, y)};
    }

private:
    std::int64_t n_;
};

struct Mlp : Module {
    Linear fc1, fc2;
    explicit Mlp(Generator&& gen) : fc1(3, 32, true, gen, Activation::Relu), fc2(32, 1, true, gen) {
        register_module("fc1", fc1);
        register_module("fc2", fc2);
    }
    Var operator()(const Var& x) const { return fc2(fc1(x)); }
};

struct Run {
    Mlp model;
    Adam optimizer;
    StepLR schedule;
    explicit Run(std::uint64_t seed)
        : model(Generator(seed)), optimizer(model.parameters(), {.lr = 0.01}), schedule(optimizer, 4, 0.5) {}
};

// One epoch; returns the mean loss.
double train_epoch(Run& run, DataLoader& loader, std::int64_t epoch) {
    loader.start_epoch(epoch);
    std::vector<Tensor> batch;
    double total = 0;
    std::int64_t steps = 0;
    while (loader.next(batch)) {
        ComputeGraph graph;
        Var loss = mse_loss(run.model(graph.input(batch[0])), graph.input(batch[1]));
        run.optimizer.zero_grad();
        graph.backward(loss);
        clip_grad_norm(run.model.parameters(), 1.0);
        run.optimizer.step();
        total += loss.item();  // a host sync per step; fine for a demo
        ++steps;
    }
    run.schedule.step();
    return total / static_cast<double>(steps);
}

int main(int argc, char** argv) {
    Device device = Device::cpu();
    const char* const usage = "usage: user_dataset [--device cpu|cuda]\n";
    try {
        const cli::Arguments args(argc, argv, {.options = {"--device"}});
        if (args.help()) {
            std::fputs(usage, stdout);
            return 0;
        }
        if (auto v = args.value("--device")) device = cli::parse_device("--device", *v, {"cpu", "cuda"});
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "user_dataset: %s\n%s", e.what(), usage);
        return 2;
    }
    try {
        auto data = std::make_shared<Points>(2048);
        DataLoader loader(data, {.batch_size = 64, .shuffle = true, .seed = 7, .prefetch = 2, .device = device});
        const std::filesystem::path checkpoint =
            std::filesystem::temp_directory_path() / ("user_dataset_" + std::to_string(::getpid()) + ".safetensors");

        Run first(1);
        first.model.to(device);
        double initial = 0, last = 0;
        constexpr std::int64_t kEpochs = 12;
        for (std::int64_t epoch = 0; epoch < kEpochs / 2; ++epoch) {
            last = train_epoch(first, loader, epoch);
            if (epoch == 0) initial = last;
            std::printf("epoch %lld loss %.5f lr %.5f\n", static_cast<long long>(epoch), last, first.optimizer.lr());
        }
        save_checkpoint(checkpoint, first.model, first.optimizer, &first.schedule);

        Run resumed(2);  // fresh weights, overwritten by the checkpoint
        resumed.model.to(device);
        load_checkpoint(checkpoint, resumed.model, resumed.optimizer, &resumed.schedule);
        std::filesystem::remove(checkpoint);
        std::printf("resumed at epoch %lld\n", static_cast<long long>(resumed.schedule.epoch()));
        for (std::int64_t epoch = kEpochs / 2; epoch < kEpochs; ++epoch) {
            last = train_epoch(resumed, loader, epoch);
            std::printf("epoch %lld loss %.5f lr %.5f\n", static_cast<long long>(epoch), last, resumed.optimizer.lr());
        }
        if (!(last < initial / 5)) {
            std::printf("FAILED: the loss fell from %.5f to %.5f only\n", initial, last);
            return 1;
        }
        std::printf("ok: loss %.5f -> %.5f\n", initial, last);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "user_dataset: %s\n", e.what());
        return 1;
    }
}
