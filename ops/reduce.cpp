// Reductions: sum and mean over a set of axes, max over one axis. The user functions, shape rules and
// Eigen kernels, plus the engine's backend dispatchers sum_to and accumulate_into (ops/kernels.h).
#include "dyngrad/ops/reduce.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "dyngrad/graph/eager.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/indexing.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduce_geometry.h"

namespace dyngrad {

namespace {

template <typename T>
using Array1 = Eigen::Array<T, Eigen::Dynamic, 1>;
template <typename T>
using Array2 = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic>;  // column-major

template <typename T>
Eigen::Map<const Array1<T>> in(const T* data, std::int64_t n) {
    return {data, n};
}
template <typename T>
Eigen::Map<Array1<T>> out(T* data, std::int64_t n) {
    return {data, n};
}

void check_floating(const Tensor& x) {
    if (!is_floating(x.dtype())) throw DTypeError(str("expects float32 or float64, got ", dtype_name(x.dtype())));
}

// x (outer, reduced, inner) -> y (outer, inner), summing the middle axis ('=').
template <typename T>
void sum_middle(const T* x, T* y, std::int64_t outer, std::int64_t reduced, std::int64_t inner) {
    if (inner == 1) {
        // slice o is column o of the column-major (reduced, outer) view
        out(y, outer) = Eigen::Map<const Array2<T>>(x, reduced, outer).colwise().sum().transpose();
        return;
    }
    // slice o is `reduced` contiguous rows of `inner`: add them row by row (Eigen's rowwise().sum() over
    // the column-major view walks across rows and is several times slower)
    for (std::int64_t o = 0; o < outer; ++o) {
        const T* slice = x + o * reduced * inner;
        auto total = out(y + o * inner, inner);
        total.setZero();
        for (std::int64_t r = 0; r < reduced; ++r) total += in(slice + r * inner, inner);
    }
}

// y = x summed over the reduced runs ('='); y holds the kept runs, in order. One (outer, reduced, inner)
// pass per reduced run, innermost first, through scratch buffers.
template <typename T>
void sum_runs(const T* x, T* y, std::vector<Run> runs) {
    const auto passes = std::count_if(runs.begin(), runs.end(), [](const Run& r) { return r.reduced; });
    if (passes == 0) {
        std::memcpy(y, x, static_cast<std::size_t>(runs_numel(runs, 0, runs.size())) * sizeof(T));
        return;
    }
    std::vector<T> scratch[2];
    const T* src = x;
    for (std::ptrdiff_t p = 0; p < passes; ++p) {
        const auto last = std::find_if(runs.rbegin(), runs.rend(), [](const Run& r) { return r.reduced; });
        const auto j = static_cast<std::size_t>(runs.rend() - last) - 1;
        const std::int64_t outer = runs_numel(runs, 0, j);
        const std::int64_t inner = runs_numel(runs, j + 1, runs.size());
        T* dst = y;
        if (p + 1 < passes) {
            scratch[p % 2].resize(static_cast<std::size_t>(outer * inner));
            dst = scratch[p % 2].data();
        }
        sum_middle(src, dst, outer, runs[j].size, inner);
        runs.erase(runs.begin() + static_cast<std::ptrdiff_t>(j));
        src = dst;
    }
}

// dx = scale * dy broadcast over the reduced runs ('='); dy holds the kept runs, in order. Walks dx one
// innermost run at a time, stepping dy with an odometer over the outer runs.
template <typename T>
void expand_runs(const T* dy, T* dx, const std::vector<Run>& runs, T scale) {
    if (runs.empty()) {
        dx[0] = scale * dy[0];
        return;
    }
    if (runs_numel(runs, 0, runs.size()) == 0) return;
    std::vector<std::int64_t> dy_stride(runs.size(), 0);  // 0 along reduced runs
    std::int64_t stride = 1;
    for (std::size_t i = runs.size(); i-- > 0;) {
        if (runs[i].reduced) continue;
        dy_stride[i] = stride;
        stride *= runs[i].size;
    }
    const std::size_t outer_rank = runs.size() - 1;
    const Run inner = runs.back();
    const std::int64_t outer = runs_numel(runs, 0, outer_rank);
    std::vector<std::int64_t> index(outer_rank, 0);
    std::int64_t j = 0;
    for (std::int64_t k = 0; k < outer; ++k) {
        auto run = out(dx + k * inner.size, inner.size);
        if (inner.reduced)
            run.setConstant(scale * dy[j]);
        else
            run = scale * in(dy + j, inner.size);
        for (std::size_t d = outer_rank; d-- > 0;) {
            if (++index[d] < runs[d].size) {
                j += dy_stride[d];
                break;
            }
            index[d] = 0;
            j -= dy_stride[d] * (runs[d].size - 1);
        }
    }
}

}  // namespace

// (the user functions are front doors in ops/reduce.h)

namespace infer {

OutputSpec reduce_axes(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    check_floating(x);
    const std::vector<bool> reduced = reduced_axes(x.shape(), attrs.axes);
    // A sum over nothing is 0; a mean over nothing is undefined (as for the losses' means).
    if (op == OpType::Mean && reduced_count(x.shape(), reduced) == 0)
        throw ShapeError(str("the mean over ",
                             attrs.axes.empty() ? std::string("all axes") : str("axes ", to_string(attrs.axes)), " of ",
                             to_string(x.shape()), " averages zero elements"));
    if (op == OpType::LogSumExp && reduced_count(x.shape(), reduced) == 0)
        throw ShapeError(str("logsumexp over ",
                             attrs.axes.empty() ? std::string("all axes") : str("axes ", to_string(attrs.axes)), " of ",
                             to_string(x.shape()), ": no elements (its maximum is undefined)"));
    return {reduced_shape(x.shape(), reduced, attrs.keepdim), x.dtype()};
}

OutputSpec reduce_axis(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    check_floating(x);
    const int axis = normalize_axis(attrs.axis, x.rank());
    if (x.shape()[axis] == 0) throw ShapeError(str("axis ", attrs.axis, " of ", to_string(x.shape()), " is empty"));
    std::vector<bool> reduced(x.rank(), false);
    reduced[axis] = true;
    return {reduced_shape(x.shape(), reduced, attrs.keepdim), x.dtype()};
}

OutputSpec arg_reduce(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    OutputSpec spec = reduce_axis(op, inputs, attrs);
    spec.dtype = DType::i64;
    return spec;
}

}  // namespace infer

// argmax, argmin on every backend: the index the max op's forward saves for its backward, so the same kernels
// and the same rule: the first index of the maximum, NaN counting as the maximum (NumPy, PyTorch). argmin is
// argmax of -x: negation is exact, so ties stay ties and the first minimum wins.
Tensor arg_reduce_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const auto forward_of = [&x](OpType op) {
        const OpDef& def = op_def(op);
        const ForwardFn forward = x.device().is_cuda() ? def.cuda.forward : def.cpu.forward;
        if (!forward) throw DeviceError(str(def.name, ": no forward kernel on ", x.device().to_string()));
        return forward;
    };
    std::vector<Tensor> saved;
    Tensor searched = x;
    if (args.op == OpType::ArgMin) {
        const OutputSpec same{x.shape(), x.dtype()};
        searched = forward_of(OpType::Neg)(ForwardArgs{OpType::Neg, args.inputs, args.attrs, same, saved});
    }
    const OutputSpec values{args.out.shape, x.dtype()};
    const Tensor max_inputs[] = {searched};
    forward_of(OpType::Max)(ForwardArgs{OpType::Max, max_inputs, args.attrs, values, saved});
    if (saved.size() != 1 || saved[0].dtype() != DType::i64)
        throw GraphError(str(op_def(args.op).name, ": the max forward saved no int64 argmax"));
    return saved[0];
}

