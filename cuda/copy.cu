// The device runtime's copies and fills: host<->device through pinned staging buffers, between devices, on a
// device (whole or as strided blocks); pinned host memory and stream events for asynchronous input pipelines
// (cuda/runtime.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <utility>

#include "dyngrad/cuda/block_copy.h"
#include "dyngrad/cuda/context_owner.h"
#include "dyngrad/cuda/element_convert.cuh"
#include "dyngrad/cuda/runtime.h"

namespace dyngrad::cuda {

namespace {

// Host<->device copies above this size go through the context's pinned staging buffers: a pageable
// copy is staged by the driver anyway, and reusing our own pinned chunks avoids its extra sync.
constexpr std::size_t kStagingThreshold = std::size_t{1} << 20;
constexpr std::size_t kStagingChunk = std::size_t{4} << 20;  // two chunks: 8 MiB pinned per device
constexpr unsigned kFillThreads = 256;

}  // namespace

void ContextOwner::ensure_staging() {
    if (staging.back().done.get()) return;  // the last thing created: a failed attempt is redone whole
    for (StagingSlot& slot : staging) {
        void* buffer = nullptr;
        DG_CUDA_CHECK(cudaHostAlloc(&buffer, kStagingChunk, cudaHostAllocDefault));
        slot.buffer = PinnedBuffer(buffer);
        slot.done = make_event();
    }
}

namespace {

// Host -> device on the device's stream. The host buffer may be reused as soon as this returns: small
// pageable copies are staged by the driver before cudaMemcpyAsync returns, large ones by us.
void copy_to_device(void* dst, int device, const void* src, std::size_t bytes) {
    throw_if_capturing(device, "a host-to-device copy",
                       "each replay would read the host memory again, which may be gone by then; copy it to the "
                       "device first and pass it as an input of run()");
    ContextOwner& o = owner(device);
    const cudaStream_t stream = o.ctx.stream;
    if (bytes <= kStagingThreshold) {
        DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
        return;
    }
    const std::lock_guard lock(o.staging_mutex);
    o.ensure_staging();
    auto* out = static_cast<char*>(dst);
    const auto* in = static_cast<const char*>(src);
    for (std::size_t offset = 0, chunk = 0; offset < bytes; offset += kStagingChunk, ++chunk) {
        StagingSlot& slot = o.staging[chunk % 2];
        const std::size_t n = std::min(kStagingChunk, bytes - offset);
        DG_CUDA_CHECK(cudaEventSynchronize(slot.done.get()));  // the slot's previous copy has read it
        std::memcpy(slot.buffer.get(), in + offset, n);
        DG_CUDA_CHECK(cudaMemcpyAsync(out + offset, slot.buffer.get(), n, cudaMemcpyHostToDevice, stream));
        DG_CUDA_CHECK(cudaEventRecord(slot.done.get(), stream));
    }
}

// Device -> host: waits for the stream (the caller reads the bytes next), then raises kernel errors.
void copy_to_host(void* dst, const void* src, int device, std::size_t bytes) {
    throw_if_capturing(device, "a device-to-host copy (item(), to_vector(), to(cpu))", kWaitsForGraph);
    ContextOwner& o = owner(device);
    const cudaStream_t stream = o.ctx.stream;
    if (bytes <= kStagingThreshold) {
        DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    } else {
        const std::lock_guard lock(o.staging_mutex);
        o.ensure_staging();
        auto* out = static_cast<char*>(dst);
        const auto* in = static_cast<const char*>(src);
        const std::size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
        auto chunk_bytes = [&](std::size_t chunk) { return std::min(kStagingChunk, bytes - chunk * kStagingChunk); };
        auto issue = [&](std::size_t chunk) {
            StagingSlot& slot = o.staging[chunk % 2];
            DG_CUDA_CHECK(cudaMemcpyAsync(slot.buffer.get(), in + chunk * kStagingChunk, chunk_bytes(chunk),
                                          cudaMemcpyDeviceToHost, stream));
            DG_CUDA_CHECK(cudaEventRecord(slot.done.get(), stream));
        };
        // Double buffering: chunk c+1 streams into the other slot while the host drains chunk c. That
        // slot was drained by the host in the previous iteration, so it is free to overwrite.
        issue(0);
        for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
            if (chunk + 1 < chunks) issue(chunk + 1);
            StagingSlot& slot = o.staging[chunk % 2];
            DG_CUDA_CHECK(cudaEventSynchronize(slot.done.get()));
            std::memcpy(out + chunk * kStagingChunk, slot.buffer.get(), chunk_bytes(chunk));
        }
    }
    DG_CUDA_CHECK(cudaStreamSynchronize(stream));
    raise_device_error(o.ctx);
}

// Between two devices: the copy runs on the destination's stream once the source's queued work (which
// produced `src`) is done, and the source's stream then waits for the copy, so that a later
// stream-ordered free of `src` cannot overtake it. Without peer access the driver stages through the host.
void copy_between_devices(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes) {
    for (const int device : {src_device, dst_device})
        throw_if_capturing(device, "a copy between devices", "a captured step runs on the stream of one device");
    ContextOwner& from = owner(src_device);
    const EventHandle produced = make_event();  // events belong to the device current at creation
    DG_CUDA_CHECK(cudaEventRecord(produced.get(), from.ctx.stream));

    ContextOwner& to = owner(dst_device);
    const EventHandle copied = make_event();
    DG_CUDA_CHECK(cudaStreamWaitEvent(to.ctx.stream, produced.get(), 0));
    DG_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, to.ctx.stream));
    DG_CUDA_CHECK(cudaEventRecord(copied.get(), to.ctx.stream));
    DG_CUDA_CHECK(cudaStreamWaitEvent(from.ctx.stream, copied.get(), 0));
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ dst, std::int64_t n, T value) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count())
        dst[i] = value;
}

