// Initialisation, Modules, layers and model save/load (nn/layers.h). Layers only compose op functions.
#include "dyngrad/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dyngrad/core/checked.h"
#include "dyngrad/core/safetensors.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/indexing.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/linalg.h"
#include "dyngrad/ops/norm.h"

namespace dyngrad {

Fans compute_fans(const Shape& shape) {
    if (shape.size() < 2)
        throw ShapeError(str("fans need a weight of rank 2 or more, got shape ", to_string(shape)));
    // The shape is a requested weight's, not yet a tensor's: its products are checked (core/checked.h).
    std::int64_t receptive = 1;
    for (std::size_t i = 2; i < shape.size(); ++i) receptive = checked_mul(receptive, shape[i], "fans: receptive field");
    return {checked_mul(shape[1], receptive, "fan_in"), checked_mul(shape[0], receptive, "fan_out")};
}

namespace {
// fan_in, or fan_in + fan_out, of `shape`; ValueError when it is 0 (an empty weight has no scale).
double fan_for(const char* what, const Shape& shape, bool both) {
    const Fans fans = compute_fans(shape);
    const std::int64_t fan = both ? checked_add(fans.in, fans.out, "fan_in + fan_out") : fans.in;
    if (fan <= 0) throw ValueError(str(what, ": shape ", to_string(shape), " has no fan-in"));
    return static_cast<double>(fan);
}
}  // namespace

Tensor kaiming_uniform(const Shape& shape, Generator& gen, double gain, DType dtype, Device device) {
    const double bound = gain * std::sqrt(3.0 / fan_for("kaiming_uniform", shape, false));
    return Tensor::uniform(shape, -bound, bound, gen, dtype, device);
}

Tensor kaiming_normal(const Shape& shape, Generator& gen, double gain, DType dtype, Device device) {
    const double stddev = gain / std::sqrt(fan_for("kaiming_normal", shape, false));
    return Tensor::normal(shape, 0.0, stddev, gen, dtype, device);
}

Tensor xavier_uniform(const Shape& shape, Generator& gen, double gain, DType dtype, Device device) {
    const double bound = gain * std::sqrt(6.0 / fan_for("xavier_uniform", shape, true));
    return Tensor::uniform(shape, -bound, bound, gen, dtype, device);
}

Tensor xavier_normal(const Shape& shape, Generator& gen, double gain, DType dtype, Device device) {
    const double stddev = gain * std::sqrt(2.0 / fan_for("xavier_normal", shape, true));
    return Tensor::normal(shape, 0.0, stddev, gen, dtype, device);
}

double leaky_relu_gain(double negative_slope) { return std::sqrt(2.0 / (1.0 + negative_slope * negative_slope)); }

namespace {
// The weight and (when `with_bias`) bias of a Linear or Conv2d, drawn in PyTorch's order: weight, then bias.
std::pair<Tensor, Tensor> layer_init(const Shape& weight_shape, bool with_bias, Generator& gen, Init init) {
    if (init != Init::Torch && init != Init::KaimingRelu)
        throw ValueError(str("layer init: ", static_cast<int>(init), " is not an Init (Torch or KaimingRelu)"));
    if (init == Init::KaimingRelu)
        return {kaiming_uniform(weight_shape, gen), with_bias ? Tensor::zeros({weight_shape[0]}) : Tensor()};
    Tensor weight = kaiming_uniform(weight_shape, gen, leaky_relu_gain(std::sqrt(5.0)));
    if (!with_bias) return {weight, Tensor()};
    const double bound = 1.0 / std::sqrt(fan_for("bias init", weight_shape, false));
    return {weight, Tensor::uniform({weight_shape[0]}, -bound, bound, gen)};
}
}  // namespace

struct Module::State {
    std::vector<std::pair<std::string, Parameter>> parameters;
    std::vector<std::pair<std::string, std::shared_ptr<Tensor>>> buffers;
    std::vector<std::pair<std::string, std::shared_ptr<State>>> children;
    bool training = true;
};

namespace {
using State = Module::State;

// Calls on_state(state), on_parameter(path, parameter) and on_buffer(path, cell) over the module tree,
// depth-first in registration order. A module registered in several places (shared weights) is
// visited once, under its first path.
template <typename OnState, typename OnParameter, typename OnBuffer>
void walk(State& root, OnState on_state, OnParameter on_parameter, OnBuffer on_buffer) {
    std::set<const State*> seen;
    const auto visit = [&](const auto& self, State& state, const std::string& prefix) -> void {
        if (!seen.insert(&state).second) return;
        on_state(state);
        for (auto& [name, parameter] : state.parameters) on_parameter(prefix + name, parameter);
        for (const auto& [name, cell] : state.buffers) on_buffer(prefix + name, cell);
        for (const auto& [name, child] : state.children) self(self, *child, prefix + name + ".");
    };
    visit(visit, root, "");
}

bool reaches(State& from, const State& target) {
    bool found = false;
    walk(from, [&](const State& s) { found = found || &s == &target; }, [](const std::string&, const Parameter&) {},
         [](const std::string&, const std::shared_ptr<Tensor>&) {});
    return found;
}

void check_new_name(const State& state, const std::string& name, const char* what) {
    if (name.empty() || name.find('.') != std::string::npos || name.starts_with('@'))
        throw ValueError(str(what, ": name '", name, "' must be non-empty, contain no '.' and not start with '@' ",
                             "(kept for a checkpoint's optimizer state)"));
    const auto taken = [&](const auto& entries) {
        return std::any_of(entries.begin(), entries.end(), [&](const auto& entry) { return entry.first == name; });
    };
    if (taken(state.parameters) || taken(state.buffers) || taken(state.children))
        throw ValueError(str(what, ": the module already has an entry named '", name, "'"));
}
}  // namespace

Module::Module() : state_(std::make_shared<State>()) {}

Parameter Module::register_parameter(const std::string& name, Tensor value) {
    check_new_name(*state_, name, "register_parameter");
    Parameter parameter(std::move(value), name);
    state_->parameters.emplace_back(name, parameter);
    return parameter;
}

Parameter Module::register_parameter(const std::string& name, Parameter parameter) {
    check_new_name(*state_, name, "register_parameter");
    if (!parameter.defined()) throw ValueError(str("register_parameter: '", name, "' is an undefined Parameter"));
    parameter.set_name(name);
    state_->parameters.emplace_back(name, parameter);
    return parameter;
}

std::shared_ptr<Tensor> Module::register_buffer(const std::string& name, Tensor value) {
    check_new_name(*state_, name, "register_buffer");
    if (!value.defined()) throw ValueError(str("register_buffer: '", name, "' is undefined"));
    auto cell = std::make_shared<Tensor>(std::move(value));
    state_->buffers.emplace_back(name, cell);
    return cell;
}

void Module::register_module(const std::string& name, const Module& child) {
    check_new_name(*state_, name, "register_module");
    if (reaches(*child.state_, *state_))
        throw ValueError(str("register_module: '", name, "' contains this module (a cycle)"));
    state_->children.emplace_back(name, child.state_);
    // Every parameter's name becomes its path from here; an outer registration renames again.
    walk(*state_, [](const State&) {}, [](const std::string& path, Parameter p) { p.set_name(path); },
         [](const std::string&, const std::shared_ptr<Tensor>&) {});
}

std::vector<Parameter> Module::parameters() const {
    std::vector<Parameter> out;
    walk(*state_, [](const State&) {}, [&](const std::string&, const Parameter& p) { out.push_back(p); },
         [](const std::string&, const std::shared_ptr<Tensor>&) {});
    return out;
}

std::vector<std::pair<std::string, Parameter>> Module::named_parameters() const {
    std::vector<std::pair<std::string, Parameter>> out;
    walk(*state_, [](const State&) {}, [&](const std::string& path, const Parameter& p) { out.emplace_back(path, p); },
         [](const std::string&, const std::shared_ptr<Tensor>&) {});
    return out;
}

std::vector<std::pair<std::string, Tensor>> Module::buffers() const {
    std::vector<std::pair<std::string, Tensor>> out;
    walk(*state_, [](const State&) {}, [](const std::string&, const Parameter&) {},
         [&](const std::string& path, const std::shared_ptr<Tensor>& cell) { out.emplace_back(path, *cell); });
    return out;
}

void Module::train(bool training) {
    walk(*state_, [&](State& s) { s.training = training; },
         [](const std::string&, const Parameter&) {}, [](const std::string&, const std::shared_ptr<Tensor>&) {});
}

bool Module::is_training() const { return state_->training; }

void Module::to(Device device) {
    walk(*state_, [](const State&) {},
         [&](const std::string&, Parameter p) {
             p.value() = p.value().to(device);
             p.zero_grad();
         },
         [&](const std::string&, const std::shared_ptr<Tensor>& cell) { *cell = cell->to(device); });
}

void Module::to(DType dtype) {
    if (!is_floating(dtype)) throw DTypeError(str("Module::to: parameters need float32 or float64, got ",
                                                  dtype_name(dtype)));
    walk(*state_, [](const State&) {},
         [&](const std::string&, Parameter p) {
             p.value() = p.value().to(dtype);
             p.zero_grad();
         },
         [&](const std::string&, const std::shared_ptr<Tensor>& cell) { *cell = cell->to(dtype); });
}

void Module::zero_grad() {
    walk(*state_, [](const State&) {}, [](const std::string&, Parameter p) { p.zero_grad(); },
         [](const std::string&, const std::shared_ptr<Tensor>&) {});
}

namespace {
void check_positive(const char* layer, const char* what, std::int64_t value) {
    if (value <= 0) throw ValueError(str(layer, ": ", what, " must be positive, got ", value));
}
}  // namespace

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias, Generator& gen,
               Activation fused_activation, Init init)
    : activation(fused_activation) {
    check_positive("Linear", "in_features", in_features);
    check_positive("Linear", "out_features", out_features);
    auto [w, b] = layer_init({out_features, in_features}, with_bias, gen, init);
    weight = register_parameter("weight", std::move(w));
    if (with_bias) bias = register_parameter("bias", std::move(b));
}