// sum, mean: dy (with the reduced axes kept as 1) expanded back to x's shape; mean scales by 1/count.
std::vector<Var> reduce_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    const Shape& x_shape = args.inputs[0].shape();
    const std::vector<bool> reduced = reduced_axes(x_shape, args.attrs.axes);
    Shape kept = x_shape;
    for (std::size_t i = 0; i < kept.size(); ++i)
        if (reduced[i]) kept[i] = 1;
    Var g = expand(reshape(args.grad_output, kept), x_shape);
    if (args.op == OpType::Mean) g = mul_scalar(g, 1.0 / static_cast<double>(reduced_count(x_shape, reduced)));
    return {g};
}

// max along an axis: dy scattered to the first maximum of each slice (the kernels' tie rule), found eagerly (an
// index, no gradient).
std::vector<Var> max_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    const Var& x = args.inputs[0];
    const std::int64_t axis = args.attrs.axis;
    const Tensor index = argmax(x.value(), axis, /*keepdim=*/true);
    Var g = args.grad_output;
    if (!args.attrs.keepdim) g = reshape(g, index.shape());
    const Var zeros = constant_of(x, Tensor::zeros(x.shape(), x.dtype(), x.device()));
    return {scatter_add(zeros, axis, constant_of(x, index), g)};
}