template <typename T>
void launch_fill_element(const DeviceContext& ctx, void* dst, std::int64_t n, T element) {
    const unsigned blocks = grid_size(ctx, n, kFillThreads);
    fill_kernel<T><<<blocks, kFillThreads, 0, ctx.stream>>>(static_cast<T*>(dst), n, element);
    DG_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_fill(const DeviceContext& ctx, void* dst, std::int64_t n, double value) {
    launch_fill_element<T>(ctx, dst, n, static_cast<T>(value));
}

}  // namespace

void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
    if (bytes == 0) return;
    if (dst_device.is_cpu() && src_device.is_cpu()) {
        std::memcpy(dst, src, bytes);
    } else if (src_device.is_cpu()) {
        copy_to_device(dst, dst_device.index, src, bytes);
    } else if (dst_device.is_cpu()) {
        copy_to_host(dst, src, src_device.index, bytes);
    } else if (dst_device.index == src_device.index) {
        const DeviceContext& ctx = context(dst_device.index);
        DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx.stream));
    } else {
        copy_between_devices(dst, dst_device.index, src, src_device.index, bytes);
    }
}

void copy_blocks(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t block,
                 std::size_t rows, int device) {
    if (block == 0 || rows == 0) return;
    const DeviceContext& ctx = context(device);
    if (rows == 1 || (dst_pitch == block && src_pitch == block)) {  // one contiguous run
        DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, block * rows, cudaMemcpyDeviceToDevice, ctx.stream));
        return;
    }
    // A 2D copy takes pitches up to the device's limit (cudaDevAttrMaxPitch); rows further apart than that go one
    // copy each: few rows, since each is that large.
    int max_pitch = 0;
    DG_CUDA_CHECK(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, device));
    const auto limit = static_cast<std::size_t>(max_pitch);
    if (dst_pitch <= limit && src_pitch <= limit) {
        DG_CUDA_CHECK(
            cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, block, rows, cudaMemcpyDeviceToDevice, ctx.stream));
        return;
    }
    auto* to = static_cast<char*>(dst);
    const auto* from = static_cast<const char*>(src);
    for (std::size_t r = 0; r < rows; ++r)
        DG_CUDA_CHECK(cudaMemcpyAsync(to + r * dst_pitch, from + r * src_pitch, block, cudaMemcpyDeviceToDevice,
                                      ctx.stream));
}

