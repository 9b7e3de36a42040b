// Matrix products and layout. CPU: ops/linalg.cpp (Eigen). GPU: ops/linalg.cu (cuBLAS, cuBLASLt).
#pragma once
#include <source_location>
#include <vector>

#include "dyngrad/graph/graph.h"

namespace dyngrad {

// (M,K)@(K,N) -> (M,N); batched (B,M,K)@(B,K,N) -> (B,M,N).
Var matmul(const Var& a, const Var& b, std::source_location where = std::source_location::current());
// x (N,in) · weight (out,in)ᵀ + bias (out) -> (N,out); bias may be an undefined Var (no bias).
Var linear(const Var& x, const Var& weight, const Var& bias,
           std::source_location where = std::source_location::current());
// The same followed by `activation`, fused into the linear node (graph/op_def.h): relu(x·weightᵀ + bias) is
// one node whose backward needs only its output. Without a bias: the composite relu(matmul(x, weightᵀ)).
Var linear(const Var& x, const Var& weight, const Var& bias, Activation activation,
           std::source_location where = std::source_location::current());
Var linear(const Var& x, const Var& weight, std::source_location where = std::source_location::current());
// Swaps two axes (default: the last two).
Var transpose(const Var& x, std::int64_t axis0 = -2, std::int64_t axis1 = -1,
              std::source_location where = std::source_location::current());
// Same elements, new shape; one dimension may be -1 (inferred).
Var reshape(const Var& x, const Shape& shape, std::source_location where = std::source_location::current());
// Composite: (N, ...) -> (N, prod(...)).
Var flatten(const Var& x, std::source_location where = std::source_location::current());
// Indices [start, start + length) of `axis`: x (..., n, ...) -> (..., length, ...). Any dtype.
Var narrow(const Var& x, std::int64_t axis, std::int64_t start, std::int64_t length,
           std::source_location where = std::source_location::current());
// Joins one or more tensors of one dtype along `axis`; their shapes agree on every other axis.
Var concat(const std::vector<Var>& xs, std::int64_t axis = 0,
           std::source_location where = std::source_location::current());

}  // namespace dyngrad
