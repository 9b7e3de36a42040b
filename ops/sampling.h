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
#include "dyngrad/graph/front_door.h"
#include "dyngrad/ops/values_indices.h"

namespace dyngrad {

// Each function is one front door over Var (recorded) and Tensor (eager: no graph, no gradient);
// graph/front_door.h.

// The running sum along `axis`: y[..., i, ...] = x[..., 0, ...] + ... + x[..., i, ...]. Floating dtypes, summed in
// double on every backend (bf16/f16 through float32). Gradient: the reversed running sum of dy.
template <Operand T>
T cumsum(const T& x, std::int64_t axis, Loc where = Loc::current()) {
    return apply_op(OpType::Cumsum, {x}, op_attrs(&OpAttrs::axis, axis), where);
}

// x sorted along `axis` (stable; order above) and the int64 indices of the sorted entries:
// values = gather(x, axis, indices).
template <Operand T>
ValuesAndIndices<T> sort(const T& x, std::int64_t axis = -1, bool descending = false, Loc where = Loc::current());
template <Operand T>
T argsort(const T& x, std::int64_t axis = -1, bool descending = false, Loc where = Loc::current()) {
    return apply_op(OpType::ArgSort, {x}, op_attrs(&OpAttrs::axis, axis, &OpAttrs::descending, descending),
                    where);
}

// The k largest (largest = true) or smallest entries along `axis`, always in sorted order (largest first, or
// smallest first), with their int64 indices; `axis` keeps its place with size k. 0 <= k <= size (ValueError).
// The first k of sort(x, axis, largest): ties go to the lower index.
template <Operand T>
ValuesAndIndices<T> topk(const T& x, std::int64_t k, std::int64_t axis = -1, bool largest = true,
                         Loc where = Loc::current());

// num_samples int64 category indices from each row of `probs`, (C) or (N, C): non-negative finite weights, not
// necessarily summing to 1. Output (num_samples) or (N, num_samples). Without replacement a category is drawn at
// most once (num_samples <= C, and each row needs that many non-zero weights). Not differentiable.
// The draws are a function of (seed, row, sample) alone (ops/sampling_math.h): the CPU and the GPU give the same
// indices for the same seed. The Generator form draws the seed from `gen` (one 64-bit draw per call: the seed of
// this call's counter-based samples, recorded in the node, so a replay and the other backend reproduce them).
// Bad rows (a negative, NaN or infinite weight, a zero sum, too few non-zero weights) are a ValueError naming
// the row: on the CPU at once, on the GPU through the device error record at the next host wait (as labels).
template <Operand T>
T multinomial(const T& probs, std::int64_t num_samples, bool replacement, std::uint64_t seed,
              Loc where = Loc::current()) {
    return apply_op(OpType::Multinomial, {probs},
                    op_attrs(&OpAttrs::length, num_samples, &OpAttrs::seed, seed, &OpAttrs::replacement, replacement),
                    where);
}
template <Operand T>
T multinomial(const T& probs, std::int64_t num_samples, bool replacement, Generator& gen,
              Loc where = Loc::current()) {
    return multinomial(probs, num_samples, replacement, static_cast<std::uint64_t>(gen.engine()()), where);
}

}  // namespace dyngrad
