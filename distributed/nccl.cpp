// NCCL for CUDA tensors (distributed/group_impl.h): one communicator per process and a watchdog.
//
// Blocking by default (ncclConfig_t blocking = 1, as PyTorch): a collective's call only queues it. The
// non-blocking mode (DYNGRAD_NCCL_BLOCKING=0) starts a thread inside NCCL for every call, which made each
// all-reduce up to 4 MiB take ~0.05 ms of host time instead of ~0.02 (H200 x2, docs/performance.md), so it is
// kept for diagnosis only. Nothing waits past the timeout either way: the creation (and a first collective of
// each size class, which makes NCCL connect its peers) runs on a helper thread the caller waits for up to the
// timeout, non-blocking calls are polled (ncclCommGetAsyncError) up to it, and a collective whose peer died
// does not fail but spins on the GPU: the watchdog thread records an event after every collective queued
// outside a CUDA graph capture and aborts the communicator (ncclCommAbort, which also ends the spinning
// kernels) when one has not completed after the timeout or NCCL reports an asynchronous error. Every later
// call on the group then throws DistributedError with the reason. Inside a capture nothing is tracked (the
// graph's replays are the user's to bound).
//
// Also DistributedDataParallel's communication stream, which only its NCCL all-reduces use (the end of the file).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dyngrad/core/error.h"
#include "dyngrad/cuda/context.h"
#include "dyngrad/distributed/group_impl.h"

namespace dyngrad::dist {

using Clock = std::chrono::steady_clock;

struct NcclComm {
    ncclComm_t comm = nullptr;
    int rank = 0;
    int world = 1;
    int device = 0;
    double timeout = 600;
    bool blocking = true;             // ncclConfig_t blocking (DYNGRAD_NCCL_BLOCKING)

    std::mutex mutex;                 // guards everything below
    std::condition_variable wake;
    struct Pending {
        cudaEvent_t done;
        Clock::time_point queued;
        std::string what;
    };
    std::deque<Pending> pending;
    std::vector<cudaEvent_t> spare_events;
    std::string failure;              // set once the communicator is aborted
    bool stopping = false;
    std::thread watchdog;

    void watch();
    void abort_locked(const std::string& why);
};

namespace {

ncclDataType_t nccl_type(DType dtype, const std::string& what) {
    switch (dtype) {
        case DType::f32: return ncclFloat32;
        case DType::f64: return ncclFloat64;
        case DType::i64: return ncclInt64;
        case DType::bf16: return ncclBfloat16;  // DDP's compressed buckets (DDPOptions::compression)
        case DType::f16: return ncclFloat16;
    }
    throw DTypeError(str(what, ": dtype ", dtype_name(dtype), " is not supported by NCCL here (f32, f64, i64, bf16, f16)"));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclAvg; }

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
    std::string text = ncclGetErrorString(r);
    if (const char* last = comm ? ncclGetLastError(comm) : nullptr; last && *last) text += str(" (", last, ")");
    return text;
}

// Waits while the communicator reports ncclInProgress (non-blocking mode), up to the timeout. The caller holds
// c.mutex (or no watchdog runs yet), so the watchdog cannot abort the communicator under the call.
void settle(NcclComm& c, ncclResult_t r, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.timeout));
    while (r == ncclInProgress) {
        if (Clock::now() > deadline) {
            c.abort_locked(str(what, ": NCCL did not finish the call within ", c.timeout, " s"));
            throw DistributedError(c.failure);
        }
        std::this_thread::yield();
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(c.comm, &state);
        r = state;
    }
    if (r != ncclSuccess) {
        const std::string text = str(what, ": NCCL error: ", nccl_text(r, c.comm));
        c.abort_locked(text);
        throw DistributedError(text);
    }
}

cudaStream_t stream_of(NcclComm& c, void* stream) {
    return stream ? static_cast<cudaStream_t>(stream) : cuda::context(c.device).stream;
}

