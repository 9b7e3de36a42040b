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
#include <string_view>
#include <variant>
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

// The names of a choice attribute's values, in enum order: what Python keywords, the golden export and error
// text write (a new enum attribute adds its overload here).
inline constexpr std::string_view kRnnModeNames[] = {"lstm", "gru", "rnn_tanh", "rnn_relu"};
inline constexpr std::string_view kActivationNames[] = {"none", "relu"};
inline constexpr std::string_view kGeluApproximationNames[] = {"none", "tanh"};
inline constexpr std::string_view kReductionNames[] = {"mean", "sum", "none"};
// DType's, as core/dtype.h's dtype_name writes them (checked in graph/op_attrs.cpp).
inline constexpr std::string_view kDTypeNames[] = {"float32", "float64", "int64", "bfloat16", "float16"};
constexpr std::span<const std::string_view> choice_names(RnnMode) { return kRnnModeNames; }
constexpr std::span<const std::string_view> choice_names(Activation) { return kActivationNames; }
constexpr std::span<const std::string_view> choice_names(GeluApproximation) { return kGeluApproximationNames; }
constexpr std::span<const std::string_view> choice_names(Reduction) { return kReductionNames; }
constexpr std::span<const std::string_view> choice_names(DType) { return kDTypeNames; }

// Attributes of a node. Each op reads the fields its table row names (OpDef::attrs, from kAttrFields below).
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
    std::int64_t num_heads = 1;                  // qkv_attention: H, the packed projection's heads
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

// ---- The attribute field table: one entry per OpAttrs member ----
// Every serialiser of attributes walks this table instead of naming members by hand: the Python keyword parser
// (python/src/op_path.cpp), the golden export (tools/export_cases.cpp, read by tools/make_goldens.py), the fuzzer
// (tests/fuzz/fuzz_graph.cpp) and error text (attrs_text). A row of the op table names the entries its op reads
// (OpDef::attrs); the default of a field is its initialiser in OpAttrs above. A new attribute: its member above
// and its entry here (and, for a new enum type, its choice_names overload).
//
// The member's type is the field's kind: float (double), optional float (None: absent), int, uint64 (seed),
// bool, int list (axes, shape), int pair (an int or two), choice (an enum: choice_names), internal (uint32).
using AttrMember =
    std::variant<double OpAttrs::*, std::optional<double> OpAttrs::*, std::int64_t OpAttrs::*, std::uint64_t OpAttrs::*,
                 std::uint32_t OpAttrs::*, bool OpAttrs::*, std::vector<std::int64_t> OpAttrs::*,
                 std::array<std::int64_t, 2> OpAttrs::*, GeluApproximation OpAttrs::*, Activation OpAttrs::*,
                 RnnMode OpAttrs::*, Reduction OpAttrs::*, DType OpAttrs::*>;

struct AttrField {
    std::string_view name;  // the member's name: JSON key, fuzzer, error text
    // Python keywords, first the one users write (unused slots empty); none: only the library sets it.
    std::array<std::string_view, 3> keywords;
    AttrMember member;
};