namespace {

// A launch's ranges, passed by value as the kernel's parameter (1.5 KiB: no device buffer to fill, capturable).
struct RangeBatch {
    device_memory::CopyRange ranges[kDeviceRangesPerLaunch];
};

// Block row y copies range y in units of T (the widest of 16, 8, 4, 2, 1 bytes dividing both addresses and the
// length), grid-stride over blockIdx.x.
template <typename T>
__device__ void copy_range_as(const device_memory::CopyRange& r) {
    const std::size_t n = r.bytes / sizeof(T);
    T* dst = static_cast<T*>(r.dst);
    const T* src = static_cast<const T*>(r.src);
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i];
}

__global__ void copy_ranges_kernel(RangeBatch batch) {
    const device_memory::CopyRange& r = batch.ranges[blockIdx.y];
    const auto bits = reinterpret_cast<std::uintptr_t>(r.dst) | reinterpret_cast<std::uintptr_t>(r.src) | r.bytes;
    if (bits % 16 == 0) copy_range_as<uint4>(r);
    else if (bits % 8 == 0) copy_range_as<uint2>(r);
    else if (bits % 4 == 0) copy_range_as<std::uint32_t>(r);
    else if (bits % 2 == 0) copy_range_as<std::uint16_t>(r);
    else copy_range_as<std::uint8_t>(r);
}

}  // namespace

void copy_ranges(std::span<const device_memory::CopyRange> ranges, int device) {
    const DeviceContext& ctx = context(device);
    for (std::size_t first = 0; first < ranges.size(); first += kDeviceRangesPerLaunch) {
        RangeBatch batch{};
        unsigned count = 0;
        std::size_t largest = 0;
        for (std::size_t i = first; i < ranges.size() && i < first + kDeviceRangesPerLaunch; ++i) {
            if (ranges[i].bytes == 0) continue;
            batch.ranges[count++] = ranges[i];
            largest = std::max(largest, ranges[i].bytes);
        }
        if (count == 0) continue;
        // Enough blocks per range for its 16-byte units at 4 per thread, at most 64 (grid-stride beyond).
        const std::size_t per_block = std::size_t{kFillThreads} * 16 * 4;
        const auto blocks = static_cast<unsigned>(std::min<std::size_t>(64, (largest + per_block - 1) / per_block));
        copy_ranges_kernel<<<dim3(blocks, count), kFillThreads, 0, ctx.stream>>>(batch);
        DG_CUDA_CHECK_LAUNCH();
    }
}

void fill(void* dst, std::int64_t n, double value, DType dtype, int device) {
    if (n <= 0) return;
    const DeviceContext& ctx = context(device);
    if (value == 0.0 && !std::signbit(value)) {  // +0 is all-zero bytes in every dtype
        DG_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(n) * dtype_size(dtype), ctx.stream));
        return;
    }
    switch (dtype) {
        case DType::f32: return launch_fill<float>(ctx, dst, n, value);
        case DType::f64: return launch_fill<double>(ctx, dst, n, value);
        case DType::i64: return launch_fill<std::int64_t>(ctx, dst, n, value);
        // Rounded on the host (core/half.h), so the device holds exactly the bits the CPU would store.
        case DType::bf16: return launch_fill_element<std::uint16_t>(ctx, dst, n, to_bfloat16(value).bits);
        case DType::f16: return launch_fill_element<std::uint16_t>(ctx, dst, n, to_float16(value).bits);
    }
    throw DTypeError(str("fill: unknown dtype code ", static_cast<int>(dtype)));
}

