// The engine's reverse sweep (ComputeGraph::sweep, graph/graph.h) and the version check it makes before each
// node's backward. Recording and the rest of backward(): graph/graph.cpp.
#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/graph/anomaly.h"
#include "dyngrad/graph/autocast.h"
#include "dyngrad/graph/backend.h"
#include "dyngrad/graph/engine_helpers.h"
#include "dyngrad/graph/fusion_check.h"
#include "dyngrad/graph/fusion_replay.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/profiling.h"
#include "dyngrad/graph/through_f32.h"

namespace dyngrad {

// Throws GraphError when the storage behind something node `id`'s backward reads was written in place since
// the node was recorded (Storage::version): the backward would mix the forward's values with newer ones.
void ComputeGraph::check_versions(NodeId id, std::span<const Tensor> input_values) const {
    const ComputeNode& n = *nodes_[id];
    const auto fail = [&](const std::string& what, std::uint32_t then, std::uint32_t now) {
        throw GraphError(str(what, " was modified in place after ", describe_node(id), " recorded it (storage ",
                             "version ", then, " then, ", now, " now), and this backward needs the value the forward ",
                             "used. An in-place write (an optimizer step(), copy_from(), fill(), set(), ",
                             "load_parameters()) ran between the forward and its backward: run backward() first, ",
                             "or record the forward again"));
    };
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        const Tensor& value = input_values[i];
        if (!value.defined() || value.version() == n.inputs[i].version) continue;
        const ComputeNode& in = *nodes_[n.inputs[i].id];
        fail(in.parameter.defined()  // a Parameter's name is what the user knows it by
                 ? str("parameter '", in.parameter.name(), "' (input ", i, ", ", describe_node(n.inputs[i].id), ")")
                 : str("input ", i, " (", describe_node(n.inputs[i].id), ")"),
             n.inputs[i].version, value.version());
    }
    if (n.value.defined() && n.value.version() != n.value_version)
        fail(str("the output of ", describe_node(id)), n.value_version, n.value.version());
    for (std::size_t i = 0; i < n.saved_versions.size(); ++i)
        if (n.saved[i].version() != n.saved_versions[i])
            fail(str("saved tensor ", i), n.saved_versions[i], n.saved[i].version());
}

namespace {

// Batched parameter-gradient casts (graph/autocast.h): the held 16-bit gradients converted once they pass this many
// bytes (their leaves waiting until then), or sooner when a backward reports each parameter's readiness.
constexpr std::size_t kCastBatchBytes = std::size_t{64} << 20;
constexpr std::size_t kReportedCastBatchBytes = std::size_t{4} << 20;

// A gradient the engine reads (adds into, reduces, inspects) or hands to a callback, with its pending writes made
// visible first (device_memory::await_writes): a backward may leave a weight gradient to a backend's side work,
// which the sweep waits for only where it reads that gradient, so the work overlaps the rest of the sweep. The
// backward kernels get theirs through run_backward_kernel (graph/through_f32.cpp), which awaits them itself.
const Tensor& ready(const Tensor& gradient) {
    device_memory::await_writes(gradient);
    return gradient;
}

// slot += g. An undefined slot takes g unread, so a pending g stays pending.
void add_gradient(Tensor& slot, Tensor g) {
    if (slot.defined()) {
        ready(slot);
        ready(g);
    }
    accumulate_into(slot, std::move(g));
}

}  // namespace

