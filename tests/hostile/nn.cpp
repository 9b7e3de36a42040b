// Hostile inputs to the model layer's training surface (nn/optim.h, nn/layers.h): parameter groups, frozen
// parameters, gradient clipping, optimizer/schedule checkpoints and the layers' init options.
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;
using hostile::expect;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Parameter param(const char* name, std::int64_t n = 3) {
    Generator gen(static_cast<std::uint64_t>(n) * 7 + 1);
    return Parameter(Tensor::uniform({n}, -1, 1, gen), name);
}

// A parameter with a gradient (loss = Σ w·c).
Parameter with_grad(const char* name) {
    Parameter p = param(name);
    ComputeGraph graph;
    Generator gen(5);
    graph.backward(sum(graph.parameter(p) * graph.input(Tensor::uniform({3}, -1, 1, gen))));
    return p;
}

struct Model : Module {
    Linear fc;
    explicit Model(Generator&& gen) : fc(3, 2, true, gen) { register_module("fc", fc); }
};

// A checkpoint of a Model + Adam (one step) + StepLR, edited, then loaded into fresh ones.
void load_edited(const std::function<void(TensorMap&, SafetensorsMetadata&)>& edit) {
    const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                       ("dyngrad_hostile_nn_" + std::to_string(::getpid()) + ".safetensors");
    struct Remove {
        std::filesystem::path path;
        ~Remove() {
            std::error_code ignored;
            std::filesystem::remove(path, ignored);
        }
    } remove{path};
    {
        Model model(Generator(1));
        Adam adam(model.parameters());
        StepLR schedule(adam, 1);
        ComputeGraph graph;
        Generator gen(2);
        graph.backward(sum(model.fc(graph.input(Tensor::uniform({4, 3}, -1, 1, gen)))));
        adam.step();
        schedule.step();
        save_checkpoint(path, model, adam, &schedule);
        SafetensorsMetadata metadata;
        TensorMap tensors = load_safetensors(path, &metadata);
        edit(tensors, metadata);
        save_safetensors(path, tensors, metadata);
    }
    Model fresh(Generator(3));
    Adam adam(fresh.parameters());
    StepLR schedule(adam, 1);
    load_checkpoint(path, fresh, adam, &schedule);
}

