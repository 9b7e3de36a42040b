// The device runtime's contexts: per device one stream, cuBLAS/cuBLASLt handles with their workspace, a memory
// pool and a device error record, and per host thread a cuDNN handle and the side lanes; their release at exit;
// the checked-call errors; device queries and settings. Public API: cuda/runtime.h (plain C++); kernel-side API:
// cuda/context.h. The allocator is in cuda/allocator.cu, capture pools in cuda/capture_pool.cu, copies in
// cuda/copy.cu. Over 600 lines because the side lanes live in the per-thread contexts and share their release
// at thread and process exit; split candidate: the device queries and settings.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cuda_profiler_api.h>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <link.h>
#include <limits>
#include <mutex>
#include <string_view>
#include <utility>

#include "dyngrad/core/environment.h"
#include "dyngrad/cuda/context_owner.h"
#include "dyngrad/cuda/runtime.h"

namespace dyngrad::cuda {

namespace {

// The fixed cuBLAS workspace per device: the sizes the cuBLAS guide recommends (Hopper and later, earlier).
constexpr std::size_t kCublasWorkspaceHopper = std::size_t{32} << 20;
constexpr std::size_t kCublasWorkspace = std::size_t{4} << 20;

std::atomic<bool> g_allow_tf32{false};
std::atomic<bool> g_deterministic{false};
// The device this thread last made current, so context() skips redundant cudaSetDevice calls.
// (Code outside dyngrad that calls cudaSetDevice itself defeats the cache; dyngrad never does.)
thread_local int tls_current_device = -1;

}  // namespace

void make_current(int device) {
    if (tls_current_device == device) return;
    DG_CUDA_CHECK(cudaSetDevice(device));
    tls_current_device = device;
}

EventHandle make_event() {
    return make_owned<EventHandle>(
        [](cudaEvent_t* event) { DG_CUDA_CHECK(cudaEventCreateWithFlags(event, cudaEventDisableTiming)); });
}

int thread_current_device() noexcept { return tls_current_device; }

namespace {

// The pieces a device context and a side lane both own, each bound to `stream`.
StreamHandle make_stream() {
    return make_owned<StreamHandle>(
        [](cudaStream_t* raw) { DG_CUDA_CHECK(cudaStreamCreateWithFlags(raw, cudaStreamNonBlocking)); });
}

// A cuBLAS handle on `stream` with host pointer mode and a workspace of ours: without one cuBLAS allocates its
// own, inside a CUDA graph capture too (memory nodes of the graph). Set after cublasSetStream, which resets it.
void make_cublas(cudaStream_t stream, std::size_t workspace_bytes, CublasHandle& handle, DeviceBuffer& workspace) {
    handle = make_owned<CublasHandle>([](cublasHandle_t* raw) { DG_CUBLAS_CHECK(cublasCreate(raw)); });
    DG_CUBLAS_CHECK(cublasSetStream(handle.get(), stream));
    DG_CUBLAS_CHECK(cublasSetPointerMode(handle.get(), CUBLAS_POINTER_MODE_HOST));
    workspace = make_owned<DeviceBuffer>([&](void** raw) { DG_CUDA_CHECK(cudaMalloc(raw, workspace_bytes)); });
    DG_CUBLAS_CHECK(cublasSetWorkspace(handle.get(), workspace.get(), workspace_bytes));
}

CudnnHandle make_cudnn(cudaStream_t stream) {
    CudnnHandle handle = make_owned<CudnnHandle>([](cudnnHandle_t* raw) { DG_CUDNN_CHECK(cudnnCreate(raw)); });
    DG_CUDNN_CHECK(cudnnSetStream(handle.get(), stream));
    return handle;
}

// The zeroed counter of last-block patterns (DeviceContext::block_counter), zeroed in `stream`'s order.
DeviceBuffer make_block_counter(cudaStream_t stream) {
    void* counter = nullptr;
    DG_CUDA_CHECK(cudaMalloc(&counter, sizeof(unsigned)));
    DeviceBuffer buffer(counter);
    DG_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned), stream));
    return buffer;
}

}  // namespace

