// Layout geometry shared by both backends (computed in ops/layout.cpp): permute's checked permutation and
// walk, and the row copies that narrow and concat are made of.
#pragma once
#include <cstdint>
#include <vector>

#include "dyngrad/core/shape.h"
#include "dyngrad/ops/strided.h"

namespace dyngrad {

// permute: `dims` checked and normalised (ShapeError for a wrong count or an axis out of range, ValueError for
// a repeat); the walk that reads x in y's order; the inverse permutation (the backward's).
std::vector<int> permutation_of(const std::vector<std::int64_t>& dims, std::size_t rank);
StridedWalk<1> permute_walk(const Shape& x, const std::vector<int>& perm);
std::vector<int> inverse_permutation(const std::vector<int>& perm);

// `rows` runs of `block` contiguous elements: run r is read at src_offset + r·src_stride of the source and
// written at dst_offset + r·dst_stride of the destination (all in elements, of one dtype). narrow and concat,
// forward and backward, are such copies: the ops are written once (ops/layout.cpp) and each backend supplies
// only the copy (cpu::copy_rows, cuda::copy_rows).
struct RowCopy {
    std::int64_t src_offset = 0, src_stride = 0;
    std::int64_t dst_offset = 0, dst_stride = 0;
    std::int64_t rows = 0, block = 0;
};

// The same rows copied the other way (a forward copy's backward).
inline RowCopy reversed(const RowCopy& c) {
    return {c.dst_offset, c.dst_stride, c.src_offset, c.src_stride, c.rows, c.block};
}

}  // namespace dyngrad
