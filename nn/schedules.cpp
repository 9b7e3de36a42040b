// Learning-rate schedules (nn/optim.h): StepLR, CosineAnnealingLR, WarmupCosineLR over the LRScheduler base.
// The host keeps the epoch for CPU parameters; on a GPU the epoch and base lrs live on the device and the next
// fused optimizer step advances them (its kernel computes the lr from the rule: no launch of the schedule's own),
// so captured steps move the schedule on every replay.
#include <map>
#include <optional>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/optim_internal.h"
#include "dyngrad/nn/schedule_rule.h"

namespace dyngrad {

using optim_detail::check_group_count;
using optim_detail::check_no_extra;
using optim_detail::check_non_negative;
using optim_detail::entry;
using optim_detail::kSchedulePrefix;
using optim_detail::kScheduleType;
using optim_detail::check_type_entry;

// A schedule's epoch counter and base lrs on each device where its optimizer keeps device scalars.
struct LRScheduler::DeviceEpochs {
    struct OnDevice {
        Tensor epoch;     // i64 (1)
        Tensor base_lrs;  // f64 (groups)
    };
    std::map<int, OnDevice> by_device;

    // Made from the host's values at the schedule's first step on `device` (host-to-device copies).
    OnDevice& on(int device, std::int64_t epoch, const std::vector<double>& base_lrs, const char* schedule) {
        const auto found = by_device.find(device);
        if (found != by_device.end()) return found->second;
        cuda::refuse_in_capture(device, str(schedule, "::step()").c_str(),
                                "its first step after the optimizer's first GPU step creates its device epoch "
                                "(a host-to-device copy); run one step eagerly before capturing");
        const Device where = Device::cuda(device);
        OnDevice fresh{Tensor::from_vector(std::vector<std::int64_t>{epoch}, {1}).to(where),
                       Tensor::from_vector(base_lrs, {static_cast<std::int64_t>(base_lrs.size())}, DType::f64).to(where)};
        return by_device.emplace(device, std::move(fresh)).first->second;
    }
};

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer), devices_(std::make_shared<DeviceEpochs>()) {
    for (std::size_t g = 0; g < optimizer.group_count(); ++g) base_lrs_.push_back(optimizer.lr(g));
}

// The steps of this schedule the optimizer's next step on `device` applies (the device epoch lags by them).
std::int64_t LRScheduler::deferred_steps(int device) const {
    const auto on = optimizer_.tables_->by_device.find(device);
    const auto mine = devices_->by_device.find(device);
    if (on != optimizer_.tables_->by_device.end() && mine != devices_->by_device.end())
        return on->second.deferred_steps_of(mine->second.epoch);
    return 0;
}

std::int64_t LRScheduler::epoch() const {
    if (!devices_->by_device.empty()) {
        const auto& [device, on] = *devices_->by_device.begin();
        epoch_ = on.epoch.to(Device::cpu()).data<std::int64_t>()[0] + deferred_steps(device);
    }
    return epoch_;
}

std::vector<std::pair<std::string, Tensor>> LRScheduler::device_scalars() const {
    std::vector<std::pair<std::string, Tensor>> out;
    for (const auto& [device, on] : devices_->by_device) out.emplace_back(str("epoch.cuda", device), on.epoch);
    return out;
}

void LRScheduler::apply_current_epoch() {
    for (std::size_t g = 0; g < base_lrs_.size(); ++g) optimizer_.set_lr(g, lr_for(base_lrs_[g], epoch_));
}

LRScheduler::~LRScheduler() = default;

double LRScheduler::lr_at(std::int64_t epoch, std::size_t group) const {
    if (group >= base_lrs_.size())
        throw IndexError(str(name(), ": parameter group ", group, " does not exist (", base_lrs_.size(), " groups)"));
    // Every closed form extrapolates before epoch 0 into rates the schedule never gives (a warm-up's negative).
    if (epoch < 0) throw ValueError(str(name(), "::lr_at: epoch ", epoch, " is negative (epochs count from 0)"));
    return lr_for(base_lrs_[group], epoch);
}

void LRScheduler::step() {
    // The host mirror (the truth for CPU parameters; on a GPU the device epoch is, as replays advance it).
    ++epoch_;
    for (std::size_t g = 0; g < base_lrs_.size(); ++g) optimizer_.set_host_lr(g, lr_for(base_lrs_[g], epoch_));
    const std::optional<ScheduleRule> rule = device_rule();
    for (auto& [device, scalars] : optimizer_.tables_->by_device) {
        if (!rule) {
            cuda::refuse_in_capture(device, str(name(), "::step()").c_str(),
                                    "this schedule has no device rule (device_rule()): its lr is computed on the host, "
                                    "and a replay would repeat the captured value");
            for (std::size_t g = 0; g < base_lrs_.size(); ++g)
                scalars.write_lr(device, g, optimizer_.groups_[g].settings.lr);
            continue;
        }
        // Nothing is launched: the optimizer's next step on this device computes the lr from the rule and
        // advances the device epoch (OnDevice::defer_schedule_step).
        auto& on = devices_->on(device, epoch_ - 1, base_lrs_, name());
        scalars.defer_schedule_step(device, *rule, on.epoch, on.base_lrs);
    }
}

