// CUDA runtime: per-device contexts (stream, cuBLAS/cuBLASLt/cuDNN handles, memory pool, device error
// record), the stream-ordered allocator, copies, fills, device queries and the checked-call errors.
// Public API: cuda/runtime.h (plain C++); kernel-side API: cuda/context.h.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <link.h>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"

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

constexpr int kMaxDevices = 64;
// Host<->device copies above this size go through the context's pinned staging buffers: a pageable
// copy is staged by the driver anyway, and reusing our own pinned chunks avoids its extra sync.
constexpr std::size_t kStagingThreshold = std::size_t{1} << 20;
constexpr std::size_t kStagingChunk = std::size_t{4} << 20;  // two chunks: 8 MiB pinned per device
constexpr unsigned kFillThreads = 256;
// The fixed cuBLAS workspace per device: the sizes the cuBLAS guide recommends (Hopper and later, earlier).
constexpr std::size_t kCublasWorkspaceHopper = std::size_t{32} << 20;
constexpr std::size_t kCublasWorkspace = std::size_t{4} << 20;
// Capture pools: blocks are multiples of kCaptureAlign bytes cut from chunks of at least kCaptureChunk.
constexpr std::size_t kCaptureAlign = 512;
constexpr std::size_t kCaptureChunk = std::size_t{2} << 20;
constexpr const char* kWaitsForGraph =
    "the host would wait for work that runs only when the graph is launched; read results after run() returns";

std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_deterministic{false};
// The device this thread last made current, so context() skips redundant cudaSetDevice calls.
// (Code outside dyngrad that calls cudaSetDevice itself defeats the cache; dyngrad never does.)
thread_local int tls_current_device = -1;

// Owns a handle released by `destroy`. Non-copyable; a move nulls the source; the destructor ignores
// the status because it must not throw and has no one to report to.
template <typename T, auto destroy>
class UniqueHandle {
public:
    UniqueHandle() = default;
    explicit UniqueHandle(T handle) : handle_(handle) {}
    ~UniqueHandle() { reset(); }
    UniqueHandle(UniqueHandle&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
    UniqueHandle& operator=(UniqueHandle&& other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, T{});
        }
        return *this;
    }
    UniqueHandle(const UniqueHandle&) = delete;
    UniqueHandle& operator=(const UniqueHandle&) = delete;

    T get() const { return handle_; }
    void reset() noexcept {
        if (handle_) static_cast<void>(destroy(handle_));
        handle_ = T{};
    }

private:
    T handle_{};
};

using StreamHandle = UniqueHandle<cudaStream_t, cudaStreamDestroy>;
using EventHandle = UniqueHandle<cudaEvent_t, cudaEventDestroy>;
using CublasHandle = UniqueHandle<cublasHandle_t, cublasDestroy>;
using CublasLtHandle = UniqueHandle<cublasLtHandle_t, cublasLtDestroy>;
using CudnnHandle = UniqueHandle<cudnnHandle_t, cudnnDestroy>;
using PinnedBuffer = UniqueHandle<void*, cudaFreeHost>;
using DeviceBuffer = UniqueHandle<void*, cudaFree>;

void make_current(int device) {
    if (tls_current_device == device) return;
    DG_CUDA_CHECK(cudaSetDevice(device));
    tls_current_device = device;
}

// An event on the current device, for ordering only (no timing).
EventHandle make_event() {
    cudaEvent_t event = nullptr;
    DG_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return EventHandle(event);
}

// One half of the double-buffered staging area: `done` is recorded after the last stream operation
// that touches `buffer`, so the host waits on it before reusing the buffer.
struct StagingSlot {
    PinnedBuffer buffer;
    EventHandle done;
};

