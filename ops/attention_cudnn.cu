// scaled_dot_product_attention for bfloat16/float16 on cuDNN's fused flash attention, built with cuDNN's backend
// graph API (cudnn_graph.h; cuDNN 9). cuDNN's runtime-fusion engines recognise the scaled-dot-product-attention
// patterns below, node for node, and run each as one flash-attention kernel (forward) or a few (backward):
//
// Forward (O and Stats are outputs; every other tensor is virtual, f32 unless named):
//   S  = matmul(Q, Kᵀ)                      Kᵀ: K's memory read as (B,H,D,S)
//   S  = S · scale                           pointwise MUL with a by-value f32 scalar
//   [causal] row = GEN_INDEX(S, axis 2), col = GEN_INDEX(S, axis 3) (int32), keep = CMP_GE(row, col) (bool),
//            S = BINARY_SELECT(S, −inf, keep)   (top-left aligned: key s takes part when s <= t)
//   M  = reduce MAX(S) (B,H,T,1);  E = exp(S − M);  L = reduce ADD(E) (B,H,T,1)
//   Stats = M + log L   (f32 (B,H,T,1): the log-sum-exp of the scaled, masked scores, natural log: exactly the
//                        lse dyngrad's kernels save, so the paths share the saved tensor)
//   P  = E / L   (in the data's dtype: the second matmul's A operand)
//   O  = matmul(P, V)
// Backward (cuDNN's "sdpa backward" pattern; dQ, dK, dV outputs; softmax_sum and dQ_accum are f32 scratch
// tensors in our workspace that the graph names, as cudnn-frontend lays them out):
//   softmax_sum = reduce ADD(dO ∘ O) · 1 (B,H,T,1)
//   P  = exp(matmul(Q, Kᵀ) · scale − Stats) [causal: BINARY_SELECT(…, −inf, row >= col) before the exp]
//   dV = matmul(reshape(P) as (B,H,S,T), dO)
//   dS = (matmul(dO, Vᵀ) − softmax_sum) ∘ P · scale
//   dK = matmul(reshape(dS) as (B,H,S,T), Q)
//   dQ_accum = matmul(dS, reshape(Kᵀ) as (B,H,S,D));  dQ = IDENTITY(dQ_accum)
// Learnt from cuDNN's documentation (graph API, supported SDPA patterns) and NVIDIA/cudnn-frontend's SDPA nodes.
// Over 600 lines: the forward and backward graphs node for node, their plans and the run record, one path in one file.
//
// Plans: one per (device, dtype, B, H, T, S, D, causal, scale, direction, deterministic, layout) in the plan cache
// (contiguous operands, or qkv_attention's packed ones: the strides follow from the shape and the layout,
// strides_of); a case cuDNN refuses is remembered there too, with the reason. Heuristics: mode A, then the fallback
// list; the first engine config whose execution plan finalizes wins (in deterministic mode only configs without the
// nondeterministic note). Scratch memory comes from the allocator (a Workspace) per call, as every cuDNN op here:
// a training step stays capturable.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dyngrad/cuda/cudnn_graph.h"
#include "dyngrad/cuda/plan_cache.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/attention.h"
#include "dyngrad/ops/attention_cudnn.h"

namespace dyngrad::cuda {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention (cuDNN)";

// ---- which implementation ran the last call of this thread ----
thread_local AttentionRunInfo t_last_run;

struct AttentionPlanKey {
    int device = 0;
    DType dtype = DType::bf16;
    std::int64_t batch = 0, heads = 0, queries = 0, keys = 0, head_dim = 0;
    bool causal = false;
    std::uint32_t scale_bits = 0;  // the f32 scale the graph multiplies by
    bool backward = false;
    bool deterministic = false;
    bool packed = false;  // qkv_attention's layouts (Strides below); otherwise contiguous (B,H,T,D) operands
    auto operator<=>(const AttentionPlanKey&) const = default;
};

// Unique ids of the tensors the variant pack addresses; virtual tensors are numbered from kFirstVirtual.
enum Uid : std::int64_t {
    kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kScale, kMinusInfinity, kOne, kSoftmaxSum, kDQAccum,
    kFirstVirtual = 100
};

// A cuDNN refusal ("not supported") while building a plan: the plan records it and the kernels run.
struct Refused {
    std::string reason;
};

using Dims = std::array<std::int64_t, 4>;

// Builds one operation graph: owns every tensor and operation descriptor (cuDNN's operation graph and plan
// refer to them), names each after its node for the error messages.
class GraphBuilder {
public:
    GraphBuilder(cudnnDataType_t io_type) : io_type_(io_type) {}

    cudnnDataType_t io() const { return io_type_; }

