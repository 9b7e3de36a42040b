// Internal (CUDA translation units only): the per-device context every GPU kernel runs in, and the
// checked-call macros. One stream per device; cuBLAS handles created once per device, cuDNN handles one
// per host thread (cuDNN forbids sharing one between threads), all bound to that stream; scratch memory
// (workspaces) from the device's stream-ordered pool.
#pragma once
#include <cstddef>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "dyngrad/core/error.h"
#include "dyngrad/core/tensor.h"
#include "dyngrad/cuda/handle.h"
#include "dyngrad/cuda/user_kernels.h"

namespace dyngrad::cuda {

#ifdef __CUDACC__
// A grid-stride loop's first index and step: for (i = thread_index(); i < n; i += thread_count()).
__device__ __forceinline__ std::int64_t thread_index() {
    return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t thread_count() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }
#endif

// Throw CudaError (OutOfMemory for allocation failures) naming the call, file:line and status (the CUDA
// runtime's throw_cuda_error, DG_CUDA_CHECK and DG_CUDA_CHECK_LAUNCH: cuda/user_kernels.h).
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line);

// One library call's status check; `text` is the call as written (stringified by the macros below, before
// the library's own macros rename it, e.g. cublasCreate to cublasCreate_v2).
#define DG_CUDA_LIBRARY_CHECK_(expr, text, Status, success, thrower)                              \
    do {                                                                                          \
        const Status dg_status_ = (expr);                                                         \
        if (dg_status_ != success) ::dyngrad::cuda::thrower(dg_status_, text, __FILE__, __LINE__); \
    } while (0)
