// Hostile user-defined ops (graph/custom_op.h): definitions that are incomplete, and ops whose shape rule,
// forward or backward breaks the contract of graph/op_def.h or throws something that is not a std::exception.
// The engine checks every op where it calls it (graph/graph.cpp), so each must give a typed error naming
// the op and what it did wrong.
#include <functional>
#include <string>
#include <typeinfo>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

OutputSpec same_shape(OpType, std::span<const Tensor> in, const OpAttrs&) { return {in[0].shape(), in[0].dtype()}; }
OutputSpec negative_dim(OpType, std::span<const Tensor> in, const OpAttrs&) { return {{in[0].size(0), -1}, in[0].dtype()}; }
OutputSpec all_negative(OpType, std::span<const Tensor>, const OpAttrs&) { return {{-4}, DType::f64}; }
OutputSpec int64_rule(OpType, std::span<const Tensor> in, const OpAttrs&) { return {in[0].shape(), DType::i64}; }
OutputSpec throws_int_rule(OpType, std::span<const Tensor>, const OpAttrs&) { throw 42; }
OutputSpec throws_text_rule(OpType, std::span<const Tensor>, const OpAttrs&) { throw "no shape for you"; }
OutputSpec throws_std_rule(OpType, std::span<const Tensor>, const OpAttrs&) { throw std::logic_error("rule broke"); }

Tensor copy_forward(const ForwardArgs& a) { return a.inputs[0].clone(); }
Tensor undefined_forward(const ForwardArgs&) { return Tensor(); }
Tensor flat_forward(const ForwardArgs& a) { return a.inputs[0].clone().reshaped({a.inputs[0].numel()}); }
Tensor extra_axis_forward(const ForwardArgs& a) {
    Shape s = a.inputs[0].shape();
    s.push_back(1);
    return a.inputs[0].clone().reshaped(s);
}
Tensor scalar_forward(const ForwardArgs& a) { return Tensor::zeros({}, a.out.dtype); }
Tensor f32_forward(const ForwardArgs& a) { return a.inputs[0].to(DType::f32); }
Tensor i64_forward(const ForwardArgs& a) { return Tensor::zeros(a.out.shape, DType::i64); }
Tensor transposed_forward(const ForwardArgs& a) {
    return Tensor::zeros({a.inputs[0].size(1), a.inputs[0].size(0)}, a.out.dtype);
}
Tensor throws_int_forward(const ForwardArgs&) { throw 42; }
Tensor throws_string_forward(const ForwardArgs&) { throw std::string("forward broke"); }
struct NotAnException {};
Tensor throws_struct_forward(const ForwardArgs&) { throw NotAnException{}; }

std::vector<Tensor> copy_backward(const BackwardArgs& a) { return {a.grad_output.clone()}; }
std::vector<Tensor> throws_int_backward(const BackwardArgs&) { throw 42; }
std::vector<Tensor> throws_struct_backward(const BackwardArgs&) { throw NotAnException{}; }
std::vector<Tensor> no_gradients(const BackwardArgs&) { return {}; }
std::vector<Tensor> two_gradients(const BackwardArgs& a) { return {a.grad_output.clone(), a.grad_output.clone()}; }
std::vector<Tensor> undefined_gradient(const BackwardArgs&) { return {Tensor()}; }
std::vector<Tensor> f32_gradient(const BackwardArgs& a) { return {a.grad_output.to(DType::f32)}; }
std::vector<Tensor> square_gradient(const BackwardArgs& a) { return {Tensor::ones({2, 2}, a.inputs[0].dtype())}; }
std::vector<Tensor> longer_gradient(const BackwardArgs& a) {
    return {Tensor::ones({a.inputs[0].numel() + 1}, a.inputs[0].dtype())};
}

// A case expecting exactly dyngrad::Error, the type a non-std exception (or another std exception) becomes.
hostile::Case expect_error(std::string label, std::vector<std::string> keys, std::function<void()> call) {
    return hostile::Case{"", std::move(label), "dyngrad::Error",
                         [](const Error& e) { return typeid(e) == typeid(Error); }, std::move(keys), std::move(call)};
}

CustomOp op(const char* name, InferFn infer, ForwardFn forward, BackwardFn backward = copy_backward) {
    return CustomOp::define({.name = name, .arity = 1, .infer = infer, .cpu = {forward, backward}});
}