    // A tensor the variant pack addresses (uid fixed), or a virtual one (uid 0: numbered here).
    const BackendDescriptor& tensor(const char* name, std::int64_t uid, cudnnDataType_t type, Dims dims,
                                    Dims strides, bool is_virtual = false) {
        BackendDescriptor& t = tensors_.emplace_back(CUDNN_BACKEND_TENSOR_DESCRIPTOR, str("tensor ", name));
        t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type)
            .set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
            .set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides)
            .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, is_virtual ? next_virtual_++ : uid)
            .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
        if (is_virtual) t.set_bool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, true);
        finalize(t);
        return t;
    }
    const BackendDescriptor& virtual_tensor(const char* name, cudnnDataType_t type, Dims dims, Dims strides) {
        return tensor(name, 0, type, dims, strides, true);
    }
    // An f32 scalar passed by value (the variant pack points at host memory).
    const BackendDescriptor& scalar(const char* name, std::int64_t uid) {
        BackendDescriptor& t = tensors_.emplace_back(CUDNN_BACKEND_TENSOR_DESCRIPTOR, str("scalar ", name));
        const Dims ones{1, 1, 1, 1};
        t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT)
            .set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, ones)
            .set_int64s(CUDNN_ATTR_TENSOR_STRIDES, ones)
            .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
            .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16)
            .set_bool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
        finalize(t);
        return t;
    }

    void matmul(const char* name, const BackendDescriptor& a, const BackendDescriptor& b, const BackendDescriptor& c) {
        BackendDescriptor& desc = descriptors_.emplace_back(CUDNN_BACKEND_MATMUL_DESCRIPTOR, str(name, " (matmul)"));
        desc.set_data_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
        finalize(desc);
        BackendDescriptor& op = operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
        op.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
            .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
            .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
            .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_DESC, desc);
        finalize(op);
    }

    // y = mode(x[, b[, t]]); `compute` is the pointwise math precision; GEN_INDEX takes an axis.
    void pointwise(const char* name, cudnnPointwiseMode_t mode, const BackendDescriptor& x, const BackendDescriptor& y,
                   const BackendDescriptor* b = nullptr, const BackendDescriptor* t = nullptr,
                   cudnnDataType_t compute = CUDNN_DATA_FLOAT, std::optional<std::int64_t> axis = std::nullopt) {
        BackendDescriptor& desc = descriptors_.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, str(name, " (pointwise)"));
        desc.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
            .set_data_type(CUDNN_ATTR_POINTWISE_MATH_PREC, compute);
        if (axis) desc.set_int64(CUDNN_ATTR_POINTWISE_AXIS, *axis);
        finalize(desc);
        BackendDescriptor& op = operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
        op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc)
            .set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
        if (b) op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
        if (t) op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
        op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
            .set_float(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0f)
            .set_float(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0f);
        finalize(op);
    }

    void reduction(const char* name, cudnnReduceTensorOp_t mode, const BackendDescriptor& x, const BackendDescriptor& y) {
        BackendDescriptor& desc = descriptors_.emplace_back(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, str(name, " (reduction)"));
        desc.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
            .set_data_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
        finalize(desc);
        BackendDescriptor& op = operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
        op.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
            .set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
            .set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc);
        finalize(op);
    }

    // y: x's elements under other dimensions/strides (a transposed view).
    void reshape(const char* name, const BackendDescriptor& x, const BackendDescriptor& y) {
        BackendDescriptor& op = operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
        op.set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
        finalize(op);
    }

    // The finalized operation graph of every operation added, in order.
    BackendDescriptor operation_graph(cudnnHandle_t handle, const char* name) {
        BackendDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, name);
        const std::vector<cudnnBackendDescriptor_t> ops = raw_descriptors(operations_);
        graph.set_descriptors(CUDNN_ATTR_OPERATIONGRAPH_OPS, ops)
            .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        finalize(graph);
        return graph;
    }

private:
    BackendDescriptor& operation(cudnnBackendDescriptorType_t type, const char* name) {
        return operations_.emplace_back(type, name);
    }
    // "Not supported" at any node: cuDNN does not take this graph; the node is named in the reason.
    static void finalize(BackendDescriptor& d) {
        const cudnnStatus_t status = d.try_finalize();
        if (status != CUDNN_STATUS_SUCCESS)
            throw Refused{str("cuDNN refused node '", d.name(), "' at finalize: ", cudnn_status_text(status))};
    }

    cudnnDataType_t io_type_;
    std::int64_t next_virtual_ = kFirstVirtual;
    // deques: references stay valid as descriptors are added.
    std::deque<BackendDescriptor> tensors_, descriptors_, operations_;
};

