// Optimizers over groups of Parameters, learning-rate schedules, gradient clipping, loss scaling (GradScaler) and
// checkpoints. CPU: nn/optim.cpp. GPU: nn/optim.cu (fused multi-tensor kernels); both apply the update rules of
// nn/optim_internal.h. Schedules: nn/schedules.cpp; clipping: nn/clip.{cpp,cu}; checkpoints: nn/checkpoint.cpp.
//
//   SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
//   for each batch: opt.zero_grad(); graph.backward(loss); clip_grad_norm(params, 1.0); opt.step(); graph.clear();
//
// Parameter groups, as PyTorch's param_groups: each group's unset settings take the optimizer's options.
//   AdamW opt({{.parameters = body.parameters()}, {.parameters = head.parameters(), .lr = 1e-2, .weight_decay = 0}},
//             {.lr = 1e-3, .weight_decay = 0.01});
// A group may set only the settings its optimizer has (ValueError otherwise: beta1 for SGD, momentum for Adam).
//
// The update rules are PyTorch's (torch.optim.SGD / Adam / AdamW with their default flags).
// step() skips parameters without a gradient and frozen ones (Parameter::set_requires_grad(false)).
// State (momentum buffers, Adam moments) is created on the first step that updates a parameter, on that
// parameter's device, and follows the parameter if it moves. On a GPU one step over all parameters of
// one dtype is one fused kernel launch, whatever their groups and Adam step counts, with no device
// synchronisation.
//
// Capturable (cuda/capture.h): on a GPU every group's lr and every parameter's step count live in device
// memory (the host keeps a mirror). The fused step reads them there, derives Adam's bias corrections from
// the device step count and advances it; set_lr() writes the device lr with a kernel, and a schedule's
// step() computes the next lr on the device from a device epoch counter. So a captured step (Adam, AdamW,
// SGD, with a schedule) advances exactly as the same steps run eagerly. Reading them back on the host
// (lr(), settings(), step_count(), LRScheduler::epoch(), save_state) copies from the device: a host
// synchronisation, refused inside a captured step (GraphError). The device copies are made at the first
// GPU step on each device, which must therefore run eagerly (CapturedStep's warm-up run does; GraphError
// when that first step is captured).
//
// Checkpoints: save_checkpoint() writes the model's tensors, the optimizer's state (per-group settings,
// per-parameter step counts and moments) and a schedule's epoch and base lrs into one safetensors file;
// load_checkpoint() restores all three so that a resumed run continues bit for bit as an uninterrupted one.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/core/safetensors.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/nn/layers.h"
#include "dyngrad/nn/schedule_rule.h"

namespace dyngrad {

class GradScaler;  // below

// One group of parameters and its settings; unset ones take the optimizer's options.
struct ParamGroup {
    std::vector<Parameter> parameters = {};
    std::optional<double> lr = std::nullopt;
    std::optional<double> weight_decay = std::nullopt;
    std::optional<double> momentum = std::nullopt;   // SGD
    std::optional<bool> nesterov = std::nullopt;     // SGD
    std::optional<double> beta1 = std::nullopt;      // Adam, AdamW
    std::optional<double> beta2 = std::nullopt;      // Adam, AdamW
    std::optional<double> eps = std::nullopt;        // Adam, AdamW
};

// The resolved settings of one group (each optimizer reads those it has).
struct GroupSettings {
    double lr = 0;
    double weight_decay = 0;
    double momentum = 0;
    bool nesterov = false;
    double beta1 = 0;
    double beta2 = 0;
    double eps = 0;
};

class Optimizer {
public:
    virtual ~Optimizer();
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    // Updates every trainable parameter that has a gradient, in place.
    void step() { update(nullptr, nullptr); }
    // Internal (GradScaler, below): a step whose gradients are multiplied by `inv_scale` first and that is
    // skipped whole (step counts included) when `found_inf` is non-zero: one-element float32 tensors on the
    // parameters' device, read there by the fused kernel (no host synchronisation).
    struct Gate {
        Tensor inv_scale;
        Tensor found_inf;
    };
    void step(const Gate& gate) { update(&gate, nullptr); }
    // clip_grad_norm(parameters(), max_norm, norm_type, eps) followed by step(), with the same results bit for
    // bit (the parameters, the optimizer state, the returned norm, and the gradients, which are left clipped
    // as clip_grad_norm leaves them). On a GPU the clipping is fused into the step: the norm is one launch per
    // dtype, and the step's kernel multiplies each gradient by the clip coefficient as it reads it and writes
    // the clipped gradient back, where clip_grad_norm + step() launch a scaling pass of its own. Since nothing
    // runs between the two, nothing can read half-clipped gradients. The errors of clip_grad_norm (checked
    // before anything changes) and of step().
    Tensor clip_grad_norm_and_step(double max_norm, double norm_type = 2.0, double eps = 1e-6);
    // Drops every parameter's gradient (the next backward starts from zero).
    void zero_grad();
    // "SGD", "Adam", "AdamW": also the optimizer type recorded in a checkpoint.
    virtual const char* name() const = 0;

