// The device runtime's capture pools (cuda/context.h): while a thread captures a device's stream, its
// allocations on that device come from a pool private to the graph being captured. CapturedStep, which uses
// them, is in cuda/capture.cu.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context_owner.h"

namespace dyngrad::cuda {

// A capture pool (cuda/context.h): chunks of device memory from cudaMalloc, cut into blocks by best fit;
// adjacent free blocks of one chunk merge. Guarded by the capture registry's mutex.
struct CapturePool {
    struct Block {
        std::size_t size;
        bool free;
        char* chunk;  // blocks merge only within their chunk
    };
    explicit CapturePool(int device) : device(device) {}

    int device;
    std::map<char*, Block> blocks;                    // every block of every chunk, by address
    std::multimap<std::size_t, char*> free_blocks;    // the free ones, by size
    std::vector<char*> chunks;                        // cudaMalloc'd, listed in the registry
    std::vector<void*> constants;                     // capture_constant() copies, cudaMalloc'd
    std::vector<std::pair<void*, std::size_t>> held;  // ordinary memory freed during the capture
    std::size_t reserved_bytes = 0;                   // chunks and constants
    std::size_t live_blocks = 0;                      // handed out and not returned
    bool retired = false;                             // its owner is gone
};

namespace {

// Capture pools: blocks are multiples of kCaptureAlign bytes cut from chunks of at least kCaptureChunk.
constexpr std::size_t kCaptureAlign = 512;
constexpr std::size_t kCaptureChunk = std::size_t{2} << 20;

// Every live capture pool, and the pool of each chunk, so that deallocate() can return a block to its pool
// from any thread, after the capture and after the pool's owner is gone.
struct CaptureRegistry {
    std::mutex mutex;
    std::map<char*, std::pair<CapturePool*, std::size_t>> chunks;  // chunk base -> pool, chunk bytes
    std::vector<CapturePool*> pools;
};
CaptureRegistry& capture_registry() {
    static auto& registry = *new CaptureRegistry();  // leaked on purpose: deallocate() may run during exit
    return registry;
}
// Live pools: while there are none, deallocate() does not look at the registry.
std::atomic<std::size_t> g_capture_pools{0};

// This thread's capture, between begin_capture() and end_capture().
struct CaptureState {
    CapturePool* pool;
    cudaStream_t stream;
    std::vector<CapturePool*> to_release;  // pools emptied during the capture: cudaFree would invalidate it
};
thread_local CaptureState* tls_capture = nullptr;

// Sets this thread's capture mode to relaxed for the enclosed calls: a pool's own cudaMalloc and cudaMemcpy
// are not stream work and must not invalidate the capture in progress (PyTorch's allocator does the same).
class RelaxedCaptureMode {
public:
    RelaxedCaptureMode() { DG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
    ~RelaxedCaptureMode() { static_cast<void>(cudaThreadExchangeStreamCaptureMode(&mode_)); }
    RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
    RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

private:
    cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

std::size_t round_up(std::size_t n, std::size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// The helpers below run with the registry's mutex held.

void erase_free_block(CapturePool& pool, std::size_t size, char* address) {
    const auto [first, last] = pool.free_blocks.equal_range(size);
    for (auto it = first; it != last; ++it)
        if (it->second == address) {
            pool.free_blocks.erase(it);
            return;
        }
}

// Adds a free chunk of at least `bytes` to the pool.
void grow_capture_pool(CaptureRegistry& registry, CapturePool& pool, ContextOwner& o, std::size_t bytes) {
    const std::size_t chunk_bytes = round_up(bytes, kCaptureChunk);
    void* raw = nullptr;
    cudaError_t status = cudaSuccess;
    {
        const RelaxedCaptureMode relaxed;
        status = cudaMalloc(&raw, chunk_bytes);
    }
    if (status == cudaErrorMemoryAllocation) {
        static_cast<void>(cudaGetLastError());
        throw OutOfMemory(str("cuda:", pool.device, ": out of memory reserving ", chunk_bytes,
                              " bytes for a captured step's private pool (",
                              o.bytes_in_use.load(std::memory_order_relaxed), " bytes in use by dyngrad, ",
                              pool.reserved_bytes, " reserved by this pool)"));
    }
    if (status != cudaSuccess) throw_cuda_error(status, "cudaMalloc (capture pool)", __FILE__, __LINE__);
    char* base = static_cast<char*>(raw);
    pool.chunks.push_back(base);  // first: whatever fails next, the pool's release frees the chunk
    pool.reserved_bytes += chunk_bytes;
    registry.chunks.emplace(base, std::pair(&pool, chunk_bytes));
    pool.blocks.emplace(base, CapturePool::Block{chunk_bytes, true, base});
    pool.free_blocks.emplace(chunk_bytes, base);
}

}  // namespace

// At exit, with the contexts: the memory of capture pools that are still alive (a block of theirs was never
// returned, e.g. a tensor held by a static object) and the ordinary memory they held. The pool objects
// stay: a later deallocate() finds the contexts released and returns before it would look them up.
void release_capture_pools_at_exit(ContextOwner& o) noexcept {
    CaptureRegistry& registry = capture_registry();
    const std::lock_guard lock(registry.mutex);
    for (CapturePool* pool : registry.pools) {
        if (pool->device != o.ctx.device) continue;
        for (char* chunk : pool->chunks) static_cast<void>(cudaFree(chunk));
        for (void* constant : pool->constants) static_cast<void>(cudaFree(constant));
        for (const auto& [ptr, bytes] : pool->held) static_cast<void>(cudaFreeAsync(ptr, o.ctx.stream));
        pool->chunks.clear();
        pool->constants.clear();
        pool->held.clear();
    }
    static_cast<void>(cudaGetLastError());
}

namespace {

// Removes an emptied pool from the registry; release_capture_pool() then frees it without the lock.
void unregister_capture_pool(CaptureRegistry& registry, CapturePool& pool) noexcept {
    for (char* chunk : pool.chunks) registry.chunks.erase(chunk);
    std::erase(registry.pools, &pool);
    g_capture_pools.fetch_sub(1, std::memory_order_acq_rel);
}

// Returns a block; true when that emptied a retired pool.
bool free_capture_block(CapturePool& pool, char* address) {
    auto it = pool.blocks.find(address);
    it->second.free = true;
    --pool.live_blocks;
    if (const auto next = std::next(it);
        next != pool.blocks.end() && next->second.free && next->second.chunk == it->second.chunk) {
        erase_free_block(pool, next->second.size, next->first);
        it->second.size += next->second.size;
        pool.blocks.erase(next);
    }
    if (it != pool.blocks.begin()) {
        if (const auto previous = std::prev(it); previous->second.free && previous->second.chunk == it->second.chunk) {
            erase_free_block(pool, previous->second.size, previous->first);
            previous->second.size += it->second.size;
            pool.blocks.erase(it);
            it = previous;
        }
    }
    pool.free_blocks.emplace(it->second.size, it->first);
    return pool.retired && pool.live_blocks == 0;
}

// The end of an unregistered pool: waits for the device's stream (a last replay may still use the memory),
// then frees the chunks, the constants and the ordinary memory the pool held.
void release_capture_pool(CapturePool* pool) noexcept {
    ContextOwner* o = existing_owner(pool->device);
    if (o != nullptr && cudaSetDevice(pool->device) == cudaSuccess) {
        static_cast<void>(cudaStreamSynchronize(o->ctx.stream));
        for (char* chunk : pool->chunks) static_cast<void>(cudaFree(chunk));
        for (void* constant : pool->constants) static_cast<void>(cudaFree(constant));
        for (const auto& [ptr, bytes] : pool->held) {
            o->bytes_in_use.fetch_sub(bytes, std::memory_order_relaxed);
            static_cast<void>(cudaFreeAsync(ptr, o->ctx.stream));
        }
        static_cast<void>(cudaGetLastError());
        if (const int current = thread_current_device(); current >= 0) static_cast<void>(cudaSetDevice(current));
    }
    delete pool;  // after exit's release_contexts(): the memory is the driver's to reclaim
}

// Releases an emptied pool now, or when this thread's capture ends (cudaFree would invalidate it).
void release_or_defer(CapturePool* pool) noexcept {
    if (tls_capture != nullptr) {
        try {
            tls_capture->to_release.push_back(pool);
            return;
        } catch (...) {
            return;  // no memory to list it: the pool leaks, which is safe
        }
    }
    release_capture_pool(pool);
}

}  // namespace

void* allocate_in_capture(CapturePool& pool, ContextOwner& o, std::size_t bytes) {
    const std::size_t size = round_up(std::max<std::size_t>(bytes, 1), kCaptureAlign);
    CaptureRegistry& registry = capture_registry();
    const std::lock_guard lock(registry.mutex);
    auto fit = pool.free_blocks.lower_bound(size);  // best fit: the smallest free block that holds `size`
    if (fit == pool.free_blocks.end()) {
        grow_capture_pool(registry, pool, o, size);
        fit = pool.free_blocks.lower_bound(size);
    }
    char* address = fit->second;
    pool.free_blocks.erase(fit);
    CapturePool::Block& block = pool.blocks.at(address);
    if (block.size > size) {  // the tail (a multiple of kCaptureAlign) stays free
        pool.blocks.emplace(address + size, CapturePool::Block{block.size - size, true, block.chunk});
        pool.free_blocks.emplace(block.size - size, address + size);
        block.size = size;
    }
    block.free = false;
    ++pool.live_blocks;
    note_allocation(o, bytes);
    return address;
}

bool free_to_capture_pool(void* ptr, std::size_t bytes) {
    if (g_capture_pools.load(std::memory_order_acquire) == 0) return false;  // no registry lookup without pools
    CaptureRegistry& registry = capture_registry();
    auto* address = static_cast<char*>(ptr);
    CapturePool* emptied = nullptr;
    {
        const std::lock_guard lock(registry.mutex);
        auto chunk = registry.chunks.upper_bound(address);
        if (chunk == registry.chunks.begin()) return false;
        --chunk;
        if (address >= chunk->first + chunk->second.second) return false;
        CapturePool& pool = *chunk->second.first;
        if (ContextOwner* o = existing_owner(pool.device))
            o->bytes_in_use.fetch_sub(bytes, std::memory_order_relaxed);
        if (free_capture_block(pool, address)) {
            unregister_capture_pool(registry, pool);
            emptied = &pool;
        }
    }
    if (emptied != nullptr) release_or_defer(emptied);
    return true;
}

void hold_during_capture(void* ptr, std::size_t bytes) {
    const std::lock_guard lock(capture_registry().mutex);
    tls_capture->pool->held.emplace_back(ptr, bytes);
}

CapturePool* capture_pool_of_this_thread(int device) noexcept {
    return tls_capture != nullptr && tls_capture->pool->device == device ? tls_capture->pool : nullptr;
}

std::size_t capture_reserved_bytes(int device) {
    CaptureRegistry& registry = capture_registry();
    const std::lock_guard lock(registry.mutex);
    std::size_t bytes = 0;
    for (const CapturePool* pool : registry.pools)
        if (pool->device == device) bytes += pool->reserved_bytes;
    return bytes;
}

CapturePoolOwner::CapturePoolOwner(int device) {
    static_cast<void>(owner(device));
    auto pool = std::make_unique<CapturePool>(device);
    CaptureRegistry& registry = capture_registry();
    const std::lock_guard lock(registry.mutex);
    registry.pools.push_back(pool.get());
    g_capture_pools.fetch_add(1, std::memory_order_acq_rel);
    pool_ = UniqueHandle<CapturePool*, retire_capture_pool>(pool.release());
}

void retire_capture_pool(CapturePool* pool) noexcept {
    CaptureRegistry& registry = capture_registry();
    bool emptied = false;
    {
        const std::lock_guard lock(registry.mutex);
        pool->retired = true;
        if (pool->live_blocks == 0) {
            unregister_capture_pool(registry, *pool);
            emptied = true;
        }
    }
    if (emptied) release_or_defer(pool);
}

void begin_capture(CapturePool& pool) {
    if (tls_capture != nullptr)
        throw GraphError("this thread is already capturing a CUDA graph (captures do not nest)");
    ContextOwner& o = owner(pool.device);
    auto state = std::make_unique<CaptureState>(CaptureState{&pool, o.ctx.stream, {}});
    DG_CUDA_CHECK(cudaStreamBeginCapture(o.ctx.stream, cudaStreamCaptureModeThreadLocal));
    tls_capture = state.release();
}

cudaError_t end_capture(cudaGraph_t* graph) noexcept {
    *graph = nullptr;
    CaptureState* state = std::exchange(tls_capture, nullptr);
    if (state == nullptr) return cudaErrorIllegalState;
    const cudaError_t status = cudaStreamEndCapture(state->stream, graph);
    if (status != cudaSuccess) {
        static_cast<void>(cudaGetLastError());
        const GraphHandle discarded(std::exchange(*graph, nullptr));
    }
    for (CapturePool* pool : state->to_release) release_capture_pool(pool);
    delete state;
    return status;
}

bool capturing(int device) noexcept { return tls_capture != nullptr && tls_capture->pool->device == device; }

void throw_if_capturing(int device, const char* what, const char* why) {
    if (!capturing(device)) return;
    throw GraphError(str(what, " inside a step being captured into a CUDA graph (cuda::CapturedStep on cuda:", device,
                         "): ", why));
}

const void* capture_constant(const void* host, std::size_t bytes) {
    if (tls_capture == nullptr) throw GraphError("capture_constant(): this thread is not capturing a CUDA graph");
    CapturePool& pool = *tls_capture->pool;
    static_cast<void>(owner(pool.device));
    void* copy = nullptr;
    {
        const RelaxedCaptureMode relaxed;
        DG_CUDA_CHECK(cudaMalloc(&copy, std::max<std::size_t>(bytes, 1)));
        if (const cudaError_t status = cudaMemcpy(copy, host, bytes, cudaMemcpyHostToDevice); status != cudaSuccess) {
            static_cast<void>(cudaFree(copy));
            throw_cuda_error(status, "cudaMemcpy(copy, host, bytes, cudaMemcpyHostToDevice)", __FILE__, __LINE__);
        }
    }
    const std::lock_guard lock(capture_registry().mutex);
    pool.constants.push_back(copy);
    pool.reserved_bytes += bytes;
    return copy;
}

}  // namespace dyngrad::cuda