// Throws when the watchdog aborted the communicator; else runs `call` and hands the queued work to the watchdog.
template <typename Call>
void run_collective(NcclComm& c, void* stream_arg, const std::string& what, Call call) {
    const cudaStream_t stream = stream_of(c, stream_arg);
    const std::lock_guard lock(c.mutex);  // the watchdog cannot abort (and free) the communicator meanwhile
    if (!c.failure.empty()) throw DistributedError(str(what, ": the communicator was aborted earlier: ", c.failure));
    settle(c, call(stream), what);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DG_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return;  // a graph node: its replays are not tracked
    cudaEvent_t done = nullptr;
    if (!c.spare_events.empty()) {
        done = c.spare_events.back();
        c.spare_events.pop_back();
    } else {
        DG_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    }
    DG_CUDA_CHECK(cudaEventRecord(done, stream));
    c.pending.push_back({done, Clock::now(), what});
    c.wake.notify_one();
}

// Runs `work` on a thread of its own and waits up to `seconds` for it; false when it has not finished by then.
// The thread is then left behind (detached) with what it holds: a blocking NCCL call waiting for a peer that
// never comes cannot be interrupted, and the caller must not wait for it.
bool finishes_within(double seconds, std::function<void()> work) {
    struct Shared {
        std::mutex mutex;
        std::condition_variable finished;
        bool done = false;
    };
    auto shared = std::make_shared<Shared>();
    std::thread([shared, work = std::move(work)] {
        work();
        const std::lock_guard lock(shared->mutex);
        shared->done = true;
        shared->finished.notify_all();
    }).detach();
    std::unique_lock lock(shared->mutex);
    return shared->finished.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return shared->done; });
}

// A first all-reduce of one element and of 4 Mi elements makes a blocking communicator connect the peers
// (NCCL connects at a collective's first use of an algorithm and protocol, NCCL_RUNTIME_CONNECT), inside the
// bounded creation instead of inside a training step's collective, which the watchdog could not bound.
ncclResult_t connect_peers(ncclComm_t comm) {
    constexpr std::size_t kLargest = std::size_t{1} << 22;
    float* buffer = nullptr;
    cudaStream_t stream = nullptr;
    ncclResult_t r = ncclSuccess;
    if (cudaMalloc(&buffer, kLargest * sizeof(float)) != cudaSuccess ||
        cudaMemset(buffer, 0, kLargest * sizeof(float)) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        r = ncclUnhandledCudaError;
    }
    for (const std::size_t count : {std::size_t{1}, kLargest})
        if (r == ncclSuccess) r = ncclAllReduce(buffer, buffer, count, ncclFloat32, ncclSum, comm, stream);
    if (r == ncclSuccess && cudaStreamSynchronize(stream) != cudaSuccess) r = ncclUnhandledCudaError;
    if (stream) cudaStreamDestroy(stream);
    if (buffer) cudaFree(buffer);
    return r;
}

}  // namespace

void NcclComm::abort_locked(const std::string& why) {
    if (!failure.empty()) return;
    failure = why;
    if (comm) ncclCommAbort(comm);  // ends kernels still waiting for a peer
    comm = nullptr;
}