Var Linear::operator()(const Var& x, std::source_location where) const {
    ComputeGraph& graph = x.graph();
    const Var w = graph.parameter(weight, where);
    return linear(x, w, bias.defined() ? graph.parameter(bias, where) : Var(), activation, where);
}

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::array<std::int64_t, 2> kernel,
               Conv2dOptions conv_options, bool with_bias, Generator& gen, Init init)
    : options(conv_options) {
    check_positive("Conv2d", "in_channels", in_channels);
    check_positive("Conv2d", "out_channels", out_channels);
    check_positive("Conv2d", "kernel height", kernel[0]);
    check_positive("Conv2d", "kernel width", kernel[1]);
    check_positive("Conv2d", "groups", options.groups);
    if (in_channels % options.groups != 0 || out_channels % options.groups != 0)
        throw ValueError(str("Conv2d: ", in_channels, " input and ", out_channels,
                             " output channels do not split into ", options.groups, " groups"));
    auto [w, b] = layer_init({out_channels, in_channels / options.groups, kernel[0], kernel[1]}, with_bias, gen, init);
    weight = register_parameter("weight", std::move(w));
    if (with_bias) bias = register_parameter("bias", std::move(b));
}

Var Conv2d::operator()(const Var& x, std::source_location where) const {
    ComputeGraph& graph = x.graph();
    const Var w = graph.parameter(weight, where);
    if (!bias.defined()) return conv2d(x, w, options, where);
    return conv2d(x, w, graph.parameter(bias, where), options, where);
}

