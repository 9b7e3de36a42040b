// Matrix products. CPU: ops/linalg.cpp (Eigen). GPU: ops/linalg.cu (cuBLAS, cuBLASLt). Layout ops: ops/layout.h.
#pragma once
#include <source_location>
#include <vector>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// One front door per function over Var (recorded) and Tensor (eager); graph/front_door.h.
// (M,K)@(K,N) -> (M,N); batched (B,M,K)@(B,K,N) -> (B,M,N).
template <Operand T>
T matmul(const T& a, const T& b, std::source_location where = std::source_location::current()) {
    return apply_op(OpType::Matmul, {a, b}, {}, where);
}
// x (*,in) · weight (out,in)ᵀ + bias (out) -> (*,out), as libtorch: any leading dims, x (in) gives (out); bias
// may be undefined (no bias). The Linear node itself is 2-D: other ranks are reshaped around it. `activation` is
// fused into the linear node (graph/op_def.h): relu(x·weightᵀ + bias) is one node whose backward needs only its
// output. Without a bias: the composite relu(matmul(x, weightᵀ)).
template <Operand T>
T linear(const T& x, const T& weight, const T& bias, Activation activation,
         std::source_location where = std::source_location::current());
template <Operand T>
T linear(const T& x, const T& weight, const T& bias, std::source_location where = std::source_location::current()) {
    return linear(x, weight, bias, Activation::None, where);
}
template <Operand T>
T linear(const T& x, const T& weight, std::source_location where = std::source_location::current()) {
    return linear(x, weight, T(), Activation::None, where);
}

// The transformer's MLP as one op (ops/gelu_mlp.cpp):
//   y = linear(gelu(linear(x, w1, b1), approximate), w2, b2)
// x (*,in) as linear takes it, w1 (hidden,in), b1 (hidden), w2 (out,hidden), b2 (out) -> (*,out); both biases
// required, one dtype. Why an op: on the GPU (f32, bf16, f16; GELU's tanh form) the first GEMM adds b1 and applies
// GELU in its epilogue, keeping the pre-activation for the backward (cuBLASLt's GELU_AUX_BIAS), and the backward's
// GEMM dy·w2 multiplies by GELU's derivative in its epilogue (DGELU), b1's gradient summed by dw1's GEMM (BGRADB):
// no GELU kernel in either pass (llm.c's gelu_fusion). Otherwise (the exact GELU, f64, the CPU) linear's and gelu's kernels in
// turn, which is what it computes. Saves the pre-activation and the GELU output, as the composition does.
template <Operand T>
T gelu_mlp(const T& x, const T& w1, const T& b1, const T& w2, const T& b2,
           GeluApproximation approximate = GeluApproximation::None,
           std::source_location where = std::source_location::current());

// Which of gelu_mlp's GPU passes use cuBLASLt's GELU epilogues; the others run linear's and gelu's kernels (the same
// values up to rounding order). Set from any thread; DYNGRAD_GELU_MLP_EPILOGUES=none|forward|all sets it at start.
enum class GeluMlpEpilogues { none, forward, all };
void set_gelu_mlp_epilogues(GeluMlpEpilogues which);
GeluMlpEpilogues gelu_mlp_epilogues();

}  // namespace dyngrad
