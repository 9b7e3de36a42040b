// Boolean-mask selection (PyTorch's x[mask] / torch.masked_select over the leading dims) and the eager
// in-place arithmetic of Tensor (Tensor::add_ ...), composed from existing ops: no kernel of their own.
#pragma once
#include <source_location>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// x[mask]: the mask (any dtype; every value 0 or 1, ValueError otherwise; dyngrad has no bool dtype, its
// comparisons return float 0/1 masks) has the shape of x's leading mask.rank() dims (ShapeError naming both
// shapes otherwise); the result is (count, x.shape[mask.rank():]...): the selected elements (or rows) in
// row-major order. Differentiable in x: the gradient goes back to the selected places, zeros elsewhere
// (index_select's backward). The count depends on the mask's values, so a device mask is read on the host
// (a synchronisation, as PyTorch's x[mask]); inside a captured CUDA step that is a GraphError.
// One front door over Var (recorded) and Tensor (eager); graph/front_door.h.
template <Operand T>
T masked_select(const T& x, const Tensor& mask, Loc where = Loc::current());

// The flat row indices x[mask] selects (int64, 1-D, on the mask's device) after the checks above; `who`
// names the caller in errors.
Tensor mask_positions(const Shape& x_shape, const Tensor& mask, const char* who);

}  // namespace dyngrad
