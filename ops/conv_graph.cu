// conv2d's passes on cuDNN's graph (backend) API (cuda/cudnn_graph.h; cuDNN 9): the candidates ops/conv.cu's
// per-shape search times beside the legacy API's algorithms, and the run of the one it keeps (ops/conv_graph.h).
//
// Per pass, one operation graph of one node (CONVOLUTION_FORWARD, _BACKWARD_DATA or _BACKWARD_FILTER) over three
// contiguous NCHW tensors (uids kX, kW, kY by their shapes' role), compute type float (bf16/f16 data accumulate in
// f32; f32 data per the TF32 setting below). Any layout change an engine wants is its own affair: PyTorch hands
// cuDNN the same graph and its chosen bf16 dgrad engine converts internally. The group count is not an attribute:
// cuDNN reads it off x's C over w's C/groups.
//
// Engine configs come from the heuristics (mode A, then the fallback list, without repeats) in their order; up to
// kTimed that the precision policy allows and whose execution plan finalizes are timed (kExamined bounds how many
// are looked at). The policy is the legacy path's (ops/conv.cu's refusal()), read from the engines' notes: never
// down-converted inputs or reduced-precision accumulation; float32 without TF32 no tensor-core engine; no FFT or
// Winograd where the plan forbids transforms; in deterministic mode nothing with the nondeterministic note. Engines
// that compile their kernels at finalize (runtime compilation) are left out: a search per shape would pay NVRTC
// for each, and the precompiled engines cover plain convolutions.
//
// The run builds nothing but, for a pointer set it has not seen lately, a variant pack (host-side descriptor
// calls, as ops/attention_cudnn.cu does per new pointer set: cuDNN takes no pointer update of a finalized pack);
// the workspace is the caller's (the device pool, as for the legacy API). cudnnBackendExecute enqueues on the
// handle's stream, so a captured step records it like the legacy calls.
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dyngrad/cuda/cudnn_graph.h"
#include "dyngrad/cuda/cudnn_plans.h"
#include "dyngrad/ops/conv_graph.h"

namespace dyngrad::cuda {

namespace {

constexpr int kTimed = 8;                // engine configs timed per pass
constexpr int kExamined = 32;            // engine configs looked at per pass, refused ones included
constexpr std::int64_t kAlignment = 16;  // what the tensors declare; conv_graph_aligned checks each call
constexpr std::size_t kPacks = 4;        // variant packs kept per plan (layers of one shape share the plan)

enum Uid : std::int64_t { kX = 1, kW = 2, kY = 3 };

using Dims = std::array<std::int64_t, 4>;

Dims contiguous(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

const char* pass_name(ConvPass pass) {
    switch (pass) {
        case ConvPass::forward: return "forward";
        case ConvPass::backward_data: return "backward data";
        case ConvPass::backward_filter: return "backward filter";
    }
    return "?";
}

// "Not supported" while building the operation graph: cuDNN does not take this convolution (the reason is logged).
struct Refused {
    std::string reason;
};

void finalize_or_refuse(BackendDescriptor& d) {
    const cudnnStatus_t status = d.try_finalize();
    if (status != CUDNN_STATUS_SUCCESS) throw Refused{str("node '", d.name(), "': ", cudnn_status_text(status))};
}

}  // namespace

// The operation graph of one pass and every descriptor it refers to: kept as long as a plan made from it.
struct ConvOperationGraph {
    BackendDescriptor x, w, y, convolution, operation, graph;
};

class ConvGraphPlan {
public:
    ConvGraphPlan(std::shared_ptr<const ConvOperationGraph> graph, BackendDescriptor plan, std::size_t workspace_bytes)
        : graph_(std::move(graph)), plan_(std::move(plan)), workspace_bytes_(workspace_bytes) {}

    const BackendDescriptor& plan() const { return plan_; }
    std::size_t workspace_bytes() const { return workspace_bytes_; }

