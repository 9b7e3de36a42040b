// Internal: what the optimizers (nn/optim.cpp) share with the schedules (nn/schedules.cpp): the optimizer's
// per-device tables of scalars, which a schedule's step advances, an update rule's backend halves, the
// hyperparameter check and the checkpoint entry readers. Not installed. In a build without CUDA the tables stay
// empty (no parameter lives on a GPU) and the GPU entry points they call are nn/optim_unavailable.cpp's.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <span>
#include <set>
#include <string>
#include <vector>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/core/safetensors.h"
#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/optim_kernels.h"

namespace dyngrad {

struct Optimizer::DeviceTables {
    // What the fused steps of one device read: the chunk table and the device-resident scalars.
    struct OnDevice {
        explicit OnDevice(int device) : table(device) {}
        cuda::StepTable table;
        Tensor lrs;       // f64 (groups)
        Tensor steps;     // i64 (parameters): updates so far
        Tensor arrivals;  // i64 (parameters): the kernels' per-launch chunk counters, zero between launches
        Tensor lr_overrides;  // f64 (groups): set_lr's values while a schedule advance is deferred; -1: none
        // A schedule's steps the next fused step applies (cuda::ScheduleAdvance; count 0: none), and the
        // schedule's device epoch and base lrs, kept alive until then.
        cuda::ScheduleAdvance deferred;
        Tensor deferred_epoch, deferred_base_lrs;

        cuda::StepState state(const Gate* gate, const Tensor* clip) const {
            cuda::StepState s;
            if (clip != nullptr) s.clip = clip->data<double>();
            s.lrs = lrs.data<double>();
            s.lr_overrides = lr_overrides.data<double>();
            s.groups = static_cast<int>(lrs.numel());
            s.schedule = deferred;
            s.steps = reinterpret_cast<long long*>(steps.data<std::int64_t>());
            s.arrivals = reinterpret_cast<unsigned long long*>(arrivals.data<std::int64_t>());
            if (gate != nullptr) {
                s.inv_scale = gate->inv_scale.data<float>();
                s.found_inf = gate->found_inf.data<float>();
            }
            return s;
        }
        // After a fused step that launched: the deferred advance is applied.
        void launched() { deferred.count = 0; }
        // Group g's lr from the host: the device lr, or while a schedule advance is deferred the override,
        // which wins over the schedule's lr for the next step (a fill kernel: capturable).
        void write_lr(int device, std::size_t group, double lr) {
            const Tensor& target = deferred.count > 0 ? lr_overrides : lrs;
            device_memory::fill(target.data<double>() + group, 1, lr, DType::f64, device);
        }
        // The lrs the next step uses (a device tensor; with a deferred advance computed by a kernel that
        // changes nothing): what host reads report.
        Tensor next_lrs(int device) const {
            if (deferred.count == 0) return lrs;
            Tensor out = Tensor::empty(lrs.shape(), DType::f64, lrs.device());
            cuda::next_lrs(device, state(nullptr, nullptr), out.data<double>());
            return out;
        }
        // Defers one step of the schedule whose device epoch and base lrs these are; another schedule's
        // deferred steps are applied first (a kernel), so each keeps its order.
        void defer_schedule_step(int device, const ScheduleRule& rule, const Tensor& epoch, const Tensor& base_lrs) {
            auto* epoch_address = reinterpret_cast<long long*>(epoch.data<std::int64_t>());
            if (deferred.count > 0 && deferred.epoch != epoch_address) {
                cuda::apply_schedule(device, state(nullptr, nullptr));
                deferred.count = 0;
            }
            deferred = {rule, base_lrs.data<double>(), epoch_address, deferred.count + 1};
            deferred_epoch = epoch;
            deferred_base_lrs = base_lrs;
        }
        // How many steps of the schedule with this device epoch are deferred here.
        std::int64_t deferred_steps_of(const Tensor& epoch) const {
            return deferred.epoch == reinterpret_cast<const long long*>(epoch.data<std::int64_t>()) ? deferred.count
                                                                                                  : 0;
        }
    };
    std::map<int, OnDevice> by_device;