struct AttentionPlan {
    std::string refused;  // non-empty: cuDNN does not run this case (why); nothing else is set
    std::unique_ptr<GraphBuilder> graph;  // the descriptors the plan was built from (kept with it)
    BackendDescriptor operation_graph, plan;
    std::size_t engine_workspace = 0;  // bytes cuDNN's engine needs
    std::size_t softmax_sum_offset = 0, dq_accum_offset = 0, workspace_bytes = 0;  // our layout of the workspace
    // By-value scalars: the variant pack points at these (host memory that lives as long as the plan).
    float scale = 1.0f, minus_infinity = -std::numeric_limits<float>::infinity(), one = 1.0f;
    std::vector<std::int64_t> uids;  // the variant pack's order

    // The last variant pack built, reused while the data pointers repeat (a captured or steady training loop).
    std::mutex variant_mutex;
    std::vector<void*> variant_pointers;
    BackendDescriptor variant_pack;
};

constexpr std::size_t align_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

Dims contiguous(Dims dims) { return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1}; }

// Element strides of the operands, as (B,H,T,D) tensors (K and V also read transposed, (B,H,D,S)). Contiguous
// operands, or qkv_attention's packed ones: q, k, v (and dq, dk, dv) interleaved in (B,T,3,H,D) (S = T), y and dy
// in (B,T,H,D): the graph reads and writes them where they are, as llm.c's cuDNN attention does.
struct Strides {
    Dims q, k, v, k_t, v_t, o;
};
Strides strides_of(const AttentionPlanKey& key) {
    const std::int64_t B = key.batch, H = key.heads, T = key.queries, S = key.keys, D = key.head_dim;
    if (!key.packed) {
        const Dims keys_t{H * S * D, S * D, 1, D};
        return {contiguous({B, H, T, D}), contiguous({B, H, S, D}), contiguous({B, H, S, D}), keys_t, keys_t,
                contiguous({B, H, T, D})};
    }
    const std::int64_t row = 3 * H * D;  // one position's q, k and v
    const Dims qkv{T * row, D, row, 1}, qkv_t{S * row, D, 1, row};
    return {qkv, qkv, qkv, qkv_t, qkv_t, {T * H * D, D, H * D, 1}};
}

// The scores x (B,H,T,S) with −inf where key s comes after query t (row < column): is_causal's mask, built
// from generated indices as cuDNN's fused-attention patterns expect.
const BackendDescriptor& causal_masked(GraphBuilder& b, const BackendDescriptor& x, const Dims& scores,
                                       const Dims& scores_strides) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const auto& minus_infinity = b.scalar("-inf", kMinusInfinity);
    const auto& rows = b.virtual_tensor("row index", CUDNN_DATA_INT32, scores, scores_strides);
    const auto& cols = b.virtual_tensor("column index", CUDNN_DATA_INT32, scores, scores_strides);
    const auto& keep = b.virtual_tensor("row >= column", CUDNN_DATA_BOOLEAN, scores, scores_strides);
    const auto& masked = b.virtual_tensor("causal S", f32, scores, scores_strides);
    b.pointwise("gen_row_index", CUDNN_POINTWISE_GEN_INDEX, x, rows, nullptr, nullptr, f32, 2);
    b.pointwise("gen_col_index", CUDNN_POINTWISE_GEN_INDEX, x, cols, nullptr, nullptr, f32, 3);
    b.pointwise("row >= col", CUDNN_POINTWISE_CMP_GE, rows, keep, &cols, nullptr, CUDNN_DATA_BOOLEAN);
    b.pointwise("causal select", CUDNN_POINTWISE_BINARY_SELECT, x, masked, &minus_infinity, &keep);
    return masked;
}