    // The variant pack for these pointers (x, w, y, workspace), built when none of the last kPacks matches. Call
    // with mutex() held.
    const BackendDescriptor& pack_for(const std::array<void*, 4>& pointers) {
        for (const Pack& pack : packs_)
            if (pack.descriptor && pack.pointers == pointers) return pack.descriptor;
        Pack& slot = packs_[next_];
        next_ = (next_ + 1) % kPacks;
        slot.descriptor = make_pack(pointers);
        slot.pointers = pointers;
        return slot.descriptor;
    }
    BackendDescriptor make_pack(const std::array<void*, 4>& pointers) const {
        static constexpr std::array<std::int64_t, 3> kUids{kX, kW, kY};
        void* workspace = pointers[3];
        BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, str(plan_.name(), " variant pack"));
        pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, kUids.data())
            .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers.data())
            .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
            .finalize();
        return pack;
    }
    std::mutex& mutex() { return mutex_; }

private:
    struct Pack {
        std::array<void*, 4> pointers{};
        BackendDescriptor descriptor;
    };

    std::shared_ptr<const ConvOperationGraph> graph_;  // what plan_ was finalized from
    BackendDescriptor plan_;
    std::size_t workspace_bytes_;
    std::mutex mutex_;  // guards packs_: threads (and a thread's side lane) share plans
    std::array<Pack, kPacks> packs_;
    std::size_t next_ = 0;
};

namespace {

std::shared_ptr<const ConvOperationGraph> build_graph(const ConvGraphProblem& p, ConvPass pass, cudnnHandle_t handle) {
    constexpr const char* what = "conv2d";
    auto g = std::make_shared<ConvOperationGraph>();
    const cudnnDataType_t io = cudnn_dtype(p.dtype, what);
    const auto tensor = [&](BackendDescriptor& t, const char* name, std::int64_t uid, const Dims& dims) {
        t = BackendDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, str(what, " tensor ", name));
        t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, io)
            .set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
            .set_int64s(CUDNN_ATTR_TENSOR_STRIDES, contiguous(dims))
            .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
            .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, kAlignment);
        finalize_or_refuse(t);
    };
    tensor(g->x, pass == ConvPass::backward_data ? "dx" : "x", kX, p.x);
    tensor(g->w, pass == ConvPass::backward_filter ? "dw" : "w", kW, p.w);
    tensor(g->y, pass == ConvPass::forward ? "y" : "dy", kY, p.y);

    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    g->convolution = BackendDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, str(what, " convolution"));
    g->convolution.set_data_type(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, cudnn_compute_dtype(p.dtype, what))
        .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
        .set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2)
        .set_int64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, p.padding)
        .set_int64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, p.padding)
        .set_int64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, p.dilation)
        .set_int64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, p.stride);
    finalize_or_refuse(g->convolution);

    struct Node {
        cudnnBackendDescriptorType_t type;
        cudnnBackendAttributeName_t x, w, y, alpha, beta, convolution;
    };
    const Node node =
        pass == ConvPass::forward
            ? Node{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC}
        : pass == ConvPass::backward_data
            ? Node{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC}
            : Node{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                   CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC};
    // y = 1·conv + 0·y: the output is written, never accumulated into (float scalars, as for every non-double type).
    g->operation = BackendDescriptor(node.type, str(what, " ", pass_name(pass)));
    g->operation.set_descriptor(node.x, g->x)
        .set_descriptor(node.w, g->w)
        .set_descriptor(node.y, g->y)
        .set_descriptor(node.convolution, g->convolution)
        .set_float(node.alpha, 1.0f)
        .set_float(node.beta, 0.0f);
    finalize_or_refuse(g->operation);

    g->graph = BackendDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, str(what, " ", pass_name(pass), " graph"));
    const std::array<cudnnBackendDescriptor_t, 1> operations{g->operation.get()};
    g->graph.set_descriptors(CUDNN_ATTR_OPERATIONGRAPH_OPS, operations)
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    finalize_or_refuse(g->graph);
    return g;
}

// An engine config's engine as the log names it, and its notes (what the policy reads).
struct EngineInfo {
    std::string name;  // "graph:eng<global index>{k<knob type>=<value>,...}"
    std::vector<cudnnBackendNumericalNote_t> numerical;
    std::vector<cudnnBackendBehaviorNote_t> behavior;

    bool has(cudnnBackendNumericalNote_t note) const {
        return std::find(numerical.begin(), numerical.end(), note) != numerical.end();
    }
    bool has(cudnnBackendBehaviorNote_t note) const {
        return std::find(behavior.begin(), behavior.end(), note) != behavior.end();
    }
};

