// GPU tests: the executable's main, and the device runtime's own checks: out of memory, memory accounting,
// mixed devices, errors reported by kernels at the next sync, deterministic mode over a training step.
// The cases of each subject are in gpu_*.cpp files of the subject folders (ops/, nn/, graph/, capture/,
// verification/), compiled into this executable; each has the tags [gpu] and its subject's ([runtime] for the
// cases here).
//
// Without a CUDA device (or in a CPU-only build) the executable prints why and exits 77, which CTest
// counts as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
#include <cmath>
#include <cstdint>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;
using dgtest::MessageHas;

TEST_CASE("out of memory is an exception and the device stays usable", "[gpu][runtime][memory]") {
    if (under_sanitizer()) {
        WARN("left out under compute-sanitizer: its allocation tracking makes a failed 1 TiB allocation take minutes");
        return;
    }
    CHECK_THROWS_AS(Tensor::empty({1LL << 40}, DType::f32, kGpu), OutOfMemory);
    CHECK_THROWS_AS(Tensor::zeros({1LL << 38, 4}, DType::f64, kGpu), OutOfMemory);

    ComputeGraph graph;
    Var a = graph.input(Tensor::of({1, 2, 3}).to(kGpu), "a", true);
    Var b = graph.input(Tensor::of({4, 5, 6}).to(kGpu), "b");
    Var loss = sum(relu(a * b));
    CHECK(loss.item() == 32);
    graph.backward(loss);
    CHECK(a.grad().to_vector() == std::vector<double>{4, 5, 6});
}

TEST_CASE("memory in use returns to its earlier value", "[gpu][runtime][memory]") {
    auto workload = [] {
        Generator gen(kSeedBase + 3000);
        ComputeGraph graph;
        Var x = graph.input(Tensor::normal({256, 512}, 0.0, 1.0, gen, DType::f32, kGpu), "x", true);
        Var w = graph.input(Tensor::normal({128, 512}, 0.0, 1.0, gen, DType::f32, kGpu), "w", true);
        Var y = graph.input(random_labels(256, 128, gen, kGpu), "labels");
        Var loss = cross_entropy(softmax(tanh(linear(x, w)), -1), y) + sum(x * x);
        graph.backward(loss);
        return loss.item();
    };
    workload();  // first use creates handles and plans
    cuda::synchronize(0);
    const std::size_t before = cuda::memory_stats(0).bytes_in_use;
    {
        const Tensor big = Tensor::zeros({1 << 22}, DType::f32, kGpu);
        CHECK(cuda::memory_stats(0).bytes_in_use >= before + big.nbytes());
        CHECK(cuda::memory_stats(0).peak_bytes_in_use >= before + big.nbytes());
        CHECK(std::isfinite(workload()));
    }
    cuda::synchronize(0);
    CHECK(cuda::memory_stats(0).bytes_in_use == before);
    cuda::reset_peak_memory(0);
    CHECK(cuda::memory_stats(0).peak_bytes_in_use == cuda::memory_stats(0).bytes_in_use);
}

TEST_CASE("a memory limit refuses what would pass it, typed, and lifting it restores the device", "[gpu][runtime][memory]") {
    cuda::synchronize(0);
    const std::size_t in_use = cuda::memory_stats(0).bytes_in_use;
    const std::size_t limit = in_use + (std::size_t{64} << 20);
    cuda::set_memory_limit(0, limit);
    CHECK(cuda::memory_limit(0) == limit);
    {
        const Tensor fits = Tensor::zeros({std::int64_t{8} << 20}, DType::f32, kGpu);  // 32 MiB under 64
        CHECK_THROWS_MATCHES(Tensor::zeros({std::int64_t{16} << 20}, DType::f32, kGpu), OutOfMemory,
                             MessageHas({"memory limit", "cuda:0"}));
        CHECK(cuda::memory_stats(0).bytes_in_use <= limit);  // the refused block was never taken
        CHECK(sum(fits).item() == 0);  // the device still works under the limit
    }
    cuda::set_memory_limit(0, 0);
    CHECK(cuda::memory_limit(0) == 0);
    CHECK(Tensor::zeros({std::int64_t{32} << 20}, DType::f32, kGpu).numel() == std::int64_t{32} << 20);
}

TEST_CASE("inputs on different devices are a DeviceError", "[gpu][runtime][device]") {
    ComputeGraph graph;
    Var on_cpu = graph.input(Tensor::of({1, 2}), "on_cpu");
    Var on_gpu = graph.input(Tensor::of({3, 4}).to(kGpu), "on_gpu");
    CHECK_THROWS_MATCHES(add(on_cpu, on_gpu), DeviceError, MessageHas({"add", "cpu", "cuda:0"}));
    CHECK_THROWS_MATCHES(mul(on_gpu, on_cpu), DeviceError, MessageHas({"mul", "cpu", "cuda:0"}));
    CHECK(add(on_gpu, on_gpu).value().to_vector() == std::vector<double>{6, 8});
}