ContextOwner::ContextOwner(int device) {
    make_current(device);
    ctx.device = device;

    stream = make_stream();
    const cudaStream_t raw_stream = stream.get();
    ctx.stream = raw_stream;

    // One fixed workspace serves every thread: they all queue on the one stream, which orders the GEMMs that
    // use it (cuBLASLt's too: ops/linalg.cu). A side lane has its own.
    int major = 0;
    DG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const std::size_t workspace_bytes = major >= 9 ? kCublasWorkspaceHopper : kCublasWorkspace;
    make_cublas(raw_stream, workspace_bytes, cublas, cublas_workspace);
    ctx.cublas = cublas.get();
    ctx.gemm_workspace = cublas_workspace.get();
    ctx.gemm_workspace_bytes = workspace_bytes;

    cublas_lt = make_owned<CublasLtHandle>([](cublasLtHandle_t* raw) { DG_CUBLAS_CHECK(cublasLtCreate(raw)); });
    ctx.cublas_lt = cublas_lt.get();

    cudnn = make_cudnn(raw_stream);
    spare_cudnn.push_back(cudnn.get());  // created synchronously before any other, as cuDNN's guide recommends

    // Freed blocks stay in the pool (no release at stream syncs): steady-state training allocates nothing
    // from the driver after the first step.
    DG_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&ctx.pool, device));
    std::uint64_t keep_everything = std::numeric_limits<std::uint64_t>::max();
    DG_CUDA_CHECK(cudaMemPoolSetAttribute(ctx.pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));

    DG_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.multiprocessors, cudaDevAttrMultiProcessorCount, device));

    void* record = nullptr;
    DG_CUDA_CHECK(cudaHostAlloc(&record, sizeof(DeviceErrorRecord), cudaHostAllocMapped));
    error_record = ErrorRecordBuffer(static_cast<DeviceErrorRecord*>(record));
    *error_record.get() = DeviceErrorRecord{};
    void* record_device = nullptr;
    DG_CUDA_CHECK(cudaHostGetDevicePointer(&record_device, record, 0));
    ctx.error_record = error_record.get();
    ctx.error_record_device = static_cast<DeviceErrorRecord*>(record_device);

    block_counter = make_block_counter(raw_stream);
    ctx.block_counter = static_cast<unsigned*>(block_counter.get());
}

SideLane::SideLane(const DeviceContext& main) : ctx(main) {
    make_current(main.device);
    stream = make_stream();
    ctx.stream = stream.get();
    // The main workspace's size: cuBLASLt plans are cached per problem, not per stream, and were chosen for it.
    make_cublas(ctx.stream, main.gemm_workspace_bytes, cublas, cublas_workspace);
    ctx.cublas = cublas.get();
    ctx.gemm_workspace = cublas_workspace.get();
    cudnn = make_cudnn(ctx.stream);
    ctx.cudnn = cudnn.get();
    block_counter = make_block_counter(ctx.stream);
    ctx.block_counter = static_cast<unsigned*>(block_counter.get());
    forked = make_event();
    finished = make_event();
}

SideLane* ContextOwner::acquire_lane() {
    const std::lock_guard lock(lanes_mutex);
    if (!spare_lanes.empty()) {
        SideLane* lane = spare_lanes.back();
        spare_lanes.pop_back();
        return lane;
    }
    lanes.push_back(std::make_unique<SideLane>(ctx));
    return lanes.back().get();
}

