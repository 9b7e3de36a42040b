// Autocast (as libtorch's): while an AutocastGuard is alive on a thread, every op that thread records (or runs
// eagerly) first casts its floating inputs by its op's policy (OpDef::autocast, in its op-table row), through
// recorded cast nodes, so gradients flow back to the float32 master parameters in their own dtype.
//
//   {
//       AutocastGuard autocast(DType::bf16);
//       Var loss = cross_entropy(model(graph, x), y);   // linear/conv2d/matmul/attention in bf16, the loss in f32
//   }
//   graph.backward(loss);                               // parameter gradients in f32
//
// The policies (docs/mixed_precision.md gives the table and the reasons):
// - Reduced: the products that run on tensor cores (matmul, linear, conv2d, scaled_dot_product_attention):
//   float32 and the other reduced type are cast to the autocast dtype;
// - Float32: ops whose error grows with the input's rounding or that sum many terms (softmax, log_softmax,
//   every loss, the norms, sum/mean, exp/log/pow, softplus): bfloat16/float16 inputs are cast to float32;
// - Follow: everything else runs in its inputs' dtype; when its floating inputs mix dtypes (a bf16 product plus
//   an f32 residual), all are cast to the widest, float32.
// float64 inputs are never cast (as in PyTorch: autocast leaves double alone). Integer inputs never are.
//
// Guards nest (an inner AutocastGuard(DType::f32) turns autocast off for its scope) and are per thread. Autocast
// stays on under NoGradGuard (bf16 inference), as in PyTorch. While any guard is alive on a thread, a parameter
// cast to a dtype is cast once per graph and reused by its later uses (the cast node is shared, so its gradient
// is the sum over the uses); the cached cast is dropped when the parameter's value is written in place (its
// storage version changes) or replaced, and the cache is emptied when the thread's outermost guard ends.
// Across graphs, a parameter an optimizer updates keeps its cast (set_autocast_parameter_copies below).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "dyngrad/core/dtype.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

class Var;
class Tensor;

// The policy of `op`: its op-table row's (OpDef::autocast, enum AutocastPolicy in graph/op_def.h).
AutocastPolicy autocast_policy(OpType op);
std::string_view autocast_policy_name(AutocastPolicy policy);

// The dtype autocast gives the floating inputs of `op` whose dtypes are `input_dtypes` when autocast runs in
// `autocast_dtype` (bf16 or f16); none when they are left as they are. Inputs of that dtype, float64 or an
// integer dtype are never cast. The one decision rule of the graph and eager paths (and of the tests).
std::optional<DType> autocast_target(OpType op, std::span<const DType> input_dtypes, DType autocast_dtype);

class AutocastGuard {
public:
    // bf16 or f16: autocast into that dtype; f32: autocast off in this scope. DTypeError for f64 and i64.
    explicit AutocastGuard(DType dtype);
    ~AutocastGuard();
    AutocastGuard(const AutocastGuard&) = delete;
    AutocastGuard& operator=(const AutocastGuard&) = delete;

private:
    std::optional<DType> previous_;
};

// The autocast dtype of this thread: bf16/f16 inside an AutocastGuard of that type, none otherwise.
std::optional<DType> autocast_dtype();

// Kept parameter copies (on by default; DYNGRAD_AUTOCAST_PARAMETER_COPIES=0 or set_autocast_parameter_copies(false)
// turns them off, for every thread): the cast of a float32 parameter that an optimizer updates outlives its graph
// as the parameter's 16-bit copy (Parameter::keep_reduced_copy), as llm.c keeps bf16 weights beside its f32
// masters. The optimizer's step rewrites the copy from the new value in the same kernel (no launch of its own),
// and the next graph records the parameter's cast with the copy as its value: no cast kernel, the same bits (the
// step rounds as the cast op does). A copy is used only while it is current (made from the parameter's storage at
// its present version); any other in-place write or a replaced value makes autocast cast again. The cost: the
// 16-bit copies stay allocated between steps (2 bytes per parameter for bf16/f16), where PyTorch frees its
// casts with the step. ZeRO-3 drops a unit's copies with its gathered parameters.
void set_autocast_parameter_copies(bool keep);
bool autocast_parameter_copies();

// Batched parameter-gradient casts (on by default; DYNGRAD_BATCH_GRADIENT_CASTS=0 or
// set_batched_gradient_casts(false) turns them off, for every thread): in a backward pass, the backward of a
// parameter's cast (its 16-bit gradient back to the parameter's float32) waits for the end of the sweep, where
// the casts of all such parameters are converted together, a kernel launch per 64 on a GPU
// (device_memory::convert_ranges) where each was a launch of its own: the bf16 LeNet's eight gradient casts one
// kernel. The same bits (a gradient of three or more terms may sum them in another order); the parameters'
// gradients are complete when backward returns, as before. The held 16-bit
// gradients are converted once they pass 64 MiB, or 4 MiB when the backward reports each parameter's readiness
// (BackwardOptions::on_parameter_ready: data parallel's all-reduce starts as gradients are done), which then comes
// after its batch's conversion, still once per parameter with its complete gradient. Not under anomaly mode or
// DYNGRAD_CHECK_FUSIONS (both look at each node's gradient).
void set_batched_gradient_casts(bool batch);
bool batched_gradient_casts();
// Casts converted that way and the batches they took, in this process (for tests and benchmarks).
struct BatchedGradientCastStats {
    std::int64_t casts = 0;
    std::int64_t batches = 0;
};
BatchedGradientCastStats batched_gradient_cast_stats();

// Parameter casts served from the cache and casts recorded for it, on this thread since the outermost guard
// began (for tests and the docs' claim that a weight is cast once per step); of those casts, the ones that took a
// kept copy (below) and launched no kernel.
struct AutocastCacheStats {
    std::int64_t hits = 0;
    std::int64_t casts = 0;
    std::int64_t copies_used = 0;
};
AutocastCacheStats autocast_cache_stats();

namespace detail {
// The engine's hooks (graph/graph.cpp), called only while autocast_dtype() is set: the inputs with the casts
// that `op` needs recorded in their graph (or run eagerly), or none when `op` needs none.
std::optional<std::vector<Var>> autocast_inputs(OpType op, std::span<const Var> inputs,
                                                std::span<const Tensor> values);
std::optional<std::vector<Tensor>> autocast_tensors(OpType op, std::span<const Tensor> inputs);
// The sweep's count of one batch of `casts` parameter-gradient casts (batched_gradient_cast_stats).
void count_batched_gradient_casts(std::int64_t casts);
}  // namespace detail

}  // namespace dyngrad
