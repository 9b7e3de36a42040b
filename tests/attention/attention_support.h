// Helpers shared by the attention tests (test_attention, test_attention_cudnn).
#pragma once
#include <cstdint>
#include <vector>

#include "dyngrad/dyngrad.h"

namespace dgtest {

inline bool have_gpu() { return dyngrad::cuda_compiled() && dyngrad::cuda::device_count() > 0; }

// scaled_dot_product_attention's attributes as the op table stores them.
inline dyngrad::OpAttrs attention_attrs(bool causal, double dropout_p = 0.0, std::uint64_t seed = 0) {
    dyngrad::OpAttrs a;
    a.is_causal = causal;
    a.scalar = dropout_p;
    a.seed = seed;
    return a;
}

// scaled_dot_product_attention's row of the op table.
inline const dyngrad::OpDef& attention_def() {
    const dyngrad::OpDef* def = dyngrad::find_op("scaled_dot_product_attention");
    if (def == nullptr) throw dyngrad::GraphError("scaled_dot_product_attention is not in the op table");
    return *def;
}
// The input domains of a case with a mask: q, k, v any values, the mask 0/1.
inline const std::vector<dyngrad::InputDomain> kMaskedDomains = {
    dyngrad::InputDomain::Any, dyngrad::InputDomain::Any, dyngrad::InputDomain::Any, dyngrad::InputDomain::Mask};

// Sets the process-wide cuDNN attention switch while in scope, then restores it.
class CudnnSwitch {
public:
    explicit CudnnSwitch(bool enabled) : previous_(dyngrad::attention_cudnn_enabled()) {
        dyngrad::set_attention_cudnn(enabled);
    }
    ~CudnnSwitch() { dyngrad::set_attention_cudnn(previous_); }
    CudnnSwitch(const CudnnSwitch&) = delete;
    CudnnSwitch& operator=(const CudnnSwitch&) = delete;

private:
    bool previous_;
};

// Sets cuda::deterministic() while in scope, then restores it. Attention's float32 tensor-core backward is one
// fused kernel adding dq with float atomics outside deterministic mode, two deterministic kernels inside it.
class DeterministicMode {
public:
    explicit DeterministicMode(bool deterministic) : previous_(dyngrad::cuda::deterministic()) {
        dyngrad::cuda::set_deterministic(deterministic);
    }
    ~DeterministicMode() { dyngrad::cuda::set_deterministic(previous_); }
    DeterministicMode(const DeterministicMode&) = delete;
    DeterministicMode& operator=(const DeterministicMode&) = delete;

private:
    bool previous_;
};

}  // namespace dgtest
