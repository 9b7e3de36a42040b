// The side lane (cuda/runtime.h, set_weight_gradient_overlap; cuda/context.h): small weight gradients of linear
// and conv2d run on a second stream beside the rest of the backward sweep. The results must be the one-stream
// results bit for bit, whatever reads a weight gradient inside the sweep (a parameter recorded twice, a Var used
// twice, a weight computed from a parameter, the readiness callback), in f32 and under bf16 autocast; a sweep
// that throws leaves no work pending; a captured step's graph gets parallel branches (a longest chain shorter
// than its node count), and without the lane it is one chain.
//
// Without a CUDA device (or in a CPU-only build) the executable prints why and exits 77 (CTest: skipped).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

const Device kGpu = Device::cuda(0);

// Deterministic mode for one test: cuDNN's searched algorithms may otherwise add with atomics, and two runs
// would differ with or without the lane.
struct Deterministic {
    bool previous = cuda::deterministic();
    Deterministic() { cuda::set_deterministic(true); }
    ~Deterministic() { cuda::set_deterministic(previous); }
};

// Sets the overlap mode for one test.
struct Overlap {
    cuda::WeightGradientOverlap previous = cuda::weight_gradient_overlap();
    explicit Overlap(cuda::WeightGradientOverlap mode) { cuda::set_weight_gradient_overlap(mode); }
    ~Overlap() { cuda::set_weight_gradient_overlap(previous); }
};

Tensor labels_on_gpu(std::int64_t n, std::int64_t classes, Generator& gen) {
    std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
    for (auto& label : labels) label = static_cast<std::int64_t>(gen.engine()() % static_cast<std::uint64_t>(classes));
    return Tensor::from_vector(labels, {n}).to(kGpu);
}

// Parameters of a small convolutional net, fresh random values from `seed`.
struct Net {
    std::vector<Parameter> params;
    Net(std::uint64_t seed) {
        Generator gen(seed);
        const auto make = [&](const char* name, Shape shape, double scale) {
            params.emplace_back(Tensor::normal(shape, 0.0, scale, gen).to(kGpu), name);
        };
        make("conv1.w", {6, 1, 5, 5}, 0.2);
        make("conv1.b", {6}, 0.1);
        make("conv2.w", {16, 6, 5, 5}, 0.08);
        make("conv2.b", {16}, 0.1);
        make("fc1.w", {64, 256}, 0.06);
        make("fc1.b", {64}, 0.1);
        make("shared.w", {64, 64}, 0.12);
        make("shared.b", {64}, 0.1);
        make("derived.w", {10, 64}, 0.12);
        make("out.b", {10}, 0.1);
    }
};

struct Result {
    std::vector<std::vector<double>> grads;  // per parameter, after backward()
    std::vector<std::vector<double>> ready;  // what the readiness callback read, in its order
    double loss = 0;
};

// One forward + backward. `shared.w` is used through one Var twice and recorded again as a second leaf;
// `derived.w` reaches its linear through a mul (the weight is not a leaf).
Result run(const Net& net, std::span<const Tensor> batch, DType precision) {
    const std::vector<Parameter>& p = net.params;
    for (Parameter param : p) param.zero_grad();  // copies share the state
    ComputeGraph graph;
    Result out;
    Var loss;
    {
        const AutocastGuard autocast(precision);  // f32: off
        const Conv2dOptions relu{.activation = Activation::Relu};
        Var h = conv2d(graph.input(batch[0], "x"), graph.parameter(p[0]), graph.parameter(p[1]), relu);
        h = max_pool2d(h, {2, 2});
        h = max_pool2d(conv2d(h, graph.parameter(p[2]), graph.parameter(p[3]), relu), {2, 2});
        h = linear(flatten(h), graph.parameter(p[4]), graph.parameter(p[5]), Activation::Relu);
        const Var shared_w = graph.parameter(p[6]), shared_b = graph.parameter(p[7]);
        h = linear(h, shared_w, shared_b, Activation::Relu);
        h = linear(h, shared_w, shared_b, Activation::Relu);
        h = linear(h, graph.parameter(p[6]), graph.parameter(p[7]), Activation::Relu);  // a second leaf
        const Var derived = graph.parameter(p[8]) * graph.constant(Tensor::full({10, 64}, 0.5, DType::f32, kGpu));
        loss = cross_entropy(linear(h, derived, graph.parameter(p[9])), graph.input(batch[1], "labels"));
    }
    out.loss = loss.value().item();
    graph.backward(loss, {.on_parameter_ready = [&](const Parameter& param) {
                              out.ready.push_back(param.grad().to_vector());
                          }});
    for (const Parameter& param : p) out.grads.push_back(param.grad().to_vector());
    return out;
}

std::vector<Tensor> batch(std::uint64_t seed) {
    Generator gen(seed);
    return {Tensor::uniform({32, 1, 28, 28}, -1, 1, gen).to(kGpu), labels_on_gpu(32, 10, gen)};
}

}  // namespace

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "side-lane tests"); }

