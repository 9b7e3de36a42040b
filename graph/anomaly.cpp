// Anomaly mode's switch and the tensor statistics' backend dispatch. The checks themselves run in the
// engine (graph/graph.cpp), right after each forward and each backward kernel.
#include "dyngrad/graph/anomaly.h"

#include "dyngrad/ops/kernels.h"

namespace dyngrad {

namespace {
thread_local bool tls_anomaly_mode = false;
}  // namespace

AnomalyModeGuard::AnomalyModeGuard(bool enabled) : previous_(tls_anomaly_mode) { tls_anomaly_mode = enabled; }
AnomalyModeGuard::~AnomalyModeGuard() { tls_anomaly_mode = previous_; }
bool anomaly_mode_enabled() { return tls_anomaly_mode; }

TensorStats tensor_stats(const Tensor& tensor) {
    if (!tensor.defined()) throw ValueError("tensor_stats: tensor is undefined");
    if (tensor.device().is_cpu()) return cpu::tensor_stats(tensor);
#if DYNGRAD_WITH_CUDA
    return cuda::tensor_stats(tensor);
#else
    throw DeviceError(str("tensor_stats: ", tensor.device().to_string(), " needs the CUDA backend"));
#endif
}

std::string to_string(const TensorStats& stats) {
    return str("min ", stats.min, " max ", stats.max, ", ", stats.nan_count, " NaN, ", stats.inf_count, " Inf (of ",
               stats.numel, ")");
}

}  // namespace dyngrad