const bool added = hostile::add(
    "nn",
    {
        // ---- parameter groups ----
        expect<ValueError>("SGD group sets beta1", {"SGD", "group 0", "beta1"},
                           [] { SGD({{.parameters = {param("a")}, .beta1 = 0.5}}); }),
        expect<ValueError>("SGD group sets eps", {"SGD", "eps"}, [] { SGD({{.parameters = {param("a")}, .eps = 1e-3}}); }),
        expect<ValueError>("Adam group sets momentum", {"Adam", "momentum"},
                           [] { Adam({{.parameters = {param("a")}, .momentum = 0.9}}); }),
        expect<ValueError>("AdamW group sets nesterov", {"AdamW", "nesterov"},
                           [] { AdamW({{.parameters = {param("a")}, .nesterov = true}}); }),
        expect<ValueError>("SGD group 1 lr negative", {"SGD group 1", "lr", "-1"},
                           [] { SGD({{.parameters = {param("a")}}, {.parameters = {param("b")}, .lr = -1}}); }),
        expect<ValueError>("SGD group momentum NaN", {"SGD", "momentum", "nan"},
                           [] { SGD({{.parameters = {param("a")}, .momentum = kNaN}}); }),
        expect<ValueError>("SGD group nesterov without momentum", {"SGD", "nesterov", "momentum"},
                           [] { SGD({{.parameters = {param("a")}, .nesterov = true}}); }),
        expect<ValueError>("Adam group beta1 = 1", {"Adam", "betas", "[0, 1)"},
                           [] { Adam({{.parameters = {param("a")}, .beta1 = 1.0}}); }),
        expect<ValueError>("Adam group beta2 negative", {"Adam", "betas"},
                           [] { Adam({{.parameters = {param("a")}, .beta2 = -0.1}}); }),
        expect<ValueError>("AdamW group eps infinite", {"AdamW", "eps", "inf"},
                           [] { AdamW({{.parameters = {param("a")}, .eps = kInf}}); }),
        expect<ValueError>("AdamW group weight_decay negative", {"AdamW", "weight_decay"},
                           [] { AdamW({{.parameters = {param("a")}, .weight_decay = -0.01}}); }),
        expect<ValueError>("a parameter in two groups", {"'a'", "twice"}, [] {
            Parameter a = param("a");
            SGD({{.parameters = {a}}, {.parameters = {a}}});
        }),
        expect<ValueError>("an undefined parameter in a group", {"SGD", "undefined"},
                           [] { SGD({{.parameters = {param("a")}}, {.parameters = {Parameter()}}}); }),
        expect<IndexError>("set_lr of group 5 of 1", {"SGD", "group 5", "1 groups"},
                           [] { SGD({param("a")}).set_lr(5, 0.1); }),
        expect<ValueError>("set_lr of group 0 to NaN", {"SGD", "lr", "nan"}, [] { SGD({param("a")}).set_lr(0, kNaN); }),
        expect<IndexError>("settings of group 3 of 2", {"Adam", "group 3"},
                           [] { Adam({{.parameters = {param("a")}}, {.parameters = {param("b")}}}).settings(3); }),
        expect<IndexError>("schedule lr_at a group that does not exist", {"StepLR", "group 2"}, [] {
            SGD opt({param("a")});
            StepLR(opt, 1).lr_at(1, 2);
        }),
        // ---- freezing ----
        expect<ValueError>("set_requires_grad on an undefined Parameter", {"Parameter", "undefined"},
                           [] { Parameter().set_requires_grad(false); }),
        // ---- clipping ----
        expect<ValueError>("clip_grad_norm max_norm -1", {"clip_grad_norm", "max_norm", "-1"},
                           [] { clip_grad_norm({with_grad("a")}, -1); }),
        expect<ValueError>("clip_grad_norm max_norm NaN", {"clip_grad_norm", "max_norm"},
                           [] { clip_grad_norm({with_grad("a")}, kNaN); }),
        expect<ValueError>("clip_grad_norm norm_type 0", {"clip_grad_norm", "norm_type"},
                           [] { clip_grad_norm({with_grad("a")}, 1, 0); }),
        expect<ValueError>("clip_grad_norm norm_type -2", {"clip_grad_norm", "norm_type", "-2"},
                           [] { clip_grad_norm({with_grad("a")}, 1, -2); }),
        expect<ValueError>("clip_grad_norm norm_type NaN", {"clip_grad_norm", "norm_type"},
                           [] { clip_grad_norm({with_grad("a")}, 1, kNaN); }),
        expect<ValueError>("clip_grad_norm eps negative", {"clip_grad_norm", "eps"},
                           [] { clip_grad_norm({with_grad("a")}, 1, 2, -1e-6); }),
        expect<ValueError>("clip_grad_norm undefined parameter", {"clip_grad_norm", "parameter 1", "undefined"},
                           [] { clip_grad_norm({with_grad("a"), Parameter()}, 1); }),
        expect<ValueError>("clip_grad_norm gradient of a replaced value", {"clip_grad_norm", "'a'", "zero_grad"}, [] {
            Parameter a = with_grad("a");
            a.value() = Tensor::zeros({5});
            clip_grad_norm({a}, 1);
        }),
        expect<ValueError>("clip_grad_value negative", {"clip_grad_value", "clip_value"},
                           [] { clip_grad_value({with_grad("a")}, -0.5); }),
        expect<ValueError>("clip_grad_value NaN", {"clip_grad_value"}, [] { clip_grad_value({with_grad("a")}, kNaN); }),
        expect<ValueError>("clip_grad_value undefined parameter", {"clip_grad_value", "undefined"},
                           [] { clip_grad_value({Parameter()}, 1); }),
        // ---- checkpoints ----
        expect<IoError>("load_checkpoint of a missing file", {"no-such-checkpoint"}, [] {
            Model model(Generator(1));
            Adam adam(model.parameters());
            load_checkpoint("/nonexistent/no-such-checkpoint.safetensors", model, adam);
        }),
        expect<IoError>("a checkpoint without optimizer metadata", {"no optimizer state", "dyngrad.optimizer"},
                        [] { load_edited([](TensorMap&, SafetensorsMetadata& m) { m.erase("dyngrad.optimizer"); }); }),
        expect<ValueError>("a checkpoint of another optimizer type", {"SGD", "Adam"},
                           [] { load_edited([](TensorMap&, SafetensorsMetadata& m) { m["dyngrad.optimizer"] = "SGD"; }); }),
        expect<IoError>("a checkpoint missing a moment", {"@optimizer.state.0.exp_avg", "fc.weight"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) { t.erase("@optimizer.state.0.exp_avg"); });
        }),
        expect<ShapeError>("a moment of the wrong shape", {"@optimizer.state.1.exp_avg_sq", "(4)", "(2)"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) { t["@optimizer.state.1.exp_avg_sq"] = Tensor::zeros({4}); });
        }),
        expect<DTypeError>("an integer moment", {"@optimizer.state.1.exp_avg", "int64", "floating"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) {
                t["@optimizer.state.1.exp_avg"] = Tensor::zeros({2}, DType::i64);
            });
        }),
        expect<DTypeError>("step counts stored as float64", {"@optimizer.steps", "float64", "int64"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) { t["@optimizer.steps"] = Tensor::ones({2}, DType::f64); });
        }),
        expect<ShapeError>("step counts of another parameter count", {"@optimizer.steps", "(3)", "(2)"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) {
                t["@optimizer.steps"] = Tensor::from_vector(std::vector<std::int64_t>{1, 1, 1}, {3});
            });
        }),
        expect<ValueError>("a negative step count", {"parameter 1", "step count -4"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) {
                t["@optimizer.steps"] = Tensor::from_vector(std::vector<std::int64_t>{1, -4}, {2});
            });
        }),
        expect<ValueError>("a group lr of -1 in the file", {"Adam", "lr", "-1"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) { t["@optimizer.settings"].set({0, 0}, -1.0); });
        }),
        expect<ValueError>("a group beta1 of 2 in the file", {"Adam", "betas"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) { t["@optimizer.settings"].set({0, 4}, 2.0); });
        }),
        expect<ValueError>("another group size in the file", {"group 0", "5 parameters there", "2 here"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) {
                t["@optimizer.group_sizes"] = Tensor::from_vector(std::vector<std::int64_t>{5}, {1});
            });
        }),
        // Another number of groups is another group layout: ValueError, as other group sizes (issue 35).
        expect<ValueError>("a checkpoint of two groups into one", {"group_sizes", "2 Adam parameter groups there and 1 here"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) {
                t["@optimizer.group_sizes"] = Tensor::from_vector(std::vector<std::int64_t>{1, 1}, {2});
            });
        }),
        expect<ValueError>("a checkpoint of no groups", {"group_sizes", "0 Adam parameter groups there"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) {
                t["@optimizer.group_sizes"] = Tensor::from_vector(std::vector<std::int64_t>{}, {0});
            });
        }),
        expect<ValueError>("a schedule checkpoint of three groups into one", {"@schedule.base_lrs", "3 StepLR base lrs"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) {
                t["@schedule.base_lrs"] = Tensor::from_vector(std::vector<double>{0.1, 0.1, 0.1}, {3}, DType::f64);
            });
        }),
        expect<IoError>("an unexpected optimizer entry", {"@optimizer.extra", "does not have"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) { t["@optimizer.extra"] = Tensor::zeros({1}); });
        }),
        expect<ValueError>("a checkpoint of another schedule type", {"CosineAnnealingLR", "StepLR"}, [] {
            load_edited([](TensorMap&, SafetensorsMetadata& m) { m["dyngrad.schedule"] = "CosineAnnealingLR"; });
        }),
        expect<ValueError>("a negative schedule epoch", {"StepLR", "epoch -3"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) {
                t["@schedule.epoch"] = Tensor::from_vector(std::vector<std::int64_t>{-3}, {1});
            });
        }),
        expect<IoError>("a schedule without base lrs", {"@schedule.base_lrs"},
                        [] { load_edited([](TensorMap& t, SafetensorsMetadata&) { t.erase("@schedule.base_lrs"); }); }),
        expect<ValueError>("an infinite base lr", {"StepLR", "base lr", "inf"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) { t["@schedule.base_lrs"].set({0}, kInf); });
        }),
        expect<ShapeError>("a model weight of another shape in a checkpoint", {"fc.bias", "(7)", "(2)"}, [] {
            load_edited([](TensorMap& t, SafetensorsMetadata&) { t["fc.bias"] = Tensor::zeros({7}); });
        }),
        expect<ValueError>("save_checkpoint with a schedule of another optimizer", {"StepLR", "another optimizer"}, [] {
            Model model(Generator(1));
            Adam adam(model.parameters()), other(model.parameters());
            StepLR schedule(other, 1);
            save_checkpoint("/nonexistent/x.safetensors", model, adam, &schedule);
        }),
        expect<ValueError>("load_checkpoint with a schedule of another optimizer", {"StepLR", "another optimizer"}, [] {
            Model model(Generator(1));
            Adam adam(model.parameters()), other(model.parameters());
            StepLR schedule(other, 1);
            load_checkpoint("/nonexistent/x.safetensors", model, adam, &schedule);
        }),
        expect<ValueError>("a module entry named '@x'", {"'@x'", "'@'"},
                           [] { Module().register_parameter("@x", Tensor::zeros({1})); }),
        expect<ValueError>("save_parameters of a parameter named '@w'", {"save_parameters", "'@w'"},
                           [] { save_parameters({param("@w")}, "/nonexistent/x.safetensors"); }),
        // ---- DataLoader ----
        expect<ValueError>("DataLoader of a null data set", {"DataLoader", "null"}, [] { DataLoader(nullptr, {}); }),
        expect<ValueError>("DataLoader batch size 0", {"DataLoader", "batch size 0"}, [] {
            DataLoader(std::make_shared<TensorDataset>(std::vector<Tensor>{Tensor::zeros({4, 2})}), {.batch_size = 0});
        }),
        expect<ValueError>("DataLoader shard 3 of 3", {"DataLoader", "shard 3 of 3"}, [] {
            DataLoader(std::make_shared<TensorDataset>(std::vector<Tensor>{Tensor::zeros({4})}),
                       {.num_shards = 3, .shard = 3});
        }),
        expect<ValueError>("DataLoader 0 shards", {"DataLoader", "0 shards"}, [] {
            DataLoader(std::make_shared<TensorDataset>(std::vector<Tensor>{Tensor::zeros({4})}), {.num_shards = 0});
        }),
        expect<ValueError>("DataLoader negative shard", {"DataLoader", "shard -1"}, [] {
            DataLoader(std::make_shared<TensorDataset>(std::vector<Tensor>{Tensor::zeros({4})}), {.shard = -1});
        }),
        expect<ValueError>("DataLoader prefetch -2", {"DataLoader", "prefetch -2"}, [] {
            DataLoader(std::make_shared<TensorDataset>(std::vector<Tensor>{Tensor::zeros({4})}), {.prefetch = -2});
        }),
        expect<DeviceError>("DataLoader on cuda:64", {"DataLoader", "cuda:64"}, [] {
            DataLoader(std::make_shared<TensorDataset>(std::vector<Tensor>{Tensor::zeros({4})}),
                       {.device = Device::cuda(64)});
        }),
        expect<ValueError>("TensorDataset of no tensors", {"TensorDataset", "no tensors"}, [] { TensorDataset({}); }),
        expect<ValueError>("TensorDataset with an undefined tensor", {"TensorDataset", "tensor 1", "undefined"},
                           [] { TensorDataset({Tensor::zeros({3}), Tensor()}); }),
        expect<ShapeError>("TensorDataset first dimensions 5 and 4", {"TensorDataset", "(5,2)", "(4)"},
                           [] { TensorDataset({Tensor::zeros({5, 2}), Tensor::zeros({4})}); }),
        expect<ShapeError>("TensorDataset of a 0-d tensor", {"TensorDataset", "first"},
                           [] { TensorDataset({Tensor::zeros({})}); }),
        expect<IndexError>("TensorDataset get(7) of 3", {"TensorDataset", "sample 7", "0..2"},
                           [] { TensorDataset({Tensor::zeros({3})}).get(7); }),
        expect<ValueError>("stack_samples of no samples", {"stack_samples", "no samples"}, [] { stack_samples({}); }),
        expect<ValueError>("stack_samples with field counts 1 and 2", {"stack_samples", "sample 1", "2 tensors"},
                           [] { stack_samples({{Tensor::zeros({2})}, {Tensor::zeros({2}), Tensor::zeros({1})}}); }),
        expect<DTypeError>("stack_samples of float32 and int64", {"stack_samples", "int64", "float32"},
                           [] { stack_samples({{Tensor::zeros({2})}, {Tensor::zeros({2}, DType::i64)}}); }),
        expect<ShapeError>("stack_samples of (2) and (3)", {"stack_samples", "sample 1", "(3)", "collate"},
                           [] { stack_samples({{Tensor::zeros({2})}, {Tensor::zeros({3})}}); }),
        expect<ValueError>("stack_samples with an undefined tensor", {"stack_samples", "undefined"},
                           [] { stack_samples({{Tensor()}}); }),
        expect<ValueError>("a collate returning an undefined tensor", {"DataLoader", "collate", "undefined"}, [] {
            DataLoader loader(std::make_shared<TensorDataset>(std::vector<Tensor>{Tensor::zeros({4})}),
                              {.prefetch = 1, .collate = [](const std::vector<std::vector<Tensor>>&) {
                                   return std::vector<Tensor>{Tensor()};
                               }});
            std::vector<Tensor> batch;
            loader.next(batch);
        }),
        // ---- init ----
        expect<ValueError>("Linear with an Init that does not exist", {"Init", "9"}, [] {
            Generator gen(1);
            Linear(2, 2, true, gen, Activation::None, static_cast<Init>(9));
        }),
        expect<ValueError>("Conv2d with an Init that does not exist", {"Init", "-1"}, [] {
            Generator gen(1);
            Conv2d(2, 2, {3, 3}, {}, true, gen, static_cast<Init>(-1));
        }),
    });

}  // namespace
