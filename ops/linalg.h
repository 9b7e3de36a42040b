// Matrix products. CPU: ops/linalg.cpp (Eigen). GPU: ops/linalg.cu (cuBLAS, cuBLASLt). Layout ops: ops/layout.h.
#pragma once
#include <source_location>
#include <vector>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// One front door per function over Var (recorded) and Tensor (eager); graph/front_door.h.
// (M,K)@(K,N) -> (M,N); batched (B,M,K)@(B,K,N) -> (B,M,N).
template <Operand T>
T matmul(const T& a, const T& b, std::source_location where = std::source_location::current()) {
    return apply_op(OpType::Matmul, {a, b}, {}, where);
}
// x (*,in) · weight (out,in)ᵀ + bias (out) -> (*,out), as libtorch: any leading dims, x (in) gives (out); bias
// may be undefined (no bias). The Linear node itself is 2-D: other ranks are reshaped around it. `activation` is
// fused into the linear node (graph/op_def.h): relu(x·weightᵀ + bias) is one node whose backward needs only its
// output. Without a bias: the composite relu(matmul(x, weightᵀ)).
template <Operand T>
T linear(const T& x, const T& weight, const T& bias, Activation activation,
         std::source_location where = std::source_location::current());
template <Operand T>
T linear(const T& x, const T& weight, const T& bias, std::source_location where = std::source_location::current()) {
    return linear(x, weight, bias, Activation::None, where);
}
template <Operand T>
T linear(const T& x, const T& weight, std::source_location where = std::source_location::current()) {
    return linear(x, weight, T(), Activation::None, where);
}

}  // namespace dyngrad
