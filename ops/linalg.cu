// Matrix products on the GPU: matmul through cuBLAS GEMMs; linear through cuBLASLt GEMMs with fused
// epilogues in float32, bfloat16 and float16 (bias, weight and bias gradients in one GEMM; the ReLU is a kernel
// of ours, see linear_forward) and cuBLAS plus small kernels otherwise. CPU reference: ops/linalg.cpp (same
// names in namespace cpu). Layout ops: ops/layout.cu.
//
// bfloat16 / float16: A, B, C and D in the reduced type, scale type float, CUBLAS_COMPUTE_32F: tensor cores
// with float accumulation, and D rounded once (the bias of the BIAS epilogue and the BGRADB sum are in D's
// type, computed in float). The small kernels of ours compute in acc_t<T> (ops/reduced_precision.cuh).
//
// cuBLAS is column-major; a row-major buffer read column-major is the transpose of the matrix. So a
// row-major C = op(A)·op(B) is computed as the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, i.e. with the two
// operands swapped and no copies.
#include <array>
#include <climits>
#include <compare>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/handle.h"
#include "dyngrad/cuda/plan_cache.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/linalg.h"
#include "dyngrad/ops/linalg_gemm.h"
#include "dyngrad/ops/linalg_geometry.h"
#include "dyngrad/ops/reduced_precision.cuh"
#include "dyngrad/ops/vector_pack.cuh"

namespace dyngrad::cuda {

namespace {

using namespace vector_pack;  // Pack, load_pack, store_pack, for_each_pack, pack_count: ops/vector_pack.cuh

constexpr unsigned kThreads = 256;

int cublas_dim(std::int64_t value, const char* what) {
    if (value > INT_MAX) throw ValueError(str(what, ": dimension ", value, " exceeds the int range of cuBLAS"));
    return static_cast<int>(value);
}

using Operand = GemmOperand;  // ops/linalg_gemm.h

// The CUDA element type of a floating dtype (DTypeError otherwise).
cudaDataType_t gemm_data_type(DType dtype, const char* what) {
    return dispatch_gpu_floating(dtype, what, []<typename T>() { return cuda_data_type<T>(); });
}

// Row-major c (m,n) = op(a) (m,k) · op(b) (k,n), plus c itself when `accumulate` (c is written with
// '=' otherwise), for `batch` matrices; c's matrices are m·n apart. a and b in `dtype`, c in `c_dtype`: `dtype`
// (not given), or f32 for bf16/f16 operands (cuBLAS's mixed GEMM: the f32 accumulator written out unrounded).
void gemm(DeviceContext& ctx, DType dtype, const char* what, std::int64_t batch, std::int64_t m, std::int64_t n,
          std::int64_t k, Operand a, Operand b, void* c, bool accumulate,
          std::optional<DType> c_dtype_given = std::nullopt, std::int64_t c_row_stride = 0) {
    const cudaDataType_t type = gemm_data_type(dtype, what);
    const DType c_dtype = c_dtype_given.value_or(dtype);
    if (c_dtype != dtype && !(c_dtype == DType::f32 && is_reduced_precision(dtype)))
        throw DTypeError(str(what, ": a GEMM of ", dtype_name(dtype), " operands writes ", dtype_name(dtype),
                             is_reduced_precision(dtype) ? " or float32" : "", ", not ", dtype_name(c_dtype)));
    const cudaDataType_t c_type = gemm_data_type(c_dtype, what);
    if (batch == 0 || m == 0 || n == 0) return;
    if (k == 0) {  // an empty sum: c = 0 (+ c)
        if (!accumulate)
            DG_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<std::size_t>(c_row_stride > 0 ? c_row_stride : n) *
                                                   dtype_size(c_dtype),
                                            0, static_cast<std::size_t>(n) * dtype_size(c_dtype),
                                            static_cast<std::size_t>(batch * m), ctx.stream));
        return;
    }
    // Column-major view: cᵀ (n,m) = op(b)ᵀ (n,k) · op(a)ᵀ (k,m). A row-major buffer's leading
    // dimension is its number of columns.
    const int cm = cublas_dim(n, what);
    const int cn = cublas_dim(m, what);
    const int ck = cublas_dim(k, what);
    const int ldb = b.row_stride > 0 ? cublas_dim(b.row_stride, what) : b.transposed ? ck : cm;
    const int lda = a.row_stride > 0 ? cublas_dim(a.row_stride, what) : a.transposed ? cn : ck;
    const int ldc = c_row_stride > 0 ? cublas_dim(c_row_stride, what) : cm;
    const cublasOperation_t op_b = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;

