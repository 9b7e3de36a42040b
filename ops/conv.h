// 2-D convolution, NCHW. CPU: ops/conv.cpp (im2col + Eigen GEMM). GPU: ops/conv.cu (cuDNN).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

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

// What cuDNN's algorithm search offered for each convolution pass the GPU searched, and what ops/conv.cu made of it
// (CUDA builds; always empty on the CPU): one entry per candidate, in cuDNN's order (fastest first). For a reader
// asking why a pass runs the kernel it runs (dyngrad-perf --kernel-times prints it). Kept until cleared; a pass is
// searched once per shape, dtype and setting, so the log grows with the shapes a program uses, not with its steps.
struct ConvSearchEntry {
    std::string convolution;  // "x (64,6,14,14) w (16,6,5,5) stride (1,1) padding (0,0) dilation (1,1) groups 1 bf16"
    std::string pass;         // "forward", "backward data" or "backward filter"
    std::string algorithm;    // cuDNN's name without its prefix: "IMPLICIT_PRECOMP_GEMM", "ALGO_1", "WINOGRAD_NONFUSED"
    double ms = -1;           // cuDNN's timing; -1 when the candidate failed
    std::size_t workspace_bytes = 0;
    bool tensor_ops = false;  // its math type uses tensor cores
    bool deterministic = false;
    // "chosen", or why not: "failed", "workspace over the limit", "down-conversion", "not deterministic" (deterministic
    // mode), "tensor ops at float32 precision", "transform-based", or "slower" (allowed, after the chosen one).
    std::string verdict;
};
std::vector<ConvSearchEntry> conv_search_log();
void clear_conv_search_log();
namespace detail {
void log_conv_search(std::vector<ConvSearchEntry> entries);  // ops/conv.cu, after each search
}

}  // namespace dyngrad