BatchNorm::BatchNorm(std::int64_t channels, double momentum, double eps) : momentum(momentum), eps(eps) {
    check_positive("BatchNorm", "channels", channels);
    if (!(momentum >= 0 && momentum <= 1)) throw ValueError(str("BatchNorm: momentum must be in [0, 1], got ", momentum));
    if (!(eps > 0)) throw ValueError(str("BatchNorm: eps must be positive, got ", eps));
    weight = register_parameter("weight", Tensor::ones({channels}));
    bias = register_parameter("bias", Tensor::zeros({channels}));
    running_mean = register_buffer("running_mean", Tensor::zeros({channels}));
    running_var = register_buffer("running_var", Tensor::ones({channels}));
}

Var BatchNorm::operator()(const Var& x, std::source_location where) const {
    ComputeGraph& graph = x.graph();
    return batch_norm(x, graph.parameter(weight, where), graph.parameter(bias, where), *running_mean, *running_var,
                      is_training(), momentum, eps, where);
}

namespace {
// The checks of LayerNorm's and RMSNorm's constructors, in their words.
void check_normalized_shape(const char* layer, const Shape& normalized_shape) {
    if (normalized_shape.empty()) throw ValueError(str(layer, ": normalized_shape must have at least one dim, got ()"));
    for (const std::int64_t d : normalized_shape)
        if (d <= 0)
            throw ValueError(str(layer, ": normalized_shape ", to_string(normalized_shape), " must be positive"));
    std::int64_t count = 1;
    for (const std::int64_t d : normalized_shape) count = checked_mul(count, d, str(layer, ": normalized_shape"));
}
void check_eps(const char* layer, double eps) {
    if (!(eps >= 0) || !std::isfinite(eps)) throw ValueError(str(layer, ": eps must be finite and >= 0, got ", eps));
}
}  // namespace

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias)
    : normalized_shape(std::move(normalized_shape)), eps(eps) {
    check_normalized_shape("LayerNorm", this->normalized_shape);
    check_eps("LayerNorm", eps);
    if (!elementwise_affine) return;
    weight = register_parameter("weight", Tensor::ones(this->normalized_shape));
    if (bias) this->bias = register_parameter("bias", Tensor::zeros(this->normalized_shape));
}

