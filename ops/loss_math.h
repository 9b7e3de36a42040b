// Per-element formulas of the pointwise losses (l1_loss, smooth_l1_loss, binary_cross_entropy_with_logits),
// shared by the CPU kernels (ops/loss.cpp) and the CUDA kernels (ops/loss.cu), as elementwise_math.h is for
// the elementwise ops: the float64 finite differences prove the formulas, the GPU comparison the launch code.
//
//   a: prediction (l1, smooth_l1) or logits (bce)   b: target   (same shape, n elements)
//   w, pw: bce's weight and pos_weight (nullptr: none), broadcast over leading axes: element i reads
//          w[i % w_count] (a weight's shape is a suffix of the input's, checked by the shape rule)
#pragma once
#include <cstdint>

#include <span>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/ops/elementwise_math.h"

namespace dyngrad::math {

template <typename T> struct PointLossInputs {
    const T* a = nullptr;
    const T* b = nullptr;
    const T* w = nullptr;
    std::int64_t w_count = 1;
    const T* pw = nullptr;
    std::int64_t pw_count = 1;
    T beta = T(1);  // smooth_l1
};

// The factor of row (or element) i's loss in the reduced loss, times dy: dy[i] (None), dy (Sum), dy / D (Mean).
template <typename T>
DG_HOST_DEVICE T reduction_scale(Reduction reduction, const T* dy, double denominator, std::int64_t i) {
    if (reduction == Reduction::None) return dy[i];
    if (reduction == Reduction::Sum) return *dy;
    return static_cast<T>(static_cast<double>(*dy) / denominator);
}

// sign(d), 0 at 0; a NaN stays NaN (torch.sign).
template <typename T> DG_HOST_DEVICE T sign_of(T d) { return d > T(0) ? T(1) : (d < T(0) ? T(-1) : d * T(0)); }

// Loss of element i.
//   l1:        |d|, d = a - b
//   smooth_l1: 0.5 d²/beta where |d| < beta, else |d| - 0.5 beta (PyTorch's; beta = 0 is l1)
//   bce:       w · [(1 - b)·a + (1 + (pw - 1)·b) · softplus(-a)]  (PyTorch's stable form; softplus(-a) = -log σ(a))
template <typename T> DG_HOST_DEVICE T point_loss(OpType op, const PointLossInputs<T>& in, std::int64_t i) {
    const T a = in.a[i];
    const T b = in.b[i];
    if (op == OpType::BceWithLogits) {
        const T w = in.w ? in.w[i % in.w_count] : T(1);
        const T log_weight = in.pw ? T(1) + (in.pw[i % in.pw_count] - T(1)) * b : T(1);
        return w * ((T(1) - b) * a + log_weight * SoftplusOp::forward(-a, T(0)));
    }
    const T d = a - b;
    const T abs_d = d < T(0) ? -d : d;
    if (op == OpType::SmoothL1Loss && abs_d < in.beta) return T(0.5) * d * d / in.beta;
    if (op == OpType::SmoothL1Loss) return abs_d - T(0.5) * in.beta;
    return abs_d;
}

// d loss_i / d a_i and d loss_i / d b_i.
//   l1:        sign(d), -sign(d)  (0 at d = 0, as PyTorch)
//   smooth_l1: d/beta where |d| < beta, else sign(d); negated for b
//   bce:       w · [(1 - b) - (1 + (pw - 1)·b) · σ(-a)],   w · [(pw - 1)·softplus(-a) - a]
template <typename T>
DG_HOST_DEVICE void point_loss_grads(OpType op, const PointLossInputs<T>& in, std::int64_t i, T& da, T& db) {
    const T a = in.a[i];
    const T b = in.b[i];
    if (op == OpType::BceWithLogits) {
        const T w = in.w ? in.w[i % in.w_count] : T(1);
        const T pw = in.pw ? in.pw[i % in.pw_count] : T(1);
        const T log_weight = T(1) + (pw - T(1)) * b;
        da = w * ((T(1) - b) - log_weight * SigmoidOp::forward(-a, T(0)));
        db = w * ((pw - T(1)) * SoftplusOp::forward(-a, T(0)) - a);
        return;
    }
    const T d = a - b;
    const T abs_d = d < T(0) ? -d : d;
    da = op == OpType::SmoothL1Loss && abs_d < in.beta ? d / in.beta : sign_of(d);
    db = -da;
}

// The pointers of a pointwise loss's inputs (host code; on the GPU they are device pointers).
template <typename T> PointLossInputs<T> point_loss_inputs(std::span<const Tensor> inputs, const OpAttrs& attrs) {
    PointLossInputs<T> in;
    in.a = inputs[0].data<T>();
    in.b = inputs[1].data<T>();
    if (inputs.size() > 2) {
        in.w = inputs[2].data<T>();
        in.w_count = inputs[2].numel();
    }
    if (inputs.size() > 3) {
        in.pw = inputs[3].data<T>();
        in.pw_count = inputs[3].numel();
    }
    in.beta = static_cast<T>(attrs.scalar);
    return in;
}

// A pointwise loss's (mse_loss's too) gradients, allocated like input 0 for the inputs that need one: d input 0
// and d target.
// bce's weight and pos_weight get none (as in PyTorch): ValueError when one is asked for.
inline std::vector<Tensor> point_loss_gradients(const BackwardArgs& args) {
    const Tensor& a = args.inputs[0];
    std::vector<Tensor> grads(args.inputs.size());
    for (std::size_t i = 2; i < args.inputs.size(); ++i)
        if (args.needs_grad[i])
            throw ValueError(str(i == 2 ? "weight" : "pos_weight", " gets no gradient (as in PyTorch): pass it as ",
                                 "a constant or an input that does not require grad"));
    for (std::size_t i = 0; i < 2; ++i)
        if (args.needs_grad[i]) grads[i] = Tensor::empty(a.shape(), a.dtype(), a.device());
    return grads;
}

// cross_entropy / nll_loss forward: the loss, cross_entropy's log-sum-exp per row (N) and the sums [D, W] (f64),
// saved for the backward here (sums, then cross_entropy's lse); each backend fills them.
struct ClassLossForward {
    Tensor loss, lse, sums;
};

inline ClassLossForward class_loss_forward_outputs(const ForwardArgs& args) {
    const Tensor& logits = args.inputs[0];
    ClassLossForward f{Tensor::empty(args.out.shape, args.out.dtype, logits.device()),
                       Tensor::empty({logits.size(0)}, logits.dtype(), logits.device()),
                       Tensor::empty({2}, DType::f64, logits.device())};
    args.saved.push_back(f.sums);
    if (args.op != OpType::NllLoss) args.saved.push_back(f.lse);
    return f;
}

// linear_cross_entropy forward (ops/linear_cross_entropy.h), on both backends: the loss, the sums [D, C] (f64: the
// rows not ignored, the classes) and, where the forward computes the gradients (save_for_backward under Mean or
// Sum), dx and dW of the summed loss; saved in that order. `grads` says whether dx and dW are there to fill.
// The loss (args.out) is float32 for bf16/f16 inputs (infer::linear_cross_entropy), and so are dx and dW here.
struct LinearCrossEntropyForward {
    Tensor loss, sums, dx, dw;
    bool grads = false;
};

inline LinearCrossEntropyForward linear_cross_entropy_outputs(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& weight = args.inputs[1];
    LinearCrossEntropyForward f;
    f.loss = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    f.sums = Tensor::empty({2}, DType::f64, x.device());
    args.saved.push_back(f.sums);
    f.grads = args.attrs.save_for_backward && args.attrs.reduction != Reduction::None;
    if (f.grads) {
        // Float32 for bf16/f16 inputs (the GPU's native path): the f32 sums, rounded once when the backward scales.
        const DType unit_dtype = is_reduced_precision(x.dtype()) ? DType::f32 : x.dtype();
        f.dx = Tensor::empty(x.shape(), unit_dtype, x.device());
        f.dw = Tensor::empty(weight.shape(), unit_dtype, weight.device());
        args.saved.push_back(f.dx);
        args.saved.push_back(f.dw);
    }
    return f;
}

// linear_cross_entropy backward: dx and dW allocated where needed (labels get none), and whether the forward's
// gradients serve (Mean or Sum with them saved: the backend scales them by dy, or dy / D; otherwise it recomputes).
struct LinearCrossEntropyBackward {
    std::vector<Tensor> grads;
    bool from_saved = false;
    bool any() const { return grads[0].defined() || grads[1].defined(); }
};

inline LinearCrossEntropyBackward linear_cross_entropy_gradients(const BackwardArgs& args) {
    LinearCrossEntropyBackward b;
    b.grads.resize(args.inputs.size());
    b.from_saved = args.saved.size() == 3 && args.attrs.reduction != Reduction::None;
    for (std::size_t i = 0; i < 2; ++i) {
        const Tensor& like = args.inputs[i];
        if (args.needs_grad[i]) b.grads[i] = Tensor::empty(like.shape(), like.dtype(), like.device());
    }
    return b;
}

// cross_entropy / nll_loss backward: whether dlogits is wanted. The labels and class weights get no gradient
// (as in PyTorch): ValueError when the weights ask for one. The forward's saved sums (and cross_entropy's
// log-sum-exp) must be there.
inline bool class_loss_needs_dlogits(const BackwardArgs& args) {
    if (args.inputs.size() > 2 && args.needs_grad[2])
        throw ValueError("class_weight gets no gradient (as in PyTorch): pass it as a constant or an input "
                         "that does not require grad");
    if (!args.needs_grad[0]) return false;
    if (args.saved.size() != (args.op == OpType::NllLoss ? 1u : 2u))
        throw Error("internal: cross_entropy backward needs the forward's sums and log-sum-exp");
    return true;
}

}  // namespace dyngrad::math
