// The rules of Tensor's indexing methods (select, narrow, squeeze, unsqueeze, flatten; core/tensor.h), which
// the layout ops' composites over Vars and Tensors share (ops/layout.cpp): one text per error, whichever
// form the user called. Internal to the library (not installed).
#pragma once
#include <cstdint>
#include <source_location>
#include <string>
#include <utility>

#include "dyngrad/core/shape.h"
#include "dyngrad/core/tensor.h"

namespace dyngrad {
// A creation site as error messages print it: "model.cpp:42" (core/source_site.cpp; users see it in graph/graph.h).
std::string describe_site(const std::source_location& where);
}  // namespace dyngrad

namespace dyngrad::indexing {

// (axis, index) of select(x, axis, index), both made non-negative: ShapeError for an axis outside [-rank, rank),
// IndexError for an index outside [-n, n), each naming "select at <site>" and x.
std::pair<int, std::int64_t> select_at(const Tensor& x, std::int64_t axis, std::int64_t index,
                                       std::source_location where);
// `shape` without axis `axis` (in [0, rank)).
Shape without_axis(const Shape& shape, int axis);
// x's shape with `axis` removed; ShapeError unless that axis exists and has size 1.
Shape squeezed_shape(const Tensor& x, std::int64_t axis, std::source_location where);
// x's shape with a 1 inserted at `axis` in [-(rank+1), rank]; ShapeError otherwise.
Shape unsqueezed_shape(const Tensor& x, std::int64_t axis, std::source_location where);
// x's shape with axes start..end merged (a rank-0 x counts as (1)); ShapeError for an axis out of range or start
// after end.
Shape flattened_shape(const Tensor& x, std::int64_t start_axis, std::int64_t end_axis, std::source_location where);
// narrow's shape rule (the op's, ops/layout.cpp): `x` with [start, start + length) of `axis`. ShapeError for the
// axis, ValueError for a negative length, IndexError for a window outside the axis; the messages name no call
// (the caller adds it).
Shape narrowed_shape(const Shape& x, std::int64_t axis, std::int64_t start, std::int64_t length);

}  // namespace dyngrad::indexing
