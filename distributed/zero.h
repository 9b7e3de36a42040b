// Sharded data parallelism (ZeRO stages 1, 2 and 3) over a ProcessGroup. In stages 1 and 2 every rank holds the
// whole model and runs its part of the batch, as with DistributedDataParallel, but AdamW's moments (stage 1) and
// the averaged gradients (stage 2) are split across the ranks: each rank keeps and updates only its shard, and
// the updated parameters are all-gathered after the step. Stage 3 shards the parameters too (below).
//
//   auto group = dist::ProcessGroup::init();
//   dist::ZeroOptimizer zero(model, group, {.lr = 1e-3, .weight_decay = 0.01}, {.stage = 2});
//   for each batch (this rank's shard):
//       ComputeGraph graph;
//       zero.backward(graph, loss(model(graph.input(x)), ...));   // backward, then reduce-scatter (stage 2)
//       zero.clip_grad_norm(1.0);                                 // optional: one global norm over the shards
//       zero.step();                                              // shard-local AdamW, then all_gather
//       zero.zero_grad();
//
// Layout. The trainable parameters, in registration order, are laid end to end in one flat buffer per dtype
// (Ψ_d elements), padded with zeros to a multiple of the world size W; rank r owns elements [r·S, (r+1)·S) of
// it, S = ceil(Ψ_d / W). The padding (at most W − 1 elements, all on the last ranks) has zero gradient, zero
// value and zero moments, so AdamW leaves it at zero and it never reaches a parameter. In stages 1 and 2 the
// parameters' values are views of one such flat buffer of values per dtype, and this rank's shard is its block
// of it: the all-gather after the step writes every parameter in place (no copies; a parameter whose value was
// replaced since is copied into instead).
//
// The update is AdamW's own code (nn/optim.h): an AdamW over one Parameter per dtype whose value is this rank's
// shard and whose gradient is the averaged gradient's shard, so the per-element formula, the fused GPU kernel,
// the step counts and the lr schedules (attach one to optimizer()) are those of the ordinary optimizer. After
// N steps the parameters equal a single-process AdamW on the concatenated batch (tests/distributed/test_dist_zero.cpp).
//
// Stage 1: the gradients are all-reduced (averaged) in full; every rank keeps them in the model's parameters
// (as DDP) and updates its shard. Stage 2: they are reduce-scattered; each rank keeps only its shard's averaged
// gradient, and the model's full gradients are dropped after the reduction (the model's parameters have no
// gradient after backward()). Per-rank bytes (`memory()`, bytes b per element, K = 2 AdamW moments):
//   stage 1: parameters Ψ·b, gradients Ψ·b,   optimizer state K·Ψ·b / W
//   stage 2: parameters Ψ·b, gradients Ψ·b/W, optimizer state K·Ψ·b / W
// (ZeRO paper's formulas, with the padding counted.) In stage 2 the full gradients still exist while the backward
// runs; the reduce-scatter then frees them.
//
// Stage 3 (FSDP-style, distributed/zero3.cpp): built from a list of units (ZeroUnit: a Module and its forward over one
// Var), each with its own flat buffers, padded and sharded as above. Between uses a unit's parameters hold no
// elements (0-element tensors); zero.forward(x) runs the units in order, each as one node of the caller's graph:
// its forward all-gathers the unit's shards into the parameters, records the unit's forward into a graph of its
// own (kept by the node: the unit's activations stay) and frees the gathered memory; that node's backward gathers
// the parameters again into the same memory, back-propagates through the kept graph, reduce-scatters (avg) the
// unit's gradients into this rank's shards and frees everything. With ZeroOptions::recompute the forward records
// nothing and the backward re-runs it (activation checkpointing per unit). Per-rank bytes: parameters Ψ·b/W + one
// unit's gathered copy, gradients Ψ·b/W, optimizer state K·Ψ·b/W.
//
//   std::vector<dist::ZeroUnit> units;
//   for (std::size_t i = 0; i < blocks.size(); ++i)
//       units.push_back({str("block", i), blocks[i], [b = blocks[i]](const Var& x) { return b(x); }});
//   dist::ZeroOptimizer zero(std::move(units), group, {.lr = 1e-3}, {.stage = 3});
//   ComputeGraph graph;
//   zero.backward(graph, loss(zero.forward(graph.input(x)), ...));
//   zero.step(); zero.zero_grad();
//
// Unused parameters: a trainable parameter the backward did not reach contributes zeros (as in DDP), so every
// shard has a gradient at every step and every element's step count advances together.
//
// Checkpoints (save_checkpoint / load_checkpoint): a folder with model.safetensors (rank 0, the full model) and
// one zero-rank<r>-of-<W>.safetensors per rank (that rank's moments, the step counts and settings). Loading on
// another world size reshards: each rank reads the old files its new shard overlaps.
//
// The same collectives on CUDA tensors go through NCCL (reduce_scatter, all_gather, all_reduce): a model on a GPU
// needs a group with NCCL (DeviceError at construction otherwise). No host synchronisation in a step on a GPU
// (clip_grad_norm's norm stays on the device).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dyngrad/distributed/process_group.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/nn/layers.h"
#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/transformer.h"

