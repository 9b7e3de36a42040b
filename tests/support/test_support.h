// Small helpers several test files share: float64 tensors from literals, the largest element-wise distance
// between two tensors, and one optimizer step on a quadratic loss.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

namespace dgtest {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline dyngrad::Tensor f64(std::initializer_list<double> values) {
    return dyngrad::Tensor::of(values, dyngrad::DType::f64);
}

// Class indices as a 1-D int64 tensor (the targets of the class losses).
inline dyngrad::Tensor labels(std::vector<std::int64_t> values) {
    const auto n = static_cast<std::int64_t>(values.size());
    return dyngrad::Tensor::from_vector(values, {n});
}

// Standard-normal values of `shape` drawn from a generator seeded with `seed`: the same for the same seed.
inline dyngrad::Tensor randn(const dyngrad::Shape& shape, std::uint64_t seed, dyngrad::DType dtype = dyngrad::DType::f32) {
    dyngrad::Generator gen(seed);
    return dyngrad::Tensor::normal(shape, 0.0, 1.0, gen, dtype);
}

// Standard-normal tensors drawn one after another from one generator seeded once, so a file's draws repeat
// in order from run to run: `dgtest::NormalDraws randn(77, DType::f64);` then `randn({3, 4})`.
class NormalDraws {
public:
    NormalDraws(std::uint64_t seed, dyngrad::DType dtype) : gen_(seed), dtype_(dtype) {}
    dyngrad::Tensor operator()(const dyngrad::Shape& shape) { return (*this)(shape, dtype_); }
    dyngrad::Tensor operator()(const dyngrad::Shape& shape, dyngrad::DType dtype) {
        return dyngrad::Tensor::normal(shape, 0.0, 1.0, gen_, dtype);
    }

private:
    dyngrad::Generator gen_;
    dyngrad::DType dtype_;
};

// max |a[i] − b[i]| over the elements of two tensors of the same size (any dtype; read as double).
inline double max_abs_diff(const dyngrad::Tensor& a, const dyngrad::Tensor& b) {
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    REQUIRE(x.size() == y.size());
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    return worst;
}

// loss = Σ w²/2 over the parameters, so each gradient equals its parameter; then one optimizer step.
inline void quadratic_step(dyngrad::Optimizer& opt, const std::vector<dyngrad::Parameter>& used) {
    dyngrad::ComputeGraph graph;
    dyngrad::Var loss;
    for (const dyngrad::Parameter& p : used) {
        dyngrad::Var w = graph.parameter(p);
        dyngrad::Var term = dyngrad::sum(w * w) * 0.5;
        loss = loss.defined() ? loss + term : term;
    }
    opt.zero_grad();
    graph.backward(loss);
    opt.step();
}

}  // namespace dgtest
