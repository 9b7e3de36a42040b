// matmul's dims, shared by the Eigen kernels (ops/linalg.cpp) and the cuBLAS launchers (ops/linalg.cu).
#pragma once
#include <cstdint>

#include "dyngrad/core/tensor.h"

namespace dyngrad {

// (B,M,K)@(B,K,N); B = 1 for 2-D operands (infer::matmul admits only these two forms).
struct MatmulDims {
    std::int64_t batch, m, k, n;
};

inline MatmulDims matmul_dims(const Tensor& a, const Tensor& b) {
    const Shape& sa = a.shape();
    const Shape& sb = b.shape();
    const std::size_t r = sa.size();
    return {r == 3 ? sa[0] : 1, sa[r - 2], sa[r - 1], sb[r - 1]};
}

}  // namespace dyngrad