    // Scale type float for everything but float64; bf16/f16 accumulate in float on tensor cores.
    const bool f64 = dtype == DType::f64;
    const float alpha32 = 1.0f, beta32 = accumulate ? 1.0f : 0.0f;
    const double alpha64 = 1.0, beta64 = accumulate ? 1.0 : 0.0;
    const void* alpha = f64 ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha32);
    const void* beta = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
    const cublasComputeType_t compute = f64                                   ? CUBLAS_COMPUTE_64F
                                        : dtype == DType::f32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                              : CUBLAS_COMPUTE_32F;

    if (batch == 1) {
        DG_CUBLAS_CHECK(cublasGemmEx(ctx.cublas, op_b, op_a, cm, cn, ck, alpha, b.data, type, ldb, a.data, type, lda,
                                     beta, c, c_type, ldc, compute, CUBLAS_GEMM_DEFAULT));
    } else {
        DG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx.cublas, op_b, op_a, cm, cn, ck, alpha, b.data, type, ldb,
                                                   b.stride, a.data, type, lda, a.stride, beta, c, c_type, ldc,
                                                   static_cast<std::int64_t>(ldc) * m,
                                                   cublas_dim(batch, what), compute, CUBLAS_GEMM_DEFAULT));
    }
}

}  // namespace

void row_major_gemm(DeviceContext& ctx, DType dtype, const char* what, std::int64_t batch, std::int64_t m,
                    std::int64_t n, std::int64_t k, GemmOperand a, GemmOperand b, void* c, bool accumulate,
                    std::optional<DType> c_dtype, std::int64_t c_row_stride) {
    gemm(ctx, dtype, what, batch, m, n, k, a, b, c, accumulate, c_dtype, c_row_stride);
}

namespace {

// y (N,out) = b broadcast over rows: the GEMM then adds x·wᵀ with beta = 1 (the cuBLAS path).
template <typename T>
__global__ void bias_rows_kernel(const T* __restrict__ b, T* __restrict__ y, std::int64_t n, std::int64_t out) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count())
        y[i] = b[i % out];
}

// y = relu(y) in place: the fused activation after the GEMM, with ReluOp's formula (ops/elementwise_math.h),
// so NaN propagates as on the CPU. 16-byte packs (ops/vector_pack.cuh), then the scalar tail: one element per
// thread took 38 µs per 4096×4096 bf16 pass on the H100 against PyTorch's 21 (ncu, session 5).
template <typename T>
__device__ __forceinline__ T relu_element(T y) {
    return from_acc<T>(math::ReluOp::forward(to_acc(y), acc_t<T>(0)));
}
template <typename T>
__global__ void relu_in_place_kernel(T* __restrict__ y, std::int64_t n, std::int64_t packs) {
    for_each_pack(
        n, packs, Pack<T>::width,
        [&](std::int64_t p) {
            Pack<T> v = load_pack(static_cast<const T*>(y), p);
#pragma unroll
            for (T& e : v.v) e = relu_element(e);
            store_pack(y, p, v);
        },
        [&](std::int64_t i) { y[i] = relu_element(y[i]); });
}

// dz = ReluOp::masked_gradient(y, dy): the fused ReLU's gradient taken from the output, which is <= 0
// exactly where the pre-activation is (so the pre-activation is never stored). Packs as above.
template <typename T>
__device__ __forceinline__ T relu_gradient_element(T y, T dy) {
    return from_acc<T>(math::ReluOp::masked_gradient(to_acc(y), to_acc(dy)));
}
template <typename T>
__global__ void relu_gradient_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dz,
                                     std::int64_t n, std::int64_t packs) {
    for_each_pack(
        n, packs, Pack<T>::width,
        [&](std::int64_t p) {
            const Pack<T> yv = load_pack(y, p), dyv = load_pack(dy, p);
            Pack<T> dzv;
#pragma unroll
            for (int k = 0; k < Pack<T>::width; ++k) dzv.v[k] = relu_gradient_element(yv.v[k], dyv.v[k]);
            store_pack(dz, p, dzv);
        },
        [&](std::int64_t i) { dz[i] = relu_gradient_element(y[i], dy[i]); });
}

