// scaled_dot_product_attention on the GPU: the dispatch, which implementation runs a call. The kernels:
// ops/attention_simt.cu (SIMT, exact FMA), ops/attention_mma.cu (mma.sync tensor cores), ops/attention_cudnn.cu
// (cuDNN's fused flash attention); their launchers: ops/attention_launch.h. CPU reference: ops/attention.cpp; the
// contract (mask, dropout, empty rows): ops/attention.h.
//
// The selection policy (docs/ops.md, "scaled_dot_product_attention", says the same). Every path saves the same
// log-sum-exp, so a forward on one path and a backward on another agree.
//   Always first: a non-empty keep mask is checked for values other than 0/1; no slice or no query: nothing runs.
//   bf16 / f16:
//     1. cuDNN, where it takes the case: no dropout, no mask, D a multiple of 8 up to 128, cuDNN 9+, compute
//        capability 8.0+, 16-byte aligned operands and outputs, fewer than 2^31 elements per tensor, and an engine
//        config that finalizes for the shape (in deterministic mode, only one without cuDNN's nondeterministic note;
//        a refused shape is remembered). The backward computes dq, dk and dv together.
//     2. otherwise the mma.sync kernels (m16n8k16, f32 softmax and accumulators): the two-kernel backward (dk/dv,
//        then dq), deterministic. A device the tensor-core kernels were not compiled for: DeviceError.
//   f32:
//     1. the mma.sync kernels in 3xTF32 on compute capability 8.0+ (the tensor-core kernels compiled for the
//        device). The backward with dq and dk both wanted, outside deterministic mode (cuda::deterministic() false,
//        the default): one fused kernel adding dq with float atomics (not bitwise reproducible); otherwise the
//        deterministic two-kernel backward.
//     2. otherwise (older devices, or the SIMT override below) the SIMT kernels, exact float32 FMA, TILE 64.
//   f64: the SIMT kernels, TILE 32 (correctness, not speed).
// The backward without a query or a key gives zero gradients without a kernel.
// Overrides, for debugging and for the tests and benchmarks that compare paths (process-wide; the default is the
// policy above): set_attention_gpu_path(AttentionGpuPath::simt) runs f32 on the SIMT kernels, and
// set_attention_cudnn(false) keeps bf16/f16 on the mma.sync kernels; the environment variables
// DYNGRAD_ATTENTION_SIMT=1 and DYNGRAD_ATTENTION_CUDNN=0 set the same at start. attention_last_run() reports which
// implementation ran this thread's last bf16/f16 call and why not cuDNN; it selects nothing.
#include <cstdint>
#include <type_traits>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/attention.h"
#include "dyngrad/ops/attention_cudnn.h"
#include "dyngrad/ops/attention_geometry.h"
#include "dyngrad/ops/attention_launch.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda {

