// Layout ops (ops/layout.h): user functions, shape rules, reshape (every backend) and the CPU kernels
// (axis swaps and strided row copies). GPU: ops/layout.cu.
#include "dyngrad/ops/layout.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <Eigen/Core>

#include "dyngrad/core/checked.h"
#include "dyngrad/core/tensor_indexing.h"
#include "dyngrad/graph/eager.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/strided.h"

namespace dyngrad {

// ---- user functions: the composites over either operand type (the single-op front doors are in ops/layout.h) ----
template <Operand T>
T concat(const std::vector<T>& xs, std::int64_t axis, Loc where) {
    if (xs.empty()) throw ValueError(str("concat at ", describe_site(where), ": needs at least one tensor"));
    return apply_op(OpType::Concat, xs, op_attrs(&OpAttrs::axis, axis), where);
}

namespace {

// The axis of a composite (stack, split) in [0, rank), or ShapeError naming the composite and its call site.
int composite_axis(const char* op, std::int64_t axis, std::size_t rank, std::source_location where) {
    try {
        return normalize_axis(axis, rank);
    } catch (const ShapeError& e) {
        throw ShapeError(str(op, " at ", describe_site(where), ": ", e.what()));
    }
}

// stack's checks: at least one input, all of input 0's shape. Returns each input's shape with a 1 at `axis`.
template <Operand T>
Shape stack_piece_shape(const std::vector<T>& xs, std::int64_t axis, std::source_location where) {
    if (xs.empty()) throw ValueError(str("stack at ", describe_site(where), ": needs at least one tensor"));
    const Shape& first = xs.front().shape();
    for (std::size_t i = 1; i < xs.size(); ++i)
        if (xs[i].shape() != first)
            throw ShapeError(str("stack at ", describe_site(where), ": input ", i, " has shape ",
                                 to_string(xs[i].shape()), " but input 0 has ", to_string(first),
                                 " (stacked tensors share one shape)"));
    Shape piece = first;
    piece.insert(piece.begin() + composite_axis("stack", axis, first.size() + 1, where), 1);
    return piece;
}

// split's pieces as (start, length) along the axis.
std::vector<std::pair<std::int64_t, std::int64_t>> split_pieces(std::int64_t axis_size, std::int64_t size,
                                                                std::source_location where) {
    if (size < 1) throw ValueError(str("split at ", describe_site(where), ": the piece size must be >= 1, got ", size));
    std::vector<std::pair<std::int64_t, std::int64_t>> pieces;
    for (std::int64_t start = 0; start < axis_size; start += std::min(size, axis_size - start))
        pieces.emplace_back(start, std::min(size, axis_size - start));
    if (pieces.empty()) pieces.emplace_back(0, 0);  // PyTorch: an empty axis splits into one empty piece
    return pieces;
}

std::vector<std::pair<std::int64_t, std::int64_t>> sized_pieces(std::int64_t axis_size,
                                                                const std::vector<std::int64_t>& sizes,
                                                                std::source_location where) {
    std::vector<std::pair<std::int64_t, std::int64_t>> pieces;
    std::int64_t start = 0;
    const std::string total = str("split_with_sizes at ", describe_site(where), ": sum of the split sizes");
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i] < 0)
            throw ValueError(str("split_with_sizes at ", describe_site(where), ": size ", i, " is negative (",
                                 sizes[i], ")"));
        pieces.emplace_back(start, sizes[i]);
        start = checked_add(start, sizes[i], total);
    }
    if (start != axis_size)
        throw ShapeError(str("split_with_sizes at ", describe_site(where), ": sizes ", to_string(sizes),
                             " add up to ", start, " but the axis has size ", axis_size));
    return pieces;
}

// x narrowed to each (start, length) piece along axis `axis` (already in [0, rank)).
template <Operand T>
std::vector<T> narrowed(const T& x, int axis, const std::vector<std::pair<std::int64_t, std::int64_t>>& pieces,
                        std::source_location where) {
    std::vector<T> out;
    for (const auto& [start, length] : pieces) out.push_back(narrow(x, axis, start, length, where));
    return out;
}

}  // namespace

