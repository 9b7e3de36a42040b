// A generated kernel (cuda/nvrtc_compiler.h) loaded into a device and launched on its stream (docs/fusion.md). The
// CUDA build only: it uses the driver API (cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel; every call checked
// with DG_CU_CHECK), in the runtime's primary context of the device. The fusion hook (graph/fusion_replay.h) loads
// each plan's kernels through it; tests/fusion/test_gpu_fusion.cpp runs it against the unfused kernels.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "dyngrad/cuda/nvrtc_compiler.h"

namespace dyngrad::cuda {

// The architecture NVRTC compiles for: compute capability major*10 + minor of `device`.
int device_arch(int device);

// One loaded image (a cubin or PTX that may hold several kernels: a fusion plan's translation unit). Unloaded
// when the last FusedKernel taken from it goes.
class FusedModule {
public:
    FusedModule(const std::string& image, int device);
    ~FusedModule();
    FusedModule(const FusedModule&) = delete;
    FusedModule& operator=(const FusedModule&) = delete;
    int device() const { return device_; }
    void* module() const { return module_; }  // CUmodule

private:
    int device_;
    void* module_ = nullptr;
};

class FusedKernel {
public:
    // The image loaded as a module of its own.
    FusedKernel(const CompiledKernel& compiled, int device);
    // Kernel `name` of a module already loaded (CudaError when the image has no such entry point).
    FusedKernel(std::shared_ptr<const FusedModule> module, const std::string& name);
    ~FusedKernel();
    FusedKernel(const FusedKernel&) = delete;
    FusedKernel& operator=(const FusedKernel&) = delete;

    // Launches a grid-stride loop over `numel` elements on the device's stream (capturable: no allocation, no
    // synchronisation). `arguments` as cuLaunchKernel's kernelParams: one pointer to each parameter, in order.
    void launch(std::int64_t numel, std::span<void*> arguments) const;

private:
    std::shared_ptr<const FusedModule> module_;
    void* function_ = nullptr;  // CUfunction
};

}  // namespace dyngrad::cuda
