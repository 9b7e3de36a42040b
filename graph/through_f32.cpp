#include "dyngrad/graph/through_f32.h"

#include <cstring>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/graph/backend.h"

namespace dyngrad::detail {

namespace {

Tensor widened(const Tensor& t, DType reduced) {
    return t.defined() && t.dtype() == reduced ? t.to(DType::f32) : t;
}

std::vector<Tensor> widened(std::span<const Tensor> tensors, DType reduced) {
    std::vector<Tensor> out;
    out.reserve(tensors.size());
    for (const Tensor& t : tensors) out.push_back(widened(t, reduced));
    return out;
}

bool through_f32(const BackendKernels& kernels, std::optional<DType> reduced) {
    return reduced.has_value() && !kernels.native_reduced;
}

}  // namespace

std::optional<DType> reduced_input_dtype(std::span<const Tensor> inputs) {
    std::optional<DType> reduced;
    std::size_t reduced_index = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i)
        if (inputs[i].defined() && is_reduced_precision(inputs[i].dtype()) && !reduced) {
            reduced = inputs[i].dtype();
            reduced_index = i;
        }
    if (!reduced) return reduced;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const DType dtype = inputs[i].defined() ? inputs[i].dtype() : *reduced;
        if (is_floating(dtype) && dtype != *reduced)
            throw DTypeError(str("inputs mix ", dtype_name(*reduced), " (input ", reduced_index, ") and ",
                                 dtype_name(dtype), " (input ", i, "); an op takes one floating dtype: convert one ",
                                 "with to_dtype() (autocast does so for the ops it covers)"));
    }
    return reduced;
}

Tensor run_forward_kernel(const OpDef& def, const BackendKernels& kernels, const ForwardArgs& args) {
    const std::optional<DType> reduced = reduced_input_dtype(args.inputs);
    if (!through_f32(kernels, reduced)) return kernels.forward(args);
    const std::vector<Tensor> inputs = widened(args.inputs, *reduced);
    OutputSpec spec = args.out;
    if (spec.dtype == *reduced) spec.dtype = DType::f32;
    Tensor out = kernels.forward(ForwardArgs{args.op, inputs, args.attrs, spec, args.saved});
    // A forward that updates an input in place (OpDef::updates_inputs) updated the f32 copy: write it back,
    // rounded, as raw bytes without a version bump, exactly as the f32 kernel writes an f32 input.
    for (std::size_t i = 0; i < inputs.size() && i < 32; ++i) {
        if (!(def.updates_inputs >> i & 1u) || args.inputs[i].dtype() != *reduced) continue;
        const Tensor rounded = inputs[i].to(*reduced);
        const Tensor& target = args.inputs[i];
        if (target.device().is_cpu())
            std::memcpy(target.raw_data(), rounded.raw_data(), target.nbytes());
        else
            device_memory::copy(target.raw_data(), target.device(), rounded.raw_data(), rounded.device(),
                                target.nbytes());
    }
    return out.defined() && args.out.dtype == *reduced && out.dtype() == DType::f32 ? out.to(*reduced) : out;
}

std::vector<Tensor> run_backward_kernel(const BackendKernels& kernels, const BackwardArgs& args) {
    // The gradients a backward reads, with their pending writes (a weight gradient some earlier backward left to
    // a backend's side work, core/device_memory.h) visible to it: the consumer waits, only for what it reads.
    device_memory::await_writes(args.grad_output);
    for (const Tensor& g : args.grads_so_far) device_memory::await_writes(g);
    const std::optional<DType> reduced = reduced_input_dtype(args.inputs);
    if (!through_f32(kernels, reduced)) return kernels.backward(args);
    const std::vector<Tensor> inputs = widened(args.inputs, *reduced);
    const Tensor output = widened(args.output, *reduced);
    const Tensor grad_output = widened(args.grad_output, *reduced);
    std::vector<Tensor> grads =
        kernels.backward(BackwardArgs{args.op, inputs, output, grad_output, args.attrs, args.saved, args.needs_grad});
    // The narrowing below reads the gradients: their pending writes first.
    for (const Tensor& g : grads) device_memory::await_writes(g);
    for (std::size_t i = 0; i < grads.size() && i < args.inputs.size(); ++i) {
        Tensor& g = grads[i];
        const Tensor& in = args.inputs[i];
        if (!g.defined() || in.dtype() != *reduced || g.dtype() != DType::f32) continue;
        // Sum a broadcast gradient in f32, then round once. A shape that does not broadcast is left to the
        // engine's check, which names the op.
        if (g.shape() != in.shape()) {
            try {
                g = sum_to(g, in.shape());
            } catch (const ShapeError&) {
                continue;
            }
        }
        g = g.to(*reduced);
    }
    return grads;
}

}  // namespace dyngrad::detail
