// Recurrent layers on the GPU through cuDNN's RNN API (cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8: the only RNN API left in cuDNN 9). CPU reference: ops/rnn.cpp.
//
// Per configuration (cell, sizes, dtype, device, TF32 setting) one plan holds the RNN descriptor (with
// a dropout descriptor of probability 0: no dropout between layers), the x/y sequence descriptors, the
// h/c tensor descriptor and the weight-, work- and reserve-space sizes: no device memory (DeviceSeqLengths
// says why). It is built on the first call, after checking that cuDNN's weight space is exactly the
// canonical layout of ops/rnn.h: the flat weight tensor is then cuDNN's weight space, with no copy. Later
// calls look the plan up and run; workspaces and the device array of sequence lengths come from the
// device's pool per call; no device sync.
//
// Every sequence of a batch has the full length T, so the packed sequence-major layout
// (CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, no padded I/O) is exactly our (T,N,·) tensors.
//
// While gradients are recorded (OpAttrs::save_for_backward, which ops/rnn.cpp sets from grad_enabled())
// the forward runs in training mode and keeps cuDNN's reserve space in the node's saved tensors;
// otherwise it runs in inference mode. cuDNN documents the reserve space as an input and output of
// cudnnRNNBackwardData_v8, so a second backward over the same node (BackwardOptions::retain_graph) first
// rebuilds it with a training forward.
//
// Precision: float32 at full precision (CUDNN_FMA_MATH) unless cuda::allow_tf32(); float64 with
// CUDNN_DEFAULT_MATH. cuDNN reports a cell/dtype combination it does not implement as
// CUDNN_STATUS_NOT_SUPPORTED, which becomes a DeviceError naming the configuration.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/cudnn_plans.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/rnn.h"