Var LayerNorm::operator()(const Var& x, std::source_location where) const {
    ComputeGraph& graph = x.graph();
    const Var w = weight.defined() ? graph.parameter(weight, where) : Var();
    const Var b = bias.defined() ? graph.parameter(bias, where) : Var();
    return layer_norm(x, normalized_shape, w, b, eps, where);
}

RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine)
    : normalized_shape(std::move(normalized_shape)), eps(eps) {
    check_normalized_shape("RMSNorm", this->normalized_shape);
    if (eps) check_eps("RMSNorm", *eps);
    if (elementwise_affine) weight = register_parameter("weight", Tensor::ones(this->normalized_shape));
}

Var RMSNorm::operator()(const Var& x, std::source_location where) const {
    const Var w = weight.defined() ? x.graph().parameter(weight, where) : Var();
    return rms_norm(x, normalized_shape, w, eps, where);
}

Var GELU::operator()(const Var& x, std::source_location where) const { return gelu(x, approximation, where); }

Var SiLU::operator()(const Var& x, std::source_location where) const { return silu(x, where); }

Dropout::Dropout(double p, std::uint64_t seed) : p(p), seeds_(std::make_shared<DropoutSeeds>(seed)) {
    if (!(p >= 0 && p < 1)) throw ValueError(str("Dropout: p must be in [0, 1), got ", p));
}

Var Dropout::operator()(const Var& x, std::source_location where) const {
    // Nothing dropped (evaluation, or p = 0): x itself, as PyTorch's nn.Dropout — no node, no seed drawn, no pass
    // over x (under autocast a 16-bit x would otherwise also pay two casts each way).
    if (!is_training() || p == 0) return x;
    // The seed is drawn where x lives and handed to the op as a tensor: on a GPU neither the counter nor the
    // seed passes through the host, so a replay of a captured step draws the next masks; there the dropout
    // kernel draws it (no launch of its own).
    return dropout(x, p, true, *seeds_, where);
}

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Generator& gen,
                     std::optional<std::int64_t> padding) {
    check_positive("Embedding", "num_embeddings", num_embeddings);
    check_positive("Embedding", "embedding_dim", embedding_dim);
    if (padding) {
        if (*padding < -num_embeddings || *padding >= num_embeddings)
            throw IndexError(str("Embedding: padding_idx ", *padding, " is outside [", -num_embeddings, ", ",
                                 num_embeddings, ") for ", num_embeddings, " embeddings"));
        padding_idx = *padding < 0 ? *padding + num_embeddings : *padding;
    }
    Tensor w = Tensor::normal({num_embeddings, embedding_dim}, 0.0, 1.0, gen);
    if (padding_idx) std::fill_n(w.data<float>() + *padding_idx * embedding_dim, embedding_dim, 0.0f);
    weight = register_parameter("weight", std::move(w));
}

