// Building blocks for models: seeded weight initialisation, Modules (parameters, buffers, train/eval
// mode, device moves) and the standard layers, plus saving and loading a model's tensors.
// Implemented in nn/layers.cpp on top of the op functions; layers have no kernels of their own.
//
// Modules are handles, like Tensor and Parameter: a copy shares the parameters, buffers and mode of
// the original, so a layer can be a member of a model struct, be registered with it, and be copied
// into a Sequential without ever going stale. A layer adds its parameters to the graph of its input:
//
//   struct Mlp : Module {
//       Linear fc1, fc2;
//       explicit Mlp(Generator& gen) : fc1(784, 128, true, gen), fc2(128, 10, true, gen) {
//           register_module("fc1", fc1);  // parameters become "fc1.weight", "fc1.bias", ...
//           register_module("fc2", fc2);
//       }
//       Var operator()(const Var& x) const { return fc2(relu(fc1(x))); }
//   };
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dyngrad/core/safetensors.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/ops/conv.h"
#include "dyngrad/ops/dropout.h"
#include "dyngrad/ops/norm.h"

namespace dyngrad {

// ---- initialisation: fresh tensors drawn from an explicit, seeded Generator ----

// Fan-in and fan-out of a weight: (out, in) -> (in, out); (K, C, R, S) -> (C·R·S, K·R·S); in general
// dims 0 and 1 times the product of the rest. ShapeError for ranks below 2.
struct Fans {
    std::int64_t in = 0;
    std::int64_t out = 0;
};
Fans compute_fans(const Shape& shape);

// Gain of the ReLU family (He et al. 2015); use 1 for linear / tanh-free layers.
inline constexpr double kReluGain = 1.4142135623730951;  // √2

// He: uniform(±gain·√(3 / fan_in)), normal(0, gain / √fan_in) — variance gain² / fan_in.
Tensor kaiming_uniform(const Shape& shape, Generator& gen, double gain = kReluGain, DType dtype = DType::f32,
                       Device device = Device::cpu());
Tensor kaiming_normal(const Shape& shape, Generator& gen, double gain = kReluGain, DType dtype = DType::f32,
                      Device device = Device::cpu());
// Glorot: uniform(±gain·√(6 / (fan_in + fan_out))), normal(0, gain·√(2 / (fan_in + fan_out))).
Tensor xavier_uniform(const Shape& shape, Generator& gen, double gain = 1.0, DType dtype = DType::f32,
                      Device device = Device::cpu());
Tensor xavier_normal(const Shape& shape, Generator& gen, double gain = 1.0, DType dtype = DType::f32,
                     Device device = Device::cpu());
// (Zeros: Tensor::zeros.)

// The gain of kaiming init for a leaky ReLU of negative slope a: √(2 / (1 + a²)) (a = 0: kReluGain).
double leaky_relu_gain(double negative_slope);

// How Linear and Conv2d initialise their weight and bias (drawn from the Generator in that order).
enum class Init {
    // PyTorch's default (torch.nn.Linear / Conv2d reset_parameters): weight kaiming_uniform with
    // a = √5, i.e. uniform(±1/√fan_in), and bias uniform(±1/√fan_in).
    Torch,
    // dyngrad's default before PyTorch's: weight kaiming_uniform with the ReLU gain, uniform(±√(6/fan_in)),
    // and bias zeros. Steeper; the training records up to this change were measured with it.
    KaimingRelu,
};

// ---- Module: the registry every layer and model derives from ----

class Module {
public:
    Module();

    // Registers a trainable tensor under `name` (no dots) and returns its Parameter handle; the
    // Parameter's name() is the dotted path from the outermost module it is registered in.
    Parameter register_parameter(const std::string& name, Tensor value);
    // Registers an existing Parameter handle (it keeps its value, gradient and identity, shared with its other
    // copies) and names it as above: a Module over parameters owned elsewhere, e.g. a Python model's for
    // dist::DistributedDataParallel. ValueError for an undefined parameter.
    Parameter register_parameter(const std::string& name, Parameter parameter);
    // Registers non-trainable state that is saved and moved with the parameters (batch-norm running
    // statistics). The returned cell stays valid across to(): the module replaces the Tensor inside it.
    std::shared_ptr<Tensor> register_buffer(const std::string& name, Tensor value);
    // Registers a child: its parameters and buffers join this module's under "name." and train()/eval()
    // and to() reach it. Register a child after it has registered its own tensors (constructors do).
    // ValueError for a duplicate name or a cycle.
    void register_module(const std::string& name, const Module& child);

