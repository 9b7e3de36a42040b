// Normalisation geometry shared by the Eigen kernels (ops/norm.cpp) and the CUDA launchers and kernels
// (ops/norm.cu): batch_norm's channel layout and its backward's plan, layer_norm/rms_norm's rows.
#pragma once
#include <cstdint>
#include <optional>

#include "dyngrad/core/error.h"
#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/ops/host_device.h"

namespace dyngrad {

// batch_norm sees x as (N, C, HW): HW = H·W for (N,C,H,W), 1 for (N,C). Sample n is a (C, HW) row-major
// block; each channel's statistics run over M = N·HW values. Kernels receive it by value.
struct ChannelLayout {
    std::int64_t n = 0, c = 0, hw = 1;
    DG_HOST_DEVICE std::int64_t per_channel() const { return n * hw; }
};

inline ChannelLayout channel_layout(const Shape& shape) {
    ChannelLayout l;
    l.n = shape[0];
    l.c = shape[1];
    for (std::size_t i = 2; i < shape.size(); ++i) l.hw *= shape[i];
    return l;
}

// batch_norm's forward: y like x, and mean and invstd = 1/sqrt(var + eps) (C) as used (the batch's in training,
// the running ones in eval), saved for the backward here; each backend fills the three.
struct BatchNormForward {
    ChannelLayout layout;
    Tensor y, mean, invstd;
};

inline BatchNormForward batch_norm_forward_outputs(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const ChannelLayout l = channel_layout(x.shape());
    BatchNormForward f{l, Tensor::empty(args.out.shape, args.out.dtype, x.device()),
                       Tensor::empty({l.c}, x.dtype(), x.device()), Tensor::empty({l.c}, x.dtype(), x.device())};
    args.saved.push_back(f.mean);
    args.saved.push_back(f.invstd);
    return f;
}

// batch_norm's backward: dy like x  ->  with x̂ = (x − mean)·invstd, per channel over N,H,W (M values):
//   dgamma = Σ dy·x̂,  dbeta = Σ dy
//   training: dx = gamma·invstd·(dy − Σdy/M − x̂·Σ(dy·x̂)/M)   (through the batch statistics)
//   eval:     dx = gamma·invstd·dy
// The running statistics get no gradient. What both backends read from the node, read and checked once.
struct BatchNormBackward {
    const Tensor& x;
    const Tensor& dy;
    const Tensor& mean;    // the forward's (the batch's in training, the running ones in eval)
    const Tensor& invstd;  // 1/sqrt(var + eps), likewise
    ChannelLayout layout;
    bool training = false;
    bool need_dx = false, need_dgamma = false, need_dbeta = false;
    // Σdy and Σdy·x̂ per channel: dbeta and dgamma themselves, and the training dx's terms.
    bool need_sums() const { return need_dgamma || need_dbeta || (training && need_dx); }
};

// nullopt when no input needs a gradient.
inline std::optional<BatchNormBackward> batch_norm_backward_plan(const BackwardArgs& args) {
    const bool need_dx = args.needs_grad[0], need_dgamma = args.needs_grad[1], need_dbeta = args.needs_grad[2];
    if (!need_dx && !need_dgamma && !need_dbeta) return std::nullopt;
    if (args.saved.size() != 2) throw Error("internal: batch_norm backward needs the forward's mean and invstd");
    const Tensor& x = args.inputs[0];
    return BatchNormBackward{x,        args.grad_output, args.saved[0], args.saved[1], channel_layout(x.shape()),
                             args.attrs.training, need_dx, need_dgamma, need_dbeta};
}

// layer_norm / rms_norm see x as `rows` rows of the n = numel(normalized_shape) values they normalise.
struct RowNormLayout {
    std::int64_t rows = 0, n = 0;
};

inline RowNormLayout row_norm_layout(const Shape& x, const Shape& normalized_shape) {
    RowNormLayout l;
    l.n = numel(normalized_shape);
    l.rows = numel(Shape(x.begin(), x.end() - static_cast<std::ptrdiff_t>(normalized_shape.size())));
    return l;
}

// layer_norm / rms_norm's backward: dy (rows, n) -> with x̂ = (x − mean)·rstd (mean 0 for rms_norm) and
// g = dy·w (dy without a weight), per row:
//   dx = rstd·(g − Σg/n − x̂·Σ(g·x̂)/n)    (rms_norm: no Σg/n term)
//   dw = Σ_rows dy·x̂,  db = Σ_rows dy
// What both backends read from the node, read and checked once.
struct RowNormBackward {
    const Tensor& x;
    const Tensor& dy;
    bool center = false;  // layer_norm (a saved mean) or rms_norm
    RowNormLayout layout;
    bool need_dx = false, need_dw = false, need_db = false;
};

inline RowNormBackward row_norm_backward_plan(const BackwardArgs& args) {
    const bool center = args.op == OpType::LayerNorm;
    if (args.saved.size() != (center ? 2u : 1u))
        throw Error("internal: layer_norm/rms_norm backward needs the forward's saved statistics");
    const Tensor& x = args.inputs[0];
    return RowNormBackward{x,
                           args.grad_output,
                           center,
                           row_norm_layout(x.shape(), args.attrs.shape),
                           args.needs_grad[0],
                           args.inputs.size() > 1 && args.needs_grad[1],
                           args.inputs.size() > 2 && args.needs_grad[2]};
}

}  // namespace dyngrad