// Everything one device's context owns. The public DeviceContext holds the raw handles kernels use;
// the RAII members here release them if construction fails half-way.
struct ContextOwner {
    explicit ContextOwner(int device);
    void ensure_staging();  // call with staging_mutex held
    // A cuDNN handle bound to `stream` for one host thread, and its return when the thread ends.
    cudnnHandle_t acquire_cudnn();
    void release_cudnn(cudnnHandle_t handle) noexcept;

    DeviceContext ctx;  // cudnn stays null here: each thread has its own (ThreadContexts)
    StreamHandle stream;
    DeviceBuffer cublas_workspace;  // released after the handle that uses it
    CublasHandle cublas;
    CublasLtHandle cublas_lt;
    CudnnHandle cudnn;  // the first handle, created with the context
    std::mutex cudnn_mutex;
    std::vector<cudnnHandle_t> spare_cudnn;  // bound to `stream`, not in use by any thread
    UniqueHandle<DeviceErrorRecord*, cudaFreeHost> error_record;
    DeviceBuffer block_counter;
    std::atomic<std::size_t> bytes_in_use{0};
    std::atomic<std::size_t> peak_bytes_in_use{0};
    // Freed small blocks by size class, handed out again without a CUDA call (see allocate()).
    std::mutex cache_mutex;
    std::unordered_map<std::size_t, std::vector<void*>> cached_blocks;
    std::size_t cached_bytes = 0;
    std::mutex staging_mutex;  // one host thread at a time uses the staging slots
    std::array<StagingSlot, 2> staging;
};

ContextOwner::ContextOwner(int device) {
    make_current(device);
    ctx.device = device;

    cudaStream_t raw_stream = nullptr;
    DG_CUDA_CHECK(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking));
    stream = StreamHandle(raw_stream);
    ctx.stream = raw_stream;

    cublasHandle_t raw_cublas = nullptr;
    DG_CUBLAS_CHECK(cublasCreate(&raw_cublas));
    cublas = CublasHandle(raw_cublas);
    DG_CUBLAS_CHECK(cublasSetStream(raw_cublas, raw_stream));
    DG_CUBLAS_CHECK(cublasSetPointerMode(raw_cublas, CUBLAS_POINTER_MODE_HOST));
    // Without a workspace of ours cuBLAS allocates its own, inside a CUDA graph capture too (memory nodes of
    // the graph). One fixed workspace serves every thread: they all queue on the one stream, which orders
    // the GEMMs that use it (cuBLASLt's too: cuda/linalg.cu). Set after cublasSetStream, which resets it.
    int major = 0;
    DG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const std::size_t workspace_bytes = major >= 9 ? kCublasWorkspaceHopper : kCublasWorkspace;
    void* raw_workspace = nullptr;
    DG_CUDA_CHECK(cudaMalloc(&raw_workspace, workspace_bytes));
    cublas_workspace = DeviceBuffer(raw_workspace);
    DG_CUBLAS_CHECK(cublasSetWorkspace(raw_cublas, raw_workspace, workspace_bytes));
    ctx.cublas = raw_cublas;
    ctx.gemm_workspace = raw_workspace;
    ctx.gemm_workspace_bytes = workspace_bytes;

    cublasLtHandle_t raw_lt = nullptr;
    DG_CUBLAS_CHECK(cublasLtCreate(&raw_lt));
    cublas_lt = CublasLtHandle(raw_lt);
    ctx.cublas_lt = raw_lt;

    cudnnHandle_t raw_cudnn = nullptr;
    DG_CUDNN_CHECK(cudnnCreate(&raw_cudnn));
    cudnn = CudnnHandle(raw_cudnn);
    DG_CUDNN_CHECK(cudnnSetStream(raw_cudnn, raw_stream));
    spare_cudnn.push_back(raw_cudnn);  // created synchronously before any other, as cuDNN's guide recommends

    // Freed blocks stay in the pool (no release at stream syncs): steady-state training allocates nothing
    // from the driver after the first step.
    DG_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&ctx.pool, device));
    std::uint64_t keep_everything = std::numeric_limits<std::uint64_t>::max();
    DG_CUDA_CHECK(cudaMemPoolSetAttribute(ctx.pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));

    DG_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.multiprocessors, cudaDevAttrMultiProcessorCount, device));

    void* record = nullptr;
    DG_CUDA_CHECK(cudaHostAlloc(&record, sizeof(DeviceErrorRecord), cudaHostAllocMapped));
    error_record = UniqueHandle<DeviceErrorRecord*, cudaFreeHost>(static_cast<DeviceErrorRecord*>(record));
    *error_record.get() = DeviceErrorRecord{};
    void* record_device = nullptr;
    DG_CUDA_CHECK(cudaHostGetDevicePointer(&record_device, record, 0));
    ctx.error_record = error_record.get();
    ctx.error_record_device = static_cast<DeviceErrorRecord*>(record_device);

    void* counter = nullptr;
    DG_CUDA_CHECK(cudaMalloc(&counter, sizeof(unsigned)));
    block_counter = DeviceBuffer(counter);
    DG_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned), raw_stream));
    ctx.block_counter = static_cast<unsigned*>(counter);
}

