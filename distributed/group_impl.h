// Internal (distributed/ sources only): the state behind a ProcessGroup handle, and the CUDA half of it (the NCCL
// communicator, and DistributedDataParallel's communication stream), which distributed/nccl.cpp implements when
// NCCL is compiled in and distributed/nccl_unavailable.cpp stubs otherwise.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dyngrad/distributed/process_group.h"
#include "dyngrad/nn/layers.h"

namespace dyngrad::dist {

// ---- NCCL (one communicator per process, blocking unless DYNGRAD_NCCL_BLOCKING=0, watched) ----
struct NcclComm;
void destroy_nccl(NcclComm* comm) noexcept;
struct NcclDeleter {
    void operator()(NcclComm* comm) const noexcept { destroy_nccl(comm); }
};
using NcclHandle = std::unique_ptr<NcclComm, NcclDeleter>;

bool nccl_compiled();
// A fresh ncclUniqueId's bytes (rank 0 makes it, the launch channel carries it to the others).
std::vector<char> nccl_unique_id();
// ncclCommInitRankConfig on `device` and a first all-reduce connecting the peers, bounded by `timeout`
// seconds (then DistributedError; distributed/nccl.cpp says how). Starts the communicator's watchdog.
NcclHandle nccl_create(const std::vector<char>& id, int rank, int world, int device, double timeout);
// Queue one collective on `stream` (a cudaStream_t; nullptr: dyngrad's stream of the device). `what` names
// the call for errors ("all_reduce of f32 (4,3) on cuda:0, rank 1/2"). Throws DistributedError, also when
// the watchdog aborted the communicator earlier.
void nccl_all_reduce(NcclComm& comm, const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                     void* stream, const std::string& what);
void nccl_broadcast(NcclComm& comm, void* data, std::size_t count, DType dtype, int root, void* stream,
                    const std::string& what);
void nccl_all_gather(NcclComm& comm, const void* send, void* recv, std::size_t count_per_rank, DType dtype,
                     void* stream, const std::string& what);
void nccl_reduce_scatter(NcclComm& comm, const void* send, void* recv, std::size_t count_per_rank, DType dtype,
                         ReduceOp op, void* stream, const std::string& what);

// ---- DistributedDataParallel's overlap: a communication stream with an event pair per bucket ----
// Only a bucket all-reduced through NCCL uses the stream, so without NCCL make_comm_streams gives an empty
// CommStreams and the others throw DeviceError (never reached: nccl_for refuses the collective first).
struct CommStreams;
void destroy_comm_streams(CommStreams* streams) noexcept;
struct CommStreamsDeleter {
    void operator()(CommStreams* s) const noexcept { destroy_comm_streams(s); }
};
using CommStreamsHandle = std::unique_ptr<CommStreams, CommStreamsDeleter>;

// A non-blocking stream on `device` and `buckets` (ready, done) event pairs.
CommStreamsHandle make_comm_streams(int device, std::size_t buckets);
void* comm_stream(CommStreams& s);  // the cudaStream_t
// dyngrad's stream records bucket b's ready event; the communication stream waits for it.
void hand_bucket_to_comm(CommStreams& s, std::size_t bucket);
// The communication stream records bucket b's done event; dyngrad's stream waits for it (the host does not).
void hand_bucket_back(CommStreams& s, std::size_t bucket);

// Every rank must hold the same parameters and buffers (names, shapes, dtypes, in registration order). Cheap when
// they do: one all_gather of (count, hash). On a mismatch every rank learns the first differing entry and what
// each rank has there, and throws the same error: ShapeError (same name, another shape), DTypeError (another
// dtype) or ValueError (other names or counts). `who` starts the message ("DistributedDataParallel",
// "ZeroOptimizer"). Then rank 0's parameters and buffers (batch-norm statistics) everywhere.
// distributed/model_check.cpp.
void check_and_broadcast_model(ProcessGroup& group, const Module& module, const char* who);

// ---- the group ----
struct ProcessGroup::Impl {
    LaunchEnvironment::Kind kind = LaunchEnvironment::Kind::Single;
    int rank = 0;
    int world = 1;
    int local_rank = 0;
    double timeout = 600;
    int device = -1;                 // CUDA device, -1 for a CPU-only group
    MPI_Comm comm = MPI_COMM_NULL;   // a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN
    NcclHandle nccl;

    Impl() = default;
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;
    ~Impl();

    // "all_reduce(avg) of f32 (4,3) on cpu, rank 1/2"
    std::string what(const std::string& collective, const Tensor& t) const;
    // Throws DistributedError naming `what` when an MPI call returned an error code.
    void check_mpi(int code, const std::string& what) const;
    // Polls `request` up to the group's timeout; DistributedError on an error or on the timeout.
    void wait_mpi(MPI_Request& request, const std::string& what) const;
    // Starts an in-place MPI sum over a CPU f32/f64/i64 buffer, or bf16/f16 (uint16 on the wire, summed in float
    // and rounded back by a user op) (the request must be waited on).
    MPI_Request start_mpi_all_reduce(void* data, std::size_t count, DType dtype, const std::string& what) const;
    // DeviceError unless t is on this rank's CUDA device.
    void check_device(const Tensor& t, const std::string& what) const;
    NcclComm& nccl_for(const Tensor& t, const std::string& what) const;  // check_device; DeviceError without NCCL
};

}  // namespace dyngrad::dist
