// linear_cross_entropy: the user function, its argument rule, shape rule, composition (create_graph and the fused
// check) and the CPU kernels (Eigen). GPU kernels: ops/linear_cross_entropy.cu. What the op computes and why the
// gradients come from the forward: ops/linear_cross_entropy.h.
#include "dyngrad/ops/linear_cross_entropy.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/ops/argument_rules.h"
#include "dyngrad/ops/cpu_parallel.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/linalg.h"
#include "dyngrad/ops/loss.h"
#include "dyngrad/ops/loss_math.h"

namespace dyngrad {

namespace {
constexpr AttrSet kClassesGiven = reads("length");
std::atomic<std::int64_t> chunk_elements_setting{0};
}  // namespace

template <Operand T>
T linear_cross_entropy(const T& x, const T& weight, const T& labels, const LinearCrossEntropyOptions& options,
                       std::source_location where) {
    const Shape& shape = x.shape();
    if (shape.empty())
        throw ShapeError(str("linear_cross_entropy at ", describe_site(where), ": x must be (*, E), got a 0-d tensor"));
    const Shape positions(shape.begin(), shape.end() - 1);
    if (labels.shape() != positions)
        throw ShapeError(str("linear_cross_entropy at ", describe_site(where), ": labels ", to_string(labels.shape()),
                             " do not match x ", to_string(shape), ": expected ", to_string(positions),
                             " (x's shape without its last axis)"));
    OpAttrs attrs;
    attrs.reduction = options.reduction;
    attrs.ignore_index = options.ignore_index;
    attrs.label_smoothing = options.label_smoothing;
    attrs.length = options.classes;
    AttrSet given = options.classes != 0 ? kClassesGiven : AttrSet{};
    // The forward's dx and dW are wasted work unless a backward can come: never for a Tensor (eager), and for a
    // Var only while recording with x or the weight requiring grad.
    if constexpr (std::is_same_v<T, Tensor>) {
        attrs.save_for_backward = false;
    } else {
        attrs.save_for_backward = grad_enabled() && (x.requires_grad() || weight.requires_grad());
    }
    given = given.with(attr_field_index("save_for_backward"));
    const std::int64_t n = numel(positions);
    const T rows = shape.size() == 2 ? x : reshape(x, {n, shape.back()}, where);
    const T flat_labels = positions.size() == 1 ? labels : reshape(labels, {n}, where);
    T out = apply_op(OpType::LinearCrossEntropy, {rows, weight, flat_labels}, attrs, where, given);
    return options.reduction == Reduction::None && positions.size() != 1 ? reshape(out, positions, where) : out;
}
template Var linear_cross_entropy(const Var&, const Var&, const Var&, const LinearCrossEntropyOptions&,
                                  std::source_location);
template Tensor linear_cross_entropy(const Tensor&, const Tensor&, const Tensor&, const LinearCrossEntropyOptions&,
                                     std::source_location);

// classes not given: every row of the weight; save_for_backward not given: grad_enabled() (Python's dg.ops).
void linear_cross_entropy_arguments(OpCall& call) {
    if (!call.gave(attr_field_index("length")) && call.size() > 1 && call.value(1) != nullptr &&
        call.value(1)->rank() == 2)
        call.attrs.length = call.value(1)->size(0);
    if (!call.gave(attr_field_index("save_for_backward"))) call.attrs.save_for_backward = grad_enabled();
}

namespace detail {
std::int64_t set_linear_cross_entropy_chunk_elements(std::int64_t elements) {
    return chunk_elements_setting.exchange(std::max<std::int64_t>(elements, 0));
}
std::int64_t linear_cross_entropy_chunk_rows(std::int64_t rows, std::int64_t classes, std::int64_t backend_default) {
    const std::int64_t setting = chunk_elements_setting.load();
    const std::int64_t budget = setting > 0 ? setting : backend_default;
    return std::clamp<std::int64_t>(budget / std::max<std::int64_t>(classes, 1), 1, std::max<std::int64_t>(rows, 1));
}
}  // namespace detail

// ---- the unfused composition: create_graph, and the fused-kernel check (graph/fusion_check.h) ----

namespace {

// F.cross_entropy(F.linear(x, weight[:classes]), labels, ...): what the fused kernels compute, in recorded ops.
Var linear_cross_entropy_composition(std::span<const Var> in, const OpAttrs& attrs) {
    const Var& weight = in[1];
    const Var head = attrs.length == weight.shape()[0] ? weight : narrow(weight, 0, 0, attrs.length);
    CrossEntropyOptions options;
    options.reduction = attrs.reduction;
    options.ignore_index = attrs.ignore_index;
    options.label_smoothing = attrs.label_smoothing;
    // 16-bit inputs. The GPU's logits are 16-bit outputs of an f32-accumulating GEMM (PyTorch's bf16 logits under
    // autocast), which the row kernels read into float32; the CPU runs the op through f32, logits never rounded.
    // The composition rounds where its device's kernels do: the two differ by the logits' rounding (7e-4 relative
    // in bf16 on the H200), above the fused-kernel check's f32 tolerance.
    Var logits;
    if (!is_reduced_precision(in[0].dtype()))
        logits = linear(in[0], head);
    else if (in[0].device().is_cuda())
        logits = to_dtype(linear(in[0], head), DType::f32);
    else
        logits = linear(to_dtype(in[0], DType::f32), to_dtype(head, DType::f32));
    return cross_entropy(logits, in[2], options);
}

}  // namespace

namespace unfused {
const UnfusedComposition linear_cross_entropy{linear_cross_entropy_composition};
}  // namespace unfused

namespace infer {

// x (N,E) (the user function flattens (*,E)), weight (V_padded,E) of x's dtype, labels (N) int64; classes (the
// `length` attribute) in [1, V_padded]. The loss is float32 for bf16/f16 inputs (autocast or not), as
// F.cross_entropy's of the bf16 logits under PyTorch's autocast: a loss summed over ~50k-class softmaxes kept in
// the inputs' 8 or 11 bits would lose what the f32 row sums computed. x's dtype otherwise.
OutputSpec linear_cross_entropy(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    const Tensor& weight = inputs[1];
    const Tensor& labels = inputs[2];
    require_float(x, "x");
    require_same_dtype(weight, "weight", x, "x");
    require_int64(labels, "labels");
    if (x.rank() != 2) throw ShapeError(str("x must be (N,E), got ", to_string(x.shape())));
    if (weight.rank() != 2) throw ShapeError(str("weight must be (V,E), got ", to_string(weight.shape())));
    if (weight.size(1) != x.size(1))
        throw ShapeError(str("weight ", to_string(weight.shape()), " does not match x ", to_string(x.shape()),
                             ": its rows must have x's width ", x.size(1)));
    if (labels.shape() != Shape{x.size(0)})
        throw ShapeError(str("labels ", to_string(labels.shape()), " do not match x ", to_string(x.shape()),
                             ": expected (", x.size(0), ")"));
    if (x.numel() == 0) throw ShapeError(str("x ", to_string(x.shape()), " is empty: the loss needs N, E >= 1"));
    if (attrs.length < 1 || attrs.length > weight.size(0))
        throw ValueError(str("classes (length) must be in [1, ", weight.size(0), "] (the weight's rows), got ",
                             attrs.length));
    if (!(attrs.label_smoothing >= 0.0 && attrs.label_smoothing <= 1.0))
        throw ValueError(str("label_smoothing must be in [0, 1], got ", attrs.label_smoothing));
    if (attrs.reduction != Reduction::Mean && attrs.reduction != Reduction::Sum && attrs.reduction != Reduction::None)
        throw ValueError(str("reduction must be Mean, Sum or None, got ", static_cast<int>(attrs.reduction)));
    return {attrs.reduction == Reduction::None ? Shape{x.size(0)} : Shape{},
            is_reduced_precision(x.dtype()) ? DType::f32 : x.dtype()};
}

}  // namespace infer

namespace cpu {

namespace {

// Logits elements per chunk: 4M (16 MB in f32), a few dozen rows of GPT-2's vocabulary per GEMM.
constexpr std::int64_t kCpuChunkElements = std::int64_t{1} << 22;

void check_lce_labels(const Tensor& labels, std::int64_t classes, std::int64_t ignore_index) {
    const std::int64_t* label = labels.data<std::int64_t>();
    for (std::int64_t i = 0; i < labels.numel(); ++i)
        if ((label[i] < 0 || label[i] >= classes) && label[i] != ignore_index)
            throw IndexError(str("linear_cross_entropy: label ", label[i], " at row ", i, " is out of range for ",
                                 classes, " classes (ignore_index ", ignore_index, ")"));
}

// One pass over the rows in chunks. Per chunk: logits = x_c·W[:C]ᵀ into the workspace; per row the loss
//   loss_i = lse_i − (1 − ε)·z_i,y − (ε/C)·Σ_c z_ic       (0 for an ignored row)
// into row_loss (when given); where dx or dW is wanted the row is overwritten with
//   dlogits_ic = s_i·(softmax_ic − (1 − ε)·[c = y_i] − ε/C)  (0 for an ignored row)
// and dx_c = dlogits·W[:C], dW[:C] += dlogitsᵀ·x_c follow at once. dW's padded rows stay 0.
template <typename T, typename Scale>
void chunked_pass(const Tensor& x, const Tensor& weight, const Tensor& labels, const OpAttrs& attrs, Scale&& scale,
                  double* row_loss, T* dx, T* dw) {
    const std::int64_t n = x.size(0), width = x.size(1), classes = attrs.length;
    const Eigen::Map<const MatrixRM<T>> X(x.data<T>(), n, width);
    const Eigen::Map<const MatrixRM<T>> head(weight.data<T>(), classes, width);  // W[:C]: a prefix of the buffer
    const std::int64_t* label = labels.data<std::int64_t>();
    const T eps = static_cast<T>(attrs.label_smoothing);
    const T eps_per_class = eps / static_cast<T>(classes);
    const bool grads = dx != nullptr || dw != nullptr;
    if (dw != nullptr) Eigen::Map<MatrixRM<T>>(dw, weight.size(0), width).setZero();
    const std::int64_t chunk = detail::linear_cross_entropy_chunk_rows(n, classes, kCpuChunkElements);
    MatrixRM<T> workspace(chunk, classes);
    for (std::int64_t start = 0; start < n; start += chunk) {
        const std::int64_t rows = std::min(chunk, n - start);
        auto logits = workspace.topRows(rows);
        parallel_gemm(logits, X.middleRows(start, rows), head.transpose());
        const std::int64_t row_chunks = chunk_count(rows, classes);
        parallel_chunks(row_chunks, [&](std::int64_t c) {
          const ChunkRange range = chunk_range(rows, row_chunks, c);
          for (std::int64_t i = range.begin; i < range.begin + range.size(); ++i) {
            auto z = logits.row(i);
            const std::int64_t y = label[start + i];
            if (y == attrs.ignore_index) {
                if (row_loss) row_loss[start + i] = 0.0;
                if (grads) z.setZero();
                continue;
            }
            const T max = z.maxCoeff();
            const T lse = max + std::log((z.array() - max).exp().sum());
            if (row_loss) {
                T loss = lse - (T(1) - eps) * z(y);
                if (eps != T(0)) loss -= eps_per_class * z.sum();
                row_loss[start + i] = static_cast<double>(loss);
            }
            if (!grads) continue;
            const T s = scale(start + i);
            z = ((z.array() - lse).exp() * s).matrix();
            z(y) -= (T(1) - eps) * s;
            if (eps != T(0)) z.array() -= eps_per_class * s;
          }
        });
        if (!grads) continue;
        if (dx != nullptr) {
            Eigen::Map<MatrixRM<T>> dx_rows(dx + start * width, rows, width);
            parallel_gemm(dx_rows, logits, head);
        }
        if (dw != nullptr) {
            Eigen::Map<MatrixRM<T>> dw_head(dw, classes, width);
            parallel_gemm(dw_head, logits.transpose(), X.middleRows(start, rows), /*accumulate=*/true);
        }
    }
}

}  // namespace

// x (N,E), weight (V_padded,E), labels (N) -> loss () or (N); saves what math::linear_cross_entropy_outputs says
// (ops/loss_math.h): [D, C] and, when the forward computes them, the gradients of the summed loss (dx, dW), which
// the backward scales by dy (or dy / D for the mean). Row sums in double.
Tensor linear_cross_entropy_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& labels = args.inputs[2];
    const std::int64_t n = x.size(0);
    check_lce_labels(labels, args.attrs.length, args.attrs.ignore_index);
    math::LinearCrossEntropyForward f = math::linear_cross_entropy_outputs(args);
    dispatch_floating(x.dtype(), "linear_cross_entropy", [&]<typename T>() {
        std::vector<double> row_loss(static_cast<std::size_t>(n));
        chunked_pass<T>(x, args.inputs[1], labels, args.attrs, [](std::int64_t) { return T(1); }, row_loss.data(),
                        f.grads ? f.dx.data<T>() : nullptr, f.grads ? f.dw.data<T>() : nullptr);
        const std::int64_t* label = labels.data<std::int64_t>();
        T* out = f.loss.data<T>();
        double total = 0.0, kept = 0.0;
        for (std::int64_t i = 0; i < n; ++i) {
            const double loss_i = row_loss[static_cast<std::size_t>(i)];
            total += loss_i;
            if (label[i] != args.attrs.ignore_index) kept += 1.0;
            if (args.attrs.reduction == Reduction::None) out[i] = static_cast<T>(loss_i);
        }
        f.sums.data<double>()[0] = kept;
        f.sums.data<double>()[1] = static_cast<double>(args.attrs.length);
        if (args.attrs.reduction == Reduction::Sum) out[0] = static_cast<T>(total);
        if (args.attrs.reduction == Reduction::Mean) out[0] = static_cast<T>(total / kept);  // 0/0: NaN, as PyTorch
    });
    return f.loss;
}

// dloss () or (N) -> dx, dW (labels get none). Mean/Sum with the forward's gradients: those times dy (/ D).
// Otherwise (None: a factor per row; or nothing saved) the chunks are recomputed with s_i = dy_i, dy or dy / D.
std::vector<Tensor> linear_cross_entropy_backward(const BackwardArgs& args) {
    math::LinearCrossEntropyBackward b = math::linear_cross_entropy_gradients(args);
    if (!b.any()) return std::move(b.grads);
    const Reduction reduction = args.attrs.reduction;
    const double kept = args.saved[0].data<double>()[0];
    dispatch_floating(args.inputs[0].dtype(), "linear_cross_entropy backward", [&]<typename T>() {
        const T* dy = args.grad_output.data<T>();
        const T factor = reduction == Reduction::Mean ? static_cast<T>(static_cast<double>(dy[0]) / kept)
                         : reduction == Reduction::Sum ? dy[0]
                                                       : T(0);
        if (b.from_saved) {
            for (std::size_t i = 0; i < 2; ++i) {
                if (!b.grads[i].defined()) continue;
                const Tensor& unit = args.saved[1 + i];
                Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(b.grads[i].data<T>(), unit.numel()) =
                    Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(unit.data<T>(), unit.numel()) * factor;
            }
            return;
        }
        check_lce_labels(args.inputs[2], args.attrs.length, args.attrs.ignore_index);
        const auto scale = [&](std::int64_t i) { return reduction == Reduction::None ? dy[i] : factor; };
        chunked_pass<T>(args.inputs[0], args.inputs[1], args.inputs[2], args.attrs, scale, nullptr,
                        b.grads[0].defined() ? b.grads[0].data<T>() : nullptr,
                        b.grads[1].defined() ? b.grads[1].data<T>() : nullptr);
    });
    return std::move(b.grads);
}

}  // namespace cpu

}  // namespace dyngrad
