// The structure of where's and masked_fill's backward, shared by ops/indexing.cpp and ops/indexing.cu (each
// supplies its own routing kernel).
#pragma once
#include <vector>

#include "dyngrad/graph/op_def.h"

namespace dyngrad {

// where (condition, a, b) and masked_fill (x, mask) backward, both backends: route(dy, condition, when_true)
// returns dy where (condition != 0) == when_true and 0 elsewhere, in dy's shape (the engine sums it down).
// where: da = route(true), db = route(false); masked_fill: dx = route(false). The condition gets zeros.
template <typename Route>
std::vector<Tensor> select_gradients(const BackwardArgs& args, Route route) {
    const Tensor& dy = args.grad_output;
    const bool is_where = args.op == OpType::Where;
    const std::size_t condition = is_where ? 0 : 1;
    const Tensor& c = args.inputs[condition];
    std::vector<Tensor> grads(args.inputs.size());
    if (is_where) {
        if (args.needs_grad[1]) grads[1] = route(dy, c, true);
        if (args.needs_grad[2]) grads[2] = route(dy, c, false);
    } else if (args.needs_grad[0]) {
        grads[0] = route(dy, c, false);
    }
    if (args.needs_grad[condition]) grads[condition] = Tensor::zeros(c.shape(), dy.dtype(), dy.device());
    return grads;
}

}  // namespace dyngrad
