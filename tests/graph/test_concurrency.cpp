// Concurrency: two threads, each training its own small model (its own graphs, Parameters, optimizer and
// data, seeded like a sequential run), must produce bit-identical losses and weights to the same two runs
// made one after the other. On the CPU, and on cuda:0 when there is one (both threads then share the
// device's stream and cuBLAS handle, each with its own cuDNN handle: cuda/context.cu, ThreadContexts).
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

constexpr int kSteps = 25;
constexpr std::int64_t kBatch = 8;

struct Result {
    std::vector<double> losses;   // one per step
    std::vector<double> weights;  // every parameter after the last step, concatenated
};

Var relu_layer(const Var& x) { return relu(x); }
Var pool_layer(const Var& x) { return max_pool2d(x, {2, 2}); }
Var flatten_layer(const Var& x) { return flatten(x); }

// A small CNN (conv, pool, linear: cuDNN and cuBLAS on a GPU) trained with SGD + momentum on fixed random
// batches; everything it draws comes from `seed`.
Result train(std::uint64_t seed, Device device) {
    Generator gen(seed);
    Sequential model;
    model.add(Conv2d(1, 4, {3, 3}, {}, true, gen)).add(relu_layer).add(pool_layer).add(flatten_layer);
    model.add(Linear(4 * 3 * 3, 5, true, gen));
    model.to(device);
    SGD optimizer(model.parameters(), {.lr = 0.05, .momentum = 0.9});
    std::vector<Tensor> images, labels;
    for (int i = 0; i < 4; ++i) {
        images.push_back(Tensor::normal({kBatch, 1, 8, 8}, 0.0, 1.0, gen, DType::f32, device));
        std::vector<std::int64_t> y(static_cast<std::size_t>(kBatch));
        for (auto& label : y) label = static_cast<std::int64_t>(gen.engine()() % 5);
        labels.push_back(Tensor::from_vector(y, {kBatch}, device));
    }

    Result result;
    for (int step = 0; step < kSteps; ++step) {
        ComputeGraph graph;
        const Var logits = model(graph.input(images[step % images.size()], "images"));
        const Var loss = cross_entropy(logits, graph.input(labels[step % labels.size()], "labels"));
        optimizer.zero_grad();
        graph.backward(loss);
        optimizer.step();
        result.losses.push_back(loss.item());
    }
    for (const Parameter& p : model.parameters()) {
        const std::vector<double> values = p.value().to_vector();
        result.weights.insert(result.weights.end(), values.begin(), values.end());
    }
    return result;
}

// Runs train(seed) for every seed on threads of its own, all at once; rethrows the first failure.
std::vector<Result> train_concurrently(const std::vector<std::uint64_t>& seeds, Device device) {
    std::vector<Result> results(seeds.size());
    std::vector<std::exception_ptr> errors(seeds.size());
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < seeds.size(); ++i)
        threads.emplace_back([&, i] {
            try {
                results[i] = train(seeds[i], device);
            } catch (...) {
                errors[i] = std::current_exception();
            }
        });
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& error : errors)
        if (error) std::rethrow_exception(error);
    return results;
}

// Bit-identical: exact equality of every value (no tolerance).
void require_identical(const Result& concurrent, const Result& sequential) {
    REQUIRE(concurrent.losses == sequential.losses);
    REQUIRE(concurrent.weights == sequential.weights);
}

void check_device(Device device) {
    const std::vector<std::uint64_t> seeds = {11, 12};
    const Result first = train(seeds[0], device);
    const Result second = train(seeds[1], device);
    REQUIRE(first.losses != second.losses);  // two different models, or the test proves nothing
    // A few rounds, so that the threads' steps interleave differently.
    for (int round = 0; round < 3; ++round) {
        const std::vector<Result> concurrent = train_concurrently(seeds, device);
        require_identical(concurrent[0], first);
        require_identical(concurrent[1], second);
    }
}

}  // namespace

TEST_CASE("two threads train two models exactly like sequential runs, on the CPU", "[concurrency]") {
    check_device(Device::cpu());
}

TEST_CASE("two threads train two models exactly like sequential runs, on the GPU", "[concurrency][gpu]") {
    if (cuda_device_count() == 0) {
        DG_SKIP("no CUDA device (or a CPU-only build): the GPU part of the concurrency test");
    }
    // cuDNN may pick algorithms with atomics, which differ from run to run even on one thread.
    const bool was_deterministic = cuda::deterministic();
    cuda::set_deterministic(true);
    try {
        check_device(Device::cuda(0));
    } catch (...) {
        cuda::set_deterministic(was_deterministic);
        throw;
    }
    cuda::set_deterministic(was_deterministic);
}
