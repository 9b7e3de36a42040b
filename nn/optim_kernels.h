// Internal: what the optimizers (nn/optim.cpp) share with their fused CUDA steps (nn/optim.cu):
// the hyper-parameters, the per-step scalars both backends derive from them in the same way, and the
// GPU entry points with the cached device table of update chunks.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "dyngrad/core/tensor.h"
#if DYNGRAD_WITH_CUDA
#include "dyngrad/cuda/runtime.h"
#endif

namespace dyngrad {

// The scalars of one SGD update of one parameter (its group's settings):
//   g = grad + weight_decay·p;  buf = momentum·buf + g;  g = nesterov ? g + momentum·buf : buf;  p -= lr·g
struct SgdScalars {
    double lr = 0;
    double momentum = 0;      // 0: no momentum buffer
    double weight_decay = 0;  // L2
    double nesterov = 0;      // 1: Nesterov (a double, so that the scalars are one array of doubles)
};

// The scalars of one Adam update at step t (from 1), with the bias corrections folded in:
//   p *= decay;  g += l2·p;  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;
//   p -= step_size · m / (√v / bias2_sqrt + eps)
struct AdamScalars {
    double beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    double l2;     // Adam's weight decay, 0 for AdamW
    double decay;  // AdamW's 1 - lr·wd, 1 for Adam
    double step_size;   // lr / (1 - β1^t)
    double bias2_sqrt;  // √(1 - β2^t)
};

inline AdamScalars adam_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                bool decoupled, std::int64_t step) {
    const auto t = static_cast<double>(step);
    return {beta1,
            1 - beta1,
            beta2,
            1 - beta2,
            eps,
            decoupled ? 0.0 : weight_decay,
            decoupled ? 1 - lr * weight_decay : 1.0,
            lr / (1 - std::pow(beta1, t)),
            std::sqrt(1 - std::pow(beta2, t))};
}

// Every chunk of the GPU table carries its parameter's scalars (SgdScalars or AdamScalars, as doubles).
inline constexpr int kStepScalars = 9;
static_assert(sizeof(AdamScalars) == kStepScalars * sizeof(double) && sizeof(SgdScalars) <= sizeof(AdamScalars));

#if DYNGRAD_WITH_CUDA
namespace cuda {

// One tensor's update: param, grad and state (null where the rule keeps none) of `numel` elements of
// `dtype`, all on the same device, with the scalars of its update.
struct StepOperands {
    DType dtype;
    void* param;
    const void* grad;
    void* state1;  // SGD: momentum buffer; Adam: m
    void* state2;  // Adam: v
    std::int64_t numel;
    std::array<double, kStepScalars> scalars;
};

// A slice of at most kStepChunk elements of one tensor, as the kernels read it from the device table.
struct StepChunk {
    void* param;
    const void* grad;
    void* state1;
    void* state2;
    std::int64_t n;
    double scalars[kStepScalars];
    friend bool operator==(const StepChunk&, const StepChunk&) = default;
};

// The device-side chunk table of one optimizer on one device. Gradients are re-allocated by every
// backward, so the table usually changes from step to step; it is re-uploaded, with one asynchronous
// copy from pinned memory, only when its contents differ from the last upload. Two pinned slots take
// turns; a slot is rewritten only after the copy that last read it has run (an event two uploads old,
// so the host never waits on the current step's work). No device synchronisation, no per-step
// allocation: the device array comes from the pool and grows only with the number of chunks.
class StepTable {
public:
    explicit StepTable(int device);
    ~StepTable();
    StepTable(const StepTable&) = delete;
    StepTable& operator=(const StepTable&) = delete;

    // The device address of `chunks` (uploaded when they changed), valid for kernels queued next.
    const StepChunk* upload(const std::vector<StepChunk>& chunks);
    int device() const { return device_; }

private:
    int device_;
    std::vector<StepChunk> uploaded_;
    Tensor table_;  // device bytes for at least uploaded_.size() chunks
    std::size_t pinned_capacity_ = 0;  // chunks per slot
    std::array<void*, 2> pinned_{};
    std::array<StreamEvent, 2> copied_;
    int next_slot_ = 0;
};

// Fused steps over every operand (on the table's device): one kernel launch per dtype.
void sgd_step(StepTable& table, std::span<const StepOperands> tensors);
void adam_step(StepTable& table, std::span<const StepOperands> tensors, bool decoupled);

// Gradient clipping on one device, queued on its stream with no host synchronisation. `grads` are
// (pointer, numel, dtype) triples. clip_norm: the norm of all grads (into `norm`, a 0-d tensor of its
// dtype on the device) and grads *= min(1, max_norm / (norm + eps)) read from the device.
struct GradOperand {
    DType dtype;
    void* data;
    std::int64_t numel;
};
void clip_norm(int device, std::span<const GradOperand> grads, double max_norm, double norm_type, double eps,
               Tensor& norm);
void clip_value(int device, std::span<const GradOperand> grads, double clip_value);

}  // namespace cuda
#endif

}  // namespace dyngrad
