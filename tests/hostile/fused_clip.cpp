// Hostile inputs to Optimizer::clip_grad_norm_and_step (clip_grad_norm fused into the optimizer's step): the
// arguments clip_grad_norm refuses, and gradients it cannot clip; each is refused before anything changes.
#include <cmath>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::kInf;
using dgtest::kNaN;

namespace {

std::vector<Parameter> parameters_with_grads() {
    Generator gen(77);
    std::vector<Parameter> params{Parameter(Tensor::normal({3, 2}, 0, 1, gen), "w"),
                                  Parameter(Tensor::normal({2}, 0, 1, gen), "b")};
    ComputeGraph graph;
    Var w = graph.parameter(params[0]), b = graph.parameter(params[1]);
    graph.backward(sum(w * w) + sum(b * b * b));
    return params;
}

// `clip_grad_norm_and_step(max_norm, norm_type, eps)` on a fresh SGD and AdamW over parameters with gradients.
template <typename Opt>
void fused(double max_norm, double norm_type = 2.0, double eps = 1e-6) {
    const std::vector<Parameter> params = parameters_with_grads();
    Opt opt(params);
    opt.clip_grad_norm_and_step(max_norm, norm_type, eps);
}

// A parameter whose gradient no longer matches it (its value was replaced after the backward).
template <typename Opt>
void mismatched_gradient(Shape shape, DType dtype) {
    std::vector<Parameter> params = parameters_with_grads();
    Generator gen(78);
    params[1].value() = Tensor::normal(shape, 0, 1, gen, dtype);
    Opt opt(params);
    opt.clip_grad_norm_and_step(1.0);
}

template <typename Opt>
std::vector<hostile::Case> cases(const char* name) {
    const std::string who = name;
    return {
        hostile::expect<ValueError>(who + ": max_norm -1", {"clip_grad_norm_and_step", "max_norm", "-1"},
                                    [] { fused<Opt>(-1); }),
        hostile::expect<ValueError>(who + ": max_norm -inf", {"clip_grad_norm_and_step", "max_norm", "inf"},
                                    [] { fused<Opt>(-kInf); }),
        hostile::expect<ValueError>(who + ": max_norm NaN", {"clip_grad_norm_and_step", "max_norm", "nan"},
                                    [] { fused<Opt>(kNaN); }),
        hostile::expect<ValueError>(who + ": max_norm -1e-300", {"clip_grad_norm_and_step", "max_norm"},
                                    [] { fused<Opt>(-1e-300); }),
        hostile::expect<ValueError>(who + ": norm_type 0", {"clip_grad_norm_and_step", "norm_type", "0"},
                                    [] { fused<Opt>(1, 0); }),
        hostile::expect<ValueError>(who + ": norm_type -2", {"clip_grad_norm_and_step", "norm_type", "-2"},
                                    [] { fused<Opt>(1, -2); }),
        hostile::expect<ValueError>(who + ": norm_type -inf", {"clip_grad_norm_and_step", "norm_type", "inf"},
                                    [] { fused<Opt>(1, -kInf); }),
        hostile::expect<ValueError>(who + ": norm_type NaN", {"clip_grad_norm_and_step", "norm_type", "nan"},
                                    [] { fused<Opt>(1, kNaN); }),
        hostile::expect<ValueError>(who + ": eps -1", {"clip_grad_norm_and_step", "eps", "-1"},
                                    [] { fused<Opt>(1, 2, -1); }),
        hostile::expect<ValueError>(who + ": eps inf", {"clip_grad_norm_and_step", "eps", "inf"},
                                    [] { fused<Opt>(1, 2, kInf); }),
        hostile::expect<ValueError>(who + ": eps NaN", {"clip_grad_norm_and_step", "eps", "nan"},
                                    [] { fused<Opt>(1, 2, kNaN); }),
        hostile::expect<ValueError>(who + ": a gradient of another shape", {"clip_grad_norm_and_step", "'b'", "zero_grad"},
                                    [] { mismatched_gradient<Opt>({3}, DType::f32); }),
        hostile::expect<ValueError>(who + ": a gradient of another dtype", {"clip_grad_norm_and_step", "'b'", "float64"},
                                    [] { mismatched_gradient<Opt>({2}, DType::f64); }),
    };
}

const bool added = [] {
    hostile::add("fused clipping", cases<SGD>("SGD"));
    hostile::add("fused clipping", cases<AdamW>("AdamW"));
    return hostile::add("fused clipping", cases<Adam>("Adam"));
}();

}  // namespace