void build_forward(GraphBuilder& b, const AttentionPlanKey& key) {
    const std::int64_t B = key.batch, H = key.heads, T = key.queries, S = key.keys, D = key.head_dim;
    const cudnnDataType_t io = b.io(), f32 = CUDNN_DATA_FLOAT;
    const Dims scores{B, H, T, S}, scores_strides = contiguous(scores);
    const Dims row{B, H, T, 1}, row_strides{H * T, T, 1, 1};
    const Strides strides = strides_of(key);
    const auto& q = b.tensor("Q", kQ, io, {B, H, T, D}, strides.q);
    const auto& kt = b.tensor("K^T", kK, io, {B, H, D, S}, strides.k_t);
    const auto& v = b.tensor("V", kV, io, {B, H, S, D}, strides.v);
    const auto& o = b.tensor("O", kO, io, {B, H, T, D}, strides.o);
    const auto& stats = b.tensor("Stats", kStats, f32, row, row_strides);
    const auto& scale = b.scalar("scale", kScale);

    const auto& s = b.virtual_tensor("S = Q·K^T", f32, scores, scores_strides);
    b.matmul("bmm1 Q·K^T", q, kt, s);
    const auto* last = &b.virtual_tensor("S·scale", f32, scores, scores_strides);
    b.pointwise("attn_scale", CUDNN_POINTWISE_MUL, s, *last, &scale);
    if (key.causal) last = &causal_masked(b, *last, scores, scores_strides);
    // Softmax with its statistics.
    const auto& max = b.virtual_tensor("M = max S", f32, row, row_strides);
    b.reduction("softmax max", CUDNN_REDUCE_TENSOR_MAX, *last, max);
    const auto& centred = b.virtual_tensor("S - M", f32, scores, scores_strides);
    b.pointwise("softmax sub", CUDNN_POINTWISE_SUB, *last, centred, &max);
    const auto& e = b.virtual_tensor("E = exp(S - M)", f32, scores, scores_strides);
    b.pointwise("softmax exp", CUDNN_POINTWISE_EXP, centred, e);
    const auto& sum = b.virtual_tensor("L = sum E", f32, row, row_strides);
    b.reduction("softmax sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
    const auto& log_sum = b.virtual_tensor("log L", f32, row, row_strides);
    b.pointwise("softmax log", CUDNN_POINTWISE_LOG, sum, log_sum);
    b.pointwise("softmax stats", CUDNN_POINTWISE_ADD, max, stats, &log_sum);
    const auto& p = b.virtual_tensor("P = E / L", io, scores, scores_strides);
    b.pointwise("softmax div", CUDNN_POINTWISE_DIV, e, p, &sum);
    b.matmul("bmm2 P·V", p, v, o);
}

void build_backward(GraphBuilder& b, const AttentionPlanKey& key) {
    const std::int64_t B = key.batch, H = key.heads, T = key.queries, S = key.keys, D = key.head_dim;
    const cudnnDataType_t io = b.io(), f32 = CUDNN_DATA_FLOAT;
    const Dims scores{B, H, T, S}, scores_strides = contiguous(scores);
    const Dims scores_t{B, H, S, T}, scores_t_strides{H * T * S, T * S, 1, S};  // (B,H,T,S) memory read transposed
    const Dims row{B, H, T, 1}, row_strides{H * T, T, 1, 1};
    const Dims queries{B, H, T, D}, keys{B, H, S, D}, keys_t{B, H, D, S};
    const Strides strides = strides_of(key);  // the gradients share their operands' layout
    const auto& q = b.tensor("Q", kQ, io, queries, strides.q);
    const auto& kt = b.tensor("K^T", kK, io, keys_t, strides.k_t);
    const auto& vt = b.tensor("V^T", kV, io, keys_t, strides.v_t);
    const auto& o = b.tensor("O", kO, io, queries, strides.o);
    const auto& d_o = b.tensor("dO", kDO, io, queries, strides.o);
    const auto& stats = b.tensor("Stats", kStats, f32, row, row_strides);
    const auto& dq = b.tensor("dQ", kDQ, io, queries, strides.q);
    const auto& dk = b.tensor("dK", kDK, io, keys, strides.k);
    const auto& dv = b.tensor("dV", kDV, io, keys, strides.v);
    const auto& softmax_sum = b.tensor("softmax_sum", kSoftmaxSum, f32, row, row_strides);
    const auto& dq_accum = b.tensor("dQ_accum", kDQAccum, f32, queries, contiguous(queries));
    const auto& scale = b.scalar("scale", kScale);
    const auto& one = b.scalar("1", kOne);

    // softmax_sum = rowsum(dO ∘ O)
    const auto& d_o_o = b.virtual_tensor("dO*O", f32, queries, contiguous(queries));
    b.pointwise("mul_dO_O", CUDNN_POINTWISE_MUL, d_o, d_o_o, &o);
    const auto& row_dot = b.virtual_tensor("rowsum(dO*O)", f32, row, row_strides);
    b.reduction("reduce_dO_O", CUDNN_REDUCE_TENSOR_ADD, d_o_o, row_dot);
    b.pointwise("scale_softmax_sum", CUDNN_POINTWISE_MUL, row_dot, softmax_sum, &one);

    // P = exp(S·scale − Stats), masked
    const auto& s = b.virtual_tensor("S = Q·K^T", f32, scores, scores_strides);
    b.matmul("matmul_Q_KT", q, kt, s);
    const auto& scaled = b.virtual_tensor("S·scale", f32, scores, scores_strides);
    b.pointwise("mul_s_attn_scale", CUDNN_POINTWISE_MUL, s, scaled, &scale);
    const auto* last = &b.virtual_tensor("S·scale - Stats", f32, scores, scores_strides);
    b.pointwise("sub_s_stats", CUDNN_POINTWISE_SUB, scaled, *last, &stats);
    if (key.causal) last = &causal_masked(b, *last, scores, scores_strides);
    const auto& p = b.virtual_tensor("P = exp(...)", f32, scores, scores_strides);
    b.pointwise("exp_s", CUDNN_POINTWISE_EXP, *last, p);

    // dV = Pᵀ·dO
    const auto& p_t = b.virtual_tensor("P^T", io, scores_t, scores_t_strides);
    b.reshape("reshape_p", p, p_t);
    b.matmul("matmul_pT_dO", p_t, d_o, dv);

    // dS = (dO·Vᵀ − softmax_sum) ∘ P · scale
    const auto& dp = b.virtual_tensor("dP = dO·V^T", f32, scores, scores_strides);
    b.matmul("matmul_dO_VT", d_o, vt, dp);
    const auto& dp_centred = b.virtual_tensor("dP - softmax_sum", f32, scores, scores_strides);
    b.pointwise("sub_dP_softmax_sum", CUDNN_POINTWISE_SUB, dp, dp_centred, &softmax_sum);
    const auto& ds_unscaled = b.virtual_tensor("(dP - softmax_sum)*P", f32, scores, scores_strides);
    b.pointwise("mul_dP_exp_s", CUDNN_POINTWISE_MUL, dp_centred, ds_unscaled, &p);
    const auto& ds = b.virtual_tensor("dS", f32, scores, scores_strides);
    b.pointwise("mul_dS_attn_scale", CUDNN_POINTWISE_MUL, ds_unscaled, ds, &scale);

    // dK = dSᵀ·Q
    const auto& ds_t = b.virtual_tensor("dS^T", io, scores_t, scores_t_strides);
    b.reshape("reshape_dS", ds, ds_t);
    b.matmul("matmul_dST_Q", ds_t, q, dk);

    // dQ = dS·K, accumulated in f32
    const auto& k = b.virtual_tensor("K", io, keys, strides.k);  // K^T's memory read as (B,H,S,D)
    b.reshape("reshape_k", kt, k);
    b.matmul("matmul_dS_K", ds, k, dq_accum);
    b.pointwise("identity_dQ", CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
}

// Whether an engine config carries the nondeterministic numerical note.
bool nondeterministic(const BackendDescriptor& config) {
    BackendDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine of an engine config");
    cudnnBackendDescriptor_t raw = engine.get();
    std::int64_t count = 0;
    get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &raw);
    std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
    get_attribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                  static_cast<std::int64_t>(notes.size()), &count, notes.data());
    const auto end = notes.begin() + std::min<std::int64_t>(count, static_cast<std::int64_t>(notes.size()));
    return std::find(notes.begin(), end, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) != end;
}

