// The CUDA half of samples/custom_op.cpp: forward and backward kernels of sum_of_squares; empty
// kernels ({nullptr, nullptr}) when dyngrad was built without CUDA.
#pragma once
#include <dyngrad/graph/op_def.h>

dyngrad::BackendKernels custom_op_cuda_kernels();
