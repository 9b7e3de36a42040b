// The CUDA runtime seen from plain C++ (no CUDA headers): memory, copies, device queries.
// Implemented in cuda/context.cu, allocator.cu and copy.cu when dyngrad is built with CUDA; core/ calls it only in that build.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "dyngrad/core/device.h"
#include "dyngrad/core/dtype.h"

namespace dyngrad {
class Tensor;
}

namespace dyngrad::cuda {

// What core/device_memory.h's hooks run (their contracts are there), each ordered on the device's stream:
// allocation from its memory pool; fills and conversions by one kernel (capturable: no allocation, no sync).
// Device-to-host copies wait for the stream (the caller reads the bytes right after), then raise any error a
// kernel reported through the device error record (cuda/context.h).
void* allocate(std::size_t bytes, int device);
void deallocate(void* ptr, std::size_t bytes, int device) noexcept;
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);
void fill(void* dst, std::int64_t n, double value, DType dtype, int device);
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n, int device);
int device_count();

// "NVIDIA H100 80GB HBM3 (sm_90, driver 13.0, runtime 13.0, cuBLAS 130100, cuDNN 91400)": the device and the
// library versions in use, for reports.
std::string device_name(int device = 0);

struct MemoryStats {
    std::size_t bytes_in_use = 0;  // bytes handed out by dyngrad and not yet returned
    std::size_t peak_bytes_in_use = 0;
    std::size_t pool_reserved_bytes = 0;  // what the pool holds from the driver
    // Device memory of captured steps' private pools (cuda/capture.h): the working memory of their graphs.
    // Blocks of it that tensors hold count in bytes_in_use too.
    std::size_t capture_reserved_bytes = 0;
};
MemoryStats memory_stats(int device = 0);
// The device's memory in bytes (cudaDeviceProp::totalGlobalMem): what a per-process memory fraction is of.
std::size_t device_total_memory(int device = 0);
void reset_peak_memory(int device = 0);
// A cap on what dyngrad holds on the device (bytes_in_use), as PyTorch's per-process memory fraction: an
// allocation that would take bytes_in_use past `bytes` throws OutOfMemory naming the limit, whatever the device
// has free. 0 removes it. For running a model as if on a smaller GPU (char_gpt --memory-limit-mib).
void set_memory_limit(int device, std::size_t bytes);
std::size_t memory_limit(int device = 0);
// Waits for all work queued on the device's stream, then raises any error a kernel reported.
void synchronize(int device = 0);
// Brackets the work to profile for `ncu --profile-from-start off` (cudaProfilerStart / Stop), e.g. one training
// step of a long run.
void profiler_start();
void profiler_stop();

}  // namespace dyngrad::cuda

namespace dyngrad::cuda {
// Pinned (page-locked) host memory, for staging host-to-device copies that run asynchronously.
// Throws OutOfMemory when the host cannot pin that much.
void* allocate_pinned(std::size_t bytes);
void free_pinned(void* ptr) noexcept;
// Queues a copy of `bytes` from pinned host memory `src` to `dst` on `device` (e.g. a tensor's
// raw_data()) on the device's stream and returns at once. `src` must stay unchanged until the copy has
// run: record a StreamEvent after the copy and wait() on it before rewriting the buffer.
void copy_to_device_async(void* dst, int device, const void* src, std::size_t bytes);

// A point in a device's stream the host can wait for. Non-copyable; a move empties the source.
// Stream exchange with other CUDA libraries (DLPack, python/): `stream` is another library's cudaStream_t as
// an integer (1: the legacy default stream, 2: the per-thread default stream, as DLPack numbers them).
// dyngrad's stream of `device` (every op of that device is queued on it).
std::uintptr_t stream_handle(int device);
// `stream` waits (on the device, through an event; the host does not) for the work queued so far on
// dyngrad's stream: a consumer that reads a dyngrad tensor on `stream` sees its finished value.
void make_stream_wait(std::uintptr_t stream, int device);
// dyngrad's stream waits for the work queued so far on `stream` (a producer's pending writes).
void wait_for_stream(std::uintptr_t stream, int device);

class StreamEvent {
public:
    explicit StreamEvent(int device);
    ~StreamEvent();
    StreamEvent(StreamEvent&& other) noexcept;
    StreamEvent& operator=(StreamEvent&& other) noexcept;
    StreamEvent(const StreamEvent&) = delete;
    StreamEvent& operator=(const StreamEvent&) = delete;

    // Marks the work queued on the device's stream so far.
    void record();
    // Blocks until the work marked by the last record() has run; returns at once when never recorded.
    void wait();

private:
    void* event_ = nullptr;  // cudaEvent_t
    int device_ = 0;
};
}  // namespace dyngrad::cuda

namespace dyngrad::cuda {
// TF32 tensor-core math for float32 GEMMs: off by default (full float32 precision).
void set_allow_tf32(bool allow);
bool allow_tf32();
// Deterministic mode: off by default. When on, cuDNN convolution passes use only deterministic algorithms, the
// indexing ops that add many values into one (embedding, index_select and gather backward, scatter_add;
// ops/indexing.h) sort the destinations (CUB) and sum in index order, and the float32 tensor-core attention backward
// runs two kernels (dk/dv, dq) instead of one adding dq with float atomics (ops/attention.cu), and attention's
// backward runs on dyngrad's tensor-core kernels, never cuDNN's (ops/attention_cudnn.cu says why): two runs give
// bitwise-identical gradients (GPT-2 in bf16: docs/performance.md). Other kernels never depend on scheduling (no
// float atomics), in either mode.
void set_deterministic(bool deterministic);
bool deterministic();
// Where small weight gradients (linear, conv2d) run during backward: on a second stream of the calling thread
// that overlaps the rest of the sweep (cuda/context.h, "the side lane"), or in line on the device's stream.
// `captured` (the default): overlap only while a CUDA graph is being captured, where the two streams become
// parallel branches of the graph and a small step's replay gets shorter. `always`: in eager steps too (they
// gain only when the GPU, not the host, bounds the step). `never`: one stream. Results are bitwise the same in
// every mode: the same kernels run on either stream. The environment variable DYNGRAD_WEIGHT_GRADIENT_OVERLAP
// (never, captured, always) sets the mode at start-up.
enum class WeightGradientOverlap { never, captured, always };
void set_weight_gradient_overlap(WeightGradientOverlap mode);
WeightGradientOverlap weight_gradient_overlap();
// For core's device_memory::await_writes: whether `t` is a result of this thread's side-lane work the device's
// stream has not waited for yet, and the join: each device's stream waits (on the device) for this thread's
// lane there and the lane's kept tensors and workspaces are released. Both are cheap when no lane is pending.
bool side_lane_pending(const Tensor& t) noexcept;
void join_side_lanes();
// Whether this thread is capturing `device`'s stream into a CUDA graph (cuda::CapturedStep); false without CUDA.
bool capturing(int device) noexcept;
// The cuda::CapturedStep run this thread is inside, for the fusion compiler (graph/fusion_replay.h), which plans
// in a variant's warm-up and applies the plans in that same variant's capture: `variant` is unique in the process
// (0: not inside a run; a variant warmed up again after a failed capture gets a new number), `capture` tells the
// capture from the warm-up. Always {0, false} without CUDA.
struct StepRun {
    std::uint64_t variant = 0;
    bool capture = false;
};
StepRun current_step_run() noexcept;
}  // namespace dyngrad::cuda
