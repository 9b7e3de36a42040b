// A generated kernel (cuda/nvrtc_compiler.h) loaded into a device and launched on its stream (docs/fusion.md). The
// CUDA build only: it uses the driver API (cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel; every call checked
// with DG_CU_CHECK), in the runtime's primary context of the device. Not called by the engine yet: the captured-step
// hook is the next step of issue 33; tests/fusion/test_gpu_fusion.cpp runs it against the unfused kernels.
#pragma once
#include <cstdint>
#include <span>

#include "dyngrad/cuda/nvrtc_compiler.h"

namespace dyngrad::cuda {

// The architecture NVRTC compiles for: compute capability major*10 + minor of `device`.
int device_arch(int device);

class FusedKernel {
public:
    FusedKernel(const CompiledKernel& compiled, int device);
    ~FusedKernel();
    FusedKernel(const FusedKernel&) = delete;
    FusedKernel& operator=(const FusedKernel&) = delete;

    // Launches a grid-stride loop over `numel` elements on the device's stream (capturable: no allocation, no
    // synchronisation). `arguments` as cuLaunchKernel's kernelParams: one pointer to each parameter, in order.
    void launch(std::int64_t numel, std::span<void*> arguments) const;

private:
    int device_;
    void* module_ = nullptr;    // CUmodule
    void* function_ = nullptr;  // CUfunction
};

}  // namespace dyngrad::cuda