namespace dyngrad::cuda {

namespace {

using RnnDescriptor = CudnnDescriptor<cudnnRNNDescriptor_t, cudnnCreateRNNDescriptor, cudnnDestroyRNNDescriptor>;
using RnnDataDescriptor =
    CudnnDescriptor<cudnnRNNDataDescriptor_t, cudnnCreateRNNDataDescriptor, cudnnDestroyRNNDataDescriptor>;
using DropoutDescriptor =
    CudnnDescriptor<cudnnDropoutDescriptor_t, cudnnCreateDropoutDescriptor, cudnnDestroyDropoutDescriptor>;

struct RnnKey {
    RnnMode mode;
    std::int64_t steps, batch, input, hidden, layers;
    bool bidirectional;
    DType dtype;
    int device;
    bool tf32;
    auto operator<=>(const RnnKey&) const = default;
};

struct RnnPlan {
    DropoutDescriptor dropout;
    RnnDescriptor rnn;
    RnnDataDescriptor x, y;
    TensorDescriptor state;  // h and c: (L·D, N, H)
    std::size_t weight_bytes = 0;
    std::size_t inference_workspace = 0, training_workspace = 0, reserve_bytes = 0;
    int steps = 0, batch = 0;
    std::int64_t output_elements = 0, state_elements = 0;
};

__global__ void fill_int_kernel(std::int32_t* out, std::int64_t n, std::int32_t value) {
    for (std::int64_t i = thread_index(); i < n; i += thread_count())
        out[i] = value;
}

// The device array of sequence lengths (N int32 values, all T) that every cuDNN RNN call takes and reads
// asynchronously: a Workspace per op call, filled and freed in stream order like the call's other scratch.
// Not kept in the plan: plans live in a cache leaked on purpose (cuda/plan_cache.h), so a buffer there was
// never returned (compute-sanitizer's leak check reported one per configuration at exit), and one built
// inside a captured step would have come from that step's capture pool.
class DeviceSeqLengths {
public:
    DeviceSeqLengths(DeviceContext& ctx, const RnnPlan& plan)
        : buffer_(ctx, static_cast<std::size_t>(plan.batch) * sizeof(std::int32_t)) {
        fill_int_kernel<<<1, 256, 0, ctx.stream>>>(static_cast<std::int32_t*>(buffer_.data()), plan.batch,
                                                   plan.steps);
        DG_CUDA_CHECK_LAUNCH();
    }
    const std::int32_t* data() const { return static_cast<const std::int32_t*>(buffer_.data()); }

private:
    Workspace buffer_;
};

RnnKey rnn_key(const Tensor& x, const OpAttrs& attrs) {
    return {attrs.rnn_mode,  x.size(0),          x.size(1), x.size(2), attrs.hidden_size, attrs.num_layers,
            attrs.bidirectional, x.dtype(), x.device().index, x.dtype() == DType::f32 && allow_tf32()};
}

std::string describe_key(const RnnKey& key) {
    return str(rnn_mode_name(key.mode), " (", dtype_name(key.dtype), ", input ", key.input, ", hidden ", key.hidden,
               ", ", key.layers, " layer(s), ", key.bidirectional ? "bidirectional" : "unidirectional", ")");
}

cudnnRNNMode_t cudnn_cell(RnnMode mode) {
    switch (mode) {
        case RnnMode::Lstm: return CUDNN_LSTM;
        case RnnMode::Gru: return CUDNN_GRU;
        case RnnMode::RnnTanh: return CUDNN_RNN_TANH;
        case RnnMode::RnnRelu: return CUDNN_RNN_RELU;
    }
    throw ValueError(str("rnn: unknown mode ", static_cast<int>(mode)));
}

// A descriptor-setup or size query: NOT_SUPPORTED means cuDNN lacks this configuration.
void check_supported(cudnnStatus_t status, const char* expr, const RnnKey& key, const char* file, int line) {
    if (status == CUDNN_STATUS_NOT_SUPPORTED)
        throw DeviceError(str("rnn: cuDNN does not support ", describe_key(key), " on cuda:", key.device, " (", expr,
                              ": ", cudnnGetErrorString(status), "); run it on the CPU"));
    if (status != CUDNN_STATUS_SUCCESS) throw_cudnn_error(status, expr, file, line);
}
#define DG_RNN_SUPPORTED(expr, key) check_supported((expr), #expr, (key), __FILE__, __LINE__)

// Element count and shape of a cuDNN tensor descriptor returned by cudnnGetRNNWeightParams.
Shape descriptor_dims(cudnnTensorDescriptor_t desc) {
    cudnnDataType_t type{};
    int rank = 0;
    int dims[8] = {}, strides[8] = {};
    DG_CUDNN_CHECK(cudnnGetTensorNdDescriptor(desc, 8, &type, &rank, dims, strides));
    return Shape(dims, dims + rank);
}

// Every (pseudo-layer, linLayerID) matrix and bias of cuDNN's weight space must sit where ops/rnn.h's
// layout puts it, with its size; `w` is the caller's weight (cuDNN only computes addresses from it).
void check_weight_layout(DeviceContext& ctx, const RnnPlan& plan, const RnnKey& key, const Tensor& w) {
    const RnnOptions options{key.hidden, key.layers, key.bidirectional};
    const std::vector<RnnWeightEntry> layout = rnn_weight_layout(key.mode, options, key.input);
    const std::size_t element = dtype_size(key.dtype);
    const auto expected_bytes = static_cast<std::size_t>(rnn_weight_size(key.mode, options, key.input)) * element;
    if (plan.weight_bytes != expected_bytes)
        throw Error(str("rnn: cuDNN's weight space for ", describe_key(key), " has ", plan.weight_bytes,
                        " bytes; the canonical layout of ops/rnn.h has ", expected_bytes));
    const std::int64_t pseudo_layers = key.layers * (key.bidirectional ? 2 : 1);
    const std::int64_t gates = static_cast<std::int64_t>(layout.size()) / (4 * pseudo_layers);
    const auto* base = static_cast<const unsigned char*>(w.raw_data());
    TensorDescriptor matrix_desc, bias_desc;
    const auto check = [&](const RnnWeightEntry& entry, const void* address, cudnnTensorDescriptor_t desc) {
        if (address == nullptr)
            throw Error(str("rnn: cuDNN reports no ", entry.name, " for ", describe_key(key)));
        const Shape dims = descriptor_dims(desc);
        const std::int64_t offset =
            (static_cast<const unsigned char*>(address) - base) / static_cast<std::int64_t>(element);
        if (offset != entry.offset || numel(dims) != numel(entry.shape))
            throw Error(str("rnn: cuDNN places ", entry.name, " of ", describe_key(key), " at element ", offset,
                            " with dims ", to_string(dims), "; the canonical layout of ops/rnn.h has it at ",
                            entry.offset, " with shape ", to_string(entry.shape)));
    };
    // layout: the 2G matrices of each pseudo-layer in turn, then the 2G biases of each.
    for (std::int64_t p = 0; p < pseudo_layers; ++p) {
        for (std::int64_t id = 0; id < 2 * gates; ++id) {
            void* matrix = nullptr;
            void* bias = nullptr;
            DG_CUDNN_CHECK(cudnnGetRNNWeightParams(ctx.cudnn, plan.rnn.get(), static_cast<std::int32_t>(p),
                                                   plan.weight_bytes, w.raw_data(), static_cast<std::int32_t>(id),
                                                   matrix_desc.get(), &matrix, bias_desc.get(), &bias));
            check(layout[static_cast<std::size_t>(p * 2 * gates + id)], matrix, matrix_desc.get());
            check(layout[static_cast<std::size_t>((pseudo_layers + p) * 2 * gates + id)], bias, bias_desc.get());
        }
    }
}

std::shared_ptr<RnnPlan> make_plan(DeviceContext& ctx, const RnnKey& key, const Tensor& w) {
    constexpr const char* what = "rnn";
    auto plan = std::make_shared<RnnPlan>();
    const cudnnDataType_t type = cudnn_dtype(key.dtype, what);
    const cudnnMathType_t math =
        key.dtype == DType::f32 && !key.tf32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
    const std::int64_t dirs = key.bidirectional ? 2 : 1;
    const int steps = cudnn_dim(key.steps, what), batch = cudnn_dim(key.batch, what);
    const int hidden = cudnn_dim(key.hidden, what);

    // No dropout between layers: probability 0 needs no random-state buffer.
    DG_CUDNN_CHECK(cudnnSetDropoutDescriptor(plan->dropout.get(), ctx.cudnn, 0.0f, nullptr, 0, 0));
    DG_RNN_SUPPORTED(cudnnSetRNNDescriptor_v8(plan->rnn.get(), CUDNN_RNN_ALGO_STANDARD, cudnn_cell(key.mode),
                                              CUDNN_RNN_DOUBLE_BIAS,
                                              key.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
                                              CUDNN_LINEAR_INPUT, type, type, math, cudnn_dim(key.input, what), hidden,
                                              hidden, cudnn_dim(key.layers, what), plan->dropout.get(),
                                              CUDNN_RNN_PADDED_IO_DISABLED),
                     key);
    const std::vector<int> lengths(static_cast<std::size_t>(batch), steps);
    DG_CUDNN_CHECK(cudnnSetRNNDataDescriptor(plan->x.get(), type, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, steps, batch,
                                             cudnn_dim(key.input, what), lengths.data(), nullptr));
    DG_CUDNN_CHECK(cudnnSetRNNDataDescriptor(plan->y.get(), type, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, steps, batch,
                                             cudnn_dim(dirs * key.hidden, what), lengths.data(), nullptr));
    const int state_dims[3] = {cudnn_dim(key.layers * dirs, what), batch, hidden};
    const int state_strides[3] = {batch * hidden, hidden, 1};
    DG_CUDNN_CHECK(cudnnSetTensorNdDescriptor(plan->state.get(), type, 3, state_dims, state_strides));

    DG_RNN_SUPPORTED(cudnnGetRNNWeightSpaceSize(ctx.cudnn, plan->rnn.get(), &plan->weight_bytes), key);
    check_weight_layout(ctx, *plan, key, w);
    std::size_t inference_reserve = 0;
    DG_RNN_SUPPORTED(cudnnGetRNNTempSpaceSizes(ctx.cudnn, plan->rnn.get(), CUDNN_FWD_MODE_INFERENCE, plan->x.get(),
                                               &plan->inference_workspace, &inference_reserve),
                     key);
    DG_RNN_SUPPORTED(cudnnGetRNNTempSpaceSizes(ctx.cudnn, plan->rnn.get(), CUDNN_FWD_MODE_TRAINING, plan->x.get(),
                                               &plan->training_workspace, &plan->reserve_bytes),
                     key);

    plan->steps = steps;
    plan->batch = batch;
    plan->output_elements = key.steps * key.batch * dirs * key.hidden;
    plan->state_elements = key.layers * dirs * key.batch * key.hidden;
    return plan;
}

// The plan for this call's configuration, built on first use.
std::shared_ptr<RnnPlan> plan_for(DeviceContext& ctx, const Tensor& x, const Tensor& w, const OpAttrs& attrs) {
    const RnnKey key = rnn_key(x, attrs);
    return plan_cache<RnnKey, RnnPlan>().get(key, [&] { return make_plan(ctx, key, w); });
}

// Element `offset` of a tensor's storage, as a device address (nullptr for an undefined tensor).
void* at(const Tensor& t, std::int64_t offset = 0) {
    if (!t.defined()) return nullptr;
    return static_cast<unsigned char*>(t.raw_data()) + static_cast<std::size_t>(offset) * dtype_size(t.dtype());
}

struct RnnBuffers {
    const Tensor& x;
    const Tensor& w;
    Tensor h0, c0;  // undefined when left out: cuDNN reads zeros
};

RnnBuffers buffers_of(std::span<const Tensor> inputs) {
    return {inputs[0], inputs[1], inputs.size() > 2 ? inputs[2] : Tensor(), inputs.size() > 3 ? inputs[3] : Tensor()};
}

// One cudnnRNNForward into `out` (packed [y | h_n | c_n]).
void run_forward(DeviceContext& ctx, const RnnPlan& plan, cudnnForwardMode_t mode, const RnnBuffers& in,
                 bool lstm, void* out, void* reserve) {
    const std::size_t element = dtype_size(in.x.dtype());
    auto* y = static_cast<unsigned char*>(out);
    unsigned char* h_n = y + static_cast<std::size_t>(plan.output_elements) * element;
    unsigned char* c_n = lstm ? h_n + static_cast<std::size_t>(plan.state_elements) * element : nullptr;
    const std::size_t workspace_bytes =
        mode == CUDNN_FWD_MODE_TRAINING ? plan.training_workspace : plan.inference_workspace;
    const DeviceSeqLengths seq_lengths(ctx, plan);
    Workspace workspace(ctx, workspace_bytes);
    DG_CUDNN_CHECK(cudnnRNNForward(ctx.cudnn, plan.rnn.get(), mode, seq_lengths.data(), plan.x.get(),
                                   in.x.raw_data(), plan.y.get(), y, plan.state.get(), at(in.h0), h_n,
                                   plan.state.get(), at(in.c0), c_n, plan.weight_bytes, in.w.raw_data(),
                                   workspace.bytes(), workspace.data(),
                                   mode == CUDNN_FWD_MODE_TRAINING ? plan.reserve_bytes : 0, reserve));
}

// saved[0]: the reserve space (int64 elements as raw bytes); saved[1]: a host counter of the backwards run.
Tensor reserve_tensor(const RnnPlan& plan, Device device) {
    const auto words = static_cast<std::int64_t>((plan.reserve_bytes + 7) / 8);
    return Tensor::empty({words}, DType::i64, device);
}

}  // namespace

// x (T,N,I)  w (flat, cuDNN's weight space)  h0, c0 (L·D,N,H) -> [y (T,N,D·H) | h_n | c_n]
Tensor rnn_forward(const ForwardArgs& args) {
    const RnnBuffers in = buffers_of(args.inputs);
    DeviceContext& ctx = context_for(in.x);
    const std::shared_ptr<RnnPlan> plan = plan_for(ctx, in.x, in.w, args.attrs);
    Tensor out = Tensor::empty(args.out.shape, args.out.dtype, in.x.device());
    const bool lstm = args.attrs.rnn_mode == RnnMode::Lstm;
    if (!args.attrs.save_for_backward) {
        run_forward(ctx, *plan, CUDNN_FWD_MODE_INFERENCE, in, lstm, out.raw_data(), nullptr);
        return out;
    }
    Tensor reserve = reserve_tensor(*plan, in.x.device());
    run_forward(ctx, *plan, CUDNN_FWD_MODE_TRAINING, in, lstm, out.raw_data(), reserve.raw_data());
    args.saved.push_back(std::move(reserve));
    args.saved.push_back(Tensor::zeros({1}, DType::i64));
    return out;
}

// d[y | h_n | c_n] -> dx, dh0, dc0 by cudnnRNNBackwardData_v8, then dw by cudnnRNNBackwardWeights_v8
// (which adds into its output: dw starts at zero). Backward data always runs: backward weights reads
// what it leaves in the reserve space.
std::vector<Tensor> rnn_backward(const BackwardArgs& args) {
    const RnnBuffers in = buffers_of(args.inputs);
    DeviceContext& ctx = context_for(in.x);
    const std::shared_ptr<RnnPlan> plan = plan_for(ctx, in.x, in.w, args.attrs);
    const bool lstm = args.attrs.rnn_mode == RnnMode::Lstm;
    if (args.saved.size() != 2)
        throw GraphError("rnn backward: the forward ran without gradient recording (no cuDNN reserve space)");
    std::int64_t& backwards_run = *args.saved[1].data<std::int64_t>();
    Tensor reserve = args.saved[0];
    if (backwards_run++ > 0) {  // a retained graph: rebuild the reserve space the last backward consumed
        reserve = reserve_tensor(*plan, in.x.device());
        Workspace scratch_out(ctx, args.output.nbytes());
        run_forward(ctx, *plan, CUDNN_FWD_MODE_TRAINING, in, lstm, scratch_out.data(), reserve.raw_data());
    }

    const Tensor& dout = args.grad_output;
    std::vector<Tensor> grads(args.inputs.size());
    for (std::size_t i = 0; i < grads.size(); ++i)
        if (args.needs_grad[i]) grads[i] = Tensor::empty(args.inputs[i].shape(), in.x.dtype(), in.x.device());
    // dx is computed even when x needs no gradient.
    const Tensor dx = grads[0].defined() ? grads[0] : Tensor::empty(in.x.shape(), in.x.dtype(), in.x.device());
    const Tensor dh0 = grads.size() > 2 ? grads[2] : Tensor();
    const Tensor dc0 = grads.size() > 3 ? grads[3] : Tensor();
    const DeviceSeqLengths seq_lengths(ctx, *plan);
    Workspace workspace(ctx, plan->training_workspace);
    DG_CUDNN_CHECK(cudnnRNNBackwardData_v8(
        ctx.cudnn, plan->rnn.get(), seq_lengths.data(), plan->y.get(), args.output.raw_data(), at(dout),
        plan->x.get(), dx.raw_data(), plan->state.get(), at(in.h0), at(dout, plan->output_elements), at(dh0),
        plan->state.get(), at(in.c0), lstm ? at(dout, plan->output_elements + plan->state_elements) : nullptr,
        at(dc0), plan->weight_bytes, in.w.raw_data(), workspace.bytes(), workspace.data(), plan->reserve_bytes,
        reserve.raw_data()));
    if (grads[1].defined()) {
        DG_CUDA_CHECK(cudaMemsetAsync(grads[1].raw_data(), 0, grads[1].nbytes(), ctx.stream));
        DG_CUDNN_CHECK(cudnnRNNBackwardWeights_v8(
            ctx.cudnn, plan->rnn.get(), CUDNN_WGRAD_MODE_ADD, seq_lengths.data(), plan->x.get(), in.x.raw_data(),
            plan->state.get(), at(in.h0), plan->y.get(), args.output.raw_data(), plan->weight_bytes,
            grads[1].raw_data(), workspace.bytes(), workspace.data(), plan->reserve_bytes, reserve.raw_data()));
    }
    return grads;
}

}  // namespace dyngrad::cuda