    // Depth-first in registration order: own tensors first, then each child's. Stable across calls.
    // A module registered in several places (shared weights) is listed once, at its first place.
    std::vector<Parameter> parameters() const;
    // The same, with each parameter's dotted path from this module (name() is the path from the
    // outermost module: they differ for a submodule).
    std::vector<std::pair<std::string, Parameter>> named_parameters() const;
    // (dotted path from this module, tensor handle sharing the buffer's storage), in the same order.
    std::vector<std::pair<std::string, Tensor>> buffers() const;

    // Mode of this module and every module registered under it (dropout, batch norm); default training.
    void train(bool training = true);
    void eval() { train(false); }
    bool is_training() const;

    // Moves (or converts) every parameter and buffer; parameters' gradients are dropped.
    void to(Device device);
    void to(DType dtype);
    // Drops every parameter's gradient.
    void zero_grad();

    struct State;  // internal (nn/layers.cpp): the registry all copies share

private:
    std::shared_ptr<State> state_;
};

// ---- layers: call them like functions, layer(x); `where` is the caller's line in error messages ----

// y = activation(x · weightᵀ + bias).  x (N,in), weight (out,in), bias (out) -> y (N,out).
// weight and bias: PyTorch's init, uniform(±1/√in) (Init::Torch); Init::KaimingRelu for the earlier scheme. An activation is fused into the linear node (see
// linear, ops/linalg.h); in a Sequential, leave the index of the activation layer it replaces unused
// (Sequential::skip_index) to keep the names of the layers after it.
class Linear : public Module {
public:
    Linear() = default;  // no parameters: a placeholder (GPT's LM head when tied to the token embedding)
    Linear(std::int64_t in_features, std::int64_t out_features, bool bias, Generator& gen,
           Activation activation = Activation::None, Init init = Init::Torch);
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;

    Parameter weight;
    Parameter bias;  // undefined without bias
    Activation activation = Activation::None;
};

// x (N,C,H,W), weight (K, C/groups, R, S), bias (K) -> y (N,K,P,Q); see conv2d (ops/conv.h).
// weight and bias: PyTorch's init, uniform(±1/√fan_in) with fan_in = C/groups·R·S (Init::Torch); Init::KaimingRelu
// for the earlier scheme. options.activation fuses an activation into the conv2d
// node ({.activation = Activation::Relu}); in a Sequential, skip_index() after it keeps the names of later
// layers as they are with a separate activation layer.
class Conv2d : public Module {
public:
    Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::array<std::int64_t, 2> kernel,
           Conv2dOptions options, bool bias, Generator& gen, Init init = Init::Torch);
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;

    Parameter weight;
    Parameter bias;  // undefined without bias
    Conv2dOptions options;
};

// Batch normalisation over (N,C) or (N,C,H,W) inputs; see batch_norm (ops/norm.h).
// Parameters "weight" (gamma, ones) and "bias" (beta, zeros); buffers "running_mean" (zeros) and
// "running_var" (ones), updated in training mode and used in eval mode.
class BatchNorm : public Module {
public:
    explicit BatchNorm(std::int64_t channels, double momentum = 0.1, double eps = 1e-5);
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;

    Parameter weight;
    Parameter bias;
    std::shared_ptr<Tensor> running_mean;
    std::shared_ptr<Tensor> running_var;
    double momentum;
    double eps;
};

// Layer normalisation over the trailing normalized_shape dims of its input; see layer_norm (ops/norm.h).
// PyTorch's nn.LayerNorm: with elementwise_affine, parameter "weight" (ones) and, with bias, "bias" (zeros),
// both of normalized_shape.
class LayerNorm : public Module {
public:
    explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;

    Parameter weight;  // undefined without elementwise_affine
    Parameter bias;    // undefined without elementwise_affine or bias
    Shape normalized_shape;
    double eps;
};

// RMS normalisation over the trailing normalized_shape dims; see rms_norm (ops/norm.h). PyTorch's nn.RMSNorm:
// with elementwise_affine, parameter "weight" (ones); eps absent: the machine epsilon of the input's dtype.
class RMSNorm : public Module {
public:
    explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt, bool elementwise_affine = true);
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;

    Parameter weight;  // undefined without elementwise_affine
    Shape normalized_shape;
    std::optional<double> eps;
};

// gelu (ops/elementwise.h) as a layer, for Sequential; no parameters.
class GELU : public Module {
public:
    explicit GELU(GeluApproximation approximation = GeluApproximation::None) : approximation(approximation) {}
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;

