// CapturedStep (cuda/capture.h): a training step captured into a CUDA graph per input key and replayed.
// The allocator side of capture (private pools, deferred frees, sync checks) is in cuda/capture_pool.cu.
#include "dyngrad/cuda/capture.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/cuda/handle.h"

namespace dyngrad::cuda {

namespace {

// What selects a variant: the device and every input's shape and dtype.
struct InputKey {
    int device = 0;
    std::vector<std::pair<Shape, DType>> inputs;
    auto operator<=>(const InputKey&) const = default;
};

InputKey input_key(std::span<const Tensor> inputs) {
    if (inputs.empty()) throw DeviceError("CapturedStep::run: needs at least one input tensor on a CUDA device");
    InputKey key;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const Tensor& t = inputs[i];
        if (!t.defined() || !t.device().is_cuda())
            throw DeviceError(
                str("CapturedStep::run: input ", i, " is ", describe(t), "; inputs must be CUDA tensors"));
        if (i == 0) key.device = t.device().index;
        if (t.device().index != key.device)
            throw DeviceError(str("CapturedStep::run: input ", i, " is on ", t.device().to_string(),
                                  ", input 0 on cuda:", key.device, "; a captured step runs on one device"));
        key.inputs.emplace_back(t.shape(), t.dtype());
    }
    return key;
}

// An executable graph and the stream it is launched on.
struct LaunchedGraph {
    cudaGraphExec_t exec = nullptr;
    cudaStream_t stream = nullptr;
    explicit operator bool() const { return exec != nullptr; }
};

// Waits for the graph's last launch, then destroys it (UniqueHandle drops a failure: the device is lost or
// the runtime is unloading).
cudaError_t destroy_after_last_launch(LaunchedGraph graph) noexcept {
    const cudaError_t synchronized = cudaStreamSynchronize(graph.stream);
    const cudaError_t destroyed = cudaGraphExecDestroy(graph.exec);
    return synchronized != cudaSuccess ? synchronized : destroyed;
}

// The executable graph of one variant; destroying it waits for its last launch.
class GraphExec {
public:
    GraphExec() = default;
    GraphExec(cudaGraphExec_t exec, cudaStream_t stream) : graph_(LaunchedGraph{exec, stream}) {}

    bool defined() const { return static_cast<bool>(graph_); }
    void launch() const { DG_CUDA_CHECK(cudaGraphLaunch(graph_.get().exec, graph_.get().stream)); }

private:
    UniqueHandle<LaunchedGraph, destroy_after_last_launch> graph_;
};

// One input key's state: warmed up (eager run done), then captured. Members are destroyed bottom-up: the
// graph first (waiting for its last launch), then the tensors, then the pool.
struct Variant {
    std::uint64_t id = 0;                  // current_step_run().variant in its warm-up and its capture
    std::optional<CapturePoolOwner> pool;  // created for the capture
    std::vector<Tensor> inputs;            // static input buffers the graph reads
    Tensor output;                         // the step's result, rewritten by each replay
    GraphExec graph;
    std::size_t guarded = 0;               // replays checked by the guard so far
};

thread_local StepRun tls_step_run;
std::atomic<std::uint64_t> next_variant_id{1};

// Marks the step function's run (current_step_run) and restores the outer mark after it, even when it throws.
class StepRunScope {
public:
    explicit StepRunScope(StepRun run) : outer_(tls_step_run) { tls_step_run = run; }
    ~StepRunScope() { tls_step_run = outer_; }
    StepRunScope(const StepRunScope&) = delete;
    StepRunScope& operator=(const StepRunScope&) = delete;

private:
    StepRun outer_;
};

// Counts a captured graph's nodes by kind (once per capture, off the replay path).
CapturedStep::GraphCounts count_nodes(cudaGraph_t graph) {
    std::size_t count = 0;
    DG_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    if (count > 0) DG_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
    CapturedStep::GraphCounts counts;
    counts.nodes = count;
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type{};
        DG_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
        switch (type) {
            case cudaGraphNodeTypeKernel: ++counts.kernels; break;
            case cudaGraphNodeTypeMemset: ++counts.memsets; break;
            case cudaGraphNodeTypeMemcpy: ++counts.memcpys; break;
            default: ++counts.other; break;
        }
    }
    // The longest dependency path, in kernel/memset/memcpy nodes: what a replay waits for in sequence.
    std::size_t edge_count = 0;
    DG_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count));
    std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
    // With the edges' data: without it a graph holding programmatic (PDL) edges, as cuDNN's and cuBLASLt's
    // kernels add, answers cudaErrorLossyQuery (seen with GPT-2's captured step, cuDNN 9.14). Any type counts.
    std::vector<cudaGraphEdgeData> edge_data(edge_count);
    if (edge_count > 0)
        DG_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), edge_data.data(), &edge_count));
    std::unordered_map<cudaGraphNode_t, std::size_t> index;
    for (std::size_t i = 0; i < nodes.size(); ++i) index.emplace(nodes[i], i);
    std::vector<std::vector<std::size_t>> successors(nodes.size());
    std::vector<std::size_t> waiting(nodes.size(), 0), weight(nodes.size(), 0), path(nodes.size(), 0);
    for (std::size_t e = 0; e < edge_count; ++e) {
        successors[index.at(from[e])].push_back(index.at(to[e]));
        ++waiting[index.at(to[e])];
    }
    std::vector<std::size_t> ready;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        cudaGraphNodeType type{};
        DG_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
        weight[i] = type == cudaGraphNodeTypeKernel || type == cudaGraphNodeTypeMemset ||
                    type == cudaGraphNodeTypeMemcpy;
        if (waiting[i] == 0) ready.push_back(i);
    }
    while (!ready.empty()) {  // Kahn's order: a node's path is final when its last predecessor is done
        const std::size_t i = ready.back();
        ready.pop_back();
        path[i] += weight[i];
        counts.longest_chain = std::max(counts.longest_chain, path[i]);
        for (const std::size_t next : successors[i]) {
            path[next] = std::max(path[next], path[i]);
            if (--waiting[next] == 0) ready.push_back(next);
        }
    }
    return counts;
}

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The first element where a and b differ bit for bit, or -1 (both on the CPU, same dtype and shape).
std::int64_t first_difference(const Tensor& a, const Tensor& b) {
    const std::size_t width = dtype_size(a.dtype());
    const auto* x = static_cast<const unsigned char*>(a.raw_data());
    const auto* y = static_cast<const unsigned char*>(b.raw_data());
    for (std::int64_t i = 0; i < a.numel(); ++i)
        if (std::memcmp(x + i * width, y + i * width, width) != 0) return i;
    return -1;
}

