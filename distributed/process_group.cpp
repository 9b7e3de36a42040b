// ProcessGroup (distributed/process_group.h): launch detection, MPI for CPU tensors and for the NCCL id, NCCL for
// CUDA tensors (distributed/nccl.cpp), argument checks before anything is sent.
#include "dyngrad/distributed/process_group.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/core/error.h"
#include "dyngrad/core/half.h"
#include "dyngrad/distributed/group_impl.h"
#include "dyngrad/distributed/rendezvous.h"

namespace dyngrad::dist {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

namespace {

// Finalizes MPI at exit when this library initialised it (a user who called MPI_Init finalizes it himself).
struct MpiLifetime {
    bool initialised_here = false;
    ~MpiLifetime() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (initialised_here && !finalized) MPI_Finalize();
    }
};
MpiLifetime& mpi_lifetime() {
    static MpiLifetime lifetime;
    return lifetime;
}

bool parse_int(const char* text, long long& out) {
    if (!text || !*text) return false;
    char* end = nullptr;
    errno = 0;
    out = std::strtoll(text, &end, 10);
    return errno == 0 && end && *end == '\0';
}

int env_int(const char* (*getenv)(const char*), const char* name, long long low, long long high) {
    const char* text = getenv(name);
    long long v = 0;
    if (!parse_int(text, v) || v < low || v > high)
        throw ValueError(str("process group: ", name, "='", text ? text : "", "' is not an integer in ", low, "..", high));
    return static_cast<int>(v);
}

// MPI's counts are ints: a message past INT_MAX elements (bytes, for the byte-wise broadcast and gather) would wrap
// to a negative or short count. Refused typed before anything is sent (a ZeRO flat buffer of a large model on the
// CPU could reach it; NCCL takes size_t counts and has no such limit).
int mpi_count(std::size_t count, const std::string& what, const char* unit) {
    if (count > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        throw ShapeError(str(what, ": ", count, " ", unit, " exceed MPI's int count (", std::numeric_limits<int>::max(),
                             "); split the tensor"));
    return static_cast<int>(count);
}

// MPI datatype of a dtype; DTypeError for one no collective takes.
// MPI has no 16-bit floating types: bf16/f16 travel as uint16 and are summed by these user ops, each pair of
// elements added in float and rounded back to nearest even (as NCCL adds them), for DDP's compressed buckets.
template <const HalfFormat& format>
void sum_half(void* in, void* inout, int* count, MPI_Datatype*) {
    const auto* a = static_cast<const std::uint16_t*>(in);
    auto* b = static_cast<std::uint16_t*>(inout);
    for (int i = 0; i < *count; ++i) {
        const float sum = static_cast<float>(half_bits_to_double(a[i], format)) +
                          static_cast<float>(half_bits_to_double(b[i], format));
        b[i] = round_to_half_bits(sum, format);
    }
}

template <const HalfFormat& format>
MPI_Op create_half_sum() {
    MPI_Op op = MPI_OP_NULL;
    MPI_Op_create(&sum_half<format>, 1, &op);
    return op;
}

// MPI_SUM, or for bf16/f16 the user op above.
MPI_Op sum_op(DType dtype, const std::string& what) {
    if (!is_reduced_precision(dtype)) return MPI_SUM;
    // Created once per process on first use (after MPI_Init); MPI frees user ops at MPI_Finalize.
    static const MPI_Op bf16 = create_half_sum<kBFloat16Format>();
    static const MPI_Op f16 = create_half_sum<kFloat16Format>();
    const MPI_Op op = dtype == DType::bf16 ? bf16 : f16;
    if (op == MPI_OP_NULL) throw DistributedError(str(what, ": MPI could not create the 16-bit sum operation"));
    return op;
}

MPI_Datatype mpi_type(DType dtype, const std::string& what) {
    switch (dtype) {
        case DType::f32: return MPI_FLOAT;
        case DType::f64: return MPI_DOUBLE;
        case DType::i64: return MPI_INT64_T;
        case DType::bf16:
        case DType::f16: return MPI_UINT16_T;  // summed by sum_op's user op
    }
    throw DTypeError(str(what, ": dtype ", dtype_name(dtype), " is not supported (f32, f64, i64, bf16, f16)"));
}

void check_defined(const Tensor& t, const std::string& what, const char* role) {
    if (!t.defined()) throw ValueError(str(what, ": the ", role, " tensor is undefined"));
}

}  // namespace

double resolve_timeout(double requested) {
    if (requested < 0 || !std::isfinite(requested))
        throw ValueError(str("process group: timeout ", requested, " s must be a positive number of seconds"));
    if (requested > 0) return requested;
    const char* text = std::getenv("DYNGRAD_DIST_TIMEOUT");
    if (!text || !*text) return 600;
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    if (!end || *end != '\0' || !(v > 0) || !std::isfinite(v))
        throw ValueError(str("process group: DYNGRAD_DIST_TIMEOUT='", text, "' is not a positive number of seconds"));
    return v;
}

LaunchEnvironment parse_launch_environment(const char* (*getenv)(const char*)) {
    LaunchEnvironment env;
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")) {
        env.kind = LaunchEnvironment::Kind::Mpi;
        if (getenv("OMPI_COMM_WORLD_SIZE")) {
            env.world_size = env_int(getenv, "OMPI_COMM_WORLD_SIZE", 1, 1 << 24);
            env.rank = env_int(getenv, "OMPI_COMM_WORLD_RANK", 0, env.world_size - 1);
            if (getenv("OMPI_COMM_WORLD_LOCAL_RANK"))
                env.local_rank = env_int(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", 0, env.world_size - 1);
        }
        return env;  // other MPIs: MPI_Comm_rank / MPI_Comm_split_type give the ranks
    }
    if (getenv("WORLD_SIZE") || getenv("RANK")) {
        env.kind = LaunchEnvironment::Kind::Torchrun;
        env.world_size = env_int(getenv, "WORLD_SIZE", 1, 1 << 24);
        env.rank = env_int(getenv, "RANK", 0, env.world_size - 1);
        env.local_rank = getenv("LOCAL_RANK") ? env_int(getenv, "LOCAL_RANK", 0, env.world_size - 1) : env.rank;
        const char* addr = getenv("MASTER_ADDR");
        if (!addr || !*addr)
            throw ValueError("process group: torchrun launch (RANK/WORLD_SIZE set) without MASTER_ADDR");
        env.master_addr = addr;
        // torchrun's agent may host its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE): then the
        // rendezvous takes the next port. DYNGRAD_RENDEZVOUS_PORT overrides both.
        if (getenv("DYNGRAD_RENDEZVOUS_PORT")) {
            env.master_port = env_int(getenv, "DYNGRAD_RENDEZVOUS_PORT", 1, 65535);
        } else {
            env.master_port = env_int(getenv, "MASTER_PORT", 1, 65535);
            const char* agent_store = getenv("TORCHELASTIC_USE_AGENT_STORE");
            if (agent_store && (std::strcmp(agent_store, "True") == 0 || std::strcmp(agent_store, "1") == 0)) {
                if (env.master_port == 65535)
                    throw ValueError("process group: MASTER_PORT=65535 is torchrun's store; set DYNGRAD_RENDEZVOUS_PORT");
                env.master_port += 1;
            }
        }
    }
    return env;
}

ProcessGroup::Impl::~Impl() {
    nccl.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
}

std::string ProcessGroup::Impl::what(const std::string& collective, const Tensor& t) const {
    const std::string tensor = t.defined() ? dyngrad::describe(t) : std::string("an undefined tensor");
    return str(collective, " of ", tensor, ", rank ", rank, "/", world);
}

void ProcessGroup::Impl::check_mpi(int code, const std::string& what) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw DistributedError(str(what, ": MPI error ", code, ": ", text));
}

