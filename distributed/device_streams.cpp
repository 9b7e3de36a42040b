// The CUDA side of DistributedDataParallel's overlap (distributed/device_streams.h). Event records and stream waits are
// capturable: inside a cuda::CapturedStep the communication stream joins the capture through the first wait and
// rejoins dyngrad's stream through the last, so the graph holds the fork and the join.
#include "dyngrad/distributed/device_streams.h"

#include <cuda_runtime.h>

#include <vector>

#include "dyngrad/cuda/context.h"

namespace dyngrad::dist {

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

void device_copy(void* dst, const void* src, std::size_t bytes, int device) {
    if (bytes == 0) return;
    DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::context(device).stream));
}

void device_zero(void* dst, std::size_t bytes, int device) {
    if (bytes == 0) return;
    DG_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cuda::context(device).stream));
}

}  // namespace dyngrad::dist
