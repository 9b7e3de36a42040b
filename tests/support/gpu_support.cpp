// The helpers of tests/support/gpu_support.h.
#include "gpu_support.h"

#include <cstdlib>
#include <random>

using namespace dyngrad;

namespace dgtest::gpu {

std::string describe_result(const CheckResult& r) {
    return str(r.check, " of ", r.op, " '", r.case_label, "' shapes ", r.shapes, ": max rel err ", r.max_rel_err,
               " (tolerance ", r.tolerance, "), max abs err ", r.max_abs_err, ", gpu ", r.gpu_ms, " ms, cpu ",
               r.cpu_ms, " ms, ", r.detail);
}

bool under_sanitizer() { return std::getenv("DYNGRAD_UNDER_SANITIZER") != nullptr; }

Tensor random_labels(std::int64_t n, std::int64_t classes, Generator& gen, Device device) {
    std::uniform_int_distribution<std::int64_t> dist(0, classes - 1);
    std::vector<std::int64_t> values(static_cast<std::size_t>(n));
    for (auto& v : values) v = dist(gen.engine());
    return Tensor::from_vector(values, {n}, device);
}

namespace {

std::vector<Parameter> model_parameters(bool cnn, std::uint64_t seed) {
    Generator gen(seed);
    auto t = [&](const Shape& shape) { return Tensor::normal(shape, 0.0, 0.3, gen).to(kGpu); };
    if (cnn) return {Parameter(t({4, 3, 3, 3}), "conv.w"), Parameter(t({4}), "conv.b"),
                     Parameter(t({10, 4 * 4 * 4}), "fc.w"), Parameter(t({10}), "fc.b")};
    return {Parameter(t({32, 20}), "w1"), Parameter(t({32}), "b1"), Parameter(t({10, 32}), "w2"),
            Parameter(t({10}), "b2")};
}

}  // namespace

Model::Model(bool cnn, std::uint64_t seed)
    : cnn(cnn), params(model_parameters(cnn, seed)), optimizer(params, {.lr = 0.05, .momentum = 0.9}) {}

Var Model::forward(ComputeGraph& graph, const Var& x) const {
    auto p = [&](std::size_t i) { return graph.parameter(params[i]); };
    if (!cnn) return linear(relu(linear(x, p(0), p(1))), p(2), p(3));
    Var h = max_pool2d(relu(conv2d(x, p(0), p(1), {.padding = {1, 1}})), {2, 2});
    return linear(flatten(h), p(2), p(3));
}

Tensor Model::step(std::span<const Tensor> in) {
    ComputeGraph graph;
    Var loss = cross_entropy(forward(graph, graph.input(in[0])), graph.input(in[1]));
    graph.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    return loss.value();
}

std::vector<Tensor> model_batch(bool cnn, std::int64_t rows, std::uint64_t seed) {
    Generator gen(seed);
    const Shape x_shape = cnn ? Shape{rows, 3, 8, 8} : Shape{rows, 20};
    return {Tensor::normal(x_shape, 0.0, 1.0, gen).to(kGpu), random_labels(rows, 10, gen, kGpu)};
}

}  // namespace dgtest::gpu
