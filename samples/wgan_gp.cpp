// A WGAN-GP critic on Fashion-MNIST (Gulrajani et al. 2017): a generator and a critic trained with the
// Wasserstein loss plus the gradient penalty λ·E[(‖∇x̂ D(x̂)‖ − 1)²] at random interpolates x̂ of real and generated
// images. The penalty's gradient with respect to the critic's weights is a second-order gradient: ∇x̂ D comes from
// grad with create_graph (graph/higher_order.h) and the critic's loss is back-propagated through it.
//
// Prints, per generator step, the critic's Wasserstein estimate E[D(real)] − E[D(fake)] and the mean deviation
// |‖∇x̂ D‖ − 1| of the critic's input-gradient norm. --check-penalty also trains the same models from the same
// initialisation and batches with λ = 0 and exits 1 unless the penalty kept the norm closer to 1 (CTest's check
// that the penalty's gradient reaches the critic).
//
// --device cuda trains the same float32 models on the GPU: the weights and the training images live there; the
// batches' positions, the noise and the interpolation weights are drawn on the CPU (the same draws as a CPU run)
// and copied over. Without a usable CUDA device it fails with the library's DeviceError (exit 1);
// --skip-without-cuda makes that exit 77 instead, CTest's "skipped".
//
//   wgan_gp [--device cpu|cuda] [--data DIR] [--steps N] [--critic-iters K] [--batch B] [--lambda L] [--lr LR]
//           [--seed S] [--check-penalty] [--skip-without-cuda]
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../cli/command_line.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

constexpr std::int64_t kPixels = 28 * 28;
constexpr std::int64_t kNoise = 32;

struct Critic : Module {
    Linear fc1, fc2;
    explicit Critic(Generator& gen) : fc1(kPixels, 128, true, gen), fc2(128, 1, true, gen) {
        register_module("fc1", fc1);
        register_module("fc2", fc2);
    }
    Var operator()(const Var& x) const { return fc2(leaky_relu(fc1(x), 0.2)); }  // (B,784) -> (B,1)
};

struct GeneratorNet : Module {
    Linear fc1, fc2;
    explicit GeneratorNet(Generator& gen) : fc1(kNoise, 128, true, gen), fc2(128, kPixels, true, gen) {
        register_module("fc1", fc1);
        register_module("fc2", fc2);
    }
    Var operator()(const Var& z) const { return tanh(fc2(relu(fc1(z)))); }  // (B,32) -> (B,784) in (-1, 1)
};

struct Options {
    Device device = Device::cpu();
    std::string data = kDefaultMnistDirectory;
    std::int64_t steps = 200, critic_iters = 5, batch = 64;
    double lambda = 10.0, lr = 1e-4;
    std::uint64_t seed = 0;
    bool check_penalty = false;
    bool skip_without_cuda = false;
};

// The gradient penalty's statistics of one critic step.
struct CriticStep {
    double wasserstein = 0;  // E[D(real)] - E[D(fake)]
    double deviation = 0;    // mean over the batch of |‖∇x̂ D(x̂)‖ − 1|
};

