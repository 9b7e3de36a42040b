// The host plan of a sum/mean, shared by the Eigen kernels (ops/reduce.cpp) and the CUDA launchers
// (ops/reduce.cu): which axes are reduced, the output shape, and x seen as runs of reduced and kept axes.
// Likewise max's: its outputs and what its backward reads.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "dyngrad/core/error.h"
#include "dyngrad/core/shape.h"
#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/ops/axis_geometry.h"

namespace dyngrad {

// The axes of `shape` that a sum/mean reduces: `axes` (negative counting from the end), empty = all.
inline std::vector<bool> reduced_axes(const Shape& shape, const std::vector<std::int64_t>& axes) {
    std::vector<bool> reduced(shape.size(), axes.empty());
    for (const std::int64_t axis : axes) {
        const int a = normalize_axis(axis, shape.size());
        if (reduced[a]) throw ShapeError(str("axis ", axis, " is listed twice in axes"));
        reduced[a] = true;
    }
    return reduced;
}

inline Shape reduced_shape(const Shape& shape, const std::vector<bool>& reduced, bool keepdim) {
    Shape out;
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (!reduced[i])
            out.push_back(shape[i]);
        else if (keepdim)
            out.push_back(1);
    }
    return out;
}

// How many elements each output sums (the mean's divisor).
inline std::int64_t reduced_count(const Shape& shape, const std::vector<bool>& reduced) {
    std::int64_t count = 1;
    for (std::size_t i = 0; i < shape.size(); ++i)
        if (reduced[i]) count *= shape[i];
    return count;
}

// A shape as a reduction sees it, outermost first: size-1 axes dropped, neighbouring axes of the same kind
// merged. (2,3,4,5) over axes {0,2,3} -> [2 reduced][3 kept][20 reduced].
struct Run {
    std::int64_t size;
    bool reduced;
};

inline std::vector<Run> reduction_runs(const Shape& shape, const std::vector<bool>& reduced) {
    std::vector<Run> runs;
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == 1) continue;
        if (!runs.empty() && runs.back().reduced == reduced[i])
            runs.back().size *= shape[i];
        else
            runs.push_back({shape[i], static_cast<bool>(reduced[i])});
    }
    return runs;
}

// The element count of runs [begin, end).
inline std::int64_t runs_numel(const std::vector<Run>& runs, std::size_t begin, std::size_t end) {
    std::int64_t n = 1;
    for (std::size_t i = begin; i < end; ++i) n *= runs[i].size;
    return n;
}

// max over attrs.axis: x seen as (outer, size, inner) around the axis -> y and argmax (int64), both (outer, inner);
// argmax is saved for the backward here, each backend fills the two.
struct MaxForward {
    AxisSplit split;
    Tensor y, argmax;
};

inline MaxForward max_forward_outputs(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const AxisSplit v = split_at_axis(x.shape(), normalize_axis(args.attrs.axis, x.rank()));
    if (v.size == 0) throw ShapeError(str("axis ", args.attrs.axis, " of ", to_string(x.shape()), " is empty"));
    MaxForward f{v, Tensor::empty(args.out.shape, args.out.dtype, x.device()),
                 Tensor::empty(args.out.shape, DType::i64, x.device())};
    args.saved.push_back(f.argmax);
    return f;
}

// max's backward: dy (outer, inner) -> dx like x, dy at each slice's argmax. What both backends read from the node,
// read and checked once; nullopt when x needs no gradient.
struct MaxBackward {
    const Tensor& x;
    const Tensor& dy;
    const Tensor& argmax;  // the forward's
    AxisSplit split;       // x around the axis, as the forward saw it
};

inline std::optional<MaxBackward> max_backward_plan(const BackwardArgs& args) {
    if (!args.needs_grad[0]) return std::nullopt;
    if (args.saved.empty()) throw GraphError("max: the argmax saved by the forward is missing");
    const Tensor& x = args.inputs[0];
    return MaxBackward{x, args.grad_output, args.saved[0],
                       split_at_axis(x.shape(), normalize_axis(args.attrs.axis, x.rank()))};
}

}  // namespace dyngrad
