// Loading and launching generated kernels with the driver API (cuda/fused_kernel.h).
#include "dyngrad/cuda/fused_kernel.h"

#include <cuda.h>

#include "dyngrad/cuda/context.h"

namespace dyngrad::cuda {

namespace {

[[noreturn]] void throw_cu_error(CUresult status, const char* expr, const char* file, int line) {
    const char* name = nullptr;
    const char* text = nullptr;
    cuGetErrorName(status, &name);
    cuGetErrorString(status, &text);
    throw CudaError(str("CUDA driver call failed: ", expr, " at ", file, ":", line, ": ", name ? name : "?", " (",
                        text ? text : "no description", ")"));
}

#define DG_CU_CHECK(expr)                                                                          \
    do {                                                                                           \
        const CUresult dg_status_ = (expr);                                                        \
        if (dg_status_ != CUDA_SUCCESS) throw_cu_error(dg_status_, #expr, __FILE__, __LINE__);     \
    } while (0)

constexpr unsigned kThreads = 256;  // the generated kernels' __launch_bounds__

}  // namespace

int device_arch(int device) {
    int major = 0, minor = 0;
    DG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    DG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major * 10 + minor;
}

FusedModule::FusedModule(const std::string& image, int device) : device_(device) {
    DeviceContext& ctx = context(device);  // makes the device's primary context current (the runtime's)
    (void)ctx;
    CUmodule module = nullptr;
    DG_CU_CHECK(cuModuleLoadData(&module, image.c_str()));
    module_ = module;
}

FusedModule::~FusedModule() {
    if (module_ != nullptr) cuModuleUnload(static_cast<CUmodule>(module_));  // a destructor does not throw
}

FusedKernel::FusedKernel(const CompiledKernel& compiled, int device)
    : FusedKernel(std::make_shared<const FusedModule>(compiled.image, device), compiled.kernel) {}

FusedKernel::FusedKernel(std::shared_ptr<const FusedModule> module, const std::string& name) : module_(std::move(module)) {
    DeviceContext& ctx = context(module_->device());
    (void)ctx;
    CUfunction function = nullptr;
    DG_CU_CHECK(cuModuleGetFunction(&function, static_cast<CUmodule>(module_->module()), name.c_str()));
    function_ = function;
}

FusedKernel::~FusedKernel() = default;

void FusedKernel::launch(std::int64_t numel, std::span<void*> arguments) const {
    if (numel <= 0) return;
    DeviceContext& ctx = context(module_->device());
    const unsigned blocks = grid_size(ctx, numel, kThreads);
    DG_CU_CHECK(cuLaunchKernel(static_cast<CUfunction>(function_), blocks, 1, 1, kThreads, 1, 1, 0,
                               reinterpret_cast<CUstream>(ctx.stream), arguments.data(), nullptr));
}

}  // namespace dyngrad::cuda
