// 2-D convolution on the GPU through cuDNN. CPU reference: ops/conv.cpp (same names in namespace cpu).
//
// Per shape key (x and weight shapes, stride, padding, dilation, groups, dtype, device, TF32, deterministic and
// graph-API settings) one plan holds the tensor/filter descriptors and, per pass (forward, backward data, backward
// filter), a convolution descriptor and the algorithm cudnnFind*AlgorithmEx timed fastest on the first call that
// runs that pass, with the call's own buffers; for bf16, f16 and f32 the same search times cuDNN's graph-API engine
// configs too (ops/conv_graph.cu: engines the legacy API cannot reach), and the pass keeps the graph API's
// execution plan when one of those was fastest. Later calls look the plan up and run: no descriptor creation (but
// a graph plan's variant pack for a pointer set it has not seen lately), no search, no device sync; the per-call
// workspace comes from the device's pool. A search inside a CUDA graph capture throws GraphError (cuda/capture.h).
//
// Precision: float32 runs at full precision (CUDNN_FMA_MATH) unless cuda::allow_tf32(). CUDNN_DEFAULT_MATH
// is not enough for that: on Ampere and later it lets cuDNN use TF32 tensor cores for float data. With
// TF32 allowed the plan uses CUDNN_TENSOR_OP_MATH (TF32, not the fp16 down-conversion of
// CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION). float64 uses CUDNN_DEFAULT_MATH (its tensor-core paths are exact
// float64). bfloat16/float16 tensors and filters run with a FLOAT compute type (float accumulation) and
// CUDNN_TENSOR_OP_MATH: tensor cores, as the GEMMs of ops/linalg.cu; the bias and activation kernels below
// compute in acc_t<T> (float) and round once on store.
//
// The legacy convolution API is marked deprecated in cuDNN 9 (the graph API succeeds it) but is supported.
// Over 600 lines: the legacy API's plans and search, the choice between its algorithms and the graph API's
// engines (the graph API itself is ops/conv_graph.cu), and the bias/activation kernels of both directions.
//
// Bias and activation (OpAttrs::activation) are kernels of ours around cuDNN's: forward, one launch adds the
// bias and applies the activation to cuDNN's output in place; backward, one launch computes dz (dy masked
// with y > 0 under Relu) together with the bias gradient db = Σ dz over N, P, Q, and cuDNN's backward data
// and filter read dz. cudnnConvolutionBiasActivationForward would fold the forward epilogue into cuDNN's
// call, but cuDNN runs it with CUDNN_ACTIVATION_RELU only for the IMPLICIT_PRECOMP_GEMM algorithm, which
// would override the algorithm the search timed fastest; our epilogue costs the one launch that
// cudnnAddTensor cost before.
#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/cudnn_plans.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/conv.h"
#include "dyngrad/ops/conv_graph.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/reduced_precision.cuh"