// GraphError naming `name` when the replayed and the eager tensor differ.
void compare(const std::string& name, const Tensor& replayed, const Tensor& eager, std::size_t replay) {
    const auto fail = [&](const std::string& how) {
        throw GraphError(str("CapturedStep guard: replay ", replay, " of the captured step differs from the same step "
                             "run eagerly at '", name, "': ", how, ". The step is not capturable: a host-side branch "
                             "or counter, or a host value frozen into the graph (docs/training.md, \"Captured "
                             "training steps\")"));
    };
    if (replayed.shape() != eager.shape() || replayed.dtype() != eager.dtype())
        fail(str("replayed ", describe(replayed), ", eager ", describe(eager)));
    const Tensor a = replayed.to(Device::cpu()), b = eager.to(Device::cpu());
    const std::int64_t at = first_difference(a, b);
    if (at < 0) return;
    fail(str("element ", at, " is ", a.reshaped({a.numel()}).to_vector()[static_cast<std::size_t>(at)], " replayed and ",
             b.reshaped({b.numel()}).to_vector()[static_cast<std::size_t>(at)], " eager"));
}

}  // namespace

struct CapturedStep::Impl {
    StepFn step;
    CaptureOptions options;
    std::map<InputKey, Variant> variants;  // a key without a graph has had its eager warm-up only
    GraphCounts last_counts;                // of the graph captured last

    // Copies `inputs` into a new variant's static buffers, captures the step on them and launches it once.
    Tensor capture(Variant& v, std::span<const Tensor> inputs);
    // A replay checked against the eager step (CaptureOptions::guard_replays).
    Tensor guarded_replay(Variant& v, std::span<const Tensor> inputs);
};

Tensor CapturedStep::Impl::guarded_replay(Variant& v, std::span<const Tensor> inputs) {
    const std::size_t replay = ++v.guarded;
    NamedTensors state = options.guard_state();
    std::vector<Tensor> before;
    for (const auto& [name, t] : state) before.push_back(t.clone());
    v.graph.launch();
    std::vector<Tensor> replayed;
    for (const auto& [name, t] : state) replayed.push_back(t.clone());
    const Tensor replayed_output = v.output.clone();
    for (std::size_t i = 0; i < state.size(); ++i) state[i].second.copy_from(before[i]);
    const Tensor eager_output = step(inputs);
    // Asked again: the eager step may have replaced a tensor (the names must stay the same).
    const NamedTensors after = options.guard_state();
    if (after.size() != state.size())
        throw GraphError(str("CapturedStep guard: guard_state named ", state.size(), " tensors before the eager step and ",
                             after.size(), " after it"));
    for (std::size_t i = 0; i < state.size(); ++i) compare(state[i].first, replayed[i], after[i].second, replay);
    compare("the step's output", replayed_output, eager_output, replay);
    return v.output;
}