namespace dyngrad::dist {

struct ZeroOptions {
    // 1: optimizer state sharded; 2: gradients too; 3: parameters too (the ZeroUnit constructor only). ValueError
    // otherwise.
    int stage = 2;
    // Stage 1 only (ValueError otherwise): backward() all-reduces the gradients during the sweep through
    // DistributedDataParallel's buckets (distributed/ddp.h) instead of one all-reduce after it, so the communication
    // overlaps the backward. Costs DDP's bucket buffers: Ψ·b more gradient memory than the formula (memory()
    // counts them). reduce_gradients() called by hand still reduces after the backward.
    bool overlap = false;
    // Stage 3 only. false (the default, PyTorch FSDP's way): a unit's forward is recorded once, into a graph of its
    // own that the caller's node keeps until its backward; the unit's activations are kept, and only its gathered
    // parameters (and their autocast casts) are freed after the forward and gathered again into the same memory
    // before the backward: one forward per step, the units may draw randomness (dropout). true: the unit's forward
    // runs without recording and again in the backward (activation checkpointing per unit): less activation memory,
    // one more forward per step, and the unit must be deterministic (a unit marked `stochastic` is refused).
    bool recompute = false;
    // Stage 3, kept forward only (ValueError otherwise): while a unit computes, the all-gather a neighbour needs next
    // runs beside it, as FSDP's forward and backward prefetch: in the forward the next unit's shards, in the backward
    // the previous unit's (into its recorded forward's released storages). On CUDA the prefetch runs on a
    // communication stream that starts after the collective before it and is waited for before the next one (the
    // unit's reduce-scatter, the next unit's use), so every rank's device runs the collectives in one order; on the
    // CPU it is the same all-gather, made earlier. Two units' gathered parameters are resident at once (memory():
    // gathered_peak_bytes). A group of one sends nothing and prefetches nothing. Unset (the default): on where it
    // applies (stage 3 with the kept forward), as FSDP prefetches: it pays where an all-gather is slow against a
    // unit's compute; over NVLink it measured within noise (docs/distributed.md). true: required (ValueError where
    // it does not apply); false: off.
    std::optional<bool> prefetch = std::nullopt;
};

// Stage 3: one unit of the model. Its parameters are gathered, used and freed together; `forward` maps the
// previous unit's output (or zero.forward's input) to this unit's output and may record only the parameters of
// `module` (and constants). With ZeroOptions::recompute it runs twice per step (forward, then again in the
// backward), so it must give the same result both times: no dropout or other fresh randomness.
struct ZeroUnit {
    std::string name;  // no dots; its parameters are "<name>.<path in module>" in checkpoints and errors
    Module module;
    std::function<Var(const Var&)> forward;
    // The forward draws fresh randomness (dropout): refused with ZeroOptions::recompute (ValueError naming the
    // unit). A recomputed unit that records a dropout anyway is refused in its backward.
    bool stochastic = false;
};

// Stage 3's units of a GPT (nn/transformer.h), as char_gpt --zero 3 and dyngrad-dist-bench shard it: "embed" (the
// token and position embeddings, then the embedding dropout), "block<i>" per block, "head" (the final LayerNorm and
// the LM head, giving the logits (B, T, embedding rows)): GPT::operator() in pieces. With dropout the embed unit and
// the blocks are `stochastic` (ZeroOptimizer refuses them with recompute). The embeddings must be untied
// (ValueError: the tied head's weight would be in two units).
std::vector<ZeroUnit> gpt_units(const GPT& model);

// Per-rank bytes held by the ZeRO optimizer and the model (from tensor sizes), with the ZeRO formulas.
struct ZeroMemory {
    int world = 1;
    int stage = 2;
    std::int64_t parameters = 0;        // Ψ: trainable elements (all dtypes)
    std::int64_t padded = 0;            // Σ_d W·ceil(Ψ_d / W)
    std::int64_t parameter_bytes = 0;   // the model's trainable parameters, measured
    std::int64_t gradient_bytes = 0;    // gradients kept between backward() and step(), measured
    std::int64_t optimizer_bytes = 0;   // AdamW moments of this rank's shards, measured
    // The formulas: Ψ·b, Ψ·b (stage 1) or padded·b/W (stage 2), 2·padded·b/W.
    std::int64_t formula_parameter_bytes = 0;
    std::int64_t formula_gradient_bytes = 0;
    std::int64_t formula_optimizer_bytes = 0;
    // The same model under DDP with AdamW: Ψ·b each for parameters and gradients, 2·Ψ·b for the moments.
    std::int64_t ddp_bytes = 0;
    // Stage 3: the most bytes of gathered parameters held at once since construction (measured; with
    // ZeroOptions::prefetch the next unit's prefetched buffers count from their prefetch), and the formula: the
    // largest unit's padded flat buffers (Σ_d W·S_d·b; one unit gathered at a time), with prefetch (W > 1) the
    // largest sum of two neighbouring units' (a unit and the neighbour gathered beside it).
    std::int64_t gathered_peak_bytes = 0;
    std::int64_t formula_gathered_bytes = 0;
    std::int64_t gathered_bytes = 0;  // stage 3: gathered parameters held now (0 between the units' uses)
    // Stage 3 without recompute, measured now over the units' recorded forwards that await their backward (0 with
    // recompute, and once every backward ran): `kept_parameter_bytes`, the gathered parameter buffers and their
    // autocast casts those forwards refer to that are resident (0 between a unit's forward and its backward: the
    // formula); `released_bytes`, those freed until their backward (the padded gathered buffers, W·S_u·b per unit
    // and forward, plus 2 bytes per parameter element cast to bf16/f16); `kept_activation_bytes`, the rest of what
    // their graphs hold (the activations inside the units: each distinct storage once, the units' inputs and
    // outputs excluded, as the caller's graph holds those).
    std::int64_t kept_parameter_bytes = 0;
    std::int64_t released_bytes = 0;
    std::int64_t kept_activation_bytes = 0;
};

class ZeroOptimizer {
public:
    // Checks that every rank's model has the same parameters (names, shapes, dtypes: ShapeError, DTypeError or
    // ValueError naming the first difference, on every rank, as DistributedDataParallel), broadcasts rank 0's
    // parameters and buffers, and creates this rank's shards. ValueError: no trainable parameter, a stage other
    // than 1 or 2, trainable parameters on several devices. DeviceError: CUDA parameters on a group without
    // NCCL, or CPU parameters on a group of several ranks without MPI.
    ZeroOptimizer(const Module& module, ProcessGroup group, const AdamOptions& options = {.weight_decay = 0.01},
                  ZeroOptions zero = {});
    // Stage 3 (zero.stage must be 3, overlap false: ValueError). The units' modules are registered, under their
    // names, in one Module (module()); the same checks and broadcast as above, then each unit's trainable
    // parameters become one flat buffer per dtype, sharded, and the parameters are freed (0 elements) until
    // forward() gathers them. ValueError also for no unit, a unit without forward or name, a name with a dot or
    // used twice, a parameter in two units, a stochastic unit with recompute.
    ZeroOptimizer(std::vector<ZeroUnit> units, ProcessGroup group, const AdamOptions& options = {.weight_decay = 0.01},
                  ZeroOptions zero = {.stage = 3});
    ~ZeroOptimizer();
    ZeroOptimizer(const ZeroOptimizer&) = delete;
    ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