using LtMatmulDesc = UniqueHandle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = UniqueHandle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = UniqueHandle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// A float32, bfloat16 or float16 cuBLASLt GEMM in column-major terms, D (m,n) = op(A) (m,k) · op(B) (k,n)
// with an epilogue, on packed operands (leading dimensions follow from the transposes). The algorithm depends on the
// pointers' alignments too (A, B, D, bias, aux), so they are part of the key.
struct LtGemmKey {
    int device;
    int m, n, k;
    bool transpose_a, transpose_b;
    std::uint32_t epilogue;  // cublasLtEpilogue_t
    DType dtype;             // of A, B, D, the bias and the aux matrix
    bool tf32;
    std::array<std::uint32_t, 5> alignment;
    auto operator<=>(const LtGemmKey&) const = default;
};

// The GELU epilogues' second matrix: the pre-activation (m,n) column-major with leading dimension m, written by
// GELU_AUX_BIAS and read by DGELU.
bool uses_aux(std::uint32_t epilogue) {
    return epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
           epilogue == CUBLASLT_EPILOGUE_DGELU || epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

// Descriptors and the heuristic's algorithm for one key. The bias pointer is an attribute of the matmul
// descriptor, so a call sets it and enqueues the GEMM under `mutex` (threads share the plan).
struct LtGemmPlan {
    LtMatmulDesc matmul{nullptr};
    LtLayout a{nullptr}, b{nullptr}, d{nullptr};
    cublasLtMatmulAlgo_t algo{};
    bool supported = false;  // cuBLASLt offered an algorithm: otherwise the caller takes the cuBLAS path
    std::mutex mutex;
};

PlanCache<LtGemmKey, LtGemmPlan>& lt_plans() { return plan_cache<LtGemmKey, LtGemmPlan>(); }

// The largest power of two up to 256 (cuBLASLt's default assumption) that divides the address (down to 2: a
// bfloat16 operand may start at any element).
std::uint32_t pointer_alignment(const void* p) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    std::uint32_t alignment = 256;
    while (alignment > 2 && address % alignment != 0) alignment /= 2;
    return alignment;
}

LtLayout lt_layout(cudaDataType_t type, std::uint64_t rows, std::uint64_t cols) {
    cublasLtMatrixLayout_t layout = nullptr;
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, static_cast<std::int64_t>(rows)));
    return LtLayout(layout);
}

std::shared_ptr<LtGemmPlan> make_lt_plan(DeviceContext& ctx, const LtGemmKey& key, void* bias, void* aux) {
    auto plan = std::make_shared<LtGemmPlan>();
    cublasLtMatmulDesc_t matmul = nullptr;
    DG_CUBLAS_CHECK(
        cublasLtMatmulDescCreate(&matmul, key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    plan->matmul = LtMatmulDesc(matmul);
    const cublasOperation_t op_a = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const auto epilogue = static_cast<cublasLtEpilogue_t>(key.epilogue);
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    // The heuristic reads the bias pointer's alignment from here; calls overwrite it with their own.
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    const auto m = static_cast<std::uint64_t>(key.m), n = static_cast<std::uint64_t>(key.n),
               k = static_cast<std::uint64_t>(key.k);
    const cudaDataType_t type = gemm_data_type(key.dtype, "linear");
    if (uses_aux(key.epilogue)) {  // the pre-activation, in D's type, packed like D
        const auto aux_ld = static_cast<std::int64_t>(m);
        const auto aux_type = static_cast<std::int32_t>(type);
        DG_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        DG_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                       sizeof(aux_type)));
    }
    plan->a = key.transpose_a ? lt_layout(type, k, m) : lt_layout(type, m, k);
    plan->b = key.transpose_b ? lt_layout(type, n, k) : lt_layout(type, k, n);
    plan->d = lt_layout(type, m, n);

    cublasLtMatmulPreference_t raw_preference = nullptr;
    DG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_preference));
    const LtPreference preference(raw_preference);
    const std::uint64_t workspace = ctx.gemm_workspace_bytes;
    DG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace, sizeof(workspace)));
    const cublasLtMatmulPreferenceAttributes_t alignment_attributes[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const std::uint32_t alignments[] = {key.alignment[0], key.alignment[1], key.alignment[2], key.alignment[2]};
    for (int i = 0; i < 4; ++i)
        DG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw_preference, alignment_attributes[i], &alignments[i],
                                                             sizeof(alignments[i])));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(ctx.cublas_lt, matmul, plan->a.get(), plan->b.get(),
                                                                 plan->d.get(), plan->d.get(), raw_preference, 1,
                                                                 &result, &found);
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED)
        throw_cublas_error(status, "cublasLtMatmulAlgoGetHeuristic(...)", __FILE__, __LINE__);
    plan->supported = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (plan->supported) plan->algo = result.algo;
    return plan;
}

