#include <cmath>
#include <iostream>
#include <span>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

// softsign(x) = x / (1 + |x|), elementwise; dsoftsign/dx = 1 / (1 + |x|)².

// The shape rule: checks the inputs and gives the output's shape and dtype (errors get the op's name
// and the inputs' shapes, dtypes and devices added by the engine).
OutputSpec softsign_infer(OpType, std::span<const Tensor> in, const OpAttrs&) {
    if (!is_floating(in[0].dtype()))
        throw DTypeError(str("needs float32 or float64, got ", dtype_name(in[0].dtype())));
    return {in[0].shape(), in[0].dtype()};
}

// Kernels return fresh tensors; the engine accumulates gradients and handles broadcasting.
Tensor softsign_forward(const ForwardArgs& args) {
    return dispatch_floating(args.out.dtype, "softsign", [&]<typename T>() {
        Tensor y = Tensor::empty(args.out.shape, args.out.dtype);
        const T* x = args.inputs[0].data<T>();
        T* out = y.data<T>();
        for (std::int64_t i = 0; i < y.numel(); ++i) out[i] = x[i] / (T(1) + std::abs(x[i]));
        return y;
    });
}

std::vector<Tensor> softsign_backward(const BackwardArgs& args) {
    if (!args.needs_grad[0]) return {Tensor()};  // one entry per input; undefined where none is needed
    return dispatch_floating(args.grad_output.dtype(), "softsign", [&]<typename T>() {
        Tensor dx = Tensor::empty(args.inputs[0].shape(), args.inputs[0].dtype());
        const T* x = args.inputs[0].data<T>();
        const T* dy = args.grad_output.data<T>();
        T* out = dx.data<T>();
        for (std::int64_t i = 0; i < dx.numel(); ++i) {
            const T denominator = T(1) + std::abs(x[i]);
            out[i] = dy[i] / (denominator * denominator);
        }
        return std::vector<Tensor>{dx};
    });
}

// Cases for the gradient checks: shapes, attributes and input domains (away from the kink of |x| at 0).
std::vector<OpCase> softsign_cases() { return {{"matrix", {{3, 4}}, {}, {InputDomain::AwayFromZero}}}; }

int main() {
    static const CustomOp softsign = CustomOp::define({.name = "softsign",
                                                       .arity = 1,
                                                       .infer = softsign_infer,
                                                       .cpu = {softsign_forward, softsign_backward},
                                                       .cases = softsign_cases});  // .cuda: see below

    // The same checks as the built-in ops: float64 finite differences, float32 against float64.
    Generator gen(12);
    bool ok = true;
    const OpDef& def = softsign.def();
    for (const OpCase& c : def.cases()) {
        for (const CheckResult& r : {finite_difference_check(def, c, gen), float32_check(def, c, gen)}) {
            std::cout << r.check << " " << r.case_label << ": max relative error " << r.max_rel_err << "\n";
            ok = ok && r.pass;
        }
    }

    // Recorded like any op: backward, replay verification, error messages.
    ComputeGraph graph;
    Var x = graph.input(Tensor::normal({2, 5}, 0.0, 2.0, gen), "x", true);
    Var loss = sum(softsign({x}));
    const VerifyReport report = verify(graph, loss);  // runs the backward, replays it in float64
    std::cout << "verify: " << report.summary() << "\n";
    return ok && report.pass ? 0 : 1;
}
