// Layout: transpose, reshape, flatten, narrow, concat, permute, expand, stack, split (ops that move or
// re-view elements, no arithmetic), and the indexing built on them: select, squeeze, unsqueeze. CPU:
// ops/layout.cpp. GPU: ops/layout.cu. Reshape is metadata only, the same on every backend.
// Each function is one front door over its operand type (graph/front_door.h): Var (recorded) or Tensor (eager:
// no graph, no gradient).
// On Tensors, reshape, flatten, squeeze and unsqueeze return views (the same storage: a write through one is
// seen by the other); transpose, narrow, select, concat, permute, expand and stack return copies (storage is
// contiguous, with no offset or strides, so a slice cannot be a view). Tensor has the same as methods (core's,
// core/tensor_indexing.cpp: the same rules and errors, outside the op dispatch): t.select(0, 3).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <source_location>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// Swaps two axes (default: the last two).
template <Operand T>
T transpose(const T& x, std::int64_t axis0 = -2, std::int64_t axis1 = -1, Loc where = Loc::current()) {
    return apply_op(OpType::Transpose, {x}, op_attrs(&OpAttrs::axes, std::vector<std::int64_t>{axis0, axis1}), where);
}
// Same elements, new shape; one dimension may be -1 (inferred).
template <Operand T>
T reshape(const T& x, const Shape& shape, Loc where = Loc::current()) {
    return apply_op(OpType::Reshape, {x}, op_attrs(&OpAttrs::shape, shape), where);
}
// Composite: (N, ...) -> (N, prod(...)).
template <Operand T>
T flatten(const T& x, Loc where = Loc::current());
// Axes start_axis..end_axis (inclusive, negative from the end) merged into one, as torch.flatten; a rank-0
// tensor becomes (1). ShapeError for an axis out of range or start after end.
template <Operand T>
T flatten(const T& x, std::int64_t start_axis, std::int64_t end_axis = -1, Loc where = Loc::current());
// Indices [start, start + length) of `axis`: x (..., n, ...) -> (..., length, ...). Any dtype.
template <Operand T>
T narrow(const T& x, std::int64_t axis, std::int64_t start, std::int64_t length, Loc where = Loc::current()) {
    return apply_op(OpType::Narrow, {x},
                    op_attrs(&OpAttrs::axis, axis, &OpAttrs::start, start, &OpAttrs::length, length), where);
}
// Index `index` of `axis` (negative from the end), the axis removed: x (..., n, ...) -> (...). narrow + reshape.
// IndexError for an index outside [-n, n), ShapeError for an axis out of range. Any dtype.
template <Operand T>
T select(const T& x, std::int64_t axis, std::int64_t index, Loc where = Loc::current());
// Removes `axis`, which must have size 1 (ShapeError otherwise; PyTorch would silently do nothing).
template <Operand T>
T squeeze(const T& x, std::int64_t axis, Loc where = Loc::current());
// Inserts a size-1 axis at `axis` in [-(rank+1), rank] (negative counts from the end of the result).
template <Operand T>
T unsqueeze(const T& x, std::int64_t axis, Loc where = Loc::current());
// Joins one or more tensors of one dtype along `axis`; their shapes agree on every other axis.
template <Operand T>
T concat(const std::vector<T>& xs, std::int64_t axis = 0, Loc where = Loc::current());

// Reorders the axes: y.shape[i] = x.shape[dims[i]]; dims is a permutation of the axes (negatives count from
// the end). A copy. Any dtype; rank <= 16.
template <Operand T>
T permute(const T& x, const std::vector<std::int64_t>& dims, Loc where = Loc::current()) {
    return apply_op(OpType::Permute, {x}, op_attrs(&OpAttrs::axes, dims), where);
}
// Broadcasts x to `shape` (PyTorch's expand): new leading axes, size-1 axes stretched, -1 keeps x's size.
// A copy; the gradient is dy summed back to x's shape. Any dtype; rank <= 16.
template <Operand T>
T expand(const T& x, const Shape& shape, Loc where = Loc::current()) {
    return apply_op(OpType::Expand, {x}, op_attrs(&OpAttrs::shape, shape), where);
}
// Composite: joins tensors of one shape along a new axis `axis` in [-(rank+1), rank] (each reshaped with a
// 1 inserted, then concat).
template <Operand T>
T stack(const std::vector<T>& xs, std::int64_t axis = 0, Loc where = Loc::current());
// The braced forms of the two: concat({a, b}, 1), stack({a, b}).
template <Operand T>
T concat(std::initializer_list<T> xs, std::int64_t axis = 0, Loc where = Loc::current()) {
    return concat(std::vector<T>(xs), axis, where);
}
template <Operand T>
T stack(std::initializer_list<T> xs, std::int64_t axis = 0, Loc where = Loc::current()) {
    return stack(std::vector<T>(xs), axis, where);
}
// Composite: consecutive pieces of `size` along `axis` (the last one shorter when size does not divide the
// axis), each a narrow (a copy). size >= 1; an empty axis gives one empty piece, as in PyTorch.
template <Operand T>
std::vector<T> split(const T& x, std::int64_t size, std::int64_t axis = 0, Loc where = Loc::current());
// Composite: pieces of the given sizes along `axis`; they must add up to the axis' size.
template <Operand T>
std::vector<T> split_with_sizes(const T& x, const std::vector<std::int64_t>& sizes, std::int64_t axis = 0,
                                Loc where = Loc::current());

}  // namespace dyngrad
