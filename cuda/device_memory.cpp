// core/'s device-memory hooks (core/device_memory.h), served by the CUDA runtime (cuda/runtime.h).
// Plain C++: built with and without the CUDA backend (without it the runtime is cuda/cuda_unavailable.cpp).
#include "dyngrad/core/device_memory.h"

#include "dyngrad/cuda/block_copy.h"
#include "dyngrad/cuda/runtime.h"

namespace dyngrad::device_memory {

void* allocate(std::size_t bytes, int device) { return cuda::allocate(bytes, device); }
void deallocate(void* ptr, std::size_t bytes, int device) noexcept { cuda::deallocate(ptr, bytes, device); }
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
    cuda::copy(dst, dst_device, src, src_device, bytes);
}
void copy_blocks(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t block,
                 std::size_t rows, int device) {
    cuda::copy_blocks(dst, dst_pitch, src, src_pitch, block, rows, device);
}
void copy_ranges(std::span<const CopyRange> ranges, int device) { cuda::copy_ranges(ranges, device); }
void convert_ranges(std::span<const ConvertRange> ranges, DType dst_dtype, DType src_dtype, int device) {
    cuda::convert_ranges(ranges, dst_dtype, src_dtype, device);
}
void fill(void* dst, std::int64_t n, double value, DType dtype, int device) {
    cuda::fill(dst, n, value, dtype, device);
}
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n, int device) {
    cuda::convert(dst, dst_dtype, src, src_dtype, n, device);
}
int device_count() { return cuda::device_count(); }
void await_writes(const Tensor& t) {
    if (cuda::side_lane_pending(t)) cuda::join_side_lanes();
}
void await_all_writes() { cuda::join_side_lanes(); }

}  // namespace dyngrad::device_memory