// logsumexp on every backend, over that backend's own kernels (as argmax over max's), in the keepdim shape:
// y = m + log Σ exp(x − m), m the maximum over the axes (one max per axis), replaced by 0 where it is ±inf or NaN
// (PyTorch's rule: an all −inf slice gives −inf and an inf gives inf, not NaN from inf − inf).
namespace {
Tensor run_kernel(OpType op, std::vector<Tensor> inputs, const OpAttrs& attrs = {}) {
    const OpDef& def = op_def(op);
    const ForwardFn forward = inputs[0].device().is_cuda() ? def.cuda.forward : def.cpu.forward;
    if (!forward) throw DeviceError(str(def.name, ": no forward kernel on ", inputs[0].device().to_string()));
    const OutputSpec spec = def.infer(op, inputs, attrs);
    std::vector<Tensor> saved;
    return forward(ForwardArgs{op, inputs, attrs, spec, saved});
}
}  // namespace

Tensor logsumexp_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const std::vector<bool> reduced = reduced_axes(x.shape(), args.attrs.axes);
    Tensor m = x;
    for (std::size_t axis = 0; axis < reduced.size(); ++axis)
        if (reduced[axis]) m = run_kernel(OpType::Max, {m}, detail::axis_keepdim_attrs(static_cast<std::int64_t>(axis), true));
    const Tensor zero = Tensor::zeros({}, x.dtype(), x.device());
    const Tensor finite = run_kernel(OpType::Eq, {run_kernel(OpType::Sub, {m, m}), zero});  // m − m = 0: finite
    m = run_kernel(OpType::Where, {finite, m, zero});
    const Tensor e = run_kernel(OpType::Exp, {run_kernel(OpType::Sub, {x, m})});
    const Tensor s = run_kernel(OpType::Sum, {e}, detail::axes_attrs(args.attrs.axes, true));
    return run_kernel(OpType::Add, {run_kernel(OpType::Log, {s}), m}).reshaped(args.out.shape);
}

// dx = dy · exp(x − y): the softmax over the reduced axes, dy and y broadcast from the keepdim shape.
std::vector<Tensor> logsumexp_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    if (!args.needs_grad[0]) return {Tensor()};
    const Shape kept = reduced_shape(x.shape(), reduced_axes(x.shape(), args.attrs.axes), true);
    const Tensor p = run_kernel(OpType::Exp, {run_kernel(OpType::Sub, {x, args.output.reshaped(kept)})});
    return {run_kernel(OpType::Mul, {p, args.grad_output.reshaped(kept)})};
}

// logsumexp: dx = dy · exp(x − y), dy and y broadcast from the keepdim shape, in differentiable ops.
std::vector<Var> logsumexp_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    const Var& x = args.inputs[0];
    const Shape kept = reduced_shape(x.shape(), reduced_axes(x.shape(), args.attrs.axes), true);
    return {reshape(args.grad_output, kept) * exp(x - reshape(args.output, kept))};
}

namespace cpu {

// x -> y: x summed (mean: averaged) over the reduced axes; y holds the kept axes in order
Tensor reduce_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const std::vector<bool> reduced = reduced_axes(x.shape(), args.attrs.axes);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    dispatch_floating(x.dtype(), "reduce_forward", [&]<typename T>() {
        sum_runs(x.data<T>(), y.data<T>(), reduction_runs(x.shape(), reduced));
        if (args.op == OpType::Mean) out(y.data<T>(), y.numel()) /= static_cast<T>(reduced_count(x.shape(), reduced));
    });
    return y;
}

// dy (kept axes) -> dx (x's shape): dy repeated along the reduced axes (mean: divided by their count)
std::vector<Tensor> reduce_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    if (!args.needs_grad[0]) return {Tensor()};
    const std::vector<bool> reduced = reduced_axes(x.shape(), args.attrs.axes);
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    dispatch_floating(x.dtype(), "reduce_backward", [&]<typename T>() {
        const T scale = args.op == OpType::Mean ? T(1) / static_cast<T>(reduced_count(x.shape(), reduced)) : T(1);
        expand_runs(args.grad_output.data<T>(), dx.data<T>(), reduction_runs(x.shape(), reduced), scale);
    });
    return {dx};
}

// x (outer, n, inner) -> y (outer, inner); saved[0]: argmax (outer, inner) int64. NaN counts as the
// maximum (as in NumPy and PyTorch); ties go to the first index.
Tensor max_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const MaxForward f = max_forward_outputs(args);
    const AxisSplit v = f.split;
    const Tensor &y = f.y, &argmax = f.argmax;
    dispatch_floating(x.dtype(), "max_forward", [&]<typename T>() {
        const T* xp = x.data<T>();
        T* yp = y.data<T>();
        std::int64_t* ip = argmax.data<std::int64_t>();
        if (v.inner == 1) {
            // contiguous slices: a vectorised max, then the first element equal to it
            for (std::int64_t o = 0; o < v.outer; ++o) {
                const T* slice = xp + o * v.size;
                const T m = in(slice, v.size).template maxCoeff<Eigen::PropagateNaN>();
                const T* first = std::isnan(m) ? std::find_if(slice, slice + v.size, [](T e) { return std::isnan(e); })
                                               : std::find(slice, slice + v.size, m);
                yp[o] = m;
                ip[o] = first - slice;
            }
            return;
        }
        // running max down the n rows of `inner` of each slice (branch-free; strict '>' keeps the first)
        for (std::int64_t o = 0; o < v.outer; ++o) {
            const T* slice = xp + o * v.size * v.inner;
            T* best = yp + o * v.inner;
            std::int64_t* arg = ip + o * v.inner;
            std::copy(slice, slice + v.inner, best);
            std::fill(arg, arg + v.inner, 0);
            for (std::int64_t r = 1; r < v.size; ++r) {
                const T* row = slice + r * v.inner;
                for (std::int64_t i = 0; i < v.inner; ++i) {
                    const T e = row[i];
                    const T b = best[i];
                    const bool wins = e > b || (std::isnan(e) && !std::isnan(b));
                    best[i] = wins ? e : b;
                    arg[i] = wins ? r : arg[i];
                }
            }
        }
    });
    return y;
}

