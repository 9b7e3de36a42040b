// 2-D max and average pooling, NCHW. CPU: ops/pool.cpp. GPU: ops/pool.cu (max: kernels of ours; average: cuDNN).
#pragma once
#include <array>
#include <cstdint>
#include <source_location>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// x (N,C,H,W) -> y (N,C,P,Q), P = (H + 2·padding - kernel) / stride + 1 (floor), Q likewise; (height, width)
// pairs. A stride of 0 means the kernel size (non-overlapping windows). Padding is at most kernel/2.
// Max: padding never wins; the gradient goes to the first maximal element of each window (row-major scan).
template <Operand T>
T max_pool2d(const T& x, std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride = {0, 0},
             std::array<std::int64_t, 2> padding = {0, 0},
             std::source_location where = std::source_location::current());
// Average: the padding counts as zeros in every window (divides by kernel height·width), like PyTorch's
// default count_include_pad=True and cuDNN's CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING.
template <Operand T>
T avg_pool2d(const T& x, std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride = {0, 0},
             std::array<std::int64_t, 2> padding = {0, 0},
             std::source_location where = std::source_location::current());

}  // namespace dyngrad
