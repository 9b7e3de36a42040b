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
#include "dyngrad/graph/graph.h"

namespace dyngrad {

// indices (any shape, int64 in [0, V)), weight (V, D) -> (indices..., D): y[..., :] = weight[indices[...], :].
// padding_idx (in [-V, V); negative counts from V) names a row that gets no gradient; its value still
// appears in the output (PyTorch's rule).
Var embedding(const Var& indices, const Var& weight, std::optional<std::int64_t> padding_idx = std::nullopt,
              std::source_location where = std::source_location::current());
Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<std::int64_t> padding_idx = std::nullopt,
                 std::source_location where = std::source_location::current());

// PyTorch's gather: y has index's shape and, along axis 1 of rank 3, y[i][j][k] = x[i][index[i][j][k]][k].
// index: int64 of x's rank with index.size(d) <= x.size(d) for d != axis. Any dtype of x.
Var gather(const Var& x, std::int64_t axis, const Var& index,
           std::source_location where = std::source_location::current());
Tensor gather(const Tensor& x, std::int64_t axis, const Tensor& index,
              std::source_location where = std::source_location::current());

// x with `axis` replaced by the entries the 1-D int64 index names, in its order (repeats allowed).
Var index_select(const Var& x, std::int64_t axis, const Var& index,
                 std::source_location where = std::source_location::current());
Tensor index_select(const Tensor& x, std::int64_t axis, const Tensor& index,
                    std::source_location where = std::source_location::current());

// PyTorch's scatter_add: y = base, then along axis 1 of rank 3, y[i][index[i][j][k]][k] += src[i][j][k].
// src has index's shape (PyTorch also takes a larger src and ignores the rest; dyngrad asks for the
// exact shape); index.size(d) <= base.size(d) for d != axis. Differentiable in base and src.
Var scatter_add(const Var& base, std::int64_t axis, const Var& index, const Var& src,
                std::source_location where = std::source_location::current());
Tensor scatter_add(const Tensor& base, std::int64_t axis, const Tensor& index, const Tensor& src,
                   std::source_location where = std::source_location::current());

// y = condition != 0 ? a : b, the three broadcast together (NumPy rules); all three of one float dtype.
Var where(const Var& condition, const Var& a, const Var& b,
          std::source_location where = std::source_location::current());
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b,
             std::source_location where = std::source_location::current());

// y = mask != 0 ? value : x, with the mask (x's dtype) broadcast to x's shape.
Var masked_fill(const Var& x, const Var& mask, double value,
                std::source_location where = std::source_location::current());
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value,
                   std::source_location where = std::source_location::current());

}  // namespace dyngrad
