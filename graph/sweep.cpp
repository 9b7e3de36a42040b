// The engine's reverse sweep (ComputeGraph::sweep, graph/graph.h) and the version check it makes before each
// node's backward. Recording and the rest of backward(): graph/graph.cpp.
#include <span>
#include <string>
#include <vector>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/graph/anomaly.h"
#include "dyngrad/graph/backend.h"
#include "dyngrad/graph/engine_helpers.h"
#include "dyngrad/graph/fusion_check.h"
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

// The reverse sweep over the marked nodes, from the seeded root.
void ComputeGraph::sweep(NodeId root, Tensor seed, std::span<const char> needed, const BackwardOptions& options) {
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
    for (NodeId id = root + 1; id-- > 0;) {
        ComputeNode& n = *nodes_[id];
        if (!needed[id] || !n.grad.defined()) continue;
        if (n.op == OpType::Leaf) {
            if (shared_seed != nullptr && n.grad.raw_data() == shared_seed) n.grad = n.grad.clone();
            if (n.parameter.defined()) {
                add_gradient(n.parameter.grad_slot(), n.grad);
            }
            if (needed[id] == 2) {
                ready(n.grad);  // the callback may read it on another stream (distributed/: the all-reduce)
                options.on_parameter_ready(n.parameter);
            }
            continue;
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
        if (!options.retain_grads) n.grad = Tensor();
        if (!options.retain_graph) {
            n.saved.clear();
            n.saved_versions.clear();
        }
        if (options.free_values && !options.retain_graph && id != root) n.value = Tensor();
    }
}

}  // namespace dyngrad
