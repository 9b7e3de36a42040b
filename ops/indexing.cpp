// Indexing ops (ops/indexing.h): user functions, shape rules, the geometry both backends share, and the CPU
// kernels (sums in index order, so the CPU is deterministic). GPU: ops/indexing.cu.
#include "dyngrad/ops/indexing.h"

#include <cstring>

#include "dyngrad/core/checked.h"
#include "dyngrad/graph/eager.h"
#include "dyngrad/ops/argument_rules.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/select_gradients.h"

namespace dyngrad {

// ---- argument rules (ops/argument_rules.h; the user functions are front doors in ops/indexing.h) ----
// The indices pick the weight's rows (axis 0, which the Indices input domain reads); a padding_idx given in
// [-V, V) counts from V when negative, -1 (not given) is none.
void embedding_arguments(OpCall& call) {
    call.attrs.axis = 0;
    const Tensor* weight = call.value(0);
    if (!call.gave(attr_field_index("padding_idx")) || weight == nullptr || !weight->defined()) return;
    const std::int64_t rows = weight->rank() == 0 ? 0 : weight->shape()[0];
    const std::int64_t p = call.attrs.padding_idx;
    if (p < -rows || p >= rows)
        throw IndexError(str("embedding at ", describe_site(call.where), ": padding_idx ", p, " is outside [", -rows,
                             ", ", rows, ") for a weight of ", rows, " rows"));
    call.attrs.padding_idx = p < 0 ? p + rows : p;
}

namespace {

// gather / scatter_add: index of the indexed tensor's rank, no larger than it outside `axis`.
int check_indexed(const Tensor& indexed, const char* indexed_role, const Tensor& index, std::int64_t axis_attr) {
    require_int64(index, "index");
    require_strided_rank(indexed.shape(), indexed_role);
    if (index.rank() != indexed.rank())
        throw ShapeError(str("index ", to_string(index.shape()), " has rank ", index.rank(), " but ", indexed_role, " ",
                             to_string(indexed.shape()), " has rank ", indexed.rank()));
    const int axis = normalize_axis(axis_attr, indexed.rank());
    for (std::size_t d = 0; d < indexed.rank(); ++d)
        if (static_cast<int>(d) != axis && index.shape()[d] > indexed.shape()[d])
            throw ShapeError(str("index ", to_string(index.shape()), " is larger than ", indexed_role, " ",
                                 to_string(indexed.shape()), " along axis ", d, " (only axis ", axis, " may differ)"));
    return axis;
}

}  // namespace

namespace infer {

// inputs: weight (V, D), indices (any shape)
OutputSpec embedding(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& weight = inputs[0];
    const Tensor& indices = inputs[1];
    require_float(weight, "weight");
    require_int64(indices, "indices");
    if (weight.rank() != 2)
        throw ShapeError(str("weight must be 2-D (num_embeddings, embedding_dim), got ", to_string(weight.shape())));
    if (attrs.padding_idx < -1 || attrs.padding_idx >= weight.shape()[0])
        throw IndexError(str("padding_idx ", attrs.padding_idx, " is outside [0, ", weight.shape()[0],
                             ") (the weight's rows; -1 for none)"));
    Shape shape = indices.shape();
    shape.push_back(weight.shape()[1]);
    checked_numel(shape, "output");
    return {shape, weight.dtype()};
}

// inputs: x, index (x's rank)
OutputSpec gather(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    check_indexed(inputs[0], "x", inputs[1], attrs.axis);
    return {inputs[1].shape(), inputs[0].dtype()};
}

// inputs: x, index (1-D)
OutputSpec index_select(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    const Tensor& index = inputs[1];
    require_int64(index, "index");
    if (index.rank() != 1) throw ShapeError(str("index must be 1-D, got ", to_string(index.shape())));
    Shape shape = x.shape();
    shape[normalize_axis(attrs.axis, x.rank())] = index.numel();
    checked_numel(shape, "output");
    return {shape, x.dtype()};
}

// inputs: base, index (base's rank), src (index's shape)
OutputSpec scatter_add(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& base = inputs[0];
    const Tensor& src = inputs[2];
    require_float(base, "base");
    require_same_dtype(src, "src", base, "base");
    check_indexed(base, "base", inputs[1], attrs.axis);
    if (src.shape() != inputs[1].shape())
        throw ShapeError(str("src ", to_string(src.shape()), " must have index's shape ", to_string(inputs[1].shape())));
    return {base.shape(), base.dtype()};
}

// inputs: condition, a, b
OutputSpec where(OpType, std::span<const Tensor> inputs, const OpAttrs&) {
    const Tensor& condition = inputs[0];
    const Tensor& a = inputs[1];
    const Tensor& b = inputs[2];
    require_float(a, "a");
    require_same_dtype(b, "b", a, "a");
    require_same_dtype(condition, "condition", a, "a");
    const Shape shape = broadcast_shapes(broadcast_shapes(condition.shape(), a.shape()), b.shape());
    require_strided_rank(shape, "output");
    return {shape, a.dtype()};
}

// inputs: x, mask
OutputSpec masked_fill(OpType, std::span<const Tensor> inputs, const OpAttrs&) {
    const Tensor& x = inputs[0];
    const Tensor& mask = inputs[1];
    require_float(x, "x");
    require_same_dtype(mask, "mask", x, "x");
    require_strided_rank(x.shape(), "x");
    if (mask.rank() > x.rank() || broadcast_shapes(x.shape(), mask.shape()) != x.shape())
        throw ShapeError(str("mask ", to_string(mask.shape()), " does not broadcast to x's shape ", to_string(x.shape())));
    return {x.shape(), x.dtype()};
}

}  // namespace infer

IndexedWalk indexed_walk(const Shape& indexed, const Shape& index, int axis) {
    const std::vector<std::int64_t> strides = contiguous_strides(indexed);
    IndexedWalk walk;
    walk.element.rank = static_cast<int>(index.size());
    for (std::size_t d = 0; d < index.size(); ++d) {
        walk.element.sizes[d] = index[d];
        walk.element.strides[0][d] = static_cast<int>(d) == axis ? 0 : strides[d];
    }
    walk.axis_stride = strides[axis];
    walk.axis_size = indexed[axis];
    return walk;
}

// ---- Differentiable backwards (graph/higher_order.h): the index inputs are constants (no gradient) ----

namespace {

Var zeros_of(const Var& x) { return constant_of(x, Tensor::zeros(x.shape(), x.dtype(), x.device())); }

}  // namespace

// weight (V, D), indices (...): dweight = dy's rows scattered into the indexed rows; padding_idx's rows get none
std::vector<Var> embedding_differentiable_backward(const DiffBackwardArgs& args) {
    const Var& weight = args.inputs[0];
    std::vector<Var> grads(2);
    if (!args.needs_grad[0]) return grads;
    const Tensor& indices = args.inputs[1].value();
    const std::int64_t n = indices.numel();
    const std::int64_t d = weight.shape()[1];
    const std::vector<double> rows = indices.to(Device::cpu()).to_vector();
    std::vector<std::int64_t> index(static_cast<std::size_t>(n * d));
    std::vector<double> keep(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
        const auto row = static_cast<std::int64_t>(rows[static_cast<std::size_t>(i)]);
        for (std::int64_t j = 0; j < d; ++j) index[static_cast<std::size_t>(i * d + j)] = row;
        keep[static_cast<std::size_t>(i)] = row == args.attrs.padding_idx ? 0.0 : 1.0;
    }
    Var g = reshape(args.grad_output, {n, d});
    if (args.attrs.padding_idx >= 0)
        g = mul(g, constant_of(weight, Tensor::from_vector(keep, {n, 1}, weight.dtype(), weight.device())));
    const Var at = constant_of(weight, Tensor::from_vector(index, {n, d}, weight.device()));
    grads[0] = scatter_add(zeros_of(weight), 0, at, g);
    return grads;
}

// dx = zeros with dy added at the gathered positions
std::vector<Var> gather_differentiable_backward(const DiffBackwardArgs& args) {
    std::vector<Var> grads(2);
    if (args.needs_grad[0])
        grads[0] = scatter_add(zeros_of(args.inputs[0]), args.attrs.axis, args.inputs[1], args.grad_output);
    return grads;
}

// x (…, n, …), index (L): dx = dy's slices added into the indexed ones (a scatter_add with the index broadcast)
std::vector<Var> index_select_differentiable_backward(const DiffBackwardArgs& args) {
    std::vector<Var> grads(2);
    if (!args.needs_grad[0]) return grads;
    const Var& x = args.inputs[0];
    const Shape& dy_shape = args.grad_output.shape();
    const auto axis = static_cast<std::size_t>(normalize_axis(args.attrs.axis, x.shape().size()));
    Shape column(dy_shape.size(), 1);
    column[axis] = dy_shape[axis];
    const Tensor index = expand(args.inputs[1].value().reshaped(column), dy_shape);
    grads[0] = scatter_add(zeros_of(x), static_cast<std::int64_t>(axis), constant_of(x, index), args.grad_output);
    return grads;
}

// dbase = dy; dsrc = dy gathered at the indexed positions
std::vector<Var> scatter_add_differentiable_backward(const DiffBackwardArgs& args) {
    std::vector<Var> grads(3);
    if (args.needs_grad[0]) grads[0] = args.grad_output;
    if (args.needs_grad[2]) grads[2] = gather(args.grad_output, args.attrs.axis, args.inputs[1]);
    return grads;
}

// where (c, a, b): da = dy where c, db = dy where not c; masked_fill (x, m): dx = dy where not m. The condition is
// flat: a zero gradient.
std::vector<Var> select_differentiable_backward(const DiffBackwardArgs& args) {
    const bool is_where = args.op == OpType::Where;
    const std::size_t condition = is_where ? 0 : 1;
    const Var& c = args.inputs[condition];
    const Var& g = args.grad_output;
    std::vector<Var> grads(args.inputs.size());
    const auto route = [&](bool when_true) {
        return mul(g, constant_of(g, when_true ? (c.value() != 0.0) : (c.value() == 0.0)));
    };
    if (is_where) {
        if (args.needs_grad[1]) grads[1] = route(true);
        if (args.needs_grad[2]) grads[2] = route(false);
    } else if (args.needs_grad[0]) {
        grads[0] = route(false);
    }
    if (args.needs_grad[condition]) grads[condition] = zeros_of(c);
    return grads;
}

namespace cpu {

namespace {

// IndexError for an index outside [0, size): the engine prefixes the op and node.
void check_index(std::int64_t index, std::int64_t position, std::int64_t size) {
    if (index < 0 || index >= size)
        throw IndexError(str("index ", index, " at position ", position, " is out of range [0, ", size, ")"));
}

// Calls f(e, offset) for every element e of the index, with `offset` the flat position in the indexed tensor.
template <typename F>
void for_each_indexed(const Tensor& index, const IndexedWalk& walk, F f) {
    const std::int64_t* idx = index.data<std::int64_t>();
    std::int64_t base[1];
    for (std::int64_t e = 0; e < index.numel(); ++e) {
        check_index(idx[e], e, walk.axis_size);
        walk.element.offsets(e, base);
        f(e, base[0] + idx[e] * walk.axis_stride);
    }
}

template <typename E>
void gather_words(const E* x, const Tensor& index, const IndexedWalk& walk, E* y) {
    for_each_indexed(index, walk, [&](std::int64_t e, std::int64_t offset) { y[e] = x[offset]; });
}

}  // namespace

void select_rows(const Tensor& x, const Tensor& index, const AxisSplit& s, const char*, Tensor& y) {
    const std::int64_t* idx = index.data<std::int64_t>();
    const std::int64_t count = index.numel();
    for (std::int64_t l = 0; l < count; ++l) check_index(idx[l], l, s.size);
    const std::size_t row_bytes = static_cast<std::size_t>(s.inner) * dtype_size(x.dtype());
    const auto* src = static_cast<const unsigned char*>(x.raw_data());
    auto* dst = static_cast<unsigned char*>(y.raw_data());
    if (row_bytes == 0) return;
    for (std::int64_t o = 0; o < s.outer; ++o)
        for (std::int64_t l = 0; l < count; ++l)
            std::memcpy(dst + static_cast<std::size_t>(o * count + l) * row_bytes,
                        src + static_cast<std::size_t>(o * s.size + idx[l]) * row_bytes, row_bytes);
}

void add_selected_rows(const Tensor& dy, const Tensor& index, const AxisSplit& s, std::int64_t skip_row,
                       const char* what, Tensor& dx) {
    dispatch_floating(dx.dtype(), what, [&]<typename T>() {
        const std::int64_t* idx = index.data<std::int64_t>();
        const std::int64_t count = index.numel();
        for (std::int64_t l = 0; l < count; ++l) check_index(idx[l], l, s.size);
        const T* dy_rows = dy.data<T>();
        T* dx_rows = dx.data<T>();
        for (std::int64_t o = 0; o < s.outer; ++o)
            for (std::int64_t l = 0; l < count; ++l) {
                if (idx[l] == skip_row) continue;
                const T* from = dy_rows + (o * count + l) * s.inner;
                T* to = dx_rows + (o * s.size + idx[l]) * s.inner;
                for (std::int64_t c = 0; c < s.inner; ++c) to[c] += from[c];
            }
    });
}

void gather_elements(const Tensor& x, const Tensor& index, const IndexedWalk& walk, const char*, Tensor& y) {
    with_element_word(dtype_size(x.dtype()), [&]<typename E>() {
        gather_words(static_cast<const E*>(x.raw_data()), index, walk, static_cast<E*>(y.raw_data()));
    });
}

void add_elements(const Tensor& src, const Tensor& index, const IndexedWalk& walk, const char* what, Tensor& dst) {
    dispatch_floating(dst.dtype(), what, [&]<typename T>() {
        const T* from = src.data<T>();
        T* to = dst.data<T>();
        for_each_indexed(index, walk, [&](std::int64_t e, std::int64_t offset) { to[offset] += from[e]; });
    });
}

namespace {

// where: y = c != 0 ? a : b over y's shape (operands condition, a, b); masked_fill: y = m != 0 ? value : x
// (operands mask, x). One walk per op; the backward routes dy by the same test.
template <typename T>
void select_values(const ForwardArgs& args, Tensor& y) {
    const Shape& out = args.out.shape;
    T* to = y.data<T>();
    const std::int64_t n = y.numel();
    if (args.op == OpType::Where) {
        const Shape shapes[3] = {args.inputs[0].shape(), args.inputs[1].shape(), args.inputs[2].shape()};
        const StridedWalk<3> walk = broadcast_walk(out, shapes);
        const T* c = args.inputs[0].data<T>();
        const T* a = args.inputs[1].data<T>();
        const T* b = args.inputs[2].data<T>();
        std::int64_t at[3];
        for (std::int64_t i = 0; i < n; ++i) {
            walk.offsets(i, at);
            to[i] = c[at[0]] != T(0) ? a[at[1]] : b[at[2]];
        }
        return;
    }
    const Shape shapes[1] = {args.inputs[1].shape()};
    const StridedWalk<1> walk = broadcast_walk(out, shapes);
    const T* x = args.inputs[0].data<T>();
    const T* m = args.inputs[1].data<T>();
    const T value = static_cast<T>(args.attrs.scalar);
    std::int64_t at[1];
    for (std::int64_t i = 0; i < n; ++i) {
        walk.offsets(i, at);
        to[i] = m[at[0]] != T(0) ? value : x[i];
    }
}

// dy routed to the side the condition chose: `chosen` gets dy where the condition is true (`when_true`)
// or false, 0 elsewhere; dy's shape (the engine sums it down to the operand's).
template <typename T>
Tensor routed(const Tensor& dy, const Tensor& condition, bool when_true) {
    Tensor out = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    const Shape shapes[1] = {condition.shape()};
    const StridedWalk<1> walk = broadcast_walk(dy.shape(), shapes);
    const T* g = dy.data<T>();
    const T* c = condition.data<T>();
    T* to = out.data<T>();
    std::int64_t at[1];
    for (std::int64_t i = 0; i < dy.numel(); ++i) {
        walk.offsets(i, at);
        to[i] = (c[at[0]] != T(0)) == when_true ? g[i] : T(0);
    }
    return out;
}

}  // namespace

Tensor select_forward(const ForwardArgs& args) {
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, args.inputs[0].device());
    dispatch_floating(args.out.dtype, "where / masked_fill", [&]<typename T>() { select_values<T>(args, y); });
    return y;
}

// where: da = dy where c, db = dy where not c; masked_fill: dx = dy where not m (select_gradients).
std::vector<Tensor> select_backward(const BackwardArgs& args) {
    return select_gradients(args, [](const Tensor& dy, const Tensor& condition, bool when_true) {
        return dispatch_floating(dy.dtype(), "where / masked_fill backward",
                                 [&]<typename T>() { return routed<T>(dy, condition, when_true); });
    });
}

}  // namespace cpu

