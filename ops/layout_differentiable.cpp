// The differentiable backwards of the layout ops (graph/higher_order.h): each is another layout op on the output
// gradient. In a file of their own because ops/layout.cpp, where their first-order backwards live, is at the
// 800-line limit.

#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/layout.h"

namespace dyngrad {

// A swap of two axes is its own inverse.
std::vector<Var> transpose_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    return {transpose(args.grad_output, args.attrs.axes[0], args.attrs.axes[1])};
}

std::vector<Var> reshape_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    return {reshape(args.grad_output, args.inputs[0].shape())};
}

// dx = dy permuted by the inverse permutation
std::vector<Var> permute_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    const auto rank = static_cast<std::int64_t>(args.inputs[0].shape().size());
    std::vector<std::int64_t> inverse(args.attrs.axes.size());
    for (std::size_t i = 0; i < args.attrs.axes.size(); ++i) {
        const std::int64_t axis = args.attrs.axes[i] < 0 ? args.attrs.axes[i] + rank : args.attrs.axes[i];
        inverse[static_cast<std::size_t>(axis)] = static_cast<std::int64_t>(i);
    }
    return {permute(args.grad_output, inverse)};
}

// dy in the expanded shape: the engine's recorded sum_to reduces it to x's.
std::vector<Var> expand_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    return {args.grad_output};
}

// dx = dy placed in its window along the axis, zeros (constants) around it.
std::vector<Var> narrow_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    const Var& g = args.grad_output;
    const Shape& shape = args.inputs[0].shape();
    const auto rank = static_cast<std::int64_t>(shape.size());
    const std::int64_t axis = args.attrs.axis < 0 ? args.attrs.axis + rank : args.attrs.axis;
    const std::int64_t start = args.attrs.start;
    const std::int64_t after = shape[axis] - start - args.attrs.length;
    const auto zeros = [&](std::int64_t length) {
        Shape block = shape;
        block[axis] = length;
        return constant_of(g, Tensor::zeros(block, g.dtype(), g.device()));
    };
    std::vector<Var> parts;
    if (start > 0) parts.push_back(zeros(start));
    parts.push_back(g);
    if (after > 0) parts.push_back(zeros(after));
    return {parts.size() == 1 ? g : concat(parts, axis)};
}

// dx_i = dy narrowed to input i's window along the axis
std::vector<Var> concat_differentiable_backward(const DiffBackwardArgs& args) {
    const Var& g = args.grad_output;
    const auto rank = static_cast<std::int64_t>(g.shape().size());
    const std::int64_t axis = args.attrs.axis < 0 ? args.attrs.axis + rank : args.attrs.axis;
    std::vector<Var> grads(args.inputs.size());
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < args.inputs.size(); ++i) {
        const std::int64_t length = args.inputs[i].shape()[axis];
        if (args.needs_grad[i]) grads[i] = narrow(g, axis, offset, length);
        offset += length;
    }
    return grads;
}

}  // namespace dyngrad