// Records `custom` on a fresh (3,4) float64 input that requires grad.
void record_on_matrix(const CustomOp& custom) {
    Generator gen(91);
    ComputeGraph g;
    custom({g.input(Tensor::normal({3, 4}, 0, 1, gen, DType::f64), "x", true)});
}
// Records `custom` on a (5) input and back-propagates through it.
void backward_through(const CustomOp& custom) {
    Generator gen(92);
    ComputeGraph g;
    Var x = g.input(Tensor::normal({5}, 0, 1, gen, DType::f64), "x", true);
    g.backward(sum(custom({x})));
}

hostile::Case forward_case(std::string label, const char* name, InferFn infer, ForwardFn forward,
                           std::vector<std::string> keys) {
    keys.insert(keys.begin(), str("custom op '", name, "'"));
    return hostile::expect<GraphError>(std::move(label), std::move(keys),
                                       [=] { record_on_matrix(op(name, infer, forward)); });
}

const bool added = hostile::add(
    "custom_ops",
    {
        // definitions
        hostile::expect<ValueError>("define with an empty name", {"needs a name"},
                                    [] { CustomOp::define({.name = "", .arity = 1, .infer = same_shape,
                                                           .cpu = {copy_forward, copy_backward}}); }),
        hostile::expect<ValueError>("define with arity 0", {"hostile_arity", "arity must be >= 1"},
                                    [] { CustomOp::define({.name = "hostile_arity", .arity = 0, .infer = same_shape,
                                                           .cpu = {copy_forward, copy_backward}}); }),
        hostile::expect<ValueError>("define without a shape rule", {"hostile_no_rule", "shape rule"},
                                    [] { CustomOp::define({.name = "hostile_no_rule", .arity = 1,
                                                           .cpu = {copy_forward, copy_backward}}); }),
        hostile::expect<ValueError>("define without a CPU backward", {"hostile_no_backward", "backward"},
                                    [] { CustomOp::define({.name = "hostile_no_backward", .arity = 1,
                                                           .infer = same_shape, .cpu = {copy_forward, nullptr}}); }),
        hostile::expect<ValueError>("define with a CUDA forward but no CUDA backward", {"hostile_half_cuda", "CUDA"},
                                    [] { CustomOp::define({.name = "hostile_half_cuda", .arity = 1, .infer = same_shape,
                                                           .cpu = {copy_forward, copy_backward},
                                                           .cuda = {copy_forward, nullptr}}); }),
        // calls
        hostile::expect<GraphError>("call with no inputs", {"hostile_call", "needs defined inputs"},
                                    [] { op("hostile_call", same_shape, copy_forward)({}); }),
        hostile::expect<GraphError>("call with an undefined Var", {"hostile_call_undefined", "needs defined inputs"},
                                    [] { op("hostile_call_undefined", same_shape, copy_forward)({Var()}); }),
        hostile::expect<GraphError>("call with two inputs for arity 1", {"hostile_call_two", "takes 1 inputs, got 2"},
                                    [] {
                                        ComputeGraph g;
                                        Var x = g.input(Tensor::ones({2}));
                                        op("hostile_call_two", same_shape, copy_forward)({x, x});
                                    }),
        // shape rules
        hostile::expect<ShapeError>("shape rule with a negative dimension",
                                    {"custom op 'hostile_negative_dim'", "shape (3,-1)", "negative dimension"},
                                    [] { record_on_matrix(op("hostile_negative_dim", negative_dim, copy_forward)); }),
        hostile::expect<ShapeError>("shape rule of shape (-4)", {"custom op 'hostile_all_negative'", "(-4)"},
                                    [] { record_on_matrix(op("hostile_all_negative", all_negative, copy_forward)); }),
        expect_error("shape rule throws 42",
                               {"custom op 'hostile_rule_int'", "its shape rule threw", "not a std::exception"},
                               [] { record_on_matrix(op("hostile_rule_int", throws_int_rule, copy_forward)); }),
        expect_error("shape rule throws a string literal",
                               {"custom op 'hostile_rule_text'", "its shape rule threw", "not a std::exception"},
                               [] { record_on_matrix(op("hostile_rule_text", throws_text_rule, copy_forward)); }),
        expect_error("shape rule throws std::logic_error", {"hostile_rule_std", "rule broke"},
                               [] { record_on_matrix(op("hostile_rule_std", throws_std_rule, copy_forward)); }),
        // forwards that disagree with their shape rule
        forward_case("forward returns an undefined tensor", "hostile_undefined", same_shape, undefined_forward,
                     {"returned an undefined tensor", "(3,4) float64 cpu"}),
        forward_case("forward returns a flattened output", "hostile_flat", same_shape, flat_forward,
                     {"returned (12) float64", "shape rule gave (3,4) float64"}),
        forward_case("forward returns an extra axis", "hostile_extra_axis", same_shape, extra_axis_forward,
                     {"returned (3,4,1)", "gave (3,4)"}),
        forward_case("forward returns a scalar", "hostile_scalar", same_shape, scalar_forward,
                     {"returned () float64", "gave (3,4)"}),
        forward_case("forward returns the transposed shape", "hostile_transposed", same_shape, transposed_forward,
                     {"returned (4,3)", "gave (3,4)"}),
        forward_case("forward returns float32 for a float64 rule", "hostile_f32", same_shape, f32_forward,
                     {"returned (3,4) float32", "gave (3,4) float64"}),
        forward_case("forward returns int64 for a float64 rule", "hostile_i64", same_shape, i64_forward,
                     {"returned (3,4) int64", "gave (3,4) float64"}),
        forward_case("forward returns float64 for an int64 rule", "hostile_rule_i64", int64_rule, copy_forward,
                     {"returned (3,4) float64", "gave (3,4) int64"}),
        hostile::expect<GraphError>("forward returns an undefined tensor without grad",
                                    {"custom op 'hostile_undefined_nograd'", "undefined tensor"}, [] {
                                        const NoGradGuard no_grad;
                                        record_on_matrix(op("hostile_undefined_nograd", same_shape, undefined_forward));
                                    }),
        hostile::expect<GraphError>("forward returns a wrong shape under anomaly mode",
                                    {"custom op 'hostile_flat_anomaly'", "returned (12)"}, [] {
                                        const AnomalyModeGuard anomaly;
                                        record_on_matrix(op("hostile_flat_anomaly", same_shape, flat_forward));
                                    }),
        // forwards that throw something other than a std::exception
        expect_error("forward throws 42", {"custom op 'hostile_fwd_int'", "its forward threw"},
                               [] { record_on_matrix(op("hostile_fwd_int", same_shape, throws_int_forward)); }),
        expect_error("forward throws std::string", {"custom op 'hostile_fwd_string'", "its forward threw"},
                               [] { record_on_matrix(op("hostile_fwd_string", same_shape, throws_string_forward)); }),
        expect_error("forward throws a plain struct", {"custom op 'hostile_fwd_struct'", "not a std::exception"},
                               [] { record_on_matrix(op("hostile_fwd_struct", same_shape, throws_struct_forward)); }),
        // backwards
        expect_error("backward throws 42", {"custom op 'hostile_bwd_int'", "its backward threw"},
                               [] { backward_through(op("hostile_bwd_int", same_shape, copy_forward, throws_int_backward)); }),
        expect_error("backward throws a plain struct", {"custom op 'hostile_bwd_struct'", "its backward threw"},
                               [] {
                                   backward_through(op("hostile_bwd_struct", same_shape, copy_forward,
                                                       throws_struct_backward));
                               }),
        hostile::expect<GraphError>("backward returns no gradients", {"hostile_bwd_none", "returned 0 gradients for 1"},
                                    [] { backward_through(op("hostile_bwd_none", same_shape, copy_forward, no_gradients)); }),
        hostile::expect<GraphError>("backward returns two gradients for one input", {"hostile_bwd_two", "returned 2"},
                                    [] { backward_through(op("hostile_bwd_two", same_shape, copy_forward, two_gradients)); }),
        hostile::expect<GraphError>("backward returns an undefined gradient", {"hostile_bwd_undefined", "no gradient for input 0"},
                                    [] {
                                        backward_through(op("hostile_bwd_undefined", same_shape, copy_forward,
                                                            undefined_gradient));
                                    }),
        hostile::expect<GraphError>("backward returns a float32 gradient for float64", {"hostile_bwd_f32", "float32"},
                                    [] { backward_through(op("hostile_bwd_f32", same_shape, copy_forward, f32_gradient)); }),
        hostile::expect<ShapeError>("backward returns (2,2) for a (5) input",
                                    {"custom op 'hostile_bwd_square'", "gradient of shape (2,2) for input 0 of shape (5)"},
                                    [] {
                                        backward_through(op("hostile_bwd_square", same_shape, copy_forward,
                                                            square_gradient));
                                    }),
        hostile::expect<ShapeError>("backward returns (6) for a (5) input",
                                    {"custom op 'hostile_bwd_longer'", "gradient of shape (6) for input 0 of shape (5)"},
                                    [] {
                                        backward_through(op("hostile_bwd_longer", same_shape, copy_forward,
                                                            longer_gradient));
                                    }),
    });

}  // namespace