Var Embedding::operator()(const Var& indices, std::source_location where) const {
    return embedding(indices, indices.graph().parameter(weight, where), padding_idx, where);
}

Sequential& Sequential::skip_index() {
    ++layers_->next_index;
    return *this;
}

Var Sequential::operator()(const Var& x, std::source_location where) const {
    Var y = x;
    for (const LayerFn& layer : layers_->calls) y = layer(y, where);
    return y;
}

namespace {
// (name, destination) pairs of a module or a parameter list, in their order.
using Targets = std::vector<std::pair<std::string, Tensor>>;

Targets module_targets(const Module& module) {
    Targets targets;
    for (const auto& [path, p] : module.named_parameters()) targets.emplace_back(path, p.value());
    for (auto& buffer : module.buffers()) targets.push_back(std::move(buffer));
    return targets;
}

Targets parameter_targets(const std::vector<Parameter>& parameters, const char* what) {
    Targets targets;
    std::set<std::string> names;
    for (const Parameter& p : parameters) {
        if (!p.defined()) throw ValueError(str(what, ": a parameter is undefined"));
        if (p.name().empty()) throw ValueError(str(what, ": a parameter of shape ", to_string(p.value().shape()),
                                                   " has no name"));
        if (!names.insert(p.name()).second) throw ValueError(str(what, ": two parameters are named '", p.name(), "'"));
        if (p.name().starts_with('@'))
            throw ValueError(str(what, ": parameter name '", p.name(), "' starts with '@', kept for checkpoint state"));
        targets.emplace_back(p.name(), p.value());
    }
    return targets;
}

void save_targets(const Targets& targets, const std::filesystem::path& path) {
    TensorMap tensors;
    for (const auto& [name, value] : targets) tensors.emplace(name, value);
    save_safetensors(path, tensors);
}

// Everything is read, matched and converted before the first destination is written.
void load_targets(const Targets& targets, TensorMap file, const std::string& source_name) {
    std::erase_if(file, [](const auto& entry) { return entry.first.starts_with('@'); });  // not the model's
    std::vector<Tensor> sources;
    sources.reserve(targets.size());
    for (const auto& [name, target] : targets) {
        const auto found = file.find(name);
        if (found == file.end()) throw IoError(str("'", source_name, "' has no tensor '", name, "'"));
        const Tensor& source = found->second;
        if (source.shape() != target.shape())
            throw ShapeError(str("tensor '", name, "' in '", source_name, "' has shape ", to_string(source.shape()),
                                 ", the destination ", to_string(target.shape())));
        sources.push_back(source.to(target.dtype()));
        file.erase(found);
    }
    if (!file.empty())
        throw IoError(str("'", source_name, "' has tensor '", file.begin()->first, "' that the destination lacks (",
                          file.size(), " unexpected in all)"));
    for (std::size_t i = 0; i < targets.size(); ++i) {
        Tensor destination = targets[i].second;
        destination.copy_from(sources[i]);
    }
}
}  // namespace

void save_parameters(const Module& module, const std::filesystem::path& path) {
    save_targets(module_targets(module), path);
}

void save_parameters(const std::vector<Parameter>& parameters, const std::filesystem::path& path) {
    save_targets(parameter_targets(parameters, "save_parameters"), path);
}

void load_parameters(Module& module, const std::filesystem::path& path) {
    load_targets(module_targets(module), load_safetensors(path), path.string());
}

void load_parameters(const std::vector<Parameter>& parameters, const std::filesystem::path& path) {
    load_targets(parameter_targets(parameters, "load_parameters"), load_safetensors(path), path.string());
}

void load_parameters(Module& module, const TensorMap& tensors, const std::string& source) {
    load_targets(module_targets(module), tensors, source);
}

TensorMap named_tensors(const Module& module) {
    TensorMap tensors;
    for (const auto& [name, value] : module_targets(module)) tensors.emplace(name, value);
    return tensors;
}

}  // namespace dyngrad
