// Indexing: rows by index (embedding, index_select), elements by index along an axis (gather,
// scatter_add), and selection by a 0/1 condition (where, masked_fill). CPU: ops/indexing.cpp.
// GPU: ops/indexing.cu. Every op writes a new tensor (no views).
//
// Indices are int64 tensors. An index outside its axis is an IndexError naming the op, the index, its
// position and the axis' size: on the CPU at once; on the GPU a kernel writes the device error record and
// the runtime raises it at the next point where the host waits for the device (no synchronisation in the
// op), as for cross_entropy's labels.
//
// Conditions and masks are float tensors of the data's dtype holding 0 or 1 (any non-zero value counts as
// true), the form dyngrad's comparisons return; they get no gradient (zeros if one is asked for).
//
// Gradients that add several rows or elements into one (embedding, index_select and gather backward,
// scatter_add forward) are sums in index order on the CPU. On the GPU they use floating-point atomics by
// default (fast; the order of the additions, hence the last bits, may vary between runs) and, under
// cuda::set_deterministic(true), a stable CUB radix sort of the destinations followed by one sum per
// destination in index order, bitwise-identical across runs.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// Each function is one front door over Var (recorded) and Tensor (eager: no graph, no gradient);
// graph/front_door.h.

// indices (any shape, int64 in [0, V)), weight (V, D) -> (indices..., D): y[..., :] = weight[indices[...], :].
// padding_idx (in [-V, V); negative counts from V) names a row that gets no gradient; its value still
// appears in the output (PyTorch's rule). Checking and counting it from V is the row's argument rule
// (ops/argument_rules.h), which Python's dg.ops.embedding runs too.
template <Operand T>
T embedding(const T& indices, const T& weight, std::optional<std::int64_t> padding_idx = std::nullopt,
            Loc where = Loc::current()) {
    const AttrSet given = padding_idx ? AttrSet{}.with(attr_field_index("padding_idx")) : AttrSet{};
    return apply_op(OpType::Embedding, {weight, indices}, op_attrs(&OpAttrs::padding_idx, padding_idx.value_or(-1)),
                    where, given);
}

// PyTorch's gather: y has index's shape and, along axis 1 of rank 3, y[i][j][k] = x[i][index[i][j][k]][k].
// index: int64 of x's rank with index.size(d) <= x.size(d) for d != axis. Any dtype of x.
template <Operand T>
T gather(const T& x, std::int64_t axis, const T& index, Loc where = Loc::current()) {
    return apply_op(OpType::Gather, {x, index}, op_attrs(&OpAttrs::axis, axis), where);
}

// x with `axis` replaced by the entries the 1-D int64 index names, in its order (repeats allowed).
template <Operand T>
T index_select(const T& x, std::int64_t axis, const T& index, Loc where = Loc::current()) {
    return apply_op(OpType::IndexSelect, {x, index}, op_attrs(&OpAttrs::axis, axis), where);
}

// PyTorch's scatter_add: y = base, then along axis 1 of rank 3, y[i][index[i][j][k]][k] += src[i][j][k].
// src has index's shape (PyTorch also takes a larger src and ignores the rest; dyngrad asks for the
// exact shape); index.size(d) <= base.size(d) for d != axis. Differentiable in base and src.
template <Operand T>
T scatter_add(const T& base, std::int64_t axis, const T& index, const T& src, Loc where = Loc::current()) {
    return apply_op(OpType::ScatterAdd, {base, index, src}, op_attrs(&OpAttrs::axis, axis), where);
}

// y = condition != 0 ? a : b, the three broadcast together (NumPy rules); all three of one float dtype.
template <Operand T>
T where(const T& condition, const T& a, const T& b, Loc at = Loc::current()) {
    return apply_op(OpType::Where, {condition, a, b}, {}, at);
}

// y = mask != 0 ? value : x, with the mask (x's dtype) broadcast to x's shape.
template <Operand T>
T masked_fill(const T& x, const T& mask, double value, Loc where = Loc::current()) {
    return apply_op(OpType::MaskedFill, {x, mask}, op_attrs(&OpAttrs::scalar, value), where);
}

}  // namespace dyngrad
