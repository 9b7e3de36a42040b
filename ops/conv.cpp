// 2-D convolution: the user functions, the shape rule and the CPU kernels. The CPU path lowers each
// (image, group) pair to one GEMM over an im2col matrix; backward runs the same lowering in reverse
// (col2im). GPU: ops/conv.cu (cuDNN).
//
// A fused activation (OpAttrs::activation, Relu) is applied to conv(x, w) + b in place (NaN propagates, as
// in the relu op); backward first masks dy where y <= 0 (exactly where the pre-activation is) and runs the
// plain convolution backward on that masked gradient dz.
//
// Shapes: x (N,C,H,W)  w (K,Cg,R,S)  b (K)  y (N,K,P,Q) with Cg = C/groups, Kg = K/groups;
// an im2col matrix col (Cg·R·S, P·Q) holds, for output pixel (p,q), the input pixels its window covers:
// col[(c·R + r)·S + s][p·Q + q] = x[c][p·sh - ph + r·dh][q·sw - pw + s·dw] (0 in the padding).
#include "dyngrad/ops/conv.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string_view>
#include <vector>

#include "dyngrad/core/checked.h"
#include "dyngrad/core/environment.h"
#include "dyngrad/ops/cpu_parallel.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/linalg.h"

namespace dyngrad {

// (the user functions are front doors in ops/conv.h)

namespace {

// Everything the kernels need, read once from the inputs and attributes.
struct ConvDims {
    std::int64_t n, c, h, w;              // x (N,C,H,W)
    std::int64_t k, r, s;                 // weight (K,Cg,R,S)
    std::int64_t p, q;                    // y (N,K,P,Q)
    std::int64_t groups, cg, kg;          // Cg = C/groups, Kg = K/groups
    std::int64_t sh, sw, ph, pw, dh, dw;  // stride, padding, dilation (height, width)
};

ConvDims conv_dims(const Tensor& x, const Tensor& weight, const OpAttrs& attrs, const Shape& y_shape) {
    const Shape& xs = x.shape();
    const Shape& ws = weight.shape();
    return {.n = xs[0], .c = xs[1], .h = xs[2], .w = xs[3],
            .k = ws[0], .r = ws[2], .s = ws[3],
            .p = y_shape[2], .q = y_shape[3],
            .groups = attrs.groups, .cg = ws[1], .kg = ws[0] / attrs.groups,
            .sh = attrs.stride[0], .sw = attrs.stride[1],
            .ph = attrs.padding[0], .pw = attrs.padding[1],
            .dh = attrs.dilation[0], .dw = attrs.dilation[1]};
}

}  // namespace

// ---- Differentiable backward (graph/higher_order.h): conv2d as a composition ----

// x (N,C,H,W), w (K,C/G,R,S)[, b (K)] -> y (N,K,P,Q): the windows of x (zeros in the padding) as columns
// (G, N·P·Q, C/G·R·S), one batched matmul with w as (G, C/G·R·S, K/G), then the bias and the fused ReLU.
Var conv2d_composition(std::span<const Var> in, const OpAttrs& a) {
    const Var& x = in[0];
    const Var& w = in[1];
    const std::int64_t n = x.shape()[0], c = x.shape()[1];
    const std::int64_t k = w.shape()[0], cg = w.shape()[1], r = w.shape()[2], s = w.shape()[3];
    const std::int64_t groups = a.groups;
    std::vector<double> inside;
    Var cols = sliding_windows(x, {r, s}, a.stride, a.padding, a.dilation, inside);  // (N,C,P,Q,R·S)
    const std::int64_t p = cols.shape()[2], q = cols.shape()[3];
    cols = mul(cols, x.graph().constant(Tensor::from_vector(inside, {p, q, r * s}, x.dtype(), x.device())));
    cols = permute(reshape(permute(cols, {0, 2, 3, 1, 4}), {n * p * q, groups, (c / groups) * r * s}), {1, 0, 2});
    const Var weights = transpose(reshape(w, {groups, k / groups, cg * r * s}), -2, -1);  // (G, C/G·R·S, K/G)
    Var y = permute(reshape(permute(matmul(cols, weights), {1, 0, 2}), {n, p, q, k}), {0, 3, 1, 2});
    if (in.size() >= 3 && in[2].defined()) y = y + reshape(in[2], {1, k, 1, 1});
    return a.activation == Activation::Relu ? relu(y) : y;
}

namespace infer {

OutputSpec conv2d(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    const Tensor& weight = inputs[1];
    require_float(x, "x");
    for (std::size_t i = 1; i < inputs.size(); ++i) require_same_dtype(x, "x", inputs[i], i == 1 ? "weight" : "bias");
    if (x.rank() != 4 || weight.rank() != 4)
        throw ShapeError(str("expects x (N,C,H,W) and weight (K,C/groups,R,S), got ", to_string(x.shape()), " and ",
                             to_string(weight.shape())));
    const auto pair = [](const std::array<std::int64_t, 2>& v) { return str("(", v[0], ",", v[1], ")"); };
    if (attrs.stride[0] <= 0 || attrs.stride[1] <= 0)
        throw ValueError(str("stride ", pair(attrs.stride), " must be positive"));
    if (attrs.dilation[0] <= 0 || attrs.dilation[1] <= 0)
        throw ValueError(str("dilation ", pair(attrs.dilation), " must be positive"));
    if (attrs.padding[0] < 0 || attrs.padding[1] < 0)
        throw ValueError(str("padding ", pair(attrs.padding), " must not be negative"));
    if (attrs.activation != Activation::None && attrs.activation != Activation::Relu)
        throw ValueError(str("unknown activation ", static_cast<int>(attrs.activation)));
    const std::int64_t groups = attrs.groups;
    if (groups <= 0) throw ValueError(str("groups must be positive, got ", groups));
    const Shape& xs = x.shape();
    const Shape& ws = weight.shape();
    if (xs[1] == 0 || ws[0] == 0 || ws[2] == 0 || ws[3] == 0)
        throw ShapeError(str("needs at least one channel and a non-empty window, got x ", to_string(xs), " and weight ",
                             to_string(ws)));
    const std::int64_t expected_channels = checked_mul(ws[1], groups, "weight channels · groups");
    if (xs[1] != expected_channels)
        throw ShapeError(
            str("input has ", xs[1], " channels, weight expects ", expected_channels, " (groups ", groups, ")"));
    if (ws[0] % groups != 0)
        throw ShapeError(str(ws[0], " output channels do not split into ", groups, " groups"));
    if (inputs.size() == 3 && (inputs[2].rank() != 1 || inputs[2].shape()[0] != ws[0]))
        throw ShapeError(str("bias ", to_string(inputs[2].shape()), " for ", ws[0], " output channels"));
    Shape y{xs[0], ws[0], 0, 0};
    for (int i = 0; i < 2; ++i)
        y[2 + i] = sliding_window_output(xs[2 + i], ws[2 + i], attrs.stride[i], attrs.padding[i], attrs.dilation[i],
                                         i == 0 ? "height" : "width");
    // An empty batch holds nothing, yet K·P·Q can exceed int64 with a huge padding; the kernels multiply it.
    checked_numel(y, "output");
    // The CPU kernels' im2col buffer (Cg·R·S, P·Q) combines the weight's dims with the output's.
    checked_numel({ws[1], ws[2], ws[3], y[2], y[3]}, "im2col buffer");
    return {y, x.dtype()};
}

}  // namespace infer

namespace cpu {

namespace {

// Output positions o in [0, out) whose input index o·stride + offset lies in [0, size), as [lo, hi).
// Outside it the window reads padding.
struct Span {
    std::int64_t lo, hi;
};
// ceil(a / b) for a >= 0, b > 0, without the a + b - 1 that overflows for a stride near INT64_MAX.
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }
Span valid_outputs(std::int64_t offset, std::int64_t stride, std::int64_t size, std::int64_t out) {
    // offset >= -padding and size + padding fits int64 (the shape rule checked it), so size - offset fits.
    const std::int64_t lo = offset >= 0 ? 0 : ceil_div(-offset, stride);
    const std::int64_t hi = size - offset <= 0 ? 0 : ceil_div(size - offset, stride);
    return {std::min(lo, out), std::clamp(hi, std::min(lo, out), out)};
}

// x: one group of one image (Cg,H,W) -> col (Cg·R·S, P·Q), written with '='
template <typename T>
void im2col(const T* x, const ConvDims& d, T* col) {
    for (std::int64_t c = 0; c < d.cg; ++c)
        for (std::int64_t r = 0; r < d.r; ++r)
            for (std::int64_t s = 0; s < d.s; ++s) {
                T* row = col + ((c * d.r + r) * d.s + s) * d.p * d.q;
                const std::int64_t h_offset = r * d.dh - d.ph;
                const std::int64_t w_offset = s * d.dw - d.pw;
                const Span ps = valid_outputs(h_offset, d.sh, d.h, d.p);
                const Span qs = valid_outputs(w_offset, d.sw, d.w, d.q);
                std::fill(row, row + ps.lo * d.q, T(0));
                for (std::int64_t p = ps.lo; p < ps.hi; ++p) {
                    const T* x_row = x + (c * d.h + p * d.sh + h_offset) * d.w + w_offset;
                    T* out = row + p * d.q;
                    std::fill(out, out + qs.lo, T(0));
                    for (std::int64_t q = qs.lo; q < qs.hi; ++q) out[q] = x_row[q * d.sw];
                    std::fill(out + qs.hi, out + d.q, T(0));
                }
                std::fill(row + ps.hi * d.q, row + d.p * d.q, T(0));
            }
}

// col (Cg·R·S, P·Q) -> dx: one group of one image (Cg,H,W), accumulated with '+=' (windows overlap)
template <typename T>
void col2im_add(const T* col, const ConvDims& d, T* dx) {
    for (std::int64_t c = 0; c < d.cg; ++c)
        for (std::int64_t r = 0; r < d.r; ++r)
            for (std::int64_t s = 0; s < d.s; ++s) {
                const T* row = col + ((c * d.r + r) * d.s + s) * d.p * d.q;
                const std::int64_t h_offset = r * d.dh - d.ph;
                const std::int64_t w_offset = s * d.dw - d.pw;
                const Span ps = valid_outputs(h_offset, d.sh, d.h, d.p);
                const Span qs = valid_outputs(w_offset, d.sw, d.w, d.q);
                for (std::int64_t p = ps.lo; p < ps.hi; ++p) {
                    T* dx_row = dx + (c * d.h + p * d.sh + h_offset) * d.w + w_offset;
                    const T* in = row + p * d.q;
                    for (std::int64_t q = qs.lo; q < qs.hi; ++q) dx_row[q * d.sw] += in[q];
                }
            }
}

// One group of one image's col (Cg·R·S, P·Q), from the tensor allocator (a request that cannot be met is
// OutOfMemory); none for an empty batch, whose P·Q may be huge.
Tensor im2col_buffer(const ConvDims& d, DType dtype) {
    return Tensor::empty({d.n == 0 ? 0 : d.cg * d.r * d.s * d.p * d.q}, dtype);
}

}  // namespace

// x (N,C,H,W)  w (K,Cg,R,S)  b (K)  y (N,K,P,Q): y[n, group g] = act(w_g (Kg, Cg·R·S) · col(x[n, g]) + b_g)
Tensor conv2d_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& w = args.inputs[1];
    const bool has_bias = args.inputs.size() == 3;
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    const ConvDims d = conv_dims(x, w, args.attrs, y.shape());
    const std::int64_t pq = d.p * d.q;
    const std::int64_t rows = d.cg * d.r * d.s;
    // Images are independent: fixed chunks of them run in parallel, each with its own column buffer.
    const std::int64_t chunks = chunk_count(d.n, d.k * pq * rows);
    dispatch_floating(x.dtype(), "conv2d", [&]<typename T>() {
        parallel_chunks(chunks, [&](std::int64_t chunk) {
            const ChunkRange images = chunk_range(d.n, chunks, chunk);
            const Tensor col_buffer = im2col_buffer(d, x.dtype());
            T* col = col_buffer.data<T>();
            for (std::int64_t n = images.begin; n < images.end; ++n)
                for (std::int64_t g = 0; g < d.groups; ++g) {
                    im2col(x.data<T>() + (n * d.c + g * d.cg) * d.h * d.w, d, col);
                    const ConstMatrixMap<T> W(w.data<T>() + g * d.kg * rows, d.kg, rows);
                    const ConstMatrixMap<T> Col(col, rows, pq);
                    MatrixMap<T> Y(y.data<T>() + (n * d.k + g * d.kg) * pq, d.kg, pq);
                    parallel_gemm(Y, W, Col);
                    if (has_bias)
                        Y.colwise() += Eigen::Map<const ColumnVector<T>>(args.inputs[2].data<T>() + g * d.kg, d.kg);
                    if (args.attrs.activation == Activation::Relu)
                        Y = Y.unaryExpr([](T v) { return math::ReluOp::forward(v, T(0)); });
                }
        });
    });
    return y;
}

