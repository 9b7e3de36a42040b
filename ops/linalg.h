// Matrix products. CPU: ops/linalg.cpp (Eigen). GPU: ops/linalg.cu (cuBLAS, cuBLASLt). Layout ops: ops/layout.h.
#pragma once
#include <source_location>
#include <vector>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

// (M,K)@(K,N) -> (M,N); batched (B,M,K)@(B,K,N) -> (B,M,N).
Var matmul(const Var& a, const Var& b, std::source_location where = std::source_location::current());
Tensor matmul(const Tensor& a, const Tensor& b, std::source_location where = std::source_location::current());
// x (*,in) · weight (out,in)ᵀ + bias (out) -> (*,out), as libtorch: any leading dims, x (in) gives (out); bias
// may be an undefined Var (no bias). The Linear node itself is 2-D: other ranks are reshaped around it.
Var linear(const Var& x, const Var& weight, const Var& bias,
           std::source_location where = std::source_location::current());
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              std::source_location where = std::source_location::current());
// The same followed by `activation`, fused into the linear node (graph/op_def.h): relu(x·weightᵀ + bias) is
// one node whose backward needs only its output. Without a bias: the composite relu(matmul(x, weightᵀ)).
Var linear(const Var& x, const Var& weight, const Var& bias, Activation activation,
           std::source_location where = std::source_location::current());
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation activation,
              std::source_location where = std::source_location::current());
Var linear(const Var& x, const Var& weight, std::source_location where = std::source_location::current());
Tensor linear(const Tensor& x, const Tensor& weight, std::source_location where = std::source_location::current());
}  // namespace dyngrad
