// GradScaler's GPU passes (nn/amp.h, declared in nn/grad_passes.h): the inf check with optional unscaling over
// batches of gradients, and the scale update; queued with no host synchronisation (capturable). The optimizer's
// fused step reads the flags (nn/optim.cu). The host side and the CPU rules: nn/amp.cpp.
#include <cstdint>
#include <span>

#include "dyngrad/cuda/context.h"
#include "dyngrad/nn/grad_batch.cuh"

namespace dyngrad::cuda {

namespace {

// One thread: inv_scale = 1/scale (in double, rounded to float, as PyTorch) and found_inf = 0.
__global__ void scaler_prepare_kernel(const float* __restrict__ scale, float* __restrict__ inv_scale,
                                      float* __restrict__ found_inf) {
    *inv_scale = static_cast<float>(1.0 / static_cast<double>(*scale));
    *found_inf = 0.0f;
}

// Block b: its slice of the batch; found_inf = 1 where grad·inv_scale is not finite (every writer writes 1,
// so the race is benign); with `unscale`, the products are written back.
template <typename T>
__global__ void scaler_check_kernel(GradBatch batch, const float* __restrict__ inv_scale, float* __restrict__ found_inf,
                                    bool unscale) {
    const BlockSlice slice = block_slice(batch);
    T* __restrict__ g = static_cast<T*>(batch.data[slice.tensor]);
    const T inv = static_cast<T>(*inv_scale);
    bool bad = false;
    for (std::int64_t i = slice.begin; i < slice.end; i += blockDim.x) {
        const T v = g[i] * inv;
        bad = bad || !isfinite(v);
        if (unscale) g[i] = v;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

__global__ void scaler_update_kernel(ScalerRule rule, float* __restrict__ scale, long long* __restrict__ tracker,
                                     long long* __restrict__ skips, const float* __restrict__ found_inf,
                                     DeviceErrorRecord* record) {
    if (*found_inf != 0.0f) {
        const float backed_off = static_cast<float>(static_cast<double>(*scale) * rule.backoff);
        *scale = backed_off;
        *tracker = 0;
        const long long skipped = *skips + 1;
        *skips = skipped;
        if (skipped >= rule.max_skips && static_cast<double>(backed_off) < rule.min_scale &&
            atomicCAS(&record->code, static_cast<int>(DeviceErrorCode::none),
                      static_cast<int>(DeviceErrorCode::loss_scale_collapsed)) == static_cast<int>(DeviceErrorCode::none)) {
            record->index = skipped;
            record->value = __float_as_int(backed_off);
            record->bound = 0;
        }
        return;
    }
    *skips = 0;
    const long long successful = *tracker + 1;
    if (successful == rule.interval) {
        const float grown = static_cast<float>(static_cast<double>(*scale) * rule.growth);
        if (isfinite(grown)) *scale = grown;
        *tracker = 0;
    } else {
        *tracker = successful;
    }
}

}  // namespace

void scaler_check(int device, std::span<const GradOperand> grads, const float* scale, float* inv_scale,
                  float* found_inf, bool unscale) {
    DeviceContext& ctx = context(device);
    require_batch_dtypes(grads, "GradScaler");  // before the prepare kernel resets found_inf
    scaler_prepare_kernel<<<1, 1, 0, ctx.stream>>>(scale, inv_scale, found_inf);
    DG_CUDA_CHECK_LAUNCH();
    for_each_batch(grads, "GradScaler", [&](DType dtype, const GradBatch& batch, unsigned grid) {
        dispatch_floating(dtype, "GradScaler", [&]<typename T>() {
            scaler_check_kernel<T><<<grid, kBatchThreads, 0, ctx.stream>>>(batch, inv_scale, found_inf, unscale);
            DG_CUDA_CHECK_LAUNCH();
        });
    });
}

void scaler_update(int device, const ScalerRule& rule, float* scale, long long* tracker, long long* skips,
                   const float* found_inf) {
    DeviceContext& ctx = context(device);
    scaler_update_kernel<<<1, 1, 0, ctx.stream>>>(rule, scale, tracker, skips, found_inf, ctx.error_record_device);
    DG_CUDA_CHECK_LAUNCH();
}

}  // namespace dyngrad::cuda
