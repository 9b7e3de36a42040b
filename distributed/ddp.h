// Data-parallel training of an nn::Module over a ProcessGroup (distributed/process_group.h): every rank holds the
// whole model, runs its own part of the batch, and the gradients are averaged across ranks before the step.
//
//   auto group = dist::ProcessGroup::init();
//   Sequential model = make_model(...); model.to(group.device());
//   dist::DistributedDataParallel ddp(model, group);       // checks the ranks agree, broadcasts rank 0's weights
//   for each batch (this rank's shard, DataLoaderOptions::shard / num_shards):
//       ComputeGraph graph;
//       ddp.backward(graph, loss(model(graph.input(x)), ...));   // all-reduces start during the backward
//       optimizer.step(); optimizer.zero_grad();
//
// How the all-reduce overlaps the backward: the trainable parameters are grouped into buckets in reverse
// registration order (≈ the order the backward finishes their gradients), the first bucket small
// (first_bucket_cap_mb, so communication starts early), the others up to bucket_cap_mb, one dtype and device per
// bucket. The engine calls back when a parameter's gradient is final (BackwardOptions::on_parameter_ready); its
// gradient is copied into its bucket's flat buffer, and a bucket whose last gradient has arrived is all-reduced at
// once — on a communication stream of its own (NCCL), or as a non-blocking MPI_Iallreduce (CPU) — while the sweep
// goes on. Buckets are launched in bucket order on every rank (a collective order the ranks agree on). When the
// backward returns, the buckets not yet launched are launched, dyngrad's stream waits for each bucket's all-reduce
// (an event: the host does not wait) and the averaged values are copied back into the parameters' gradients.
// No host synchronisation anywhere on the GPU path, so it runs inside a cuda::CapturedStep.
//
// Unused parameters: a trainable parameter the backward did not reach on this rank contributes its current
// gradient (zeros when it has none) to the average. After the sync every trainable parameter of the model has a
// gradient (zeros when no rank used it), like PyTorch DDP's bucket views.
// Gradient accumulation: inside `auto guard = ddp.no_sync();` backward() only accumulates locally; the first
// backward after the guard is gone averages the accumulated gradients.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/distributed/process_group.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/nn/layers.h"

namespace dyngrad::dist {

struct DDPOptions {
    double bucket_cap_mb = 25;        // MiB per bucket
    double first_bucket_cap_mb = 1;   // the first bucket (the last layers' gradients) is smaller
    // false: launch every bucket after the backward (what overlap buys is the difference, dyngrad-dist-bench).
    bool overlap = true;
    // As PyTorch's gradient_as_bucket_view: after a synchronised backward each gradient is a view into its bucket
    // (no copy back, no second buffer). The bucket is rewritten by the next synchronised backward, so a gradient
    // kept from an earlier step changes under its holder: off by default, as in PyTorch.
    bool gradient_as_bucket_view = false;
    // Opt-in gradient compression, as PyTorch DDP's bf16_compress_hook / fp16_compress_hook: each bucket is
    // converted to this 16-bit dtype (bf16 or f16), averaged across ranks in it (NCCL's average; on the CPU MPI
    // sums the values already divided by the world size, in float rounded back per pair) and converted back into
    // the f32 gradients. Half the bytes on the wire, for one 16-bit rounding of each rank's gradient and of the
    // result (f16 can overflow on gradients above 65504·W; bf16 keeps f32's range). float32 parameters only
    // (DTypeError for another bucket dtype); std::nullopt (the default): full precision. What it costs the
    // loss: docs/distributed.md.
    std::optional<DType> compression = std::nullopt;
    // Opt-in check: step() recomputes the global batch (every rank's inputs, gathered) on this device alone and
    // compares its gradients with the averaged ones; NumericalError names the first parameter off by more than
    // `check_tolerance` (relative L2; 0: 1e-5 for f32, 1e-10 for f64; with compression 2e-2 for bf16, 3e-3 for
    // f16). Needs a loss that is a mean over the batch, equal batch sizes on every rank, and a model without batch
    // statistics (BatchNorm in training mode normalises per rank). Costs a forward and backward of the whole global batch per step: for debugging.
    bool check_gradients = false;
    double check_tolerance = 0;
};

// Bookkeeping of the last backward that synchronised (the tests and the benchmark read it).
struct DDPStats {
    std::int64_t backward_calls = 0;      // all, no_sync ones included
    std::int64_t synchronised_calls = 0;
    // Of the last synchronised backward:
    std::vector<std::string> ready_order;        // parameter names, in the order the engine finished them
    std::vector<std::size_t> launch_order;       // bucket indices, in launch order
    std::int64_t buckets_launched_during_backward = 0;
    std::int64_t buckets_launched_after_backward = 0;
    std::int64_t unused_parameters = 0;          // trainable parameters the backward did not reach on this rank
};

struct GradientCheckResult {
    double worst_relative_error = 0;
    std::string worst_parameter;
};

class DistributedDataParallel {
public:
    // Checks that every rank's model has the same parameter names, shapes and dtypes (a hash of them, all-gathered;
    // on a mismatch every rank throws — ShapeError, DTypeError or ValueError — naming the first differing parameter
    // and what each rank has), then broadcasts rank 0's parameters and buffers. ValueError for a model without
    // trainable parameters or bad options.
    DistributedDataParallel(const Module& module, ProcessGroup group, DDPOptions options = {});
    ~DistributedDataParallel();
    DistributedDataParallel(const DistributedDataParallel&) = delete;
    DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

