// The consumer's CUDA kernel (kernel.cu): y = x + 1 for a float64 tensor on a CUDA device.
#pragma once
#include <dyngrad/dyngrad.h>

dyngrad::Tensor add_one_on_gpu(const dyngrad::Tensor& x);
