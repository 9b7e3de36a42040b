// cuda::CapturedStep on small models: replays against eager steps per batch shape, host synchronisations
// inside a capture, replays that allocate nothing, results that outlive the step, clip_grad_norm captured.
// tests/capture/test_gpu_capture.cpp (an executable of its own) covers the optimizers, schedules and dropout.
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp); the helpers several of its files share are in tests/support/gpu_support.h.
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;
using dgtest::max_abs_diff;
using dgtest::MessageHas;

namespace {

void check_captured_matches_eager(bool cnn) {
    Model eager(cnn, 11), captured(cnn, 11);
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return captured.step(in); });
    // Shape 64 warms up, is captured, then replays; shape 32 gets its own variant on the way.
    const std::int64_t rows[] = {64, 64, 64, 32, 32, 64, 32, 64, 32, 64};
    for (std::size_t i = 0; i < std::size(rows); ++i) {
        const std::vector<Tensor> batch = model_batch(cnn, rows[i], 500 + i);
        const double eager_loss = eager.step(batch).item();
        const Tensor loss = step.run({{batch[0], batch[1]}});
        INFO("step " << i << " rows " << rows[i]);
        CHECK(loss.numel() == 1);
        CHECK(loss.item() == dgtest::Approx(eager_loss).epsilon(1e-6));
    }
    CHECK(step.variants() == 2);
    for (std::size_t i = 0; i < eager.params.size(); ++i) {
        INFO(eager.params[i].name());
        CHECK(max_abs_diff(eager.params[i].value(), captured.params[i].value()) <= 1e-6);
    }
}

}  // namespace

TEST_CASE("a captured training step matches the eager step, per batch shape", "[gpu][capture]") {
    SECTION("MLP (linear, relu, cross_entropy, SGD)") { check_captured_matches_eager(false); }
    SECTION("CNN (cuDNN conv2d and max_pool2d)") { check_captured_matches_eager(true); }
}

TEST_CASE("a host synchronisation inside a captured step is a GraphError; the device stays usable",
          "[gpu][capture]") {
    Model model(false, 12);
    const std::vector<Tensor> batch = model_batch(false, 16, 600);
    const std::vector<double> before = model.params[0].value().to_vector();
    SECTION("item()") {
        cuda::CapturedStep step([&](std::span<const Tensor> in) {
            Tensor loss = model.step(in);
            static_cast<void>(loss.item());  // not inside CHECK: Catch would swallow the exception
            return loss;
        });
        CHECK_NOTHROW(step.run(batch));  // the eager warm-up may read values
        CHECK_THROWS_MATCHES(step.run(batch), GraphError, MessageHas({"item()", "captured", "cuda:0"}));
        CHECK(step.variants() == 0);
    }
    SECTION("cuda::synchronize()") {
        cuda::CapturedStep step([&](std::span<const Tensor> in) {
            Tensor loss = model.step(in);
            cuda::synchronize(0);
            return loss;
        });
        step.run(batch);
        CHECK_THROWS_MATCHES(step.run(batch), GraphError, MessageHas({"cuda::synchronize()", "captured"}));
    }
    SECTION("an Adam step whose first step would be captured") {
        // Adam steps are capturable (issue 15: step counts and lrs live on the device, tests/capture/test_gpu_capture.cpp),
        // but the first step on a device creates them with host-to-device copies.
        Adam adam(model.params);
        int calls = 0;
        cuda::CapturedStep step([&](std::span<const Tensor> in) {
            ComputeGraph graph;
            Var loss = cross_entropy(model.forward(graph, graph.input(in[0])), graph.input(in[1]));
            graph.backward(loss);
            if (calls++ > 0) adam.step();  // the warm-up run steps with SGD instead
            else model.optimizer.step();
            adam.zero_grad();
            return loss.value();
        });
        step.run(batch);
        CHECK_THROWS_MATCHES(step.run(batch), GraphError, MessageHas({"Adam::step()", "first step", "eagerly"}));
    }
    // The capture was ended: eager work runs and syncs as before, and the failed capture changed nothing.
    ComputeGraph graph;
    Var a = graph.input(Tensor::of({1, 2, 3}).to(kGpu), "a", true);
    Var loss = sum(a * a);
    CHECK(loss.item() == 14);
    graph.backward(loss);
    CHECK(a.grad().to_vector() == std::vector<double>{2, 4, 6});
    CHECK_NOTHROW(cuda::synchronize(0));
    CHECK(model.params[0].value().to_vector() != before);  // the warm-up step did update
}