void ContextOwner::release_lane(SideLane* lane) noexcept {
    try {
        const std::lock_guard lock(lanes_mutex);
        spare_lanes.push_back(lane);
    } catch (...) {
        // No memory to list it: the lane stays owned by `lanes`, unused.
    }
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

namespace {

// Contexts are created once and released at process exit by release_contexts(), registered with
// std::atexit after the first context has initialised the CUDA runtime: exit handlers run in reverse
// order of registration, so ours runs while the runtime is still loaded (destroying handles in a static
// destructor could run after it unloads). Memory freed after that (a Tensor held by a static object)
// is left to the driver, which reclaims everything when the process ends.
std::array<std::atomic<ContextOwner*>, kMaxDevices> g_contexts{};
std::mutex g_contexts_mutex;
std::atomic<bool> g_released{false};

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

}  // namespace

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

ContextOwner* existing_owner(int device) noexcept {
    return g_released.load(std::memory_order_acquire) ? nullptr : g_contexts[device].load(std::memory_order_acquire);
}

bool contexts_released() noexcept { return g_released.load(std::memory_order_acquire); }

namespace {

// Side lanes per thread and device: DYNGRAD_SIDE_LANES (1 to kMaxSideLanes), 2 by default.
constexpr std::size_t kMaxSideLanes = 4;
std::size_t side_lane_count() noexcept {
    static const std::size_t count = [] {
        const char* value = std::getenv("DYNGRAD_SIDE_LANES");
        const long parsed = value ? std::strtol(value, nullptr, 10) : 2;
        return static_cast<std::size_t>(std::clamp<long>(parsed, 1, static_cast<long>(kMaxSideLanes)));
    }();
    return count;
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
        for (int device = 0; device < kMaxDevices; ++device) {
            ContextOwner* o = g_contexts[device].load(std::memory_order_acquire);
            if (!o) continue;  // after release_contexts(): the lanes went with their owner
            for (SideLane* lane : lanes_[device]) {
                if (!lane) continue;
                try {
                    join_lane(*o, *lane);
                } catch (...) {
                    // A thread ending has no one to report to; join_lane released what the lane kept.
                }
                o->release_lane(lane);
            }
        }
    }

    // The lane for the next fork on o's device: the thread's lanes in turn, so that consecutive weight gradients
    // (conv2's, then conv1's) need not wait for each other.
    SideLane& next_lane(ContextOwner& o) {
        const int device = o.ctx.device;
        const std::size_t count = side_lane_count();
        SideLane*& lane = lanes_[device][next_[device] % count];
        if (!lane) lane = o.acquire_lane();
        ++next_[device];
        return *lane;
    }

    // Creates the lanes the forks on o's device will use.
    void prepare(ContextOwner& o) {
        for (std::size_t i = 0; i < side_lane_count(); ++i)
            if (!lanes_[o.ctx.device][i]) lanes_[o.ctx.device][i] = o.acquire_lane();
    }

    bool has_lanes(int device) const noexcept {
        for (std::size_t i = 0; i < side_lane_count(); ++i)
            if (!lanes_[device][i]) return false;
        return true;
    }

    // Joins every lane of this thread with pending work; the first failure is rethrown after all were tried.
    void join_all() {
        if (pending_lanes_ == 0) return;
        std::exception_ptr first;
        for (int device = 0; device < kMaxDevices; ++device)
            for (SideLane* lane : lanes_[device]) {
                if (!lane || !lane->pending) continue;
                try {
                    join_lane(*g_contexts[device].load(std::memory_order_acquire), *lane);
                } catch (...) {
                    if (!first) first = std::current_exception();
                }
            }
        pending_lanes_ = 0;
        if (first) std::rethrow_exception(first);
    }

    bool pending(const void* data, int device) const noexcept {
        if (pending_lanes_ == 0 || device < 0 || device >= kMaxDevices) return false;
        for (const SideLane* lane : lanes_[device])
            if (lane && lane->pending &&
                std::find(lane->produced.begin(), lane->produced.end(), data) != lane->produced.end())
                return true;
        return false;
    }

    void note_pending() noexcept { ++pending_lanes_; }

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
    // The main stream waits for the lane's work; then what the work kept returns to the allocator (in the main
    // stream's order, after the wait). Without a device the lane has nothing to wait for: the blocks are freed.
    static void join_lane(ContextOwner& o, SideLane& lane) {
        if (!lane.pending) return;
        lane.pending = false;
        lane.produced.clear();
        std::vector<Tensor> kept = std::move(lane.kept);
        std::vector<std::pair<void*, std::size_t>> blocks = std::move(lane.kept_blocks);
        lane.kept.clear();
        lane.kept_blocks.clear();
        const auto release = [&] {
            kept.clear();
            for (const auto& [data, bytes] : blocks) deallocate(data, bytes, o.ctx.device);
        };
        try {
            make_current(o.ctx.device);
            DG_CUDA_CHECK(cudaEventRecord(lane.finished.get(), lane.ctx.stream));
            DG_CUDA_CHECK(cudaStreamWaitEvent(o.ctx.stream, lane.finished.get(), 0));
        } catch (...) {
            // The wait could not be enqueued: wait on the host (outside a capture) before the blocks go back.
            if (!capturing(o.ctx.device)) static_cast<void>(cudaStreamSynchronize(lane.ctx.stream));
            release();
            throw;
        }
        release();
    }

    std::array<DeviceContext, kMaxDevices> views_{};
    std::array<std::array<SideLane*, kMaxSideLanes>, kMaxDevices> lanes_{};
    std::array<std::size_t, kMaxDevices> next_{};
    int pending_lanes_ = 0;  // lanes made pending since the last join_all (a quick test for the engine's checks)
};
thread_local ThreadContexts tls_contexts;

std::atomic<int> g_weight_gradient_overlap{-1};  // WeightGradientOverlap; -1: read the environment first

WeightGradientOverlap overlap_from_environment() {
    const std::string_view v = environment("DYNGRAD_WEIGHT_GRADIENT_OVERLAP");
    if (v.empty()) return WeightGradientOverlap::captured;
    if (v == "never") return WeightGradientOverlap::never;
    if (v == "captured") return WeightGradientOverlap::captured;
    if (v == "always") return WeightGradientOverlap::always;
    throw ValueError(str("DYNGRAD_WEIGHT_GRADIENT_OVERLAP=", v, ": expected never, captured or always"));
}

// Work below this many fused multiply-adds goes to the side lane: on an H100 a float32 SIMT GEMM or cuDNN
// weight-gradient kernel of this size takes a few µs, about a launch's latency, so overlapping it shortens a
// step; larger work fills the GPU by itself and would only keep its inputs alive until the end of the sweep.
constexpr double kSideLaneWorkLimit = 1u << 26;

std::string_view file_name(const char* path) {
    const std::string_view p(path);
    const auto slash = p.find_last_of('/');
    return slash == std::string_view::npos ? p : p.substr(slash + 1);
}

std::string call_site(const char* expr, const char* file, int line) {
    return str(expr, " failed at ", file_name(file), ":", line);
}

}  // namespace

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
    const char* what = record->what;
    record->index = 0;
    record->value = 0;
    record->bound = 0;
    record->what = nullptr;
    record->code = static_cast<int>(DeviceErrorCode::none);
    if (code == static_cast<int>(DeviceErrorCode::label_out_of_range))
        throw IndexError(str("cross_entropy: label ", value, " at row ", index, " is out of range [0, ", bound, ")"));
    if (code == static_cast<int>(DeviceErrorCode::index_out_of_range))
        throw IndexError(str(what ? what : "an indexing op", ": index ", value, " at position ", index,
                             " is out of range [0, ", bound, ") (reported by a GPU kernel)"));
    if (code == static_cast<int>(DeviceErrorCode::value_not_binary))
        throw ValueError(str(what ? what : "an op", ": the value at flat position ", index,
                             " is neither 0 nor 1 (reported by a GPU kernel)"));
    if (code == static_cast<int>(DeviceErrorCode::invalid_value))
        throw ValueError(str(what ? what : "an op: an invalid value", " in row ", index,
                             value >= 0 ? str(" at column ", value) : std::string(), " (reported by a GPU kernel)"));
    if (code == static_cast<int>(DeviceErrorCode::loss_scale_collapsed))
        throw NumericalError(str("GradScaler: the loss scale collapsed to ",
                                 std::bit_cast<float>(static_cast<std::int32_t>(value)), " after ", index,
                                 " consecutive skipped steps (non-finite gradients at every scale): the training "
                                 "diverged (reported by a GPU kernel)"));
    throw CudaError(str("cuda:", ctx.device, ": a kernel reported unknown error code ", code));
}

