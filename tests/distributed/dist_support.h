// What the distributed tests (test_dist, test_dist_zero, test_dist_zero3, test_dist_gpu) share: a seed every rank
// agrees on, a global batch every rank can rebuild from it, one rank's rows of it, the loss, and the relative L2
// distance the comparisons use.
#pragma once
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dyngrad/distributed/process_group.h"
#include "dyngrad/dyngrad.h"

namespace dgtest {

// The group of this launch (mpirun, torchrun's variables, or a group of one), created once.
inline dyngrad::dist::ProcessGroup& launched_group() {
    static dyngrad::dist::ProcessGroup group = dyngrad::dist::ProcessGroup::init();
    return group;
}

// A seed every rank of `group` agrees on (rank 0's, broadcast), new each run; DYNGRAD_TEST_SEED fixes it (to
// repeat a failure: the tests print theirs).
inline std::uint64_t shared_seed(dyngrad::dist::ProcessGroup& group) {
    const char* fixed = std::getenv("DYNGRAD_TEST_SEED");
    dyngrad::Tensor seed = dyngrad::Tensor::from_vector(
        std::vector<std::int64_t>{fixed ? std::atoll(fixed) : static_cast<std::int64_t>(std::random_device{}() >> 1)}, {1});
    group.broadcast(seed, 0);
    return static_cast<std::uint64_t>(seed.data<std::int64_t>()[0]);
}

struct Rows {
    dyngrad::Tensor x;
    dyngrad::Tensor y;
};

// `rows` samples of shape `sample` uniform in [-1, 1] and labels in [0, classes), drawn from `seed` (the same
// on every rank), on the CPU.
inline Rows global_batch(std::uint64_t seed, const dyngrad::Shape& sample, std::int64_t rows, dyngrad::DType dtype,
                         std::int64_t classes = 5) {
    dyngrad::Generator gen(seed);
    dyngrad::Shape shape{rows};
    shape.insert(shape.end(), sample.begin(), sample.end());
    dyngrad::Tensor x = dyngrad::Tensor::uniform(shape, -1, 1, gen, dtype);
    std::vector<std::int64_t> labels;
    for (std::int64_t i = 0; i < rows; ++i)
        labels.push_back(static_cast<std::int64_t>(gen.engine()() % static_cast<std::uint64_t>(classes)));
    return {x, dyngrad::Tensor::from_vector(labels, {rows})};
}

// Rows [rank·b, (rank+1)·b) of a global batch of world·b rows.
inline Rows shard(const Rows& b, int rank, int world) {
    const std::int64_t per = b.x.size(0) / world;
    return {b.x.narrow(0, rank * per, per), b.y.narrow(0, rank * per, per)};
}

// The CPU tests' MLP: 12 → 32 → 16 → `classes`, ReLU between, in `dtype`.
inline dyngrad::Sequential make_mlp(dyngrad::Generator& gen, dyngrad::DType dtype, std::int64_t classes) {
    using dyngrad::Activation, dyngrad::Linear;
    dyngrad::Sequential m;
    m.add(Linear(12, 32, true, gen, Activation::Relu)).skip_index();
    m.add(Linear(32, 16, true, gen, Activation::Relu)).skip_index();
    m.add(Linear(16, classes, true, gen));
    m.to(dtype);
    return m;
}

inline dyngrad::Var loss_of(const dyngrad::Sequential& model, dyngrad::ComputeGraph& graph, const Rows& b) {
    return dyngrad::cross_entropy(model(graph.input(b.x)), graph.input(b.y));
}

// ‖a − b‖ / ‖b‖ (b's norm floored at 1e-30).
inline double relative(const std::vector<double>& a, const std::vector<double>& b) {
    double d = 0, n = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        n += b[i] * b[i];
    }
    return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

}  // namespace dgtest