// Enqueues the column-major GEMM d (m,n) = op(a) (m,k) · op(b) (k,n) (float32, bfloat16 or float16 operands,
// float scale and accumulation) with `epilogue` (d written with '='): BIAS reads `bias` (m), BGRADB writes
// `bias` (n) = Σ over k of op(b); GELU_AUX_BIAS adds `bias` (m), writes the sum into `aux` (m,n) and GELU's tanh
// form of it into d; DGELU multiplies the product by GELU's derivative at `aux` into d. Plans are cached per key
// (dtype included); no allocation, no sync (the workspace is the context's fixed one). Returns false, having enqueued nothing, when cuBLASLt offers no algorithm for the key.
bool lt_gemm(DeviceContext& ctx, DType dtype, const char* what, std::int64_t m, std::int64_t n, std::int64_t k,
             const void* a, bool transpose_a, const void* b, bool transpose_b, void* d, cublasLtEpilogue_t epilogue,
             void* bias, void* aux = nullptr) {
    const LtGemmKey key{ctx.device,
                        cublas_dim(m, what),
                        cublas_dim(n, what),
                        cublas_dim(k, what),
                        transpose_a,
                        transpose_b,
                        static_cast<std::uint32_t>(epilogue),
                        dtype,
                        dtype == DType::f32 && allow_tf32(),
                        {pointer_alignment(a), pointer_alignment(b), pointer_alignment(d), pointer_alignment(bias),
                         pointer_alignment(aux)}};
    const std::shared_ptr<LtGemmPlan> plan = lt_plans().get(key, [&] { return make_lt_plan(ctx, key, bias, aux); });
    if (!plan->supported) return false;
    const float alpha = 1.0f, beta = 0.0f;
    const std::lock_guard lock(plan->mutex);
    DG_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->matmul.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (uses_aux(key.epilogue))
        DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->matmul.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                       &aux, sizeof(aux)));
    DG_CUBLAS_CHECK(cublasLtMatmul(ctx.cublas_lt, plan->matmul.get(), &alpha, a, plan->a.get(), b, plan->b.get(), &beta,
                                   d, plan->d.get(), d, plan->d.get(), &plan->algo, ctx.gemm_workspace,
                                   ctx.gemm_workspace_bytes, ctx.stream));
    return true;
}

// dz = dy ⊙ (y > 0) with a fused ReLU, dy itself otherwise.
Tensor activation_gradient(DeviceContext& ctx, const Tensor& dy, const Tensor& y, Activation activation) {
    if (activation == Activation::None || dy.numel() == 0) return dy;
    Tensor dz = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    dispatch_gpu_floating(dy.dtype(), "linear backward", [&]<typename T>() {
        const std::int64_t n = dy.numel();
        const std::int64_t packs = pack_count<T>(n, {dy.raw_data(), y.raw_data(), dz.raw_data()});
        relu_gradient_kernel<T><<<vector_blocks(ctx, n, packs, kThreads), kThreads, 0, ctx.stream>>>(
            dy.data<T>(), y.data<T>(), dz.data<T>(), n, packs);
        DG_CUDA_CHECK_LAUNCH();
    });
    return dz;
}

}  // namespace

Tensor matmul_forward(const ForwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Tensor& b = args.inputs[1];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, a.device());
    const MatmulDims d = matmul_dims(a, b);
    gemm(context_for(a), a.dtype(), "matmul", d.batch, d.m, d.n, d.k, {a.raw_data(), false, d.m * d.k},
         {b.raw_data(), false, d.k * d.n}, y.raw_data(), false);
    return y;
}

