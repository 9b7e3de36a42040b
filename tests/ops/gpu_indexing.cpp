// The indexing ops' GPU kernels: deterministic mode's sorted sums against the atomics, bit for bit over
// runs; embedding's padding_idx against the CPU in both modes.
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp); the helpers several of its files share are in tests/support/gpu_support.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;

namespace {

// dweight of embedding, dx of gather and dbase/dsrc of scatter_add with heavy repeats (many sources per
// destination, so atomics would add in a varying order), copied to the CPU.
std::vector<std::vector<double>> indexing_gradients(std::uint64_t seed, std::optional<std::int64_t> padding) {
    Generator gen(seed);
    const Tensor w = Tensor::normal({50, 64}, 0.0, 1.0, gen).to(kGpu);
    const Tensor tokens = random_labels(100'000, 50, gen, kGpu).reshaped({400, 250});
    const Tensor x = Tensor::normal({64, 30}, 0.0, 1.0, gen).to(kGpu);
    const Tensor columns = random_labels(64 * 4000, 30, gen, kGpu).reshaped({64, 4000});
    const Tensor src = Tensor::normal({64, 4000}, 0.0, 1.0, gen).to(kGpu);
    ComputeGraph graph;
    Var wv = graph.input(w, "w", true);
    Var xv = graph.input(x, "x", true);
    Var sv = graph.input(src, "src", true);
    Var e = embedding(graph.input(tokens), wv, padding);
    Var g = gather(xv, 1, graph.input(columns));
    Var s = scatter_add(xv, 1, graph.input(columns), sv);
    graph.backward(sum(e * e) + sum(g * g) + sum(s * s));
    return {e.value().to_vector(), wv.grad().to_vector(), xv.grad().to_vector(), sv.grad().to_vector(),
            s.value().to_vector()};
}

}  // namespace

TEST_CASE("deterministic mode makes the indexing ops' GPU sums bitwise-identical over runs", "[gpu][ops][deterministic]") {
    const bool previous = cuda::deterministic();
    cuda::set_deterministic(true);
    const auto first = indexing_gradients(78, 3);
    const auto second = indexing_gradients(78, 3);
    cuda::set_deterministic(false);
    const auto fast = indexing_gradients(78, 3);  // atomics: equal up to the order of additions
    cuda::set_deterministic(previous);
    REQUIRE(first.size() == second.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
        INFO("tensor " << i);
        CHECK(first[i] == second[i]);  // exact equality: bit for bit
        REQUIRE(first[i].size() == fast[i].size());
        double worst = 0, norm = 0;
        for (std::size_t k = 0; k < first[i].size(); ++k) {
            worst = std::max(worst, std::abs(first[i][k] - fast[i][k]));
            norm = std::max(norm, std::abs(first[i][k]));
        }
        CHECK(worst <= 1e-4 * std::max(norm, 1.0));  // thousands of float32 terms per destination
    }
    // embedding's padding row (3) gets no gradient on either path.
    for (std::size_t c = 0; c < 64; ++c) {
        CHECK(first[1][3 * 64 + c] == 0.0);
        CHECK(fast[1][3 * 64 + c] == 0.0);
    }
}

TEST_CASE("embedding with padding_idx on the GPU matches the CPU", "[gpu][ops][indexing]") {
    for (const bool deterministic : {false, true}) {
        INFO("deterministic " << deterministic);
        const bool previous = cuda::deterministic();
        cuda::set_deterministic(deterministic);
        Generator gen(79);
        const Tensor w = Tensor::normal({20, 7}, 0.0, 1.0, gen);
        const Tensor tokens = random_labels(300, 20, gen, Device::cpu()).reshaped({30, 10});
        const Tensor dy = Tensor::normal({30, 10, 7}, 0.0, 1.0, gen);
        std::vector<double> grads[2];
        for (const Device device : {Device::cpu(), kGpu}) {
            ComputeGraph graph;
            Var wv = graph.input(w.to(device), "w", true);
            graph.backward(embedding(graph.input(tokens.to(device)), wv, -1), dy.to(device));
            grads[device.is_cuda()] = wv.grad().to_vector();
        }
        cuda::set_deterministic(previous);
        // Float32 sums of up to ~30 unit-sized terms in another order: an absolute margin, not only a relative one
        // (a sum near zero has no relative accuracy).
        for (std::size_t i = 0; i < grads[0].size(); ++i)
            CHECK(grads[1][i] == dgtest::Approx(grads[0][i]).epsilon(1e-5).margin(2e-5));
        for (std::size_t c = 0; c < 7; ++c) CHECK(grads[1][19 * 7 + c] == 0.0);
    }
}
