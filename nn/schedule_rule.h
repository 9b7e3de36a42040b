// The closed form of a built-in learning-rate schedule as data, so that the host (LRScheduler::lr_for) and
// the kernel that advances a schedule on the device (nn/optim.cu) evaluate one formula (schedule_lr,
// nn/optim_internal.h).
#pragma once
#include <cstdint>

namespace dyngrad {

enum class ScheduleKind : int { Step = 0, Cosine = 1, WarmupCosine = 2 };

struct ScheduleRule {
    ScheduleKind kind = ScheduleKind::Step;
    std::int64_t n1 = 1;  // Step: step_size; Cosine: T_max; WarmupCosine: warmup_steps
    std::int64_t n2 = 0;  // WarmupCosine: total_steps
    double x = 0;         // Step: gamma; Cosine: eta_min; WarmupCosine: min_lr
};

}  // namespace dyngrad