template <Operand T>
T stack(const std::vector<T>& xs, std::int64_t axis, Loc where) {
    const Shape piece = stack_piece_shape(xs, axis, where);
    std::vector<T> pieces;
    for (const T& x : xs) pieces.push_back(reshape(x, piece, where));
    return concat(pieces, normalize_axis(axis, piece.size()), where);
}

template <Operand T>
std::vector<T> split(const T& x, std::int64_t size, std::int64_t axis, Loc where) {
    const int a = composite_axis("split", axis, x.shape().size(), where);
    return narrowed(x, a, split_pieces(x.shape()[a], size, where), where);
}

template <Operand T>
std::vector<T> split_with_sizes(const T& x, const std::vector<std::int64_t>& sizes, std::int64_t axis, Loc where) {
    const int a = composite_axis("split_with_sizes", axis, x.shape().size(), where);
    return narrowed(x, a, sized_pieces(x.shape()[a], sizes, where), where);
}

// An undefined operand goes to the op itself, which names it as for any op.
template <Operand T>
T select(const T& x, std::int64_t axis, std::int64_t index, Loc where) {
    if (!x.defined()) return narrow(x, axis, index, 1, where);
    const auto [a, i] = indexing::select_at(value_of(x), axis, index, where);
    return reshape(narrow(x, a, i, 1, where), indexing::without_axis(x.shape(), a), where);
}
template <Operand T>
T squeeze(const T& x, std::int64_t axis, Loc where) {
    return reshape(x, x.defined() ? indexing::squeezed_shape(value_of(x), axis, where) : Shape{}, where);
}
template <Operand T>
T unsqueeze(const T& x, std::int64_t axis, Loc where) {
    return reshape(x, x.defined() ? indexing::unsqueezed_shape(value_of(x), axis, where) : Shape{}, where);
}
template <Operand T>
T flatten(const T& x, std::int64_t start_axis, std::int64_t end_axis, Loc where) {
    const Shape shape = x.defined() ? indexing::flattened_shape(value_of(x), start_axis, end_axis, where) : Shape{};
    return reshape(x, shape, where);
}
template <Operand T>
T flatten(const T& x, Loc where) {
    if (x.defined() && x.shape().size() < 2)
        throw ShapeError(str("flatten at ", describe_site(where), ": needs a tensor of rank >= 2 (N, ...), got shape ",
                             to_string(x.shape())));
    return flatten(x, 1, -1, where);
}

#define DG_LAYOUT_INSTANCES(T)                                                                                   \
    template T concat(const std::vector<T>&, std::int64_t, Loc);                                                 \
    template T stack(const std::vector<T>&, std::int64_t, Loc);                                                  \
    template std::vector<T> split(const T&, std::int64_t, std::int64_t, Loc);                                    \
    template std::vector<T> split_with_sizes(const T&, const std::vector<std::int64_t>&, std::int64_t, Loc);     \
    template T select(const T&, std::int64_t, std::int64_t, Loc);                                                \
    template T squeeze(const T&, std::int64_t, Loc);                                                             \
    template T unsqueeze(const T&, std::int64_t, Loc);                                                           \
    template T flatten(const T&, std::int64_t, std::int64_t, Loc);                                               \
    template T flatten(const T&, Loc);
DG_LAYOUT_INSTANCES(Var)
DG_LAYOUT_INSTANCES(Tensor)
#undef DG_LAYOUT_INSTANCES