// dy (outer, inner) -> dx (outer, n, inner): dy at each slice's argmax, zero elsewhere
std::vector<Tensor> max_backward(const BackwardArgs& args) {
    const std::optional<MaxBackward> plan = max_backward_plan(args);
    if (!plan) return {Tensor()};
    const MaxBackward& p = *plan;
    const AxisSplit v = p.split;
    const std::int64_t* argmax = p.argmax.data<std::int64_t>();
    Tensor dx = Tensor::zeros(p.x.shape(), p.x.dtype(), p.x.device());
    dispatch_floating(p.x.dtype(), "max_backward", [&]<typename T>() {
        const T* dy = p.dy.data<T>();
        T* dxp = dx.data<T>();
        for (std::int64_t o = 0; o < v.outer; ++o)
            for (std::int64_t i = 0; i < v.inner; ++i) {
                const std::int64_t k = o * v.inner + i;
                dxp[(o * v.size + argmax[k]) * v.inner + i] = dy[k];
            }
    });
    return {dx};
}

// x -> x summed over `axes`, which stay as size 1; bf16/f16 through f32, rounded once
Tensor sum_over(const Tensor& x, std::span<const int> axes) {
    if (is_reduced_precision(x.dtype())) return sum_over(x.to(DType::f32), axes).to(x.dtype());
    std::vector<bool> reduced(x.rank(), false);
    for (const int axis : axes) reduced[normalize_axis(axis, x.rank())] = true;
    Tensor y = Tensor::empty(reduced_shape(x.shape(), reduced, true), x.dtype(), x.device());
    dispatch_floating(x.dtype(), "sum_over", [&]<typename T>() {
        sum_runs(x.data<T>(), y.data<T>(), reduction_runs(x.shape(), reduced));
    });
    return y;
}

}  // namespace cpu

// ---- engine helpers, dispatched by device ----
std::vector<int> broadcast_reduction_axes(const Shape& from, const Shape& to) {
    if (to.size() > from.size())
        throw ShapeError(str("shape ", to_string(to), " does not broadcast to ", to_string(from)));
    const std::size_t lead = from.size() - to.size();
    std::vector<int> axes;
    for (std::size_t i = 0; i < from.size(); ++i) {
        const std::int64_t target = i < lead ? 1 : to[i - lead];
        if (target == from[i]) continue;  // size-1 axes need no sum either
        if (target != 1) throw ShapeError(str("shape ", to_string(to), " does not broadcast to ", to_string(from)));
        axes.push_back(static_cast<int>(i));
    }
    return axes;
}

// bf16/f16: the CUDA helpers take them natively (f32 accumulation); the CPU ones through f32, rounded once.
Tensor sum_to(const Tensor& grad, const Shape& shape) {
    const std::vector<int> axes = broadcast_reduction_axes(grad.shape(), shape);
    if (axes.empty()) return grad.reshaped(shape);
    return DG_ON_BACKEND_OF(grad, sum_over(grad, axes)).reshaped(shape);
}

void accumulate_into(Tensor& dst, Tensor src) {
    if (!dst.defined()) {
        dst = std::move(src);
        return;
    }
    if (dst.device() != src.device())
        throw DeviceError(str("accumulate ", describe(src), " into ", describe(dst)));
    // Gradients may share storage with values or other gradients (kernels may return aliases, add's backward
    // hands one dy to both inputs): add into whichever of the two is owned alone (the sum is the same either way,
    // IEEE addition commutes), and copy only when neither is.
    if (!dst.owns_storage_exclusively()) {
        if (src.owns_storage_exclusively() && src.dtype() == dst.dtype() && src.shape() == dst.shape())
            std::swap(dst, src);
        else
            dst = dst.clone();
    }
    DG_ON_BACKEND_OF(dst, accumulate_into(dst, src));
}

}  // namespace dyngrad
