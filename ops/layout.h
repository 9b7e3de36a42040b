// Layout: transpose, reshape, flatten, narrow, concat, permute, expand, stack, split (ops that move or
// re-view elements, no arithmetic), and the indexing built on them: select, squeeze, unsqueeze. CPU:
// ops/layout.cpp. GPU: ops/layout.cu. Reshape is metadata only, the same on every backend.
// Each function has a Var form (recorded) and a Tensor form (eager: no graph, no gradient; graph/eager.h).
// On Tensors, reshape, flatten, squeeze and unsqueeze return views (the same storage: a write through one is
// seen by the other); transpose, narrow, select, concat, permute, expand and stack return copies (storage is
// contiguous, with no offset or strides, so a slice cannot be a view). Tensor has the same as methods:
// t.select(0, 3).
#pragma once
#include <cstdint>
#include <source_location>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

// Swaps two axes (default: the last two).
Var transpose(const Var& x, std::int64_t axis0 = -2, std::int64_t axis1 = -1,
              std::source_location where = std::source_location::current());
Tensor transpose(const Tensor& x, std::int64_t axis0 = -2, std::int64_t axis1 = -1,
                 std::source_location where = std::source_location::current());
// Same elements, new shape; one dimension may be -1 (inferred).
Var reshape(const Var& x, const Shape& shape, std::source_location where = std::source_location::current());
Tensor reshape(const Tensor& x, const Shape& shape, std::source_location where = std::source_location::current());
// Composite: (N, ...) -> (N, prod(...)).
Var flatten(const Var& x, std::source_location where = std::source_location::current());
Tensor flatten(const Tensor& x, std::source_location where = std::source_location::current());
// Axes start_axis..end_axis (inclusive, negative from the end) merged into one, as torch.flatten; a rank-0
// tensor becomes (1). ShapeError for an axis out of range or start after end.
Var flatten(const Var& x, std::int64_t start_axis, std::int64_t end_axis = -1,
            std::source_location where = std::source_location::current());
Tensor flatten(const Tensor& x, std::int64_t start_axis, std::int64_t end_axis = -1,
               std::source_location where = std::source_location::current());
// Indices [start, start + length) of `axis`: x (..., n, ...) -> (..., length, ...). Any dtype.
Var narrow(const Var& x, std::int64_t axis, std::int64_t start, std::int64_t length,
           std::source_location where = std::source_location::current());
Tensor narrow(const Tensor& x, std::int64_t axis, std::int64_t start, std::int64_t length,
              std::source_location where = std::source_location::current());
// Index `index` of `axis` (negative from the end), the axis removed: x (..., n, ...) -> (...). narrow + reshape.
// IndexError for an index outside [-n, n), ShapeError for an axis out of range. Any dtype.
Var select(const Var& x, std::int64_t axis, std::int64_t index,
           std::source_location where = std::source_location::current());
Tensor select(const Tensor& x, std::int64_t axis, std::int64_t index,
              std::source_location where = std::source_location::current());
// Removes `axis`, which must have size 1 (ShapeError otherwise; PyTorch would silently do nothing).
Var squeeze(const Var& x, std::int64_t axis, std::source_location where = std::source_location::current());
Tensor squeeze(const Tensor& x, std::int64_t axis, std::source_location where = std::source_location::current());
// Inserts a size-1 axis at `axis` in [-(rank+1), rank] (negative counts from the end of the result).
Var unsqueeze(const Var& x, std::int64_t axis, std::source_location where = std::source_location::current());
Tensor unsqueeze(const Tensor& x, std::int64_t axis, std::source_location where = std::source_location::current());
// Joins one or more tensors of one dtype along `axis`; their shapes agree on every other axis.
Var concat(const std::vector<Var>& xs, std::int64_t axis = 0,
           std::source_location where = std::source_location::current());
Tensor concat(const std::vector<Tensor>& xs, std::int64_t axis = 0,
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