cudnnHandle_t ContextOwner::acquire_cudnn() {
    const std::lock_guard lock(cudnn_mutex);
    if (!spare_cudnn.empty()) {
        const cudnnHandle_t handle = spare_cudnn.back();
        spare_cudnn.pop_back();
        return handle;
    }
    make_current(ctx.device);
    cudnnHandle_t handle = nullptr;
    DG_CUDNN_CHECK(cudnnCreate(&handle));
    if (const cudnnStatus_t status = cudnnSetStream(handle, ctx.stream); status != CUDNN_STATUS_SUCCESS) {
        static_cast<void>(cudnnDestroy(handle));
        throw_cudnn_error(status, "cudnnSetStream(handle, stream)", __FILE__, __LINE__);
    }
    return handle;
}

void ContextOwner::release_cudnn(cudnnHandle_t handle) noexcept {
    try {
        const std::lock_guard lock(cudnn_mutex);
        spare_cudnn.push_back(handle);
    } catch (...) {
        // No memory to list it: the handle is lost to reuse, nothing else (the driver reclaims it at exit).
    }
}

void ContextOwner::ensure_staging() {
    if (staging.back().done.get()) return;  // the last thing created: a failed attempt is redone whole
    for (StagingSlot& slot : staging) {
        void* buffer = nullptr;
        DG_CUDA_CHECK(cudaHostAlloc(&buffer, kStagingChunk, cudaHostAllocDefault));
        slot.buffer = PinnedBuffer(buffer);
        slot.done = make_event();
    }
}

// Contexts are created once and released at process exit by release_contexts(), registered with
// std::atexit after the first context has initialised the CUDA runtime: exit handlers run in reverse
// order of registration, so ours runs while the runtime is still loaded (destroying handles in a static
// destructor could run after it unloads). Memory freed after that (a Tensor held by a static object)
// is left to the driver, which reclaims everything when the process ends.
std::array<std::atomic<ContextOwner*>, kMaxDevices> g_contexts{};
std::mutex g_contexts_mutex;
std::atomic<bool> g_released{false};

void empty_block_cache(ContextOwner& o) noexcept;
void release_capture_pools_at_exit(ContextOwner& o) noexcept;

void release_contexts() noexcept {
    const std::lock_guard lock(g_contexts_mutex);
    g_released.store(true, std::memory_order_release);
    for (int device = 0; device < kMaxDevices; ++device) {
        ContextOwner* o = g_contexts[device].exchange(nullptr, std::memory_order_acq_rel);
        if (!o) continue;
        if (cudaSetDevice(device) == cudaSuccess && cudaStreamSynchronize(o->ctx.stream) == cudaSuccess) {
            // Handles that threads gave back; the first one is also owned by o->cudnn.
            for (const cudnnHandle_t handle : o->spare_cudnn)
                if (handle != o->cudnn.get()) static_cast<void>(cudnnDestroy(handle));
            empty_block_cache(*o);
            release_capture_pools_at_exit(*o);
            static_cast<void>(cudaStreamSynchronize(o->ctx.stream));
            static_cast<void>(cudaMemPoolTrimTo(o->ctx.pool, 0));
            delete o;  // its RAII members destroy the handles, the stream, the staging and error buffers
        }
        static_cast<void>(cudaGetLastError());
    }
}

