// CUDA kernels of the custom op in custom_op.cpp: y = a² + b²; da = 2a·dy, db = 2b·dy.
// They run on dyngrad's stream for the tensors' device, and are checked like dyngrad's own launches, through
// the one public header for user kernels (dyngrad/cuda/user_kernels.h: no cuDNN or cuBLAS in this build).
#include "custom_op_kernels.h"

#include <dyngrad/cuda/user_kernels.h>

namespace {

using namespace dyngrad;

template <typename T>
__global__ void sum_of_squares_forward_kernel(const T* a, const T* b, T* y, std::int64_t n) {
    for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
        y[i] = a[i] * a[i] + b[i] * b[i];
}

template <typename T>
__global__ void twice_times_kernel(const T* x, const T* dy, T* dx, std::int64_t n) {
    for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
        dx[i] = T(2) * x[i] * dy[i];
}

constexpr unsigned kThreads = 256;

Tensor forward(const ForwardArgs& args) {
    const Tensor& a = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, a.device());
    if (y.numel() == 0) return y;
    const int device = a.device().index;
    const cudaStream_t stream = cuda::current_stream_for(a);
    dispatch_floating(a.dtype(), "sum_of_squares", [&]<typename T>() {
        sum_of_squares_forward_kernel<T><<<cuda::grid_size(device, y.numel(), kThreads), kThreads, 0, stream>>>(
            a.data<T>(), args.inputs[1].data<T>(), y.data<T>(), y.numel());
        DG_CUDA_CHECK_LAUNCH();
    });
    return y;
}

std::vector<Tensor> backward(const BackwardArgs& args) {
    std::vector<Tensor> grads(2);
    const int device = args.grad_output.device().index;
    const cudaStream_t stream = cuda::current_stream_for(args.grad_output);
    for (int k = 0; k < 2; ++k) {
        if (!args.needs_grad[k]) continue;
        const Tensor& x = args.inputs[k];
        grads[k] = Tensor::empty(x.shape(), x.dtype(), x.device());
        if (x.numel() == 0) continue;
        dispatch_floating(x.dtype(), "sum_of_squares", [&]<typename T>() {
            twice_times_kernel<T><<<cuda::grid_size(device, x.numel(), kThreads), kThreads, 0, stream>>>(
                x.data<T>(), args.grad_output.data<T>(), grads[k].data<T>(), x.numel());
            DG_CUDA_CHECK_LAUNCH();
        });
    }
    return grads;
}

}  // namespace

dyngrad::BackendKernels custom_op_cuda_kernels() { return {forward, backward}; }