    // Device `device`'s scalars, made from the host's values at the first GPU step there (host-to-device
    // copies, so that first step cannot be captured).
    OnDevice& on(int device, const std::vector<Group>& groups, const std::vector<std::int64_t>& steps,
                 const char* optimizer) {
        const auto found = by_device.find(device);
        if (found != by_device.end()) return found->second;
        cuda::refuse_in_capture(device, str(optimizer, "::step()").c_str(),
                                "its first step on a device creates the device-resident lrs and step counts "
                                "(host-to-device copies); run one step eagerly before capturing (CapturedStep's "
                                "warm-up run does)");
        std::vector<double> lrs;
        for (const Group& group : groups) lrs.push_back(group.settings.lr);
        const Device where = Device::cuda(device);
        Tensor lr_values = Tensor::from_vector(lrs, {static_cast<std::int64_t>(lrs.size())}, DType::f64).to(where);
        Tensor step_values = Tensor::from_vector(steps, {static_cast<std::int64_t>(steps.size())}).to(where);
        Tensor arrivals = Tensor::zeros({static_cast<std::int64_t>(steps.size())}, DType::i64, where);
        Tensor overrides = Tensor::full({static_cast<std::int64_t>(lrs.size())}, -1.0, DType::f64).to(where);
        auto& on = by_device.try_emplace(device, device).first->second;
        on.lrs = std::move(lr_values);
        on.steps = std::move(step_values);
        on.arrivals = std::move(arrivals);
        on.lr_overrides = std::move(overrides);
        return on;
    }
};

struct Optimizer::StepRule {
    std::function<void(std::size_t, double)> cpu;  // parameter i on the CPU, with the gate's inverse scale
    std::function<cuda::StepOperands(std::size_t)> gpu;  // parameter i's operands for the fused kernel
    bool (*fused)(cuda::StepTable&, std::span<const cuda::StepOperands>, const cuda::StepState&);

    // Parameter i of `optimizer` with its gradient, state tensors (undefined: none) and group settings.
    static cuda::StepOperands operands(const Optimizer& optimizer, std::size_t i, const Tensor& state1,
                                       const Tensor& state2, const std::array<double, kStepScalars>& settings) {
        const Tensor& value = optimizer.parameters_[i].value();
        return {value.dtype(),
                value.raw_data(),
                optimizer.parameters_[i].grad().raw_data(),
                state1.defined() ? state1.raw_data() : nullptr,
                state2.defined() ? state2.raw_data() : nullptr,
                value.numel(),
                settings,
                static_cast<std::int32_t>(optimizer.group_of_[i]),
                static_cast<std::int32_t>(i)};
    }
};

namespace optim_detail {

constexpr const char* kSchedulePrefix = "@schedule.";
constexpr const char* kScheduleType = "dyngrad.schedule";

// The one check of every optimizer's and schedule's hyperparameters (lr, momentum, weight decay, eps,
// gamma, eta_min; set_lr too, so a schedule cannot step to an lr of inf): NaN and ±inf are refused with
// the negative values. Betas are checked against [0, 1), which refuses them as well.
void check_non_negative(const std::string& who, const char* what, double value);

// The entry `key` of a checkpoint, with the dtype and shape it must have.
const Tensor& entry(const TensorMap& tensors, const std::string& key, DType dtype, const Shape& shape,
                    const std::string& source);

// ValueError when the rank-1 entry `key` has another length than `groups`: a checkpoint of another group
// layout (`what` names the groups in the message). Nothing when the entry is missing or of another rank.
void check_group_count(const TensorMap& tensors, const std::string& key, std::int64_t groups, const std::string& what,
                       const std::string& source);

// IoError for an entry under `prefix` that was not read (`used`): a checkpoint of another model or optimizer.
void check_no_extra(const TensorMap& tensors, const std::string& prefix, const std::set<std::string>& used,
                    const std::string& source);

// ValueError unless the metadata entry `key` names `expected`, the optimizer or schedule type (`what`) being
// loaded; IoError without one.
void check_type_entry(const SafetensorsMetadata& metadata, const char* key, const char* what, const char* expected,
                      const std::string& source);

}  // namespace optim_detail

}  // namespace dyngrad
