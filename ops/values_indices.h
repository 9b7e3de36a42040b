// The (values, indices) pair of the ops that return both, as PyTorch's return types do: sort, topk (ops/sampling.h),
// and max/min with a dim. `auto [values, indices] = topk(x, 5);`
#pragma once

namespace dyngrad {

// T is Var (recorded: values differentiable, indices an int64 node that never requires grad) or Tensor (eager).
template <class T>
struct ValuesAndIndices {
    T values;
    T indices;
};

}  // namespace dyngrad
