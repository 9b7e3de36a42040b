// Internal to the device runtime (cuda/context.cu, allocator.cu, capture_pool.cu, copy.cu): the owner of each
// device's context and the hooks these files call in one another. Op families use cuda/context.h instead.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/handle.h"

namespace dyngrad::cuda {

constexpr int kMaxDevices = 64;
constexpr const char* kWaitsForGraph =
    "the host would wait for work that runs only when the graph is launched; read results after run() returns";

using CublasHandle = UniqueHandle<cublasHandle_t, cublasDestroy>;
using CublasLtHandle = UniqueHandle<cublasLtHandle_t, cublasLtDestroy>;
using CudnnHandle = UniqueHandle<cudnnHandle_t, cudnnDestroy>;
using PinnedBuffer = UniqueHandle<void*, cudaFreeHost>;
using DeviceBuffer = UniqueHandle<void*, cudaFree>;
using ErrorRecordBuffer = UniqueHandle<DeviceErrorRecord*, cudaFreeHost>;

// ---- cuda/context.cu ----

// Makes `device` current on this thread (skipped when it already is).
void make_current(int device);
// The device this thread last made current through make_current(), -1 before the first.
int thread_current_device() noexcept;
// An event on the current device, for ordering only (no timing).
EventHandle make_event();

// One half of the double-buffered staging area: `done` is recorded after the last stream operation
// that touches `buffer`, so the host waits on it before reusing the buffer.
struct StagingSlot {
    PinnedBuffer buffer;
    EventHandle done;
};

// Everything one device's context owns. The public DeviceContext holds the raw handles kernels use;
// the RAII members here release them if construction fails half-way.
// A host thread's side lane on one device (cuda/context.h): its own stream, cuBLAS handle with a workspace of the
// main one's size (a plan cached for the main stream fits it), cuDNN handle and block counter, and what its
// work since the last join keeps alive. Owned by the device's ContextOwner, lent to one thread at a time.
struct SideLane {
    explicit SideLane(const DeviceContext& main);

    DeviceContext ctx;  // the main context with the lane's stream, handles, workspace and counter
    StreamHandle stream;
    DeviceBuffer cublas_workspace;
    CublasHandle cublas;
    CudnnHandle cudnn;
    DeviceBuffer block_counter;
    EventHandle forked;    // recorded on the main stream at each fork
    EventHandle finished;  // recorded on the lane at the join
    // Since the last join:
    bool pending = false;
    std::vector<Tensor> kept;
    std::vector<std::pair<void*, std::size_t>> kept_blocks;
    std::vector<const void*> produced;  // data pointers of results
};

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
    ErrorRecordBuffer error_record;
    DeviceBuffer block_counter;
    std::atomic<std::size_t> bytes_in_use{0};
    std::atomic<std::size_t> peak_bytes_in_use{0};
    std::atomic<std::size_t> memory_limit{0};  // set_memory_limit: bytes_in_use may not exceed it (0: none)
    // Freed small blocks by size class, handed out again without a CUDA call (see allocate()).
    std::mutex cache_mutex;
    std::unordered_map<std::size_t, std::vector<void*>> cached_blocks;
    std::size_t cached_bytes = 0;
    std::mutex staging_mutex;  // one host thread at a time uses the staging slots
    std::array<StagingSlot, 2> staging;
    // Side lanes, created on a thread's first use and returned when it ends; destroyed first.
    std::mutex lanes_mutex;
    std::vector<std::unique_ptr<SideLane>> lanes;
    std::vector<SideLane*> spare_lanes;
    SideLane* acquire_lane();
    void release_lane(SideLane* lane) noexcept;
};

// The owner of `device`'s context, created on first use; makes `device` current on this thread.
ContextOwner& owner(int device);
// The owner of `device`'s context when it exists and exit's release has not run; never creates one.
ContextOwner* existing_owner(int device) noexcept;
// Whether exit's release of the contexts has run: memory freed after it is the driver's to reclaim.
bool contexts_released() noexcept;

// ---- cuda/allocator.cu ----

// Returns every cached block to the pool, ordered on the stream.
void empty_block_cache(ContextOwner& o) noexcept;
// Counts `bytes` as in use (and the peak).
void note_allocation(ContextOwner& o, std::size_t bytes);
std::size_t pool_reserved_bytes(cudaMemPool_t pool);

// ---- cuda/capture_pool.cu ----

// The pool this thread serves `device`'s allocations from while it captures that device's stream, else null.
CapturePool* capture_pool_of_this_thread(int device) noexcept;
void* allocate_in_capture(CapturePool& pool, ContextOwner& o, std::size_t bytes);
// deallocate() of a block some capture pool handed out; false when `ptr` is not from a capture pool.
bool free_to_capture_pool(void* ptr, std::size_t bytes);
// deallocate() of ordinary memory while this thread captures its device: the pool holds it (context.h).
void hold_during_capture(void* ptr, std::size_t bytes);
// Device memory the capture pools of `device` hold.
std::size_t capture_reserved_bytes(int device);
// At exit, with the contexts: frees the memory of the capture pools of o's device that are still alive.
void release_capture_pools_at_exit(ContextOwner& o) noexcept;

}  // namespace dyngrad::cuda
