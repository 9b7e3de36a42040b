// What core/ needs from a device runtime: memory, copies, fills and the device count. Declared here and
// implemented by cuda/ (cuda/device_memory.cpp), so that core/ includes nothing above it (dependency
// inversion: the layer order is in docs/architecture.md). A build without CUDA links cuda/'s stubs,
// which throw DeviceError.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "dyngrad/core/device.h"
#include "dyngrad/core/dtype.h"

namespace dyngrad {
class Tensor;
}

namespace dyngrad::device_memory {

// Stream-ordered allocation on `device`; throws OutOfMemory when the device cannot provide it.
void* allocate(std::size_t bytes, int device);
// Returns memory to the device's pool. Never throws.
void deallocate(void* ptr, std::size_t bytes, int device) noexcept;
// Any copy that involves a device (host-to-host copies never reach here).
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);
// `rows` blocks of `block` bytes on `device`: block r from src + r·src_pitch to dst + r·dst_pitch (pitches >=
// block; the areas do not overlap). Stream-ordered, capturable: no allocation, no host synchronisation. Tensor's
// narrow and select (core/tensor_indexing.cpp) copy their window of a device tensor with it.
void copy_blocks(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t block,
                 std::size_t rows, int device);
// One copy of many byte ranges on `device` (distributed/: gradients into a flat buffer): a kernel launch per 64
// ranges instead of a copy each. Stream-ordered, capturable; the ranges must not overlap one another.
struct CopyRange {
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t bytes = 0;
};
void copy_ranges(std::span<const CopyRange> ranges, int device);
// Many conversions of one dtype pair on `device` (the sweep's parameter-gradient casts, graph/sweep.cpp): a kernel
// launch per 64 ranges instead of a conversion each, each element converted as `convert` converts it (the same
// bits). Stream-ordered, capturable; no range may overlap another's destination.
struct ConvertRange {
    void* dst = nullptr;
    const void* src = nullptr;
    std::int64_t n = 0;
};
void convert_ranges(std::span<const ConvertRange> ranges, DType dst_dtype, DType src_dtype, int device);
// Fills n elements of `dtype` on `device` with `value`.
void fill(void* dst, std::int64_t n, double value, DType dtype, int device);
// n elements of floating `src_dtype` on `device` converted to floating `dst_dtype` (round to nearest even).
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n, int device);
// Number of usable devices (0 when there is no driver, no device or no backend).
int device_count();
// Makes the writes to `t` the runtime still has pending off its device's main queue (asynchronous side work:
// CUDA's side lane computes small weight gradients on a second stream, cuda/context.h) visible to the work queued
// next on the device: a stream wait, never a host synchronisation or an allocation (capturable). Nothing when
// none are pending (always, on the CPU). The engine calls it where it reads a gradient or hands one out.
void await_writes(const Tensor& t);
// The same for every tensor with pending writes on this thread: what backward() does before it returns.
void await_all_writes();

}  // namespace dyngrad::device_memory
