// dyngrad-soak: trains the `lenet` model of dyngrad-train (samples/train.cpp) for many steps and checks
// that memory stays flat. Memory in use is read after step 100 (when every lazily created state exists:
// optimizer buffers, cuDNN plans, the memory pool) and after the last step, both at the same point of
// the loop (the step's graph and batch gone); where the reading is exact, the two must be equal.
//   --device cuda: dyngrad's device memory in use (cuda::memory_stats), synchronised first: exact.
//   --device cpu:  heap bytes in use. Under ASan the sanitizer allocator's count: exact (and LeakSanitizer
//                  reports any leak at exit). Otherwise glibc's mallinfo2, which counts the freed blocks
//                  glibc keeps cached per thread as in use: shown, not compared.
// Exit status: 0 when the readings are equal (or not exact), 1 when they differ, 2 for a usage or run error.
#include <malloc.h>

#include <charconv>
#include <cstddef>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "../cli/command_line.h"

#if defined(__SANITIZE_ADDRESS__)
#define DG_SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DG_SOAK_ASAN 1
#endif
#endif
#if DG_SOAK_ASAN
// Bytes the sanitizer's allocator has handed out and not yet freed (declared here: gcc ships no
// sanitizer/allocator_interface.h).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace {

using namespace dyngrad;

const char* const kUsage =
    "usage: dyngrad-soak [--steps N] [--device cpu|cuda] [--batch N] [--data DIR] [--seed N] [--check-at N]\n"
    "\n"
    "Trains lenet (Adam, lr 0.001, as dyngrad-train) for N steps (default 10000) and compares the memory\n"
    "in use after step --check-at (default 100) with the memory in use after the last step: device memory\n"
    "on cuda, heap bytes on cpu (compared only in a build with AddressSanitizer, whose count is exact).\n"
    "Batches of --batch (default 64) images: random 28x28 images and labels (a fixed set of 16 batches,\n"
    "cycled), or Fashion-MNIST's training split with --data DIR.\n"
    "\n"
    "Exit status: 0 when the two readings are equal (or not exact), 1 when they differ, 2 for a usage or\n"
    "run error.\n";

struct Options {
    std::int64_t steps = 10'000;
    std::int64_t check_at = 100;
    std::int64_t batch = 64;
    std::uint64_t seed = 1;
    Device device = Device::cpu();
    std::string data;  // empty: random batches
};

// Every argument is checked before the first step (cli/command_line.h).
Options parse(int argc, char* argv[]) {
    const cli::Arguments args(argc, argv,
                              {.options = {"--steps", "--check-at", "--batch", "--seed", "--data", "--device"}});
    if (args.help()) {
        std::fputs(kUsage, stdout);
        std::exit(0);
    }
    Options o;
    if (auto v = args.value("--steps")) o.steps = cli::parse_int("--steps", *v, 1);
    if (auto v = args.value("--check-at")) o.check_at = cli::parse_int("--check-at", *v, 1);
    if (auto v = args.value("--batch")) o.batch = cli::parse_int("--batch", *v, 1, 1 << 24);
    if (auto v = args.value("--seed")) o.seed = static_cast<std::uint64_t>(cli::parse_int("--seed", *v, 0));
    if (auto v = args.value("--data")) o.data = cli::existing_directory("--data", *v);
    if (auto v = args.value("--device")) o.device = cli::parse_device("--device", *v, {"cpu", "cuda"});
    if (o.check_at >= o.steps)
        throw cli::UsageError(str("--check-at ", o.check_at, " must come before the last step ", o.steps));
    return o;
}

Var relu_layer(const Var& x) { return relu(x); }
Var pool_layer(const Var& x) { return max_pool2d(x, {2, 2}); }
Var flatten_layer(const Var& x) { return flatten(x); }

// dyngrad-train's lenet for 1×28×28 images:
// conv 5×5 (20) · pool · conv 5×5 (50) · pool · fc 500 · relu · fc 10.
Sequential make_lenet(Generator& gen) {
    Sequential model;
    model.add(Conv2d(1, 20, {5, 5}, {}, true, gen)).add(pool_layer);
    model.add(Conv2d(20, 50, {5, 5}, {}, true, gen)).add(pool_layer).add(flatten_layer);
    model.add(Linear(50 * 4 * 4, 500, true, gen)).add(relu_layer).add(Linear(500, kMnistClasses, true, gen));
    return model;
}

struct MemoryReading {
    std::size_t bytes = 0;
    const char* what = "";
    bool exact = false;  // equal readings mean equal memory in use
};

// Bytes in use: dyngrad's device allocations on a GPU, the whole heap on the CPU.
MemoryReading memory_in_use(Device device) {
    if (device.is_cuda()) {
        cuda::synchronize(device.index);
        return {cuda::memory_stats(device.index).bytes_in_use, "device memory in use", true};
    }
#if DG_SOAK_ASAN
    return {__sanitizer_get_current_allocated_bytes(), "heap in use (ASan allocator)", true};
#else
    // glibc serves large blocks with mmap, counted apart from the heap's own.
    const struct mallinfo2 info = mallinfo2();
    return {info.uordblks + info.hblkhd, "heap in use (glibc mallinfo2, not exact)", false};
#endif
}