std::vector<Tensor> matmul_backward(const BackwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Tensor& b = args.inputs[1];
    const Tensor& dy = args.grad_output;
    DeviceContext& ctx = context_for(a);
    const MatmulDims d = matmul_dims(a, b);
    std::vector<Tensor> grads(2);
    if (args.needs_grad[0]) {
        grads[0] = Tensor::empty(a.shape(), a.dtype(), a.device());
        gemm(ctx, a.dtype(), "matmul backward", d.batch, d.m, d.k, d.n, {dy.raw_data(), false, d.m * d.n},
             {b.raw_data(), true, d.k * d.n}, grads[0].raw_data(), false);
    }
    if (args.needs_grad[1]) {
        grads[1] = Tensor::empty(b.shape(), b.dtype(), b.device());
        gemm(ctx, a.dtype(), "matmul backward", d.batch, d.k, d.n, d.m, {a.raw_data(), true, d.m * d.k},
             {dy.raw_data(), false, d.m * d.n}, grads[1].raw_data(), false);
    }
    return grads;
}

// float32, bfloat16, float16: one cuBLASLt GEMM, yᵀ (out,N) = w · xᵀ in column-major terms with the BIAS epilogue.
// float64 (cuBLASLt offers no epilogues for it), an empty inner dimension, or a key without a cuBLASLt
// algorithm: the bias is written into y, a cuBLAS GEMM accumulates x·wᵀ onto it (beta = 1).
// The ReLU is always our own in-place kernel, never cuBLASLt's RELU_BIAS epilogue: what that epilogue does
// with NaN depends on the algorithm the heuristic picks (on an H100 with cuBLAS 13, four of the five
// float32 algorithms for an 8×8×8 GEMM propagated NaN and the fifth wrote 0; the documentation promises
// neither), and the relu op propagates NaN. One extra elementwise pass over y is the cheapest path that is
// right for every algorithm (checking x, w and b for NaN instead would read more than y).
Tensor linear_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& w = args.inputs[1];
    const Tensor& b = args.inputs[2];
    const bool relu = args.attrs.activation == Activation::Relu;
    DeviceContext& ctx = context_for(x);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    const std::int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
    if (y.numel() == 0) return y;
    const bool fused = x.dtype() != DType::f64 && in > 0 &&
                       lt_gemm(ctx, x.dtype(), "linear", out, rows, in, w.raw_data(), true, x.raw_data(), false,
                               y.raw_data(), CUBLASLT_EPILOGUE_BIAS, b.raw_data());
    if (!fused) {
        dispatch_gpu_floating(x.dtype(), "linear", [&]<typename T>() {
            bias_rows_kernel<T><<<grid_size(ctx, y.numel(), kThreads), kThreads, 0, ctx.stream>>>(
                b.data<T>(), y.data<T>(), y.numel(), out);
            DG_CUDA_CHECK_LAUNCH();
        });
        gemm(ctx, x.dtype(), "linear", 1, rows, out, in, {x.raw_data(), false, 0}, {w.raw_data(), true, 0},
             y.raw_data(), true);
    }
    if (relu) {
        dispatch_gpu_floating(x.dtype(), "linear", [&]<typename T>() {
            const std::int64_t n = y.numel();
            const std::int64_t packs = pack_count<T>(n, {y.raw_data()});
            relu_in_place_kernel<T><<<vector_blocks(ctx, n, packs, kThreads), kThreads, 0, ctx.stream>>>(
                y.data<T>(), n, packs);
            DG_CUDA_CHECK_LAUNCH();
        });
    }
    return y;
}