// exit() runs handlers in reverse order of registration, and a library loaded with dlopen registers its
// finalizers when it is loaded. cuDNN 9 loads its engine libraries on its first execution, after our
// handler was registered, so their finalizers ran first and left the context unusable to
// release_contexts(): compute-sanitizer then reported every block of the block cache as leaked (32 MB in
// 172 allocations over the [conv_relu] tests; none with cuDNN preloaded). So whenever the loader has added
// objects since our last registration, register the (idempotent) handler again: it then runs before the
// finalizers of everything loaded so far. glibc counts additions in dlpi_adds, read from the first object
// without walking the list, so the check costs a loader-lock round trip.
std::uint64_t loaded_object_additions() noexcept {
    std::uint64_t adds = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t size, void* out) {
            if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
                *static_cast<std::uint64_t*>(out) = info->dlpi_adds;
            return 1;  // the counter is global: the first object is enough
        },
        &adds);
    return adds;
}

}  // namespace

void release_contexts_before_new_libraries() noexcept {
    static std::mutex mutex;
    static std::uint64_t registered_at = 0;  // loader additions when the handler was last registered
    const std::uint64_t adds = loaded_object_additions();
    const std::lock_guard lock(mutex);
    if (registered_at != 0 && adds == registered_at) return;
    if (std::atexit(release_contexts) == 0) registered_at = adds;
}

namespace {

int query_device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        static_cast<void>(cudaGetLastError());  // no driver or no device: not an error for the caller
        return 0;
    }
    return std::min(count, kMaxDevices);
}

// The owner of `device`'s context, created on first use; makes `device` current on this thread.
ContextOwner& owner(int device) {
    const int count = device_count();
    if (device < 0 || device >= count)
        throw DeviceError(
            str("cuda:", device, " does not exist (", count, " CUDA device", count == 1 ? "" : "s", " available)"));
    ContextOwner* found = g_contexts[device].load(std::memory_order_acquire);
    if (!found) {
        const std::lock_guard lock(g_contexts_mutex);
        found = g_contexts[device].load(std::memory_order_relaxed);
        if (!found) {
            if (g_released.load(std::memory_order_acquire))
                throw DeviceError(str("cuda:", device, ": dyngrad's CUDA contexts were released at process exit"));
            found = new ContextOwner(device);  // deleted by release_contexts() at exit
            g_contexts[device].store(found, std::memory_order_release);
            release_contexts_before_new_libraries();
        }
    }
    make_current(device);
    return *found;
}

// Thread safety of the libraries: a cuDNN handle must not be used by two host threads at the same time
// (cuDNN developer guide, "Thread Safety", which recommends one handle per thread for the thread's
// lifetime), while a cuBLAS handle may be shared by threads as long as its configuration does not
// change (cuBLAS guide, "Thread Safety"): ours are configured once, when the context is created, and
// math precision is chosen per call. So every host thread sees a device's context through its own
// DeviceContext: the same stream, pool, cuBLAS handles and error record, and a cuDNN handle of its own
// bound to that same stream, so the work of all threads stays in one stream order. When a thread ends,
// its handles go back to their contexts for the next thread; release_contexts() destroys them at exit.
class ThreadContexts {
public:
    ThreadContexts() = default;
    ThreadContexts(const ThreadContexts&) = delete;
    ThreadContexts& operator=(const ThreadContexts&) = delete;
    ~ThreadContexts() {
        for (const DeviceContext& view : views_) {
            if (!view.cudnn) continue;
            // After release_contexts() (a thread ending during exit) the handle is the driver's to reclaim.
            if (ContextOwner* o = g_contexts[view.device].load(std::memory_order_acquire)) o->release_cudnn(view.cudnn);
        }
    }