// The execution plan of the first engine config (heuristics mode A, then the fallback list) that finalizes.
void choose_engine(AttentionPlan& plan, const AttentionPlanKey& key, cudnnHandle_t handle) {
    std::string last_refusal = "no engine config offered";
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
        for (const BackendDescriptor& config : engine_configs(plan.operation_graph, mode, last_refusal)) {
            if (key.deterministic && nondeterministic(config)) {
                last_refusal = "deterministic mode: the engine configs cuDNN offers are nondeterministic";
                continue;
            }
            BackendDescriptor candidate(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, str("execution plan of ", config.name()));
            candidate.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
                .set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
            if (const cudnnStatus_t status = candidate.try_finalize(); status != CUDNN_STATUS_SUCCESS) {
                last_refusal = str(candidate.name(), ": ", cudnn_status_text(status));
                continue;
            }
            std::int64_t workspace = 0, n = 0;
            get_attribute(candidate, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &workspace);
            plan.plan = std::move(candidate);
            plan.engine_workspace = static_cast<std::size_t>(std::max<std::int64_t>(workspace, 0));
            return;
        }
    }
    throw Refused{str("no engine config finalized: ", last_refusal)};
}

std::shared_ptr<AttentionPlan> make_plan(const AttentionPlanKey& key, cudnnHandle_t handle) {
    auto plan = std::make_shared<AttentionPlan>();
    plan->scale = std::bit_cast<float>(key.scale_bits);
    try {
        plan->graph = std::make_unique<GraphBuilder>(key.dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF);
        if (key.backward)
            build_backward(*plan->graph, key);
        else
            build_forward(*plan->graph, key);
        plan->operation_graph = plan->graph->operation_graph(
            handle, key.backward ? "sdpa backward operation graph" : "sdpa forward operation graph");
        choose_engine(*plan, key, handle);
    } catch (const Refused& refused) {
        auto refusal = std::make_shared<AttentionPlan>();
        refusal->refused = refused.reason;
        return refusal;
    }
    plan->uids = key.backward ? std::vector<std::int64_t>{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne,
                                                          kSoftmaxSum, kDQAccum}
                              : std::vector<std::int64_t>{kQ, kK, kV, kO, kStats, kScale};
    if (key.causal) plan->uids.push_back(kMinusInfinity);
    std::size_t bytes = align_up(plan->engine_workspace);
    if (key.backward) {
        const std::size_t rows = static_cast<std::size_t>(key.batch * key.heads * key.queries);
        plan->softmax_sum_offset = bytes;
        bytes += align_up(rows * sizeof(float));
        plan->dq_accum_offset = bytes;
        bytes += align_up(rows * static_cast<std::size_t>(key.head_dim) * sizeof(float));
    }
    plan->workspace_bytes = bytes;
    return plan;
}

