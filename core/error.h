// dyngrad error model: every failure in library code is a typed exception.
// Library code never exits, aborts or prints-and-continues; it throws one of these.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dyngrad {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Shapes that do not fit together (broadcast, inner dimensions, axes out of range).
class ShapeError : public Error { using Error::Error; };
// A dtype an op does not accept, or inputs of different dtypes.
class DTypeError : public Error { using Error::Error; };
// Inputs on different devices, or a device that does not exist / is not compiled in.
class DeviceError : public Error { using Error::Error; };
// Misuse of the graph: stale handles, backward on a non-scalar without a gradient, backward twice.
class GraphError : public Error { using Error::Error; };
// Memory read or written after Storage::release_memory (core/tensor.h) and before restore_memory: e.g. a ZeRO-3
// unit's gathered parameters outside their unit's forward and backward.
class ReleasedMemoryError : public GraphError { using GraphError::GraphError; };
// Out-of-range element access or label values.
class IndexError : public Error { using Error::Error; };
// Invalid argument values (negative sizes, bad attributes, mismatched factory sizes).
class ValueError : public Error { using Error::Error; };
// A CUDA, cuBLAS or cuDNN call failed.
class CudaError : public Error { using Error::Error; };
// The device ran out of memory; the library stays usable after this is thrown.
class OutOfMemory : public CudaError { using CudaError::CudaError; };
// Files: missing, truncated or malformed.
class IoError : public Error { using Error::Error; };
// A NaN or Inf found by anomaly mode (graph/anomaly.h) in a node's value or gradient.
class NumericalError : public Error { using Error::Error; };
// A collective of the distributed layer (distributed/) failed: an NCCL or MPI error, a timeout (a peer died or
// never joined), a failed rendezvous, or a communicator aborted by the watchdog. Names the collective and rank.
class DistributedError : public Error { using Error::Error; };

// Concatenates its arguments with operator<< into one message.
template <typename... Args>
std::string str(const Args&... args) {
    std::ostringstream out;
    (out << ... << args);
    return out.str();
}

}  // namespace dyngrad

namespace dyngrad {
// Inside a catch block: rethrows the exception being handled as the same dyngrad error type with
// `context` prepended to its message (so callers can catch by type and read where it happened).
// Non-dyngrad exceptions become dyngrad::Error. Called outside a catch block (nothing to rethrow) it throws
// ValueError instead of terminating the process.
[[noreturn]] void rethrow_with_context(const std::string& context);

// Throws DeviceError "<what>: this build of dyngrad has no <missing>": the stubs of a build without CUDA or NCCL.
[[noreturn]] void throw_not_built(const std::string& what,
                                  const char* missing = "CUDA backend (configure with -DDYNGRAD_CUDA=ON)");
}  // namespace dyngrad
