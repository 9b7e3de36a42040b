// Anomaly mode's switch (the tensor statistics' backend dispatch is in ops/tensor_stats.cpp). The checks themselves run in the
// engine (graph/graph.cpp), right after each forward and each backward kernel.
#include "dyngrad/graph/anomaly.h"

namespace dyngrad {

namespace {
thread_local bool tls_anomaly_mode = false;
}  // namespace

AnomalyModeGuard::AnomalyModeGuard(bool enabled) : previous_(tls_anomaly_mode) { tls_anomaly_mode = enabled; }
AnomalyModeGuard::~AnomalyModeGuard() { tls_anomaly_mode = previous_; }
bool anomaly_mode_enabled() { return tls_anomaly_mode; }

// tensor_stats dispatches to the backends' kernels: ops/tensor_stats.cpp.

std::string to_string(const TensorStats& stats) {
    return str("min ", stats.min, " max ", stats.max, ", ", stats.nan_count, " NaN, ", stats.inf_count, " Inf (of ",
               stats.numel, ")");
}

}  // namespace dyngrad