#define DG_CUBLAS_CHECK(expr) \
    DG_CUDA_LIBRARY_CHECK_(expr, #expr, cublasStatus_t, CUBLAS_STATUS_SUCCESS, throw_cublas_error)
#define DG_CUDNN_CHECK(expr) DG_CUDA_LIBRARY_CHECK_(expr, #expr, cudnnStatus_t, CUDNN_STATUS_SUCCESS, throw_cudnn_error)

// Errors found by kernels (e.g. a label out of range) without a device sync inside the op: the first
// kernel to fail claims the record (atomicCAS on `code` from 0); the runtime raises it as an exception
// at the next point where the host waits for the stream (device-to-host copy, synchronize()).
// index_out_of_range (indexing ops, ops/indexing.cu) names its op through `what`: the address of a host
// string literal that the launching code passes to the kernel, which only copies the pointer.
// value_not_binary (a 0/1 mask holding another value: scaled_dot_product_attention) names its op the same way.
// loss_scale_collapsed (GradScaler's update, nn/optim.cu): index = consecutive skipped steps, value = the
// float bits of the scale.
enum class DeviceErrorCode : int {
    none = 0, label_out_of_range = 1, index_out_of_range = 2, value_not_binary = 3, loss_scale_collapsed = 4,
    invalid_value = 5 };  // `what` says what (multinomial's weights): ValueError at row `index`, column `value` (or -1)
struct DeviceErrorRecord {
    int code;                // DeviceErrorCode
    long long index;         // e.g. the row of the bad label
    long long value;         // e.g. the bad label
    long long bound;         // e.g. the number of classes
    const char* what;        // index_out_of_range: the op ("embedding"), a string literal; else null
};

struct DeviceContext {
    int device = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;      // bound to `stream`; math mode per the TF32 setting
    cublasLtHandle_t cublas_lt = nullptr;
    void* gemm_workspace = nullptr;       // the fixed workspace cuBLAS and cuBLASLt share (both on `stream`)
    std::size_t gemm_workspace_bytes = 0;
    cudnnHandle_t cudnn = nullptr;        // this host thread's own, bound to `stream`
    cudaMemPool_t pool = nullptr;
    int multiprocessors = 0;
    DeviceErrorRecord* error_record = nullptr;         // mapped pinned memory: host reads and resets it
    DeviceErrorRecord* error_record_device = nullptr;  // the same record as kernels address it
    // Zero between kernels: a kernel whose last block to finish combines the others' partial results counts
    // finished blocks here and resets it (ops/conv.cu). The one stream orders every such kernel.
    unsigned* block_counter = nullptr;
};

// Throws (IndexError for label_out_of_range and index_out_of_range) and clears the record if a kernel reported an error.
// Call only after the stream has been synchronised.
void raise_device_error(DeviceContext& ctx);

// The context of `device` as this host thread sees it (its own cuDNN handle, everything else shared),
// created on first use (makes `device` current on this thread). Use it on this thread only.
DeviceContext& context(int device);
// The context of a tensor's device (DeviceError when the tensor is not on a CUDA device).
DeviceContext& context_for(const Tensor& t);

// Scratch memory from the pool for the duration of one op (freed stream-ordered on destruction).
class Workspace {
public:
    Workspace(DeviceContext& ctx, std::size_t bytes);
    ~Workspace();
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    void* data() const { return data_; }
    std::size_t bytes() const { return bytes_; }
    // Gives up the block without freeing it (SideWork::keep frees it after the side lane's join).
    void* release() noexcept {
        void* data = data_;
        data_ = nullptr;
        return data;
    }

private:
    DeviceContext& ctx_;
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// ---- the side lane: weight gradients off the backward sweep's critical path ----
//
// A backward op may enqueue work whose result nothing later in the sweep reads (a weight gradient: only the
// optimizer reads it, after backward()) on a second stream of this host thread, the side lane, so that it
// overlaps the input-gradient chain the rest of the sweep waits on. Captured, the two streams become parallel
// branches of the CUDA graph, and the replay's critical path loses the weight-gradient kernels (in small
// networks a step is a chain of latency-bound launches of a few µs each). The kernels and algorithms are the
// same on either stream, so results are bitwise the same with and without the lane.
//
// Protocol (ops/linalg.cu, ops/conv.cu): allocate every output and workspace first (the allocator orders
// blocks on the main stream), then open a SideWork; when lane() is not null, enqueue on lane()->stream with
// the lane's handles and hand keep() every tensor and workspace that work reads or writes: they return to the
// allocator only after the main stream has waited for the lane (join_side_lanes, cuda/runtime.h), or a block's
// next owner on the main stream could race the lane. produced() marks a result: whoever reads one on the main
// stream joins first, through core's device_memory::await_writes (the engine where it reads or hands out a
// gradient, graph/sweep.cpp; a backward kernel's reads, graph/through_f32.cpp).
struct SideLane;
// Whether the lane takes work of `fused_multiply_adds` (its size: the overlap pays off for latency-bound work,
// while large work would only hold its inputs longer) on ctx's device now, per set_weight_gradient_overlap.
bool side_lane_wanted(const DeviceContext& ctx, double fused_multiply_adds);
// Creates this thread's lane on `device` unless the mode is never: before a capture, inside which creating it
// is impossible (cuda::CapturedStep calls it; without it a captured step runs on one stream).
void prepare_side_lane(int device);

class SideWork {
public:
    // Forks the lane from ctx's stream when `wanted` (side_lane_wanted); lane() is null otherwise.
    SideWork(DeviceContext& ctx, bool wanted);
    SideWork(const SideWork&) = delete;
    SideWork& operator=(const SideWork&) = delete;
    ~SideWork() = default;
    // The lane's context (its stream, cuBLAS handle and workspace, cuDNN handle, block counter), or null.
    DeviceContext* lane() const { return lane_context_; }
    void keep(const Tensor& t);
    void keep(Workspace& workspace);
    void produced(const Tensor& t);

private:
    SideLane* lane_ = nullptr;
    DeviceContext* lane_context_ = nullptr;
};

// Call after a library call that may have loaded shared objects (cuDNN loads its engine libraries on first
// use): keeps the release of the contexts at exit ahead of those libraries' finalizers (cuda/context.cu).
void release_contexts_before_new_libraries() noexcept;

// Number of blocks for a grid-stride loop over n elements at `threads` per block.
unsigned grid_size(const DeviceContext& ctx, std::int64_t n, unsigned threads);
// Whether a grid-stride loop of `blocks` x `threads` may index with int32: every index below `largest` and the step
// past it fit (64-bit integer division is emulated on the GPU: a kernel that divides per element runs at a fraction
// of the memory bandwidth with int64 indices).
inline bool fits_int32_indices(std::int64_t largest, unsigned blocks, unsigned threads) {
    return largest + static_cast<std::int64_t>(blocks) * threads < std::int64_t{2147483647};
}

// ---- CUDA graph capture (cuda::CapturedStep, cuda/capture.cu; the mechanics live in cuda/capture_pool.cu) ----
//
// While a thread captures a device's stream, every allocation it makes on that device is served from a
// CapturePool private to the graph being captured (device memory reserved outside the graph), so the graph
// holds no memory nodes and its buffers keep their addresses over replays. Blocks freed during the capture
// are reused later in the same capture (one stream orders all of it). Ordinary memory freed during the
// capture is held by the pool until the pool is released: a replay may still read it. Calls that make the
// host wait for the stream throw GraphError (throw_if_capturing) before CUDA would invalidate the capture.
struct CapturePool;
// What destroying a CapturePoolOwner does to its pool.
void retire_capture_pool(CapturePool* pool) noexcept;

// Owns one capture pool on `device`. Destroying the owner retires the pool; its device memory goes back to
// the driver once every block it handed out has been returned too (a tensor may outlive its graph).
// Non-copyable; a move empties the source (UniqueHandle).
class CapturePoolOwner {
public:
    explicit CapturePoolOwner(int device);

    CapturePool& get() const { return *pool_.get(); }

private:
    UniqueHandle<CapturePool*, retire_capture_pool> pool_;
};

// Begins capturing `pool`'s device stream on this thread (cudaStreamCaptureModeThreadLocal: unsafe calls of
// this thread invalidate the capture, other threads' calls do not), serving this thread's allocations on
// that device from `pool`. GraphError when this thread is already capturing.
void begin_capture(CapturePool& pool);
// Ends this thread's capture, whatever happened inside it. Returns cudaStreamEndCapture's status; *graph is
// the captured graph on success (the caller destroys it), null otherwise.
cudaError_t end_capture(cudaGraph_t* graph) noexcept;
// Whether this thread is capturing `device`'s stream.
bool capturing(int device) noexcept;
// GraphError naming `what` (e.g. "cuda::synchronize()") and `why` when this thread is capturing `device`'s
// stream. Called where the runtime would make the host wait for the stream, before CUDA invalidates the capture.
void throw_if_capturing(int device, const char* what, const char* why);
// Device memory holding a copy of `bytes` of `host`, made now (outside the graph), that lives as long as the
// pool of the graph this thread is capturing: replays read it without copying (e.g. a kernel's argument
// table). GraphError when this thread is not capturing.
const void* capture_constant(const void* host, std::size_t bytes);

}  // namespace dyngrad::cuda
