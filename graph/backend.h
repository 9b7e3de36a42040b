// What the engine needs from the op families' kernels, declared at the graph level and implemented in
// ops/ (ops/reduce.cpp, ops/tensor_stats.cpp), so that graph/ includes nothing above it; the op table
// itself is reached the same way (op_def, graph/op_def.h, implemented in ops/op_table.cpp).
#pragma once
#include "dyngrad/core/tensor.h"

namespace dyngrad {

// Reduces a broadcast gradient to `shape` on the gradient's device (the one place broadcasting is undone).
Tensor sum_to(const Tensor& grad, const Shape& shape);
// dst += src on their device; an undefined dst takes src. Never writes a storage that another handle shares: when
// dst is shared but src (moved in) is owned alone, the sum is formed in src's storage instead of a copy of dst.
void accumulate_into(Tensor& dst, Tensor src);

}  // namespace dyngrad
