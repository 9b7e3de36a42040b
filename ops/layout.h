// Layout: transpose, reshape, flatten, narrow, concat (ops that move or re-view elements, no arithmetic).
// CPU: ops/layout.cpp. GPU: ops/layout.cu. Reshape is metadata only, the same on every backend.
#pragma once
#include <cstdint>
#include <source_location>
#include <vector>

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

}  // namespace dyngrad