// Runs `plan` on `pointers` (in plan.uids' order, with the workspace's own entries filled here).
void execute(AttentionPlan& plan, std::vector<void*> pointers, DeviceContext& ctx, bool backward) {
    Workspace workspace(ctx, std::max<std::size_t>(plan.workspace_bytes, 1));
    char* base = static_cast<char*>(workspace.data());
    for (std::size_t i = 0; i < plan.uids.size(); ++i) {
        switch (plan.uids[i]) {
            case kScale: pointers[i] = &plan.scale; break;
            case kOne: pointers[i] = &plan.one; break;
            case kMinusInfinity: pointers[i] = &plan.minus_infinity; break;
            case kSoftmaxSum: pointers[i] = base + plan.softmax_sum_offset; break;
            case kDQAccum: pointers[i] = base + plan.dq_accum_offset; break;
            default: break;
        }
    }
    // cuDNN before 9.6 expects dQ_accum zeroed (cudnn-frontend does the same).
    if (backward && cudnnGetVersion() < 90600)
        DG_CUDA_CHECK(cudaMemsetAsync(base + plan.dq_accum_offset, 0, plan.workspace_bytes - plan.dq_accum_offset,
                                      ctx.stream));
    pointers.push_back(base);  // the workspace, last: part of what makes a variant pack reusable
    const std::lock_guard lock(plan.variant_mutex);
    if (!plan.variant_pack || plan.variant_pointers != pointers) {
        BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, str(kOp, backward ? " backward" : " forward",
                                                                          " variant pack"));
        void* workspace_pointer = base;
        pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(plan.uids.size()),
                 plan.uids.data())
            .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<std::int64_t>(plan.uids.size()),
                 pointers.data())
            .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace_pointer)
            .finalize();
        plan.variant_pack = std::move(pack);
        plan.variant_pointers = std::move(pointers);
    }
    const cudnnStatus_t status = cudnnBackendExecute(ctx.cudnn, plan.plan.get(), plan.variant_pack.get());
    if (status != CUDNN_STATUS_SUCCESS) plan.plan.fail(status, "cudnnBackendExecute");
}

