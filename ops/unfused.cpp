// The unfused compositions of the ops whose GPU kernels fuse several steps (graph/fusion_check.h): the same
// result built from the plain ops the fusion replaces, recorded through the op table so that each piece runs
// its own, unfused kernel. Each is named by its op's row (OpDef::unfused); declared in ops/kernels.h.
#include <source_location>

#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/ops/kernels.h"

namespace dyngrad {
namespace {

Var record(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs = {}) {
    return inputs.begin()->graph().record(op, inputs, attrs, std::source_location::current());
}

bool has_bias(std::span<const Tensor> inputs) { return inputs.size() >= 3 && inputs[2].defined(); }

Var activate(const Var& y, Activation activation) {
    return activation == Activation::Relu ? record(OpType::Relu, {y}) : y;
}

// linear: y = act(x·wᵀ + b) — cuBLASLt's bias epilogue (forward), bias-gradient epilogue (backward) and our
// ReLU kernels; without bias or activation it is one plain GEMM and nothing is fused.
bool linear_applies(std::span<const Tensor> inputs, const OpAttrs& attrs) {
    return has_bias(inputs) || attrs.activation != Activation::None;
}
Var linear_compose(std::span<const Var> in, const OpAttrs& attrs) {
    OpAttrs swap_last;
    swap_last.axes = {-2, -1};
    Var y = record(OpType::Matmul, {in[0], record(OpType::Transpose, {in[1]}, swap_last)});
    if (in.size() >= 3) y = record(OpType::Add, {y, in[2]});
    return activate(y, attrs.activation);
}

// conv2d: y = act(conv(x, w) + b[c]) — our bias+activation epilogue after cuDNN's convolution, and the
// mask + bias-gradient kernel in the backward.
bool conv2d_applies(std::span<const Tensor> inputs, const OpAttrs& attrs) {
    return has_bias(inputs) || attrs.activation != Activation::None;
}
Var conv2d_compose(std::span<const Var> in, const OpAttrs& attrs) {
    OpAttrs plain = attrs;
    plain.activation = Activation::None;
    Var y = record(OpType::Conv2d, {in[0], in[1]}, plain);
    if (in.size() >= 3) {
        OpAttrs channel_column;
        channel_column.shape = Shape{1, in[2].shape()[0], 1, 1};
        y = record(OpType::Add, {y, record(OpType::Reshape, {in[2]}, channel_column)});
    }
    return activate(y, attrs.activation);
}

// cross_entropy: log-softmax, the NLL of the targets and (backward) softmax − one-hot in fused row kernels.
// The composition covers the unweighted, unsmoothed loss; the other forms are left to the f64 replay.
bool cross_entropy_applies(std::span<const Tensor> inputs, const OpAttrs& attrs) {
    return inputs.size() == 2 && attrs.label_smoothing == 0.0;
}
Var cross_entropy_compose(std::span<const Var> in, const OpAttrs& attrs) {
    OpAttrs classes;
    classes.axis = 1;
    OpAttrs nll;
    nll.reduction = attrs.reduction;
    nll.ignore_index = attrs.ignore_index;
    return record(OpType::NllLoss, {record(OpType::LogSoftmax, {in[0]}, classes), in[1]}, nll);
}

}  // namespace

// The rows of linear, conv2d and cross_entropy name these (OpDef::unfused, ops/op_table.cpp).
namespace unfused {
const UnfusedComposition linear{linear_compose, linear_applies};
const UnfusedComposition conv2d{conv2d_compose, conv2d_applies};
const UnfusedComposition cross_entropy{cross_entropy_compose, cross_entropy_applies};
}  // namespace unfused

}  // namespace dyngrad
