// The op table: one row per OpType, in tag order (checked at compile time below). A row is the whole op: its
// name, arity, shape rule, CPU and CUDA kernels, the cases every check runs it on (ops/op_cases.cpp), the
// attributes it reads (from the field table of graph/op_def.h), its autocast policy, the PyTorch expression it
// matches, and, for a fused op, its unfused composition (ops/unfused.cpp). The tests, dyngrad-verify, the Python
// keyword parser, the golden export and the fuzzer all read it from here.
#include <array>

#include "dyngrad/graph/custom_op.h"
#include "dyngrad/ops/argument_rules.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/op_cases.h"

namespace dyngrad {

namespace {

using namespace op_cases;

// Autocast policies, stated by every row (docs/mixed_precision.md gives the reasons): products on tensor cores in
// the autocast dtype, long sums and error-amplifying functions in f32, the rest in their inputs' dtype.
constexpr AutocastPolicy kReduced = AutocastPolicy::Reduced;
constexpr AutocastPolicy kFloat32 = AutocastPolicy::Float32;
constexpr AutocastPolicy kFollow = AutocastPolicy::Follow;

// A row's CUDA kernels: `...` in a build with CUDA, none without (where its cuda:: names do not exist).
#if DYNGRAD_WITH_CUDA
#define DG_IF_CUDA(...) __VA_ARGS__
#else
#define DG_IF_CUDA(...) BackendKernels{}
#endif
#define DG_CUDA_KERNELS(forward, backward) DG_IF_CUDA(BackendKernels{cuda::forward, cuda::backward})
// Kernels written once for every backend (in namespace dyngrad), on top of per-backend primitives.
#define DG_CUDA_KERNELS_SHARED(forward, backward) DG_IF_CUDA(BackendKernels{forward, backward})
// CUDA kernels that take bf16/f16 themselves (BackendKernels::native_reduced): no conversion through f32.
#define DG_CUDA_KERNELS_NATIVE(forward, backward) DG_IF_CUDA(BackendKernels{cuda::forward, cuda::backward, true})
// A native CUDA forward with a backward shared by every backend (in namespace dyngrad).
#define DG_CUDA_KERNELS_FORWARD_NATIVE(forward, backward) DG_IF_CUDA(BackendKernels{cuda::forward, backward, true})
#define DG_CUDA_KERNELS_SHARED_NATIVE(forward, backward) DG_IF_CUDA(BackendKernels{forward, backward, true})

constexpr BackendKernels kCpuUnary{cpu::unary_forward, cpu::unary_backward};
constexpr BackendKernels kCpuBinary{cpu::binary_forward, cpu::binary_backward};
constexpr BackendKernels kCpuReduce{cpu::reduce_forward, cpu::reduce_backward};
constexpr BackendKernels kCpuSoftmax{cpu::softmax_forward, cpu::softmax_backward};
// Native bf16/f16 on the GPU (BackendKernels::native_reduced): elementwise, comparisons, selection, reductions,
// layout and the row norms. Everything else (and every CPU kernel but the byte copies) runs through f32
// (graph/through_f32.h).
constexpr BackendKernels kCudaUnary = DG_CUDA_KERNELS_NATIVE(unary_forward, unary_backward);
constexpr BackendKernels kCudaBinary = DG_CUDA_KERNELS_NATIVE(binary_forward, binary_backward);
constexpr BackendKernels kCudaReduce = DG_CUDA_KERNELS_NATIVE(reduce_forward, reduce_backward);
constexpr BackendKernels kCudaSoftmax = DG_CUDA_KERNELS(softmax_forward, softmax_backward);
constexpr BackendKernels kCpuClassLoss{cpu::cross_entropy_forward, cpu::cross_entropy_backward};
constexpr BackendKernels kCudaClassLoss = DG_CUDA_KERNELS(cross_entropy_forward, cross_entropy_backward);
constexpr BackendKernels kCpuPointLoss{cpu::pointwise_loss_forward, cpu::pointwise_loss_backward};
constexpr BackendKernels kCudaPointLoss = DG_CUDA_KERNELS(pointwise_loss_forward, pointwise_loss_backward);
// Metadata only, or Tensor::to on every backend: every dtype natively.
constexpr BackendKernels kReshape{reshape_forward, reshape_backward, true};
constexpr BackendKernels kCast{cast_forward, cast_backward, true};
constexpr BackendKernels kCpuPool{cpu::pool2d_forward, cpu::pool2d_backward};
constexpr BackendKernels kCpuSelect{cpu::select_forward, cpu::select_backward};
constexpr BackendKernels kCudaSelect = DG_CUDA_KERNELS_NATIVE(select_forward, select_backward);
// max/avg pooling: cuDNN's descriptors take bf16/f16 with float scaling (ops/pool.cu): no conversions through f32.
constexpr BackendKernels kCudaPool = DG_CUDA_KERNELS_NATIVE(pool2d_forward, pool2d_backward);
constexpr BackendKernels kCpuRowNorm{cpu::row_norm_forward, cpu::row_norm_backward};
// layer_norm/rms_norm: bf16/f16 values computed in f32, statistics saved in f32 (ops/norm.cu).
constexpr BackendKernels kCudaRowNorm = DG_CUDA_KERNELS_NATIVE(row_norm_forward, row_norm_backward);
// Not differentiable (OpDef::differentiable = false): forward kernels only.
constexpr BackendKernels kCpuCompare{cpu::binary_forward, nullptr};
constexpr BackendKernels kArgReduce{arg_reduce_forward, nullptr};  // every backend, through max's kernels
constexpr BackendKernels kSortIndices{sort_indices_forward, nullptr};  // every backend, through sort_lines
constexpr BackendKernels kSortIndicesCuda = DG_CUDA_KERNELS_SHARED(sort_indices_forward, nullptr);
constexpr BackendKernels kCudaCompare = DG_IF_CUDA(BackendKernels{cuda::binary_forward, nullptr, true});
// neg and max: native on the GPU
constexpr BackendKernels kCudaArgReduce = DG_CUDA_KERNELS_SHARED_NATIVE(arg_reduce_forward, nullptr);
constexpr BackendKernels kCudaMultinomial = DG_IF_CUDA(BackendKernels{cuda::multinomial_forward, nullptr});
constexpr bool kNotDifferentiable = false;
// The differentiable backwards of the families whose compositions take the op (ops/differentiable_backward.h).
constexpr DiffBackwardFn loss_differentiable_backward = composition_differentiable_backward<loss_composition>;
constexpr DiffBackwardFn norm_differentiable_backward = composition_differentiable_backward<norm_composition>;
constexpr DiffBackwardFn pool_differentiable_backward = composition_differentiable_backward<pool_composition>;
// narrow: byte copies on every backend; its backward adds into the gradient so far in place (graph/op_def.h)
constexpr BackendKernels kNarrow{narrow_forward, narrow_backward, true, /*accumulates_in_place=*/true};
constexpr BackendKernels kCudaNarrow = DG_IF_CUDA(kNarrow);

constexpr std::array<OpDef, kOpTypeCount> kTable = {{
    {OpType::Leaf, "leaf", 0, nullptr, {}, {}, no_cases,
     kNoAttrs, kFollow, nullptr},
    {OpType::Add, "add", 2, infer::broadcast, kCpuBinary, kCudaBinary, binary_cases,
     kNoAttrs, kFollow, "torch.add(a, b)", 0, true, 0, nullptr, binary_differentiable_backward, &math::formula::add},
    {OpType::Sub, "sub", 2, infer::broadcast, kCpuBinary, kCudaBinary, binary_cases,
     kNoAttrs, kFollow, "torch.sub(a, b)", 0, true, 0, nullptr, binary_differentiable_backward, &math::formula::sub},
    {OpType::Mul, "mul", 2, infer::broadcast, kCpuBinary, kCudaBinary, binary_cases,
     kNoAttrs, kFollow, "torch.mul(a, b)", 0, true, 0, nullptr, binary_differentiable_backward, &math::formula::mul},
    {OpType::Div, "div", 2, infer::broadcast, kCpuBinary, kCudaBinary, binary_cases,
     kNoAttrs, kFollow, "torch.div(a, b)", 0, true, 0, nullptr, binary_differentiable_backward, &math::formula::div},
    {OpType::Minimum, "minimum", 2, infer::broadcast, kCpuBinary, kCudaBinary, min_max_cases,
     kNoAttrs, kFollow, "torch.minimum(a, b)", 0, true, 0, nullptr, binary_differentiable_backward, &math::formula::minimum},
    {OpType::Maximum, "maximum", 2, infer::broadcast, kCpuBinary, kCudaBinary, min_max_cases,
     kNoAttrs, kFollow, "torch.maximum(a, b)", 0, true, 0, nullptr, binary_differentiable_backward, &math::formula::maximum},
    {OpType::Eq, "eq", 2, infer::broadcast, kCpuCompare, kCudaCompare, compare_cases,
     kNoAttrs, kFollow, "torch.eq(a, b).to(a.dtype)", 0, kNotDifferentiable, 0, nullptr, nullptr, &math::formula::eq},
    {OpType::Ne, "ne", 2, infer::broadcast, kCpuCompare, kCudaCompare, compare_cases,
     kNoAttrs, kFollow, "torch.ne(a, b).to(a.dtype)", 0, kNotDifferentiable, 0, nullptr, nullptr, &math::formula::ne},
    {OpType::Lt, "lt", 2, infer::broadcast, kCpuCompare, kCudaCompare, compare_cases,
     kNoAttrs, kFollow, "torch.lt(a, b).to(a.dtype)", 0, kNotDifferentiable, 0, nullptr, nullptr, &math::formula::lt},
    {OpType::Le, "le", 2, infer::broadcast, kCpuCompare, kCudaCompare, compare_cases,
     kNoAttrs, kFollow, "torch.le(a, b).to(a.dtype)", 0, kNotDifferentiable, 0, nullptr, nullptr, &math::formula::le},
    {OpType::Gt, "gt", 2, infer::broadcast, kCpuCompare, kCudaCompare, compare_cases,
     kNoAttrs, kFollow, "torch.gt(a, b).to(a.dtype)", 0, kNotDifferentiable, 0, nullptr, nullptr, &math::formula::gt},
    {OpType::Ge, "ge", 2, infer::broadcast, kCpuCompare, kCudaCompare, compare_cases,
     kNoAttrs, kFollow, "torch.ge(a, b).to(a.dtype)", 0, kNotDifferentiable, 0, nullptr, nullptr, &math::formula::ge},
    {OpType::AddScalar, "add_scalar", 1, infer::same_as_first, kCpuUnary, kCudaUnary, add_scalar_cases,
     reads("scalar"), kFollow, "x + scalar", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::add_scalar},
    {OpType::MulScalar, "mul_scalar", 1, infer::same_as_first, kCpuUnary, kCudaUnary, mul_scalar_cases,
     reads("scalar"), kFollow, "x * scalar", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::mul_scalar},
    {OpType::PowScalar, "pow", 1, infer::same_as_first, kCpuUnary, kCudaUnary, pow_cases,
     reads("scalar"), kFloat32, "torch.pow(x, scalar)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::pow_scalar},
    {OpType::Clamp, "clamp", 1, infer::same_as_first, kCpuUnary, kCudaUnary, clamp_cases,
     reads("clamp_min", "clamp_max"), kFollow, "torch.clamp(x, min=clamp_min, max=clamp_max)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::clamp},
    {OpType::Cast, "cast", 1, infer::cast, kCast, kCast, cast_cases,
     reads("dtype"), kFollow, "x.to(dtype)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::cast},
    {OpType::LeakyRelu, "leaky_relu", 1, infer::same_as_first, kCpuUnary, kCudaUnary, leaky_relu_cases,
     reads("scalar"), kFollow, "torch.nn.functional.leaky_relu(x, negative_slope=scalar)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::leaky_relu},
    {OpType::Elu, "elu", 1, infer::same_as_first, kCpuUnary, kCudaUnary, elu_cases,
     reads("scalar"), kFollow, "torch.nn.functional.elu(x, alpha=scalar)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::elu},
    {OpType::ClippedRelu, "clipped_relu", 1, infer::same_as_first, kCpuUnary, kCudaUnary, clipped_relu_cases,
     reads("scalar"), kFollow, "torch.nn.functional.hardtanh(x, 0, scalar)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::clipped_relu},
    {OpType::Gelu, "gelu", 1, infer::same_as_first, kCpuUnary, kCudaUnary, gelu_cases,
     reads("gelu_approximation"), kFollow, "torch.nn.functional.gelu(x, approximate=gelu_approximation)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::gelu},
    {OpType::Neg, "neg", 1, infer::same_as_first, kCpuUnary, kCudaUnary, neg_cases,
     kNoAttrs, kFollow, "torch.neg(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::neg},
    {OpType::Exp, "exp", 1, infer::same_as_first, kCpuUnary, kCudaUnary, exp_cases,
     kNoAttrs, kFloat32, "torch.exp(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::exp},
    {OpType::Log, "log", 1, infer::same_as_first, kCpuUnary, kCudaUnary, positive_cases,
     kNoAttrs, kFloat32, "torch.log(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::log},
    {OpType::Sqrt, "sqrt", 1, infer::same_as_first, kCpuUnary, kCudaUnary, positive_cases,
     kNoAttrs, kFollow, "torch.sqrt(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::sqrt},
    {OpType::Abs, "abs", 1, infer::same_as_first, kCpuUnary, kCudaUnary, kink_cases,
     kNoAttrs, kFollow, "torch.abs(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::abs},
    {OpType::Sin, "sin", 1, infer::same_as_first, kCpuUnary, kCudaUnary, smooth_cases,
     kNoAttrs, kFollow, "torch.sin(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::sin},
    {OpType::Cos, "cos", 1, infer::same_as_first, kCpuUnary, kCudaUnary, smooth_cases,
     kNoAttrs, kFollow, "torch.cos(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::cos},
    {OpType::Relu, "relu", 1, infer::same_as_first, kCpuUnary, kCudaUnary, kink_cases,
     kNoAttrs, kFollow, "torch.relu(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::relu},
    {OpType::Sigmoid, "sigmoid", 1, infer::same_as_first, kCpuUnary, kCudaUnary, smooth_cases,
     kNoAttrs, kFollow, "torch.sigmoid(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::sigmoid},
    {OpType::Tanh, "tanh", 1, infer::same_as_first, kCpuUnary, kCudaUnary, smooth_cases,
     kNoAttrs, kFollow, "torch.tanh(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::tanh},
    {OpType::Softplus, "softplus", 1, infer::same_as_first, kCpuUnary, kCudaUnary, smooth_cases,
     kNoAttrs, kFloat32, "torch.nn.functional.softplus(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::softplus},
    {OpType::Silu, "silu", 1, infer::same_as_first, kCpuUnary, kCudaUnary, smooth_cases,
     kNoAttrs, kFollow, "torch.nn.functional.silu(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::silu},
    {OpType::LogSigmoid, "log_sigmoid", 1, infer::same_as_first, kCpuUnary, kCudaUnary, smooth_cases,
     kNoAttrs, kFollow, "torch.nn.functional.logsigmoid(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::log_sigmoid},
    {OpType::Softsign, "softsign", 1, infer::same_as_first, kCpuUnary, kCudaUnary, smooth_cases,
     kNoAttrs, kFollow, "torch.nn.functional.softsign(x)", 0, true, 0, nullptr, unary_differentiable_backward, &math::formula::softsign},
    {OpType::Softmax, "softmax", 1, infer::along_axis, kCpuSoftmax, kCudaSoftmax, softmax_cases,
     reads("axis"), kFloat32, "torch.softmax(x, dim=axis)", 0, true, 0, nullptr, softmax_differentiable_backward},
    {OpType::LogSoftmax, "log_softmax", 1, infer::along_axis, kCpuSoftmax, kCudaSoftmax, softmax_cases,
     reads("axis"), kFloat32, "torch.log_softmax(x, dim=axis)", 0, true, 0, nullptr, softmax_differentiable_backward},
    {OpType::Matmul, "matmul", 2, infer::matmul, {cpu::matmul_forward, cpu::matmul_backward},
     DG_CUDA_KERNELS_NATIVE(matmul_forward, matmul_backward), matmul_cases,
     kNoAttrs, kReduced, "torch.matmul(a, b)", 0, true, 0, nullptr, matmul_differentiable_backward},
    {OpType::Linear, "linear", 3, infer::linear, {cpu::linear_forward, cpu::linear_backward},
     DG_CUDA_KERNELS_NATIVE(linear_forward, linear_backward), linear_cases,
     reads("activation"), kReduced, "activation(torch.nn.functional.linear(x, weight, bias))", 0, true, 0,
     &unfused::linear, linear_differentiable_backward},
    {OpType::Transpose, "transpose", 1, infer::transpose, {transpose_forward, transpose_backward},
     DG_CUDA_KERNELS_SHARED_NATIVE(transpose_forward, transpose_backward), transpose_cases,
     reads("axes"), kFollow, "torch.transpose(x, axes[0], axes[1])", 0, true, 0, nullptr, transpose_differentiable_backward},
    {OpType::Reshape, "reshape", 1, infer::reshape, kReshape, kReshape, reshape_cases,
     reads("shape"), kFollow, "torch.reshape(x, shape)", 0, true, 0, nullptr, reshape_differentiable_backward},
    {OpType::Sum, "sum", 1, infer::reduce_axes, kCpuReduce, kCudaReduce, reduce_cases,
     reads("axes", "keepdim"), kFloat32, "torch.sum(x, dim=axes, keepdim=keepdim)", 0, true, 0, nullptr, reduce_differentiable_backward},
    {OpType::Mean, "mean", 1, infer::reduce_axes, kCpuReduce, kCudaReduce, reduce_cases,
     reads("axes", "keepdim"), kFloat32, "torch.mean(x, dim=axes, keepdim=keepdim)", 0, true, 0, nullptr, reduce_differentiable_backward},
    {OpType::Max, "max", 1, infer::reduce_axis, {cpu::max_forward, cpu::max_backward},
     DG_CUDA_KERNELS_NATIVE(max_forward, max_backward), max_cases,
     reads("axis", "keepdim"), kFollow, "torch.max(x, dim=axis, keepdim=keepdim).values", 0, true, 0, nullptr, max_differentiable_backward},
    // Written once for every backend over its max, sum and elementwise kernels (ops/reduce.cpp): no kernel of its own.
    {OpType::LogSumExp, "logsumexp", 1, infer::reduce_axes, {logsumexp_forward, logsumexp_backward},
     DG_CUDA_KERNELS_SHARED(logsumexp_forward, logsumexp_backward), reduce_cases,
     reads("axes", "keepdim"), kFloat32, "torch.logsumexp(x, dim=axes, keepdim=keepdim)", 0, true, 0, nullptr,
     logsumexp_differentiable_backward},
    {OpType::ArgMax, "argmax", 1, infer::arg_reduce, kArgReduce, kCudaArgReduce, arg_reduce_cases,
     reads("axis", "keepdim"), kFollow, "torch.argmax(x, dim=axis, keepdim=keepdim)", 0, kNotDifferentiable},
    {OpType::ArgMin, "argmin", 1, infer::arg_reduce, kArgReduce, kCudaArgReduce, arg_reduce_cases,
     reads("axis", "keepdim"), kFollow, "torch.argmin(x, dim=axis, keepdim=keepdim)", 0, kNotDifferentiable},
    {OpType::CrossEntropy, "cross_entropy", 3, infer::cross_entropy, kCpuClassLoss, kCudaClassLoss,
     cross_entropy_cases, reads("reduction", "ignore_index", "label_smoothing"), kFloat32,
     "torch.nn.functional.cross_entropy(x, target, weight, ignore_index=ignore_index, reduction=reduction, "
     "label_smoothing=label_smoothing)",
     /*optional_inputs=*/1, true, 0, &unfused::cross_entropy, loss_differentiable_backward},
    {OpType::MseLoss, "mse_loss", 2, infer::mse_loss, {cpu::mse_loss_forward, cpu::mse_loss_backward},
     DG_CUDA_KERNELS(mse_loss_forward, mse_loss_backward), mse_cases,
     kNoAttrs, kFloat32, "torch.nn.functional.mse_loss(prediction, target)", 0, true, 0, nullptr, loss_differentiable_backward},
    // label_smoothing: read to refuse anything but 0 (a ValueError naming cross_entropy, which takes it)
    {OpType::NllLoss, "nll_loss", 3, infer::cross_entropy, kCpuClassLoss, kCudaClassLoss, nll_loss_cases,
     reads("reduction", "ignore_index", "label_smoothing"), kFloat32,
     "torch.nn.functional.nll_loss(x, target, weight, ignore_index=ignore_index, reduction=reduction)",
     /*optional_inputs=*/1, true, 0, nullptr, loss_differentiable_backward},
    {OpType::BceWithLogits, "binary_cross_entropy_with_logits", 4, infer::bce_with_logits, kCpuPointLoss,
     kCudaPointLoss, bce_with_logits_cases, reads("reduction"), kFloat32,
     "torch.nn.functional.binary_cross_entropy_with_logits(x, target, weight, pos_weight=pos_weight, "
     "reduction=reduction)",
     /*optional_inputs=*/2, true, 0, nullptr, loss_differentiable_backward, nullptr, bce_with_logits_arguments},
    {OpType::L1Loss, "l1_loss", 2, infer::pointwise_loss, kCpuPointLoss, kCudaPointLoss, l1_loss_cases,
     reads("reduction"), kFloat32, "torch.nn.functional.l1_loss(prediction, target, reduction=reduction)", 0, true, 0, nullptr, loss_differentiable_backward},
    {OpType::SmoothL1Loss, "smooth_l1_loss", 2, infer::pointwise_loss, kCpuPointLoss, kCudaPointLoss,
     smooth_l1_loss_cases, reads("scalar", "reduction"), kFloat32,
     "torch.nn.functional.smooth_l1_loss(prediction, target, reduction=reduction, beta=scalar)", 0, true, 0, nullptr, loss_differentiable_backward},
    // The LM head fused with its loss, in chunks of rows (ops/linear_cross_entropy.h): the forward also computes dx
    // and dW, which the backward scales. Reduced under autocast, as linear: x and the weight arrive in bf16/f16 and
    // the GEMMs run on tensor cores, as PyTorch's autocast runs the head GEMM of F.cross_entropy(F.linear(..)). The
    // loss is float32 for 16-bit inputs, autocast or not (infer::linear_cross_entropy; docs/mixed_precision.md): on
    // the GPU the logits GEMM writes 16-bit logits read into f32, the softmax and loss are f32 as cross_entropy's, dlogits is in the
    // inputs' dtype and dW is summed over the chunks in f32 (ops/loss.cu). dx and dW come back in the inputs'
    // dtype. The CPU runs 16-bit inputs through f32 (graph/through_f32.h), with the same dtypes out.
    {OpType::LinearCrossEntropy, "linear_cross_entropy", 3, infer::linear_cross_entropy,
     {cpu::linear_cross_entropy_forward, cpu::linear_cross_entropy_backward},
     DG_CUDA_KERNELS_NATIVE(linear_cross_entropy_forward, linear_cross_entropy_backward), linear_cross_entropy_cases,
     reads("reduction", "ignore_index", "label_smoothing", "length", "save_for_backward"), kReduced,
     "torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, weight[:length]), labels, "
     "ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)",
     0, true, 0, &unfused::linear_cross_entropy, unfused_differentiable_backward<unfused::linear_cross_entropy>, nullptr,
     linear_cross_entropy_arguments},
    {OpType::Conv2d, "conv2d", 3, infer::conv2d, {cpu::conv2d_forward, cpu::conv2d_backward},
     DG_CUDA_KERNELS_NATIVE(conv2d_forward, conv2d_backward), conv2d_cases,
     reads("stride", "padding", "dilation", "groups", "activation"), kReduced,
     "activation(torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups))",
     /*optional_inputs=*/1, true, 0, &unfused::conv2d, composition_differentiable_backward<conv2d_composition>},
    {OpType::MaxPool2d, "max_pool2d", 1, infer::pool2d, kCpuPool, kCudaPool, pool2d_cases,
     reads("kernel", "stride", "padding"), kFollow, "torch.nn.functional.max_pool2d(x, kernel, stride, padding)", 0, true, 0, nullptr, pool_differentiable_backward,
     nullptr, pool_arguments},
    {OpType::AvgPool2d, "avg_pool2d", 1, infer::pool2d, kCpuPool, kCudaPool, pool2d_cases,
     reads("kernel", "stride", "padding"), kFollow,
     "torch.nn.functional.avg_pool2d(x, kernel, stride, padding, count_include_pad=True)", 0, true, 0, nullptr, pool_differentiable_backward,
     nullptr, pool_arguments},
    {OpType::BatchNorm, "batch_norm", 5, infer::batch_norm, {cpu::batch_norm_forward, cpu::batch_norm_backward},
     DG_CUDA_KERNELS(batch_norm_forward, batch_norm_backward), batch_norm_cases,
     reads("training", "eps", "momentum"), kFloat32,
     "torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)", 0, true,
     /*updates_inputs=*/(1u << 3) | (1u << 4), nullptr, norm_differentiable_backward},  // running_mean, running_var
    {OpType::LayerNorm, "layer_norm", 3, infer::row_norm, kCpuRowNorm, kCudaRowNorm, layer_norm_cases,
     reads("shape", "eps"), kFloat32, "torch.nn.functional.layer_norm(x, shape, weight, bias, eps)",
     /*optional_inputs=*/2, true, 0, nullptr, norm_differentiable_backward, nullptr, layer_norm_arguments},
    {OpType::RmsNorm, "rms_norm", 2, infer::row_norm, kCpuRowNorm, kCudaRowNorm, rms_norm_cases,
     reads("shape", "eps"), kFloat32, "torch.nn.functional.rms_norm(x, shape, weight, eps)",
     /*optional_inputs=*/1, true, 0, nullptr, norm_differentiable_backward, nullptr, rms_norm_arguments},
    // The seed input is optional; the CUDA forward takes bf16/f16 natively (the backward is that forward on dy).
    {OpType::Dropout, "dropout", 2, infer::dropout, {cpu::dropout_forward, dropout_backward},
     DG_CUDA_KERNELS_FORWARD_NATIVE(dropout_forward, dropout_backward), dropout_cases,
     reads("scalar", "training", "seed"), kFollow,
     "torch.nn.functional.dropout(x, p=scalar, training=training), with dyngrad's keep mask from seed",
     /*optional_inputs=*/1, true, 0, nullptr, dropout_differentiable_backward, &math::formula::dropout},
    // Custom ops carry their own definitions (graph/custom_op.h); op_def(op, attrs) finds them.
    {OpType::Custom, "custom", 0, nullptr, {}, {}, no_cases,
     kNoAttrs, kFollow, nullptr},
    // narrow, concat: byte copies by element size on both backends, so every dtype natively
    {OpType::Narrow, "narrow", 1, infer::narrow, kNarrow, kCudaNarrow, narrow_cases,
     reads("axis", "start", "length"), kFollow, "torch.narrow(x, axis, start, length)", 0, true, 0, nullptr, narrow_differentiable_backward},
    {OpType::Concat, "concat", kVariadic, infer::concat, {concat_forward, concat_backward, true},
     DG_CUDA_KERNELS_SHARED_NATIVE(concat_forward, concat_backward), concat_cases,
     reads("axis"), kFollow, "torch.cat(xs, dim=axis)", 0, true, 0, nullptr, concat_differentiable_backward},
    // permute, expand: copies by element size on both backends too
    {OpType::Permute, "permute", 1, infer::permute, {permute_forward, permute_backward, true},
     DG_CUDA_KERNELS_SHARED_NATIVE(permute_forward, permute_backward), permute_cases,
     reads("axes"), kFollow, "x.permute(axes)", 0, true, 0, nullptr, permute_differentiable_backward},
    {OpType::Expand, "expand", 1, infer::expand, {expand_forward, expand_backward, true},
     DG_CUDA_KERNELS_SHARED_NATIVE(expand_forward, expand_backward), expand_cases,
     reads("shape"), kFollow, "x.expand(shape)", 0, true, 0, nullptr, expand_differentiable_backward},
    {OpType::Embedding, "embedding", 2, infer::embedding, {embedding_forward, embedding_backward},
     DG_CUDA_KERNELS_SHARED(embedding_forward, embedding_backward), embedding_cases,
     reads("padding_idx"), kFollow,
     "torch.nn.functional.embedding(indices, weight, padding_idx=padding_idx)", 0, true, 0, nullptr, embedding_differentiable_backward,
     nullptr, embedding_arguments},
    {OpType::Gather, "gather", 2, infer::gather, {gather_forward, gather_backward},
     DG_CUDA_KERNELS_SHARED(gather_forward, gather_backward), gather_cases,
     reads("axis"), kFollow, "torch.gather(x, axis, index)", 0, true, 0, nullptr, gather_differentiable_backward},
    {OpType::IndexSelect, "index_select", 2, infer::index_select, {index_select_forward, index_select_backward},
     DG_CUDA_KERNELS_SHARED(index_select_forward, index_select_backward), index_select_cases,
     reads("axis"), kFollow, "torch.index_select(x, axis, index)", 0, true, 0, nullptr, index_select_differentiable_backward},
    {OpType::ScatterAdd, "scatter_add", 3, infer::scatter_add, {scatter_add_forward, scatter_add_backward},
     DG_CUDA_KERNELS_SHARED(scatter_add_forward, scatter_add_backward), scatter_add_cases,
     reads("axis"), kFollow, "torch.scatter_add(x, axis, index, src)", 0, true, 0, nullptr, scatter_add_differentiable_backward},
    {OpType::Where, "where", 3, infer::where, kCpuSelect, kCudaSelect, where_cases,
     kNoAttrs, kFollow, "torch.where(condition != 0, a, b)", 0, true, 0, nullptr, select_differentiable_backward,
     &math::formula::where},
    {OpType::MaskedFill, "masked_fill", 2, infer::masked_fill, kCpuSelect, kCudaSelect, masked_fill_cases,
     reads("scalar"), kFollow, "x.masked_fill(mask != 0, scalar)", 0, true, 0, nullptr, select_differentiable_backward,
     &math::formula::masked_fill},
    {OpType::ScaledDotProductAttention, "scaled_dot_product_attention", 4, infer::scaled_dot_product_attention,
     {cpu::scaled_dot_product_attention_forward, cpu::scaled_dot_product_attention_backward},
     // Native bf16/f16: 16-bit mma.sync with f32 softmax and accumulators (ops/attention.cu, namespace mma).
     DG_CUDA_KERNELS_NATIVE(scaled_dot_product_attention_forward, scaled_dot_product_attention_backward),
     attention_cases, reads("scalar", "seed", "is_causal", "attention_scale"), kReduced,
     "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask != 0, dropout_p=scalar, "
     "is_causal=is_causal, scale=attention_scale), with dyngrad's keep mask from seed",
     /*optional_inputs=*/1, true, 0, nullptr, composition_differentiable_backward<attention_composition>},
    // scaled_dot_product_attention over a packed projection (ops/attention.h): on cuDNN in place, elsewhere the
    // layout copies around the same kernels; its composition is the fused-kernel check's reference.
    {OpType::QkvAttention, "qkv_attention", 1, infer::qkv_attention,
     {cpu::qkv_attention_forward, cpu::qkv_attention_backward},
     DG_CUDA_KERNELS_NATIVE(qkv_attention_forward, qkv_attention_backward), qkv_attention_cases,
     reads("num_heads", "scalar", "seed", "is_causal", "attention_scale"), kReduced,
     "F.scaled_dot_product_attention(*qkv.view(B, T, 3, num_heads, D).permute(2, 0, 3, 1, 4), "
     "dropout_p=scalar, is_causal=is_causal, scale=attention_scale).transpose(1, 2).reshape(B, T, E), with "
     "dyngrad's keep mask from seed",
     0, true, 0, &unfused::qkv_attention, unfused_differentiable_backward<unfused::qkv_attention>},
    // linear(gelu(linear(x, w1, b1)), w2, b2) (ops/linalg.h): GELU in cuBLASLt's epilogues on the GPU; reduced under
    // autocast, as linear.
    {OpType::GeluMlp, "gelu_mlp", 5, infer::gelu_mlp, {gelu_mlp_unfused_forward, gelu_mlp_unfused_backward},
     DG_CUDA_KERNELS_NATIVE(gelu_mlp_forward, gelu_mlp_backward), gelu_mlp_cases, reads("gelu_approximation"), kReduced,
     "F.linear(F.gelu(F.linear(x, w1, b1), approximate=gelu_approximation), w2, b2)", 0, true, 0, &unfused::gelu_mlp,
     unfused_differentiable_backward<unfused::gelu_mlp>},
    {OpType::Rnn, "rnn", 4, infer::rnn, {cpu::rnn_forward, cpu::rnn_backward},
     DG_CUDA_KERNELS(rnn_forward, rnn_backward), rnn_cases,
     reads("rnn_mode", "hidden_size", "num_layers", "bidirectional", "save_for_backward"), kFollow,
     "torch.nn.LSTM / GRU / RNN(rnn_mode, hidden_size, num_layers, bidirectional) on the flat cuDNN-ordered weight",
     /*optional_inputs=*/2, true, 0, nullptr, composition_differentiable_backward<rnn_composition>, nullptr,
     rnn_arguments},
    // sorting and sampling (ops/sampling.h): the indices ops are not differentiable (sort's and topk's values are
    // gather(x, axis, indices)); cumsum runs in f32 under autocast, as PyTorch's
    {OpType::Cumsum, "cumsum", 1, infer::cumsum, {cumsum_forward, cumsum_backward},
     DG_CUDA_KERNELS_SHARED(cumsum_forward, cumsum_backward), cumsum_cases,
     reads("axis"), kFloat32, "torch.cumsum(x, dim=axis)", 0, true, 0, nullptr, cumsum_differentiable_backward},
    {OpType::ArgSort, "argsort", 1, infer::sort_indices, kSortIndices, kSortIndicesCuda, argsort_cases,
     reads("axis", "descending"), kFollow, "torch.argsort(x, dim=axis, descending=descending, stable=True)", 0,
     kNotDifferentiable},
    {OpType::TopKIndices, "topk_indices", 1, infer::sort_indices, kSortIndices, kSortIndicesCuda,
     topk_indices_cases, reads("axis", "descending", "length"), kFollow,
     "torch.topk(x, k=length, dim=axis, largest=descending).indices", 0, kNotDifferentiable},
    {OpType::Multinomial, "multinomial", 1, infer::multinomial, {cpu::multinomial_forward, nullptr}, kCudaMultinomial,
     multinomial_cases, reads("length", "replacement", "seed"), kFollow,
     "torch.multinomial(probs, num_samples=length, replacement=replacement), with dyngrad's draws from seed", 0,
     kNotDifferentiable},
}};

// Every tag has a row, in tag order.
constexpr bool rows_in_tag_order() {
    for (std::size_t i = 0; i < kTable.size(); ++i)
        if (static_cast<std::size_t>(kTable[i].op) != i) return false;
    return true;
}
static_assert(rows_in_tag_order(), "op table: list every OpType once, in tag order");

// Every row states its autocast policy: a new op never falls into one by default. Every row with cases (all but
// leaf and custom) names the PyTorch expression its goldens (tools/make_goldens.py) compute. By tag, not by
// comparing `cases` with no_cases: GCC does not fold function-pointer comparisons in constant expressions under
// -fsanitize (the ASan build); tests/ops/test_op_rows.cpp checks the cases themselves.
constexpr bool rows_complete() {
    for (const OpDef& def : kTable) {
        const bool has_cases = def.op != OpType::Leaf && def.op != OpType::Custom;
        if (!def.autocast || (has_cases && def.torch == nullptr)) return false;
    }
    return true;
}
static_assert(rows_complete(), "op table: every row states its autocast policy, and every row with cases its torch");

}  // namespace

const OpDef& op_def(OpType op) {
    const auto i = static_cast<std::size_t>(op);
    if (i >= kTable.size() || kTable[i].op != op) throw Error(str("internal: op table has no row for tag ", i));
    return kTable[i];
}

const OpDef& op_def(OpType op, const OpAttrs& attrs) {
    return op == OpType::Custom ? custom_op_def(attrs.custom_id) : op_def(op);
}

Tensor backend_forward(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs, const OutputSpec& out) {
    std::vector<Tensor> no_saved;
    const OpDef& def = op_def(op);
    const ForwardFn forward = inputs[0].device().is_cuda() ? def.cuda.forward : def.cpu.forward;
    return forward(ForwardArgs{op, inputs, attrs, out, no_saved});
}

std::span<const OpDef> op_table() { return kTable; }

const OpDef* find_op(std::string_view name) {
    for (const OpDef& def : kTable)
        if (name == def.name) return &def;
    return nullptr;
}

}  // namespace dyngrad