TEST_CASE("replays of a captured step allocate nothing", "[gpu][capture]") {
    Model model(false, 13);
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return model.step(in); });
    const std::vector<Tensor> batch = model_batch(false, 64, 700);
    step.run(batch);
    step.run(batch);  // captured and launched
    cuda::synchronize(0);
    const cuda::MemoryStats after_two = cuda::memory_stats(0);
    CHECK(after_two.capture_reserved_bytes > 0);
    double last = 0;
    for (int i = 0; i < 100; ++i) last = step.run(batch).item();
    CHECK(std::isfinite(last));
    const cuda::MemoryStats after_102 = cuda::memory_stats(0);
    CHECK(after_102.bytes_in_use == after_two.bytes_in_use);
    CHECK(after_102.capture_reserved_bytes == after_two.capture_reserved_bytes);
    CHECK(after_102.pool_reserved_bytes == after_two.pool_reserved_bytes);
}

TEST_CASE("a tensor returned by a captured step outlives the CapturedStep", "[gpu][capture]") {
    cuda::synchronize(0);
    const cuda::MemoryStats before = cuda::memory_stats(0);
    Tensor loss;
    std::vector<double> value;
    {
        Model model(false, 14);
        cuda::CapturedStep step([&](std::span<const Tensor> in) { return model.step(in); });
        const std::vector<Tensor> batch = model_batch(false, 8, 800);
        step.run(batch);
        loss = step.run(batch);
        value = loss.to_vector();
        CHECK(cuda::memory_stats(0).capture_reserved_bytes > before.capture_reserved_bytes);
    }
    // The step, its graph and the model are gone; the loss's block of the private pool is still held.
    CHECK(cuda::memory_stats(0).capture_reserved_bytes > before.capture_reserved_bytes);
    CHECK(loss.to_vector() == value);
    {
        ComputeGraph graph;
        CHECK(mul_scalar(graph.input(loss), 2.0).item() == dgtest::Approx(2 * value[0]));
    }
    loss = Tensor();  // the last block returns: the pool goes back to the driver
    cuda::synchronize(0);
    CHECK(cuda::memory_stats(0).capture_reserved_bytes == before.capture_reserved_bytes);
    CHECK(cuda::memory_stats(0).bytes_in_use == before.bytes_in_use);
}

TEST_CASE("clip_grad_norm needs no host synchronisation: it runs inside a captured step", "[gpu][clip][capture]") {
    Model eager(false, 21), captured(false, 21);
    const auto step = [](Model& model, std::span<const Tensor> in) {
        ComputeGraph graph;
        Var loss = cross_entropy(model.forward(graph, graph.input(in[0])), graph.input(in[1]));
        graph.backward(loss);
        clip_grad_norm(model.params, 0.05);  // small: it clips
        model.optimizer.step();
        model.optimizer.zero_grad();
        return loss.value();
    };
    cuda::CapturedStep captured_step([&](std::span<const Tensor> in) { return step(captured, in); });
    for (int i = 0; i < 4; ++i) {
        const std::vector<Tensor> batch = model_batch(false, 32, 800 + i);
        step(eager, batch);
        REQUIRE_NOTHROW(captured_step.run(batch));
    }
    for (std::size_t i = 0; i < eager.params.size(); ++i)
        CHECK(max_abs_diff(eager.params[i].value(), captured.params[i].value()) <= 1e-6);
}
