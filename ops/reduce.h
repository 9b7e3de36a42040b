// Reductions. CPU: ops/reduce.cpp. GPU: ops/reduce.cu.
// Each function has a Var form (recorded) and a Tensor form (eager: no graph, no gradient; graph/eager.h).
#pragma once
#include <source_location>
#include <vector>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/ops/values_indices.h"

namespace dyngrad {

// Sum / mean over `axes` (empty: every axis); keepdim keeps reduced axes with size 1.
Var sum(const Var& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false,
        std::source_location where = std::source_location::current());
Tensor sum(const Tensor& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false,
           std::source_location where = std::source_location::current());
Var mean(const Var& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false,
         std::source_location where = std::source_location::current());
Tensor mean(const Tensor& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false,
            std::source_location where = std::source_location::current());
// log Σ exp(x) over `axes` (empty: every axis), computed as m + log Σ exp(x − m) with m the maximum, so nothing
// overflows; the gradient is the softmax over those axes. As PyTorch's logsumexp.
Var logsumexp(const Var& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false,
              std::source_location where = std::source_location::current());
Tensor logsumexp(const Tensor& x, const std::vector<std::int64_t>& axes = {}, bool keepdim = false,
                 std::source_location where = std::source_location::current());
// Maximum over one axis; the gradient goes to the first maximal element.
Var max(const Var& x, std::int64_t axis, bool keepdim = false,
        std::source_location where = std::source_location::current());
Tensor max(const Tensor& x, std::int64_t axis, bool keepdim = false,
           std::source_location where = std::source_location::current());
// Minimum over one axis: the composite -max(-x) (exact); the gradient goes to the first minimal element.
Var min(const Var& x, std::int64_t axis, bool keepdim = false,
        std::source_location where = std::source_location::current());
Tensor min(const Tensor& x, std::int64_t axis, bool keepdim = false,
           std::source_location where = std::source_location::current());
// int64 index of the maximum / minimum over one axis; ties go to the first index and NaN counts as the extreme
// (PyTorch's and NumPy's rules). Not differentiable: a Var result never requires grad.
Var argmax(const Var& x, std::int64_t axis, bool keepdim = false,
           std::source_location where = std::source_location::current());
Tensor argmax(const Tensor& x, std::int64_t axis, bool keepdim = false,
              std::source_location where = std::source_location::current());
Var argmin(const Var& x, std::int64_t axis, bool keepdim = false,
           std::source_location where = std::source_location::current());
Tensor argmin(const Tensor& x, std::int64_t axis, bool keepdim = false,
              std::source_location where = std::source_location::current());

// PyTorch's max(x, dim) / min(x, dim): the values (differentiable, as max/min above) and their int64 indices
// (as argmax/argmin: the first extreme, NaN counting as one), so `auto [values, indices] = max_with_indices(x, 1);`.
ValuesAndIndices<Var> max_with_indices(const Var& x, std::int64_t axis, bool keepdim = false,
                                       std::source_location where = std::source_location::current());
ValuesAndIndices<Tensor> max_with_indices(const Tensor& x, std::int64_t axis, bool keepdim = false,
                                          std::source_location where = std::source_location::current());
ValuesAndIndices<Var> min_with_indices(const Var& x, std::int64_t axis, bool keepdim = false,
                                       std::source_location where = std::source_location::current());
ValuesAndIndices<Tensor> min_with_indices(const Tensor& x, std::int64_t axis, bool keepdim = false,
                                          std::source_location where = std::source_location::current());

}  // namespace dyngrad
