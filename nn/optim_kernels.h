// Internal: what the optimizers (nn/optim.cpp) share with their fused CUDA steps (nn/optim.cu): the GPU entry
// points with the cached device table of update chunks. The formulas both backends apply: nn/optim_math.h.
// Declared in every build; without CUDA they throw DeviceError (nn/optim_unavailable.cpp), and are never
// reached, since no tensor lives on a GPU.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/nn/optim_math.h"

namespace dyngrad {

// The per-group settings a GPU chunk carries (the lr and step count are read from device memory):
// SGD: momentum, weight_decay, nesterov; Adam: beta1, beta2, eps, weight_decay, decoupled.
inline constexpr int kStepScalars = 5;

namespace cuda {

// One tensor's update: param, grad and state (null where the rule keeps none) of `numel` elements of
// `dtype`, all on the same device, with its group's settings and its indices into the device scalars.
struct StepOperands {
    DType dtype;
    void* param;
    void* grad;    // written only by a step fused with clipping (StepState::clip)
    void* state1;  // SGD: momentum buffer; Adam: m
    void* state2;  // Adam: v
    std::int64_t numel;
    std::array<double, kStepScalars> scalars;
    std::int32_t group;      // index into StepState::lrs
    std::int32_t parameter;  // index into StepState::steps
};

// A slice of at most kStepChunk elements of one tensor, as the kernels read it from the device table.
struct StepChunk {
    void* param;
    void* grad;
    void* state1;
    void* state2;
    std::int64_t n;
    double scalars[kStepScalars];
    std::int32_t group;
    std::int32_t parameter;
    std::int64_t blocks;  // how many blocks update its parameter (non-empty slices of all its chunks): the last
                          // to finish advances the step count
    friend bool operator==(const StepChunk&, const StepChunk&) = default;
};

// A schedule's steps whose device effect is deferred into the next fused optimizer step on one device
// (LRScheduler::step launches nothing): that step's kernel computes each group's lr as
// schedule_lr(rule, base_lrs[g], *epoch + count), its blocks store those lrs (StepState::lr_stored_groups; the
// last block the rest) and its last block advances *epoch by `count`. So a step with a per-step schedule costs no launch beyond the optimizer's. Outside a step (a host
// read, set_lr, another schedule's step) the same formula is evaluated by a one-thread kernel (nn/optim.cu).
struct ScheduleAdvance {
    ScheduleRule rule{};
    const double* base_lrs = nullptr;  // per group, the schedule's (device)
    long long* epoch = nullptr;        // the schedule's device epoch: the steps applied so far
    long long count = 0;               // steps deferred; 0: none (the step reads StepState::lrs as they are)
};

// The optimizer's scalars that live in device memory (one set per device), read by every fused step:
// a captured step replays the kernels that read and advance them, so replays see the lr a schedule set
// and the step count the previous replay reached. GradScaler adds its two flags for one step.
struct StepState {
    double* lrs = nullptr;              // per group: the lr of the next step (but see `schedule`)
    // Per group, meaningful while a schedule advance is deferred: an lr set_lr() wrote after the schedule's
    // step, which wins over the schedule's lr for that one step (as it did when the schedule wrote the lrs
    // at once); negative: none. Consumed (reset) with the advance.
    double* lr_overrides = nullptr;
    int groups = 0;
    ScheduleAdvance schedule;
    // Per launch: whether this launch's last block applies `schedule` (the last launch of a step on this
    // device), its blocks that hold elements (the arrivals that make the last), and the device's counter.
    bool applies_schedule = false;
    unsigned launch_blocks = 0;
    unsigned* block_counter = nullptr;
    long long* steps = nullptr;         // per parameter: updates so far (the kernel uses steps + 1)
    unsigned long long* arrivals = nullptr;  // per parameter: chunks finished in this launch (0 between)
    const float* inv_scale = nullptr;   // gradients are multiplied by it; null: by 1
    const float* found_inf = nullptr;   // non-zero: the whole step is skipped (nothing changes); null: never
    // clip_grad_norm's coefficient (Optimizer::clip_grad_norm_and_step): where it is not 1, every gradient is
    // multiplied by it (in the gradient's dtype, as clip_grad_norm's scaling pass) and written back before
    // the update reads it (and before inv_scale); null: no clipping.
    const double* clip = nullptr;
    // Per launch, with a deferred schedule advance: bit g set when group g (< 64) has a non-empty block in this
    // step (any launch). Such a block stores the lr it computed into lrs[g] (every writer the same bits, and
    // with a deferred advance no update reads lrs), so the applying block evaluates the schedule again only
    // for the other groups, or for all when GradScaler skipped the step (its blocks computed no lr).
    std::uint64_t lr_stored_groups = 0;
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

// Fused steps over every operand (on the table's device): one kernel launch per dtype; the last applies
// state.schedule. False when nothing was launched (no elements): a deferred schedule advance is then still due.
bool sgd_step(StepTable& table, std::span<const StepOperands> tensors, const StepState& state);
bool adam_step(StepTable& table, std::span<const StepOperands> tensors, const StepState& state);
// GraphError (cuda::throw_if_capturing) when this thread is capturing `device`'s stream.
void refuse_in_capture(int device, const char* what, const char* why);
// One thread on `device`: applies state.schedule as a step's last block would (the lrs, the overrides, the
// epoch), for a deferred advance that cannot wait for the next step (another schedule's step).
void apply_schedule(int device, const StepState& state);
// One thread on `device`: out[g] = the lr group g's next step will use (state.groups of them), changing nothing:
// what a host read reports while a schedule advance is deferred.
void next_lrs(int device, const StepState& state, double* out);

}  // namespace cuda

}  // namespace dyngrad
