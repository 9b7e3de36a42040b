// The device runtime's allocator: stream-ordered allocation from each device's memory pool, with a cache of
// freed small blocks in front of it, and the memory statistics. While a thread captures a device's stream
// its allocations on that device go to the capture pool instead (cuda/capture_pool.cu).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "dyngrad/cuda/context_owner.h"
#include "dyngrad/cuda/runtime.h"

namespace dyngrad::cuda {

namespace {

// The block cache: cudaMallocFromPoolAsync and cudaFreeAsync cost about a microsecond of host time each,
// and an eager training step allocates and frees every activation and gradient, so freed blocks of up to
// kCachedBlockLimit bytes are kept per size class and handed out again directly. That is safe without any
// event: all of a device's work runs on its one stream, so the kernels that used a block are ordered
// before those of its next owner, exactly as for the pool's own stream-ordered reuse. At most
// kCacheLimit bytes are held; the rest goes back to the pool, and an allocation that fails empties the
// cache before it retries.
constexpr std::size_t kCacheGranule = 512;
constexpr std::size_t kCachedBlockLimit = std::size_t{4} << 20;
constexpr std::size_t kCacheLimit = std::size_t{256} << 20;

std::size_t cache_size_class(std::size_t bytes) {
    return (std::max<std::size_t>(bytes, 1) + kCacheGranule - 1) / kCacheGranule * kCacheGranule;
}

}  // namespace

void empty_block_cache(ContextOwner& o) noexcept {
    const std::lock_guard lock(o.cache_mutex);
    for (auto& [size, blocks] : o.cached_blocks)
        for (void* block : blocks)
            if (cudaFreeAsync(block, o.ctx.stream) != cudaSuccess) static_cast<void>(cudaGetLastError());
    o.cached_blocks.clear();
    o.cached_bytes = 0;
}

void note_allocation(ContextOwner& o, std::size_t bytes) {
    const std::size_t now = o.bytes_in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::size_t peak = o.peak_bytes_in_use.load(std::memory_order_relaxed);
    while (now > peak && !o.peak_bytes_in_use.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
}

std::size_t pool_reserved_bytes(cudaMemPool_t pool) {
    std::uint64_t reserved = 0;
    DG_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    return static_cast<std::size_t>(reserved);
}

void* allocate(std::size_t bytes, int device) {
    ContextOwner& o = owner(device);
    if (const std::size_t limit = o.memory_limit.load(std::memory_order_relaxed); limit > 0) {
        const std::size_t in_use = o.bytes_in_use.load(std::memory_order_relaxed);
        if (bytes > limit || in_use > limit - bytes)
            throw OutOfMemory(str("cuda:", device, ": allocating ", bytes, " bytes would exceed the memory limit of ",
                                  limit, " bytes (cuda::set_memory_limit; ", in_use, " bytes in use by dyngrad)"));
    }
    if (CapturePool* pool = capture_pool_of_this_thread(device)) return allocate_in_capture(*pool, o, bytes);
    // Zero-byte requests still get a real block, so every Storage holds a valid, unique pointer.
    const std::size_t size_class = cache_size_class(bytes);
    const bool cacheable = size_class <= kCachedBlockLimit;
    if (cacheable) {
        const std::lock_guard lock(o.cache_mutex);
        const auto found = o.cached_blocks.find(size_class);
        if (found != o.cached_blocks.end() && !found->second.empty()) {
            void* ptr = found->second.back();
            found->second.pop_back();
            o.cached_bytes -= size_class;
            note_allocation(o, bytes);
            return ptr;
        }
    }
    // A cacheable block is allocated at its class's size, so that it can serve any request of the class.
    const std::size_t request = cacheable ? size_class : bytes;
    void* ptr = nullptr;
    cudaError_t status = cudaMallocFromPoolAsync(&ptr, request, o.ctx.pool, o.ctx.stream);
    if (status == cudaErrorMemoryAllocation) {
        static_cast<void>(cudaGetLastError());
        // Failure path only: give the cache back, let pending frees complete, hand the pool's unused memory
        // back to the driver (other allocators and fragmentation may then fit the request) and retry once.
        empty_block_cache(o);
        DG_CUDA_CHECK(cudaStreamSynchronize(o.ctx.stream));
        DG_CUDA_CHECK(cudaMemPoolTrimTo(o.ctx.pool, 0));
        status = cudaMallocFromPoolAsync(&ptr, request, o.ctx.pool, o.ctx.stream);
    }
    if (status == cudaErrorMemoryAllocation) {
        static_cast<void>(cudaGetLastError());
        throw OutOfMemory(str("cuda:", device, ": out of memory allocating ", bytes, " bytes (",
                              o.bytes_in_use.load(std::memory_order_relaxed), " bytes in use by dyngrad, ",
                              pool_reserved_bytes(o.ctx.pool), " reserved by the pool)"));
    }
    if (status != cudaSuccess) throw_cuda_error(status, "cudaMallocFromPoolAsync", __FILE__, __LINE__);
    note_allocation(o, bytes);
    return ptr;
}

void deallocate(void* ptr, std::size_t bytes, int device) noexcept {
    if (ptr == nullptr || contexts_released()) return;  // after exit's release: the driver's
    try {
        if (free_to_capture_pool(ptr, bytes)) return;
        if (capture_pool_of_this_thread(device) != nullptr) return hold_during_capture(ptr, bytes);
        // A tensor of another device may die in the middle of an op: free on its device, then switch
        // back so the op's next launch still runs on the op's device.
        const int previous = thread_current_device();
        ContextOwner& o = owner(device);
        o.bytes_in_use.fetch_sub(bytes, std::memory_order_relaxed);
        bool cached = false;
        if (const std::size_t size_class = cache_size_class(bytes); size_class <= kCachedBlockLimit) {
            const std::lock_guard lock(o.cache_mutex);
            if (o.cached_bytes + size_class <= kCacheLimit) {
                o.cached_blocks[size_class].push_back(ptr);
                o.cached_bytes += size_class;
                cached = true;
            }
        }
        // A failure here (typically the runtime unloading at process exit) has no one to report to;
        // clear it so a later launch check does not pick it up.
        if (!cached && cudaFreeAsync(ptr, o.ctx.stream) != cudaSuccess) static_cast<void>(cudaGetLastError());
        if (previous >= 0) make_current(previous);
    } catch (...) {
        // A device switch failed: deallocation runs in destructors and must not throw.
    }
}

MemoryStats memory_stats(int device) {
    ContextOwner& o = owner(device);
    MemoryStats stats;
    stats.bytes_in_use = o.bytes_in_use.load(std::memory_order_relaxed);
    stats.peak_bytes_in_use = o.peak_bytes_in_use.load(std::memory_order_relaxed);
    stats.pool_reserved_bytes = pool_reserved_bytes(o.ctx.pool);
    stats.capture_reserved_bytes = capture_reserved_bytes(device);
    return stats;
}

void set_memory_limit(int device, std::size_t bytes) { owner(device).memory_limit.store(bytes, std::memory_order_relaxed); }

std::size_t memory_limit(int device) { return owner(device).memory_limit.load(std::memory_order_relaxed); }

void reset_peak_memory(int device) {
    ContextOwner& o = owner(device);
    o.peak_bytes_in_use.store(o.bytes_in_use.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // namespace dyngrad::cuda
