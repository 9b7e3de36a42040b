// Tensor statistics for anomaly mode (graph/anomaly.h): min/max over the finite elements and NaN/Inf
// counts. CPU: Eigen, here. GPU: ops/tensor_stats.cu. The backend dispatch (tensor_stats) is at the end.
#include <Eigen/Core>
#include <limits>

#include "dyngrad/ops/kernels.h"

namespace dyngrad::cpu {

namespace {

template <typename T>
TensorStats floating_stats(const T* data, std::int64_t n) {
    const Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> x(data, n);
    TensorStats stats;
    stats.numel = n;
    stats.nan_count = x.isNaN().count();
    stats.inf_count = x.isInf().count();
    if (stats.nan_count + stats.inf_count == n) return stats;  // no finite element: min and max stay NaN
    constexpr T kInf = std::numeric_limits<T>::infinity();
    const auto finite = x.isFinite();
    stats.min = static_cast<double>(finite.select(x, kInf).minCoeff());
    stats.max = static_cast<double>(finite.select(x, -kInf).maxCoeff());
    return stats;
}

}  // namespace

// x (any shape, any dtype) -> its statistics
TensorStats tensor_stats(const Tensor& x) {
    if (x.dtype() == DType::i64) {
        TensorStats stats;
        stats.numel = x.numel();
        if (x.numel() == 0) return stats;
        const Eigen::Map<const Eigen::Array<std::int64_t, Eigen::Dynamic, 1>> v(x.data<std::int64_t>(), x.numel());
        stats.min = static_cast<double>(v.minCoeff());
        stats.max = static_cast<double>(v.maxCoeff());
        return stats;
    }
    return dispatch_floating(x.dtype(), "tensor_stats",
                             [&]<typename T>() { return floating_stats(x.data<T>(), x.numel()); });
}

}  // namespace dyngrad::cpu

namespace dyngrad {

TensorStats tensor_stats(const Tensor& tensor) {
    if (!tensor.defined()) throw ValueError("tensor_stats: tensor is undefined");
    // bf16/f16 -> f32 is exact (NaN, Inf and every finite value kept): the f32 statistics are the tensor's.
    if (is_reduced_precision(tensor.dtype())) return tensor_stats(tensor.to(DType::f32));
    if (tensor.device().is_cpu()) return cpu::tensor_stats(tensor);
#if DYNGRAD_WITH_CUDA
    return cuda::tensor_stats(tensor);
#else
    throw DeviceError(str("tensor_stats: ", tensor.device().to_string(), " needs the CUDA backend"));
#endif
}

}  // namespace dyngrad