// Compute capability 8.0 or newer (cuDNN's fused attention engines), per device, asked once.
bool ampere_or_newer(int device) {
    static std::mutex mutex;
    static std::vector<int> majors;  // by device; 0: not asked yet
    const std::lock_guard lock(mutex);
    if (static_cast<std::size_t>(device) >= majors.size()) majors.resize(static_cast<std::size_t>(device) + 1, 0);
    int& major = majors[static_cast<std::size_t>(device)];
    if (major == 0) DG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 8;
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
bool aligned(const Tensor& t) { return aligned(t.raw_data()); }

// What a call hands cuDNN: q, k, v where they lie, in which layout (AttentionPlanKey::packed), and the tensors they
// come from (their shapes are written only into a message: no string on the hot path).
struct Operands {
    DType dtype;
    std::array<const void*, 3> qkv;  // q, k, v
    bool packed;
    std::span<const Tensor> tensors;  // q, k, v; or qkv alone when packed
};

Operands separate_operands(std::span<const Tensor> inputs) {
    return {inputs[0].dtype(), {inputs[0].raw_data(), inputs[1].raw_data(), inputs[2].raw_data()}, false,
            inputs.first(3)};
}

// qkv (B,T,3·H·D): q, k, v start at element 0, E and 2·E of it (E = H·D).
Operands packed_operands(const Tensor& qkv, const AttentionGeometry& g) {
    const auto* base = static_cast<const char*>(qkv.raw_data());
    const std::size_t third = static_cast<std::size_t>(g.heads * g.head_dim) * dtype_size(qkv.dtype());
    return {qkv.dtype(), {base, base + third, base + 2 * third}, true, std::span<const Tensor>(&qkv, 1)};
}

// Why cuDNN does not run this case, before any plan is built; empty when it may.
std::string precondition_refusal(const Operands& operands, const AttentionGeometry& g, DeviceContext& ctx) {
    if (!attention_cudnn_enabled()) return "disabled (set_attention_cudnn(false) or DYNGRAD_ATTENTION_CUDNN=0)";
    const DType dtype = operands.dtype;
    if (dtype != DType::bf16 && dtype != DType::f16) return str(dtype_name(dtype), ": cuDNN runs bf16/f16 only");
    if (g.dropout_p > 0) return "dropout_p > 0: cuDNN's dropout masks are not dyngrad's (the CPU replays its own)";
    if (g.has_mask) return "a keep mask: not expressed as a cuDNN graph here";
    if (g.head_dim % 8 != 0 || g.head_dim > 128)
        return str("head dim D = ", g.head_dim, ": cuDNN takes multiples of 8 up to 128");
    if (g.slices() == 0 || g.queries == 0 || g.keys == 0) return "an empty batch, query or key axis";
    if (g.batch * g.heads * std::max(g.queries, g.keys) * g.head_dim > std::numeric_limits<std::int32_t>::max())
        return "a tensor over 2^31 elements";
    if (cudnnGetVersion() < 90000) return str("cuDNN ", cudnnGetVersion(), " is older than 9.0");
    if (!ampere_or_newer(ctx.device)) return "compute capability below 8.0";
    for (const void* operand : operands.qkv)
        if (!aligned(operand)) return "an operand not 16-byte aligned";
    return {};
}

AttentionPlanKey key_of(const Operands& operands, const AttentionGeometry& g, DeviceContext& ctx, bool backward) {
    AttentionPlanKey key;
    key.device = ctx.device;
    key.dtype = operands.dtype;
    key.packed = operands.packed;
    key.batch = g.batch;
    key.heads = g.heads;
    key.queries = g.queries;
    key.keys = g.keys;
    key.head_dim = g.head_dim;
    key.causal = g.causal;
    key.scale_bits = std::bit_cast<std::uint32_t>(static_cast<float>(g.scale));
    key.backward = backward;
    key.deterministic = backward && deterministic();  // the forward has no reduction across blocks
    return key;
}

// "scaled_dot_product_attention (cuDNN) forward, bf16, q (…), k (…), causal, scale …": what a CudaError names.
std::string describe(const Operands& operands, const AttentionGeometry& g, bool backward) {
    const std::span<const Tensor> t = operands.tensors;
    const std::string shapes = operands.packed ? str("qkv ", to_string(t[0].shape()), " (packed)")
                                               : str("q ", to_string(t[0].shape()), ", k ", to_string(t[1].shape()),
                                                     ", v ", to_string(t[2].shape()));
    return str(kOp, backward ? " backward, " : " forward, ", dtype_name(operands.dtype), ", ", shapes,
               g.causal ? ", causal" : "", ", scale ", g.scale);
}

// Runs `fn`; a CudaError (OutOfMemory kept as such) it throws gets the call's description in front.
template <typename Fn>
auto with_context(const Operands& operands, const AttentionGeometry& g, bool backward, Fn&& fn) {
    try {
        return fn();
    } catch (const OutOfMemory& e) {
        throw OutOfMemory(str(describe(operands, g, backward), ": ", e.what()));
    } catch (const CudaError& e) {
        throw CudaError(str(describe(operands, g, backward), ": ", e.what()));
    }
}

// The plan for this case, or the reason cuDNN does not run it (recorded for attention_last_run()).
std::shared_ptr<AttentionPlan> plan_for(const Operands& operands, const AttentionGeometry& g, DeviceContext& ctx,
                                        bool backward) {
    if (std::string why = precondition_refusal(operands, g, ctx); !why.empty()) {
        record_attention_run(!backward, false, std::move(why));
        return nullptr;
    }
    const AttentionPlanKey key = key_of(operands, g, ctx, backward);
    std::shared_ptr<AttentionPlan> plan = with_context(operands, g, backward, [&] {
        return plan_cache<AttentionPlanKey, AttentionPlan>().get(key, [&] { return make_plan(key, ctx.cudnn); });
    });
    release_contexts_before_new_libraries();  // building the plan may have loaded cuDNN's engine libraries
    if (!plan->refused.empty()) {
        record_attention_run(!backward, false, plan->refused);
        return nullptr;
    }
    return plan;
}

}  // namespace

void record_attention_run(bool forward, bool on_cudnn, std::string reason) {
    const AttentionImpl impl = on_cudnn ? AttentionImpl::cudnn : AttentionImpl::kernels;
    if (forward) {
        t_last_run.forward = impl;
        t_last_run.forward_reason = std::move(reason);
    } else {
        t_last_run.backward = impl;
        t_last_run.backward_reason = std::move(reason);
    }
}

AttentionRunInfo attention_last_run_record() { return t_last_run; }

std::string attention_cudnn_status_line() {
    return str("cuDNN ", cudnnGetVersion(), attention_cudnn_enabled() ? ": enabled" : ": disabled",
               " for bf16/f16 attention without dropout or mask, D a multiple of 8 up to 128, compute capability 8.0+");
}