void ProcessGroup::Impl::wait_mpi(MPI_Request& request, const std::string& what) const {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
    for (int polls = 0;; ++polls) {
        int done = 0;
        MPI_Status status;
        check_mpi(MPI_Test(&request, &done, &status), what);
        if (done) return;
        if (Clock::now() > deadline)
            throw DistributedError(str(what, ": timed out after ", timeout, " s (DYNGRAD_DIST_TIMEOUT): a peer ",
                                       "died, never called this collective, or called another one; the group ",
                                       "is unusable now"));
        // Spin briefly (the usual case finishes within microseconds), then back off to spare the core.
        if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(polls > 20000 ? 1000 : 50));
    }
}

MPI_Request ProcessGroup::Impl::start_mpi_all_reduce(void* data, std::size_t count, DType dtype,
                                                     const std::string& what) const {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count, what, "elements"), mpi_type(dtype, what),
                             sum_op(dtype, what), comm, &request),
              what);
    return request;
}

void ProcessGroup::Impl::check_device(const Tensor& t, const std::string& what) const {
    if (device < 0)
        throw DeviceError(str(what, ": this rank's group has no CUDA device (", t.device().to_string(),
                              " tensors cannot be reduced here)"));
    if (t.device() != Device::cuda(device))
        throw DeviceError(str(what, ": the tensor is on ", t.device().to_string(), ", this rank's device is cuda:",
                              device));
}