// ---- embedding, index_select, gather, scatter_add: the same on every backend, over its indexing primitives ----

// weight (V, D), indices (...) -> y (..., D)
Tensor embedding_forward(const ForwardArgs& args) {
    const Tensor& weight = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, weight.device());
    DG_ON_BACKEND_OF(weight, select_rows(weight, args.inputs[1], {1, weight.shape()[0], weight.shape()[1]},
                                         "embedding", y));
    return y;
}

// dy (..., D) -> dweight (V, D): dy's rows added into the rows the indices name, padding_idx's row left 0
std::vector<Tensor> embedding_backward(const BackwardArgs& args) {
    const Tensor& weight = args.inputs[0];
    if (!args.needs_grad[0]) return {Tensor(), Tensor()};
    Tensor dw = Tensor::zeros(weight.shape(), weight.dtype(), weight.device());
    const AxisSplit s{1, weight.shape()[0], weight.shape()[1]};
    DG_ON_BACKEND_OF(dw, add_selected_rows(args.grad_output, args.inputs[1], s, args.attrs.padding_idx,
                                           "embedding backward", dw));
    return {dw, Tensor()};
}

// x (outer, n, inner), index (L) -> y (outer, L, inner)
Tensor index_select_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    const AxisSplit s = split_at_axis(x.shape(), normalize_axis(args.attrs.axis, x.rank()));
    DG_ON_BACKEND_OF(x, select_rows(x, args.inputs[1], s, "index_select", y));
    return y;
}

