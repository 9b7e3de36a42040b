// Shared by test_dist_zero3.cpp and test_dist_zero3_keep.cpp (one binary): the units, batches and losses of the
// ZeRO-3 tests, and the single-process reference.
#pragma once
#include <cstdint>
#include <vector>

#include "dist_support.h"
#include "dyngrad/distributed/process_group.h"
#include "dyngrad/distributed/zero.h"
#include "dyngrad/dyngrad.h"

namespace zero3test {

using namespace dyngrad;
using dgtest::Rows;

inline dist::ProcessGroup& group() { return dgtest::launched_group(); }

constexpr AdamOptions kAdam{.lr = 3e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.05};

// One unit per layer. The MLP has 1063 trainable elements in units of 416, 528 and 119: 2 divides only the first
// two, 3 none.
inline std::vector<dist::ZeroUnit> mlp_units(Generator& gen, DType dtype) {
    std::vector<dist::ZeroUnit> units;
    const std::int64_t widths[] = {12, 32, 16, 7};
    for (int i = 0; i < 3; ++i) {
        Linear layer(widths[i], widths[i + 1], true, gen, i < 2 ? Activation::Relu : Activation::None);
        layer.to(dtype);
        units.push_back({str("fc", i), layer, [layer](const Var& x) { return layer(x); }});
    }
    return units;
}

// (B, T, 6) -> input projection to E = 8, two pre-LN transformer blocks (2 heads, causal), a head to 1 feature.
inline std::vector<dist::ZeroUnit> transformer_units(Generator& gen, DType dtype) {
    std::vector<dist::ZeroUnit> units;
    Linear in(6, 8, true, gen);
    in.to(dtype);
    units.push_back({"embed", in, [in](const Var& x) { return in(x); }});
    for (int i = 0; i < 2; ++i) {
        TransformerBlock block(8, 2, gen);
        block.to(dtype);
        units.push_back({str("block", i), block, [block](const Var& x) { return block(x); }});
    }
    Linear head(8, 1, true, gen);
    head.to(dtype);
    units.push_back({"head", head, [head](const Var& x) { return head(x); }});
    return units;
}

// The reference: the same units run directly (the whole model on one process).
inline Var run_units(const std::vector<dist::ZeroUnit>& units, Var x) {
    for (const auto& unit : units) x = unit.forward(x);
    return x;
}

inline std::vector<Parameter> parameters_of(const std::vector<dist::ZeroUnit>& units) {
    std::vector<Parameter> all;
    for (const auto& unit : units)
        for (const Parameter& p : unit.module.parameters()) all.push_back(p);
    return all;
}

using UnitsFactory = std::vector<dist::ZeroUnit> (*)(Generator&, DType);
using LossFn = Var (*)(const Var& out, const Var& target);

inline Var classify(const Var& out, const Var& labels) { return cross_entropy(out, labels); }
inline Var regress(const Var& out, const Var& target) { return mse_loss(out, target); }

struct Pair {
    Tensor x, y;
};
inline Pair mlp_batch(std::uint64_t seed, std::int64_t rows) {
    const Rows r = dgtest::global_batch(seed, {12}, rows, DType::f64, 7);
    return {r.x, r.y};
}
inline Pair sequence_batch(std::uint64_t seed, std::int64_t rows) {
    Generator gen(seed);
    return {Tensor::uniform({rows, 5, 6}, -1, 1, gen, DType::f64), Tensor::uniform({rows, 5, 1}, -1, 1, gen, DType::f64)};
}
inline Pair rows_of(const Pair& b, int rank, int world) {
    const std::int64_t per = b.x.size(0) / world;
    return {b.x.narrow(0, rank * per, per), b.y.narrow(0, rank * per, per)};
}

}  // namespace zero3test