// dy (N,out) -> dz = dy ⊙ (y > 0) with the fused ReLU (dy otherwise); dx = dz·w (N,in), dw = dzᵀ·x (out,in),
// db = column sums of dz (out).
// float32, bfloat16 or float16 with both dw and db wanted: one cuBLASLt GEMM, dwᵀ (in,out) = xᵀ (in,N) ·
// dz (N,out) in column-major terms, whose BGRADB epilogue sums op(B) = dz over k = N: db. cuBLASLt's DRELU epilogues do
// not fit: they mask a GEMM's output with a mask stored by the forward, while here dz feeds both GEMMs.
std::vector<Tensor> linear_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& w = args.inputs[1];
    const Tensor& b = args.inputs[2];
    DeviceContext& ctx = context_for(x);
    const Tensor dz = activation_gradient(ctx, args.grad_output, args.output, args.attrs.activation);
    const std::int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
    std::vector<Tensor> grads(3);
    if (args.needs_grad[0]) grads[0] = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (args.needs_grad[1]) grads[1] = Tensor::empty(w.shape(), w.dtype(), w.device());
    const bool fusable =
        args.needs_grad[1] && args.needs_grad[2] && x.dtype() != DType::f64 && rows > 0 && in > 0 && out > 0;
    if (fusable) grads[2] = Tensor::empty(b.shape(), b.dtype(), b.device());
    // dw (and db with it) only feeds the optimizer: a small one runs on the side lane, beside dx's chain.
    bool fused = false;
    {
        const double work = static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out);
        SideWork side(ctx, args.needs_grad[1] && side_lane_wanted(ctx, work));
        DeviceContext& weight_ctx = side.lane() ? *side.lane() : ctx;
        if (fusable)
            fused = lt_gemm(weight_ctx, x.dtype(), "linear backward", in, out, rows, x.raw_data(), false, dz.raw_data(),
                            true, grads[1].raw_data(), CUBLASLT_EPILOGUE_BGRADB, grads[2].raw_data());
        if (args.needs_grad[1] && !fused)
            gemm(weight_ctx, x.dtype(), "linear backward", 1, out, in, rows, {dz.raw_data(), true, 0},
                 {x.raw_data(), false, 0}, grads[1].raw_data(), false);
        side.keep(x);
        side.keep(dz);
        side.produced(grads[1]);
        if (fused) side.produced(grads[2]);
    }
    if (args.needs_grad[0])
        gemm(ctx, x.dtype(), "linear backward", 1, rows, in, out, {dz.raw_data(), false, 0}, {w.raw_data(), false, 0},
             grads[0].raw_data(), false);
    if (fusable && !fused) grads[2] = Tensor();
    if (args.needs_grad[2] && !fused) {
        if (rows == 0) {
            grads[2] = Tensor::zeros(b.shape(), b.dtype(), b.device());
        } else {
            const int batch_axis[] = {0};
            grads[2] = sum_over(dz, batch_axis).reshaped(b.shape());
        }
    }
    return grads;
}

// ---- gelu_mlp: linear(gelu(linear(x, w1, b1)), w2, b2) (ops/linalg.h) ----
namespace {

struct MlpOperands {
    const Tensor &x, &w1, &b1, &w2, &b2;
    std::int64_t rows, in, hidden, out;
};
MlpOperands mlp_operands(std::span<const Tensor> in) {
    return {in[0], in[1], in[2], in[3], in[4], in[0].size(0), in[0].size(1), in[1].size(0), in[3].size(0)};
}

// GELU's tanh form on cuBLASLt's epilogues: f32, bf16, f16 with every dimension present (f64 has no epilogues).
bool mlp_epilogues_apply(const MlpOperands& o, const OpAttrs& attrs) {
    return attrs.gelu_approximation == GeluApproximation::Tanh && o.x.dtype() != DType::f64 && o.rows > 0 &&
           o.in > 0 && o.hidden > 0 && o.out > 0;
}

Tensor linear_of(const Tensor& x, const Tensor& w, const Tensor& b, DType dtype) {
    const Tensor inputs[] = {x, w, b};
    const OutputSpec spec{{x.size(0), w.size(0)}, dtype};
    std::vector<Tensor> saved;
    return linear_forward(ForwardArgs{OpType::Linear, inputs, OpAttrs{}, spec, saved});
}

}  // namespace

// pre = x·w1ᵀ + b1, h = gelu(pre) (rows, hidden), y = h·w2ᵀ + b2 (rows, out); saves pre and h. With the epilogues
// one GEMM writes pre (its aux matrix) and h; otherwise linear's kernels and gelu's (gelu_mlp_unfused_forward).
Tensor gelu_mlp_forward(const ForwardArgs& args) {
    const MlpOperands o = mlp_operands(args.inputs);
    DeviceContext& ctx = context_for(o.x);
    const DType dtype = o.x.dtype();
    Tensor pre = Tensor::empty({o.rows, o.hidden}, dtype, o.x.device());
    Tensor h = Tensor::empty({o.rows, o.hidden}, dtype, o.x.device());
    const bool fused = mlp_epilogues_apply(o, args.attrs) && gelu_mlp_epilogues() != GeluMlpEpilogues::none &&
                       lt_gemm(ctx, dtype, "gelu_mlp", o.hidden, o.rows, o.in, o.w1.raw_data(), true, o.x.raw_data(),
                               false, h.raw_data(), CUBLASLT_EPILOGUE_GELU_AUX_BIAS, o.b1.raw_data(), pre.raw_data());
    if (!fused) return gelu_mlp_unfused_forward(args);
    args.saved.push_back(pre);
    args.saved.push_back(h);
    return linear_of(h, o.w2, o.b2, dtype);
}