// Trains with `lambda` on o.device, where `real_images` are; returns the mean deviation over the first and the
// last `window` critic steps.
std::pair<double, double> train(const Options& o, double lambda, const Tensor& real_images, bool verbose) {
    Generator init(o.seed);
    Critic critic(init);
    GeneratorNet generator(init);
    critic.to(o.device);  // before the optimizers, which hold the parameters' tensors
    generator.to(o.device);
    Adam critic_optimizer(critic.parameters(), {.lr = o.lr, .beta1 = 0.5, .beta2 = 0.9});
    Adam generator_optimizer(generator.parameters(), {.lr = o.lr, .beta1 = 0.5, .beta2 = 0.9});
    Generator draws(o.seed + 1);  // batches, noise and interpolation weights: the same for every lambda
    const std::int64_t n = real_images.size(0);
    const std::int64_t window = std::max<std::int64_t>(1, o.steps * o.critic_iters / 5);
    std::vector<double> deviations;
    const auto noise = [&] { return Tensor::normal({o.batch, kNoise}, 0, 1, draws).to(o.device); };

    for (std::int64_t step = 0; step < o.steps; ++step) {
        CriticStep last;
        for (std::int64_t k = 0; k < o.critic_iters; ++k) {
            const auto start = static_cast<std::int64_t>(Tensor::uniform({1}, 0, 1, draws, DType::f64).item() *
                                                         static_cast<double>(n - o.batch));
            ComputeGraph graph;
            const Var real = graph.constant(real_images.narrow(0, start, o.batch));
            Var fake;
            {
                const NoGradGuard no_grad;  // the critic's step does not train the generator
                fake = graph.constant(generator(graph.constant(noise())).value());
            }
            const Var eps = graph.constant(Tensor::uniform({o.batch, 1}, 0, 1, draws).to(o.device));
            const Var mixed = graph.input((eps * real + ((-eps) + 1.0) * fake).value(), "x_hat", true);
            const Var gradient = grad({sum(critic(mixed))}, {mixed}, {}, {.create_graph = true})[0];
            const Var norm = sqrt(sum(gradient * gradient, {1}) + 1e-12);
            const Var penalty = mean((norm - 1.0) * (norm - 1.0));
            const Var wasserstein = mean(critic(real)) - mean(critic(fake));
            const Var loss = lambda * penalty - wasserstein;
            critic_optimizer.zero_grad();
            graph.backward(loss);
            critic_optimizer.step();
            double deviation = 0;
            for (double v : norm.value().to_vector()) deviation += std::abs(v - 1.0);
            last = {wasserstein.item(), deviation / static_cast<double>(o.batch)};
            deviations.push_back(last.deviation);
        }
        ComputeGraph graph;
        const Var fake = generator(graph.constant(noise()));
        const Var generator_loss = -mean(critic(fake));
        generator_optimizer.zero_grad();
        critic_optimizer.zero_grad();
        graph.backward(generator_loss);
        generator_optimizer.step();
        if (verbose && (step % 20 == 0 || step + 1 == o.steps))
            std::printf("step %4lld  wasserstein %.4f  |grad norm - 1| %.4f\n", static_cast<long long>(step),
                        last.wasserstein, last.deviation);
    }
    const auto mean_of = [&](std::size_t from) {
        double s = 0;
        for (std::size_t i = from; i < from + static_cast<std::size_t>(window); ++i) s += deviations[i];
        return s / static_cast<double>(window);
    };
    return {mean_of(0), mean_of(deviations.size() - static_cast<std::size_t>(window))};
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    try {
        const cli::Arguments args(argc, argv,
                                  {.flags = {"--check-penalty", "--skip-without-cuda"},
                                   .options = {"--device", "--data", "--steps", "--critic-iters", "--batch", "--lambda",
                                               "--lr", "--seed"}});
        // Not cli::parse_device: a missing device is the library's DeviceError when the data moves (exit 1).
        if (auto v = args.value("--device"))
            o.device = cli::parse_choice("--device", *v, {"cpu", "cuda"}) == "cuda" ? Device::cuda(0) : Device::cpu();
        if (auto v = args.value("--steps")) o.steps = cli::parse_int("--steps", *v, 1, 1'000'000);
        if (auto v = args.value("--critic-iters")) o.critic_iters = cli::parse_int("--critic-iters", *v, 1, 100);
        if (auto v = args.value("--batch")) o.batch = cli::parse_int("--batch", *v, 2, 4096);
        if (auto v = args.value("--lambda")) o.lambda = cli::parse_real("--lambda", *v, 0, 1e6);
        if (auto v = args.value("--lr")) o.lr = cli::parse_real("--lr", *v, 0, 1, /*min_exclusive=*/true);
        if (auto v = args.value("--seed")) o.seed = static_cast<std::uint64_t>(cli::parse_int("--seed", *v, 0));
        o.check_penalty = args.has("--check-penalty");
        o.skip_without_cuda = args.has("--skip-without-cuda");
        o.data = cli::existing_directory("--data", args.value("--data").value_or(o.data));
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "wgan_gp: %s\n", e.what());
        return 2;
    }
    if (o.skip_without_cuda && o.device.is_cuda() && cuda_device_count() == 0) {
        std::printf("wgan_gp: no CUDA device: the GPU run is skipped\n");
        return 77;  // CTest reports the test as skipped
    }
    try {
        // Pixels in [-1, 1], the generator's tanh range.
        const MnistData data = load_mnist(o.data);
        const Normalization& norm = data.normalization;
        const Tensor pixels = data.train.images.reshaped({data.train.size(), kPixels});
        const Tensor real_images = (pixels * (2.0 * norm.stddev) + (2.0 * norm.mean - 1.0)).to(o.device);
        std::printf("wgan_gp: %lld images on %s, lambda %g, %lld generator steps x %lld critic steps, batch %lld\n",
                    static_cast<long long>(real_images.size(0)), o.device.to_string().c_str(), o.lambda,
                    static_cast<long long>(o.steps), static_cast<long long>(o.critic_iters),
                    static_cast<long long>(o.batch));
        const auto [first, last] = train(o, o.lambda, real_images, true);
        std::printf("mean |grad norm - 1|: first fifth of critic steps %.4f, last fifth %.4f\n", first, last);
        if (!o.check_penalty) return 0;
        const auto [first_free, last_free] = train(o, 0.0, real_images, false);
        std::printf("without the penalty (lambda 0): first fifth %.4f, last fifth %.4f\n", first_free, last_free);
        const bool used = last < last_free;
        std::printf("%s\n", used ? "the penalty kept the critic's gradient norm closer to 1"
                                 : "FAILED: the penalty did not pull the critic's gradient norm toward 1");
        return used ? 0 : 1;
    } catch (const Error& e) {
        std::fprintf(stderr, "wgan_gp: %s\n", e.what());
        return 1;
    }
}
