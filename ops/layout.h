// Layout: transpose, reshape, flatten, narrow, concat, permute, expand, stack, split (ops that move or
// re-view elements, no arithmetic). CPU: ops/layout.cpp. GPU: ops/layout.cu. Reshape is metadata only,
// the same on every backend; every other op here copies (no strided views).
#pragma once
#include <cstdint>
#include <source_location>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

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

// Reorders the axes: y.shape[i] = x.shape[dims[i]]; dims is a permutation of the axes (negatives count from
// the end). A copy. Any dtype; rank <= 16.
Var permute(const Var& x, const std::vector<std::int64_t>& dims,
            std::source_location where = std::source_location::current());
Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims,
               std::source_location where = std::source_location::current());
// Broadcasts x to `shape` (PyTorch's expand): new leading axes, size-1 axes stretched, -1 keeps x's size.
// A copy; the gradient is dy summed back to x's shape. Any dtype; rank <= 16.
Var expand(const Var& x, const Shape& shape, std::source_location where = std::source_location::current());
Tensor expand(const Tensor& x, const Shape& shape, std::source_location where = std::source_location::current());
// Composite: joins tensors of one shape along a new axis `axis` in [-(rank+1), rank] (each reshaped with a
// 1 inserted, then concat).
Var stack(const std::vector<Var>& xs, std::int64_t axis = 0,
          std::source_location where = std::source_location::current());
Tensor stack(const std::vector<Tensor>& xs, std::int64_t axis = 0,
             std::source_location where = std::source_location::current());
// Composite: consecutive pieces of `size` along `axis` (the last one shorter when size does not divide the
// axis), each a narrow (a copy). size >= 1; an empty axis gives one empty piece, as in PyTorch.
std::vector<Var> split(const Var& x, std::int64_t size, std::int64_t axis = 0,
                       std::source_location where = std::source_location::current());
std::vector<Tensor> split(const Tensor& x, std::int64_t size, std::int64_t axis = 0,
                          std::source_location where = std::source_location::current());
// Composite: pieces of the given sizes along `axis`; they must add up to the axis' size.
std::vector<Var> split_with_sizes(const Var& x, const std::vector<std::int64_t>& sizes, std::int64_t axis = 0,
                                  std::source_location where = std::source_location::current());
std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t axis = 0,
                                     std::source_location where = std::source_location::current());

}  // namespace dyngrad
