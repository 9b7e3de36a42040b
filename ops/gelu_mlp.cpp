// gelu_mlp (ops/linalg.h): the transformer's MLP, linear(gelu(linear(x, w1, b1)), w2, b2), as one op: its user
// function, shape rule, its kernels as linear's and gelu's in turn (the CPU's: the reference) and its composition (the fused-kernel
// check's and create_graph's). GPU: ops/linalg.cu, where cuBLASLt's GELU epilogues take the GELU kernels' place.
#include <array>
#include <atomic>
#include <string_view>
#include <vector>

#include "dyngrad/core/environment.h"
#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/linalg.h"

namespace dyngrad {

namespace {

GeluMlpEpilogues initial_epilogues() {
    const std::string_view text = environment("DYNGRAD_GELU_MLP_EPILOGUES");
    if (text == "none") return GeluMlpEpilogues::none;
    if (text == "forward") return GeluMlpEpilogues::forward;
    return GeluMlpEpilogues::all;
}

// Read by every GPU launch, set from any thread: atomic.
std::atomic<GeluMlpEpilogues>& epilogues() {
    static std::atomic<GeluMlpEpilogues> which{initial_epilogues()};
    return which;
}

}  // namespace

void set_gelu_mlp_epilogues(GeluMlpEpilogues which) { epilogues().store(which); }
GeluMlpEpilogues gelu_mlp_epilogues() { return epilogues().load(); }

// x (*, in) as linear takes it: the leading dims become the 2-D op's rows and come back afterwards.
template <Operand T>
T gelu_mlp(const T& x, const T& w1, const T& b1, const T& w2, const T& b2, GeluApproximation approximate,
           std::source_location where) {
    OpAttrs attrs;
    attrs.gelu_approximation = approximate;
    const Shape& shape = x.shape();
    if (shape.size() == 2 || shape.empty() || w2.shape().size() != 2)
        return apply_op(OpType::GeluMlp, {x, w1, b1, w2, b2}, attrs, where);
    Shape lead(shape.begin(), shape.end() - 1);
    const Shape rows{numel(lead), shape.back()};
    // The op's checks before the reshape is recorded: a refused call records none (an undefined operand: the op's error).
    if constexpr (std::same_as<T, Var>) {
        if (w1.defined() && b1.defined() && w2.defined() && b2.defined()) {
            const Tensor operands[] = {value_of(x).reshaped(rows), value_of(w1), value_of(b1), value_of(w2), value_of(b2)};
            check_op_call(OpType::GeluMlp, operands, attrs, where);
        }
    }
    const T y = apply_op(OpType::GeluMlp, {reshape(x, rows, where), w1, b1, w2, b2}, attrs, where);
    lead.push_back(w2.shape()[0]);
    return reshape(y, lead, where);
}
template Var gelu_mlp(const Var&, const Var&, const Var&, const Var&, const Var&, GeluApproximation,
                      std::source_location);
template Tensor gelu_mlp(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, GeluApproximation,
                         std::source_location);

namespace infer {

// x (N,in), w1 (hidden,in), b1 (hidden), w2 (out,hidden), b2 (out) -> (N,out)
OutputSpec gelu_mlp(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    static constexpr const char* kRoles[] = {"x", "w1", "b1", "w2", "b2"};
    const Tensor& x = inputs[0];
    require_float(x, "x");
    for (std::size_t i = 1; i < 5; ++i) require_same_dtype(inputs[i], kRoles[i], x, "x");
    const auto shapes = [&] {
        std::string text;
        for (std::size_t i = 0; i < 5; ++i) text += str(i ? ", " : "", kRoles[i], " ", to_string(inputs[i].shape()));
        return text;
    };
    if (x.rank() != 2 || inputs[1].rank() != 2 || inputs[2].rank() != 1 || inputs[3].rank() != 2 || inputs[4].rank() != 1)
        throw ShapeError(str("expects x (N,in), w1 (hidden,in), b1 (hidden), w2 (out,hidden), b2 (out), got ", shapes()));
    const std::int64_t hidden = inputs[1].size(0);
    if (inputs[1].size(1) != x.size(1) || inputs[2].size(0) != hidden || inputs[3].size(1) != hidden ||
        inputs[4].size(0) != inputs[3].size(0))
        throw ShapeError(str("the shapes do not chain: ", shapes()));
    if (attrs.gelu_approximation != GeluApproximation::None && attrs.gelu_approximation != GeluApproximation::Tanh)
        throw ValueError(str("unknown GELU approximation ", static_cast<int>(attrs.gelu_approximation)));
    return {{x.size(0), inputs[3].size(0)}, x.dtype()};
}

}  // namespace infer

// ---- the kernels: linear's and gelu's in turn, on the inputs' backend (the CPU's, and the GPU's where cuBLASLt's
// epilogues do not apply) ----
namespace {
Tensor linear_of(const Tensor& x, const Tensor& w, const Tensor& b) {
    const Tensor inputs[] = {x, w, b};
    return backend_forward(OpType::Linear, inputs, OpAttrs{}, OutputSpec{{x.size(0), w.size(0)}, x.dtype()});
}
// args.op's backward kernel of `on`'s backend, run directly.
std::vector<Tensor> backward_on(const Tensor& on, const BackwardArgs& args) {
    const OpDef& def = op_def(args.op);
    return (on.device().is_cuda() ? def.cuda.backward : def.cpu.backward)(args);
}
}  // namespace

// Saves pre = x·w1ᵀ + b1 and h = gelu(pre), (N, hidden).
Tensor gelu_mlp_unfused_forward(const ForwardArgs& args) {
    const std::span<const Tensor> in = args.inputs;
    const Tensor pre = linear_of(in[0], in[1], in[2]);
    const Tensor gelu_in[] = {pre};
    const Tensor h = backend_forward(OpType::Gelu, gelu_in, args.attrs, OutputSpec{pre.shape(), pre.dtype()});
    args.saved.push_back(pre);
    args.saved.push_back(h);
    return linear_of(h, in[3], in[4]);
}

std::vector<Tensor> gelu_mlp_unfused_backward(const BackwardArgs& args) {
    const std::span<const Tensor> in = args.inputs;
    const Tensor& pre = args.saved[0];
    const Tensor& h = args.saved[1];
    const Tensor proj_in[] = {h, in[3], in[4]};
    const std::array<bool, 3> proj_needs{true, args.needs_grad[3], args.needs_grad[4]};
    const std::vector<Tensor> proj = backward_on(
        h, BackwardArgs{OpType::Linear, proj_in, args.output, args.grad_output, OpAttrs{}, {}, proj_needs});
    const Tensor gelu_in[] = {pre};
    const std::array<bool, 1> gelu_needs{true};
    const Tensor dpre =
        backward_on(pre, BackwardArgs{OpType::Gelu, gelu_in, h, proj[0], args.attrs, {}, gelu_needs})[0];
    const Tensor fc_in[] = {in[0], in[1], in[2]};
    const std::array<bool, 3> fc_needs{args.needs_grad[0], args.needs_grad[1], args.needs_grad[2]};
    const std::vector<Tensor> fc =
        backward_on(pre, BackwardArgs{OpType::Linear, fc_in, pre, dpre, OpAttrs{}, {}, fc_needs});
    return {fc[0], fc[1], fc[2], proj[1], proj[2]};
}

// ---- the composition: the fused-kernel check (graph/fusion_check.h) and create_graph ----
namespace {

Var gelu_mlp_composition(std::span<const Var> in, const OpAttrs& attrs) {
    return linear(gelu(linear(in[0], in[1], in[2]), attrs.gelu_approximation), in[3], in[4]);
}

}  // namespace

namespace unfused {
const UnfusedComposition gelu_mlp{gelu_mlp_composition};
}  // namespace unfused

}  // namespace dyngrad