void set_weight_gradient_overlap(WeightGradientOverlap mode) {
    g_weight_gradient_overlap.store(static_cast<int>(mode), std::memory_order_relaxed);
}

WeightGradientOverlap weight_gradient_overlap() {
    int mode = g_weight_gradient_overlap.load(std::memory_order_relaxed);
    if (mode < 0) {
        int expected = -1;
        g_weight_gradient_overlap.compare_exchange_strong(expected, static_cast<int>(overlap_from_environment()));
        mode = g_weight_gradient_overlap.load(std::memory_order_relaxed);
    }
    return static_cast<WeightGradientOverlap>(mode);
}

bool side_lane_wanted(const DeviceContext& ctx, double fused_multiply_adds) {
    if (fused_multiply_adds > kSideLaneWorkLimit) return false;
    // A lane cannot be created inside a capture (its handles allocate): prepare_side_lane makes it before.
    if (capturing(ctx.device)) return weight_gradient_overlap() != WeightGradientOverlap::never &&
                                      tls_contexts.has_lanes(ctx.device);
    return weight_gradient_overlap() == WeightGradientOverlap::always;
}

void prepare_side_lane(int device) {
    if (weight_gradient_overlap() != WeightGradientOverlap::never) tls_contexts.prepare(owner(device));
}

