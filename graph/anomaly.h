// Anomaly mode: finds the first NaN or Inf of a run and the node that made it.
//
// While an AnomalyModeGuard is alive on a thread, the engine (graph/graph.cpp) checks every node's value
// right after its forward and every gradient right after the backward kernel that produced it, and
// throws NumericalError at the first NaN or Inf. The message names the node (op, id, debug name,
// creation site file:line) and gives min/max/NaN/Inf counts of its inputs, its output and the gradients
// involved. Off by default: without the guard NaN and Inf propagate like any other value.
//
// It is a debugging mode: each check is one statistics pass over the tensor, and on a GPU the host reads
// the statistics, so every recorded op and every backward step synchronises the device's stream.
// Measured cost: docs/reliability.md, "Anomaly mode".
#pragma once
#include <cstdint>
#include <limits>
#include <string>

#include "dyngrad/core/tensor.h"

namespace dyngrad {

// Switches anomaly mode on (or, with false, off) for this thread while alive; nests like NoGradGuard.
class AnomalyModeGuard {
public:
    explicit AnomalyModeGuard(bool enabled = true);
    ~AnomalyModeGuard();
    AnomalyModeGuard(const AnomalyModeGuard&) = delete;
    AnomalyModeGuard& operator=(const AnomalyModeGuard&) = delete;

private:
    bool previous_;
};
bool anomaly_mode_enabled();

// What a tensor holds: min and max over its finite elements (NaN when it has none), and how many
// elements are NaN or ±Inf.
struct TensorStats {
    std::int64_t numel = 0;
    std::int64_t nan_count = 0;
    std::int64_t inf_count = 0;
    double min = std::numeric_limits<double>::quiet_NaN();
    double max = std::numeric_limits<double>::quiet_NaN();
    bool all_finite() const { return nan_count == 0 && inf_count == 0; }
};

// Computed on the tensor's device (cpu: Eigen, cuda: a reduction kernel whose result the host reads, so
// it waits for the device's stream). Any dtype; int64 tensors have no NaN or Inf.
TensorStats tensor_stats(const Tensor& tensor);
// "min -1 max 2, 1 NaN, 0 Inf (of 3)"
std::string to_string(const TensorStats& stats);

}  // namespace dyngrad