// The reverse sweep over the marked nodes, from the seeded root. With `fused` (graph/fusion_replay.h), each
// backward chain's members are skipped and the chain's generated kernel gives their external inputs' gradients
// when the sweep reaches its run_before; a chain that cannot run then (an incoming gradient missing or unlike the
// plan's) runs its members' unfused backward there instead, which is as correct (every outside reader is done).
void ComputeGraph::sweep(NodeId root, Tensor seed, std::span<const char> needed, const BackwardOptions& options,
                         fusion::BackwardFusion* fused) {
    if (anomaly_mode_enabled() && !tensor_stats(seed).all_finite())
        throw NumericalError(str("anomaly mode: the gradient seeding the backward of ", describe_node(root),
                                 " holds NaN/Inf", detail::stats_of("gradient", seed)));
    // A seed someone else holds (backward's kept unit seed, a caller's grad_output) must not become a leaf's
    // gradient, which its owner may write (fill, an optimizer's in-place clip): such a leaf gets a copy.
    const void* shared_seed = seed.numel() > 0 && !seed.owns_storage_exclusively() ? seed.raw_data() : nullptr;
    accumulate_into(nodes_[root]->grad, std::move(seed));

    std::vector<Tensor> input_values;
    std::vector<Tensor> grads_so_far;
    std::vector<char> added_in_place;
    std::vector<char> needs_grad_storage;
    // What a visited node leaves behind: its gradient, saved tensors and value, as the options say.
    const auto release = [&](NodeId id) {
        ComputeNode& n = *nodes_[id];
        if (!options.retain_grads) n.grad = Tensor();
        if (!options.retain_graph) {
            n.saved.clear();
            n.saved_versions.clear();
        }
        if (options.free_values && !options.retain_graph && id != root) n.value = Tensor();
    };
    // Batched parameter-gradient casts (graph/autocast.h): a parameter cast's backward waits in `pending_casts`, and
    // a leaf reached while a cast of it (or a leaf of its parameter before it) waits, in `waiting_leaves`; both until
    // the held gradients pass `flush_bytes` or the sweep ends, so each leaf still takes every gradient before its
    // visit, and leaves are visited in the order the sweep reached them.
    const bool batch_casts = batched_gradient_casts() && !anomaly_mode_enabled() && !fusion_check_enabled();
    // With a readiness callback (data parallel's all-reduce starts as gradients are done) the batches stay small.
    const std::size_t flush_bytes = options.on_parameter_ready ? kReportedCastBatchBytes : kCastBatchBytes;
    std::vector<NodeId> pending_casts;
    std::size_t pending_bytes = 0;
    std::vector<int> pending_of(batch_casts ? std::size_t{root} + 1 : 0, 0);  // per leaf: its casts waiting
    std::vector<NodeId> waiting_leaves;
    const auto waits_for_batch = [&](NodeId id) {
        const ComputeNode& n = *nodes_[id];
        if (n.op != OpType::Cast || n.inputs.size() != 1) return false;
        const ComputeNode& leaf = *nodes_[n.inputs[0].id];
        const Tensor& g = n.grad;
        return leaf.op == OpType::Leaf && leaf.parameter.defined() && leaf.value.defined() &&
               g.shape() == leaf.value.shape() && g.device() == leaf.value.device() && g.dtype() == n.value.dtype() &&
               is_floating(g.dtype()) && is_floating(leaf.value.dtype());
    };
    const auto leaf_must_wait = [&](NodeId id) {
        if (pending_of[id] > 0) return true;
        const ComputeNode& leaf = *nodes_[id];
        if (!leaf.parameter.defined()) return false;
        for (NodeId w : waiting_leaves)
            if (nodes_[w]->parameter.identity() == leaf.parameter.identity()) return true;
        return false;
    };
    const auto convert_pending = [&] {
        if (pending_casts.empty()) return;
        try {
            std::vector<Tensor> converted;
            std::vector<device_memory::ConvertRange> ranges;
            for (NodeId id : pending_casts) {
                const ComputeNode& n = *nodes_[id];
                const Tensor& leaf_value = nodes_[n.inputs[0].id]->value;
                const Tensor& g = ready(n.grad);
                if (!g.device().is_cuda()) {
                    converted.push_back(g.to(leaf_value.dtype()));
                    continue;
                }
                converted.push_back(Tensor::empty(g.shape(), leaf_value.dtype(), g.device()));
            }
            // One launch per run of casts with the same device and dtypes (in a model, all of them).
            for (std::size_t first = 0; first < pending_casts.size();) {
                const Tensor& head = nodes_[pending_casts[first]]->grad;
                std::size_t last = first;
                ranges.clear();
                for (; last < pending_casts.size(); ++last) {
                    const Tensor& g = nodes_[pending_casts[last]]->grad;
                    if (!g.device().is_cuda() || g.device() != head.device() || g.dtype() != head.dtype() ||
                        converted[last].dtype() != converted[first].dtype())
                        break;
                    ranges.push_back({converted[last].raw_data(), g.raw_data(), g.numel()});
                }
                if (ranges.empty()) {
                    ++first;
                    continue;
                }
                device_memory::convert_ranges(ranges, converted[first].dtype(), head.dtype(), head.device().index);
                first = last;
            }
            detail::count_batched_gradient_casts(static_cast<std::int64_t>(pending_casts.size()));
            for (std::size_t i = 0; i < pending_casts.size(); ++i) {
                const NodeId leaf = nodes_[pending_casts[i]]->inputs[0].id;
                add_gradient(nodes_[leaf]->grad, std::move(converted[i]));
                pending_of[leaf] = 0;
                release(pending_casts[i]);
            }
        } catch (...) {
            detail::rethrow_op_failure(str("the batched backward of ", pending_casts.size(), " parameter casts, ",
                                           describe_node(pending_casts.front()), " first"),
                                       op_def(OpType::Cast), "backward");
        }
        pending_casts.clear();
        pending_bytes = 0;
    };

    const auto visit = [&](NodeId id) {
        ComputeNode& n = *nodes_[id];
        if (!needed[id]) return;
        if (batch_casts && n.op == OpType::Leaf && leaf_must_wait(id)) {
            waiting_leaves.push_back(id);
            return;
        }
        if (!n.grad.defined()) return;
        if (batch_casts && waits_for_batch(id)) {
            const NodeId leaf = n.inputs[0].id;
            check_versions(id, std::span<const Tensor>(&nodes_[leaf]->value, 1));
            pending_casts.push_back(id);
            ++pending_of[leaf];
            pending_bytes += n.grad.nbytes();
            return;
        }
        if (n.op == OpType::Leaf) {
            if (shared_seed != nullptr && n.grad.raw_data() == shared_seed) n.grad = n.grad.clone();
            if (n.parameter.defined()) {
                add_gradient(n.parameter.grad_slot(), n.grad);
            }
            if (needed[id] == 2) {
                ready(n.grad);  // the callback may read it on another stream (distributed/: the all-reduce)
                options.on_parameter_ready(n.parameter);
            }
            return;
        }
        const OpDef& def = op_def(n.op, n.attrs);
        input_values.clear();
        needs_grad_storage.assign(n.inputs.size(), 0);
        for (std::size_t i = 0; i < n.inputs.size(); ++i) {
            input_values.push_back(nodes_[n.inputs[i]]->value);
            needs_grad_storage[i] = needed[n.inputs[i]] != 0;  // 2 marks a parameter leaf: read as a bool, it must be 1
        }
        std::vector<Tensor> grads;
        try {
            check_versions(id, input_values);
            const BackendKernels& k = detail::kernels_for(def, n.value.device());
            if (!k.backward) throw DeviceError(str("no backward kernel on ", n.value.device().to_string()));
            const std::span<const bool> needs_grad(reinterpret_cast<const bool*>(needs_grad_storage.data()),
                                                   needs_grad_storage.size());
            // The gradients so far that the backward may add into in place: only those no other handle shares
            // (the fused-backward check compares fresh gradients, so it gets none).
            grads_so_far.clear();
            if (k.accumulates_in_place && !fusion_check_enabled())
                for (std::size_t i = 0; i < n.inputs.size(); ++i) {
                    const Tensor& slot = nodes_[n.inputs[i]]->grad;
                    const bool writable = needs_grad_storage[i] && slot.defined() && slot.owns_storage_exclusively();
                    grads_so_far.push_back(writable ? slot : Tensor());
                }
            {
                const ProfilingRange range(ProfilingRange::Pass::Backward, def.name, id);
                grads = detail::run_backward_kernel(k, BackwardArgs{n.op, input_values, n.value, n.grad, n.attrs,
                                                                    n.saved, needs_grad, grads_so_far});
            }
            if (fusion_check_enabled() && grads.size() == n.inputs.size()) {
                for (const Tensor& g : grads) ready(g);
                detail::check_fused_backward(def, n.op, input_values, n.attrs, n.grad, grads, needs_grad);
            }
            if (grads.size() != n.inputs.size())
                throw GraphError(str("backward returned ", grads.size(), " gradients for ", n.inputs.size(), " inputs"));
            // A backward that added its gradient into a slot in place returned the slot's own storage. The copies
            // handed to it go first, so the slots are owned alone again for the accumulations below.
            added_in_place.assign(n.inputs.size(), 0);
            for (std::size_t i = 0; i < grads_so_far.size(); ++i)
                added_in_place[i] = grads_so_far[i].defined() && grads[i].defined() &&
                                    grads[i].raw_data() == grads_so_far[i].raw_data();
            grads_so_far.clear();
            for (std::size_t i = 0; i < n.inputs.size(); ++i) {
                if (!needs_grad_storage[i]) continue;
                Tensor& g = grads[i];
                const Tensor& in = input_values[i];
                if (!g.defined()) throw GraphError(str("backward returned no gradient for input ", i));
                if (g.dtype() != in.dtype() || g.device() != in.device())
                    throw GraphError(str("gradient ", describe(g), " for input ", i, " does not match the input ",
                                         describe(in)));
                // Broadcast gradients are reduced here, once, for every op and backend.
                if (g.shape() != in.shape()) {
                    try {
                        g = sum_to(ready(g), in.shape());
                    } catch (const ShapeError&) {
                        throw ShapeError(str(detail::op_label(def), ": its backward returned a gradient of shape ",
                                             to_string(g.shape()), " for input ", i, " of shape ",
                                             to_string(in.shape()), "; a gradient must have its input's shape ",
                                             "(or one the input broadcasts to, which the engine sums back)"));
                    }
                }
                if (anomaly_mode_enabled() && !tensor_stats(ready(g)).all_finite())
                    throw NumericalError(str("anomaly mode: the gradient for input ", i, " (",
                                             describe_node(n.inputs[i]), ") holds NaN/Inf",
                                             detail::stats_of("gradient", g),
                                             detail::stats_of("output gradient", n.grad),
                                             detail::stats_of("output", n.value),
                                             detail::stats_of_inputs(input_values)));
                if (!added_in_place[i]) add_gradient(nodes_[n.inputs[i]]->grad, std::move(g));
            }
        } catch (...) {
            detail::rethrow_op_failure(str("backward of ", describe_node(id), " with inputs ",
                                           detail::describe_inputs(input_values), " and output gradient ",
                                           describe(n.grad)),
                                       def, "backward");
        }
        release(id);
    };

    // The held casts converted, then the leaves that waited for them, in the order the sweep reached them.
    const auto visit_after_conversion = [&] {
        convert_pending();
        const std::vector<NodeId> leaves = std::exchange(waiting_leaves, {});
        for (NodeId leaf : leaves) visit(leaf);
    };

    // The chains to run, by the node id they run before, and the members they stand for.
    std::vector<int> chain_of(fused != nullptr ? std::size_t{root} + 1 : 0, -1);
    std::vector<std::vector<std::size_t>> chains_at(chain_of.size());
    if (fused != nullptr)
        for (std::size_t c = 0; c < fused->chains.size(); ++c) {
            const fusion::BackwardLaunch& launch = fused->chains[c].launch;
            if (fused->chains[c].dropped || launch.run_before > root) continue;
            bool usable = true;
            for (NodeId m : launch.members) usable = usable && m <= root && chain_of[m] < 0;
            if (!usable) continue;
            for (NodeId m : launch.members) chain_of[m] = static_cast<int>(c);
            chains_at[launch.run_before].push_back(c);
        }
    // Chains that run at one node give their gradients in the order their members' unfused backward would (newest
    // member first: members are in reverse creation order), so that a sum over several of them, into an input
    // they share, adds its terms as the unfused sweep does.
    for (std::vector<std::size_t>& at : chains_at)
        std::stable_sort(at.begin(), at.end(), [&](std::size_t a, std::size_t b) {
            return fused->chains[a].launch.members.front() > fused->chains[b].launch.members.front();
        });
    const auto run_chain = [&](fusion::CompiledBackward& chain) {
        const fusion::BackwardLaunch& launch = chain.launch;
        std::vector<Tensor> inputs;
        for (NodeId id : chain.saved) inputs.push_back(nodes_[id]->value);
        bool runnable = true;
        for (NodeId m : chain.gradients_in) {
            const Tensor& g = nodes_[m]->grad;
            const Tensor& value = nodes_[m]->value;
            runnable = runnable && g.defined() && value.defined() && g.shape() == value.shape() &&
                       g.dtype() == value.dtype() && g.device() == value.device();
            inputs.push_back(g.defined() ? ready(g) : g);
        }
        for (const Tensor& value : inputs) runnable = runnable && value.defined();
        if (!runnable) {  // the unfused backward of the members, newest first, is what the chain stands for
            for (NodeId m : launch.members) visit(m);
            return;
        }
        for (NodeId m : launch.members) {  // an in-place write since the forward fails as it would unfused
            std::vector<Tensor> values;
            for (const NodeInput& input : nodes_[m]->inputs) values.push_back(nodes_[input.id]->value);
            check_versions(m, values);
        }
        const Device device = nodes_[launch.members.front()]->value.device();
        // The comparison reads the gradients on the host: never inside a capture (a warm-up whose sweep took no
        // chains, under retain_grads, leaves it to the next eager pass).
        const bool check = fused->check && !cuda::capturing(device.index);
        std::vector<Tensor> outputs;
        for (std::size_t k = 0; k < chain.store_dtypes.size(); ++k)
            outputs.push_back(Tensor::empty(chain.store_shapes[k], chain.store_dtypes[k], device));
        fusion::launch_compiled_backward(chain, inputs, outputs);
        fusion::detail::count_backward_chain_run();
        std::vector<Tensor> results;  // per chain.results, reduced to its input's shape
        std::vector<double> magnitudes;  // the check's bound on a reduced sum's terms
        for (const fusion::CompiledBackward::Result& r : chain.results) {
            Tensor g = r.store >= 0 ? outputs[static_cast<std::size_t>(r.store)]
                                    : inputs[chain.saved.size() + static_cast<std::size_t>(r.gradient_in)];
            const Shape& shape = nodes_[r.input]->value.shape();
            double magnitude = 0.0;
            if (check && r.magnitude_store >= 0) {  // a row sum made in the kernel: its terms' magnitudes, summed
                const TensorStats stats = tensor_stats(ready(outputs[static_cast<std::size_t>(r.magnitude_store)]));
                magnitude = std::isfinite(stats.max) ? stats.max : 0.0;
            }
            if (g.shape() != shape) {
                if (check) {
                    const TensorStats stats = tensor_stats(ready(g));
                    magnitude = std::max(std::abs(stats.min), std::abs(stats.max)) *
                                static_cast<double>(g.numel()) / static_cast<double>(std::max<std::int64_t>(1, numel(shape)));
                    if (!std::isfinite(magnitude)) magnitude = 0.0;  // the comparison's own bound then
                }
                g = sum_to(ready(g), shape);
            }
            results.push_back(std::move(g));
            magnitudes.push_back(magnitude);
        }
        if (check) {
            // DYNGRAD_CHECK_FUSIONS=1: the members' unfused backward into emptied slots, compared with the chain's.
            std::vector<Tensor> earlier;
            for (const fusion::CompiledBackward::Result& r : chain.results)
                earlier.push_back(std::move(nodes_[r.input]->grad));
            for (NodeId m : launch.members) visit(m);
            std::string mismatch;
            for (std::size_t j = 0; j < chain.results.size(); ++j) {
                const fusion::CompiledBackward::Result& r = chain.results[j];
                Tensor unfused = std::move(nodes_[r.input]->grad);
                if (mismatch.empty() && unfused.defined())
                    // A row program's gradients come through its rows' sums, added in the kernel's own order.
                    mismatch = fusion::backward_mismatch(
                        ready(results[j]), ready(unfused),
                        !launch.program && (r.contributions == 1 || results[j].shape() == chain.shape), magnitudes[j]);
                if (mismatch.empty() && !unfused.defined()) mismatch = "the unfused backward gave no gradient";
                if (!mismatch.empty()) mismatch = str("the gradient of ", describe_node(r.input), ": ", mismatch);
                nodes_[r.input]->grad = std::move(earlier[j]);
                if (unfused.defined()) add_gradient(nodes_[r.input]->grad, std::move(unfused));
            }
            if (!mismatch.empty()) {
                chain.dropped = true;
                fusion::detail::backward_chain_dropped(str("the backward of ", describe_node(launch.members.back()),
                                                           " .. ", describe_node(launch.members.front()), ": ",
                                                           mismatch, "; its members run their unfused backward"));
            }
            return;
        }
        for (std::size_t j = 0; j < chain.results.size(); ++j)
            add_gradient(nodes_[chain.results[j].input]->grad, std::move(results[j]));
        for (NodeId m : launch.members) release(m);
    };

    for (NodeId id = root + 1; id-- > 0;) {
        if (fused != nullptr) {
            for (std::size_t c : chains_at[id]) run_chain(fused->chains[c]);
            if (chain_of[id] >= 0) continue;  // its chain runs (or ran) in its place
        }
        visit(id);
        if (batch_casts && pending_bytes > flush_bytes) visit_after_conversion();
    }
    if (batch_casts) visit_after_conversion();
    if (fused != nullptr && !(nodes_[root]->value.device().is_cuda() && cuda::capturing(nodes_[root]->value.device().index)))
        fused->check = false;  // compared once, in an eager pass
}

}  // namespace dyngrad