NcclComm& ProcessGroup::Impl::nccl_for(const Tensor& t, const std::string& what) const {
    check_device(t, what);
    if (!nccl)
        throw DeviceError(str(what, ": this group has no NCCL communicator (",
                              nccl_compiled() ? "use_nccl = false" : "built without NCCL", "); CUDA tensors need one"));
    return *nccl;
}

namespace {

int choose_device(const ProcessGroupOptions& options, int local_rank) {
    const int count = device_memory::device_count();
    if (options.device >= 0) {
        if (options.device >= count)
            throw DeviceError(str("process group: device cuda:", options.device, " requested, ", count,
                                  " CUDA device(s) present"));
        return options.device;
    }
    return count > 0 ? local_rank % count : -1;
}

const char* process_getenv(const char* name) { return std::getenv(name); }

}  // namespace

ProcessGroup ProcessGroup::single(const ProcessGroupOptions& options) {
    auto impl = std::make_shared<Impl>();
    impl->timeout = resolve_timeout(options.timeout_seconds);
    impl->device = choose_device(options, 0);
    return ProcessGroup(impl);
}

ProcessGroup ProcessGroup::from_mpi(const ProcessGroupOptions& options) {
    auto impl = std::make_shared<Impl>();
    impl->kind = LaunchEnvironment::Kind::Mpi;
    impl->timeout = resolve_timeout(options.timeout_seconds);
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
        int provided = 0;
        if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            throw DistributedError("process group: MPI_Init_thread failed");
        mpi_lifetime().initialised_here = true;
    }
    // Our own communicator, whose errors come back as codes instead of aborting the job.
    impl->check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm), "process group: MPI_Comm_dup");
    impl->check_mpi(MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN), "process group: MPI_Comm_set_errhandler");
    MPI_Comm_rank(impl->comm, &impl->rank);
    MPI_Comm_size(impl->comm, &impl->world);
    // The local rank: the rank among the processes sharing this host's memory.
    MPI_Comm local = MPI_COMM_NULL;
    impl->check_mpi(MPI_Comm_split_type(impl->comm, MPI_COMM_TYPE_SHARED, impl->rank, MPI_INFO_NULL, &local),
                    "process group: MPI_Comm_split_type");
    MPI_Comm_rank(local, &impl->local_rank);
    int local_size = 1;
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    impl->device = choose_device(options, impl->local_rank);
    // NCCL needs a GPU of its own per rank: with more ranks on this host than devices (the MPI tests on a one-GPU
    // machine), the group is CPU-only unless a device was named, and CUDA collectives say why (nccl_for).
    if (options.device < 0 && local_size > device_memory::device_count()) impl->device = -1;
    if (options.use_nccl && impl->device >= 0 && nccl_compiled()) {
        std::vector<char> id = impl->rank == 0 ? nccl_unique_id() : std::vector<char>();
        std::uint64_t size = id.size();
        MPI_Request request = MPI_REQUEST_NULL;
        const std::string what = str("process group: broadcast of the NCCL id, rank ", impl->rank, "/", impl->world);
        impl->check_mpi(MPI_Ibcast(&size, 1, MPI_UINT64_T, 0, impl->comm, &request), what);
        impl->wait_mpi(request, what);
        id.resize(size);
        impl->check_mpi(MPI_Ibcast(id.data(), static_cast<int>(size), MPI_CHAR, 0, impl->comm, &request), what);
        impl->wait_mpi(request, what);
        impl->nccl = nccl_create(id, impl->rank, impl->world, impl->device, impl->timeout);
    }
    return ProcessGroup(impl);
}