namespace dyngrad::cuda {

namespace {

// Algorithms that need more scratch memory than this are not considered; the search gets this much.
constexpr std::size_t kWorkspaceLimit = std::size_t{256} << 20;
// A search times kernels from the host, which a CUDA graph capture cannot do; CapturedStep runs each input
// key eagerly first, so its capture finds every plan searched.
constexpr const char* kSearchWhat = "conv2d: cuDNN's algorithm search for a new shape or setting";
constexpr const char* kSearchWhy =
    "the search times kernels on the host; run the step eagerly once with these shapes before capturing "
    "(CapturedStep does), and keep the TF32 and deterministic settings of that run";

struct ConvKey {
    std::array<std::int64_t, 4> x, w;
    std::array<std::int64_t, 2> stride, padding, dilation;
    std::int64_t groups;
    DType dtype;
    int device;
    bool tf32;
    bool deterministic;  // only algorithms cuDNN reports as deterministic
    ConvGraphMode graph_mode;
    auto operator<=>(const ConvKey&) const = default;
};

// One pass's convolution descriptor and algorithm, and the graph API's plan when that was faster. Searched once, on
// the first call that runs the pass (the search needs that pass's buffers); read-only afterwards. A failed search
// leaves `searched` unset, so the next call tries again.
template <typename Algo>
struct PassPlan {
    std::once_flag searched;
    ConvolutionDescriptor conv;  // set to the chosen algorithm's math type (see take_legacy())
    bool legacy = false;         // `algo` holds the fastest legacy algorithm the policy allows
    Algo algo{};
    std::size_t workspace_bytes = 0;
    std::shared_ptr<ConvGraphPlan> graph;  // runs the pass where set (unless a call's operands are misaligned for it)
    std::size_t graph_workspace_bytes = 0;
};

struct ConvPlan {
    bool fma_only = false;       // float32 without TF32: no tensor cores, no FFT or Winograd
    // No FFT or Winograd: float32 without TF32 (their transformed-domain rounding is far above direct summation's)
    // and bf16/f16 (whose transformed tiles lose more still: under compute-sanitizer, where the timing search
    // picked differently, a bf16 5x5 conv's gradients came out 4-8% off the f64 replay).
    bool no_transforms = false;
    bool deterministic = false;  // deterministic mode: only deterministic algorithms
    ConvGraphMode graph_mode = ConvGraphMode::Auto;
    std::string description;     // the key, for conv_search_log() (ops/conv.h)
    ConvGraphProblem graph_problem;  // the same convolution and policy, for the graph API
    TensorDescriptor x, y;
    FilterDescriptor w;
    PassPlan<cudnnConvolutionFwdAlgo_t> forward;
    PassPlan<cudnnConvolutionBwdDataAlgo_t> backward_data;
    PassPlan<cudnnConvolutionBwdFilterAlgo_t> backward_filter;
};

ConvKey conv_key(const Tensor& x, const Tensor& w, const OpAttrs& attrs) {
    ConvKey key{};
    for (int i = 0; i < 4; ++i) {
        key.x[i] = x.shape()[i];
        key.w[i] = w.shape()[i];
    }
    key.stride = attrs.stride;
    key.padding = attrs.padding;
    key.dilation = attrs.dilation;
    for (int i = 0; i < 2; ++i)
        cudnn_window_args(key.x[2 + i], key.w[2 + i], key.padding[i], key.stride[i], key.dilation[i]);
    key.groups = attrs.groups;
    key.dtype = x.dtype();
    key.device = x.device().index;
    key.tf32 = x.dtype() == DType::f32 && allow_tf32();
    key.deterministic = cuda::deterministic();
    key.graph_mode = conv_graph_mode();
    return key;
}

void set_conv_descriptor(cudnnConvolutionDescriptor_t desc, const ConvKey& key, cudnnDataType_t compute,
                         cudnnMathType_t math) {
    constexpr const char* what = "conv2d";
    DG_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        desc, cudnn_dim(key.padding[0], what), cudnn_dim(key.padding[1], what), cudnn_dim(key.stride[0], what),
        cudnn_dim(key.stride[1], what), cudnn_dim(key.dilation[0], what), cudnn_dim(key.dilation[1], what),
        CUDNN_CROSS_CORRELATION, compute));
    DG_CUDNN_CHECK(cudnnSetConvolutionGroupCount(desc, cudnn_dim(key.groups, what)));
    DG_CUDNN_CHECK(cudnnSetConvolutionMathType(desc, math));
}

std::shared_ptr<ConvPlan> make_plan(const ConvKey& key, const Shape& y_shape) {
    constexpr const char* what = "conv2d";
    auto plan = std::make_shared<ConvPlan>();
    const cudnnDataType_t type = cudnn_dtype(key.dtype, what);
    // What the search may use (see the top of this file).
    const cudnnMathType_t math = key.dtype == DType::f64                        ? CUDNN_DEFAULT_MATH
                                 : key.tf32 || is_reduced_precision(key.dtype) ? CUDNN_TENSOR_OP_MATH
                                                                               : CUDNN_FMA_MATH;
    plan->fma_only = key.dtype == DType::f32 && !key.tf32;
    plan->no_transforms = plan->fma_only || is_reduced_precision(key.dtype);
    plan->deterministic = key.deterministic;
    const auto pair = [](const std::array<std::int64_t, 2>& v) { return str("(", v[0], ",", v[1], ")"); };
    plan->description = str("x (", key.x[0], ",", key.x[1], ",", key.x[2], ",", key.x[3], ") w (", key.w[0], ",",
                            key.w[1], ",", key.w[2], ",", key.w[3], ") stride ", pair(key.stride), " padding ",
                            pair(key.padding), " dilation ", pair(key.dilation), " groups ", key.groups, " ",
                            dtype_name(key.dtype), key.tf32 ? " tf32" : "", key.deterministic ? " deterministic" : "",
                            key.graph_mode == ConvGraphMode::Force ? " graph forced"
                            : key.graph_mode == ConvGraphMode::Off ? " graph off"
                                                                    : "");
    plan->graph_mode = key.graph_mode;
    plan->graph_problem = {key.x, key.w, {y_shape[0], y_shape[1], y_shape[2], y_shape[3]}, key.stride, key.padding,
                           key.dilation, key.dtype, plan->fma_only, plan->no_transforms, plan->deterministic,
                           kWorkspaceLimit, plan->description};
    const auto set_4d = [&](cudnnTensorDescriptor_t desc, std::int64_t n, std::int64_t c, std::int64_t h,
                            std::int64_t w) {
        DG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, type, cudnn_dim(n, what),
                                                  cudnn_dim(c, what), cudnn_dim(h, what), cudnn_dim(w, what)));
    };
    set_4d(plan->x.get(), key.x[0], key.x[1], key.x[2], key.x[3]);
    set_4d(plan->y.get(), y_shape[0], y_shape[1], y_shape[2], y_shape[3]);
    DG_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w.get(), type, CUDNN_TENSOR_NCHW, cudnn_dim(key.w[0], what),
                                              cudnn_dim(key.w[1], what), cudnn_dim(key.w[2], what),
                                              cudnn_dim(key.w[3], what)));
    for (cudnnConvolutionDescriptor_t desc :
         {plan->forward.conv.get(), plan->backward_data.conv.get(), plan->backward_filter.conv.get()})
        set_conv_descriptor(desc, key, cudnn_compute_dtype(key.dtype, what), math);

    // cuDNN's output shape must be the one infer::conv2d gave the engine.
    std::array<int, 4> dims{};
    DG_CUDNN_CHECK(cudnnGetConvolutionNdForwardOutputDim(plan->forward.conv.get(), plan->x.get(), plan->w.get(), 4,
                                                         dims.data()));
    for (int i = 0; i < 4; ++i)
        if (dims[i] != y_shape[i])
            throw Error(str("internal: cuDNN's conv2d output (", dims[0], ",", dims[1], ",", dims[2], ",", dims[3],
                            ") differs from the inferred ", to_string(y_shape)));
    return plan;
}

