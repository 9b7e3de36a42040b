// Attention: scaled_dot_product_attention's user functions, shape rule and CPU kernels (Eigen; the reference
// the GPU kernels of ops/attention.cu are checked against). The CPU forms each (b, h) slice's T×S score matrix
// whole: straightforward, and its memory is T·S per slice in flight, which is fine on the host.
#include "dyngrad/ops/attention.h"

#include <Eigen/Core>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>

#include "dyngrad/core/environment.h"
#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/ops/attention_geometry.h"
#include "dyngrad/ops/cpu_parallel.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/indexing.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/linalg.h"

namespace dyngrad {

namespace {

// Read by every GPU launch, set from any thread: atomic.
std::atomic<AttentionGpuPath>& gpu_path() {
    static std::atomic<AttentionGpuPath> path{
        environment("DYNGRAD_ATTENTION_SIMT") == "1" ? AttentionGpuPath::simt : AttentionGpuPath::tensor_cores};
    return path;
}

}  // namespace

void set_attention_gpu_path(AttentionGpuPath path) { gpu_path().store(path); }
AttentionGpuPath attention_gpu_path() { return gpu_path().load(); }
bool attention_uses_tensor_cores() {
#if DYNGRAD_WITH_CUDA
    return attention_gpu_path() == AttentionGpuPath::tensor_cores && cuda::attention_tensor_cores_compiled();
#else
    return false;
#endif
}

namespace {

std::atomic<bool>& cudnn_enabled() {
    static std::atomic<bool> enabled{environment("DYNGRAD_ATTENTION_CUDNN") != "0"};
    return enabled;
}

}  // namespace

void set_attention_cudnn(bool enabled) { cudnn_enabled().store(enabled); }
bool attention_cudnn_enabled() { return cudnn_enabled().load(); }
AttentionRunInfo attention_last_run() {
#if DYNGRAD_WITH_CUDA
    return cuda::attention_last_run_record();
#else
    return {};
#endif
}
std::string attention_cudnn_status() {
#if DYNGRAD_WITH_CUDA
    return cuda::attention_cudnn_status_line();
#else
    return "unavailable: a build without CUDA";
#endif
}

AttentionGeometry attention_geometry(std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& q = inputs[0];
    AttentionGeometry g;
    g.batch = q.size(0);
    g.heads = q.size(1);
    g.queries = q.size(2);
    g.head_dim = q.size(3);
    g.keys = inputs[1].size(2);
    g.scale = attrs.attention_scale.value_or(1.0 / std::sqrt(static_cast<double>(g.head_dim)));
    g.causal = attrs.is_causal;
    g.dropout_p = attrs.scalar;
    g.seed = attrs.seed;
    if (inputs.size() > 3) {
        g.has_mask = true;
        const Shape& m = inputs[3].shape();
        const std::size_t pad = 4 - m.size();  // leading axes the mask lacks broadcast
        std::int64_t stride = 1;
        for (std::size_t axis = 4; axis-- > pad;) {
            const std::int64_t size = m[axis - pad];
            g.mask_stride[axis] = size == 1 ? 0 : stride;
            stride *= size;
        }
    }
    return g;
}

AttentionGeometry qkv_attention_geometry(const Tensor& qkv, const OpAttrs& attrs) {
    AttentionGeometry g;
    g.batch = qkv.size(0);
    g.heads = attrs.num_heads;
    g.queries = g.keys = qkv.size(1);
    g.head_dim = qkv.size(2) / (3 * attrs.num_heads);
    g.scale = attrs.attention_scale.value_or(1.0 / std::sqrt(static_cast<double>(g.head_dim)));
    g.causal = attrs.is_causal;
    g.dropout_p = attrs.scalar;
    g.seed = attrs.seed;
    return g;
}

namespace qkv_layout {
std::array<Tensor, 3> unpack(const Tensor& qkv, std::int64_t heads) {
    const std::int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (3 * heads);
    const Tensor parts = permute(reshape(qkv, {B, T, 3, heads, D}), {2, 0, 3, 1, 4});  // (3,B,H,T,D)
    return {select(parts, 0, 0), select(parts, 0, 1), select(parts, 0, 2)};
}
Tensor merge_heads(const Tensor& y) {
    return reshape(permute(y, {0, 2, 1, 3}), {y.size(0), y.size(2), y.size(1) * y.size(3)});
}
Tensor split_heads(const Tensor& y, std::int64_t heads) {
    return permute(reshape(y, {y.size(0), y.size(1), heads, y.size(2) / heads}), {0, 2, 1, 3});
}
Tensor pack(const Tensor& dq, const Tensor& dk, const Tensor& dv) {
    const std::int64_t B = dq.size(0), H = dq.size(1), T = dq.size(2), D = dq.size(3);
    return reshape(permute(stack({dq, dk, dv}, 0), {1, 3, 0, 2, 4}), {B, T, 3 * H * D});  // (B,T,3,H,D)
}
Tensor forward_through(const ForwardArgs& args, ForwardFn sdpa_forward) {
    const std::array<Tensor, 3> operands = unpack(args.inputs[0], args.attrs.num_heads);
    const OutputSpec spec{operands[0].shape(), args.out.dtype};
    return merge_heads(
        sdpa_forward(ForwardArgs{OpType::ScaledDotProductAttention, operands, args.attrs, spec, args.saved}));
}
std::vector<Tensor> backward_through(const BackwardArgs& args, BackwardFn sdpa_backward) {
    const std::int64_t heads = args.attrs.num_heads;
    const std::array<Tensor, 3> operands = unpack(args.inputs[0], heads);
    const Tensor y = split_heads(args.output, heads);
    const Tensor dy = split_heads(args.grad_output, heads);
    const std::array<bool, 3> all{true, true, true};
    const std::vector<Tensor> grads = sdpa_backward(
        BackwardArgs{OpType::ScaledDotProductAttention, operands, y, dy, args.attrs, args.saved, all});
    return {pack(grads[0], grads[1], grads[2])};
}
}  // namespace qkv_layout

namespace infer {

// q (B,H,T,D), k (B,H,S,D), v (B,H,S,D)[, mask broadcastable to (B,H,T,S)] -> (B,H,T,D)
OutputSpec scaled_dot_product_attention(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    static constexpr const char* kRoles[] = {"q", "k", "v", "mask"};
    const Tensor& q = inputs[0];
    require_float(q, "q");
    for (std::size_t i = 1; i < inputs.size(); ++i) require_same_dtype(inputs[i], kRoles[i], q, "q");
    for (std::size_t i = 0; i < 3; ++i)
        if (inputs[i].rank() != 4)
            throw ShapeError(str(kRoles[i], " must be (B, H, ", i == 0 ? "T" : "S", ", D), got ",
                                 to_string(inputs[i].shape())));
    const Tensor& k = inputs[1];
    const Tensor& v = inputs[2];
    const auto qkv = [&] {
        return str("q ", to_string(q.shape()), ", k ", to_string(k.shape()), ", v ", to_string(v.shape()));
    };
    if (k.size(0) != q.size(0) || k.size(1) != q.size(1) || v.size(0) != q.size(0) || v.size(1) != q.size(1))
        throw ShapeError(str("q, k and v must share batch B and heads H: ", qkv()));
    if (k.size(3) != q.size(3) || v.size(3) != q.size(3))
        throw ShapeError(str("q, k and v must share the head dim D: ", qkv()));
    if (k.size(2) != v.size(2)) throw ShapeError(str("k and v must share the key length S: ", qkv()));
    const std::int64_t head_dim = q.size(3);
    if (head_dim < 1) throw ShapeError(str("the head dim D must be >= 1: ", qkv()));
    if (q.device().is_cuda() && head_dim > kAttentionMaxGpuHeadDim)
        throw ShapeError(str("the GPU kernel takes head dims up to ", kAttentionMaxGpuHeadDim, ", got D = ", head_dim,
                             " (", qkv(), "); the CPU takes any D"));
    if (inputs.size() > 3) {
        const Shape target{q.size(0), q.size(1), q.size(2), k.size(2)};
        const Shape& m = inputs[3].shape();
        bool fits = m.size() <= 4;
        for (std::size_t i = 0; fits && i < m.size(); ++i) {
            const std::int64_t want = target[4 - m.size() + i];
            fits = m[i] == want || m[i] == 1;
        }
        if (!fits)
            throw ShapeError(str("mask ", to_string(m), " does not broadcast to (B, H, T, S) = ", to_string(target)));
    }
    if (!(attrs.scalar >= 0 && attrs.scalar < 1))
        throw ValueError(str("dropout_p must be in [0, 1), got ", attrs.scalar));
    if (attrs.attention_scale && !std::isfinite(*attrs.attention_scale))
        throw ValueError(str("scale must be finite, got ", *attrs.attention_scale));
    return {q.shape(), q.dtype()};
}

// qkv (B,T,3·H·D) -> (B,T,H·D), H = num_heads
OutputSpec qkv_attention(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& qkv = inputs[0];
    require_float(qkv, "qkv");
    const std::int64_t heads = attrs.num_heads;
    if (heads < 1) throw ValueError(str("num_heads must be >= 1, got ", heads));
    if (qkv.rank() != 3) throw ShapeError(str("qkv must be (B, T, 3·E), got ", to_string(qkv.shape())));
    if (qkv.size(2) == 0 || qkv.size(2) % (3 * heads) != 0)
        throw ShapeError(str("qkv ", to_string(qkv.shape()), ": its last axis must be 3·num_heads·D with D >= 1 (num_heads ",
                             heads, ")"));
    const std::int64_t head_dim = qkv.size(2) / (3 * heads);
    if (qkv.device().is_cuda() && head_dim > kAttentionMaxGpuHeadDim)
        throw ShapeError(str("the GPU kernel takes head dims up to ", kAttentionMaxGpuHeadDim, ", got D = ", head_dim,
                             " (qkv ", to_string(qkv.shape()), ", num_heads ", heads, "); the CPU takes any D"));
    if (!(attrs.scalar >= 0 && attrs.scalar < 1))
        throw ValueError(str("dropout_p must be in [0, 1), got ", attrs.scalar));
    if (attrs.attention_scale && !std::isfinite(*attrs.attention_scale))
        throw ValueError(str("scale must be finite, got ", *attrs.attention_scale));
    return {{qkv.size(0), qkv.size(1), heads * head_dim}, qkv.dtype()};
}

}  // namespace infer

namespace cpu {

namespace {

template <typename Real> using Rows = Eigen::Map<const MatrixRM<Real>>;

// One (b, h) slice's operands: q (T,D), k and v (S,D), the mask's first element for this slice (or null).
template <typename Real>
struct Slice {
    Rows<Real> q, k, v;
    const Real* mask;
};

template <typename Real>
Slice<Real> slice_of(std::span<const Tensor> inputs, const AttentionGeometry& g, std::int64_t slice) {
    const std::int64_t T = g.queries, S = g.keys, D = g.head_dim;
    const Real* mask = nullptr;
    if (g.has_mask) {
        const std::int64_t b = slice / g.heads, h = slice % g.heads;
        mask = inputs[3].data<Real>() + b * g.mask_stride[0] + h * g.mask_stride[1];
    }
    return {Rows<Real>(inputs[0].data<Real>() + slice * T * D, T, D),
            Rows<Real>(inputs[1].data<Real>() + slice * S * D, S, D),
            Rows<Real>(inputs[2].data<Real>() + slice * S * D, S, D), mask};
}

// The slice's scores q·kᵀ·scale (T,S), −inf where a key does not take part (causal, mask). A mask value other
// than 0 or 1 is a ValueError: an additive PyTorch mask (0 / −inf) would otherwise be read inverted.
template <typename Real>
MatrixRM<Real> masked_scores(const Slice<Real>& x, const AttentionGeometry& g) {
    MatrixRM<Real> scores = (x.q * x.k.transpose()) * static_cast<Real>(g.scale);
    constexpr Real kMinusInf = -std::numeric_limits<Real>::infinity();
    for (std::int64_t t = 0; t < g.queries; ++t)
        for (std::int64_t s = 0; s < g.keys; ++s) {
            if (g.causal && s > t) scores(t, s) = kMinusInf;
            if (!x.mask) continue;
            const Real keep = x.mask[t * g.mask_stride[2] + s * g.mask_stride[3]];
            if (keep == Real(0))
                scores(t, s) = kMinusInf;
            else if (keep != Real(1))
                throw ValueError(str("mask values must be 0 (masked) or 1 (kept), got ", keep, " at query ", t,
                                     ", key ", s, "; for an additive mask pass (mask == 0)"));
        }
    return scores;
}

// Dropout's factor per probability of the slice (T,S): 1/(1 − p) where kept, 0 where dropped.
template <typename Real>
MatrixRM<Real> dropout_factors(const AttentionGeometry& g, std::int64_t slice) {
    const Real kept = static_cast<Real>(1.0 / (1.0 - g.dropout_p));
    MatrixRM<Real> factors(g.queries, g.keys);
    for (std::int64_t t = 0; t < g.queries; ++t)
        for (std::int64_t s = 0; s < g.keys; ++s)
            factors(t, s) = math::dropout_keep(g.seed, g.dropout_index(slice, t, s), g.dropout_p) ? kept : Real(0);
    return factors;
}

// The slices in parallel: each writes only its own rows, so results do not depend on the thread count.
template <typename Fn>
void for_each_slice(const AttentionGeometry& g, Fn&& fn) {
    const std::int64_t work = std::max<std::int64_t>(g.queries * g.keys * g.head_dim, 1);
    const std::int64_t slices = g.slices();
    const std::int64_t chunks = chunk_count(slices, work);
    parallel_chunks(chunks, [&](std::int64_t c) {
        const ChunkRange r = chunk_range(slices, chunks, c);
        for (std::int64_t slice = r.begin; slice < r.end; ++slice) fn(slice);
    });
}

}  // namespace

// q (B,H,T,D), k, v (B,H,S,D)[, mask] -> y (B,H,T,D). Saves the log-sum-exp of each query's masked scores
// (B,H,T), −inf for a query with no key, from which the backward recomputes the probabilities.
Tensor scaled_dot_product_attention_forward(const ForwardArgs& args) {
    const AttentionGeometry g = attention_geometry(args.inputs, args.attrs);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, args.inputs[0].device());
    Tensor lse = Tensor::empty({g.batch, g.heads, g.queries}, args.out.dtype, args.inputs[0].device());
    dispatch_floating(args.out.dtype, "scaled_dot_product_attention", [&]<typename Real>() {
        for_each_slice(g, [&](std::int64_t slice) {
            const Slice<Real> x = slice_of<Real>(args.inputs, g, slice);
            MatrixRM<Real> p = masked_scores(x, g);
            Real* lse_row = lse.data<Real>() + slice * g.queries;
            for (std::int64_t t = 0; t < g.queries; ++t) {
                auto row = p.row(t);
                const Real top = g.keys > 0 ? row.maxCoeff() : -std::numeric_limits<Real>::infinity();
                if (top == -std::numeric_limits<Real>::infinity()) {  // no key takes part
                    row.setZero();
                    lse_row[t] = top;
                    continue;
                }
                row = (row.array() - top).exp().matrix();
                const Real total = row.sum();
                row /= total;
                lse_row[t] = top + std::log(total);
            }
            if (g.dropout_p > 0) p = p.cwiseProduct(dropout_factors<Real>(g, slice));
            Eigen::Map<MatrixRM<Real>>(y.data<Real>() + slice * g.queries * g.head_dim, g.queries, g.head_dim)
                .noalias() = p * x.v;
        });
    });
    args.saved.push_back(lse);
    return y;
}

// dy (B,H,T,D) -> dq, dk, dv; the mask gets zeros. With P the probabilities, F the dropout factors, P̃ = P∘F:
//   dv = P̃ᵀ·dy,  dP = (dy·vᵀ)∘F,  dS = P∘(dP − rowsum(P∘dP)),  dq = dS·k·scale,  dk = dSᵀ·q·scale.
std::vector<Tensor> scaled_dot_product_attention_backward(const BackwardArgs& args) {
    const AttentionGeometry g = attention_geometry(args.inputs, args.attrs);
    const Tensor& dy = args.grad_output;
    std::vector<Tensor> grads(args.inputs.size());
    for (std::size_t i = 0; i < 3; ++i)
        if (args.needs_grad[i]) grads[i] = Tensor::empty(args.inputs[i].shape(), dy.dtype(), dy.device());
    if (g.has_mask && args.needs_grad[3]) grads[3] = Tensor::zeros(args.inputs[3].shape(), dy.dtype(), dy.device());
    if (!args.needs_grad[0] && !args.needs_grad[1] && !args.needs_grad[2]) return grads;
    const Tensor& lse = args.saved[0];
    dispatch_floating(dy.dtype(), "scaled_dot_product_attention backward", [&]<typename Real>() {
        const std::int64_t T = g.queries, S = g.keys, D = g.head_dim;
        const auto out_rows = [&](std::size_t input, std::int64_t slice, std::int64_t rows) {
            return Eigen::Map<MatrixRM<Real>>(grads[input].data<Real>() + slice * rows * D, rows, D);
        };
        for_each_slice(g, [&](std::int64_t slice) {
            const Slice<Real> x = slice_of<Real>(args.inputs, g, slice);
            const Rows<Real> dy_rows(dy.data<Real>() + slice * T * D, T, D);
            MatrixRM<Real> p = masked_scores(x, g);
            const Real* lse_row = lse.data<Real>() + slice * T;
            for (std::int64_t t = 0; t < T; ++t) {
                if (lse_row[t] == -std::numeric_limits<Real>::infinity())
                    p.row(t).setZero();
                else
                    p.row(t) = (p.row(t).array() - lse_row[t]).exp().matrix();  // exp(−inf) = 0 where masked
            }
            MatrixRM<Real> dp = dy_rows * x.v.transpose();
            if (g.dropout_p > 0) {
                const MatrixRM<Real> factors = dropout_factors<Real>(g, slice);
                if (args.needs_grad[2]) out_rows(2, slice, S).noalias() = p.cwiseProduct(factors).transpose() * dy_rows;
                dp = dp.cwiseProduct(factors);
            } else if (args.needs_grad[2]) {
                out_rows(2, slice, S).noalias() = p.transpose() * dy_rows;
            }
            const Eigen::Matrix<Real, Eigen::Dynamic, 1> row_dot = p.cwiseProduct(dp).rowwise().sum();
            const MatrixRM<Real> ds =
                (p.array() * (dp.colwise() - row_dot).array()).matrix() * static_cast<Real>(g.scale);
            if (args.needs_grad[0]) out_rows(0, slice, T).noalias() = ds * x.k;
            if (args.needs_grad[1]) out_rows(1, slice, S).noalias() = ds.transpose() * x.q;
        });
    });
    return grads;
}

// qkv_attention: scaled_dot_product_attention's kernels on the unpacked operands (the CPU is the reference, not
// the fast path). Saves what that forward saves (the lse, (B,H,T)).
Tensor qkv_attention_forward(const ForwardArgs& args) {
    return qkv_layout::forward_through(args, scaled_dot_product_attention_forward);
}

std::vector<Tensor> qkv_attention_backward(const BackwardArgs& args) {
    if (!args.needs_grad[0]) return {Tensor()};
    return qkv_layout::backward_through(args, scaled_dot_product_attention_backward);
}

}  // namespace cpu

