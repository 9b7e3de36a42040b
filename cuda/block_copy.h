// Internal to the device runtime: the strided block copy behind core's device_memory::copy_blocks and the batched
// copy and conversion behind device_memory::copy_ranges and convert_ranges, their contracts there (served by cuda/device_memory.cpp; cuda/copy.cu
// implements them, cuda/cuda_unavailable.cpp throws without CUDA). Plain C++.
#pragma once
#include <cstddef>
#include <span>

#include "dyngrad/core/device_memory.h"

namespace dyngrad::cuda {

void copy_blocks(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t block,
                 std::size_t rows, int device);
// One kernel per kDeviceRangesPerLaunch ranges.
inline constexpr std::size_t kDeviceRangesPerLaunch = 64;
void copy_ranges(std::span<const device_memory::CopyRange> ranges, int device);
void convert_ranges(std::span<const device_memory::ConvertRange> ranges, DType dst_dtype, DType src_dtype, int device);

}  // namespace dyngrad::cuda