EngineInfo engine_info(const BackendDescriptor& config) {
    BackendDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, str(config.name(), ": engine"));
    cudnnBackendDescriptor_t raw_engine = engine.get();
    std::int64_t count = 0;
    get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &raw_engine);
    std::int64_t index = -1;
    get_attribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index);

    EngineInfo info;
    info.numerical.resize(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
    get_attribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                  static_cast<std::int64_t>(info.numerical.size()), &count, info.numerical.data());
    info.numerical.resize(static_cast<std::size_t>(std::clamp<std::int64_t>(count, 0, CUDNN_NUMERICAL_NOTE_TYPE_COUNT)));
    info.behavior.resize(CUDNN_BEHAVIOR_NOTE_TYPE_COUNT);
    get_attribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                  static_cast<std::int64_t>(info.behavior.size()), &count, info.behavior.data());
    info.behavior.resize(static_cast<std::size_t>(std::clamp<std::int64_t>(count, 0, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT)));

    // The knob choices tell apart configs of one engine (tile sizes, splits).
    std::vector<BackendDescriptor> knobs;
    for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i)
        knobs.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, str(config.name(), ": knob choice"));
    std::vector<cudnnBackendDescriptor_t> raw_knobs = raw_descriptors(knobs);
    get_attribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                  static_cast<std::int64_t>(raw_knobs.size()), &count, raw_knobs.data());
    std::string choices;
    for (std::int64_t i = 0; i < std::min<std::int64_t>(count, CUDNN_KNOB_TYPE_COUNTS); ++i) {
        const BackendDescriptor& knob = knobs[static_cast<std::size_t>(i)];
        cudnnBackendKnobType_t type{};
        std::int64_t value = 0, n = 0;
        get_attribute(knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type);
        get_attribute(knob, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &n, &value);
        choices += str(choices.empty() ? "" : ",", "k", static_cast<int>(type), "=", value);
    }
    info.name = str("graph:eng", index, "{", choices, "}");
    return info;
}

// Why the policy refuses an engine ("" when it may run); the verdicts of the legacy path where they mean the same.
const char* refusal(const EngineInfo& e, const ConvGraphProblem& p) {
    if (e.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return "down-conversion";
    if (e.has(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) return "reduced-precision reduction";
    if (p.deterministic && e.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) return "not deterministic";
    if (p.fma_only && e.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) return "tensor ops at float32 precision";
    if (p.no_transforms &&
        (e.has(CUDNN_NUMERICAL_NOTE_FFT) || e.has(CUDNN_NUMERICAL_NOTE_WINOGRAD) ||
         e.has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4) || e.has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6) ||
         e.has(CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13)))
        return "transform-based";
    if (e.has(CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)) return "runtime compilation";
    return "";
}

EventHandle timing_event() {
    return make_owned<EventHandle>([](cudaEvent_t* event) { DG_CUDA_CHECK(cudaEventCreate(event)); });
}

// The second of two runs of `plan` on `operands` with `scratch` as its workspace, in ms, timed with events on ctx's
// stream; nullopt (with `detail` set) when cuDNN fails to run it. Syncs the host with the stream.
std::optional<double> time_plan(ConvGraphPlan& plan, DeviceContext& ctx, const ConvGraphOperands& operands,
                                void* scratch, std::string& detail) {
    const BackendDescriptor pack = plan.make_pack({operands.x, operands.w, operands.y, scratch});
    const EventHandle start = timing_event(), stop = timing_event();
    // The first run loads the engine's module (CUDA loads lazily), which would dominate a small shape's timing.
    for (int run = 0; run < 2; ++run) {
        if (run == 1) DG_CUDA_CHECK(cudaEventRecord(start.get(), ctx.stream));
        if (const cudnnStatus_t status = cudnnBackendExecute(ctx.cudnn, plan.plan().get(), pack.get());
            status != CUDNN_STATUS_SUCCESS) {
            detail = str("cudnnBackendExecute: ", cudnn_status_text(status));
            static_cast<void>(cudaGetLastError());  // a refused launch is this candidate's failure, not the next op's
            return std::nullopt;
        }
    }
    DG_CUDA_CHECK(cudaEventRecord(stop.get(), ctx.stream));
    DG_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    DG_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    return static_cast<double>(ms);
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kAlignment == 0; }

}  // namespace