ProcessGroup ProcessGroup::from_env(const ProcessGroupOptions& options) {
    const LaunchEnvironment env = parse_launch_environment(process_getenv);
    if (env.kind != LaunchEnvironment::Kind::Torchrun)
        throw ValueError("process group: from_env needs torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
    auto impl = std::make_shared<Impl>();
    impl->kind = env.kind;
    impl->rank = env.rank;
    impl->world = env.world_size;
    impl->local_rank = env.local_rank;
    impl->timeout = resolve_timeout(options.timeout_seconds);
    impl->device = choose_device(options, env.local_rank);
    if (env.world_size > 1 && (impl->device < 0 || !nccl_compiled() || !options.use_nccl))
        throw DeviceError(str("process group: rank ", env.rank, "/", env.world_size, " launched by torchrun has ",
                              nccl_compiled() ? "no CUDA device" : "no NCCL in this build",
                              "; without MPI only CUDA tensors can be reduced (launch with mpirun for CPU tensors)"));
    if (impl->device >= 0 && nccl_compiled() && options.use_nccl) {
        const std::vector<char> id = rendezvous_exchange(env.master_addr, env.master_port, env.rank, env.world_size,
                                                         env.rank == 0 ? nccl_unique_id() : std::vector<char>(),
                                                         impl->timeout);
        impl->nccl = nccl_create(id, impl->rank, impl->world, impl->device, impl->timeout);
    }
    return ProcessGroup(impl);
}

ProcessGroup ProcessGroup::init(const ProcessGroupOptions& options) {
    switch (parse_launch_environment(process_getenv).kind) {
        case LaunchEnvironment::Kind::Mpi: return from_mpi(options);
        case LaunchEnvironment::Kind::Torchrun: return from_env(options);
        case LaunchEnvironment::Kind::Single: break;
    }
    return single(options);
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::world_size() const { return impl_->world; }
int ProcessGroup::local_rank() const { return impl_->local_rank; }
Device ProcessGroup::device() const { return impl_->device >= 0 ? Device::cuda(impl_->device) : Device::cpu(); }
bool ProcessGroup::has_mpi() const { return impl_->comm != MPI_COMM_NULL; }
bool ProcessGroup::has_nccl() const { return impl_->nccl != nullptr; }
double ProcessGroup::timeout_seconds() const { return impl_->timeout; }

std::string ProcessGroup::describe() const {
    const char* launch = impl_->kind == LaunchEnvironment::Kind::Mpi        ? "mpi"
                         : impl_->kind == LaunchEnvironment::Kind::Torchrun ? "torchrun"
                                                                            : "single";
    return str("rank ", impl_->rank, "/", impl_->world, " (", launch,
               has_nccl() ? str(", nccl on cuda:", impl_->device) : std::string(", no nccl"), ")");
}

// ---- collectives ----
//
// Order in each: argument checks (typed, nothing sent, the group stays usable), then the world-1 shortcut,
// then NCCL for CUDA tensors or MPI for CPU ones.

namespace {

void check_reduce_dtype(const Tensor& t, ReduceOp op, const std::string& what) {
    if (!is_floating(t.dtype()) && !(t.dtype() == DType::i64 && op == ReduceOp::Sum))
        throw DTypeError(str(what, ": dtype ", dtype_name(t.dtype()), " cannot be reduced with ", reduce_op_name(op),
                             " (f32, f64, bf16, f16; i64 with sum)"));
}

void scale(Tensor& t, double factor) {
    if (is_reduced_precision(t.dtype())) {  // in float, rounded back (as NCCL's average of 16-bit values)
        const HalfFormat format = half_format(t.dtype());
        auto* p = static_cast<std::uint16_t*>(t.raw_data());
        for (std::int64_t i = 0; i < t.numel(); ++i)
            p[i] = round_to_half_bits(static_cast<float>(half_bits_to_double(p[i], format)) * static_cast<float>(factor),
                                      format);
    } else if (t.dtype() == DType::f32) {
        float* p = t.data<float>();
        const float f = static_cast<float>(factor);
        for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= f;
    } else {
        double* p = t.data<double>();
        for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= factor;
    }
}

}  // namespace

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op) {
    const std::string what = impl_->what(str("all_reduce(", reduce_op_name(op), ")"), t);
    check_defined(t, what, "input");
    check_reduce_dtype(t, op, what);
    if (t.device().is_cuda()) impl_->check_device(t, what);
    if (impl_->world == 1) return;
    if (t.device().is_cuda()) {
        nccl_all_reduce(impl_->nccl_for(t, what), t.raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()), t.dtype(), op, nullptr,
                        what);
    } else {
        MPI_Request request = impl_->start_mpi_all_reduce(t.raw_data(), static_cast<std::size_t>(t.numel()), t.dtype(), what);
        impl_->wait_mpi(request, what);
        if (op == ReduceOp::Avg) scale(t, 1.0 / impl_->world);
    }
    t.bump_version();
}