    std::size_t group_count() const { return groups_.size(); }
    // IndexError for a group that does not exist. On a GPU the lr is read from the device (a host sync).
    const GroupSettings& settings(std::size_t group = 0) const;
    double lr(std::size_t group = 0) const { return settings(group).lr; }
    // Every group; ValueError when negative, NaN or infinite. On a GPU also the device lr, by a kernel
    // (capturable: a replay writes the value the captured call passed).
    void set_lr(double lr);
    void set_lr(std::size_t group, double lr);
    // All parameters, group after group; group_parameters(g) is group g's run of them.
    const std::vector<Parameter>& parameters() const { return parameters_; }
    std::span<const Parameter> group_parameters(std::size_t group) const;
    // How many updates parameter i (an index into parameters()) has had (IndexError past the end); read from
    // the device for a GPU parameter.
    std::int64_t step_count(std::size_t parameter) const;
    // The device-resident scalars, by name ("lr.cuda0", "steps.cuda0"): with the parameters and state
    // tensors, what a step changes (CapturedStep's guard compares them). Empty before the first GPU step.
    std::vector<std::pair<std::string, Tensor>> device_scalars() const;
    // Parameter i's state tensors by name ("exp_avg", "exp_avg_sq", "momentum_buffer"); undefined ones left out.
    std::vector<std::pair<std::string, Tensor>> state_tensors(std::size_t parameter) const;

    // Checkpoint state under "@optimizer.": the settings of every group, the step counts and the state
    // tensors (on the CPU), and the optimizer type in the metadata.
    void save_state(TensorMap& tensors, SafetensorsMetadata& metadata) const;
    // Restores what save_state wrote, into an optimizer over parameters of the same shapes in groups of the
    // same sizes. Checks everything first and changes nothing on error: ValueError for another optimizer type,
    // another number of groups, other group sizes or invalid settings; IoError for missing or unexpected "@optimizer." entries;
    // ShapeError/DTypeError for a tensor that does not fit. `source` names the file in messages.
    void load_state(const TensorMap& tensors, const SafetensorsMetadata& metadata, const std::string& source);
    // load_state in two phases: everything is checked now, and the returned function (which cannot throw)
    // applies it. load_checkpoint uses it to change nothing unless the model, optimizer and schedule all fit.
    std::function<void()> stage_state(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                                      const std::string& source);

protected:
    friend class LRScheduler;
    // The update rule: every trainable parameter with a gradient, gated by `gate` when given. `clip`: a 0-d
    // float64 tensor on the parameters' GPU holding clip_grad_norm's coefficient, which the fused kernel applies
    // to the gradients (and writes back) before the update; null: none. Only clip_grad_norm_and_step passes it,
    // for gradients on one GPU.
    virtual void update(const Gate* gate, const Tensor* clip) = 0;
    // ValueError for an undefined or repeated parameter, an unknown setting or an invalid value.
    // `who` names the optimizer in messages; `settable` lists the ParamGroup settings it has.
    Optimizer(std::vector<ParamGroup> groups, const GroupSettings& defaults, const char* who,
              std::span<const char* const> settable);
    // Indices of the trainable parameters that have a gradient; ValueError when one does not match its
    // parameter.
    std::vector<std::size_t> with_grad() const;
    // The settings a group of this optimizer may set, and the check of their values (ValueError).
    // `who` names the optimizer and group in messages ("SGD group 1").
    virtual void check_settings(const GroupSettings& settings, const std::string& who) const = 0;
    // The names of the state tensors parameter i keeps once updated (per slot of state_).
    virtual std::vector<const char*> state_names(const GroupSettings& settings) const = 0;
    // Checks every group's settings (derived constructors call it: it calls check_settings).
    void check_groups() const;
    std::string group_name(std::size_t group) const;
    // Internal: the per-device tables and device-resident scalars of the fused GPU steps (nn/optim_internal.h).
    struct DeviceTables;
    // Internal (nn/optim_internal.h): one update rule's CPU half, its GPU operands and its fused launch.
    struct StepRule;
    // The frame every update shares (after the checks and state creation that may throw): a step GradScaler's
    // flags skip on the CPU does nothing; each ready parameter's step count advances; CPU parameters are updated
    // by the rule's CPU half, GPU ones by one fused launch per device.
    void run_update(const std::vector<std::size_t>& ready, const Gate* gate, const Tensor* clip, const StepRule& rule);
    // Copies the device lrs and step counts into the host mirror (a host sync; nothing without GPU state).
    void pull_device_scalars() const;
    // Sets the host lr only (schedules write the device lrs themselves).
    void set_host_lr(std::size_t group, double lr);
    // The gradient multipliers of a gated step on the CPU: whether it is skipped, and the factor.
    static bool gate_skips(const Gate* gate, const Device& device);
    static double gate_inv_scale(const Gate* gate);

