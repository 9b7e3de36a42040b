// samples/custom_op without CUDA: the op has CPU kernels only.
#include "custom_op_kernels.h"

dyngrad::BackendKernels custom_op_cuda_kernels() { return {}; }
