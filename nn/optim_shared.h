// Internal: what the optimizers (nn/optim.cpp) share with the schedules (nn/schedules.cpp): the optimizer's
// per-device tables of scalars, which a schedule's step advances, the hyperparameter check and the checkpoint
// entry readers. Not installed.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dyngrad/core/safetensors.h"
#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/optim_kernels.h"

namespace dyngrad {

struct Optimizer::DeviceTables {
#if DYNGRAD_WITH_CUDA
    // What the fused steps of one device read: the chunk table and the device-resident scalars.
    struct OnDevice {
        explicit OnDevice(int device) : table(device) {}
        cuda::StepTable table;
        Tensor lrs;       // f64 (groups)
        Tensor steps;     // i64 (parameters): updates so far
        Tensor arrivals;  // i64 (parameters): the kernels' per-launch chunk counters, zero between launches
        cuda::StepState state(const Gate* gate, const Tensor* clip) const {
            cuda::StepState s;
            if (clip != nullptr) s.clip = clip->data<double>();
            s.lrs = lrs.data<double>();
            s.steps = reinterpret_cast<long long*>(steps.data<std::int64_t>());
            s.arrivals = reinterpret_cast<unsigned long long*>(arrivals.data<std::int64_t>());
            if (gate != nullptr) {
                s.inv_scale = gate->inv_scale.data<float>();
                s.found_inf = gate->found_inf.data<float>();
            }
            return s;
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
        auto& on = by_device.try_emplace(device, device).first->second;
        on.lrs = std::move(lr_values);
        on.steps = std::move(step_values);
        on.arrivals = std::move(arrivals);
        return on;
    }
#endif
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

// IoError for an entry under `prefix` that was not read (`used`): a checkpoint of another model or optimizer.
void check_no_extra(const TensorMap& tensors, const std::string& prefix, const std::set<std::string>& used,
                    const std::string& source);

// The metadata entry `key` naming the optimizer or schedule type a checkpoint holds (IoError without one).
const std::string& type_entry(const SafetensorsMetadata& metadata, const char* key, const char* what,
                              const std::string& source);

}  // namespace optim_detail

}  // namespace dyngrad