    struct Group {
        std::size_t begin = 0, end = 0;  // the run of parameters_
        GroupSettings settings;
    };
    std::vector<Parameter> parameters_;
    std::vector<std::size_t> group_of_;   // per parameter
    mutable std::vector<Group> groups_;   // mutable: host reads refresh the lrs from the device
    mutable std::vector<std::int64_t> steps_;  // per parameter; for GPU parameters a mirror of the device
    std::vector<std::array<Tensor, 2>> state_;  // per parameter: SGD momentum buffer; Adam m, v
    std::unique_ptr<DeviceTables> tables_;
};

struct SgdOptions {
    double lr = 0.01;
    double momentum = 0.0;
    bool nesterov = false;  // needs momentum > 0
    double weight_decay = 0.0;  // L2: added to the gradient as weight_decay · param
};

// g = grad + wd·p;  with momentum: buf = momentum·buf + g;  g = nesterov ? g + momentum·buf : buf;
// p -= lr·g.  (Dampening is 0; the first buf is g, as in PyTorch.)
class SGD : public Optimizer {
public:
    SGD(std::vector<Parameter> parameters, const SgdOptions& options = {});
    SGD(std::vector<ParamGroup> groups, const SgdOptions& defaults = {});
    const char* name() const override { return "SGD"; }
    SgdOptions options(std::size_t group = 0) const;
    // Parameter i's momentum buffer: undefined until its first update with momentum (IndexError past the end).
    const Tensor& momentum_buffer(std::size_t i) const;

protected:
    void update(const Gate* gate, const Tensor* clip) override;
    void check_settings(const GroupSettings& settings, const std::string& who) const override;
    std::vector<const char*> state_names(const GroupSettings& settings) const override;
};

struct AdamOptions {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;  // Adam: L2 added to the gradient; AdamW: decoupled, p *= 1 - lr·wd
};

// t = this parameter's step count (from 1); g = grad (+ wd·p for Adam);
// m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;
// p -= lr / (1-β1^t) · m / (√v / √(1-β2^t) + eps).
class Adam : public Optimizer {
public:
    Adam(std::vector<Parameter> parameters, const AdamOptions& options = {});
    Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults = {});
    const char* name() const override { return decoupled_ ? "AdamW" : "Adam"; }
    AdamOptions options(std::size_t group = 0) const;
    // Parameter i's moments m and v: undefined until its first update (IndexError past the end); its update
    // count, which sets its bias corrections, is step_count(i).
    const Tensor& exp_avg(std::size_t i) const;
    const Tensor& exp_avg_sq(std::size_t i) const;

protected:
    Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults, bool decoupled_weight_decay);
    void update(const Gate* gate, const Tensor* clip) override;
    void check_settings(const GroupSettings& settings, const std::string& who) const override;
    std::vector<const char*> state_names(const GroupSettings& settings) const override;

