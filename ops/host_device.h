// DG_HOST_DEVICE: a helper that CUDA kernels call too is __host__ __device__ under nvcc and a plain inline
// function under g++, so one header serves ops/<family>.cpp and ops/<family>.cu without cuda headers in the
// CPU build.
#pragma once

#if defined(__CUDACC__)
#define DG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DG_HOST_DEVICE inline
#endif