namespace {

// dy, y (N,K,P,Q) -> the gradient of the convolution's own output: ReluOp::masked_gradient(y, dy) under a
// fused Relu, dy itself without activation.
Tensor activation_backward(const BackwardArgs& args) {
    const Tensor& dy = args.grad_output;
    if (args.attrs.activation == Activation::None) return dy;
    Tensor dz = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    dispatch_floating(dy.dtype(), "conv2d backward", [&]<typename T>() {
        const std::int64_t n = dy.numel();
        MatrixMap<T>(dz.data<T>(), 1, n) = ConstMatrixMap<T>(args.output.data<T>(), 1, n).binaryExpr(
            ConstMatrixMap<T>(dy.data<T>(), 1, n), [](T yv, T g) { return math::ReluOp::masked_gradient(yv, g); });
    });
    return dz;
}

}  // namespace

// dy (N,K,P,Q) -> dz = activation_backward(dy) (N,K,P,Q), then dx = col2im(w_gᵀ · dz[n, g]) (N,C,H,W),
// dw_g = Σ_n dz[n, g] · col(x[n, g])ᵀ (K,Cg,R,S), db = Σ of dz over N, P, Q (K)
std::vector<Tensor> conv2d_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& w = args.inputs[1];
    const Tensor dz = activation_backward(args);
    std::vector<Tensor> grads(args.inputs.size());
    const ConvDims d = conv_dims(x, w, args.attrs, dz.shape());
    const std::int64_t pq = d.p * d.q;
    const std::int64_t rows = d.cg * d.r * d.s;
    // Fixed chunks of images in parallel, each with its own column buffer: dx per image (independent), and
    // dw as one partial sum per chunk (its images in order), the partials then added in chunk order.
    const std::int64_t chunks = chunk_count(d.n, d.k * pq * rows * 2);
    dispatch_floating(x.dtype(), "conv2d backward", [&]<typename T>() {
        if (args.needs_grad[0]) grads[0] = Tensor::zeros(x.shape(), x.dtype(), x.device());
        if (args.needs_grad[1]) grads[1] = Tensor::zeros(w.shape(), w.dtype(), w.device());
        std::vector<Tensor> dw_partials(grads[1].defined() ? static_cast<std::size_t>(std::max<std::int64_t>(chunks, 1)) : 0);
        parallel_chunks(chunks, [&](std::int64_t chunk) {
            const ChunkRange images = chunk_range(d.n, chunks, chunk);
            const Tensor col_buffer = im2col_buffer(d, x.dtype());
            T* col = col_buffer.data<T>();
            Tensor dw_partial;
            if (grads[1].defined())
                dw_partial = chunk == 0 ? grads[1] : Tensor::zeros(w.shape(), w.dtype(), w.device());
            for (std::int64_t n = images.begin; n < images.end; ++n)
                for (std::int64_t g = 0; g < d.groups; ++g) {
                    const ConstMatrixMap<T> dZ(dz.data<T>() + (n * d.k + g * d.kg) * pq, d.kg, pq);
                    MatrixMap<T> Col(col, rows, pq);
                    if (grads[0].defined()) {
                        const ConstMatrixMap<T> W(w.data<T>() + g * d.kg * rows, d.kg, rows);
                        parallel_gemm(Col, W.transpose(), dZ);
                        col2im_add(col, d, grads[0].data<T>() + (n * d.c + g * d.cg) * d.h * d.w);
                    }
                    if (dw_partial.defined()) {
                        im2col(x.data<T>() + (n * d.c + g * d.cg) * d.h * d.w, d, col);
                        MatrixMap<T> dW(dw_partial.data<T>() + g * d.kg * rows, d.kg, rows);
                        parallel_gemm(dW, dZ, Col.transpose(), /*accumulate=*/true);
                    }
                }
            if (dw_partial.defined()) dw_partials[static_cast<std::size_t>(chunk)] = dw_partial;
        });
        for (std::size_t c = 1; c < dw_partials.size(); ++c) {
            MatrixMap<T> dW(grads[1].data<T>(), 1, w.numel());
            dW += ConstMatrixMap<T>(dw_partials[c].data<T>(), 1, w.numel());
        }
        if (args.inputs.size() == 3 && args.needs_grad[2]) {
            const Tensor& b = args.inputs[2];
            grads[2] = Tensor::empty(b.shape(), b.dtype(), b.device());
            // dz viewed as (N·K, P·Q): per-(image, channel) sums, then summed over images.
            const ColumnVector<T> plane_sums = ConstMatrixMap<T>(dz.data<T>(), d.n * d.k, pq).rowwise().sum();
            Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(grads[2].data<T>(), d.k) =
                ConstMatrixMap<T>(plane_sums.data(), d.n, d.k).colwise().sum();
        }
    });
    return grads;
}

}  // namespace cpu

}  // namespace dyngrad