namespace {

attention::Params params_of(std::span<const Tensor> inputs, const AttentionGeometry& g) {
    attention::Params p{};
    p.heads = g.heads;
    p.queries = g.queries;
    p.keys = g.keys;
    p.head_dim = g.head_dim;
    p.scale_f = static_cast<float>(g.scale);
    p.scale_d = g.scale;
    p.causal = g.causal;
    p.dropout_p = g.dropout_p;
    p.kept_factor = 1.0 / (1.0 - g.dropout_p);
    p.seed = g.seed;
    p.mask = g.has_mask ? inputs[3].raw_data() : nullptr;
    for (int i = 0; i < 4; ++i) p.mask_stride[i] = g.mask_stride[i];
    return p;
}

// float32 runs on tensor cores unless attention_gpu_path() says simt (ops/attention.h).
bool use_tensor_cores(DType dtype) {
    return dtype == DType::f32 && attention_gpu_path() == AttentionGpuPath::tensor_cores && attention::mma_compiled();
}

// bf16/f16 run only on the tensor-core kernels (there is no 16-bit SIMT set; attention_gpu_path() chooses for
// float32).
void require_reduced_kernels(DType dtype) {
    if (!attention::mma_compiled())
        throw DeviceError(str("scaled_dot_product_attention: ", dtype_name(dtype), " needs the tensor-core kernels, ",
                              "which this build does not compile for the device (compute capability 8.0 or newer); ",
                              "convert the inputs to float32"));
}

// Calls fn.template operator()<T>() with the 16-bit GPU element type of a bf16/f16 dtype.
template <typename Fn> void dispatch_reduced(DType dtype, Fn&& fn) {
    if (dtype == DType::bf16)
        fn.template operator()<__nv_bfloat16>();
    else
        fn.template operator()<__half>();
}

// y (T) and lse (f32): by cuDNN's fused attention where it takes the case (ops/attention_cudnn.cu), else by
// the tensor-core (mma.sync) forward.
void launch_reduced_forward(std::span<const Tensor> inputs, const AttentionGeometry& g, const attention::Params& p,
                            Tensor& y, Tensor& lse, DeviceContext& ctx) {
    if (cudnn_attention_forward(inputs, g, y, lse, ctx)) return;
    require_reduced_kernels(y.dtype());
    dispatch_reduced(y.dtype(), [&]<typename T>() { attention::launch_mma_forward<T>(inputs, g, p, y, lse, ctx); });
}

// dq, dk, dv by cuDNN's fused attention where it takes the case (all three), else delta (f32), then dq (when
// defined) and dk, dv (when defined) by the tensor-core backward kernels. Both read the same saved lse.
void launch_reduced_backward(const BackwardArgs& args, const AttentionGeometry& g, const attention::Params& p,
                             const Tensor& lse, Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext& ctx) {
    const Tensor& grad_output = args.grad_output;
    if (cudnn_attention_backward(args.inputs, args.output, grad_output, g, lse, dq, dk, dv, ctx)) return;
    require_reduced_kernels(grad_output.dtype());
    dispatch_reduced(grad_output.dtype(), [&]<typename T>() {
        attention::launch_delta<T>(grad_output, args.output, delta, g, ctx);
        attention::launch_mma_backward<T>(args, g, p, lse, delta, dq, dk, dv, ctx);
    });
}

}  // namespace

bool attention_tensor_cores_compiled() { return attention::mma_compiled(); }

Tensor scaled_dot_product_attention_forward(const ForwardArgs& args) {
    const AttentionGeometry g = attention_geometry(args.inputs, args.attrs);
    const Tensor& q = args.inputs[0];
    DeviceContext& ctx = context_for(q);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, q.device());
    // bf16/f16: the log-sum-exp is saved in f32 (the backward's probabilities are exp(s − lse)).
    const bool reduced = is_reduced_precision(q.dtype());
    Tensor lse = Tensor::empty({g.batch, g.heads, g.queries}, reduced ? DType::f32 : args.out.dtype, q.device());
    args.saved.push_back(lse);
    if (g.has_mask && args.inputs[3].numel() > 0) attention::check_mask(args.inputs[3], ctx);
    if (g.slices() == 0 || g.queries == 0) return y;
    const attention::Params p = params_of(args.inputs, g);
    if (reduced) {
        launch_reduced_forward(args.inputs, g, p, y, lse, ctx);
        return y;
    }
    if (use_tensor_cores(q.dtype())) {
        attention::launch_mma_forward<float>(args.inputs, g, p, y, lse, ctx);
        return y;
    }
    dispatch_floating(q.dtype(), "scaled_dot_product_attention", [&]<typename Real>() {
        attention::launch_simt_forward<Real>(args.inputs, g, p, y, lse, ctx);
    });
    return y;
}

