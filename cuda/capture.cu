// CapturedStep (cuda/capture.h): a training step captured into a CUDA graph per input key and replayed.
// The allocator side of capture (private pools, deferred frees, sync checks) is in cuda/capture_pool.cu.
#include "dyngrad/cuda/capture.h"

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"

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

// The executable graph of one variant; destroying it waits for its last launch.
class GraphExec {
public:
    GraphExec() = default;
    GraphExec(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
    ~GraphExec() {
        if (exec_ == nullptr) return;
        // A destructor must not throw; a failure here means the device is lost or the runtime is unloading.
        static_cast<void>(cudaStreamSynchronize(stream_));
        static_cast<void>(cudaGraphExecDestroy(exec_));
        static_cast<void>(cudaGetLastError());
    }
    GraphExec(GraphExec&& other) noexcept
        : exec_(std::exchange(other.exec_, nullptr)), stream_(std::exchange(other.stream_, nullptr)) {}
    GraphExec& operator=(GraphExec&& other) noexcept {
        if (this != &other) {
            GraphExec previous(std::move(*this));
            exec_ = std::exchange(other.exec_, nullptr);
            stream_ = std::exchange(other.stream_, nullptr);
        }
        return *this;
    }
    GraphExec(const GraphExec&) = delete;
    GraphExec& operator=(const GraphExec&) = delete;

    bool defined() const { return exec_ != nullptr; }
    void launch() const { DG_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

private:
    cudaGraphExec_t exec_ = nullptr;
    cudaStream_t stream_ = nullptr;
};

// One input key's state: warmed up (eager run done), then captured. Members are destroyed bottom-up: the
// graph first (waiting for its last launch), then the tensors, then the pool.
struct Variant {
    std::optional<CapturePoolOwner> pool;  // created for the capture
    std::vector<Tensor> inputs;            // static input buffers the graph reads
    Tensor output;                         // the step's result, rewritten by each replay
    GraphExec graph;
};

}  // namespace

struct CapturedStep::Impl {
    StepFn step;
    std::map<InputKey, Variant> variants;  // a key without a graph has had its eager warm-up only

    // Copies `inputs` into a new variant's static buffers, captures the step on them and launches it once.
    Tensor capture(Variant& v, std::span<const Tensor> inputs);
};

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
    begin_capture(v.pool->get());
    Tensor output;
    try {
        output = step(std::span<const Tensor>(v.inputs));
    } catch (...) {
        cudaGraph_t partial = nullptr;
        if (end_capture(&partial) == cudaSuccess) static_cast<void>(cudaGraphDestroy(partial));
        throw;
    }
    cudaGraph_t graph = nullptr;
    if (const cudaError_t status = end_capture(&graph); status != cudaSuccess)
        throw GraphError(str("CapturedStep: capturing the step failed: ", cudaGetErrorName(status), " (",
                             cudaGetErrorString(status), "); an operation of the step is not allowed in a CUDA graph ",
                             "(a host synchronisation or allocation outside dyngrad?)"));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    static_cast<void>(cudaGraphDestroy(graph));
    if (status != cudaSuccess) throw_cuda_error(status, "cudaGraphInstantiate(&exec, graph, 0)", __FILE__, __LINE__);
    v.graph = GraphExec(exec, ctx.stream);
    v.output = std::move(output);
    v.graph.launch();
    return v.output;
}

CapturedStep::CapturedStep(StepFn step) : impl_(std::make_unique<Impl>()) {
    if (!step) throw ValueError("CapturedStep: the step function is empty");
    impl_->step = std::move(step);
}

CapturedStep::~CapturedStep() = default;

Tensor CapturedStep::run(std::span<const Tensor> inputs) {
    InputKey key = input_key(inputs);
    const auto found = impl_->variants.find(key);
    if (found == impl_->variants.end()) {
        // First run of this key: eager, with the caller's tensors. Lets cuDNN search and cache its
        // algorithms and lets parameters' optimizer state come into being before a capture.
        Tensor output = impl_->step(inputs);
        impl_->variants.try_emplace(std::move(key));
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
    v.graph.launch();
    return v.output;
}

std::size_t CapturedStep::variants() const {
    std::size_t captured = 0;
    for (const auto& [key, v] : impl_->variants) captured += v.graph.defined() ? 1 : 0;
    return captured;
}

}  // namespace dyngrad::cuda