    // Stage 3: runs the units in order on `input` (one recorded node per unit, see above). Every rank must run
    // the same units in the same order in forward and backward (each gather and reduce-scatter is a collective).
    // ValueError for stages 1 and 2, or when a parameter was added, removed or frozen after wrapping.
    Var forward(const Var& input);
    // Stage 3: the full parameters, all-gathered (a collective: every rank calls it), by name in module() order;
    // the model itself stays sharded. Stages 1 and 2: the model's own parameters.
    std::vector<std::pair<std::string, Tensor>> full_parameters();
    // The wrapped model: the Module given, or for stage 3 the units' modules under their names.
    const Module& module() const { return module_; }

    // graph.backward(loss) then reduce_gradients(); with ZeroOptions::overlap, DDP's overlapped backward, then
    // this rank's shard taken from the averaged gradients.
    void backward(ComputeGraph& graph, const Var& loss);
    // Averages the model's gradients across ranks into this rank's gradient shards (stage 1: all_reduce, the
    // model keeps the averages; stage 2: reduce_scatter, the model's gradients are dropped; stage 3: the units'
    // backward nodes reduce-scattered already, this gives zeros to a unit the backward did not reach). Call once per
    // step after the backward (backward() does). Gradient accumulation: several backward() calls before a step
    // add up their averaged gradients (stage 2 adds to the shard, stage 1 to the model's averaged gradients), as
    // DDP without no_sync. ValueError when the module gained or lost a parameter since construction ("added
    // after wrapping"); DTypeError / ShapeError for a gradient that does not match its parameter.
    void reduce_gradients();
    // Scales the gradient shards (and, in stage 1, the model's gradients) by min(1, max_norm / (norm + eps)),
    // norm being the norm_type-norm of the whole averaged gradient: Σ|g|^p over each shard, all-reduced (one
    // f64 sum), as clip_grad_norm over the full gradient would compute it. Returns that norm (0-d f64 on the
    // parameters' device; no host synchronisation on a GPU). ValueError: infinite norm_type (needs a max
    // all-reduce, not built), negative max_norm, or no reduce_gradients() since the last step.
    Tensor clip_grad_norm(double max_norm, double norm_type = 2.0, double eps = 1e-6);
    // AdamW on this rank's shards, then every rank's updated shard all-gathered into the model's parameters.
    // ValueError without reduce_gradients() since the last step.
    void step();
    // With a loss scaler (the loss was scaler.scale(loss)): the shards are unscaled and checked for inf/NaN,
    // the verdict summed over the ranks (so every rank skips the same steps), then the gated step and the
    // all_gather; call scaler.update() after, as with an ordinary optimizer. unscale() first for clipping:
    // unscale(scaler); clip_grad_norm(1.0); step(scaler). In stage 1 only the shards are unscaled (the model's
    // full gradients outside this rank's shard keep the scale).
    void unscale(GradScaler& scaler);
    void step(GradScaler& scaler);
    // Drops the model's gradients and the gradient shards.
    void zero_grad();