TEST_CASE("weight gradients on the side lane equal the one-stream gradients bit for bit, however the sweep reads "
          "them", "[gpu][side_lane]") {
    const Deterministic deterministic;
    const Net net(11);
    for (const DType precision : {DType::f32, DType::bf16}) {
        INFO("precision " << dtype_name(precision));
        for (std::uint64_t seed : {1u, 2u}) {
            const std::vector<Tensor> data = batch(seed);
            Result inline_result, lane_result;
            {
                const Overlap never(cuda::WeightGradientOverlap::never);
                inline_result = run(net, data, precision);
            }
            {
                const Overlap always(cuda::WeightGradientOverlap::always);
                lane_result = run(net, data, precision);
                // After backward() nothing of this thread's lane is pending: the gradients are final.
                for (const Parameter& param : net.params) CHECK_FALSE(cuda::side_lane_pending(param.grad()));
            }
            CHECK(lane_result.loss == inline_result.loss);
            REQUIRE(lane_result.grads.size() == inline_result.grads.size());
            for (std::size_t i = 0; i < net.params.size(); ++i) {
                INFO(net.params[i].name());
                CHECK(lane_result.grads[i] == inline_result.grads[i]);
                CHECK_FALSE(lane_result.grads[i].empty());
            }
            CHECK(lane_result.ready == inline_result.ready);
            CHECK(lane_result.ready.size() == net.params.size());
        }
    }
}

TEST_CASE("a sweep that throws after side-lane work joins the lane; the next backward is right",
          "[gpu][side_lane]") {
    const Deterministic deterministic;
    const Overlap always(cuda::WeightGradientOverlap::always);
    Generator gen(5);
    const Tensor x = Tensor::normal({16, 48}, 0.0, 1.0, gen).to(kGpu);
    const Tensor w = Tensor::normal({24, 48}, 0.0, 0.2, gen).to(kGpu);
    const Tensor b = Tensor::normal({24}, 0.0, 0.1, gen).to(kGpu);
    Tensor scale = Tensor::uniform({16, 48}, 0.5, 1.5, gen).to(kGpu);
    const auto gradient_of_w = [&](bool modify_after_forward) {
        const Parameter pw(w.clone(), "w");
        ComputeGraph graph;
        const Var xv = graph.input(x, "x", true);
        // The sweep visits linear (dw on the lane) first, then the mul, whose saved input may have changed.
        const Var loss = sum(linear(xv * graph.constant(scale), graph.parameter(pw), graph.constant(b)));
        if (modify_after_forward) scale.fill(1.25);
        graph.backward(loss);
        return pw.grad().to_vector();
    };
    CHECK_THROWS_AS(gradient_of_w(true), GraphError);
    CHECK_FALSE(cuda::side_lane_pending(x));
    cuda::synchronize(0);  // nothing failed on the device
    const std::vector<double> lane = gradient_of_w(false);
    std::vector<double> one_stream;
    {
        const Overlap never(cuda::WeightGradientOverlap::never);
        one_stream = gradient_of_w(false);
    }
    CHECK(lane == one_stream);
}

namespace {

// A captured SGD step of the net above (f32); the graph's counts after warm-up, capture and one replay.
cuda::CapturedStep::GraphCounts captured_counts(cuda::WeightGradientOverlap mode, std::vector<double>* first_weight) {
    const Overlap overlap(mode);
    const Net net(3);
    SGD opt(net.params, SgdOptions{.lr = 0.01});
    const std::vector<Tensor> data = batch(9);
    cuda::CapturedStep plain([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        const std::vector<Parameter>& p = net.params;
        const Conv2dOptions relu{.activation = Activation::Relu};
        Var h = conv2d(graph.input(in[0], "x"), graph.parameter(p[0]), graph.parameter(p[1]), relu);
        h = max_pool2d(h, {2, 2});
        h = max_pool2d(conv2d(h, graph.parameter(p[2]), graph.parameter(p[3]), relu), {2, 2});
        h = linear(flatten(h), graph.parameter(p[4]), graph.parameter(p[5]), Activation::Relu);
        h = linear(h, graph.parameter(p[6]), graph.parameter(p[7]), Activation::Relu);
        const Var loss = cross_entropy(linear(h, graph.parameter(p[8]), graph.parameter(p[9])), graph.input(in[1]));
        graph.backward(loss, {.free_values = true});
        opt.step();
        opt.zero_grad();
        return loss.value();
    });
    for (int run = 0; run < 3; ++run) plain.run(data);  // warm-up, capture, replay
    cuda::synchronize(0);
    if (first_weight) *first_weight = net.params[0].value().to_vector();
    return plain.last_graph_counts();
}

}  // namespace

TEST_CASE("a captured step with the side lane has parallel branches and trains exactly as one stream",
          "[gpu][side_lane][capture]") {
    const Deterministic deterministic;
    std::vector<double> with_lane, without_lane;
    const cuda::CapturedStep::GraphCounts lane = captured_counts(cuda::WeightGradientOverlap::captured, &with_lane);
    const cuda::CapturedStep::GraphCounts chain = captured_counts(cuda::WeightGradientOverlap::never, &without_lane);
    INFO("lane: " << lane.kernels << " kernels, longest chain " << lane.longest_chain << "; one stream: "
                  << chain.kernels << " kernels, longest chain " << chain.longest_chain);
    CHECK(lane.kernels == chain.kernels);
    CHECK(chain.longest_chain == chain.kernels + chain.memsets + chain.memcpys);
    // Five weight gradients leave the chain (two convolutions, three linear layers, the last of which the
    // optimizer waits for anyway): at least three kernels shorter.
    CHECK(lane.longest_chain + 3 <= chain.longest_chain);
    CHECK(with_lane == without_lane);  // after warm-up, capture and a replay: bit for bit
}
