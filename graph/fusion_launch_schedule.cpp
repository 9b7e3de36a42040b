// The fusion compiler's launch side (graph/fusion_replay.h, docs/fusion.md): the lazy launch rule a graph applying a
// plan follows (LaunchTracker, schedule_launches; pure, tests/fusion/test_fusion_replay.cpp) and the launches of
// generated forward and backward kernels on the device's stream. The hook's state: graph/fusion_replay.cpp.
#include <vector>

#include "dyngrad/graph/fusion_replay.h"

namespace dyngrad::fusion {

LaunchTracker::LaunchTracker(const FusionPlan& plan) : plan_(&plan), launched_(plan.groups.size(), 0) {
    for (std::size_t g = 0; g < plan.groups.size(); ++g)
        for (NodeId m : plan.groups[g].members) {
            if (m >= group_of_.size()) group_of_.resize(m + std::size_t{1}, -1);
            group_of_[m] = static_cast<int>(g);
        }
}

int LaunchTracker::group_of(NodeId node) const { return node < group_of_.size() ? group_of_[node] : -1; }

std::vector<std::size_t> LaunchTracker::before(NodeId node, std::span<const NodeId> inputs) {
    std::vector<std::size_t> due;
    const int own = group_of(node);
    for (NodeId input : inputs) {
        const int g = group_of(input);
        if (g < 0 || g == own || launched_[g]) continue;
        launched_[g] = 1;
        due.push_back(static_cast<std::size_t>(g));
    }
    return due;
}

bool LaunchTracker::claim(std::size_t group) {
    if (launched_.at(group)) return false;
    launched_[group] = 1;
    return true;
}

std::optional<std::size_t> LaunchTracker::after(NodeId node) {
    const int g = group_of(node);
    if (g < 0 || launched_[g] || plan_->groups[g].members.back() != node) return std::nullopt;
    launched_[g] = 1;
    return static_cast<std::size_t>(g);
}

std::vector<LaunchEvent> schedule_launches(const FusionPlan& plan, std::span<const std::vector<NodeId>> node_inputs) {
    LaunchTracker tracker(plan);
    std::vector<LaunchEvent> events;
    for (std::size_t i = 0; i < node_inputs.size(); ++i) {
        const auto node = static_cast<NodeId>(i);
        for (std::size_t g : tracker.before(node, node_inputs[i])) events.push_back({g, node, true});
        if (const auto g = tracker.after(node)) events.push_back({*g, node, false});
    }
    return events;
}

namespace {

// One launch of a generated kernel: pointer parameters (inputs, then outputs), then the scalar arguments' bytes.
void launch_generated(const cuda::FusedKernel& kernel, std::int64_t elements, std::span<const Tensor> inputs,
                      std::span<const Tensor> outputs, const std::vector<std::vector<std::byte>>& scalars) {
#if DYNGRAD_WITH_CUDA
    std::vector<void*> pointers;
    pointers.reserve(inputs.size() + outputs.size());
    for (const Tensor& t : inputs) pointers.push_back(t.raw_data());
    for (const Tensor& t : outputs) pointers.push_back(t.raw_data());
    std::vector<void*> arguments;
    arguments.reserve(pointers.size() + scalars.size());
    for (void*& pointer : pointers) arguments.push_back(&pointer);
    for (const std::vector<std::byte>& scalar : scalars) arguments.push_back(const_cast<std::byte*>(scalar.data()));
    kernel.launch(elements, arguments);
#else
    static_cast<void>(kernel);
    static_cast<void>(elements);
    static_cast<void>(inputs);
    static_cast<void>(outputs);
    static_cast<void>(scalars);
    throw DeviceError("fusion: generated kernels need the CUDA build");
#endif
}

}  // namespace

void launch_compiled_group(const CompiledGroup& group, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
    launch_generated(*group.kernel, group.numel, inputs, outputs, group.scalars);
}

void launch_compiled_backward(const CompiledBackward& chain, std::span<const Tensor> inputs,
                              std::span<const Tensor> outputs) {
    if (chain.kernel == nullptr) return;  // nothing to store
    launch_generated(*chain.kernel, chain.numel, inputs, outputs, chain.scalars);
}

}  // namespace dyngrad::fusion