    // The AdamW over this rank's shards (lr, schedules, step_count, state_tensors: shard-sized).
    Optimizer& optimizer();
    const Optimizer& optimizer() const;
    const ProcessGroup& group() const { return group_; }
    int stage() const { return zero_.stage; }
    ZeroMemory memory() const;
    // This rank's shards: per dtype, "<dtype>.param", "<dtype>.exp_avg", "<dtype>.exp_avg_sq" (S elements each,
    // padding included; the moments only after the first step). The tests gather them.
    std::vector<std::pair<std::string, Tensor>> shards() const;
    // Per dtype: (dtype name, Ψ_d unpadded, S shard elements).
    struct FlatInfo {
        DType dtype;
        std::int64_t numel;
        std::int64_t shard;
    };
    std::vector<FlatInfo> flats() const;

    // Writes `folder`/model.safetensors (rank 0) and `folder`/zero-rank<r>-of-<W>.safetensors (every rank), each
    // through a temporary file renamed into place, then a barrier: when it returns on any rank, every file is
    // complete. IoError when a file cannot be written.
    void save_checkpoint(const std::filesystem::path& folder) const;
    // Restores the model, the moments, step counts and settings from a folder save_checkpoint wrote, with any
    // world size (resharded). Checks first, changes nothing on error: IoError for a missing folder or rank file
    // (naming it) or files of several world sizes; ValueError for a checkpoint of another model (other
    // trainable parameter names, shapes or dtypes) or of a ZeRO stage's optimizer of another kind.
    void load_checkpoint(const std::filesystem::path& folder);

    struct State;  // internal (distributed/zero.cpp)

private:
    void check_module_unchanged(const char* call) const;
    void check_and_broadcast(const char* who);
    void gather_parameters();

    Module module_;
    ProcessGroup group_;
    ZeroOptions zero_;
    std::unique_ptr<State> state_;
};

}  // namespace dyngrad::dist
