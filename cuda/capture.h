// CapturedStep: a whole training step (forward, loss, backward, optimizer update) captured once into a
// CUDA graph and replayed, so a step costs one graph launch instead of one host dispatch per op.
//
//   cuda::CapturedStep step([&](std::span<const Tensor> in) {
//       ComputeGraph graph;
//       Var loss = cross_entropy(model(graph, graph.input(in[0])), graph.input(in[1]));
//       graph.backward(loss);
//       optimizer.step();
//       optimizer.zero_grad();
//       return loss.value();
//   });
//   for (auto& [x, y] : batches) Tensor loss = step.run({{x, y}});   // loss.item() syncs when read
//
// Variants are keyed by the inputs' shapes, dtypes and device: the first run() of a new key runs the step
// eagerly (a warm-up that lets cuDNN/cuBLAS pick and cache algorithms and lets parameters and optimizer
// state reach their steady shapes), the second captures it, later runs replay it. run() copies the inputs
// into the variant's static input buffers first, so callers may pass any tensors of the key's shapes.
//
// What is capturable (docs/training.md, "Captured training steps"): the training state that changes from
// step to step lives in device memory and is advanced there by the captured kernels, so every replay does
// what the same step run eagerly does: SGD/Adam/AdamW (step counts and bias corrections), set_lr() and the
// built-in schedules (the epoch and the lr formula run on the device), Dropout (its seed counter advances on
// the device: fresh masks on every replay, those of the eager run), clip_grad_norm, and GradScaler (inf
// check, skipped steps and scale updates on the device).
// What a captured step must respect (run() throws GraphError when it can tell, e.g. a host
// synchronisation such as item() or lr(), a host-to-device copy, the first GPU step of an optimizer, a
// schedule without a device rule or a cuDNN algorithm search inside the step; the capture is then ended and
// the device stays usable): the host code of the step runs only while capturing, so it must not branch on
// values computed on the GPU nor on host counters, and other host values it passes to kernels are frozen
// into the graph (set_lr(x) replays x). Opt-in check: CaptureOptions::guard_replays. The step should end
// with optimizer.zero_grad(), so that every replay starts from the same state. No other host thread may
// queue work on the device while a step is being captured.
// Memory the step allocates while being captured comes from a pool private to its variant and keeps
// its addresses across replays (cuda::memory_stats().capture_reserved_bytes); the returned tensor is
// overwritten by the next run() of that variant and stays valid after the CapturedStep is destroyed.
// The graph is captured in cudaStreamCaptureModeThreadLocal mode on the device's stream. Not thread-safe:
// use a CapturedStep from one thread at a time.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dyngrad/core/tensor.h"

namespace dyngrad::cuda {

// The capture guard: the first `guard_replays` replays of each variant also run the step eagerly from the
// same state and compare, bit for bit, every tensor `guard_state` names and the step's output. The first that
// differs is named in a GraphError ("... differs at 'fc.weight' ..."): the step is not capturable (a host
// branch or a host counter, a host value frozen into the graph). Per guarded replay: the state is copied
// aside, the graph replays, its results are copied, the state is restored and the step runs eagerly; so
// `guard_state` must name EVERY tensor the step changes, or the eager run starts from the replay's state:
// the parameters, the optimizer's state tensors and device_scalars(), a schedule's device_scalars(), a
// GradScaler's state_tensors(), each Dropout's seeds().counter() (nn/). Costs a host synchronisation and
// copies: a debugging aid.
struct CaptureOptions {
    std::size_t guard_replays = 0;
    std::function<std::vector<std::pair<std::string, Tensor>>()> guard_state = nullptr;
};

class CapturedStep {
public:
    using StepFn = std::function<Tensor(std::span<const Tensor> inputs)>;

    // ValueError: an empty step, or guard_replays without guard_state.
    explicit CapturedStep(StepFn step, CaptureOptions options = {});
    ~CapturedStep();
    CapturedStep(const CapturedStep&) = delete;
    CapturedStep& operator=(const CapturedStep&) = delete;

    // Runs the step on `inputs` (at least one; all CUDA tensors on one device, else DeviceError); returns
    // the step's output tensor. Queues the work and returns without waiting for the GPU.
    Tensor run(std::span<const Tensor> inputs);
    // Number of captured variants (distinct input keys) held.
    std::size_t variants() const;

    // What the most recently captured variant's graph holds: the work a replay launches (issue 17's
    // "kernels per step"). All zero before the first capture.
    struct GraphCounts {
        std::size_t nodes = 0;    // every node of the graph
        std::size_t kernels = 0;  // kernel launches (ours, cuBLAS's, cuDNN's)
        std::size_t memsets = 0;
        std::size_t memcpys = 0;
        std::size_t other = 0;    // events, host nodes, child graphs, ...
        // Kernel, memset and memcpy nodes on the graph's longest dependency path: what a replay runs in
        // sequence. Below the sum of the three when branches run side by side (the side lane, cuda/runtime.h).
        std::size_t longest_chain = 0;
    };
    GraphCounts last_graph_counts() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace dyngrad::cuda
