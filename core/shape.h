// Shapes: dims of a contiguous row-major tensor, rank 0 (a scalar) and up.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dyngrad {

using Shape = std::vector<std::int64_t>;

// ValueError for a negative dim, ShapeError when the count does not fit int64 (core/checked.h).
std::int64_t numel(const Shape& shape);
std::string to_string(const Shape& shape);  // "(64,784)"; a scalar prints "()"
// Row-major strides in elements.
std::vector<std::int64_t> contiguous_strides(const Shape& shape);
// NumPy broadcasting; throws ShapeError naming both shapes when they do not broadcast or their result
// has more elements than int64 can count.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Maps a possibly negative axis into [0, rank); throws ShapeError if out of range.
int normalize_axis(std::int64_t axis, std::size_t rank);

}  // namespace dyngrad