inline constexpr AttrField kAttrFields[] = {
    {"scalar", {"scalar", "dropout_p"}, &OpAttrs::scalar},
    {"axes", {"axes", "dims"}, &OpAttrs::axes},
    {"axis", {"axis", "dim"}, &OpAttrs::axis},
    {"start", {"start"}, &OpAttrs::start},
    {"length", {"length", "k", "num_samples"}, &OpAttrs::length},  // topk's k, multinomial's num_samples
    {"keepdim", {"keepdim"}, &OpAttrs::keepdim},
    {"shape", {"shape"}, &OpAttrs::shape},
    {"clamp_min", {"min"}, &OpAttrs::clamp_min},
    {"clamp_max", {"max"}, &OpAttrs::clamp_max},
    {"gelu_approximation", {"approximate"}, &OpAttrs::gelu_approximation},
    {"kernel", {"kernel", "kernel_size"}, &OpAttrs::kernel},
    {"stride", {"stride"}, &OpAttrs::stride},
    {"padding", {"padding"}, &OpAttrs::padding},
    {"dilation", {"dilation"}, &OpAttrs::dilation},
    {"groups", {"groups"}, &OpAttrs::groups},
    {"training", {"training"}, &OpAttrs::training},
    {"eps", {"eps"}, &OpAttrs::eps},
    {"momentum", {"momentum"}, &OpAttrs::momentum},
    {"seed", {"seed"}, &OpAttrs::seed},
    {"is_causal", {"is_causal"}, &OpAttrs::is_causal},
    {"attention_scale", {"scale"}, &OpAttrs::attention_scale},
    {"num_heads", {"num_heads"}, &OpAttrs::num_heads},
    {"custom_id", {}, &OpAttrs::custom_id},
    {"padding_idx", {"padding_idx"}, &OpAttrs::padding_idx},
    {"activation", {"activation"}, &OpAttrs::activation},
    {"rnn_mode", {"mode"}, &OpAttrs::rnn_mode},
    {"hidden_size", {"hidden_size"}, &OpAttrs::hidden_size},
    {"num_layers", {"num_layers"}, &OpAttrs::num_layers},
    {"bidirectional", {"bidirectional"}, &OpAttrs::bidirectional},
    {"save_for_backward", {"save_for_backward"}, &OpAttrs::save_for_backward},
    {"reduction", {"reduction"}, &OpAttrs::reduction},
    {"ignore_index", {"ignore_index"}, &OpAttrs::ignore_index},
    {"label_smoothing", {"label_smoothing"}, &OpAttrs::label_smoothing},
    {"dtype", {"dtype"}, &OpAttrs::dtype},
    {"descending", {"descending", "largest"}, &OpAttrs::descending},
    {"replacement", {"replacement"}, &OpAttrs::replacement},
};
inline constexpr std::size_t kAttrFieldCount = std::size(kAttrFields);
static_assert(kAttrFieldCount <= 64, "AttrSet holds one bit per field");

// The fields an op reads: one bit per kAttrFields entry. Rows write reads("axes", "keepdim"); a name that is not
// in the field table does not compile.
class AttrSet {
public:
    constexpr AttrSet() = default;
    constexpr bool contains(std::size_t field) const { return (bits_ >> field) & 1u; }
    constexpr bool empty() const { return bits_ == 0; }
    constexpr AttrSet with(std::size_t field) const { return AttrSet(bits_ | (std::uint64_t{1} << field)); }
    constexpr bool operator==(const AttrSet&) const = default;

private:
    constexpr explicit AttrSet(std::uint64_t bits) : bits_(bits) {}
    std::uint64_t bits_ = 0;
};

// The index of the field called `name` in kAttrFields (a compile error in a constant expression when none is).
consteval std::size_t attr_field_index(std::string_view name) {
    for (std::size_t i = 0; i < kAttrFieldCount; ++i)
        if (kAttrFields[i].name == name) return i;
    throw "reads(): no OpAttrs field of this name in kAttrFields (graph/op_def.h)";
}
template <typename... Names>
consteval AttrSet reads(const Names&... names) {
    AttrSet set;
    ((set = set.with(attr_field_index(names))), ...);
    return set;
}
inline constexpr AttrSet kNoAttrs{};

// The engine's autocast policy of an op (graph/autocast.h says what each does; docs/mixed_precision.md why).
enum class AutocastPolicy : std::uint8_t { Reduced, Float32, Follow };

struct UnfusedComposition;  // graph/fusion_check.h
// A row's argument rule (graph/front_door.h): fills in, from the inputs, what the caller left to the op's defaults.
class OpCall;
using PrepareFn = void (*)(OpCall& call);

// The scalar formula of a pointwise op: which functor of ops/elementwise_math.h its kernels apply to each element.
// The fusion compiler (graph/fusion_plan.h, ops/fusion_source.h) groups the ops that have one and generates kernels
// that call the same functors, so a fused kernel computes what the op's own kernels compute (docs/fusion.md).
struct PointwiseFormula {
    enum class Form : std::uint8_t {
        Unary,   // Functor::forward(x, scalars) through math::apply_forward
        Binary,  // Functor::forward(a, b), the inputs broadcast to the output's shape
        Cast,    // a conversion to OpAttrs::dtype (no functor): the value rounded once to that dtype
        Where,       // inputs (condition, a, b): condition != 0 ? a : b (no functor); da, db routed by the condition
        MaskedFill,  // inputs (x, mask): mask != 0 ? OpAttrs::scalar : x, the scalar rounded once to x's dtype
        Dropout,     // inputs (x[, seed]): math::dropout_apply with element i's mask (training, p > 0 only)
    };
    Form form;
    const char* functor;                 // the functor's name in namespace dyngrad::math; nullptr for Cast
    const char* tanh_functor = nullptr;  // gelu: the functor when OpAttrs::gelu_approximation is Tanh
    // What the derivative formula reads, so the plan knows which values a backward needs in memory.
    bool derivative_reads_inputs = false;
    bool derivative_reads_output = false;
};

