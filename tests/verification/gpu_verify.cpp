// verify() (graph/verify.h) on a small MLP built on the GPU: the replay of every node on the float64 CPU.
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp); the helpers several of its files share are in tests/support/gpu_support.h.
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;

TEST_CASE("verify() replays a small MLP built on the GPU", "[gpu][verification][verify]") {
    Generator gen(kSeedBase + 2000);
    Parameter w1(Tensor::normal({32, 20}, 0.0, 0.3, gen, DType::f32, kGpu), "w1");
    Parameter b1(Tensor::normal({32}, 0.0, 0.1, gen, DType::f32, kGpu), "b1");
    Parameter w2(Tensor::normal({10, 32}, 0.0, 0.3, gen, DType::f32, kGpu), "w2");
    Parameter b2(Tensor::normal({10}, 0.0, 0.1, gen, DType::f32, kGpu), "b2");

    ComputeGraph graph;
    Var x = graph.input(Tensor::normal({64, 20}, 0.0, 1.0, gen, DType::f32, kGpu), "x");
    Var y = graph.input(random_labels(64, 10, gen, kGpu), "labels");
    Var h = relu(linear(x, graph.parameter(w1), graph.parameter(b1)));
    h.name("h");
    Var logits = linear(h, graph.parameter(w2), graph.parameter(b2));
    Var loss = cross_entropy(logits, y);
    CHECK(loss.device() == kGpu);

    SECTION("after a backward with retain_grads") {
        graph.backward(loss, BackwardOptions{.retain_grads = true});
        const VerifyReport report = verify(graph, loss);
        INFO(report.summary() << "\n" << report.table());
        CHECK(report.pass);
        CHECK(report.first_divergence == -1);
        CHECK(report.tolerance == kTolerance);
        CHECK(report.nodes.size() == 10);
        for (const NodeCheck& node : report.nodes) {
            INFO(node.name);
            CHECK(node.pass);
        }
        CHECK(w1.grad().device() == kGpu);
        CHECK(w1.grad().shape() == Shape{32, 20});
    }
    SECTION("verify runs the backward itself") {
        const VerifyReport report = verify(graph, loss);
        INFO(report.summary());
        CHECK(report.pass);
        CHECK(h.grad().shape() == Shape{64, 32});
    }
}
