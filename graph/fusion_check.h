// Fused-kernel check mode: every fused GPU kernel is compared, on its first use per shape, with the unfused
// composition of ops it replaces, run on the same device from the same inputs — forward value and, in the
// backward, every input gradient. The f64 CPU replay (graph/verify.h) checks the fused op against an independent
// reference as well; this mode catches a fused kernel that disagrees with the unfused path on the GPU itself,
// during a real run, at the cost of one extra unfused evaluation per new shape.
//
// Fused today: linear with a bias and/or ReLU (cuBLASLt epilogues: bias in the forward GEMM, the bias gradient in
// the weight-gradient GEMM, the ReLU mask), conv2d with a bias and/or ReLU (our bias+activation epilogue and the
// mask+bias-gradient kernel), cross_entropy (log-softmax, NLL and the seed in fused row kernels). Not covered by
// this mode: the multi-tensor optimizer steps, which tests/gpu/test_gpu.cpp ([optim]) compares with the CPU's
// per-parameter updates over many chunks, groups and step counts.
#pragma once
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

// On: every fused kernel's first use per (op, shapes, dtypes, attributes) is checked; a disagreement beyond
// the dtype's tolerance throws NumericalError naming the op, shapes and error. Also on when the environment
// has DYNGRAD_CHECK_FUSIONS=1 at start-up. Off by default (the check costs one unfused run per new shape).
void set_fusion_check(bool on);
bool fusion_check_enabled();

struct FusionCheckResult {
    std::string op;           // "linear", "conv2d", ...
    std::string key;          // shapes, dtypes and the fused attributes
    std::string pass;         // "forward" or "backward input k"
    double max_abs_error = 0;  // fused vs unfused
    double scale = 0;          // max |unfused|: the error's yardstick
    double tolerance = 0;      // relative to scale
    bool passed = false;
};
// Every check made since start-up or the last clear, in order.
std::vector<FusionCheckResult> fusion_check_results();
void clear_fusion_check_results();  // also forgets which shapes were checked

// What a fused op is the fusion of (its op-table row's OpDef::unfused, written in ops/unfused.cpp): `compose` records
// the unfused ops on `inputs`' graph; `applies` says whether the kernels fuse anything for these inputs and
// attributes (null: always).
struct UnfusedComposition {
    Var (*compose)(std::span<const Var> inputs, const OpAttrs& attrs);
    bool (*applies)(std::span<const Tensor> inputs, const OpAttrs& attrs) = nullptr;
};

namespace detail {
// Sets this thread's recording mode and returns the previous one (graph/graph.cpp): the check builds the unfused
// composition's graph from inside a backward or a no_grad scope.
bool exchange_grad_enabled(bool enabled);
// Engine hooks (graph/graph.cpp): cheap when the mode is off or the op fuses nothing.
void check_fused_forward(const OpDef& def, OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs,
                         const Tensor& output);
void check_fused_backward(const OpDef& def, OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs,
                          const Tensor& grad_output, std::span<const Tensor> grads, std::span<const bool> needs_grad);
}  // namespace detail

}  // namespace dyngrad
