// The contract between the graph engine and an op's kernels, and the op-table row type.
//
// Forward:  (inputs, attrs, out shape/dtype) -> output value       (written with '=' into a new tensor)
// Backward: (inputs, output, grad_out, attrs, needs_grad) -> one gradient per input, or an undefined
//           Tensor for inputs that need none. Kernels always return fresh (or aliasing) tensors: the
//           engine alone accumulates at fan-out and reduces broadcast gradients, the same way on every
//           backend, so no kernel decides between '=' and '+='.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_type.h"

namespace dyngrad {

// The differentiable backward of an op (graph/higher_order.h): its arguments and result are Vars.
struct DiffBackwardArgs;
class Var;
using DiffBackwardFn = std::vector<Var> (*)(const DiffBackwardArgs& args);

// The cell of a recurrent layer (ops/rnn.h), as in cuDNN's cudnnRNNMode_t.
enum class RnnMode : std::uint8_t { Lstm, Gru, RnnTanh, RnnRelu };

// An activation fused into the op that produces its input (linear, conv2d): one node and fewer kernel
// launches instead of two nodes, and the pre-activation is never stored.
enum class Activation : std::uint8_t { None, Relu };

// gelu's form (PyTorch's `approximate`): None is x·Φ(x) with the erf, Tanh the tanh approximation.
enum class GeluApproximation : std::uint8_t { None, Tanh };
// How a loss reduces its per-element (or per-row) losses, as PyTorch's `reduction` argument.
enum class Reduction : std::uint8_t { Mean, Sum, None };

// Attributes of a node. Each op reads the fields its table row documents.
struct OpAttrs {
    double scalar = 0.0;  // add/mul scalar operand, pow exponent, leaky slope, elu alpha, clip ceiling, smooth_l1 beta
    std::vector<std::int64_t> axes;   // sum/mean axes (empty: all); transpose: the two axes swapped
    std::int64_t axis = -1;           // max, softmax, log_softmax, narrow, concat
    std::int64_t start = 0;           // narrow: first index along `axis`
    std::int64_t length = 0;          // narrow: number of indices taken
    bool keepdim = false;             // sum/mean/max
    Shape shape;                      // reshape target; layer_norm, rms_norm: the normalized (trailing) shape
    std::optional<double> clamp_min;  // clamp: the lower bound; absent: none
    std::optional<double> clamp_max;  // clamp: the upper bound; absent: none
    GeluApproximation gelu_approximation = GeluApproximation::None;  // gelu
    // conv2d and pooling: (height, width) pairs
    std::array<std::int64_t, 2> kernel{1, 1};    // pooling window
    std::array<std::int64_t, 2> stride{1, 1};
    std::array<std::int64_t, 2> padding{0, 0};
    std::array<std::int64_t, 2> dilation{1, 1};  // conv2d
    std::int64_t groups = 1;                     // conv2d
    bool training = false;                       // batch_norm (batch statistics, update running ones), dropout
    double eps = 1e-5;                           // batch_norm, layer_norm, rms_norm
    double momentum = 0.1;                       // batch_norm: running = (1 - momentum)·running + momentum·batch
    std::uint64_t seed = 0;                      // dropout, multinomial: counter-based draws, identical on every backend
    // scaled_dot_product_attention (ops/attention.h); its dropout p is `scalar`, its dropout seed `seed`
    bool is_causal = false;                      // key s takes part in query t only when s <= t
    std::optional<double> attention_scale;       // absent: 1/sqrt(head dim)
    std::uint32_t custom_id = 0;                 // Custom: which registered op
    std::int64_t padding_idx = -1;               // embedding: the row that gets no gradient; -1: none
    Activation activation = Activation::None;    // linear, conv2d: applied to the output
    // rnn (ops/rnn.h)
    RnnMode rnn_mode = RnnMode::Lstm;
    std::int64_t hidden_size = 0;
    std::int64_t num_layers = 1;
    bool bidirectional = false;
    // rnn: keep what backward needs (cuDNN's reserve space). The op function sets it from grad_enabled(),
    // so that kernels receive what to save instead of reading engine state.
    bool save_for_backward = true;
    // losses (ops/loss.h)
    Reduction reduction = Reduction::Mean;  // cross_entropy, nll_loss, bce_with_logits, l1_loss, smooth_l1_loss
    std::int64_t ignore_index = -100;       // cross_entropy, nll_loss: rows with this target add nothing
    double label_smoothing = 0.0;           // cross_entropy: weight of the uniform target, in [0, 1]
    DType dtype = DType::f32;               // cast: the target dtype
    // sorting and sampling (ops/sampling.h); topk's k and multinomial's num_samples are `length`
    bool descending = false;   // argsort: largest first; topk_indices: the largest (PyTorch's largest=True)
    bool replacement = false;  // multinomial: draw with replacement
};

struct OutputSpec {
    Shape shape;
    DType dtype;
};

struct ForwardArgs {
    OpType op;
    std::span<const Tensor> inputs;
    const OpAttrs& attrs;
    const OutputSpec& out;
    std::vector<Tensor>& saved;  // extra tensors a backward needs beyond inputs and output
};

struct BackwardArgs {
    OpType op;
    std::span<const Tensor> inputs;
    const Tensor& output;
    const Tensor& grad_output;
    const OpAttrs& attrs;
    std::span<const Tensor> saved;
    std::span<const bool> needs_grad;  // one per input
    // Only for kernels with BackendKernels::accumulates_in_place: per input, the gradient it has received so far
    // from later consumers when no other handle shares it (undefined otherwise; empty: none at all). A backward
    // may add its gradient for input i into grads_so_far[i] in place and return that tensor: the engine then
    // adds nothing (narrow's backward adds dy into its window, so the q, k, v slices of one tensor fill one
    // buffer without a zero-filled tensor and a full accumulation pass each).
    std::span<const Tensor> grads_so_far = {};
};

using InferFn = OutputSpec (*)(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs);
using ForwardFn = Tensor (*)(const ForwardArgs& args);
using BackwardFn = std::vector<Tensor> (*)(const BackwardArgs& args);

struct BackendKernels {
    ForwardFn forward = nullptr;
    BackwardFn backward = nullptr;
    // true: the kernels take bf16/f16 tensors themselves (load, compute in f32, round once on store). false: the
    // engine runs them through f32 for reduced-precision inputs (graph/through_f32.h): it converts those inputs
    // to f32, runs the f32 kernel and converts the output (and in backward the gradients) back to their dtype.
    bool native_reduced = false;
    // true: the backward may accumulate into BackwardArgs::grads_so_far in place.
    bool accumulates_in_place = false;
};

// How the finite-difference checker fills an input.
enum class InputDomain : std::uint8_t {
    Any,           // normal(0, 1)
    Positive,      // uniform [0.5, 2]  (log, sqrt, pow, div denominators)
    AwayFromZero,  // |x| in [0.2, 2], random sign (kinks at 0: abs, relu family)
    Labels,        // int64 class indices in [0, inputs[0].shape[1])
    LabelsIgnored, // Labels, with those at indices 1, 5, 9, ... set to OpAttrs::ignore_index
    Constant,      // no gradient is checked for it (e.g. batch_norm running statistics); uniform [0.5, 2]
    Indices,       // int64 in [0, n), n = size of axis attrs.axis of input 0 (gather, index_select, scatter_add;
                   // embedding's cases set axis 0: the weight's rows); no gradient
    Mask,          // 0 or 1 (fair coin) in the case's float dtype (where's condition, masked_fill's mask); no
                   // gradient: the op is flat in it, and a step of 1e-6 at 0 would flip the selection
};

// One case of an op's checks: shapes, attributes and input domains.
struct OpCase {
    std::string label;
    std::vector<Shape> shapes;
    OpAttrs attrs;
    std::vector<InputDomain> domains;  // empty: all Any
};

// OpDef::arity of an op that takes one or more inputs (concat).
inline constexpr int kVariadic = -1;

struct OpDef {
    OpType op;
    const char* name;
    int arity;  // number of inputs (the last `optional_inputs` of them may be left out), or kVariadic
    InferFn infer;
    BackendKernels cpu;
    BackendKernels cuda;
    std::vector<OpCase> (*cases)();  // test cases picked up by tests and dyngrad-verify
    int optional_inputs = 0;         // e.g. conv2d's bias
    // false: a step function (comparisons) or an index (argmax): its output never requires grad, whatever its
    // inputs do, so no backward reaches it and its rows have no backward kernels (as PyTorch's eq and argmax).
    // Its cases mark every input InputDomain::Constant: no gradient is checked, the output is.
    bool differentiable = true;
    // Bit i set: the forward updates input i in place (batch_norm's running statistics). Through f32
    // (graph/through_f32.h) the engine writes such an input's f32 copy back into it, rounded.
    std::uint32_t updates_inputs = 0;
    // The backward written with recorded, differentiable ops (graph/higher_order.h), used by backward and grad
    // with create_graph so that gradients can be differentiated again. nullptr: first-order only (create_graph
    // through such a node throws HigherOrderError naming it). Last on purpose: rows set it as a trailing element.
    DiffBackwardFn differentiable_backward = nullptr;
};

// Whether `def` takes `count` inputs, and how many it takes in words ("2", "2 to 3", "1 or more").
inline bool takes_input_count(const OpDef& def, int count) {
    if (def.arity == kVariadic) return count >= 1;
    return count <= def.arity && count >= def.arity - def.optional_inputs;
}
inline std::string input_count_text(const OpDef& def) {
    if (def.arity == kVariadic) return "1 or more";
    if (def.optional_inputs == 0) return std::to_string(def.arity);
    return std::to_string(def.arity - def.optional_inputs) + " to " + std::to_string(def.arity);
}

// The row for `op` (never null for a valid tag). For OpType::Custom this is the trampoline row;
// op_def(op, attrs) returns the registered op's own definition.
const OpDef& op_def(OpType op);
const OpDef& op_def(OpType op, const OpAttrs& attrs);
std::span<const OpDef> op_table();
// Looks a row up by name; nullptr when there is none.
const OpDef* find_op(std::string_view name);

}  // namespace dyngrad