// The plan for this call's shapes, built on first use.
std::shared_ptr<ConvPlan> plan_for(const Tensor& x, const Tensor& w, const OpAttrs& attrs, const Shape& y_shape) {
    const ConvKey key = conv_key(x, w, attrs);
    return plan_cache<ConvKey, ConvPlan>().get(key, [&] { return make_plan(key, y_shape); });
}

// FFT and Winograd algorithms compute in a transformed domain whose float32 rounding is far above direct
// summation's: on the H200 a 5x5 backward data lost 6e-4 relative (direct: ~1e-7) when the timing search
// happened to pick one.
bool transform_based(cudnnConvolutionFwdAlgo_t a) {
    return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdDataAlgo_t a) {
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdFilterAlgo_t a) {
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// cuDNN's names of the algorithms (the enums' names without their CUDNN_CONVOLUTION_…_ALGO_ prefix), for the log.
const char* algorithm_name(cudnnConvolutionFwdAlgo_t a) {
    static constexpr const char* kNames[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                             "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
    return a >= 0 && a < static_cast<int>(std::size(kNames)) ? kNames[a] : "?";
}
const char* algorithm_name(cudnnConvolutionBwdDataAlgo_t a) {
    static constexpr const char* kNames[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
    return a >= 0 && a < static_cast<int>(std::size(kNames)) ? kNames[a] : "?";
}
const char* algorithm_name(cudnnConvolutionBwdFilterAlgo_t a) {
    static constexpr const char* kNames[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                                             "FFT_TILING"};
    return a >= 0 && a < static_cast<int>(std::size(kNames)) ? kNames[a] : "?";
}

// Why a search result may not be used ("" when it may): the workspace limit and the precision policy — never fp16
// down-conversion; for float32 without TF32 neither tensor-core nor transform-based algorithms; no transform-based
// ones for bf16/f16 either (ConvPlan::no_transforms); only deterministic ones in deterministic mode.
template <typename Perf>
const char* refusal(const Perf& r, const ConvPlan& plan) {
    if (r.status != CUDNN_STATUS_SUCCESS) return "failed";
    if (r.memory > kWorkspaceLimit) return "workspace over the limit";
    if (r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return "down-conversion";
    if (plan.deterministic && r.determinism != CUDNN_DETERMINISTIC) return "not deterministic";
    if (plan.fma_only && r.mathType == CUDNN_TENSOR_OP_MATH) return "tensor ops at float32 precision";
    if (plan.no_transforms && transform_based(r.algo)) return "transform-based";
    return "";
}

// Appends every result of a legacy search to `log` ("slower", or why refusal() refuses it; the caller marks the one
// it takes) and returns the index of the fastest allowed (results come sorted by time), -1 when none is.
template <typename Perf>
int legacy_candidates(const ConvPlan& plan, const Perf* results, int count, const char* pass_name,
                      std::vector<ConvSearchEntry>& log) {
    int fastest = -1;
    for (int i = 0; i < count; ++i) {
        const Perf& r = results[i];
        const char* refused = refusal(r, plan);
        if (fastest < 0 && *refused == '\0') fastest = i;
        log.push_back({plan.description, pass_name, algorithm_name(r.algo),
                       r.status == CUDNN_STATUS_SUCCESS ? static_cast<double>(r.time) : -1.0, r.memory,
                       r.mathType != CUDNN_DEFAULT_MATH && r.mathType != CUDNN_FMA_MATH,
                       r.determinism == CUDNN_DETERMINISTIC, *refused ? refused : "slower"});
    }
    return fastest;
}

// Stores a legacy result in the pass. For float32 without TF32 the pass keeps its CUDNN_FMA_MATH descriptor whatever
// math type cuDNN reports for the algorithm (the descriptor's math type is what governs the run); otherwise the pass
// runs with the math type the algorithm was timed with, as cuDNN requires.
template <typename Algo, typename Perf>
void take_legacy(PassPlan<Algo>& pass, const ConvPlan& plan, const Perf& r) {
    pass.algo = r.algo;
    pass.workspace_bytes = r.memory;
    if (!plan.fma_only) DG_CUDNN_CHECK(cudnnSetConvolutionMathType(pass.conv.get(), r.mathType));
    pass.legacy = true;
}

// Picks between the legacy search's results and the graph API's candidates (ops/conv_graph.cu): the faster of the two
// fastest allowed, or the graph's under ConvGraphMode::Force. The legacy algorithm is kept either way, for calls whose
// operands the graph plan cannot take (conv_graph_aligned). Every candidate goes to conv_search_log() with its verdict.
template <typename Algo, typename Perf>
void choose(PassPlan<Algo>& pass, ConvPass which, DeviceContext& ctx, const ConvPlan& plan, const Perf* results,
            int count, const char* pass_name, const ConvGraphOperands& operands, const Workspace& search) {
    std::vector<ConvSearchEntry> log;
    const int legacy = legacy_candidates(plan, results, count, pass_name, log);  // log[i] is results[i]
    if (legacy >= 0) take_legacy(pass, plan, results[legacy]);
    ConvGraphChoice graph;
    if (plan.graph_mode != ConvGraphMode::Off && conv_graph_allowed(plan.graph_problem))
        graph = search_conv_graph(ctx, plan.graph_problem, which, operands, search.data(), log);
    const bool graph_faster = graph.plan && (legacy < 0 || graph.ms < static_cast<double>(results[legacy].time));
    if (graph.plan && (graph_faster || plan.graph_mode == ConvGraphMode::Force)) {
        pass.graph = graph.plan;
        pass.graph_workspace_bytes = graph.workspace_bytes;
        log[graph.log_index].verdict = "chosen";
        if (legacy >= 0 && !graph_faster) log[static_cast<std::size_t>(legacy)].verdict = "graph forced";
    } else if (legacy >= 0) {
        log[static_cast<std::size_t>(legacy)].verdict = "chosen";
    }
    detail::log_conv_search(std::move(log));
    if (legacy >= 0 || pass.graph) return;
    throw CudaError(str("conv2d ", pass_name, " ", plan.description, ": cuDNN found no algorithm for this shape within a ",
                        kWorkspaceLimit >> 20, " MiB workspace", plan.fma_only ? " at full float32 precision" : "",
                        plan.deterministic ? " among deterministic algorithms" : ""));
}

// Whether this call runs the pass's graph plan: the search kept one and the call's operands meet its alignment; a
// misaligned call (a view) runs the legacy algorithm, or throws where the legacy search found none.
template <typename Algo>
bool runs_graph(const PassPlan<Algo>& pass, const ConvGraphOperands& operands, const ConvPlan& plan,
                const char* pass_name) {
    if (!pass.graph) return false;
    if (conv_graph_aligned(operands)) return true;
    if (pass.legacy) return false;
    throw CudaError(str("conv2d ", pass_name, " ", plan.description, ": an operand is not 16-byte aligned, which the ",
                        "graph-API plan of this shape requires, and no legacy algorithm runs the shape"));
}

// Some algorithms cudnnFind*AlgorithmEx times read the workspace or the result buffer before they write
// it (compute-sanitizer's initcheck counted about 350,000 such reads over the [conv_relu] tests, in
// implicit_convolve_dgemm among others). The values they read are overwritten, so the results were right,
// but a search on uninitialised memory is not reproducible under the tools: both buffers are zeroed first.
// A search runs once per shape, never in a captured step, so the two memsets cost nothing per step.
void initialise_search_buffers(DeviceContext& ctx, const Workspace& search, Tensor& result) {
    DG_CUDA_CHECK(cudaMemsetAsync(search.data(), 0, search.bytes(), ctx.stream));
    DG_CUDA_CHECK(cudaMemsetAsync(result.raw_data(), 0, result.nbytes(), ctx.stream));
}

// One pass's search: cuDNN times every algorithm on scratch buffers (`result` is one of them) and the fastest that
// fits is kept (the second of two searches: see below). `max_count_of` is the pass's
// cudnnGet...AlgorithmMaxCount, `find` its cudnnFind...Ex called with (max_count, &count, results, search workspace).
template <typename Perf, typename Algo, typename MaxCountFn, typename FindFn>
void search_pass(DeviceContext& ctx, ConvPlan& plan, PassPlan<Algo>& pass, ConvPass which,
                 const ConvGraphOperands& operands, Tensor& result, const char* pass_name, MaxCountFn max_count_of,
                 FindFn find) {
    throw_if_capturing(ctx.device, kSearchWhat, kSearchWhy);
    int max_count = 0;
    DG_CUDNN_CHECK(max_count_of(ctx.cudnn, &max_count));
    std::vector<Perf> results(static_cast<std::size_t>(max_count));
    int count = 0;
    Workspace search(ctx, kWorkspaceLimit);
    initialise_search_buffers(ctx, search, result);
    // Twice, keeping the second timing: the first launch of each candidate's kernels includes loading their module
    // (CUDA loads modules lazily), which on small shapes outweighs the kernel itself — the first search timed every
    // candidate of lenet5's bf16 backward data at 81–179 µs, and the one it chose then ran for 72.7 µs a step
    // (H200, conv_search_log()).
    DG_CUDNN_CHECK(find(max_count, &count, results.data(), search));
    DG_CUDNN_CHECK(find(max_count, &count, results.data(), search));
    choose(pass, which, ctx, plan, results.data(), count, pass_name, operands, search);
}

void search_forward(DeviceContext& ctx, ConvPlan& plan, const Tensor& x, const Tensor& w, Tensor& y) {
    search_pass<cudnnConvolutionFwdAlgoPerf_t>(
        ctx, plan, plan.forward, ConvPass::forward, {x.raw_data(), w.raw_data(), y.raw_data()}, y, "forward",
        cudnnGetConvolutionForwardAlgorithmMaxCount,
        [&](int max_count, int* count, cudnnConvolutionFwdAlgoPerf_t* results, const Workspace& search) {
            return cudnnFindConvolutionForwardAlgorithmEx(ctx.cudnn, plan.x.get(), x.raw_data(), plan.w.get(),
                                                          w.raw_data(), plan.forward.conv.get(), plan.y.get(),
                                                          y.raw_data(), max_count, count, results, search.data(),
                                                          search.bytes());
        });
}

void search_backward_data(DeviceContext& ctx, ConvPlan& plan, const Tensor& w, const Tensor& dy, Tensor& dx) {
    search_pass<cudnnConvolutionBwdDataAlgoPerf_t>(
        ctx, plan, plan.backward_data, ConvPass::backward_data, {dx.raw_data(), w.raw_data(), dy.raw_data()}, dx,
        "backward data", cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
        [&](int max_count, int* count, cudnnConvolutionBwdDataAlgoPerf_t* results, const Workspace& search) {
            return cudnnFindConvolutionBackwardDataAlgorithmEx(
                ctx.cudnn, plan.w.get(), w.raw_data(), plan.y.get(), dy.raw_data(), plan.backward_data.conv.get(),
                plan.x.get(), dx.raw_data(), max_count, count, results, search.data(), search.bytes());
        });
}

void search_backward_filter(DeviceContext& ctx, ConvPlan& plan, const Tensor& x, const Tensor& dy, Tensor& dw) {
    search_pass<cudnnConvolutionBwdFilterAlgoPerf_t>(
        ctx, plan, plan.backward_filter, ConvPass::backward_filter, {x.raw_data(), dw.raw_data(), dy.raw_data()}, dw,
        "backward filter", cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
        [&](int max_count, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* results, const Workspace& search) {
            return cudnnFindConvolutionBackwardFilterAlgorithmEx(
                ctx.cudnn, plan.x.get(), x.raw_data(), plan.y.get(), dy.raw_data(), plan.backward_filter.conv.get(),
                plan.w.get(), dw.raw_data(), max_count, count, results, search.data(), search.bytes());
        });
}

// ---- bias and activation ----

constexpr unsigned kThreads = 256;
constexpr std::int64_t kMaxChain = 256;           // most values one thread adds in sequence (as ops/reduce.cu)
constexpr std::int64_t kMinChunk = 8 * kThreads;  // fewest values a block of the backward kernel takes
constexpr std::int64_t kBlocksPerSm = 4;          // blocks the backward kernel aims for
constexpr std::int64_t kMaxChunks = 65535;        // gridDim.y
constexpr int kUnroll = 4;                        // values whose loads one backward thread has in flight

// y (N,K,HW) in place: y = relu(y + b[k]) with Relu, y + b[k] without; no bias when b is null. I: 32-bit indices
// where they fit (an int64 division per element made this kernel run at half the copy bandwidth on the H200).
template <typename T, bool Relu, typename I>
__global__ void conv2d_bias_activation_kernel(T* __restrict__ y, const T* __restrict__ b, I n, I channels, I hw) {
    const I step = static_cast<I>(gridDim.x) * blockDim.x;
    for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
        acc_t<T> v = to_acc(y[i]);
        if (b != nullptr) v += to_acc(b[(i / hw) % channels]);
        if constexpr (Relu) v = math::ReluOp::forward(v, acc_t<T>(0));
        y[i] = from_acc<T>(v);
    }
}

// dy, y (N,K,HW) -> dz (N,K,HW) = ReluOp::masked_gradient(y, dy) (Relu; written with '=' unless dz is null) and
// db (K) = Σ over N, HW of dz (of dy without Relu; written with '=' unless db is null).
// Grid (K, chunks): block (k, c) takes chunk c of channel k's N·HW values (j = n·HW + s). With one chunk
// per channel the block writes db[k]. Otherwise it writes partials[k·chunks + c], and the last block to
// finish, counted on `counter` (which it leaves 0 again), adds each channel's partials in chunk order: one
// launch, and sums that do not depend on which block finishes when (the memory-fence example of the CUDA
// C++ Programming Guide; only the integer counter is atomic). Sums and partials are in acc_t<T>.
template <typename T, bool Relu>
__global__ void conv2d_activation_backward_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                                  T* __restrict__ dz, T* __restrict__ db,
                                                  acc_t<T>* __restrict__ partials,
                                                  unsigned* __restrict__ counter, std::int64_t images,
                                                  std::int64_t channels, std::int64_t hw, std::int64_t chunk) {
    using A = acc_t<T>;
    using BlockReduce = cub::BlockReduce<A, kThreads>;
    __shared__ typename BlockReduce::TempStorage temp;
    __shared__ bool last;
    const std::int64_t k = blockIdx.x;
    const std::int64_t begin = blockIdx.y * chunk + threadIdx.x;
    const std::int64_t chunk_end = (blockIdx.y + 1) * chunk;
    const std::int64_t end = chunk_end < images * hw ? chunk_end : images * hw;
    // j's image and position, advanced without a division per value
    std::int64_t image = begin / hw, position = begin % hw;
    const std::int64_t step_image = kThreads / hw, step_position = kThreads % hw;
    A sum = 0;
    // kUnroll values per round: their loads are all issued before the first is used. One value per round
    // waited a memory latency per value (8 in a row for lenet5 b64's first layer: 4.6-5.5 µs a launch
    // against 2.9 for Inductor's reduction, CUPTI, H200). The additions keep their order: the same bits.
    for (std::int64_t j = begin; j < end; j += kThreads * kUnroll) {
        std::int64_t offsets[kUnroll];
        A g[kUnroll], y_values[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            offsets[u] = (image * channels + k) * hw + position;
            image += step_image;
            position += step_position;
            if (position >= hw) {
                position -= hw;
                ++image;
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const bool inside = j + u * static_cast<std::int64_t>(kThreads) < end;
            g[u] = inside ? to_acc(dy[offsets[u]]) : A(0);
            if constexpr (Relu) y_values[u] = inside ? to_acc(y[offsets[u]]) : A(0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            if (j + u * static_cast<std::int64_t>(kThreads) >= end) break;
            if constexpr (Relu) {
                g[u] = math::ReluOp::masked_gradient(y_values[u], g[u]);
                if (dz != nullptr) dz[offsets[u]] = from_acc<T>(g[u]);
            }
            sum += g[u];
        }
    }
    if (db == nullptr) return;  // the same for every thread of the block
    sum = BlockReduce(temp).Sum(sum);
    if (gridDim.y == 1) {
        if (threadIdx.x == 0) db[k] = from_acc<T>(sum);
        return;
    }
    if (threadIdx.x == 0) {
        partials[k * gridDim.y + blockIdx.y] = sum;
        __threadfence();  // the partial is visible to every block before this block counts itself done
        last = atomicAdd(counter, 1u) == gridDim.x * gridDim.y - 1;
    }
    __syncthreads();
    if (!last) return;
    for (std::int64_t c = threadIdx.x; c < channels; c += kThreads) {
        A total = 0;
        for (unsigned i = 0; i < gridDim.y; ++i) total += __ldcg(partials + c * gridDim.y + i);  // from L2
        db[c] = from_acc<T>(total);
    }
    if (threadIdx.x == 0) *counter = 0;
}

// y (N,K,P,Q) in place: y = act(y + b); b may be null (no bias).
void bias_activation_forward(DeviceContext& ctx, const Tensor& y, const Tensor* b, Activation activation) {
    const std::int64_t n = y.numel(), channels = y.shape()[1], hw = y.shape()[2] * y.shape()[3];
    const unsigned blocks = grid_size(ctx, n, kThreads);
    const bool narrow = fits_int32_indices(n, blocks, kThreads);
    dispatch_gpu_floating(y.dtype(), "conv2d", [&]<typename T>() {
        const T* bias = b != nullptr ? b->data<T>() : nullptr;
        const auto launch = [&]<typename I>() {
            if (activation == Activation::Relu)
                conv2d_bias_activation_kernel<T, true, I><<<blocks, kThreads, 0, ctx.stream>>>(
                    y.data<T>(), bias, static_cast<I>(n), static_cast<I>(channels), static_cast<I>(hw));
            else
                conv2d_bias_activation_kernel<T, false, I><<<blocks, kThreads, 0, ctx.stream>>>(
                    y.data<T>(), bias, static_cast<I>(n), static_cast<I>(channels), static_cast<I>(hw));
            DG_CUDA_CHECK_LAUNCH();
        };
        if (narrow) launch.template operator()<std::int32_t>();
        else launch.template operator()<std::int64_t>();
    });
}

// dy, y (N,K,P,Q) -> dz (N,K,P,Q) under Relu, unless dz is undefined, and db (K) unless db is undefined;
// without activation the kernel only sums dy into db.
void activation_backward(DeviceContext& ctx, const Tensor& dy, const Tensor& y, Activation activation,
                         const Tensor& dz, const Tensor& db) {
    const std::int64_t images = dy.shape()[0], channels = dy.shape()[1], hw = dy.shape()[2] * dy.shape()[3];
    const std::int64_t per_channel = images * hw;
    if (channels > INT32_MAX) throw ValueError(str("conv2d: ", channels, " output channels exceed the grid"));
    // Chunks per channel: enough blocks for the GPU, each of at least kMinChunk values, and no thread adding
    // more than kMaxChain values in sequence. Without db, one chunk (nothing to combine).
    std::int64_t chunks = 1;
    if (db.defined()) {
        const std::int64_t wanted = std::max<std::int64_t>(ctx.multiprocessors, 1) * kBlocksPerSm;
        const std::int64_t longest = kThreads * kMaxChain;
        chunks = std::min((wanted + channels - 1) / channels, (per_channel + kMinChunk - 1) / kMinChunk);
        chunks = std::clamp<std::int64_t>(std::max(chunks, (per_channel + longest - 1) / longest), 1, kMaxChunks);
    }
    const std::int64_t chunk = (per_channel + chunks - 1) / chunks;
    chunks = (per_channel + chunk - 1) / chunk;  // no empty chunks
    const dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(chunks));
    dispatch_gpu_floating(dy.dtype(), "conv2d backward", [&]<typename T>() {
        std::optional<Workspace> partials;
        if (chunks > 1) partials.emplace(ctx, static_cast<std::size_t>(channels * chunks) * sizeof(acc_t<T>));
        acc_t<T>* partial_sums = partials ? static_cast<acc_t<T>*>(partials->data()) : nullptr;
        T* dz_data = dz.defined() ? dz.data<T>() : nullptr;
        T* db_data = db.defined() ? db.data<T>() : nullptr;
        if (activation == Activation::Relu)
            conv2d_activation_backward_kernel<T, true><<<grid, kThreads, 0, ctx.stream>>>(
                dy.data<T>(), y.data<T>(), dz_data, db_data, partial_sums, ctx.block_counter, images, channels, hw,
                chunk);
        else
            conv2d_activation_backward_kernel<T, false><<<grid, kThreads, 0, ctx.stream>>>(
                dy.data<T>(), nullptr, nullptr, db_data, partial_sums, ctx.block_counter, images, channels, hw,
                chunk);
        DG_CUDA_CHECK_LAUNCH();
    });
}

}  // namespace

// x (N,C,H,W)  w (K,C/groups,R,S)  b (K)  y (N,K,P,Q) = act(conv(x, w) + b)
Tensor conv2d_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& w = args.inputs[1];
    DeviceContext& ctx = context_for(x);
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    if (y.numel() == 0) return y;  // an empty batch: cuDNN rejects zero-sized descriptors
    const std::shared_ptr<ConvPlan> plan = plan_for(x, w, args.attrs, y.shape());
    std::call_once(plan->forward.searched, [&] { search_forward(ctx, *plan, x, w, y); });
    const Scaling scaling(x.dtype());
    const ConvGraphOperands operands{x.raw_data(), w.raw_data(), y.raw_data()};
    const bool graph = runs_graph(plan->forward, operands, *plan, "forward");
    Workspace workspace(ctx, graph ? plan->forward.graph_workspace_bytes : plan->forward.workspace_bytes);
    if (graph)
        run_conv_graph(*plan->forward.graph, ctx, operands, workspace.data());
    else
        DG_CUDNN_CHECK(cudnnConvolutionForward(ctx.cudnn, scaling.one(), plan->x.get(), x.raw_data(), plan->w.get(),
                                               w.raw_data(), plan->forward.conv.get(), plan->forward.algo,
                                               workspace.data(), workspace.bytes(), scaling.zero(), plan->y.get(),
                                               y.raw_data()));
    const bool has_bias = args.inputs.size() == 3;
    if (has_bias || args.attrs.activation != Activation::None)
        bias_activation_forward(ctx, y, has_bias ? &args.inputs[2] : nullptr, args.attrs.activation);
    return y;
}

// dy (N,K,P,Q) -> dz = dy masked with y > 0 under Relu (dy itself without activation) and db = Σ of dz
// over N, P, Q (K) in one launch of ours; dw (K,C/groups,R,S) by cuDNN backward filter (on the side lane when
// small) and dx (N,C,H,W) by backward data, both from dz
std::vector<Tensor> conv2d_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& w = args.inputs[1];
    const Tensor& dy = args.grad_output;
    DeviceContext& ctx = context_for(x);
    std::vector<Tensor> grads(args.inputs.size());
    if (dy.numel() == 0) {  // an empty batch: dx is empty, dw and db are empty sums
        for (std::size_t i = 0; i < grads.size(); ++i)
            if (args.needs_grad[i]) grads[i] = Tensor::zeros(args.inputs[i].shape(), x.dtype(), x.device());
        return grads;
    }
    const std::shared_ptr<ConvPlan> plan = plan_for(x, w, args.attrs, dy.shape());
    const Scaling scaling(x.dtype());
    const bool relu = args.attrs.activation == Activation::Relu;
    // dz is written only when cuDNN reads it, db only when wanted.
    const bool write_dz = relu && (args.needs_grad[0] || args.needs_grad[1]);
    const Tensor dz = write_dz ? Tensor::empty(dy.shape(), dy.dtype(), dy.device()) : dy;
    const Tensor db = args.inputs.size() == 3 && args.needs_grad[2]
                          ? Tensor::empty(args.inputs[2].shape(), x.dtype(), x.device())
                          : Tensor();
    if (write_dz || db.defined()) {
        activation_backward(ctx, dy, args.output, args.attrs.activation, write_dz ? dz : Tensor(), db);
        if (db.defined()) grads[2] = db;
    }
    // dw only feeds the optimizer: a small one runs on the side lane, beside dx's chain. Its search and its
    // workspace come first, on the main stream (the lane's work may only use blocks allocated before the fork).
    if (args.needs_grad[1]) {
        Tensor dw = Tensor::empty(w.shape(), w.dtype(), w.device());
        PassPlan<cudnnConvolutionBwdFilterAlgo_t>& pass = plan->backward_filter;
        std::call_once(pass.searched, [&] { search_backward_filter(ctx, *plan, x, dz, dw); });
        const ConvGraphOperands operands{x.raw_data(), dw.raw_data(), dz.raw_data()};
        const bool graph = runs_graph(pass, operands, *plan, "backward filter");
        Workspace workspace(ctx, graph ? pass.graph_workspace_bytes : pass.workspace_bytes);
        const double work = static_cast<double>(w.numel()) * static_cast<double>(dy.numel() / dy.shape()[1]);
        SideWork side(ctx, side_lane_wanted(ctx, work));
        DeviceContext& weight_ctx = side.lane() ? *side.lane() : ctx;
        if (graph)
            run_conv_graph(*pass.graph, weight_ctx, operands, workspace.data());  // on the lane's handle and stream
        else
            DG_CUDNN_CHECK(cudnnConvolutionBackwardFilter(weight_ctx.cudnn, scaling.one(), plan->x.get(),
                                                          x.raw_data(), plan->y.get(), dz.raw_data(), pass.conv.get(),
                                                          pass.algo, workspace.data(), workspace.bytes(),
                                                          scaling.zero(), plan->w.get(), dw.raw_data()));
        side.keep(x);
        side.keep(dz);
        side.keep(workspace);
        side.produced(dw);
        grads[1] = std::move(dw);
    }
    if (args.needs_grad[0]) {
        Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
        PassPlan<cudnnConvolutionBwdDataAlgo_t>& pass = plan->backward_data;
        std::call_once(pass.searched, [&] { search_backward_data(ctx, *plan, w, dz, dx); });
        const ConvGraphOperands operands{dx.raw_data(), w.raw_data(), dz.raw_data()};
        const bool graph = runs_graph(pass, operands, *plan, "backward data");
        Workspace workspace(ctx, graph ? pass.graph_workspace_bytes : pass.workspace_bytes);
        if (graph)
            run_conv_graph(*pass.graph, ctx, operands, workspace.data());
        else
            DG_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx.cudnn, scaling.one(), plan->w.get(), w.raw_data(),
                                                        plan->y.get(), dz.raw_data(), pass.conv.get(), pass.algo,
                                                        workspace.data(), workspace.bytes(), scaling.zero(),
                                                        plan->x.get(), dx.raw_data()));
        grads[0] = std::move(dx);
    }
    return grads;
}

}  // namespace dyngrad::cuda
