// Reductions. CPU: ops/reduce.cpp. GPU: ops/reduce.cu.
#pragma once
#include <source_location>
#include <vector>

#include "dyngrad/graph/graph.h"

namespace dyngrad {

// Sum / mean over `axes` (empty: every axis); keepdim keeps reduced axes with size 1.
Var sum(const Var& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false,
        std::source_location where = std::source_location::current());
Var mean(const Var& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false,
         std::source_location where = std::source_location::current());
// Maximum over one axis; the gradient goes to the first maximal element.
Var max(const Var& x, std::int64_t axis, bool keepdim = false,
        std::source_location where = std::source_location::current());

}  // namespace dyngrad