void ProcessGroup::broadcast(Tensor& t, int root) {
    const std::string what = impl_->what(str("broadcast(root ", root, ")"), t);
    check_defined(t, what, "input");
    if (root < 0 || root >= impl_->world)
        throw IndexError(str(what, ": root ", root, " is not a rank of this group of ", impl_->world));
    if (t.device().is_cuda()) impl_->check_device(t, what);
    if (impl_->world == 1) return;
    if (t.device().is_cuda()) {
        nccl_broadcast(impl_->nccl_for(t, what), t.raw_data(), static_cast<std::size_t>(t.numel()), t.dtype(), root, nullptr, what);
    } else {
        MPI_Request request = MPI_REQUEST_NULL;
        impl_->check_mpi(MPI_Ibcast(t.raw_data(), mpi_count(t.nbytes(), what, "bytes"), MPI_BYTE, root, impl_->comm, &request), what);
        impl_->wait_mpi(request, what);
    }
    t.bump_version();
}

namespace {

void check_pair(const Tensor& input, const Tensor& output, const std::string& what, const Shape& expected_output) {
    check_defined(input, what, "input");
    check_defined(output, what, "output");
    if (input.device() != output.device())
        throw DeviceError(str(what, ": input on ", input.device().to_string(), ", output on ",
                              output.device().to_string(), " (both must be on one device)"));
    if (input.dtype() != output.dtype())
        throw DTypeError(str(what, ": input ", dtype_name(input.dtype()), ", output ",
                             dtype_name(output.dtype()), " (they must match)"));
    if (output.shape() != expected_output)
        throw ShapeError(str(what, ": output has shape ", to_string(output.shape()), ", expected ",
                             to_string(expected_output)));
    if (input.shares_storage_with(output))
        throw ValueError(str(what, ": input and output share storage"));
}

}  // namespace