std::vector<Tensor> index_select_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    if (!args.needs_grad[0]) return {Tensor(), Tensor()};
    Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
    const AxisSplit s = split_at_axis(x.shape(), normalize_axis(args.attrs.axis, x.rank()));
    DG_ON_BACKEND_OF(dx, add_selected_rows(args.grad_output, args.inputs[1], s, -1, "index_select backward", dx));
    return {dx, Tensor()};
}

// x, index -> y (index's shape)
Tensor gather_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& index = args.inputs[1];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    const IndexedWalk walk = indexed_walk(x.shape(), index.shape(), normalize_axis(args.attrs.axis, x.rank()));
    DG_ON_BACKEND_OF(x, gather_elements(x, index, walk, "gather", y));
    return y;
}

// dy (index's shape) -> dx: zeros with dy added at the gathered positions, in index order
std::vector<Tensor> gather_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& index = args.inputs[1];
    if (!args.needs_grad[0]) return {Tensor(), Tensor()};
    Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
    const IndexedWalk walk = indexed_walk(x.shape(), index.shape(), normalize_axis(args.attrs.axis, x.rank()));
    DG_ON_BACKEND_OF(dx, add_elements(args.grad_output, index, walk, "gather backward", dx));
    return {dx, Tensor()};
}

// base, index, src -> y = base with src added at the indexed positions, in index order
Tensor scatter_add_forward(const ForwardArgs& args) {
    const Tensor& base = args.inputs[0];
    const Tensor& index = args.inputs[1];
    Tensor y = base.clone();
    const IndexedWalk walk = indexed_walk(base.shape(), index.shape(), normalize_axis(args.attrs.axis, base.rank()));
    DG_ON_BACKEND_OF(y, add_elements(args.inputs[2], index, walk, "scatter_add", y));
    return y;
}

// scatter_add's backward, every backend: dbase = dy; dsrc = dy gathered at the indexed positions, which is
// gather's forward on (dy, index), run by dy's backend.
std::vector<Tensor> scatter_add_backward(const BackwardArgs& args) {
    const Tensor& dy = args.grad_output;
    std::vector<Tensor> grads(3);
    if (args.needs_grad[0]) grads[0] = dy;
    if (args.needs_grad[2]) {
        const Tensor gather_inputs[] = {dy, args.inputs[1]};
        grads[2] = backend_forward(OpType::Gather, gather_inputs, args.attrs, {args.inputs[1].shape(), dy.dtype()});
    }
    return grads;
}

}  // namespace dyngrad
