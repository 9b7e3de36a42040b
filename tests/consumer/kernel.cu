// A user's own CUDA kernel through the public header only: y = x + 1 on dyngrad's stream, checked.
#include <dyngrad/cuda/user_kernels.h>

#include "kernel.h"

namespace {

__global__ void add_one_kernel(const double* x, double* y, std::int64_t n) {
    for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
        y[i] = x[i] + 1.0;
}

}  // namespace

dyngrad::Tensor add_one_on_gpu(const dyngrad::Tensor& x) {
    using namespace dyngrad;
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    constexpr unsigned kThreads = 128;
    const int device = x.device().index;
    add_one_kernel<<<cuda::grid_size(device, x.numel(), kThreads), kThreads, 0, cuda::current_stream_for(x)>>>(
        x.data<double>(), y.data<double>(), x.numel());
    DG_CUDA_CHECK_LAUNCH();
    return y;
}
