// Reduced precision (bf16/f16) for every op: the one place the engine decides whether an op's kernels take
// bf16/f16 tensors natively (BackendKernels::native_reduced) or run through f32. Through f32, the inputs of a
// reduced dtype are converted to f32 (pool allocations and one conversion kernel each on a GPU: no cudaMalloc,
// no sync, capturable), the f32 kernel runs, and the output is converted back to the inputs' dtype; the
// backward likewise, and each gradient goes back to its input's dtype (summed to the input's shape first, in
// f32, so that a broadcast gradient is rounded once). Both run_forward and the backward sweep call these, so
// recording, eager calls and the backward all share it (graph/graph.cpp).
#pragma once
#include <optional>
#include <span>
#include <vector>

#include "dyngrad/graph/op_def.h"

namespace dyngrad::detail {

// The reduced dtype an op's inputs are in, if any. DTypeError when a bf16/f16 input meets a floating input of
// another dtype: the engine never converts silently (autocast inserts the casts it wants explicitly).
std::optional<DType> reduced_input_dtype(std::span<const Tensor> inputs);

// The forward/backward kernels of `kernels`, through f32 unless the inputs are f32/f64 or the kernels are native.
Tensor run_forward_kernel(const OpDef& def, const BackendKernels& kernels, const ForwardArgs& args);
std::vector<Tensor> run_backward_kernel(const BackendKernels& kernels, const BackwardArgs& args);

}  // namespace dyngrad::detail