TEST_CASE("a label out of range on the GPU raises IndexError at the next sync", "[gpu][runtime][device]") {
    ComputeGraph graph;
    Var logits = graph.input(Tensor::zeros({4, 5}, DType::f32, kGpu), "logits", true);
    Var bad = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 9, 2}, {4}, kGpu), "labels");
    // The kernel records the error; the host sees it when it waits for the stream (reading the loss).
    CHECK_THROWS_MATCHES(cross_entropy(logits, bad).item(), IndexError, MessageHas({"9"}));

    // The error record was cleared: the next ops run normally.
    Var good = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 4, 2}, {4}, kGpu), "labels");
    Var loss = cross_entropy(logits, good);
    CHECK(loss.item() == dgtest::Approx(std::log(5.0)).epsilon(1e-6));
    CHECK_NOTHROW(cuda::synchronize(0));
}

TEST_CASE("an index out of range on the GPU raises IndexError at the next sync", "[gpu][runtime][device]") {
    ComputeGraph graph;
    Var w = graph.input(Tensor::zeros({5, 3}, DType::f32, kGpu), "w", true);
    Var bad = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, 7, 1}, {3}, kGpu), "idx");
    // The kernel records the error without a sync; reading the value waits for the stream and raises it.
    CHECK_THROWS_MATCHES(embedding(bad, w).value().to_vector(), IndexError,
                         MessageHas({"embedding", "index 7", "position 1", "[0, 5)"}));
    Var x = graph.input(Tensor::zeros({2, 3}, DType::f32, kGpu), "x", true);
    Var negative = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, -4}, {1, 2}, kGpu), "idx");
    CHECK_THROWS_MATCHES(gather(x, 1, negative).value().to_vector(), IndexError, MessageHas({"gather", "index -4"}));
    // The record was cleared: the next ops run normally.
    Var good = graph.input(Tensor::from_vector(std::vector<std::int64_t>{4, 0}, {2}, kGpu), "idx");
    CHECK(embedding(good, w).value().to_vector() == std::vector<double>(6, 0.0));
    CHECK_NOTHROW(cuda::synchronize(0));
}

namespace {

// One training-style step of a small CNN (conv, batch_norm, relu, pools, linear, cross_entropy);
// returns every parameter gradient, copied to the CPU.
std::vector<std::vector<double>> cnn_gradients(std::uint64_t seed) {
    Generator gen(seed);
    auto on_gpu = [&](const Shape& shape) { return Tensor::normal(shape, 0.0, 0.5, gen).to(kGpu); };
    const Parameter conv_w(on_gpu({8, 3, 3, 3}), "conv.w"), conv_b(on_gpu({8}), "conv.b");
    const Parameter gamma(on_gpu({8}), "bn.gamma"), beta(on_gpu({8}), "bn.beta");
    const Parameter fc_w(on_gpu({10, 8 * 4 * 4}), "fc.w"), fc_b(on_gpu({10}), "fc.b");
    Tensor running_mean = Tensor::zeros({8}, DType::f32, kGpu), running_var = Tensor::ones({8}, DType::f32, kGpu);
    const Tensor images = on_gpu({32, 3, 16, 16});
    const Tensor labels = random_labels(32, 10, gen, kGpu);
    ComputeGraph graph;
    Var h = conv2d(graph.input(images), graph.parameter(conv_w), graph.parameter(conv_b), {.padding = {1, 1}});
    h = relu(batch_norm(h, graph.parameter(gamma), graph.parameter(beta), running_mean, running_var, true));
    h = avg_pool2d(max_pool2d(h, {2, 2}), {2, 2});
    Var loss = cross_entropy(linear(flatten(h), graph.parameter(fc_w), graph.parameter(fc_b)), graph.input(labels));
    graph.backward(loss);
    std::vector<std::vector<double>> grads;
    for (const Parameter* p : {&conv_w, &conv_b, &gamma, &beta, &fc_w, &fc_b}) grads.push_back(p->grad().to_vector());
    return grads;
}

}  // namespace

TEST_CASE("deterministic mode gives bitwise-identical gradients over two runs", "[gpu][runtime][deterministic]") {
    const bool previous = cuda::deterministic();
    cuda::set_deterministic(true);
    const auto first = cnn_gradients(77);
    const auto second = cnn_gradients(77);
    cuda::set_deterministic(previous);
    REQUIRE(first.size() == second.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
        INFO("parameter " << i);
        CHECK(first[i] == second[i]);  // exact equality: bit for bit
    }
}

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "GPU tests"); }
