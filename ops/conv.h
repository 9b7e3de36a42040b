// 2-D convolution, NCHW. CPU: ops/conv.cpp (im2col + Eigen GEMM). GPU: ops/conv.cu (cuDNN).
#pragma once
#include <array>
#include <cstdint>
#include <source_location>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// (height, width) pairs, as in PyTorch's nn.Conv2d.
struct Conv2dOptions {
    std::array<std::int64_t, 2> stride{1, 1};
    std::array<std::int64_t, 2> padding{0, 0};  // zeros on both sides
    std::array<std::int64_t, 2> dilation{1, 1};
    std::int64_t groups = 1;  // input and output channels split into `groups` independent convolutions
    // Applied to conv(x, w) + b inside the same node (Activation::Relu: y = relu(conv(x, w) + b)): one node and,
    // on the GPU, fewer kernel launches than conv2d followed by relu; the pre-activation is never stored.
    Activation activation = Activation::None;
};

// Cross-correlation (no kernel flip, like every framework):
// x (N,C,H,W), weight (K,C/groups,R,S), bias (K) -> y (N,K,P,Q) with
// P = (H + 2·padding - dilation·(R-1) - 1) / stride + 1 (floor), and Q likewise.
// bias may be an undefined Var (no bias). options.activation, if any, is applied last.
// One front door over Var (recorded) and Tensor (eager); graph/front_door.h.
template <Operand T>
T conv2d(const T& x, const T& weight, const T& bias, Conv2dOptions options = {},
         std::source_location where = std::source_location::current()) {
    OpAttrs attrs;
    attrs.stride = options.stride;
    attrs.padding = options.padding;
    attrs.dilation = options.dilation;
    attrs.groups = options.groups;
    attrs.activation = options.activation;
    return apply_op(OpType::Conv2d, {x, weight, bias}, attrs, where);  // an undefined bias is left out
}
template <Operand T>
T conv2d(const T& x, const T& weight, Conv2dOptions options = {},
         std::source_location where = std::source_location::current()) {
    return conv2d(x, weight, T(), options, where);
}

}  // namespace dyngrad