// dy (rows, out) -> dx, dw1, db1, dw2, db2. With the backward epilogue: dw2 = dyᵀ·h with db2 (BGRADB), then
// dpre = (dy·w2) ∘ gelu'(pre) in one GEMM (DGELU), dw1 = dpreᵀ·x with db1 (BGRADB), dx = dpre·w1. Not DGELU_BGRAD:
// on the H200 cuBLASLt runs its bias sums as a separate kernel slower than gelu's own backward (7.4 ms of a
// 71.6 ms GPT-2 step, ncu, 2026-11-29). Otherwise linear's and gelu's backward kernels in turn
// (gelu_mlp_unfused_backward).
std::vector<Tensor> gelu_mlp_backward(const BackwardArgs& args) {
    const MlpOperands o = mlp_operands(args.inputs);
    DeviceContext& ctx = context_for(o.x);
    const DType dtype = o.x.dtype();
    const Tensor& pre = args.saved[0];
    const Tensor& h = args.saved[1];
    const Tensor& dy = args.grad_output;
    std::vector<Tensor> grads(5);
    if (mlp_epilogues_apply(o, args.attrs) && gelu_mlp_epilogues() == GeluMlpEpilogues::all) {
        Tensor dw2 = Tensor::empty(o.w2.shape(), dtype, o.x.device());
        Tensor db2 = Tensor::empty(o.b2.shape(), dtype, o.x.device());
        Tensor dpre = Tensor::empty(pre.shape(), dtype, o.x.device());
        // dw2ᵀ (hidden,out) = hᵀ (hidden,rows) · dy (rows,out), column-major; BGRADB sums dy over rows: db2.
        // dpreᵀ (hidden,rows) = w2ᵀ (hidden,out) · dyᵀ (out,rows); DGELU: ∘ gelu'(pre).
        const bool weights = lt_gemm(ctx, dtype, "gelu_mlp backward", o.hidden, o.out, o.rows, h.raw_data(), false,
                                     dy.raw_data(), true, dw2.raw_data(), CUBLASLT_EPILOGUE_BGRADB, db2.raw_data());
        const bool fused = weights && lt_gemm(ctx, dtype, "gelu_mlp backward", o.hidden, o.rows, o.out,
                                              o.w2.raw_data(), false, dy.raw_data(), false, dpre.raw_data(),
                                              CUBLASLT_EPILOGUE_DGELU, nullptr, pre.raw_data());
        // dw1ᵀ (in,hidden) = xᵀ (in,rows) · dpre (rows,hidden); BGRADB sums dpre over rows: db1.
        Tensor dw1 = Tensor::empty(o.w1.shape(), dtype, o.x.device());
        Tensor db1 = Tensor::empty(o.b1.shape(), dtype, o.x.device());
        if (fused && lt_gemm(ctx, dtype, "gelu_mlp backward", o.in, o.hidden, o.rows, o.x.raw_data(), false,
                             dpre.raw_data(), true, dw1.raw_data(), CUBLASLT_EPILOGUE_BGRADB, db1.raw_data())) {
            if (args.needs_grad[0]) {
                grads[0] = Tensor::empty(o.x.shape(), dtype, o.x.device());
                gemm(ctx, dtype, "gelu_mlp backward", 1, o.rows, o.in, o.hidden, {dpre.raw_data(), false, 0},
                     {o.w1.raw_data(), false, 0}, grads[0].raw_data(), false);
            }
            if (args.needs_grad[1]) grads[1] = dw1;
            if (args.needs_grad[2]) grads[2] = db1;
            if (args.needs_grad[3]) grads[3] = dw2;
            if (args.needs_grad[4]) grads[4] = db2;
            return grads;
        }
    }
    return gelu_mlp_unfused_backward(args);
}

}  // namespace dyngrad::cuda