namespace infer {

OutputSpec transpose(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_float(x, "x");
    if (attrs.axes.size() != 2) throw ValueError(str("expects 2 axes to swap, got ", attrs.axes.size()));
    Shape shape = x.shape();
    std::swap(shape[normalize_axis(attrs.axes[0], x.rank())], shape[normalize_axis(attrs.axes[1], x.rank())]);
    return {shape, x.dtype()};
}

OutputSpec reshape(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    return {resolve_reshape(x.shape(), x.numel(), attrs.shape), x.dtype()};
}

OutputSpec narrow(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    return {indexing::narrowed_shape(x.shape(), attrs.axis, attrs.start, attrs.length), x.dtype()};
}

OutputSpec concat(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& first = inputs[0];
    const int axis = normalize_axis(attrs.axis, first.rank());
    Shape shape = first.shape();
    shape[axis] = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const Tensor& x = inputs[i];
        if (x.dtype() != first.dtype())
            throw DTypeError(
                str("input ", i, " is ", dtype_name(x.dtype()), " but input 0 is ", dtype_name(first.dtype())));
        bool fits = x.rank() == first.rank();
        for (std::size_t k = 0; fits && k < x.rank(); ++k)
            fits = static_cast<int>(k) == axis || x.shape()[k] == first.shape()[k];
        if (!fits)
            throw ShapeError(str("input ", i, " of shape ", to_string(x.shape()), " does not fit input 0 of shape ",
                                 to_string(first.shape()), " outside axis ", axis));
        shape[axis] = checked_add(shape[axis], x.shape()[axis], "size of the joined axis");
    }
    checked_numel(shape, "output");
    return {shape, first.dtype()};
}

OutputSpec permute(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    const std::vector<int> perm = permutation_of(attrs.axes, x.rank());
    Shape shape(x.rank());
    for (std::size_t i = 0; i < perm.size(); ++i) shape[i] = x.shape()[perm[i]];
    return {shape, x.dtype()};
}

OutputSpec expand(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_strided_rank(attrs.shape, "target");
    if (attrs.shape.size() < x.rank())
        throw ShapeError(str("target ", to_string(attrs.shape), " has fewer dims than x ", to_string(x.shape())));
    const std::size_t lead = attrs.shape.size() - x.rank();
    Shape shape = attrs.shape;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] == -1) {
            if (d < lead)
                throw ValueError(str("target ", to_string(attrs.shape), ": -1 (keep the size) at new axis ", d,
                                     ", which x does not have"));
            shape[d] = x.shape()[d - lead];
        } else if (shape[d] < 0) {
            throw ValueError(str("target ", to_string(attrs.shape), " has a negative dimension"));
        } else if (d >= lead && x.shape()[d - lead] != 1 && x.shape()[d - lead] != shape[d]) {
            throw ShapeError(str("cannot expand x ", to_string(x.shape()), " to ", to_string(attrs.shape), ": axis ",
                                 d - lead, " of x has size ", x.shape()[d - lead], ", neither 1 nor ", shape[d]));
        }
    }
    checked_numel(shape, "output");
    return {shape, x.dtype()};
}

}  // namespace infer

std::vector<int> permutation_of(const std::vector<std::int64_t>& dims, std::size_t rank) {
    require_strided_rank(Shape(rank, 1), "x");
    if (dims.size() != rank)
        throw ShapeError(str("dims ", to_string(dims), " name ", dims.size(), " axes, x has ", rank));
    std::vector<int> perm(rank);
    std::vector<bool> seen(rank, false);
    for (std::size_t i = 0; i < rank; ++i) {
        perm[i] = normalize_axis(dims[i], rank);
        if (seen[perm[i]]) throw ValueError(str("dims ", to_string(dims), " name axis ", perm[i], " twice"));
        seen[perm[i]] = true;
    }
    return perm;
}

StridedWalk<1> permute_walk(const Shape& x, const std::vector<int>& perm) {
    const std::vector<std::int64_t> x_strides = contiguous_strides(x);
    StridedWalk<1> walk;
    walk.rank = static_cast<int>(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) {
        walk.sizes[i] = x[perm[i]];
        walk.strides[0][i] = x_strides[perm[i]];
    }
    return walk;
}