void ProcessGroup::all_gather(const Tensor& input, Tensor& output) {
    const std::string what = impl_->what("all_gather", input);
    check_defined(input, what, "input");
    Shape expected{impl_->world};
    for (std::int64_t d : input.shape()) expected.push_back(d);
    check_pair(input, output, what, expected);
    mpi_type(input.dtype(), what);  // the dtypes every backend takes
    const std::size_t count = static_cast<std::size_t>(input.numel());
    // In place: the input is this rank's block of the output (NCCL's in-place form; MPI_IN_PLACE for MPI).
    const bool in_place = input.device() == output.device() &&
                          input.raw_data() == static_cast<const char*>(output.raw_data()) +
                                                  static_cast<std::size_t>(impl_->rank) * input.nbytes();
    if (input.device().is_cuda()) impl_->check_device(input, what);
    if (impl_->world == 1) {
        if (!in_place) output.copy_from(input.reshaped(expected));
    } else if (input.device().is_cuda()) {
        nccl_all_gather(impl_->nccl_for(input, what), input.raw_data(), output.raw_data(), count, input.dtype(), nullptr, what);
    } else {
        MPI_Request request = MPI_REQUEST_NULL;
        const int bytes = mpi_count(input.nbytes(), what, "bytes");
        impl_->check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : input.raw_data(), bytes, MPI_BYTE, output.raw_data(),
                                        bytes, MPI_BYTE, impl_->comm, &request),
                         what);
        impl_->wait_mpi(request, what);
    }
    output.bump_version();
}

Tensor ProcessGroup::all_gather(const Tensor& input) {
    check_defined(input, impl_->what("all_gather", input), "input");
    Shape shape{impl_->world};
    for (std::int64_t d : input.shape()) shape.push_back(d);
    Tensor output = Tensor::empty(shape, input.dtype(), input.device());
    all_gather(input, output);
    return output;
}

namespace {
Shape scattered_shape(const Tensor& input, int world, const std::string& what) {
    if (input.rank() == 0 || input.size(0) % world != 0)
        throw ShapeError(str(what, ": input's first dimension must be a multiple of the world size ", world,
                             "; input has shape ", to_string(input.shape())));
    Shape shape = input.shape();
    shape[0] /= world;
    return shape;
}
}  // namespace

void ProcessGroup::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) {
    const std::string what = impl_->what(str("reduce_scatter(", reduce_op_name(op), ")"), input);
    check_defined(input, what, "input");
    check_reduce_dtype(input, op, what);
    check_pair(input, output, what, scattered_shape(input, impl_->world, what));
    const std::size_t count = static_cast<std::size_t>(output.numel());
    if (input.device().is_cuda()) impl_->check_device(input, what);
    if (impl_->world == 1) {
        output.copy_from(input);
        return;
    }
    if (input.device().is_cuda()) {
        nccl_reduce_scatter(impl_->nccl_for(input, what), input.raw_data(), output.raw_data(), count, input.dtype(), op, nullptr, what);
    } else {
        MPI_Request request = MPI_REQUEST_NULL;
        impl_->check_mpi(MPI_Ireduce_scatter_block(input.raw_data(), output.raw_data(), mpi_count(count, what, "elements"),
                                                   mpi_type(input.dtype(), what), sum_op(input.dtype(), what),
                                                   impl_->comm, &request),
                         what);
        impl_->wait_mpi(request, what);
        if (op == ReduceOp::Avg) scale(output, 1.0 / impl_->world);
    }
    output.bump_version();
}

Tensor ProcessGroup::reduce_scatter(const Tensor& input, ReduceOp op) {
    const std::string what = impl_->what(str("reduce_scatter(", reduce_op_name(op), ")"), input);
    check_defined(input, what, "input");
    Tensor output = Tensor::empty(scattered_shape(input, impl_->world, what), input.dtype(), input.device());
    reduce_scatter(input, output, op);
    return output;
}

void ProcessGroup::barrier() {
    const std::string what = str("barrier, rank ", impl_->rank, "/", impl_->world);
    if (impl_->world == 1) return;
    if (impl_->comm != MPI_COMM_NULL) {
        MPI_Request request = MPI_REQUEST_NULL;
        impl_->check_mpi(MPI_Ibarrier(impl_->comm, &request), what);
        impl_->wait_mpi(request, what);
        return;
    }
    // NCCL only (torchrun): a one-element all-reduce the host waits for.
    Tensor token = Tensor::ones({1}, DType::f32, device());
    all_reduce(token);
    token.item();
}

}  // namespace dyngrad::dist
