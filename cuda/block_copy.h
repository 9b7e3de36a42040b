// Internal to the device runtime: the strided block copy behind core's device_memory::copy_blocks and the batched
// copy behind device_memory::copy_ranges (served by
// cuda/device_memory.cpp; cuda/copy.cu implements it, cuda/cuda_unavailable.cpp throws without CUDA). Plain C++.
#pragma once
#include <cstddef>
#include <span>

#include "dyngrad/core/device_memory.h"

namespace dyngrad::cuda {

// `rows` blocks of `block` bytes within `device`: block r from src + r·src_pitch to dst + r·dst_pitch (pitches
// >= block, no overlap); on the device's stream, capturable (no allocation, no sync).
void copy_blocks(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t block,
                 std::size_t rows, int device);

// core's device_memory::copy_ranges: ranges (none overlapping) copied by one kernel per kDeviceRangesPerLaunch.
inline constexpr std::size_t kDeviceRangesPerLaunch = 64;
void copy_ranges(std::span<const device_memory::CopyRange> ranges, int device);

}  // namespace dyngrad::cuda