namespace {

// y, lse from q, k, v as `operands` lays them out; false, nothing written, where cuDNN does not run the case.
bool run_forward(const Operands& operands, const AttentionGeometry& g, Tensor& y, Tensor& lse, DeviceContext& ctx) {
    const std::shared_ptr<AttentionPlan> plan = plan_for(operands, g, ctx, false);
    if (!plan) return false;
    if (!aligned(y) || !aligned(lse)) {
        record_attention_run(true, false, "an output not 16-byte aligned");
        return false;
    }
    // uids: Q, K, V, O, Stats, scale[, -inf]; the scalars are filled by execute().
    std::vector<void*> pointers{const_cast<void*>(operands.qkv[0]), const_cast<void*>(operands.qkv[1]),
                                const_cast<void*>(operands.qkv[2]), y.raw_data(), lse.raw_data(), nullptr};
    if (g.causal) pointers.push_back(nullptr);
    with_context(operands, g, false, [&] { execute(*plan, std::move(pointers), ctx, false); });
    record_attention_run(true, true, {});
    return true;
}

// dq, dk, dv (where gradients() points, in the operands' layout; called once cuDNN takes the case) from q, k, v,
// y, dy and lse; false, nothing written, where cuDNN does not run the case.
template <typename Gradients>
bool run_backward(const Operands& operands, const Tensor& y, const Tensor& dy, const AttentionGeometry& g,
                  const Tensor& lse, Gradients&& gradients_of, DeviceContext& ctx) {
    // Deterministic mode runs the tensor-core pair of kernels (no atomics): cuDNN 9.14 offered a flash backward
    // config without the nondeterministic note, yet two GPT-2 runs in deterministic mode (char_gpt --deterministic,
    // bf16, H200, 2026-11-29) parted at the second step's loss, and cuDNN's backward was the only reduction of the
    // step outside dyngrad's kernels and cuBLAS.
    if (deterministic()) {
        record_attention_run(false, false, "deterministic mode (cuDNN's backward is not taken as reproducible)");
        return false;
    }
    const std::shared_ptr<AttentionPlan> plan = plan_for(operands, g, ctx, true);
    if (!plan) return false;
    if (!aligned(y) || !aligned(dy) || !aligned(lse)) {
        record_attention_run(false, false, "the output, its gradient or the saved lse not 16-byte aligned");
        return false;
    }
    const std::array<void*, 3> gradients = gradients_of();
    for (const void* gradient : gradients)
        if (!aligned(gradient)) {
            record_attention_run(false, false, "a gradient not 16-byte aligned");
            return false;
        }
    // uids: Q, K, V, O, dO, Stats, dQ, dK, dV, scale, 1, softmax_sum, dQ_accum[, -inf].
    std::vector<void*> pointers{const_cast<void*>(operands.qkv[0]), const_cast<void*>(operands.qkv[1]),
                                const_cast<void*>(operands.qkv[2]), y.raw_data(), dy.raw_data(), lse.raw_data(),
                                gradients[0], gradients[1], gradients[2], nullptr, nullptr, nullptr, nullptr};
    if (g.causal) pointers.push_back(nullptr);
    with_context(operands, g, true, [&] { execute(*plan, std::move(pointers), ctx, true); });
    record_attention_run(false, true, {});
    return true;
}

}  // namespace

bool cudnn_attention_forward(std::span<const Tensor> inputs, const AttentionGeometry& g, Tensor& y, Tensor& lse,
                             DeviceContext& ctx) {
    return run_forward(separate_operands(inputs), g, y, lse, ctx);
}

bool cudnn_attention_backward(std::span<const Tensor> inputs, const Tensor& y, const Tensor& dy,
                              const AttentionGeometry& g, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                              DeviceContext& ctx) {
    // cuDNN writes all three gradients: the undefined ones are allocated once it takes the case.
    return run_backward(separate_operands(inputs), y, dy, g, lse, [&] {
        if (!dq.defined()) dq = Tensor::empty(inputs[0].shape(), dy.dtype(), dy.device());
        if (!dk.defined()) dk = Tensor::empty(inputs[1].shape(), dy.dtype(), dy.device());
        if (!dv.defined()) dv = Tensor::empty(inputs[2].shape(), dy.dtype(), dy.device());
        return std::array<void*, 3>{dq.raw_data(), dk.raw_data(), dv.raw_data()};
    }, ctx);
}

bool cudnn_qkv_attention_forward(const Tensor& qkv, const AttentionGeometry& g, Tensor& y, Tensor& lse,
                                 DeviceContext& ctx) {
    return run_forward(packed_operands(qkv, g), g, y, lse, ctx);
}

bool cudnn_qkv_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& dy, const AttentionGeometry& g,
                                  const Tensor& lse, Tensor& dqkv, DeviceContext& ctx) {
    return run_backward(packed_operands(qkv, g), y, dy, g, lse, [&] {
        if (!dqkv.defined()) dqkv = Tensor::empty(qkv.shape(), dy.dtype(), dy.device());
        const Operands gradients = packed_operands(dqkv, g);
        return std::array<void*, 3>{const_cast<void*>(gradients.qkv[0]), const_cast<void*>(gradients.qkv[1]),
                                    const_cast<void*>(gradients.qkv[2])};
    }, ctx);
}

}  // namespace dyngrad::cuda
