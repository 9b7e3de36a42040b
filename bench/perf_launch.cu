// The floor under every GPU op's host cost: launching a kernel that does nothing (dyngrad-perf's host
// overhead figure reports it next to the engine's cost per recorded op).
#include <cuda_runtime.h>

namespace {
__global__ void empty_kernel() {}
}  // namespace

// Queues `count` launches of an empty kernel on `stream` and returns at once (no synchronisation).
// Returns the first launch error, cudaSuccess otherwise.
cudaError_t launch_empty_kernels(int count, cudaStream_t stream) {
    for (int i = 0; i < count; ++i) empty_kernel<<<1, 1, 0, stream>>>();
    return cudaGetLastError();
}
