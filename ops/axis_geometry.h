// A tensor seen around one axis as (outer, size, inner): `outer` slices, each `size` runs of `inner`
// contiguous elements. The one host computation of that split for every family and both backends (narrow,
// concat, index_select, max/argmax, softmax); kernels receive the struct by value.
#pragma once
#include <cstdint>

#include "dyngrad/core/shape.h"

namespace dyngrad {

struct AxisSplit {
    std::int64_t outer = 1, size = 1, inner = 1;
};

// `axis` already normalised (normalize_axis) to [0, rank).
inline AxisSplit split_at_axis(const Shape& shape, int axis) {
    AxisSplit s;
    for (int i = 0; i < axis; ++i) s.outer *= shape[i];
    s.size = shape[axis];
    for (std::size_t i = static_cast<std::size_t>(axis) + 1; i < shape.size(); ++i) s.inner *= shape[i];
    return s;
}

}  // namespace dyngrad