void LRScheduler::save_state(TensorMap& tensors, SafetensorsMetadata& metadata) const {
    const std::string prefix = kSchedulePrefix;
    metadata[kScheduleType] = name();
    tensors[prefix + "epoch"] = Tensor::from_vector(std::vector<std::int64_t>{epoch()}, {1});
    tensors[prefix + "base_lrs"] =
        Tensor::from_vector(base_lrs_, {static_cast<std::int64_t>(base_lrs_.size())}, DType::f64);
}

std::function<void()> LRScheduler::stage_state(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                                               const std::string& source) {
    check_type_entry(metadata, kScheduleType, "schedule", name(), source);
    const std::string prefix = kSchedulePrefix;
    const std::int64_t epoch = entry(tensors, prefix + "epoch", DType::i64, {1}, source).data<std::int64_t>()[0];
    if (epoch < 0) throw ValueError(str("checkpoint '", source, "': ", name(), " epoch ", epoch, " is negative"));
    check_group_count(tensors, prefix + "base_lrs", static_cast<std::int64_t>(base_lrs_.size()),
                      str(name(), " base lrs (one per parameter group)"), source);
    const Tensor& bases = entry(tensors, prefix + "base_lrs", DType::f64,
                                {static_cast<std::int64_t>(base_lrs_.size())}, source);
    std::vector<double> new_bases(bases.data<double>(), bases.data<double>() + bases.numel());
    for (const double base : new_bases) check_non_negative(str("checkpoint '", source, "': ", name()), "base lr", base);
    check_no_extra(tensors, prefix, {prefix + "epoch", prefix + "base_lrs"}, source);
    return [this, epoch, new_bases = std::move(new_bases)]() mutable {
        epoch_ = epoch;
        base_lrs_ = std::move(new_bases);
        for (auto& [device, on] : devices_->by_device) {  // in place: captured steps read these addresses
            // The device epoch lags the logical one by the steps the optimizer's next step applies.
            on.epoch.copy_from(Tensor::from_vector(std::vector<std::int64_t>{epoch_ - deferred_steps(device)}, {1}));
            on.base_lrs.copy_from(
                Tensor::from_vector(base_lrs_, {static_cast<std::int64_t>(base_lrs_.size())}, DType::f64));
        }
    };
}

void LRScheduler::load_state(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                             const std::string& source) {
    stage_state(tensors, metadata, source)();
}

StepLR::StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
    if (step_size <= 0) throw ValueError(str("StepLR: step_size must be positive, got ", step_size));
    check_non_negative("StepLR", "gamma", gamma);
}

double StepLR::lr_for(double base_lr, std::int64_t epoch) const { return schedule_lr(*device_rule(), base_lr, epoch); }

std::optional<ScheduleRule> StepLR::device_rule() const {
    return ScheduleRule{.kind = ScheduleKind::Step, .n1 = step_size_, .x = gamma_};
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, std::int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
    if (t_max <= 0) throw ValueError(str("CosineAnnealingLR: T_max must be positive, got ", t_max));
    check_non_negative("CosineAnnealingLR", "eta_min", eta_min);
}

double CosineAnnealingLR::lr_for(double base_lr, std::int64_t epoch) const {
    return schedule_lr(*device_rule(), base_lr, epoch);
}

std::optional<ScheduleRule> CosineAnnealingLR::device_rule() const {
    return ScheduleRule{.kind = ScheduleKind::Cosine, .n1 = t_max_, .x = eta_min_};
}

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, std::int64_t warmup_steps, std::int64_t total_steps,
                               double min_lr)
    : LRScheduler(optimizer),
      rule_{.kind = ScheduleKind::WarmupCosine, .n1 = warmup_steps, .n2 = total_steps, .x = min_lr} {
    if (warmup_steps < 0)
        throw ValueError(str("WarmupCosineLR: warmup_steps must be non-negative, got ", warmup_steps));
    if (total_steps <= warmup_steps)
        throw ValueError(str("WarmupCosineLR: total_steps (", total_steps, ") must be above warmup_steps (",
                             warmup_steps, "): total ", total_steps, " <= warmup ", warmup_steps));
    check_non_negative("WarmupCosineLR", "min_lr", min_lr);
    apply_current_epoch();
}

double WarmupCosineLR::lr_for(double base_lr, std::int64_t epoch) const { return schedule_lr(rule_, base_lr, epoch); }

std::optional<ScheduleRule> WarmupCosineLR::device_rule() const { return rule_; }

}  // namespace dyngrad