bool conv_graph_allowed(const ConvGraphProblem& problem) {
    if (problem.dtype == DType::f32) return !problem.fma_only;
    return problem.dtype == DType::bf16 || problem.dtype == DType::f16;
}

bool conv_graph_aligned(const ConvGraphOperands& operands) {
    return aligned(operands.x) && aligned(operands.w) && aligned(operands.y);
}

ConvGraphChoice search_conv_graph(DeviceContext& ctx, const ConvGraphProblem& problem, ConvPass pass,
                                  const ConvGraphOperands& operands, void* scratch, std::vector<ConvSearchEntry>& log) {
    // A new entry's index (entries are addressed by index: the log grows while one is filled in).
    const auto entry = [&](std::string algorithm, std::string verdict, std::string detail) {
        log.push_back({problem.description, pass_name(pass), std::move(algorithm), -1.0, 0, false, false,
                       std::move(verdict), std::move(detail)});
        return log.size() - 1;
    };
    ConvGraphChoice best;
    if (!conv_graph_aligned(operands)) {
        entry("graph", "not supported", "an operand not 16-byte aligned");
        return best;
    }
    try {
        const std::shared_ptr<const ConvOperationGraph> graph = build_graph(problem, pass, ctx.cudnn);
        std::vector<std::string> seen;
        std::string why = "no engine config offered";
        int timed = 0;
        for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
            if (timed == kTimed) break;
            for (const BackendDescriptor& config : engine_configs(graph->graph, mode, why)) {
                if (timed == kTimed || static_cast<int>(seen.size()) == kExamined) break;
                EngineInfo info = engine_info(config);
                if (std::find(seen.begin(), seen.end(), info.name) != seen.end()) continue;  // offered by both modes
                seen.push_back(info.name);
                const std::size_t at = entry(info.name, "", "");
                log[at].tensor_ops = info.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
                log[at].deterministic = !info.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
                if (const char* refused = refusal(info, problem); *refused != '\0') {
                    log[at].verdict = refused;
                    continue;
                }
                cudnnHandle_t handle = ctx.cudnn;
                BackendDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                       str("conv2d ", pass_name(pass), " ", problem.description, ", ", info.name));
                plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
                    .set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
                if (const cudnnStatus_t status = plan.try_finalize(); status != CUDNN_STATUS_SUCCESS) {
                    log[at].verdict = "not supported";
                    log[at].detail = cudnn_status_text(status);
                    continue;
                }
                std::int64_t workspace = 0, n = 0;
                get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &workspace);
                const std::size_t bytes = static_cast<std::size_t>(std::max<std::int64_t>(workspace, 0));
                log[at].workspace_bytes = bytes;
                if (bytes > problem.workspace_limit) {
                    log[at].verdict = "workspace over the limit";
                    continue;
                }
                auto candidate = std::make_shared<ConvGraphPlan>(graph, std::move(plan), bytes);
                ++timed;
                const std::optional<double> ms = time_plan(*candidate, ctx, operands, scratch, log[at].detail);
                if (!ms) {
                    log[at].verdict = "failed";
                    continue;
                }
                log[at].ms = *ms;
                log[at].verdict = "slower";
                if (!best.plan || *ms < best.ms) best = {std::move(candidate), *ms, bytes, at};
            }
        }
        if (seen.empty()) entry("graph", "not supported", why);
    } catch (const Refused& refused) {
        entry("graph", "not supported", refused.reason);
    } catch (const OutOfMemory&) {
        throw;
    } catch (const CudaError& e) {
        // A cuDNN failure outside "not supported" (e.g. an attribute this cuDNN does not know): the legacy API runs
        // the pass; a candidate already timed stays valid.
        entry("graph", "failed", e.what());
    }
    release_contexts_before_new_libraries();  // finalizing plans may have loaded cuDNN's engine libraries
    return best;
}

void run_conv_graph(ConvGraphPlan& plan, DeviceContext& ctx, const ConvGraphOperands& operands, void* workspace) {
    const std::lock_guard lock(plan.mutex());
    const BackendDescriptor& pack = plan.pack_for({operands.x, operands.w, operands.y, workspace});
    const cudnnStatus_t status = cudnnBackendExecute(ctx.cudnn, plan.plan().get(), pack.get());
    if (status != CUDNN_STATUS_SUCCESS) plan.plan().fail(status, "cudnnBackendExecute");
}

}  // namespace dyngrad::cuda
