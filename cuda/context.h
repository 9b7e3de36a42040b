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

namespace dyngrad::cuda {

// Throw CudaError (OutOfMemory for allocation failures) naming the call, file:line and status.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line);

#define DG_CUDA_CHECK(expr)                                                                       \
    do {                                                                                          \
        const cudaError_t dg_status_ = (expr);                                                    \
        if (dg_status_ != cudaSuccess) ::dyngrad::cuda::throw_cuda_error(dg_status_, #expr, __FILE__, __LINE__); \
    } while (0)
#define DG_CUBLAS_CHECK(expr)                                                                     \
    do {                                                                                          \
        const cublasStatus_t dg_status_ = (expr);                                                 \
        if (dg_status_ != CUBLAS_STATUS_SUCCESS)                                                  \
            ::dyngrad::cuda::throw_cublas_error(dg_status_, #expr, __FILE__, __LINE__);           \
    } while (0)
#define DG_CUDNN_CHECK(expr)                                                                      \
    do {                                                                                          \
        const cudnnStatus_t dg_status_ = (expr);                                                  \
        if (dg_status_ != CUDNN_STATUS_SUCCESS)                                                   \
            ::dyngrad::cuda::throw_cudnn_error(dg_status_, #expr, __FILE__, __LINE__);            \
    } while (0)
// After every kernel launch: launch-configuration errors surface here, at the op that caused them.
#define DG_CUDA_CHECK_LAUNCH() DG_CUDA_CHECK(cudaGetLastError())

// Errors found by kernels (e.g. a label out of range) without a device sync inside the op: the first
// kernel to fail claims the record (atomicCAS on `code` from 0); the runtime raises it as an exception
// at the next point where the host waits for the stream (device-to-host copy, synchronize()).
enum class DeviceErrorCode : int { none = 0, label_out_of_range = 1 };
struct DeviceErrorRecord {
    int code;                // DeviceErrorCode
    long long index;         // e.g. the row of the bad label
    long long value;         // e.g. the bad label
    long long bound;         // e.g. the number of classes
};

struct DeviceContext {
    int device = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;      // bound to `stream`; math mode per the TF32 setting
    cublasLtHandle_t cublas_lt = nullptr;
    cudnnHandle_t cudnn = nullptr;        // this host thread's own, bound to `stream`
    cudaMemPool_t pool = nullptr;
    int multiprocessors = 0;
    DeviceErrorRecord* error_record = nullptr;         // mapped pinned memory: host reads and resets it
    DeviceErrorRecord* error_record_device = nullptr;  // the same record as kernels address it
};

// Throws (IndexError for label_out_of_range) and clears the record if a kernel reported an error.
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

private:
    DeviceContext& ctx_;
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// Number of blocks for a grid-stride loop over n elements at `threads` per block.
unsigned grid_size(const DeviceContext& ctx, std::int64_t n, unsigned threads);

}  // namespace dyngrad::cuda
