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
// (CUDA builds; always empty on the CPU): one entry per candidate, the legacy API's in cuDNN's order (fastest first),
// then the graph API's engine configs in its heuristics' order (ops/conv_graph.cu). For a reader asking why a pass
// runs the kernel it runs (dyngrad-perf --kernel-times prints it). Kept until cleared; a pass is searched once per
// shape, dtype and setting, so the log grows with the shapes a program uses, not with its steps.
struct ConvSearchEntry {
    std::string convolution;  // "x (64,6,14,14) w (16,6,5,5) stride (1,1) padding (0,0) dilation (1,1) groups 1 bf16"
    std::string pass;         // "forward", "backward data" or "backward filter"
    // The legacy API's name without its prefix: "IMPLICIT_PRECOMP_GEMM", "ALGO_1", "WINOGRAD_NONFUSED"; a graph-API
    // engine config as "graph:eng<global index>{k<knob type>=<value>,...}" ("graph" alone: the operation graph).
    std::string algorithm;
    double ms = -1;           // the second of two timings; -1 when the candidate was not timed
    std::size_t workspace_bytes = 0;
    bool tensor_ops = false;  // its math type (legacy) or its numerical notes (graph) use tensor cores
    bool deterministic = false;
    // "chosen", or why not: "failed", "not supported" (cuDNN's answer for a graph or engine config), "workspace over
    // the limit", "down-conversion", "reduced-precision reduction", "not deterministic" (deterministic mode), "tensor
    // ops at float32 precision", "transform-based", "runtime compilation" (graph engines that compile kernels when
    // finalized), "graph forced" (the fastest legacy candidate under ConvGraphMode::Force), or "slower" (allowed,
    // after the chosen one).
    std::string verdict;
    std::string detail;  // graph candidates: cuDNN's status text where one failed or was refused; else empty
};
std::vector<ConvSearchEntry> conv_search_log();
void clear_conv_search_log();
namespace detail {
void log_conv_search(std::vector<ConvSearchEntry> entries);  // ops/conv.cu, after each search
}

// Whether the GPU's per-shape search also times cuDNN's graph-API engines (ops/conv_graph.cu) beside the legacy
// API's algorithms (bfloat16, float16 and float32; float64 stays on the legacy API). For tests and debugging:
// Auto (the default) takes the fastest candidate of either API; Off the legacy API's alone; Force a graph engine
// wherever one runs the pass, whatever the timings (the legacy API where none does). DYNGRAD_CONV_GRAPH=0 or =force
// in the environment sets Off or Force at start. Read when a plan is built: the mode is part of the plan's key, so a
// pass already searched under another mode is searched again.
enum class ConvGraphMode { Auto, Off, Force };
void set_conv_graph_mode(ConvGraphMode mode);
ConvGraphMode conv_graph_mode();

}  // namespace dyngrad