    const Module& module() const { return module_; }
    const ProcessGroup& group() const { return group_; }
    const DDPOptions& options() const { return options_; }

    // graph.backward(loss, options) with the gradients averaged across ranks (see the top of this file). A
    // readiness callback already in `options` is called too, before the bucket's. ValueError when called from
    // such a callback, during its own backward (the buckets of the running one would be reset).
    void backward(ComputeGraph& graph, const Var& loss, BackwardOptions options = {});

    // The step's forward and backward over this rank's batch: loss_fn records the loss of `batch` (a mean over
    // its samples) in the graph it is given. With options.check_gradients, checks the averaged gradients
    // (check_gradients below). Returns the loss value.
    using LossFn = std::function<Var(ComputeGraph& graph, std::span<const Tensor> batch)>;
    Tensor forward_backward(std::span<const Tensor> batch, const LossFn& loss_fn);
    // Recomputes the gradients of the global batch (every rank's `batch`, all-gathered along dim 0) on this rank
    // alone and compares them with the parameters' current gradients (which it leaves as they are). Call it
    // right after a synchronised backward: ValueError, before anything is sent, when there was none or the
    // last backward ran inside no_sync() (the gradients are not averaged). Throws NumericalError when a
    // parameter is off by more than the tolerance; returns the worst error otherwise.
    GradientCheckResult check_gradients(std::span<const Tensor> batch, const LossFn& loss_fn);

    // While alive, backward() does not communicate (gradient accumulation). Nestable.
    class NoSync {
    public:
        explicit NoSync(DistributedDataParallel& ddp) : ddp_(&ddp), previous_(ddp.no_sync_) { ddp.no_sync_ = true; }
        ~NoSync() {
            if (ddp_) ddp_->no_sync_ = previous_;
        }
        NoSync(NoSync&& other) noexcept : ddp_(other.ddp_), previous_(other.previous_) { other.ddp_ = nullptr; }
        NoSync(const NoSync&) = delete;
        NoSync& operator=(const NoSync&) = delete;
        NoSync& operator=(NoSync&&) = delete;

    private:
        DistributedDataParallel* ddp_;
        bool previous_;
    };
    [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

    // DDPOptions::compression after construction (Python's register_comm_hook): the same checks (ValueError,
    // DTypeError), the 16-bit buffers made or dropped; ValueError during this DDP's own backward.
    void set_compression(std::optional<DType> compression);

    // The buckets' parameter names, bucket by bucket, in launch order.
    std::vector<std::vector<std::string>> buckets() const;
    const DDPStats& stats() const { return stats_; }

    struct State;  // internal (distributed/ddp.cpp)

private:
    void on_ready(const Parameter& p);
    void launch_ready_buckets();
    void launch(std::size_t bucket);
    void finish();

    Module module_;
    ProcessGroup group_;
    DDPOptions options_;
    bool no_sync_ = false;
    bool in_backward_ = false;
    bool synchronised_ = false;  // the last backward averaged the gradients (what check_gradients checks)
    DDPStats stats_;
    std::unique_ptr<State> state_;
};

}  // namespace dyngrad::dist
