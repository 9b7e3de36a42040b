// Loss scaling for reduced-precision training (PyTorch's torch.amp.GradScaler), in C++ and capturable.
//
//   GradScaler scaler;                                  // scale 2^16, growth 2 every 2000 clean steps, backoff 0.5
//   for each batch:
//       ComputeGraph graph;
//       Var loss = cross_entropy(model(graph, x), y);
//       graph.backward(scaler.scale(loss));             // gradients of loss · scale
//       scaler.unscale(optimizer);                      // optional: only to clip the true gradients first
//       clip_grad_norm(optimizer.parameters(), 1.0);
//       scaler.step(optimizer);                         // unscale + inf/NaN check fused into the step
//       scaler.update();                                // the next scale
//       optimizer.zero_grad();
//
// On a GPU the scale, the inv_scale, the found_inf flag and the growth tracker live in device memory: the
// check of every gradient is one multi-tensor kernel, the optimizer's fused step reads found_inf and inv_scale
// (skipping the whole update, step counts included, when a gradient is inf or NaN), and update() is a kernel.
// No host synchronisation anywhere, so the whole sequence can be captured (cuda::CapturedStep) and each replay
// skips or steps and grows or backs off by itself. On the CPU the same rules run on the host, with the same
// results.
//
// A collapsing scale (a diverged run: non-finite gradients at every scale) is an error, not a silent stall:
// when `max_consecutive_skips` steps in a row were skipped and the scale fell below `min_scale`, update()
// throws NumericalError on the CPU, naming the step (the count of update() calls); on a GPU the kernel records
// it and the NumericalError is raised at the next
// host synchronisation (as an out-of-range label is). The state (scale, growth tracker, consecutive skips) goes
// into checkpoints (save_checkpoint / load_checkpoint take the scaler).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dyngrad/core/safetensors.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

class Optimizer;

struct GradScalerOptions {
    double init_scale = 65536.0;  // 2^16
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    std::int64_t growth_interval = 2000;
    bool enabled = true;  // false: scale() is the identity, step() a plain step, update() nothing
    // The collapse rule (NumericalError, see above).
    double min_scale = 1.0;
    std::int64_t max_consecutive_skips = 16;
};

class GradScaler {
public:
    // ValueError: init_scale not positive and finite, growth_factor not above 1, backoff_factor not in (0, 1),
    // growth_interval or max_consecutive_skips not positive, min_scale negative or not finite.
    explicit GradScaler(const GradScalerOptions& options = {});

    // The calls of one step, in order: scale() (once per loss: several under gradient accumulation), an
    // optional unscale(), step(), update(). A call out of order throws ValueError and changes nothing, e.g.
    // step() or unscale() without a scale() since the last step() (the gradients are not scaled: dividing
    // them by the scale would step 65536 times too short), scale() after unscale() (half the gradients would
    // stay scaled), a second step() before update(), loading a state between scale() and step() (the
    // gradients were scaled by the old scale and would be divided by the loaded one).

    // loss · scale (the scale tensor lives on the loss's device, read there by the kernel). The first call
    // places the scaler's state on that device (a host-to-device copy: not inside a captured step).
    Var scale(const Var& loss);
    // Divides the gradients of `optimizer`'s parameters by the scale in place and records whether any is
    // inf/NaN; step() then steps with them as they are. For clipping before the step. Once per step.
    void unscale(Optimizer& optimizer);
    // The optimizer's step, skipped whole when a gradient is inf/NaN, with the gradients unscaled on the fly.
    void step(Optimizer& optimizer);
    // The next scale (see GradScalerOptions); call once per step, after step().
    void update();

    bool enabled() const { return options_.enabled; }
    const GradScalerOptions& options() const { return options_; }
    // Host reads (a host synchronisation on a GPU: GraphError inside a captured step).
    double scale_value() const;
    std::int64_t growth_tracker() const;
    std::int64_t consecutive_skips() const;
    bool last_step_skipped() const;  // whether the last step()'s gradients held inf/NaN

    // The state tensors by name ("scale", "growth_tracker", "skips", "found_inf", "inv_scale"), for
    // CapturedStep's guard. Empty before the first scale().
    std::vector<std::pair<std::string, Tensor>> state_tensors() const;
    // Checkpoint state under "@scaler." (scale, growth tracker, consecutive skips).
    void save_state(TensorMap& tensors, SafetensorsMetadata& metadata) const;
    // Checks now (IoError for missing entries, ValueError for a bad scale), applies when called.
    std::function<void()> stage_state(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                                      const std::string& source);
    void load_state(const TensorMap& tensors, const SafetensorsMetadata& metadata, const std::string& source);

private:
    // Puts the state on `device` (from the host values) the first time.
    void place(const Device& device);
    // ValueError naming `call` unless scale() was called since the last step().
    void require_scaled(const char* call) const;
    // found_inf and inv_scale for the current gradients (in place when `unscale`).
    void check(Optimizer& optimizer, bool unscale);

    GradScalerOptions options_;
    Tensor scale_;      // f32 ()
    Tensor inv_scale_;  // f32 ()
    Tensor found_inf_;  // f32 ()
    Tensor one_;        // f32 (): the inv_scale of a step after unscale()
    Tensor tracker_;    // i64 ()
    Tensor skips_;      // i64 ()
    bool scaled_ = false;    // scale() was called since the last step(): the gradients are scaled
    bool unscaled_ = false;  // unscale() was called for the current step
    bool checked_ = false;   // found_inf holds the current step's verdict
    std::int64_t updates_ = 0;  // update() calls (host count; names the step in the CPU collapse error)
};

}  // namespace dyngrad