private:
    bool decoupled_;
};

// Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr·wd before the Adam update.
// PyTorch's default weight_decay for AdamW is 0.01; pass it explicitly.
class AdamW : public Adam {
public:
    AdamW(std::vector<Parameter> parameters, const AdamOptions& options = {});
    AdamW(std::vector<ParamGroup> groups, const AdamOptions& defaults = {});
};

// ---- learning-rate schedules: call step() once per epoch, after that epoch's optimizer steps ----
// A schedule records every group's lr at construction as that group's base lr and sets each group's lr
// for the next epoch from its own base; lr_at(epoch, group) is the closed form (epoch 0: the base lr, but
// for WarmupCosineLR, whose constructor sets lr_at(0)). Per-step schedules (WarmupCosineLR) are stepped
// once per optimizer step instead. On a GPU the built-in schedules keep their epoch on the device too and
// step() computes the next lrs there (capturable: each replay advances the schedule); a schedule without a
// device rule (device_rule() empty) sets the lrs from the host, which a captured step refuses (GraphError).
// A built-in schedule's step() on a GPU launches nothing: the optimizer's next fused step kernel computes
// each group's lr from the rule and the device epoch and advances the epoch (its last block), so a step
// with a per-step schedule launches no more kernels than one without. lr() and epoch() report the values
// that next step uses; set_lr() after step() overrides the schedule's lr for that one step, as before.

class LRScheduler {
public:
    virtual ~LRScheduler();
    LRScheduler(const LRScheduler&) = delete;
    LRScheduler& operator=(const LRScheduler&) = delete;

    void step();
    // ValueError for a negative epoch, IndexError for a group that does not exist.
    double lr_at(std::int64_t epoch, std::size_t group = 0) const;
    std::int64_t epoch() const;  // read from the device once the schedule runs there (a host sync)
    const std::vector<double>& base_lrs() const { return base_lrs_; }
    const Optimizer& optimizer() const { return optimizer_; }
    virtual const char* name() const = 0;  // "StepLR", "CosineAnnealingLR": recorded in a checkpoint

    // Checkpoint state under "@schedule.": the epoch and the base lrs, and the schedule type in the
    // metadata. (Its own settings, step_size or T_max, come from its constructor.)
    void save_state(TensorMap& tensors, SafetensorsMetadata& metadata) const;
    void load_state(const TensorMap& tensors, const SafetensorsMetadata& metadata, const std::string& source);
    std::function<void()> stage_state(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                                      const std::string& source);
    // The device-resident epoch counters by name ("epoch.cuda0"), for CapturedStep's guard.
    std::vector<std::pair<std::string, Tensor>> device_scalars() const;

protected:
    explicit LRScheduler(Optimizer& optimizer);
    virtual double lr_for(double base_lr, std::int64_t epoch) const = 0;
    // The closed form as the device computes it (nn/optim_internal.h); empty: host-only (not capturable).
    virtual std::optional<ScheduleRule> device_rule() const { return std::nullopt; }
    // Sets every group's lr to lr_at(epoch()) on the host (constructors of schedules whose epoch 0 is not
    // the base lr).
    void apply_current_epoch();
    // The steps of this schedule that the optimizer's next fused step on `device` applies (step() defers its
    // device work into that step's kernel): the device epoch lags the logical one by them.
    std::int64_t deferred_steps(int device) const;

private:
    struct DeviceEpochs;
    Optimizer& optimizer_;
    std::vector<double> base_lrs_;
    mutable std::int64_t epoch_ = 0;  // mutable: a host read refreshes it from the device
    std::shared_ptr<DeviceEpochs> devices_;
};

// lr = base · gamma^floor(epoch / step_size)
class StepLR : public LRScheduler {
public:
    StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);
    const char* name() const override { return "StepLR"; }

