// 2-D pooling (OpType::MaxPool2d, OpType::AvgPool2d): the user functions, the shared shape rule and the
// CPU kernels. GPU: ops/pool.cu (cuDNN).
//
// Shapes: x (N,C,H,W)  y (N,C,P,Q); output pixel (p,q) pools the window of rows [p·sh - ph, +kh) and
// columns [q·sw - pw, +kw). Windows never lie wholly in the padding (padding <= kernel/2, floor mode).
#include "dyngrad/ops/pool.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "dyngrad/core/checked.h"
#include "dyngrad/ops/argument_rules.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/indexing.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/reduce.h"

namespace dyngrad {

// ---- user functions: one front door per op (ops/pool.h), the stride rule in the row ----
// A stride of 0, or none given (Python), is the kernel size: non-overlapping windows, as PyTorch's default.
void pool_arguments(OpCall& call) {
    const bool given = call.gave(attr_field_index("stride"));
    for (int i = 0; i < 2; ++i)
        if (!given || call.attrs.stride[i] == 0) call.attrs.stride[i] = call.attrs.kernel[i];
}

namespace {
template <Operand T>
T pool(OpType op, const T& x, std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride,
       std::array<std::int64_t, 2> padding, std::source_location where) {
    OpAttrs attrs;
    attrs.kernel = kernel;
    attrs.stride = stride;
    attrs.padding = padding;
    return apply_op(op, {x}, attrs, where, AttrSet{}.with(attr_field_index("stride")));
}
}  // namespace

template <Operand T>
T max_pool2d(const T& x, std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride,
             std::array<std::int64_t, 2> padding, std::source_location where) {
    return pool(OpType::MaxPool2d, x, kernel, stride, padding, where);
}
template <Operand T>
T avg_pool2d(const T& x, std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride,
             std::array<std::int64_t, 2> padding, std::source_location where) {
    return pool(OpType::AvgPool2d, x, kernel, stride, padding, where);
}
using WindowPair = std::array<std::int64_t, 2>;
template Var max_pool2d(const Var&, WindowPair, WindowPair, WindowPair, std::source_location);
template Tensor max_pool2d(const Tensor&, WindowPair, WindowPair, WindowPair, std::source_location);
template Var avg_pool2d(const Var&, WindowPair, WindowPair, WindowPair, std::source_location);
template Tensor avg_pool2d(const Tensor&, WindowPair, WindowPair, WindowPair, std::source_location);

// ---- Differentiable backward (graph/higher_order.h): pooling as a composition ----

// x (N,C,H,W) -> the windows (N,C,P,Q,kh·kw) by one index_select over the flattened planes: window element (i,j) of
// output pixel (p,q) is input pixel (p·sh − ph + i·dh, q·sw − pw + j·dw). A padding slot reads the window's first
// pixel inside the input instead (for max a duplicate never changes the maximum, and a tie goes to the first slot,
// whose index is the same pixel); `inside` is 1 for the slots inside the input, 0 for padding (P,Q,kh·kw).
Var sliding_windows(const Var& x, std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride,
                    std::array<std::int64_t, 2> padding, std::array<std::int64_t, 2> dilation,
                    std::vector<double>& inside) {
    const Shape& s = x.shape();
    const std::int64_t n = s[0], c = s[1], h = s[2], w = s[3];
    const std::int64_t p = (h + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) / stride[0] + 1;
    const std::int64_t q = (w + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) / stride[1] + 1;
    const std::int64_t k = kernel[0] * kernel[1];
    std::vector<std::int64_t> index;
    inside.clear();
    for (std::int64_t op = 0; op < p; ++op)
        for (std::int64_t oq = 0; oq < q; ++oq) {
            const std::int64_t r0 = op * stride[0] - padding[0], c0 = oq * stride[1] - padding[1];
            std::int64_t first = -1;
            for (std::int64_t pass = 0; pass < 2; ++pass)  // the first pass finds the window's first pixel inside
                for (std::int64_t i = 0; i < kernel[0]; ++i)
                    for (std::int64_t j = 0; j < kernel[1]; ++j) {
                        const std::int64_t r = r0 + i * dilation[0], col = c0 + j * dilation[1];
                        const bool in = r >= 0 && r < h && col >= 0 && col < w;
                        if (pass == 0) {
                            if (in && first < 0) first = r * w + col;
                            continue;
                        }
                        index.push_back(in ? r * w + col : std::max<std::int64_t>(first, 0));
                        inside.push_back(in ? 1.0 : 0.0);
                    }
        }
    const Var planes = transpose(reshape(x, {n * c, h * w}), 0, 1);  // (H·W, N·C)
    const Var picked = index_select(planes, 0, x.graph().constant(Tensor::from_vector(index, {p * q * k}, x.device())));
    return reshape(transpose(picked, 0, 1), {n, c, p, q, k});
}

Var pool_composition(OpType op, std::span<const Var> in, const OpAttrs& attrs) {
    const Var& x = in[0];
    std::vector<double> inside;
    const Var windows = sliding_windows(x, attrs.kernel, attrs.stride, attrs.padding, {1, 1}, inside);
    if (op == OpType::MaxPool2d) return max(windows, 4);
    const Shape& ws = windows.shape();
    const Var mask = x.graph().constant(Tensor::from_vector(inside, {ws[2], ws[3], ws[4]}, x.dtype(), x.device()));
    return mul_scalar(sum(mul(windows, mask), {4}), 1.0 / static_cast<double>(ws[4]));
}

namespace infer {

OutputSpec pool2d(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_float(x, "x");
    if (x.rank() != 4) throw ShapeError(str("expects x (N,C,H,W), got ", to_string(x.shape())));
    const auto pair = [](const std::array<std::int64_t, 2>& v) { return str("(", v[0], ",", v[1], ")"); };
    if (attrs.kernel[0] <= 0 || attrs.kernel[1] <= 0)
        throw ValueError(str("kernel ", pair(attrs.kernel), " must be positive"));
    if (attrs.stride[0] <= 0 || attrs.stride[1] <= 0)
        throw ValueError(str("stride ", pair(attrs.stride), " must be positive"));
    for (int i = 0; i < 2; ++i)
        if (attrs.padding[i] < 0 || attrs.padding[i] > attrs.kernel[i] / 2)
            throw ValueError(str("padding ", pair(attrs.padding), " must lie in [0, kernel/2] for kernel ",
                                 pair(attrs.kernel)));
    Shape y = x.shape();
    for (int i = 0; i < 2; ++i) {
        const char* axis = i == 0 ? "height" : "width";
        y[2 + i] = sliding_window_output(x.shape()[2 + i], attrs.kernel[i], attrs.stride[i], attrs.padding[i], 1, axis);
        // An empty plane with padding would give windows of padding alone, with no element to pool.
        if (x.shape()[2 + i] == 0) throw ShapeError(str(axis, " is 0: no window would hold an input element"));
    }
    return {y, x.dtype()};
}

}  // namespace infer

namespace cpu {

namespace {

struct PoolDims {
    std::int64_t planes, h, w, p, q;  // planes = N·C
    std::int64_t kh, kw, sh, sw, ph, pw;
};

PoolDims pool_dims(const Shape& x, const Shape& y, const OpAttrs& a) {
    return {.planes = x[0] * x[1], .h = x[2], .w = x[3], .p = y[2], .q = y[3],
            .kh = a.kernel[0], .kw = a.kernel[1], .sh = a.stride[0], .sw = a.stride[1],
            .ph = a.padding[0], .pw = a.padding[1]};
}

// The part of output pixel (p,q)'s window that lies inside the input: rows [h0, h1), columns [w0, w1).
struct Window {
    std::int64_t h0, h1, w0, w1;
};
Window window(const PoolDims& d, std::int64_t p, std::int64_t q) {
    const std::int64_t h = p * d.sh - d.ph;
    const std::int64_t w = q * d.sw - d.pw;
    return {std::max<std::int64_t>(h, 0), std::min(h + d.kh, d.h), std::max<std::int64_t>(w, 0),
            std::min(w + d.kw, d.w)};
}

// Index within the (H,W) plane of the window's first maximal element in row-major order; a NaN counts
// as maximal, so it propagates to the output as in PyTorch. Padding is not part of the scan.
template <typename T>
std::int64_t window_argmax(const T* plane, std::int64_t width, const Window& win) {
    std::int64_t best = win.h0 * width + win.w0;
    for (std::int64_t h = win.h0; h < win.h1; ++h)
        for (std::int64_t w = win.w0; w < win.w1; ++w) {
            const T v = plane[h * width + w];
            if (v > plane[best] || (std::isnan(v) && !std::isnan(plane[best]))) best = h * width + w;
        }
    return best;
}

template <typename T>
void max_pool_forward(const T* x, const PoolDims& d, T* y) {
    for (std::int64_t i = 0; i < d.planes; ++i) {
        const T* plane = x + i * d.h * d.w;
        T* out = y + i * d.p * d.q;
        for (std::int64_t p = 0; p < d.p; ++p)
            for (std::int64_t q = 0; q < d.q; ++q) out[p * d.q + q] = plane[window_argmax(plane, d.w, window(d, p, q))];
    }
}

// dx written with '+=' (windows may overlap); the caller zeroes it.
template <typename T>
void max_pool_backward(const T* x, const T* dy, const PoolDims& d, T* dx) {
    for (std::int64_t i = 0; i < d.planes; ++i) {
        const T* plane = x + i * d.h * d.w;
        const T* grad = dy + i * d.p * d.q;
        T* dplane = dx + i * d.h * d.w;
        for (std::int64_t p = 0; p < d.p; ++p)
            for (std::int64_t q = 0; q < d.q; ++q)
                dplane[window_argmax(plane, d.w, window(d, p, q))] += grad[p * d.q + q];
    }
}

// 1 / (kh·kw), the product taken in floating point: a window larger than the input (all padding but one
// element) can have kh·kw beyond int64.
template <typename T>
T window_scale(const PoolDims& d) {
    return T(1) / (static_cast<T>(d.kh) * static_cast<T>(d.kw));
}

// Padding counts as zeros: every window divides by kh·kw.
template <typename T>
void avg_pool_forward(const T* x, const PoolDims& d, T* y) {
    const T scale = window_scale<T>(d);
    for (std::int64_t i = 0; i < d.planes; ++i) {
        const Eigen::Map<const MatrixRM<T>> plane(x + i * d.h * d.w, d.h, d.w);
        T* out = y + i * d.p * d.q;
        for (std::int64_t p = 0; p < d.p; ++p)
            for (std::int64_t q = 0; q < d.q; ++q) {
                const Window win = window(d, p, q);
                out[p * d.q + q] = plane.block(win.h0, win.w0, win.h1 - win.h0, win.w1 - win.w0).sum() * scale;
            }
    }
}

// dx written with '+=' (windows may overlap); the caller zeroes it.
template <typename T>
void avg_pool_backward(const T* dy, const PoolDims& d, T* dx) {
    const T scale = window_scale<T>(d);
    for (std::int64_t i = 0; i < d.planes; ++i) {
        Eigen::Map<MatrixRM<T>> dplane(dx + i * d.h * d.w, d.h, d.w);
        const T* grad = dy + i * d.p * d.q;
        for (std::int64_t p = 0; p < d.p; ++p)
            for (std::int64_t q = 0; q < d.q; ++q) {
                const Window win = window(d, p, q);
                dplane.block(win.h0, win.w0, win.h1 - win.h0, win.w1 - win.w0).array() += grad[p * d.q + q] * scale;
            }
    }
}

}  // namespace

// x (N,C,H,W) -> y (N,C,P,Q): max or mean of each window
Tensor pool2d_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    const PoolDims d = pool_dims(x.shape(), y.shape(), args.attrs);
    dispatch_floating(x.dtype(), "pool2d", [&]<typename T>() {
        if (args.op == OpType::MaxPool2d)
            max_pool_forward(x.data<T>(), d, y.data<T>());
        else
            avg_pool_forward(x.data<T>(), d, y.data<T>());
    });
    return y;
}

// dy (N,C,P,Q) -> dx (N,C,H,W): max sends each dy to its window's first maximal element (recomputed
// from x rather than saved, so the node holds no index tensor); average spreads dy/(kh·kw) over the window
std::vector<Tensor> pool2d_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& dy = args.grad_output;
    if (!args.needs_grad[0]) return {Tensor()};
    Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
    const PoolDims d = pool_dims(x.shape(), dy.shape(), args.attrs);
    dispatch_floating(x.dtype(), "pool2d backward", [&]<typename T>() {
        if (args.op == OpType::MaxPool2d)
            max_pool_backward(x.data<T>(), dy.data<T>(), d, dx.data<T>());
        else
            avg_pool_backward(dy.data<T>(), d, dx.data<T>());
    });
    return {dx};
}

}  // namespace cpu

}  // namespace dyngrad