// ---- the GPU's algorithm-search log (ops/conv.h; filled by ops/conv.cu) and its graph-API switch ----
namespace dyngrad {
namespace {
ConvGraphMode initial_conv_graph_mode() {
    const std::string_view mode = environment("DYNGRAD_CONV_GRAPH");
    return mode == "0" ? ConvGraphMode::Off : mode == "force" ? ConvGraphMode::Force : ConvGraphMode::Auto;
}

// Read when a GPU plan is built, set from any thread: atomic.
std::atomic<ConvGraphMode>& graph_mode() {
    static std::atomic<ConvGraphMode> mode{initial_conv_graph_mode()};
    return mode;
}

std::mutex& conv_search_mutex() {
    static std::mutex m;
    return m;
}
std::vector<ConvSearchEntry>& conv_search_entries() {
    static std::vector<ConvSearchEntry> entries;
    return entries;
}
}  // namespace

void set_conv_graph_mode(ConvGraphMode mode) { graph_mode().store(mode); }
ConvGraphMode conv_graph_mode() { return graph_mode().load(); }

std::vector<ConvSearchEntry> conv_search_log() {
    const std::lock_guard lock(conv_search_mutex());
    return conv_search_entries();
}

void clear_conv_search_log() {
    const std::lock_guard lock(conv_search_mutex());
    conv_search_entries().clear();
}

void detail::log_conv_search(std::vector<ConvSearchEntry> entries) {
    const std::lock_guard lock(conv_search_mutex());
    auto& log = conv_search_entries();
    log.insert(log.end(), std::make_move_iterator(entries.begin()), std::make_move_iterator(entries.end()));
}
}  // namespace dyngrad
