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

// Device time per kernel node of a captured graph of `count` empty kernels, in µs: the launch-latency floor
// of a replayed step (every kernel of a CUDA graph pays at least this): the fastest of `repetitions` replays.
cudaError_t graph_kernel_node_us(int count, int repetitions, cudaStream_t stream, double* us_per_node) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    cudaError_t status = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (status == cudaSuccess) {
        for (int i = 0; i < count; ++i) empty_kernel<<<1, 1, 0, stream>>>();
        const cudaError_t launched = cudaGetLastError();
        status = cudaStreamEndCapture(stream, &graph);
        if (status == cudaSuccess) status = launched;
    }
    if (status == cudaSuccess) status = cudaGraphInstantiate(&exec, graph, 0);
    if (status == cudaSuccess) status = cudaEventCreate(&start);
    if (status == cudaSuccess) status = cudaEventCreate(&stop);
    float best = 0;
    for (int r = 0; status == cudaSuccess && r <= repetitions; ++r) {
        if (status == cudaSuccess) status = cudaEventRecord(start, stream);
        if (status == cudaSuccess) status = cudaGraphLaunch(exec, stream);
        if (status == cudaSuccess) status = cudaEventRecord(stop, stream);
        if (status == cudaSuccess) status = cudaEventSynchronize(stop);
        float ms = 0;
        if (status == cudaSuccess) status = cudaEventElapsedTime(&ms, start, stop);
        if (r > 0 && (best == 0 || ms < best)) best = ms;  // replay 0 warms up; the best is the floor
    }
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    *us_per_node = 1e3 * static_cast<double>(best) / count;
    return status;
}