std::vector<int> inverse_permutation(const std::vector<int>& perm) {
    std::vector<int> inverse(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int>(i);
    return inverse;
}

// ---- reshape: metadata only, the same on every backend ----
Tensor reshape_forward(const ForwardArgs& args) { return args.inputs[0].reshaped(args.out.shape); }

std::vector<Tensor> reshape_backward(const BackwardArgs& args) {
    if (!args.needs_grad[0]) return {Tensor()};
    return {args.grad_output.reshaped(args.inputs[0].shape())};
}

namespace cpu {

namespace {

// Copies x into y with axes `axis0` and `axis1` swapped. x is viewed as (outer, d0, mid, d1, inner)
// around the two axes and y as (outer, d1, mid, d0, inner).
template <typename T>
void swap_axes(const Tensor& x, int axis0, int axis1, Tensor& y) {
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    const Shape& shape = x.shape();
    const int lo = std::min(axis0, axis1);
    const int hi = std::max(axis0, axis1);
    if (lo == hi) {
        std::copy_n(src, x.numel(), dst);
        return;
    }
    const auto product = [&](int begin, int end) { return numel(Shape(shape.begin() + begin, shape.begin() + end)); };
    const std::int64_t outer = product(0, lo);
    const std::int64_t d0 = shape[lo];
    const std::int64_t mid = product(lo + 1, hi);
    const std::int64_t d1 = shape[hi];
    const std::int64_t inner = product(hi + 1, static_cast<int>(shape.size()));
    if (inner == 1) {
        // Each (o, m) is a strided d0×d1 matrix: let Eigen transpose it.
        using Strided = Eigen::OuterStride<>;
        for (std::int64_t o = 0; o < outer; ++o)
            for (std::int64_t m = 0; m < mid; ++m) {
                Eigen::Map<const MatrixRM<T>, 0, Strided> from(src + (o * d0 * mid + m) * d1, d0, d1,
                                                               Strided(mid * d1));
                Eigen::Map<MatrixRM<T>, 0, Strided> to(dst + (o * d1 * mid + m) * d0, d1, d0, Strided(mid * d0));
                to = from.transpose();
            }
        return;
    }
    // Contiguous runs of `inner` elements move as blocks.
    for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t i = 0; i < d0; ++i)
            for (std::int64_t m = 0; m < mid; ++m)
                for (std::int64_t j = 0; j < d1; ++j)
                    std::copy_n(src + (((o * d0 + i) * mid + m) * d1 + j) * inner, inner,
                                dst + (((o * d1 + j) * mid + m) * d0 + i) * inner);
}

// For each of `rows` rows: `block` elements from src + row·src_stride to dst + row·dst_stride (element
// units of `element_size` bytes). Narrow, concat and their gradients are all such copies.
unsigned char* bytes_at(const Tensor& t, std::int64_t element) {
    return static_cast<unsigned char*>(t.raw_data()) + static_cast<std::size_t>(element) * dtype_size(t.dtype());
}

}  // namespace

void add_rows(const Tensor& src, Tensor& dst, const RowCopy& copy) {
    if (src.dtype() != dst.dtype())
        throw DTypeError(str("add_rows: ", describe(src), " into ", describe(dst)));
    if (copy.block == 0 || copy.rows == 0) return;
    const auto add = [&]<typename T>(auto to_float, auto from_float) {
        const T* from = static_cast<const T*>(src.raw_data()) + copy.src_offset;
        T* to = static_cast<T*>(dst.raw_data()) + copy.dst_offset;
        for (std::int64_t r = 0; r < copy.rows; ++r)
            for (std::int64_t j = 0; j < copy.block; ++j) {
                T& d = to[r * copy.dst_stride + j];
                d = from_float(to_float(d) + to_float(from[r * copy.src_stride + j]));
            }
    };
    const auto same = [](auto v) { return v; };
    // bf16/f16: summed in f32 and rounded once, as accumulate_into and the GPU kernel do
    const auto widen = [](auto h) { return static_cast<float>(to_double(h)); };
    switch (src.dtype()) {
        case DType::f32: return add.operator()<float>(same, same);
        case DType::f64: return add.operator()<double>(same, same);
        case DType::bf16: return add.operator()<bfloat16>(widen, [](float v) { return to_bfloat16(v); });
        case DType::f16: return add.operator()<float16>(widen, [](float v) { return to_float16(v); });
        default: break;
    }
    throw DTypeError(str("add_rows: expects a floating dtype, got ", describe(src)));
}

void copy_rows(const Tensor& src, Tensor& dst, const RowCopy& copy) {
    if (copy.block == 0 || copy.rows == 0) return;
    const std::size_t element_size = dtype_size(src.dtype());
    const unsigned char* from = bytes_at(src, copy.src_offset);
    unsigned char* to = bytes_at(dst, copy.dst_offset);
    const auto bytes = static_cast<std::size_t>(copy.block) * element_size;
    for (std::int64_t r = 0; r < copy.rows; ++r)
        std::memcpy(to + static_cast<std::size_t>(r * copy.dst_stride) * element_size,
                    from + static_cast<std::size_t>(r * copy.src_stride) * element_size, bytes);
}

void swap_axes(const Tensor& x, const std::vector<std::int64_t>& axes, Tensor& y) {
    const int axis0 = normalize_axis(axes[0], x.rank());
    const int axis1 = normalize_axis(axes[1], x.rank());
    dispatch_floating(x.dtype(), "transpose", [&]<typename T>() { swap_axes<T>(x, axis0, axis1, y); });
}

namespace {
// y[i] = x[walk offset of i]: permute and expand, in element units of the dtype's size (any dtype). On the
// collapsed walk, y is a sequence of runs along the innermost dim, each a block copy when x reads it contiguously.
template <typename E>
void strided_copy(const E* x, E* y, std::int64_t n, const StridedWalk<1>& walk_as_given) {
    const StridedWalk<1> walk = collapsed(walk_as_given);
    const int inner = walk.rank - 1;
    const std::int64_t run = inner < 0 ? 1 : walk.sizes[inner];
    const std::int64_t step = inner < 0 ? 0 : walk.strides[0][inner];
    StridedWalk<1> runs = walk;  // the walk over the runs' starts
    runs.rank = std::max(inner, 0);
    std::int64_t offset[1];
    for (std::int64_t r = 0; r * run < n; ++r) {
        runs.offsets(r, offset);
        const E* from = x + offset[0];
        E* to = y + r * run;
        if (step == 1) {
            std::copy_n(from, run, to);
        } else {
            for (std::int64_t j = 0; j < run; ++j) to[j] = from[j * step];
        }
    }
}
}  // namespace

void strided_copy(const Tensor& x, Tensor& y, const StridedWalk<1>& walk) {
    // bf16/f16 as 2-byte words (they were copied as 8-byte ones: past the end of both buffers).
    with_element_word(dtype_size(x.dtype()), [&]<typename E>() {
        strided_copy(static_cast<const E*>(x.raw_data()), static_cast<E*>(y.raw_data()), y.numel(), walk);
    });
}

}  // namespace cpu

