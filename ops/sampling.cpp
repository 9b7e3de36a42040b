// Sorting and sampling (ops/sampling.h): the user functions, the shape rules and the CPU kernels of cumsum,
// argsort, topk_indices and multinomial. The order keys and the multinomial draw are ops/sampling_math.h, shared
// with the GPU kernels (ops/sampling.cu), so both backends return the same indices.
#include "dyngrad/ops/sampling.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "dyngrad/core/checked.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/reduce.h"
#include "dyngrad/ops/indexing.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/sampling_math.h"

namespace dyngrad {

namespace {

// The axis a rank-0 tensor is seen along (PyTorch takes dim 0 or -1 there): its one element.
int line_axis(const Tensor& x, std::int64_t axis) {
    if (x.rank() == 0) {
        if (axis != 0 && axis != -1) throw ShapeError(str("axis ", axis, " is out of range for rank 0"));
        return 0;
    }
    return normalize_axis(axis, x.rank());
}

// sort's and topk's values: x gathered at the indices (gather needs an axis: a 0-d x is seen as one element).
template <class T>
T gather_at(const T& x, std::int64_t axis, const T& indices, std::source_location where) {
    if (x.shape().empty()) return reshape(gather(reshape(x, {1}, where), 0, reshape(indices, {1}, where), where), {}, where);
    return gather(x, axis, indices, where);
}

}  // namespace

AxisSplit sampling_split(const Tensor& x, std::int64_t axis) {
    if (x.rank() == 0) return {};
    return split_at_axis(x.shape(), line_axis(x, axis));
}

WeightRows weight_rows(const Tensor& probs) {
    return {probs.rank() == 2 ? probs.shape()[0] : 1, probs.shape().back()};
}

// ---- user functions: sort and topk (the single-op front doors are in ops/sampling.h) ----

// Second order (graph/higher_order.h): dx_i = Σ_{j≥i} dy_j = Σ_j dy_j − cumsum(dy)_i + dy_i, in differentiable ops
// (no flip op is needed); a 0-d input's cumsum is the identity.
std::vector<Var> cumsum_differentiable_backward(const DiffBackwardArgs& args) {
    if (!args.needs_grad[0]) return {Var()};
    const Var& dy = args.grad_output;
    if (dy.shape().empty()) return {dy};
    const std::int64_t axis = args.attrs.axis;
    return {sum(dy, {axis}, /*keepdim=*/true) - cumsum(dy, axis) + dy};
}

// The values are a gather at the indices: one sort, and gather's backward scatters dy back.
template <Operand T>
ValuesAndIndices<T> sort(const T& x, std::int64_t axis, bool descending, Loc where) {
    T indices = argsort(x, axis, descending, where);
    return {gather_at(x, axis, indices, where), indices};
}
template <Operand T>
ValuesAndIndices<T> topk(const T& x, std::int64_t k, std::int64_t axis, bool largest, Loc where) {
    T indices = apply_op(OpType::TopKIndices, {x},
                         op_attrs(&OpAttrs::axis, axis, &OpAttrs::length, k, &OpAttrs::descending, largest), where);
    return {gather_at(x, axis, indices, where), indices};
}
template ValuesAndIndices<Var> sort(const Var&, std::int64_t, bool, Loc);
template ValuesAndIndices<Tensor> sort(const Tensor&, std::int64_t, bool, Loc);
template ValuesAndIndices<Var> topk(const Var&, std::int64_t, std::int64_t, bool, Loc);
template ValuesAndIndices<Tensor> topk(const Tensor&, std::int64_t, std::int64_t, bool, Loc);

namespace infer {

OutputSpec cumsum(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_float(x, "x");
    line_axis(x, attrs.axis);
    return {x.shape(), x.dtype()};
}

// argsort (x's shape) and topk_indices (the axis cut to k), int64.
OutputSpec sort_indices(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_float(x, "x");
    const int axis = line_axis(x, attrs.axis);
    if (op == OpType::ArgSort) return {x.shape(), DType::i64};
    const std::int64_t size = x.rank() == 0 ? 1 : x.shape()[axis];
    if (attrs.length < (x.rank() == 0 ? 1 : 0) || attrs.length > size)  // 0-d: its one element
        throw ValueError(str("k = ", attrs.length, " is out of range: axis ", attrs.axis, " of ", to_string(x.shape()),
                             " has ", size, " entries (0 <= k <= ", size, ")"));
    Shape shape = x.shape();
    if (x.rank() > 0) shape[axis] = attrs.length;
    return {shape, DType::i64};
}

OutputSpec multinomial(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& probs = inputs[0];
    require_float(probs, "probs");
    if (probs.rank() != 1 && probs.rank() != 2)
        throw ShapeError(str("probs must be (C) or (N, C), got ", to_string(probs.shape())));
    const std::int64_t categories = probs.shape().back();
    if (categories == 0) throw ShapeError(str("probs ", to_string(probs.shape()), " has no categories"));
    if (attrs.length <= 0) throw ValueError(str("num_samples must be positive, got ", attrs.length));
    if (!attrs.replacement && attrs.length > categories)
        throw ValueError(str("cannot draw num_samples = ", attrs.length, " > ", categories,
                             " categories without replacement"));
    Shape shape = probs.shape();
    shape.back() = attrs.length;
    checked_numel(shape, "multinomial output");
    return {shape, DType::i64};
}

}  // namespace infer

const char* weight_problem_text(int problem) {
    switch (static_cast<math::WeightProblem>(problem)) {
        case math::WeightProblem::negative: return "a negative weight";
        case math::WeightProblem::not_a_number: return "a NaN weight";
        case math::WeightProblem::infinite: return "an infinite weight";
        case math::WeightProblem::zero_sum: return "weights summing to 0";
        case math::WeightProblem::too_few: return "fewer non-zero weights than num_samples (without replacement)";
        case math::WeightProblem::none: break;
    }
    return "invalid weights";
}

namespace cpu {

namespace {

// In double.
template <typename T>
void running_sums(const T* src, T* dst, const AxisSplit& s, bool reverse) {
    for (std::int64_t o = 0; o < s.outer; ++o) {
        for (std::int64_t i = 0; i < s.inner; ++i) {
            const std::int64_t base = o * s.size * s.inner + i;
            double sum = 0;
            for (std::int64_t j = 0; j < s.size; ++j) {
                const std::int64_t at = base + (reverse ? s.size - 1 - j : j) * s.inner;
                sum += static_cast<double>(src[at]);
                dst[at] = static_cast<T>(sum);
            }
        }
    }
}

template <typename T>
void sort_lines(const T* x, const AxisSplit& s, bool descending, std::int64_t keep, std::int64_t* out) {
    using Key = math::sort_key_t<T>;
    std::vector<std::pair<Key, std::int64_t>> line(static_cast<std::size_t>(s.size));
    for (std::int64_t o = 0; o < s.outer; ++o) {
        for (std::int64_t i = 0; i < s.inner; ++i) {
            for (std::int64_t j = 0; j < s.size; ++j)
                line[j] = {math::sort_key(x[(o * s.size + j) * s.inner + i], descending), j};
            // (key, index) pairs are distinct: the index breaks ties, which is the stable order.
            if (keep == s.size) std::sort(line.begin(), line.end());
            else std::partial_sort(line.begin(), line.begin() + keep, line.end());
            for (std::int64_t j = 0; j < keep; ++j) out[(o * keep + j) * s.inner + i] = line[j].second;
        }
    }
}

template <typename T>
void draw_rows(const T* probs, std::int64_t rows, std::int64_t categories, const OpAttrs& a, std::int64_t* out) {
    std::vector<double> scratch(static_cast<std::size_t>(categories));
    for (std::int64_t r = 0; r < rows; ++r) {
        std::int64_t column = 0;
        const T* weights = probs + r * categories;
        math::WeightProblem problem = math::weight_running_sums(weights, categories, scratch.data(), &column);
        if (problem == math::WeightProblem::none && !a.replacement) {
            const auto nonzero = std::count_if(weights, weights + categories, [](T w) { return w != T(0); });
            if (nonzero < a.length) problem = math::WeightProblem::too_few, column = nonzero;
        }
        if (problem != math::WeightProblem::none)
            throw ValueError(str("row ", r, " of probs has ", weight_problem_text(static_cast<int>(problem)),
                                 problem == math::WeightProblem::too_few ? str(" (", column, " of ", a.length, ")")
                                 : problem == math::WeightProblem::zero_sum ? std::string()
                                                                             : str(" at column ", column)));
        std::int64_t* row_out = out + r * a.length;
        if (a.replacement) {
            for (std::int64_t s = 0; s < a.length; ++s)
                row_out[s] = math::draw_from_running_sums(scratch.data(), categories,
                                                          math::multinomial_uniform(a.seed, r, s, a.length));
        } else {
            for (std::int64_t c = 0; c < categories; ++c) scratch[c] = static_cast<double>(weights[c]);
            math::draw_without_replacement(scratch.data(), categories, a.seed, r, a.length, row_out);
        }
    }
}

}  // namespace

void running_sums(const Tensor& src, Tensor& dst, const AxisSplit& s, bool reverse) {
    dispatch_floating(src.dtype(), "cumsum",
                      [&]<typename T>() { running_sums(src.data<T>(), dst.data<T>(), s, reverse); });
}

void sort_lines(const Tensor& x, const AxisSplit& s, bool descending, std::int64_t keep, Tensor& out) {
    dispatch_floating(x.dtype(), "sort_indices_forward", [&]<typename T>() {
        sort_lines(x.data<T>(), s, descending, keep, out.data<std::int64_t>());
    });
}

Tensor multinomial_forward(const ForwardArgs& args) {
    const Tensor& probs = args.inputs[0];
    Tensor out = Tensor::empty(args.out.shape, DType::i64, probs.device());
    const WeightRows w = weight_rows(probs);
    dispatch_floating(probs.dtype(), "multinomial_forward", [&]<typename T>() {
        draw_rows(probs.data<T>(), w.rows, w.categories, args.attrs, out.data<std::int64_t>());
    });
    return out;
}

}  // namespace cpu

// ---- cumsum, argsort and topk_indices: the same on every backend, over its scans and sorts ----

Tensor cumsum_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    DG_ON_BACKEND_OF(x, running_sums(x, y, sampling_split(x, args.attrs.axis), false));
    return y;
}

// dx_i = Σ_{j >= i} dy_j: the running sum of dy from the end.
std::vector<Tensor> cumsum_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    if (!args.needs_grad[0]) return {Tensor()};
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    DG_ON_BACKEND_OF(x, running_sums(args.grad_output, dx, sampling_split(x, args.attrs.axis), true));
    return {dx};
}

Tensor sort_indices_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor indices = Tensor::empty(args.out.shape, DType::i64, x.device());
    if (indices.numel() == 0) return indices;
    const AxisSplit s = sampling_split(x, args.attrs.axis);
    const std::int64_t keep = args.op == OpType::ArgSort ? s.size : args.attrs.length;
    DG_ON_BACKEND_OF(x, sort_lines(x, s, args.attrs.descending, keep, indices));
    return indices;
}

}  // namespace dyngrad