// Whether the derivative formula reads input `input`'s value: every input or none, except where and masked_fill,
// whose gradients read only the condition (the values they select among are not needed), and dropout, whose
// gradient reads only its seed input (the mask is recomputed from it).
constexpr bool derivative_reads_input(const PointwiseFormula& formula, std::size_t input) {
    switch (formula.form) {
        case PointwiseFormula::Form::Where: return input == 0;
        case PointwiseFormula::Form::MaskedFill: return input == 1;
        case PointwiseFormula::Form::Dropout: return input == 1;
        default: return formula.derivative_reads_inputs;
    }
}

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
    AttrSet attrs;                   // the OpAttrs fields it reads: reads("axis", "keepdim"), or kNoAttrs
    // Its autocast policy; every row of the built-in table states one (a static_assert in ops/op_table.cpp), so a
    // new op never falls into a default silently.
    std::optional<AutocastPolicy> autocast;
    // The PyTorch expression it matches, in the names of its inputs and attributes ("torch.softmax(x, dim=axis)"):
    // shown by dyngrad-verify --list, written into the golden export for tools/make_goldens.py.
    const char* torch = nullptr;
    int optional_inputs = 0;         // e.g. conv2d's bias
    // false: a step function (comparisons) or an index (argmax): its output never requires grad, whatever its
    // inputs do, so no backward reaches it and its rows have no backward kernels (as PyTorch's eq and argmax).
    // Its cases mark every input InputDomain::Constant: no gradient is checked, the output is.
    bool differentiable = true;
    // Bit i set: the forward updates input i in place (batch_norm's running statistics). Through f32
    // (graph/through_f32.h) the engine writes such an input's f32 copy back into it, rounded.
    std::uint32_t updates_inputs = 0;
    // A fused op (linear or conv2d with bias/ReLU, cross_entropy): what it is the fusion of (ops/unfused.cpp), for
    // the fused-kernel check mode (graph/fusion_check.h). nullptr: the op fuses nothing.
    const UnfusedComposition* unfused = nullptr;
    // The backward written with recorded, differentiable ops (graph/higher_order.h), used by backward and grad
    // with create_graph so that gradients can be differentiated again. nullptr: first-order only (create_graph
    // through such a node throws HigherOrderError naming it). Rows set it as a trailing element.
    DiffBackwardFn differentiable_backward = nullptr;
    // A pointwise op: its scalar formula (ops/elementwise_math.h, math::formula), which the fusion compiler
    // generates kernels from. nullptr: not pointwise, the op ends a fused group. Rows that set it are pointwise.
    const PointwiseFormula* pointwise = nullptr;
    // The argument rule every caller runs before the op (graph/front_door.h: the C++ front doors and Python's
    // dg.ops): defaults that depend on the inputs (rms_norm's eps, pooling's stride, a bias without a weight).
    // nullptr: the attributes' initialisers are the defaults. Last: rows that set it give `pointwise` (nullptr) first.
    PrepareFn prepare = nullptr;
};

// The attributes `def` reads, in field-table order: "axis=1, keepdim=true" ("" when it reads none); for error
// text and keys (graph/op_attrs.cpp).
std::string attrs_text(const OpDef& def, const OpAttrs& attrs);
// One field's value as JSON (strings quoted, an absent optional null, a uint64 as a string: JSON numbers lose 64-bit
// integers), or as text (unquoted, "none" for absent) when `json` is false.
std::string attr_value_text(const AttrField& field, const OpAttrs& attrs, bool json);
// The Python keywords `def` takes: "axes (dims), keepdim", or "none".
std::string attr_keywords_text(const OpDef& def);
// The field whose Python keywords include `keyword`; nullptr when none does. The pointer is into the library's own
// kAttrFields: a module built with hidden symbols (the Python extension) has its own copy of the inline array, so
// it compares names or indices there, not addresses.
const AttrField* find_attr_keyword(std::string_view keyword);

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