    GeluApproximation approximation;
};

// silu (ops/elementwise.h) as a layer, for Sequential; no parameters.
class SiLU : public Module {
public:
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;
};

// Dropout with drop probability p in training mode, the identity in eval mode or at p = 0 (x itself is
// returned: no node recorded, no seed drawn). Each call in training mode with p > 0 draws a fresh mask seed from (seed, number of earlier calls) through DropoutSeeds (ops/dropout.h),
// whose counter lives on x's device: runs repeat exactly, and a captured step draws fresh masks on every
// replay (the masks the same eager calls draw). Copies share the call counter.
class Dropout : public Module {
public:
    Dropout(double p, std::uint64_t seed);
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;
    // The seed stream (its counter() belongs to a captured step's guard state).
    DropoutSeeds& seeds() const { return *seeds_; }

    double p;

private:
    std::shared_ptr<DropoutSeeds> seeds_;
};

// indices (any shape, int64 in [0, num_embeddings)) -> (indices..., embedding_dim): rows of `weight`
// (embedding, ops/indexing.h). weight (num_embeddings, embedding_dim) ~ normal(0, 1), PyTorch's default;
// the padding_idx row (negative counts from num_embeddings) starts at zero and gets no gradient.
class Embedding : public Module {
public:
    Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Generator& gen,
              std::optional<std::int64_t> padding_idx = std::nullopt);
    Var operator()(const Var& indices, std::source_location where = std::source_location::current()) const;

    Parameter weight;
    std::optional<std::int64_t> padding_idx;  // in [0, num_embeddings) when set
};

// Applies its layers in order. add() takes a Module (registered under its index, "0", "1", ...) or any
// callable Var(const Var&) such as [](const Var& x) { return relu(x); }. Copies share the layer list.
class Sequential : public Module {
public:
    template <typename Layer>
    Sequential& add(Layer layer);
    // Leaves the next index unused, for an activation fused into the layer before it
    // (Linear(..., Activation::Relu) in place of Linear then ReLU): the layers after it keep the names
    // they have with the separate activation, as PyTorch's nn.Sequential numbers them ("0", "2", ...).
    Sequential& skip_index();
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;
    std::size_t size() const { return layers_->calls.size(); }  // layers added (skipped indices not counted)

private:
    using LayerFn = std::function<Var(const Var&, std::source_location)>;
    struct Layers {
        std::vector<LayerFn> calls;
        std::size_t next_index = 0;  // layers added plus indices skipped
    };
    std::shared_ptr<Layers> layers_ = std::make_shared<Layers>();
};

template <typename Layer>
Sequential& Sequential::add(Layer layer) {
    if constexpr (std::is_base_of_v<Module, Layer>) register_module(std::to_string(layers_->next_index), layer);
    if constexpr (std::is_invocable_r_v<Var, Layer&, const Var&, std::source_location>) {
        layers_->calls.push_back(
            [layer](const Var& x, std::source_location where) mutable { return layer(x, where); });
    } else {
        static_assert(std::is_invocable_r_v<Var, Layer&, const Var&>, "Sequential::add: needs Var(const Var&)");
        layers_->calls.push_back([layer](const Var& x, std::source_location) mutable { return layer(x); });
    }
    ++layers_->next_index;
    return *this;
}

// ---- saving and loading (the safetensors format, core/safetensors.h) ----

// A module's parameters and buffers under their dotted paths from that module (named_parameters(),
// buffers()), or a list of parameters under their names (which must be unique and non-empty).
// Tensors are copied to the CPU for writing.
void save_parameters(const Module& module, const std::filesystem::path& path);
void save_parameters(const std::vector<Parameter>& parameters, const std::filesystem::path& path);
// Copies the file's tensors into the existing ones, in place (their device; converted to their dtype).
// The file must hold exactly the expected names (IoError otherwise) with matching shapes (ShapeError
// naming the tensor). Everything is checked before anything is written: on error nothing has changed.
// Entries whose name starts with '@' (a checkpoint's optimizer and schedule state, nn/optim.h) are not
// the model's: loading ignores them, and no module or parameter name may start with '@'.
void load_parameters(Module& module, const std::filesystem::path& path);
void load_parameters(const std::vector<Parameter>& parameters, const std::filesystem::path& path);
// The same from tensors already read (a checkpoint's); `source` names them in messages.
void load_parameters(Module& module, const TensorMap& tensors, const std::string& source);
// A module's parameters and buffers under their dotted paths: what save_parameters writes.
TensorMap named_tensors(const Module& module);

}  // namespace dyngrad
