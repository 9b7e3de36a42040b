// Element-wise distances between tensors, shared by the tests that compare one computation with another
// (test_attention, test_elementwise_norm, test_gpu).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

namespace dgtest {

// max |a[i] − b[i]| over the elements of two tensors of the same size (any dtype; read as double).
inline double max_abs_diff(const dyngrad::Tensor& a, const dyngrad::Tensor& b) {
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    REQUIRE(x.size() == y.size());
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    return worst;
}

}  // namespace dgtest