    DeviceContext& get(ContextOwner& o) {
        DeviceContext& view = views_[o.ctx.device];
        if (!view.cudnn) {
            const cudnnHandle_t handle = o.acquire_cudnn();
            view = o.ctx;
            view.cudnn = handle;
        }
        return view;
    }

private:
    std::array<DeviceContext, kMaxDevices> views_{};
};
thread_local ThreadContexts tls_contexts;

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

// Returns every cached block to the pool, ordered on the stream.
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

// ---- capture pools (see cuda/context.h) ----

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

// At exit, with the contexts: the memory of capture pools that are still alive (a block of theirs was never
// returned, e.g. a tensor held by a static object) and the ordinary memory they held. The pool objects
// stay: a later deallocate() finds g_released set and returns before it would look them up.
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
    ContextOwner* o = g_released.load(std::memory_order_acquire)
                          ? nullptr
                          : g_contexts[pool->device].load(std::memory_order_acquire);
    if (o != nullptr && cudaSetDevice(pool->device) == cudaSuccess) {
        static_cast<void>(cudaStreamSynchronize(o->ctx.stream));
        for (char* chunk : pool->chunks) static_cast<void>(cudaFree(chunk));
        for (void* constant : pool->constants) static_cast<void>(cudaFree(constant));
        for (const auto& [ptr, bytes] : pool->held) {
            o->bytes_in_use.fetch_sub(bytes, std::memory_order_relaxed);
            static_cast<void>(cudaFreeAsync(ptr, o->ctx.stream));
        }
        static_cast<void>(cudaGetLastError());
        if (tls_current_device >= 0) static_cast<void>(cudaSetDevice(tls_current_device));
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

// deallocate() of a block some capture pool handed out; false when `ptr` is not from a capture pool.
bool free_to_capture_pool(void* ptr, std::size_t bytes) {
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
        if (ContextOwner* o = g_contexts[pool.device].load(std::memory_order_acquire))
            o->bytes_in_use.fetch_sub(bytes, std::memory_order_relaxed);
        if (free_capture_block(pool, address)) {
            unregister_capture_pool(registry, pool);
            emptied = &pool;
        }
    }
    if (emptied != nullptr) release_or_defer(emptied);
    return true;
}

// deallocate() of ordinary memory while this thread captures its device: the pool holds it (context.h).
void hold_during_capture(void* ptr, std::size_t bytes) {
    const std::lock_guard lock(capture_registry().mutex);
    tls_capture->pool->held.emplace_back(ptr, bytes);
}

std::string_view file_name(const char* path) {
    const std::string_view p(path);
    const auto slash = p.find_last_of('/');
    return slash == std::string_view::npos ? p : p.substr(slash + 1);
}

std::string call_site(const char* expr, const char* file, int line) {
    return str(expr, " failed at ", file_name(file), ":", line);
}

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

// dst[i] = value for i < n (grid-stride)
template <typename T>
__global__ void fill_kernel(T* __restrict__ dst, std::int64_t n, T value) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = value;
}

template <typename T>
void launch_fill(const DeviceContext& ctx, void* dst, std::int64_t n, double value) {
    const unsigned blocks = grid_size(ctx, n, kFillThreads);
    fill_kernel<T><<<blocks, kFillThreads, 0, ctx.stream>>>(static_cast<T*>(dst), n, static_cast<T>(value));
    DG_CUDA_CHECK_LAUNCH();
}

}  // namespace