protected:
    double lr_for(double base_lr, std::int64_t epoch) const override;
    std::optional<ScheduleRule> device_rule() const override;

private:
    std::int64_t step_size_;
    double gamma_;
};

// lr = eta_min + (base − eta_min) · (1 + cos(π · epoch / T_max)) / 2   (a cosine period of 2·T_max)
class CosineAnnealingLR : public LRScheduler {
public:
    CosineAnnealingLR(Optimizer& optimizer, std::int64_t t_max, double eta_min = 0.0);
    const char* name() const override { return "CosineAnnealingLR"; }

protected:
    double lr_for(double base_lr, std::int64_t epoch) const override;
    std::optional<ScheduleRule> device_rule() const override;

private:
    std::int64_t t_max_;
    double eta_min_;
};

// Per optimizer step (call step() after every optimizer step): a linear warm-up, then a half cosine.
//   epoch < warmup_steps:            lr = base · (epoch + 1) / (warmup_steps + 1)
//   warmup_steps <= epoch < total:   lr = min_lr + (base − min_lr) · (1 + cos(π · (epoch − warmup) / (total − warmup))) / 2
//   epoch >= total_steps:            lr = min_lr
// The constructor sets every group's lr to lr_at(0). ValueError: warmup_steps negative, total_steps not above
// warmup_steps, min_lr negative or not finite.
class WarmupCosineLR : public LRScheduler {
public:
    WarmupCosineLR(Optimizer& optimizer, std::int64_t warmup_steps, std::int64_t total_steps, double min_lr = 0.0);
    const char* name() const override { return "WarmupCosineLR"; }

protected:
    double lr_for(double base_lr, std::int64_t epoch) const override;
    std::optional<ScheduleRule> device_rule() const override;

private:
    ScheduleRule rule_;
};

// ---- gradient clipping (call between backward and step) ----

// Scales the gradients of the trainable parameters that have one by min(1, max_norm / (norm + eps)), where
// norm is the norm_type-norm of all those gradients together (norm_type = infinity: the largest |g|).
// Returns that norm (before clipping) as a 0-d tensor on the gradients' device, float64 when any gradient
// is float64, float32 otherwise (0 when no parameter has a gradient). On a GPU the norm stays on the device:
// no host synchronisation (the scale is applied by a kernel reading it). Accumulation is in float64.
// ValueError: max_norm negative/NaN, norm_type not positive; DeviceError: gradients on several devices.
Tensor clip_grad_norm(const std::vector<Parameter>& parameters, double max_norm, double norm_type = 2.0,
                      double eps = 1e-6);
// PyTorch's clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite): with true, a NaN or infinite
// total norm throws NumericalError and leaves every gradient unchanged (the check reads the norm on the host, one
// synchronisation per gradient on a GPU); false is the form above.
Tensor clip_grad_norm(const std::vector<Parameter>& parameters, double max_norm, double norm_type,
                      bool error_if_nonfinite, double eps = 1e-6);

// Clamps every gradient element into [-clip_value, clip_value]. ValueError: clip_value negative or NaN.
void clip_grad_value(const std::vector<Parameter>& parameters, double clip_value);

// ---- loss scaling ----
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

// ---- checkpoints: model, optimizer and schedule in one safetensors file ----

// The model's tensors under their names (as save_parameters), the optimizer's, schedule's and loss scaler's
// state under "@optimizer.", "@schedule." and "@scaler.". load_parameters reads the model's part of such a file.
void save_checkpoint(const std::filesystem::path& path, const Module& model, const Optimizer& optimizer,
                     const LRScheduler* schedule = nullptr, const GradScaler* scaler = nullptr);
// Restores all of them; checks everything first, so on error nothing has changed (the errors of
// load_parameters and Optimizer/LRScheduler/GradScaler::load_state; ValueError for a schedule of another
// optimizer).
void load_checkpoint(const std::filesystem::path& path, Module& model, Optimizer& optimizer,
                     LRScheduler* schedule = nullptr, GradScaler* scaler = nullptr);

}  // namespace dyngrad
