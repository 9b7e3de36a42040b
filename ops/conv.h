// 2-D convolution, NCHW. CPU: ops/conv.cpp (im2col + Eigen GEMM). GPU: ops/conv.cu (cuDNN).
#pragma once
#include <array>
#include <cstdint>
#include <source_location>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

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
Var conv2d(const Var& x, const Var& weight, const Var& bias, Conv2dOptions options = {},
           std::source_location where = std::source_location::current());
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions options = {},
              std::source_location where = std::source_location::current());
Var conv2d(const Var& x, const Var& weight, Conv2dOptions options = {},
           std::source_location where = std::source_location::current());
Tensor conv2d(const Tensor& x, const Tensor& weight, Conv2dOptions options = {},
              std::source_location where = std::source_location::current());

}  // namespace dyngrad