SideWork::SideWork(DeviceContext& ctx, bool wanted) {
    if (!wanted) return;
    ContextOwner& o = owner(ctx.device);
    SideLane& lane = tls_contexts.next_lane(o);
    // The lane waits for everything the main stream has queued, the allocations of this op's blocks included.
    DG_CUDA_CHECK(cudaEventRecord(lane.forked.get(), ctx.stream));
    DG_CUDA_CHECK(cudaStreamWaitEvent(lane.ctx.stream, lane.forked.get(), 0));
    if (!lane.pending) {
        lane.pending = true;
        tls_contexts.note_pending();
    }
    lane_ = &lane;
    lane_context_ = &lane.ctx;
}

void SideWork::keep(const Tensor& t) {
    if (lane_ && t.defined()) lane_->kept.push_back(t);
}

void SideWork::keep(Workspace& workspace) {
    if (!lane_) return;
    const std::size_t bytes = workspace.bytes();
    lane_->kept_blocks.reserve(lane_->kept_blocks.size() + 1);  // may throw before the block changes hands
    lane_->kept_blocks.emplace_back(workspace.release(), bytes);
}

void SideWork::produced(const Tensor& t) {
    if (!lane_ || !t.defined()) return;
    keep(t);
    lane_->produced.push_back(t.raw_data());
}

bool side_lane_pending(const Tensor& t) noexcept {
    if (!t.defined() || !t.device().is_cuda()) return false;
    return tls_contexts.pending(t.raw_data(), t.device().index);
}

void join_side_lanes() { tls_contexts.join_all(); }

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

// ---- user_kernels.h ----

cudaStream_t current_stream(int device) { return context(device).stream; }

cudaStream_t current_stream_for(const Tensor& t) { return context_for(t).stream; }

unsigned grid_size(int device, std::int64_t n, unsigned threads) { return grid_size(context(device), n, threads); }

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

std::size_t device_total_memory(int device) {
    cudaDeviceProp prop{};
    DG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    return prop.totalGlobalMem;
}

void synchronize(int device) {
    throw_if_capturing(device, "cuda::synchronize()", kWaitsForGraph);
    ContextOwner& o = owner(device);
    DG_CUDA_CHECK(cudaStreamSynchronize(o.ctx.stream));
    raise_device_error(o.ctx);
}

void profiler_start() { DG_CUDA_CHECK(cudaProfilerStart()); }
void profiler_stop() { DG_CUDA_CHECK(cudaProfilerStop()); }

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
void set_deterministic(bool deterministic) { g_deterministic.store(deterministic, std::memory_order_relaxed); }
bool deterministic() { return g_deterministic.load(std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

}  // namespace dyngrad::cuda