void NcclComm::watch() {
    cudaSetDevice(device);
    std::unique_lock lock(mutex);
    while (!stopping) {
        wake.wait_for(lock, std::chrono::milliseconds(100));
        if (stopping || !failure.empty()) continue;
        while (!pending.empty()) {
            Pending& p = pending.front();
            const cudaError_t state = cudaEventQuery(p.done);
            if (state == cudaSuccess) {
                spare_events.push_back(p.done);
                pending.pop_front();
                continue;
            }
            if (state != cudaErrorNotReady) {
                abort_locked(str(p.what, ": CUDA error while it ran: ", cudaGetErrorString(state)));
                break;
            }
            const double waited = std::chrono::duration<double>(Clock::now() - p.queued).count();
            if (waited > timeout)
                abort_locked(str(p.what, ": not finished after ", timeout, " s (DYNGRAD_DIST_TIMEOUT): a peer died ",
                                 "or never called it; the communicator was aborted, rank ", rank, "/", world));
            break;
        }
        if (comm && failure.empty()) {
            ncclResult_t state = ncclSuccess;
            if (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
                abort_locked(str("NCCL reported an asynchronous error on rank ", rank, "/", world, ": ",
                                 nccl_text(state, comm)));
        }
    }
}

void destroy_nccl(NcclComm* c) noexcept {
    if (!c) return;
    {
        const std::lock_guard lock(c->mutex);
        c->stopping = true;
    }
    c->wake.notify_one();
    if (c->watchdog.joinable()) c->watchdog.join();
    if (c->comm && !c->blocking) {
        // Finalize flushes queued work; in non-blocking mode it may report progress, which we poll (bounded).
        ncclResult_t r = ncclCommFinalize(c->comm);
        const auto deadline = Clock::now() + std::chrono::seconds(10);
        while (r == ncclInProgress && Clock::now() < deadline) {
            ncclCommGetAsyncError(c->comm, &r);
            std::this_thread::yield();
        }
        if (r == ncclSuccess) ncclCommDestroy(c->comm);
        else ncclCommAbort(c->comm);
    } else if (c->comm) {
        // Blocking: finalize waits for the queued work, bounded as the creation is; a communicator whose
        // finalize does not end (a peer gone) is left to its thread rather than waited for.
        const ncclComm_t comm = c->comm;
        (void)finishes_within(10, [comm] {
            if (ncclCommFinalize(comm) == ncclSuccess) ncclCommDestroy(comm);
            else ncclCommAbort(comm);
        });
    }
    for (auto& p : c->pending) cudaEventDestroy(p.done);
    for (cudaEvent_t e : c->spare_events) cudaEventDestroy(e);
    delete c;
}

bool nccl_compiled() { return true; }

std::vector<char> nccl_unique_id() {
    ncclUniqueId id;
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
        throw DistributedError(str("ncclGetUniqueId: ", ncclGetErrorString(r)));
    return std::vector<char>(id.internal, id.internal + sizeof id.internal);
}

NcclHandle nccl_create(const std::vector<char>& id_bytes, int rank, int world, int device, double timeout) {
    const std::string what = str("NCCL communicator (rank ", rank, "/", world, ", cuda:", device, ")");
    ncclUniqueId id;
    if (id_bytes.size() != sizeof id.internal)
        throw DistributedError(str(what, ": the NCCL id has ", id_bytes.size(), " bytes, expected ", sizeof id.internal));
    std::memcpy(id.internal, id_bytes.data(), sizeof id.internal);
    cuda::context(device);  // makes the device current on this thread and creates dyngrad's stream
    NcclHandle handle(new NcclComm);
    NcclComm& c = *handle;
    c.rank = rank;
    c.world = world;
    c.device = device;
    c.timeout = timeout;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    const char* mode = std::getenv("DYNGRAD_NCCL_BLOCKING");
    if (mode && std::string(mode) != "0" && std::string(mode) != "1")
        throw ValueError(str(what, ": DYNGRAD_NCCL_BLOCKING='", mode, "' (expected 1, the default, or 0: non-blocking)"));
    c.blocking = !(mode && std::string(mode) == "0");
    config.blocking = c.blocking ? 1 : 0;
    const std::string creation = str(what, ": creation (every rank must join within the timeout)");
    if (c.blocking) {
        // The creation and the first connections on a helper thread, bounded by the timeout (see the top).
        struct Result {
            ncclComm_t comm = nullptr;
            ncclResult_t init = ncclSuccess, connect = ncclSuccess;
        };
        auto result = std::make_shared<Result>();
        if (!finishes_within(timeout, [result, id, world, rank, device, config]() mutable {
                cudaSetDevice(device);
                result->init = ncclCommInitRankConfig(&result->comm, world, id, rank, &config);
                if (result->init == ncclSuccess) result->connect = connect_peers(result->comm);
            }))
            throw DistributedError(str(creation, ": NCCL did not finish creating and connecting within ", timeout,
                                       " s (DYNGRAD_DIST_TIMEOUT)"));
        c.comm = result->comm;
        const ncclResult_t r = result->init != ncclSuccess ? result->init : result->connect;
        if (r != ncclSuccess) {
            const std::string text = nccl_text(r, c.comm);
            if (c.comm) ncclCommAbort(c.comm);
            c.comm = nullptr;
            throw DistributedError(str(what, result->init != ncclSuccess ? ": ncclCommInitRankConfig failed: "
                                                                         : ": the first all-reduce (connecting the peers) failed: ",
                                       text));
        }
    } else {
        ncclResult_t r = ncclCommInitRankConfig(&c.comm, world, id, rank, &config);
        if (r != ncclSuccess && r != ncclInProgress) {
            const std::string text = nccl_text(r, c.comm);
            if (c.comm) ncclCommAbort(c.comm);
            c.comm = nullptr;
            throw DistributedError(str(what, ": ncclCommInitRankConfig failed: ", text));
        }
        settle(c, r, creation);
    }
    c.watchdog = std::thread([&c] { c.watch(); });
    return handle;
}

void nccl_all_reduce(NcclComm& c, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                     void* stream, const std::string& what) {
    const ncclDataType_t type = nccl_type(dtype, what);
    run_collective(c, stream, what, [&](cudaStream_t s) {
        return ncclAllReduce(send, recv, count, type, nccl_op(op), c.comm, s);
    });
}

void nccl_broadcast(NcclComm& c, void* data, std::size_t count, DType dtype, int root, void* stream,
                    const std::string& what) {
    const ncclDataType_t type = nccl_type(dtype, what);
    run_collective(c, stream, what, [&](cudaStream_t s) { return ncclBroadcast(data, data, count, type, root, c.comm, s); });
}

void nccl_all_gather(NcclComm& c, const void* send, void* recv, std::size_t count_per_rank, DType dtype, void* stream,
                     const std::string& what) {
    const ncclDataType_t type = nccl_type(dtype, what);
    run_collective(c, stream, what, [&](cudaStream_t s) { return ncclAllGather(send, recv, count_per_rank, type, c.comm, s); });
}

void nccl_reduce_scatter(NcclComm& c, const void* send, void* recv, std::size_t count_per_rank, DType dtype,
                         ReduceOp op, void* stream, const std::string& what) {
    const ncclDataType_t type = nccl_type(dtype, what);
    run_collective(c, stream, what, [&](cudaStream_t s) {
        return ncclReduceScatter(send, recv, count_per_rank, type, nccl_op(op), c.comm, s);
    });
}

// ---- DistributedDataParallel's overlap (distributed/group_impl.h) ----
// Event records and stream waits are capturable: inside a cuda::CapturedStep the communication stream joins the
// capture through the first wait and rejoins dyngrad's stream through the last, so the graph holds the fork and the
// join.

struct CommStreams {
    int device = 0;
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> ready;
    std::vector<cudaEvent_t> done;
};

void destroy_comm_streams(CommStreams* s) noexcept {
    if (!s) return;
    for (cudaEvent_t e : s->ready) cudaEventDestroy(e);
    for (cudaEvent_t e : s->done) cudaEventDestroy(e);
    if (s->stream) cudaStreamDestroy(s->stream);
    delete s;
}

CommStreamsHandle make_comm_streams(int device, std::size_t buckets) {
    cuda::context(device);  // current device on this thread
    CommStreamsHandle handle(new CommStreams);
    handle->device = device;
    // Higher priority than dyngrad's stream: a ready bucket's all-reduce should not queue behind backward kernels.
    int least = 0, greatest = 0;
    DG_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DG_CUDA_CHECK(cudaStreamCreateWithPriority(&handle->stream, cudaStreamNonBlocking, greatest));
    for (std::size_t b = 0; b < buckets; ++b) {
        cudaEvent_t e = nullptr;
        DG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        handle->ready.push_back(e);
        DG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        handle->done.push_back(e);
    }
    return handle;
}

void* comm_stream(CommStreams& s) { return s.stream; }

void hand_bucket_to_comm(CommStreams& s, std::size_t bucket) {
    DG_CUDA_CHECK(cudaEventRecord(s.ready[bucket], cuda::context(s.device).stream));
    DG_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.ready[bucket], 0));
}

void hand_bucket_back(CommStreams& s, std::size_t bucket) {
    DG_CUDA_CHECK(cudaEventRecord(s.done[bucket], s.stream));
    DG_CUDA_CHECK(cudaStreamWaitEvent(cuda::context(s.device).stream, s.done[bucket], 0));
}

}  // namespace dyngrad::dist
