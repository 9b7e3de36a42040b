// Public: what a user's own CUDA kernels (e.g. a custom op's, samples/custom_op_kernels.cu) need to run on
// dyngrad's stream and be checked like dyngrad's own launches. Needs only the CUDA runtime's header (no cuDNN,
// no cuBLAS, no internal dyngrad header), and links against dyngrad and CUDA::cudart.
//
//   my_kernel<<<cuda::grid_size(device, n, 256), 256, 0, cuda::current_stream(device)>>>(...);
//   DG_CUDA_CHECK_LAUNCH();
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "dyngrad/core/tensor.h"

namespace dyngrad::cuda {

// The stream dyngrad queues all work for `device` on; makes `device` current on this thread. DeviceError
// when there is no such device.
cudaStream_t current_stream(int device);
// The stream of a tensor's device (DeviceError when the tensor is not on a CUDA device).
cudaStream_t current_stream_for(const Tensor& t);
// Number of blocks for a grid-stride loop over n elements at `threads` per block on `device`.
unsigned grid_size(int device, std::int64_t n, unsigned threads);

// Throws CudaError (OutOfMemory for allocation failures) naming the call, file:line and status.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line);

}  // namespace dyngrad::cuda

#define DG_CUDA_CHECK(expr)                                                                       \
    do {                                                                                          \
        const cudaError_t dg_status_ = (expr);                                                    \
        if (dg_status_ != cudaSuccess) ::dyngrad::cuda::throw_cuda_error(dg_status_, #expr, __FILE__, __LINE__); \
    } while (0)
// After every kernel launch: launch-configuration errors surface here, at the op that caused them.
#define DG_CUDA_CHECK_LAUNCH() DG_CUDA_CHECK(cudaGetLastError())
