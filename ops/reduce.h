// Reductions. CPU: ops/reduce.cpp. GPU: ops/reduce.cu.
#pragma once
#include <source_location>
#include <vector>

#include "dyngrad/graph/front_door.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/values_indices.h"

namespace dyngrad {

namespace detail {
inline OpAttrs axes_attrs(const std::vector<std::int64_t>& axes, bool keepdim) {
    OpAttrs attrs;
    attrs.axes = axes;
    attrs.keepdim = keepdim;
    return attrs;
}
inline OpAttrs axis_keepdim_attrs(std::int64_t axis, bool keepdim) {
    OpAttrs attrs;
    attrs.axis = axis;
    attrs.keepdim = keepdim;
    return attrs;
}
}  // namespace detail

// Each function is one front door over Var (recorded) and Tensor (eager: no graph, no gradient);
// graph/front_door.h.
// Sum / mean over `axes` (empty: every axis); keepdim keeps reduced axes with size 1. logsumexp: log Σ exp(x) over
// `axes`, computed as m + log Σ exp(x − m) with m the maximum, so nothing overflows; the gradient is the softmax
// over those axes, as PyTorch's logsumexp.
#define DG_AXES_REDUCTION_FRONT_DOOR(name, tag)                                                                        \
    template <Operand T>                                                                                               \
    T name(const T& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false, Loc where = Loc::current()) { \
        return apply_op(OpType::tag, {x}, detail::axes_attrs(axes, keepdim), where);                                   \
    }
DG_AXES_REDUCTION_FRONT_DOOR(sum, Sum)
DG_AXES_REDUCTION_FRONT_DOOR(mean, Mean)
DG_AXES_REDUCTION_FRONT_DOOR(logsumexp, LogSumExp)
#undef DG_AXES_REDUCTION_FRONT_DOOR

// Over one axis: max (the gradient goes to the first maximal element); argmax, argmin: the int64 index of the
// maximum / minimum, ties to the first index and NaN counting as the extreme (PyTorch's and NumPy's rules), not
// differentiable (a Var result never requires grad).
#define DG_AXIS_REDUCTION_FRONT_DOOR(name, tag)                                                      \
    template <Operand T>                                                                             \
    T name(const T& x, std::int64_t axis, bool keepdim = false, Loc where = Loc::current()) {        \
        return apply_op(OpType::tag, {x}, detail::axis_keepdim_attrs(axis, keepdim), where);         \
    }
DG_AXIS_REDUCTION_FRONT_DOOR(max, Max)
DG_AXIS_REDUCTION_FRONT_DOOR(argmax, ArgMax)
DG_AXIS_REDUCTION_FRONT_DOOR(argmin, ArgMin)
#undef DG_AXIS_REDUCTION_FRONT_DOOR

// Minimum over one axis: the composite -max(-x) (exact); the gradient goes to the first minimal element.
template <Operand T>
T min(const T& x, std::int64_t axis, bool keepdim = false,
      std::source_location where = std::source_location::current()) {
    return neg(max(neg(x, where), axis, keepdim, where), where);
}
// PyTorch's max(x, dim) / min(x, dim): the values (differentiable, as max/min above) and their int64 indices
// (as argmax/argmin: the first extreme, NaN counting as one), so `auto [values, indices] = max_with_indices(x, 1);`.
// Two nodes: argmax runs through the max op's kernels, so the index is the element max's gradient goes to.
template <Operand T>
ValuesAndIndices<T> max_with_indices(const T& x, std::int64_t axis, bool keepdim = false,
                                     std::source_location where = std::source_location::current()) {
    return {max(x, axis, keepdim, where), argmax(x, axis, keepdim, where)};
}
template <Operand T>
ValuesAndIndices<T> min_with_indices(const T& x, std::int64_t axis, bool keepdim = false,
                                     std::source_location where = std::source_location::current()) {
    return {min(x, axis, keepdim, where), argmin(x, axis, keepdim, where)};
}

}  // namespace dyngrad