// ---- transpose, narrow and concat: swaps and row copies, the same on every backend ----

namespace {

void swap_axes(const Tensor& x, const std::vector<std::int64_t>& axes, Tensor& y) {
    DG_ON_BACKEND_OF(x, swap_axes(x, axes, y));
}
void strided_copy(const Tensor& x, Tensor& y, const StridedWalk<1>& walk) {
    DG_ON_BACKEND_OF(x, strided_copy(x, y, walk));
}
void copy_rows(const Tensor& src, Tensor& dst, const RowCopy& copy) {
    DG_ON_BACKEND_OF(src, copy_rows(src, dst, copy));
}
void add_rows(const Tensor& src, Tensor& dst, const RowCopy& copy) { DG_ON_BACKEND_OF(src, add_rows(src, dst, copy)); }

// narrow's window: x (outer, size, inner)[:, start:start+length, :] -> y (outer, length, inner)
RowCopy narrow_copy(const Shape& x, const OpAttrs& attrs) {
    const AxisSplit s = split_at_axis(x, normalize_axis(attrs.axis, x.size()));
    const std::int64_t block = attrs.length * s.inner;
    return {attrs.start * s.inner, s.size * s.inner, 0, block, s.outer, block};
}

// concat: input x (outer, n_k, inner) -> y (outer, Σ n, inner) at column `offset` of y's rows
RowCopy concat_copy(const Shape& x, const AxisSplit& ys, int axis, std::int64_t offset) {
    const AxisSplit s = split_at_axis(x, axis);
    return {0, s.size * s.inner, offset, ys.size * ys.inner, s.outer, s.size * s.inner};
}

}  // namespace