// ---- errors ----

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line) {
    // Clear a non-sticky error so the next launch check does not report it a second time.
    static_cast<void>(cudaGetLastError());
    const std::string message =
        str(call_site(expr, file, line), ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
    if (status == cudaErrorMemoryAllocation) throw OutOfMemory(message);
    throw CudaError(message);
}

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
    const std::string message =
        str(call_site(expr, file, line), ": ", cublasGetStatusName(status), " (", cublasGetStatusString(status), ")");
    if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(message);
    throw CudaError(message);
}

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line) {
    std::array<char, 512> detail{};
    cudnnGetLastErrorString(detail.data(), detail.size());
    std::string message = str(call_site(expr, file, line), ": ", cudnnGetErrorString(status));
    if (detail[0] != '\0') message += str(" (", detail.data(), ")");
    if (status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
        status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
        throw OutOfMemory(message);
    throw CudaError(message);
}

void raise_device_error(DeviceContext& ctx) {
    // The record is mapped host memory that kernels write; volatile keeps the reads real.
    volatile DeviceErrorRecord* record = ctx.error_record;
    if (record == nullptr || record->code == static_cast<int>(DeviceErrorCode::none)) return;
    const int code = record->code;
    const long long index = record->index;
    const long long value = record->value;
    const long long bound = record->bound;
    record->index = 0;
    record->value = 0;
    record->bound = 0;
    record->code = static_cast<int>(DeviceErrorCode::none);
    if (code == static_cast<int>(DeviceErrorCode::label_out_of_range))
        throw IndexError(str("cross_entropy: label ", value, " at row ", index, " is out of range [0, ", bound, ")"));
    throw CudaError(str("cuda:", ctx.device, ": a kernel reported unknown error code ", code));
}

// ---- contexts ----

DeviceContext& context(int device) { return tls_contexts.get(owner(device)); }

DeviceContext& context_for(const Tensor& t) {
    if (!t.defined() || !t.device().is_cuda())
        throw DeviceError(str("expected a tensor on a CUDA device, got ", describe(t)));
    return context(t.device().index);
}

Workspace::Workspace(DeviceContext& ctx, std::size_t bytes)
    : ctx_(ctx), data_(allocate(bytes, ctx.device)), bytes_(bytes) {}

Workspace::~Workspace() {
    deallocate(data_, bytes_, ctx_.device);
    release_contexts_before_new_libraries();  // the library call that used it may have loaded its engines
}

unsigned grid_size(const DeviceContext& ctx, std::int64_t n, unsigned threads) {
    // Grid-stride loops: one block per `threads` elements, capped at 32 blocks per SM (several waves of
    // full occupancy); past that each thread loops, which costs nothing for memory-bound kernels.
    const std::int64_t wanted = n <= 0 ? 1 : (n + threads - 1) / threads;
    const std::int64_t cap = static_cast<std::int64_t>(std::max(ctx.multiprocessors, 1)) * 32;
    return static_cast<unsigned>(std::clamp<std::int64_t>(wanted, 1, cap));
}

// ---- runtime.h ----

void* allocate(std::size_t bytes, int device) {
    ContextOwner& o = owner(device);
    if (tls_capture != nullptr && tls_capture->pool->device == device)
        return allocate_in_capture(*tls_capture->pool, o, bytes);
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
    if (ptr == nullptr || g_released.load(std::memory_order_acquire)) return;  // after exit's release: the driver's
    try {
        if (g_capture_pools.load(std::memory_order_acquire) > 0 && free_to_capture_pool(ptr, bytes)) return;
        if (tls_capture != nullptr && tls_capture->pool->device == device) return hold_during_capture(ptr, bytes);
        // A tensor of another device may die in the middle of an op: free on its device, then switch
        // back so the op's next launch still runs on the op's device.
        const int previous = tls_current_device;
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
    }
    throw DTypeError(str("fill: unknown dtype code ", static_cast<int>(dtype)));
}

int device_count() {
    static const int count = query_device_count();
    return count;
}

std::string device_name(int device) {
    cudaDeviceProp prop{};
    DG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    int driver = 0, runtime = 0, cublas = 0;
    DG_CUDA_CHECK(cudaDriverGetVersion(&driver));
    DG_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    DG_CUBLAS_CHECK(cublasGetVersion(context(device).cublas, &cublas));
    return str(prop.name, " (sm_", prop.major, prop.minor, ", CUDA driver ", driver / 1000, ".", driver % 1000 / 10,
               ", runtime ", runtime / 1000, ".", runtime % 1000 / 10, ", cuBLAS ", cublas, ", cuDNN ",
               cudnnGetVersion(), ")");
}

MemoryStats memory_stats(int device) {
    ContextOwner& o = owner(device);
    MemoryStats stats;
    stats.bytes_in_use = o.bytes_in_use.load(std::memory_order_relaxed);
    stats.peak_bytes_in_use = o.peak_bytes_in_use.load(std::memory_order_relaxed);
    stats.pool_reserved_bytes = pool_reserved_bytes(o.ctx.pool);
    CaptureRegistry& registry = capture_registry();
    const std::lock_guard lock(registry.mutex);
    for (const CapturePool* pool : registry.pools)
        if (pool->device == device) stats.capture_reserved_bytes += pool->reserved_bytes;
    return stats;
}

void reset_peak_memory(int device) {
    ContextOwner& o = owner(device);
    o.peak_bytes_in_use.store(o.bytes_in_use.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void synchronize(int device) {
    throw_if_capturing(device, "cuda::synchronize()", kWaitsForGraph);
    ContextOwner& o = owner(device);
    DG_CUDA_CHECK(cudaStreamSynchronize(o.ctx.stream));
    raise_device_error(o.ctx);
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

StreamEvent::~StreamEvent() {
    if (event_ != nullptr && cudaEventDestroy(static_cast<cudaEvent_t>(event_)) != cudaSuccess)
        static_cast<void>(cudaGetLastError());
}

StreamEvent::StreamEvent(StreamEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept {
    if (this != &other) {
        const StreamEvent previous(std::move(*this));  // releases this event at the end of the scope
        event_ = std::exchange(other.event_, nullptr);
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

// ---- capture (cuda/context.h) ----

CapturePoolOwner::CapturePoolOwner(int device) {
    static_cast<void>(owner(device));
    auto pool = std::make_unique<CapturePool>(device);
    CaptureRegistry& registry = capture_registry();
    const std::lock_guard lock(registry.mutex);
    registry.pools.push_back(pool.get());
    g_capture_pools.fetch_add(1, std::memory_order_acq_rel);
    pool_ = pool.release();
}

CapturePoolOwner::~CapturePoolOwner() {
    if (pool_ == nullptr) return;
    CaptureRegistry& registry = capture_registry();
    bool emptied = false;
    {
        const std::lock_guard lock(registry.mutex);
        pool_->retired = true;
        if (pool_->live_blocks == 0) {
            unregister_capture_pool(registry, *pool_);
            emptied = true;
        }
    }
    if (emptied) release_or_defer(pool_);
}

CapturePoolOwner::CapturePoolOwner(CapturePoolOwner&& other) noexcept : pool_(std::exchange(other.pool_, nullptr)) {}

CapturePoolOwner& CapturePoolOwner::operator=(CapturePoolOwner&& other) noexcept {
    if (this != &other) {
        const CapturePoolOwner previous(std::move(*this));  // retires this pool at the end of the scope
        pool_ = std::exchange(other.pool_, nullptr);
    }
    return *this;
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
        if (*graph != nullptr) static_cast<void>(cudaGraphDestroy(*graph));
        *graph = nullptr;
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

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
void set_deterministic(bool deterministic) { g_deterministic.store(deterministic, std::memory_order_relaxed); }
bool deterministic() { return g_deterministic.load(std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

}  // namespace dyngrad::cuda