Tensor CapturedStep::Impl::capture(Variant& v, std::span<const Tensor> inputs) {
    const int device = inputs.front().device().index;
    DeviceContext& ctx = context(device);
    v.inputs.clear();
    for (const Tensor& in : inputs) {
        Tensor buffer = Tensor::empty(in.shape(), in.dtype(), in.device());
        buffer.copy_from(in);
        v.inputs.push_back(std::move(buffer));
    }
    v.pool.emplace(device);
    prepare_side_lane(device);
    begin_capture(v.pool->get());
    Tensor output;
    try {
        {
            const StepRunScope marked({v.id, true});
            output = step(std::span<const Tensor>(v.inputs));
        }
        join_side_lanes();  // the engine joined after each backward; a capture must end with every stream joined
    } catch (...) {
        try {
            join_side_lanes();
        } catch (...) {
            // The capture is being discarded; its end reports what went wrong with the streams.
        }
        cudaGraph_t partial = nullptr;
        static_cast<void>(end_capture(&partial));
        const GraphHandle discarded(partial);
        throw;
    }
    cudaGraph_t raw_graph = nullptr;
    const cudaError_t captured = end_capture(&raw_graph);
    const GraphHandle graph(raw_graph);
    if (captured != cudaSuccess)
        throw GraphError(str("CapturedStep: capturing the step failed: ", cudaGetErrorName(captured), " (",
                             cudaGetErrorString(captured), "); an operation of the step is not allowed in a CUDA graph ",
                             "(a host synchronisation or allocation outside dyngrad?)"));
    last_counts = count_nodes(graph.get());
    cudaGraphExec_t exec = nullptr;
    // Each kernel node keeps the priority of the stream it was captured from (DDP's and ZeRO's communication
    // streams run at the highest): without this flag a replay runs every node at the launch stream's priority, and
    // a ready bucket's all-reduce queues behind the backward's GEMMs instead of overlapping them.
    const cudaError_t status = cudaGraphInstantiateWithFlags(&exec, graph.get(), cudaGraphInstantiateFlagUseNodePriority);
    if (status != cudaSuccess)
        throw_cuda_error(status, "cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagUseNodePriority)",
                         __FILE__, __LINE__);
    v.graph = GraphExec(exec, ctx.stream);
    v.output = std::move(output);
    v.graph.launch();
    return v.output;
}

CapturedStep::CapturedStep(StepFn step, CaptureOptions options) : impl_(std::make_unique<Impl>()) {
    if (!step) throw ValueError("CapturedStep: the step function is empty");
    if (options.guard_replays > 0 && !options.guard_state)
        throw ValueError(str("CapturedStep: guard_replays = ", options.guard_replays,
                             " needs guard_state, the tensors the step changes"));
    impl_->step = std::move(step);
    impl_->options = std::move(options);
}

CapturedStep::~CapturedStep() = default;

StepRun current_step_run() noexcept { return tls_step_run; }

Tensor CapturedStep::run(std::span<const Tensor> inputs) {
    InputKey key = input_key(inputs);
    const auto found = impl_->variants.find(key);
    if (found == impl_->variants.end()) {
        // First run of this key: eager, with the caller's tensors. Lets cuDNN search and cache its
        // algorithms and lets parameters' optimizer state come into being before a capture.
        const std::uint64_t id = next_variant_id.fetch_add(1, std::memory_order_relaxed);
        Tensor output;
        {
            const StepRunScope marked({id, false});
            output = impl_->step(inputs);
        }
        impl_->variants.try_emplace(std::move(key)).first->second.id = id;
        return output;
    }
    Variant& v = found->second;
    if (!v.graph.defined()) {
        try {
            return impl_->capture(v, inputs);
        } catch (...) {
            impl_->variants.erase(found);  // the next run of this key warms up and captures afresh
            throw;
        }
    }
    for (std::size_t i = 0; i < inputs.size(); ++i)
        if (!v.inputs[i].shares_storage_with(inputs[i])) v.inputs[i].copy_from(inputs[i]);
    context(key.device);  // makes the device current for the launch
    if (v.guarded < impl_->options.guard_replays) return impl_->guarded_replay(v, inputs);
    v.graph.launch();
    return v.output;
}

CapturedStep::GraphCounts CapturedStep::last_graph_counts() const { return impl_->last_counts; }

std::size_t CapturedStep::variants() const {
    std::size_t captured = 0;
    for (const auto& [key, v] : impl_->variants) captured += v.graph.defined() ? 1 : 0;
    return captured;
}

}  // namespace dyngrad::cuda