// ---- Differentiable backward (graph/higher_order.h): attention through its math composition ----

// q (B,H,T,D), k, v (B,H,S,D)[, mask]: softmax(q·kᵀ·scale, masked) (∘ dropout factors) · v in primitive ops, on
// (B·H, ·, ·) slices. Which keys take part (causal, mask) and the dropout factors are constants (the same
// counter-based masks as the kernels, dropout_factors); a query with no key gets zeros, as the kernels give.
Var attention_composition(std::span<const Var> in, const OpAttrs& attrs) {
    std::vector<Tensor> values;
    for (const Var& v : in) values.push_back(v.value());
    const AttentionGeometry g = attention_geometry(values, attrs);
    const std::int64_t bh = g.slices(), T = g.queries, S = g.keys, D = g.head_dim;
    const std::vector<double> mask = g.has_mask ? values[3].to(Device::cpu()).to_vector() : std::vector<double>();
    std::vector<double> dropped(static_cast<std::size_t>(bh * T * S), 0.0), factor(dropped.size(), 1.0);
    for (std::int64_t slice = 0; slice < bh; ++slice) {
        const std::int64_t b = slice / g.heads, h = slice % g.heads;
        const cpu::MatrixRM<double> keep_factors =
            g.dropout_p > 0 ? cpu::dropout_factors<double>(g, slice) : cpu::MatrixRM<double>::Ones(T, S);
        for (std::int64_t t = 0; t < T; ++t) {
            bool any = false;
            for (std::int64_t s = 0; s < S; ++s) {
                bool takes_part = !(g.causal && s > t);
                if (g.has_mask)
                    takes_part = takes_part && mask[static_cast<std::size_t>(b * g.mask_stride[0] + h * g.mask_stride[1] +
                                                                            t * g.mask_stride[2] + s * g.mask_stride[3])] != 0.0;
                const auto i = static_cast<std::size_t>((slice * T + t) * S + s);
                dropped[i] = takes_part ? 0.0 : 1.0;
                factor[i] = keep_factors(t, s);
                any = any || takes_part;
            }
            if (!any)  // softmax over a row of −inf would be NaN: keep the row, zero its probabilities
                for (std::int64_t s = 0; s < S; ++s) {
                    const auto i = static_cast<std::size_t>((slice * T + t) * S + s);
                    dropped[i] = 0.0;
                    factor[i] = 0.0;
                }
        }
    }
    const Var& q = in[0];
    const auto constant = [&](const std::vector<double>& v) {
        return q.graph().constant(Tensor::from_vector(v, {bh, T, S}, q.dtype(), q.device()));
    };
    const Var scores = mul_scalar(matmul(reshape(q, {bh, T, D}), transpose(reshape(in[1], {bh, S, D}))), g.scale);
    const Var p = mul(softmax(masked_fill(scores, constant(dropped), -std::numeric_limits<double>::infinity()), -1),
                      constant(factor));
    return reshape(matmul(p, reshape(in[2], {bh, S, D})), {g.batch, g.heads, T, D});
}

// ---- qkv_attention's composition: the fused-kernel check (graph/fusion_check.h) and create_graph ----

namespace {

// The layout ops around scaled_dot_product_attention that qkv_attention replaces (ops/attention.h).
Var qkv_attention_composition(std::span<const Var> in, const OpAttrs& attrs) {
    const Var& qkv = in[0];
    const std::int64_t B = qkv.shape()[0], T = qkv.shape()[1], H = attrs.num_heads, D = qkv.shape()[2] / (3 * H);
    const Var parts = permute(reshape(qkv, {B, T, 3, H, D}), {2, 0, 3, 1, 4});
    const AttentionOptions options{.is_causal = attrs.is_causal, .dropout_p = attrs.scalar,
                                   .scale = attrs.attention_scale, .seed = attrs.seed};
    const Var y = scaled_dot_product_attention(select(parts, 0, 0), select(parts, 0, 1), select(parts, 0, 2), options);
    return reshape(permute(y, {0, 2, 1, 3}), {B, T, H * D});
}

}  // namespace

namespace unfused {
const UnfusedComposition qkv_attention{qkv_attention_composition};
}  // namespace unfused

}  // namespace dyngrad