std::vector<Tensor> scaled_dot_product_attention_backward(const BackwardArgs& args) {
    const AttentionGeometry g = attention_geometry(args.inputs, args.attrs);
    const Tensor& dy = args.grad_output;
    DeviceContext& ctx = context_for(dy);
    std::vector<Tensor> grads(args.inputs.size());
    if (g.has_mask && args.needs_grad[3]) grads[3] = Tensor::zeros(args.inputs[3].shape(), dy.dtype(), dy.device());
    const bool want_q = args.needs_grad[0], want_kv = args.needs_grad[1] || args.needs_grad[2];
    if (!want_q && !want_kv) return grads;
    Tensor dq = want_q ? Tensor::empty(args.inputs[0].shape(), dy.dtype(), dy.device()) : Tensor();
    // dk and dv come from one kernel: both are computed when either is needed.
    Tensor dk = want_kv ? Tensor::empty(args.inputs[1].shape(), dy.dtype(), dy.device()) : Tensor();
    Tensor dv = want_kv ? Tensor::empty(args.inputs[2].shape(), dy.dtype(), dy.device()) : Tensor();
    const std::int64_t rows = g.slices() * g.queries;
    if (rows > 0 && g.keys > 0) {
        const attention::Params p = params_of(args.inputs, g);
        const Tensor& lse = args.saved[0];
        const bool reduced = is_reduced_precision(dy.dtype());
        Tensor delta = Tensor::empty({rows}, reduced ? DType::f32 : dy.dtype(), dy.device());
        const bool tensor_cores = use_tensor_cores(dy.dtype());
        if (reduced) {
            launch_reduced_backward(args, g, p, lse, delta, dq, dk, dv, ctx);
        } else {
            dispatch_floating(dy.dtype(), "scaled_dot_product_attention backward", [&]<typename Real>() {
                attention::launch_delta<Real>(dy, args.output, delta, g, ctx);
                if constexpr (std::is_same_v<Real, float>) {
                    if (tensor_cores) {
                        attention::launch_mma_backward<float>(args, g, p, lse, delta, dq, dk, dv, ctx);
                        return;
                    }
                }
                attention::launch_simt_backward<Real>(args, g, p, lse, delta, dq, dk, dv, ctx);
            });
        }
    } else {
        // No query or no key: every gradient is zero (and possibly empty).
        if (want_q) dq = Tensor::zeros(args.inputs[0].shape(), dy.dtype(), dy.device());
        if (want_kv) {
            dk = Tensor::zeros(args.inputs[1].shape(), dy.dtype(), dy.device());
            dv = Tensor::zeros(args.inputs[2].shape(), dy.dtype(), dy.device());
        }
    }
    if (args.needs_grad[0]) grads[0] = dq;
    if (args.needs_grad[1]) grads[1] = dk;
    if (args.needs_grad[2]) grads[2] = dv;
    return grads;
}

// qkv_attention: cuDNN reads q, k, v in place and writes y (B,T,E) where it takes the case (bf16/f16: the
// policy above); otherwise the layout copies (qkv_layout, eager) around scaled_dot_product_attention's path.
// Either way the saved lse is (B,H,T) f32 for 16-bit, so a forward on one and a backward on the other agree.
Tensor qkv_attention_forward(const ForwardArgs& args) {
    const Tensor& qkv = args.inputs[0];
    // (dropout: cuDNN refuses it, so nothing is allocated for it to refuse)
    if (is_reduced_precision(qkv.dtype()) && qkv.numel() > 0 && args.attrs.scalar == 0) {
        const AttentionGeometry g = qkv_attention_geometry(qkv, args.attrs);
        Tensor y = Tensor::empty(args.out.shape, args.out.dtype, qkv.device());
        Tensor lse = Tensor::empty({g.batch, g.heads, g.queries}, DType::f32, qkv.device());
        if (cudnn_qkv_attention_forward(qkv, g, y, lse, context_for(qkv))) {
            args.saved.push_back(lse);
            return y;
        }
    }
    return qkv_layout::forward_through(args, scaled_dot_product_attention_forward);
}

std::vector<Tensor> qkv_attention_backward(const BackwardArgs& args) {
    if (!args.needs_grad[0]) return {Tensor()};
    const Tensor& qkv = args.inputs[0];
    const Tensor& dy = args.grad_output;
    if (is_reduced_precision(qkv.dtype()) && qkv.numel() > 0) {
        const AttentionGeometry g = qkv_attention_geometry(qkv, args.attrs);
        Tensor dqkv;  // allocated once cuDNN takes the case
        if (cudnn_qkv_attention_backward(qkv, args.output, dy, g, args.saved[0], dqkv, context_for(dy))) return {dqkv};
    }
    return qkv_layout::backward_through(args, scaled_dot_product_attention_backward);
}

}  // namespace dyngrad::cuda
