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

struct SgdHyper {
    double lr = 0;
    double momentum = 0;      // 0: no momentum buffer
    double weight_decay = 0;  // L2
    bool nesterov = false;
};

struct AdamHyper {
    double lr = 0;
    double beta1 = 0;
    double beta2 = 0;
    double eps = 0;
    double weight_decay = 0;
    bool decoupled = false;  // AdamW
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

inline AdamScalars adam_scalars(const AdamHyper& h, std::int64_t step) {
    const auto t = static_cast<double>(step);
    return {h.beta1,
            1 - h.beta1,
            h.beta2,
            1 - h.beta2,
            h.eps,
            h.decoupled ? 0.0 : h.weight_decay,
            h.decoupled ? 1 - h.lr * h.weight_decay : 1.0,
            h.lr / (1 - std::pow(h.beta1, t)),
            std::sqrt(1 - std::pow(h.beta2, t))};
}

#if DYNGRAD_WITH_CUDA
namespace cuda {

// One tensor's update: param, grad and state (null where the rule keeps none) of `numel` elements of
// `dtype`, all on the same device; `step` is Adam's per-parameter step count (SGD ignores it).
struct StepOperands {
    DType dtype;
    void* param;
    const void* grad;
    void* state1;  // SGD: momentum buffer; Adam: m
    void* state2;  // Adam: v
    std::int64_t numel;
    std::int64_t step;
};

// A slice of at most kStepChunk elements of one tensor, as the kernels read it from the device table.
struct StepChunk {
    void* param;
    const void* grad;
    void* state1;
    void* state2;
    std::int64_t n;
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

// Fused steps over every operand (on the table's device): one kernel launch per (dtype, step) group.
void sgd_step(StepTable& table, std::span<const StepOperands> tensors, const SgdHyper& hyper);
void adam_step(StepTable& table, std::span<const StepOperands> tensors, const AdamHyper& hyper);

}  // namespace cuda
#endif

}  // namespace dyngrad
