// A group of processes that train together (data parallelism), one process per GPU, on one or many hosts.
// Collectives on dyngrad tensors: NCCL for CUDA tensors (on dyngrad's device stream, cuda/context.h), MPI for
// CPU tensors. No transport of our own: MPI launches the processes (mpirun) and carries the NCCL id; without
// MPI (torchrun's variables) a small TCP rendezvous (distributed/rendezvous.h) exchanges only that id.
//
//   auto group = dist::ProcessGroup::init();  // mpirun -np 2 ./train   or   torchrun --nproc-per-node 2 ./train
//   group.all_reduce(t, dist::ReduceOp::Avg);  // every rank ends with the mean of every rank's t
//
// Nothing waits forever (docs/distributed.md, "Failures"): every MPI call is non-blocking and polled up to the
// group's timeout (DYNGRAD_DIST_TIMEOUT seconds, default 600), MPI errors are returned (MPI_ERRORS_RETURN),
// NCCL communicators are created (and their peers connected) within the timeout, and a watchdog thread aborts
// the communicator when a collective has not finished within the timeout or NCCL reports an asynchronous error;
// every later call then throws. All failures are DistributedError naming the collective, the rank, and the
// tensors' shapes, dtypes and devices; bad arguments are ShapeError / DTypeError / DeviceError / ValueError
// (IndexError for a root outside the group, as for any rank or index out of range) and are detected before
// anything is sent, so the group stays usable.
//
// Every rank must call the same collectives in the same order with tensors of the same shapes and dtypes
// (as with MPI and NCCL). A group is a handle: copies share the communicators. Use it from one thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dyngrad/core/device.h"
#include "dyngrad/core/tensor.h"

namespace dyngrad::dist {

enum class ReduceOp { Sum, Avg };
const char* reduce_op_name(ReduceOp op);

struct ProcessGroupOptions {
    // Seconds a collective, the rendezvous or the creation of a communicator may take before it fails with
    // DistributedError. 0: DYNGRAD_DIST_TIMEOUT from the environment, else 600.
    double timeout_seconds = 0;
    // The CUDA device of this process. -1: local rank modulo the number of devices; a build without CUDA, or a
    // machine without devices, makes a CPU-only group (CUDA tensors then throw DeviceError).
    int device = -1;
    // Create the NCCL communicator (when NCCL is compiled in and a device is present).
    bool use_nccl = true;
};

// Where a process group's ranks come from, parsed from the environment (mpirun's OMPI_COMM_WORLD_* or
// PMI_* variables, or torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
struct LaunchEnvironment {
    enum class Kind { Single, Mpi, Torchrun } kind = Kind::Single;
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;
    std::string master_addr;  // torchrun
    int master_port = 0;      // torchrun: the port the rendezvous uses (see docs/distributed.md)
};
// `getenv` reads one variable (nullptr when unset): tests pass their own. ValueError for variables that are
// not numbers, out of range, or inconsistent (RANK >= WORLD_SIZE, a torchrun launch without MASTER_ADDR).
LaunchEnvironment parse_launch_environment(const char* (*getenv)(const char*));

// The timeout a group uses with `requested` seconds (0: DYNGRAD_DIST_TIMEOUT, else 600); ValueError for
// a negative, non-finite or unparsable value.
double resolve_timeout(double requested);

class ProcessGroup {
public:
    // Whatever launched this process: mpirun (MPI), torchrun's variables, or nothing (a group of one).
    static ProcessGroup init(const ProcessGroupOptions& options = {});
    // MPI_COMM_WORLD (MPI_Init_thread when MPI is not yet initialised; MPI_Finalize at exit then).
    static ProcessGroup from_mpi(const ProcessGroupOptions& options = {});
    // torchrun's variables: a TCP rendezvous at MASTER_ADDR:port exchanges the NCCL id; GPU tensors only.
    static ProcessGroup from_env(const ProcessGroupOptions& options = {});
    // A group of one process: every collective is a copy or nothing (code written for N ranks runs on one).
    static ProcessGroup single(const ProcessGroupOptions& options = {});

    int rank() const;
    int world_size() const;
    int local_rank() const;
    // The CUDA device this process drives (Device::cpu() for a CPU-only group).
    Device device() const;
    bool has_mpi() const;
    bool has_nccl() const;
    double timeout_seconds() const;
    // "rank 1/2 (mpi, nccl on cuda:1)"
    std::string describe() const;

    // In place on every rank: t becomes the sum (or mean) of every rank's t. f32, f64, bf16, f16 (i64: Sum only);
    // 16-bit values are added in float and rounded back at each step of the reduction (NCCL's way; on the CPU an
    // MPI user op), and the mean is the sum scaled by 1/W in float, rounded (NCCL scales each input first).
    void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
    // t becomes root's t on every rank. IndexError: root not in [0, world_size()).
    void broadcast(Tensor& t, int root = 0);
    // output (world, input's shape...) holds every rank's input, by rank. The returning form allocates it. In
    // place when input is output's block at this rank (the same memory): nothing copied there.
    void all_gather(const Tensor& input, Tensor& output);
    Tensor all_gather(const Tensor& input);
    // input (world·k, ...): output (k, ...) is rank r's block of the sum (or mean) of every rank's input.
    void reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::Sum);
    Tensor reduce_scatter(const Tensor& input, ReduceOp op = ReduceOp::Sum);
    void barrier();

    struct Impl;  // internal (distributed/process_group.cpp); DistributedDataParallel uses its asynchronous calls
    Impl& impl() const { return *impl_; }

private:
    explicit ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<Impl> impl_;
};

}  // namespace dyngrad::dist