namespace {

// kConvertWidth elements of T, moved as whole 16-byte vectors: 16 bytes of the narrower type, so the wider side
// takes one to four 16-byte loads or stores per group (float -> bf16: two float4 in, one 16-byte store out).
template <typename To, typename From>
constexpr int kConvertWidth = 16 / static_cast<int>(sizeof(To) < sizeof(From) ? sizeof(To) : sizeof(From));
template <typename T, int W>
struct alignas(16) ConvertGroup {
    T v[W];
};

// dst[i] = convert(src[i]) for i < n: whole groups (`groups` of them, grid-stride; 0 when a pointer is not
// 16-byte aligned), then the scalar tail. One element per thread ran at ~60% of the H100's bandwidth
// (313 µs for ten float -> bf16 conversions of the MLP 4096 step against PyTorch's 229, ncu session 5).
// The same convert_element per element: the same bits.
template <typename To, typename From>
__device__ void convert_grid_stride(To* __restrict__ dst, const From* __restrict__ src, std::int64_t n,
                                    std::int64_t groups) {
    constexpr int W = kConvertWidth<To, From>;
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    for (std::int64_t g = first; g < groups; g += stride) {
        const ConvertGroup<From, W> in = reinterpret_cast<const ConvertGroup<From, W>*>(src)[g];
        ConvertGroup<To, W> out;
#pragma unroll
        for (int k = 0; k < W; ++k) out.v[k] = convert_element<To>(in.v[k]);
        reinterpret_cast<ConvertGroup<To, W>*>(dst)[g] = out;
    }
    for (std::int64_t i = groups * W + first; i < n; i += stride) dst[i] = convert_element<To>(src[i]);
}

template <typename To, typename From>
__global__ void convert_kernel(To* __restrict__ dst, const From* __restrict__ src, std::int64_t n,
                               std::int64_t groups) {
    convert_grid_stride(dst, src, n, groups);
}

}  // namespace

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n, int device) {
    if (n <= 0) return;
    const DeviceContext& ctx = context(device);
    dispatch_gpu_floating(dst_dtype, "dtype conversion on the GPU", [&]<typename To>() {
        dispatch_gpu_floating(src_dtype, "dtype conversion on the GPU", [&]<typename From>() {
            constexpr int W = kConvertWidth<To, From>;
            const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
            const bool aligned = (address(dst) | address(src)) % 16 == 0;
            const std::int64_t groups = aligned ? n / W : 0;
            const unsigned blocks = grid_size(ctx, groups > 0 ? groups : n, kFillThreads);
            convert_kernel<To, From><<<blocks, kFillThreads, 0, ctx.stream>>>(
                static_cast<To*>(dst), static_cast<const From*>(src), n, groups);
            DG_CUDA_CHECK_LAUNCH();
        });
    });
}

namespace {

// A launch's conversions, passed by value as the kernel's parameter (1.5 KiB: capturable, no table to fill).
struct ConvertBatch {
    device_memory::ConvertRange ranges[kDeviceRangesPerLaunch];
};

// Block row y converts range y as convert_kernel does (16-byte groups when both ends are aligned, then the scalar
// tail), grid-stride over blockIdx.x: the same loop, the same bits.
template <typename To, typename From>
__global__ void convert_ranges_kernel(const __grid_constant__ ConvertBatch batch) {
    const device_memory::ConvertRange& r = batch.ranges[blockIdx.y];
    const bool aligned = ((reinterpret_cast<std::uintptr_t>(r.dst) | reinterpret_cast<std::uintptr_t>(r.src)) % 16) == 0;
    convert_grid_stride(static_cast<To*>(r.dst), static_cast<const From*>(r.src), r.n,
                        aligned ? r.n / kConvertWidth<To, From> : 0);
}

}  // namespace

