// Sorting and sampling: cumsum, sort / argsort, topk, multinomial (PyTorch's semantics). CPU: ops/sampling.cpp.
// GPU: ops/sampling.cu. Shared formulas (sort order, the multinomial draw): ops/sampling_math.h.
//
// The op-table rows are cumsum (differentiable), argsort, topk_indices and multinomial (int64, not
// differentiable). sort's and topk's values are gather(x, axis, indices) (ops/indexing.h): one sort, and their
// gradient is gather's, dy scattered back to the positions the indices name (each once: no sums).
//
// Order. Ascending puts NaN last, descending first (NaN counts as the largest value, as in PyTorch); -0.0 and
// +0.0 are equal. Ties keep their order along the axis, ascending and descending alike: the sort is stable
// (PyTorch's stable=True), on every backend, so the CPU and the GPU return the same indices. topk's ties go to
// the lower index (PyTorch leaves them unspecified).
#pragma once
#include <cstdint>
#include <source_location>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/ops/values_indices.h"

namespace dyngrad {

// The running sum along `axis`: y[..., i, ...] = x[..., 0, ...] + ... + x[..., i, ...]. Floating dtypes, summed in
// double on every backend (bf16/f16 through float32). Gradient: the reversed running sum of dy.
Var cumsum(const Var& x, std::int64_t axis, std::source_location where = std::source_location::current());
Tensor cumsum(const Tensor& x, std::int64_t axis, std::source_location where = std::source_location::current());

// x sorted along `axis` (stable; order above) and the int64 indices of the sorted entries:
// values = gather(x, axis, indices).
ValuesAndIndices<Var> sort(const Var& x, std::int64_t axis = -1, bool descending = false,
                           std::source_location where = std::source_location::current());
ValuesAndIndices<Tensor> sort(const Tensor& x, std::int64_t axis = -1, bool descending = false,
                              std::source_location where = std::source_location::current());
Var argsort(const Var& x, std::int64_t axis = -1, bool descending = false,
            std::source_location where = std::source_location::current());
Tensor argsort(const Tensor& x, std::int64_t axis = -1, bool descending = false,
               std::source_location where = std::source_location::current());

// The k largest (largest = true) or smallest entries along `axis`, always in sorted order (largest first, or
// smallest first), with their int64 indices; `axis` keeps its place with size k. 0 <= k <= size (ValueError).
// The first k of sort(x, axis, largest): ties go to the lower index.
ValuesAndIndices<Var> topk(const Var& x, std::int64_t k, std::int64_t axis = -1, bool largest = true,
                           std::source_location where = std::source_location::current());
ValuesAndIndices<Tensor> topk(const Tensor& x, std::int64_t k, std::int64_t axis = -1, bool largest = true,
                              std::source_location where = std::source_location::current());

// num_samples int64 category indices from each row of `probs`, (C) or (N, C): non-negative finite weights, not
// necessarily summing to 1. Output (num_samples) or (N, num_samples). Without replacement a category is drawn at
// most once (num_samples <= C, and each row needs that many non-zero weights). Not differentiable.
// The draws are a function of (seed, row, sample) alone (ops/sampling_math.h): the CPU and the GPU give the same
// indices for the same seed. The Generator form draws the seed from `gen` (one 64-bit draw per call).
// Bad rows (a negative, NaN or infinite weight, a zero sum, too few non-zero weights) are a ValueError naming
// the row: on the CPU at once, on the GPU through the device error record at the next host wait (as labels).
Var multinomial(const Var& probs, std::int64_t num_samples, bool replacement, Generator& gen,
                std::source_location where = std::source_location::current());
Tensor multinomial(const Tensor& probs, std::int64_t num_samples, bool replacement, Generator& gen,
                   std::source_location where = std::source_location::current());
Var multinomial(const Var& probs, std::int64_t num_samples, bool replacement, std::uint64_t seed,
                std::source_location where = std::source_location::current());
Tensor multinomial(const Tensor& probs, std::int64_t num_samples, bool replacement, std::uint64_t seed,
                   std::source_location where = std::source_location::current());

}  // namespace dyngrad
