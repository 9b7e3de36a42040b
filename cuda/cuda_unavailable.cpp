// The CUDA runtime API (cuda/runtime.h) in a build without the CUDA backend: every call that needs a
// device throws DeviceError, queries report no device, so user code links and fails clearly.
#if !DYNGRAD_WITH_CUDA
#include "dyngrad/core/error.h"
#include "dyngrad/cuda/block_copy.h"
#include "dyngrad/cuda/capture.h"
#include "dyngrad/cuda/runtime.h"

namespace dyngrad::cuda {

namespace {
// `what` followed by the device's name: "fill on cuda:0".
[[noreturn]] void unavailable(const char* what, int device) {
    throw_not_built(str(what, Device::cuda(device).to_string()));
}
}  // namespace

void* allocate(std::size_t, int device) { unavailable("a tensor on ", device); }
void deallocate(void*, std::size_t, int) noexcept {}
void copy(void*, Device dst, const void*, Device src, std::size_t) {
    throw_not_built(str("copy from ", src.to_string(), " to ", dst.to_string()));
}
void copy_blocks(void*, std::size_t, const void*, std::size_t, std::size_t, std::size_t, int device) {
    unavailable("copy within ", device);
}
void copy_ranges(std::span<const device_memory::CopyRange>, int device) { unavailable("copy within ", device); }
void convert_ranges(std::span<const device_memory::ConvertRange>, DType, DType, int device) {
    unavailable("dtype conversion on ", device);
}
void fill(void*, std::int64_t, double, DType, int device) { unavailable("fill on ", device); }
void convert(void*, DType, const void*, DType, std::int64_t, int device) {
    unavailable("dtype conversion on ", device);
}
int device_count() { return 0; }
std::string device_name(int) { throw_not_built("cuda::device_name"); }
MemoryStats memory_stats(int) { throw_not_built("cuda::memory_stats"); }
std::size_t device_total_memory(int) { throw_not_built("cuda::device_total_memory"); }
void reset_peak_memory(int) { throw_not_built("cuda::reset_peak_memory"); }
void set_memory_limit(int, std::size_t) { throw_not_built("cuda::set_memory_limit"); }
std::size_t memory_limit(int) { throw_not_built("cuda::memory_limit"); }
void synchronize(int) { throw_not_built("cuda::synchronize"); }
void profiler_start() { throw_not_built("cuda::profiler_start"); }
void profiler_stop() { throw_not_built("cuda::profiler_stop"); }
void* allocate_pinned(std::size_t) { throw_not_built("cuda::allocate_pinned"); }
void free_pinned(void*) noexcept {}
void copy_to_device_async(void*, int device, const void*, std::size_t) { unavailable("copy to ", device); }

StreamEvent::StreamEvent(int device) : device_(device) { unavailable("an event on ", device); }
StreamEvent::~StreamEvent() = default;
StreamEvent::StreamEvent(StreamEvent&& other) noexcept : event_(other.event_), device_(other.device_) {}
StreamEvent& StreamEvent::operator=(StreamEvent&&) noexcept = default;
void StreamEvent::record() { throw_not_built("cuda::StreamEvent::record"); }
void StreamEvent::wait() { throw_not_built("cuda::StreamEvent::wait"); }
struct CapturedStep::Impl {
    StepFn step;
};
CapturedStep::CapturedStep(StepFn step, CaptureOptions options) : impl_(std::make_unique<Impl>(Impl{std::move(step)})) {
    // The option checks of cuda/capture.cu, so that bad options fail alike in every build.
    if (!impl_->step) throw ValueError("CapturedStep: the step function is empty");
    if (options.guard_replays > 0 && !options.guard_state)
        throw ValueError(str("CapturedStep: guard_replays = ", options.guard_replays,
                             " needs guard_state, the tensors the step changes"));
}
CapturedStep::~CapturedStep() = default;
Tensor CapturedStep::run(std::span<const Tensor>) { throw_not_built("cuda::CapturedStep::run"); }
std::size_t CapturedStep::variants() const { return 0; }
CapturedStep::GraphCounts CapturedStep::last_graph_counts() const { return {}; }

std::uintptr_t stream_handle(int device) { unavailable("the stream of ", device); }
void make_stream_wait(std::uintptr_t, int) { throw_not_built("cuda::make_stream_wait"); }
void wait_for_stream(std::uintptr_t, int) { throw_not_built("cuda::wait_for_stream"); }

void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }
void set_deterministic(bool) {}
bool deterministic() { return false; }
void set_weight_gradient_overlap(WeightGradientOverlap) {}
WeightGradientOverlap weight_gradient_overlap() { return WeightGradientOverlap::never; }
bool side_lane_pending(const Tensor&) noexcept { return false; }
void join_side_lanes() {}
bool capturing(int) noexcept { return false; }
StepRun current_step_run() noexcept { return {}; }

}  // namespace dyngrad::cuda
#endif