// x -> y (x.shape[perm[0]], x.shape[perm[1]], ...), perm from attrs.axes
Tensor permute_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    strided_copy(x, y, permute_walk(x.shape(), permutation_of(args.attrs.axes, x.rank())));
    return y;
}

// dx = dy permuted back by the inverse permutation
std::vector<Tensor> permute_backward(const BackwardArgs& args) {
    const Tensor& dy = args.grad_output;
    if (!args.needs_grad[0]) return {Tensor()};
    Tensor dx = Tensor::empty(args.inputs[0].shape(), dy.dtype(), dy.device());
    strided_copy(dy, dx, permute_walk(dy.shape(), inverse_permutation(permutation_of(args.attrs.axes, dy.rank()))));
    return {dx};
}

// x broadcast to y's shape (attrs.shape with -1 resolved)
Tensor expand_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    const Shape operands[1] = {x.shape()};
    strided_copy(x, y, broadcast_walk(args.out.shape, operands));
    return y;
}

// x (..., d0, ..., d1, ...) -> y (..., d1, ..., d0, ...), axes in attrs.axes
Tensor transpose_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    swap_axes(x, args.attrs.axes, y);
    return y;
}

// A swap of two axes is its own inverse: dx is dy with the same axes swapped back.
std::vector<Tensor> transpose_backward(const BackwardArgs& args) {
    if (!args.needs_grad[0]) return {Tensor()};
    const Tensor& x = args.inputs[0];
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
    swap_axes(args.grad_output, args.attrs.axes, dx);
    return {dx};
}

Tensor narrow_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    copy_rows(x, y, narrow_copy(x.shape(), args.attrs));
    return y;
}

// dy (outer, length, inner) -> dx (outer, n, inner): dy in the window, zeros elsewhere. When the engine hands
// in the gradient x has received so far (the other slices of x: the q, k and v of a fused QKV projection), dy is
// added into its window in place instead: no zero-filled tensor and no accumulation pass over all of x.
std::vector<Tensor> narrow_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    if (!args.needs_grad[0]) return {Tensor()};
    const RowCopy window = reversed(narrow_copy(x.shape(), args.attrs));
    if (!args.grads_so_far.empty() && args.grads_so_far[0].defined()) {
        Tensor dx = args.grads_so_far[0];
        add_rows(args.grad_output, dx, window);
        return {dx};
    }
    Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
    copy_rows(args.grad_output, dx, window);
    return {dx};
}

// xs[k] (outer, n_k, inner) -> y (outer, Σ n_k, inner), in input order along attrs.axis; one copy per input
Tensor concat_forward(const ForwardArgs& args) {
    const Tensor& first = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, first.device());
    const int axis = normalize_axis(args.attrs.axis, first.rank());
    const AxisSplit ys = split_at_axis(y.shape(), axis);
    std::int64_t offset = 0;
    for (const Tensor& x : args.inputs) {
        const RowCopy copy = concat_copy(x.shape(), ys, axis, offset);
        copy_rows(x, y, copy);
        offset += copy.block;
    }
    return y;
}

// dy (outer, Σ n_k, inner) -> dxs[k] (outer, n_k, inner): each input's slab of dy
std::vector<Tensor> concat_backward(const BackwardArgs& args) {
    const Tensor& dy = args.grad_output;
    const int axis = normalize_axis(args.attrs.axis, dy.rank());
    const AxisSplit ys = split_at_axis(dy.shape(), axis);
    std::vector<Tensor> grads(args.inputs.size());
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < args.inputs.size(); ++i) {
        const Tensor& x = args.inputs[i];
        const RowCopy copy = concat_copy(x.shape(), ys, axis, offset);
        if (args.needs_grad[i]) {
            grads[i] = Tensor::empty(x.shape(), x.dtype(), x.device());
            copy_rows(dy, grads[i], reversed(copy));
        }
        offset += copy.block;
    }
    return grads;
}

// expand's gradient is dy itself, in y's shape: the engine sums it back to x's shape (sum_to), the one place
// broadcasting is undone. The same on every backend.
std::vector<Tensor> expand_backward(const BackwardArgs& args) {
    if (!args.needs_grad[0]) return {Tensor()};
    return {args.grad_output};
}

}  // namespace dyngrad