// Batches of random images and labels, made once and cycled, or Fashion-MNIST through a BatchLoader.
class Batches {
public:
    Batches(const Options& o, Generator& gen) {
        if (!o.data.empty()) {
            train_ = load_mnist(o.data).train;
            loader_ = std::make_unique<BatchLoader>(
                train_, LoaderOptions{.batch_size = o.batch, .seed = o.seed, .device = o.device});
            return;
        }
        constexpr int kRandomBatches = 16;
        for (int i = 0; i < kRandomBatches; ++i) {
            Batch b;
            b.images = Tensor::normal({o.batch, 1, 28, 28}, 0.0, 1.0, gen, DType::f32, o.device);
            std::vector<std::int64_t> labels(static_cast<std::size_t>(o.batch));
            for (std::size_t k = 0; k < labels.size(); ++k)
                labels[k] = static_cast<std::int64_t>(gen.engine()() % kMnistClasses);
            b.labels = Tensor::from_vector(labels, {o.batch}, o.device);
            random_.push_back(std::move(b));
        }
    }

    Batch next() {
        if (!loader_) return random_[static_cast<std::size_t>(count_++) % random_.size()];
        Batch b;
        if (!loader_->next(b)) {
            loader_->start_epoch(++epoch_);
            loader_->next(b);
        }
        return b;
    }

private:
    std::vector<Batch> random_;
    std::int64_t count_ = 0;
    Dataset train_;
    std::unique_ptr<BatchLoader> loader_;
    std::int64_t epoch_ = 0;
};

int soak(const Options& o) {
    if (o.device.is_cuda() && cuda_device_count() == 0)
        throw DeviceError(cuda_compiled() ? "--device cuda: no CUDA device found"
                                          : "--device cuda: this build of dyngrad has no CUDA backend");
    Generator gen(o.seed);
    Sequential model = make_lenet(gen);
    model.to(o.device);
    Adam optimizer(model.parameters(), {.lr = 1e-3});
    Batches batches(o, gen);
    std::printf("dyngrad-soak: lenet, %lld steps, batch %lld, %s, %s\n", static_cast<long long>(o.steps),
                static_cast<long long>(o.batch), o.device.to_string().c_str(),
                o.data.empty() ? "random data" : o.data.c_str());
    std::fflush(stdout);

    const auto start = std::chrono::steady_clock::now();
    MemoryReading at_check, at_end;
    double loss_at_check = 0, loss_at_end = 0;
    for (std::int64_t step = 1; step <= o.steps; ++step) {
        double loss_value = 0;
        {
            const Batch batch = batches.next();
            ComputeGraph graph;
            const Var logits = model(graph.input(batch.images, "images"));
            const Var loss = cross_entropy(logits, graph.input(batch.labels, "labels"));
            optimizer.zero_grad();
            graph.backward(loss);
            optimizer.step();
            if (step == o.check_at || step == o.steps) loss_value = loss.item();
        }
        // Read at the same point of every step: the graph, its tensors and the batch are gone.
        if (step == o.check_at) {
            loss_at_check = loss_value;
            at_check = memory_in_use(o.device);
            std::printf("step %lld: loss %.4f, %s %zu bytes\n", static_cast<long long>(step), loss_value,
                        at_check.what, at_check.bytes);
            std::fflush(stdout);
        }
        if (step == o.steps) {
            loss_at_end = loss_value;
            at_end = memory_in_use(o.device);
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("step %lld: loss %.4f, %s %zu bytes\n", static_cast<long long>(o.steps), loss_at_end, at_end.what,
                at_end.bytes);
    if (o.device.is_cuda()) {
        const cuda::MemoryStats stats = cuda::memory_stats(o.device.index);
        std::printf("peak device memory in use %zu bytes, pool reserved %zu bytes\n", stats.peak_bytes_in_use,
                    stats.pool_reserved_bytes);
    }
    std::printf("%.1f s, %.2f ms per step; loss %.4f -> %.4f\n", seconds,
                1e3 * seconds / static_cast<double>(o.steps), loss_at_check, loss_at_end);
    const long long growth = static_cast<long long>(at_end.bytes) - static_cast<long long>(at_check.bytes);
    if (!at_end.exact) {
        std::printf("not compared (%+lld bytes): glibc counts the freed blocks it caches as in use; a build with "
                    "-DDYNGRAD_SANITIZE=address counts exactly\n", growth);
        return 0;
    }
    if (growth != 0) {
        std::printf("FAIL: memory in use changed by %+lld bytes between step %lld and step %lld\n", growth,
                    static_cast<long long>(o.check_at), static_cast<long long>(o.steps));
        return 1;
    }
    std::printf("OK: memory in use after step %lld equals memory in use after step %lld (%zu bytes)\n",
                static_cast<long long>(o.check_at), static_cast<long long>(o.steps), at_end.bytes);
    return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
    try {
        return soak(parse(argc, argv));
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "dyngrad-soak: %s\n%s", e.what(), kUsage);
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dyngrad-soak: %s\n", e.what());
        return 2;
    }
}