void convert_ranges(std::span<const device_memory::ConvertRange> ranges, DType dst_dtype, DType src_dtype,
                    int device) {
    const DeviceContext& ctx = context(device);
    dispatch_gpu_floating(dst_dtype, "dtype conversion on the GPU", [&]<typename To>() {
        dispatch_gpu_floating(src_dtype, "dtype conversion on the GPU", [&]<typename From>() {
            constexpr int W = kConvertWidth<To, From>;
            // Blocks for the largest range's groups, two per thread, at most 64 per range (grid-stride beyond):
            // parameter gradients of a few thousand elements take one block row each. A range past that cap
            // gets a launch of its own (convert), so that a large one does not give every row its grid.
            const std::int64_t per_block = std::int64_t{kFillThreads} * W * 2;
            constexpr std::int64_t kMaxBlocks = 64;
            ConvertBatch batch{};
            unsigned count = 0;
            std::int64_t largest = 0;
            const auto launch = [&] {
                if (count == 0) return;
                const auto blocks = static_cast<unsigned>((largest + per_block - 1) / per_block);
                convert_ranges_kernel<To, From><<<dim3(blocks, count), kFillThreads, 0, ctx.stream>>>(batch);
                DG_CUDA_CHECK_LAUNCH();
                count = 0;
                largest = 0;
            };
            for (const device_memory::ConvertRange& r : ranges) {
                if (r.n <= 0) continue;
                if (r.n > kMaxBlocks * per_block) {
                    convert(r.dst, dst_dtype, r.src, src_dtype, r.n, device);
                    continue;
                }
                batch.ranges[count++] = r;
                largest = std::max(largest, r.n);
                if (count == kDeviceRangesPerLaunch) launch();
            }
            launch();
        });
    });
}

void* allocate_pinned(std::size_t bytes) {
    void* ptr = nullptr;
    DG_CUDA_CHECK(cudaHostAlloc(&ptr, std::max<std::size_t>(bytes, 1), cudaHostAllocDefault));
    return ptr;
}

void free_pinned(void* ptr) noexcept {
    // Runs in destructors: a failure (the runtime unloading at exit) is cleared, not reported.
    if (ptr != nullptr && cudaFreeHost(ptr) != cudaSuccess) static_cast<void>(cudaGetLastError());
}

void copy_to_device_async(void* dst, int device, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    const DeviceContext& ctx = context(device);
    DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx.stream));
}

StreamEvent::StreamEvent(int device) : device_(device) {
    static_cast<void>(owner(device));  // events belong to the device current at creation
    cudaEvent_t event = nullptr;
    DG_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    event_ = event;
}

StreamEvent::~StreamEvent() { const EventHandle released(static_cast<cudaEvent_t>(event_)); }

StreamEvent::StreamEvent(StreamEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept {
    if (this != &other) {
        const EventHandle released(static_cast<cudaEvent_t>(std::exchange(event_, std::exchange(other.event_, nullptr))));
        device_ = other.device_;
    }
    return *this;
}

void StreamEvent::record() {
    throw_if_capturing(device_, "StreamEvent::record()", kWaitsForGraph);
    const DeviceContext& ctx = context(device_);
    DG_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), ctx.stream));
}

void StreamEvent::wait() {
    throw_if_capturing(device_, "StreamEvent::wait()", kWaitsForGraph);
    DG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}

std::uintptr_t stream_handle(int device) { return reinterpret_cast<std::uintptr_t>(context(device).stream); }

namespace {
// `waiting` waits on the device for what `signalling` has queued so far.
void stream_wait(cudaStream_t waiting, cudaStream_t signalling, int device, const char* what) {
    throw_if_capturing(device, what, kWaitsForGraph);
    if (waiting == signalling) return;
    const EventHandle event = make_event();
    DG_CUDA_CHECK(cudaEventRecord(event.get(), signalling));
    DG_CUDA_CHECK(cudaStreamWaitEvent(waiting, event.get(), 0));
}
}  // namespace

void make_stream_wait(std::uintptr_t stream, int device) {
    const DeviceContext& ctx = context(device);
    stream_wait(reinterpret_cast<cudaStream_t>(stream), ctx.stream, device, "cuda::make_stream_wait");
}

void wait_for_stream(std::uintptr_t stream, int device) {
    const DeviceContext& ctx = context(device);
    stream_wait(ctx.stream, reinterpret_cast<cudaStream_t>(stream), device, "cuda::wait_for_stream");
}

}  // namespace dyngrad::cuda
