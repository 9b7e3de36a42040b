// Hostile inputs to capturable training (issue 15): GradScaler's options, call order, collapse and checkpoint
// state; WarmupCosineLR's settings; dropout's seed tensor; the gated optimizer step; CapturedStep's guard options.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::kInf;
using dgtest::kNaN;

namespace {

std::vector<Parameter> one_parameter() {
    Generator gen(41);
    return {Parameter(Tensor::normal({3, 2}, 0, 1, gen), "w")};
}

// One backward of Σw² (scaled when a scaler is given) over `params`.
void backward(const std::vector<Parameter>& params, GradScaler* scaler = nullptr) {
    ComputeGraph graph;
    Var w = graph.parameter(params[0]);
    Var loss = sum(w * w);
    graph.backward(scaler != nullptr ? scaler->scale(loss) : loss);
}

// One parameter, its SGD and a scaler, after one scaled backward.
struct AfterScaledBackward {
    std::vector<Parameter> params = one_parameter();
    SGD sgd{params};
    GradScaler scaler;
    AfterScaledBackward() { backward(params, &scaler); }
};

// A scaler's checkpoint state, then `edit` applied to it, loaded into a fresh scaler.
template <typename Edit>
void load_edited_scaler(Edit edit) {
    GradScaler saved;
    TensorMap tensors;
    SafetensorsMetadata metadata;
    saved.save_state(tensors, metadata);
    edit(tensors, metadata);
    GradScaler target;
    target.load_state(tensors, metadata, "scaler.safetensors");
}

Tensor scale_of(double value) { return Tensor::full({1}, value, DType::f64); }
Tensor count_of(std::int64_t value) { return Tensor::from_vector(std::vector<std::int64_t>{value}, {1}); }

void dropout_with_seed(const Tensor& seed) { dropout(Tensor::ones({4, 4}), 0.5, true, seed); }

// GradScaler options out of their ranges: each constructor call must name the option and its value.
struct BadScalerOption {
    std::string label;
    std::vector<std::string> keys;
    GradScalerOptions options;
};
const BadScalerOption bad_scaler_options[] = {
    {"GradScaler init_scale 0", {"GradScaler", "init_scale", "0"}, {.init_scale = 0}},
    {"GradScaler init_scale negative", {"init_scale", "-8"}, {.init_scale = -8}},
    {"GradScaler init_scale inf", {"init_scale", "inf"}, {.init_scale = kInf}},
    {"GradScaler init_scale NaN", {"init_scale", "nan"}, {.init_scale = kNaN}},
    {"GradScaler growth_factor 1 (never grows)", {"growth_factor", "above 1"}, {.growth_factor = 1}},
    {"GradScaler growth_factor 0.5 (shrinks)", {"growth_factor", "0.5"}, {.growth_factor = 0.5}},
    {"GradScaler growth_factor inf", {"growth_factor", "inf"}, {.growth_factor = kInf}},
    {"GradScaler backoff_factor 0", {"backoff_factor", "(0, 1)"}, {.backoff_factor = 0}},
    {"GradScaler backoff_factor 1 (never backs off)", {"backoff_factor", "1"}, {.backoff_factor = 1}},
    {"GradScaler backoff_factor 2", {"backoff_factor", "2"}, {.backoff_factor = 2}},
    {"GradScaler backoff_factor NaN", {"backoff_factor", "nan"}, {.backoff_factor = kNaN}},
    {"GradScaler growth_interval 0", {"growth_interval", "0"}, {.growth_interval = 0}},
    {"GradScaler growth_interval negative", {"growth_interval", "-5"}, {.growth_interval = -5}},
    {"GradScaler max_consecutive_skips 0", {"max_consecutive_skips"}, {.max_consecutive_skips = 0}},
    {"GradScaler min_scale negative", {"min_scale", "-1"}, {.min_scale = -1}},
    {"GradScaler min_scale NaN", {"min_scale", "nan"}, {.min_scale = kNaN}},
};

std::vector<hostile::Case> scaler_option_cases() {
    std::vector<hostile::Case> cases;
    for (const BadScalerOption& bad : bad_scaler_options)
        cases.push_back(
            hostile::expect<ValueError>(bad.label, bad.keys, [options = bad.options] { GradScaler{options}; }));
    return cases;
}

const bool added_options = hostile::add("capturable training", scaler_option_cases());
const bool added = hostile::add(
    "capturable training",
    {
        hostile::expect<ValueError>("GradScaler::update before any step", {"update", "step()"},
                                    [] { GradScaler().update(); }),
        hostile::expect<ValueError>("GradScaler::update twice after one step", {"update", "no step()"}, [] {
            AfterScaledBackward run;
            run.scaler.step(run.sgd);
            run.scaler.update();
            run.scaler.update();
        }),
        hostile::expect<ValueError>("GradScaler::unscale twice in one step", {"unscale", "once per step"}, [] {
            AfterScaledBackward run;
            run.scaler.unscale(run.sgd);
            run.scaler.unscale(run.sgd);
        }),
        hostile::expect<NumericalError>("a loss scale that collapses (inf gradients at every scale)",
                                        {"GradScaler", "collapsed", "consecutive skipped steps"}, [] {
            const std::vector<Parameter> params = one_parameter();
            SGD sgd(params);
            GradScaler scaler({.init_scale = 2.0, .min_scale = 1.0, .max_consecutive_skips = 2});
            for (int i = 0; i < 3; ++i) {
                backward(params, &scaler);
                Tensor& grad = const_cast<Parameter&>(params[0]).grad_slot();
                grad = Tensor::full(grad.shape(), kInf);
                scaler.step(sgd);
                scaler.update();
                sgd.zero_grad();
            }
        }),
        hostile::expect<DTypeError>("GradScaler::scale of an int64 loss", {"GradScaler", "floating", "int64"}, [] {
            ComputeGraph graph;
            GradScaler().scale(graph.input(Tensor::from_vector(std::vector<std::int64_t>{3}, {1})));
        }),
        hostile::expect<IoError>("scaler state from a checkpoint without it", {"GradScaler", "dyngrad.scaler"}, [] {
            GradScaler().load_state({}, {}, "bare.safetensors");
        }),
        hostile::expect<ValueError>("scaler checkpoint with scale 0", {"scaler.safetensors", "scale", "0"},
                                    [] { load_edited_scaler([](TensorMap& t, auto&) { t["@scaler.scale"] = scale_of(0); }); }),
        hostile::expect<ValueError>("scaler checkpoint with scale NaN", {"scale", "nan"},
                                    [] { load_edited_scaler([](TensorMap& t, auto&) { t["@scaler.scale"] = scale_of(kNaN); }); }),
        hostile::expect<ValueError>("scaler checkpoint with scale -inf", {"scale", "-inf"},
                                    [] { load_edited_scaler([](TensorMap& t, auto&) { t["@scaler.scale"] = scale_of(-kInf); }); }),
        hostile::expect<ValueError>("scaler checkpoint with a negative growth tracker", {"growth tracker", "-3"}, [] {
            load_edited_scaler([](TensorMap& t, auto&) { t["@scaler.growth_tracker"] = count_of(-3); });
        }),
        hostile::expect<ValueError>("scaler checkpoint with negative skips", {"skips", "-1"},
                                    [] { load_edited_scaler([](TensorMap& t, auto&) { t["@scaler.skips"] = count_of(-1); }); }),
        hostile::expect<DTypeError>("scaler checkpoint with a float32 scale", {"@scaler.scale", "float32", "float64"}, [] {
            load_edited_scaler([](TensorMap& t, auto&) { t["@scaler.scale"] = Tensor::full({1}, 8.0, DType::f32); });
        }),
        hostile::expect<ShapeError>("scaler checkpoint with two scales", {"@scaler.scale", "one element"}, [] {
            load_edited_scaler([](TensorMap& t, auto&) { t["@scaler.scale"] = Tensor::full({2}, 8.0, DType::f64); });
        }),
        hostile::expect<IoError>("scaler checkpoint without a growth tracker", {"@scaler.growth_tracker"},
                                 [] { load_edited_scaler([](TensorMap& t, auto&) { t.erase("@scaler.growth_tracker"); }); }),
        hostile::expect<IoError>("scaler checkpoint with an unknown entry", {"@scaler.hysteresis", "does not have"}, [] {
            load_edited_scaler([](TensorMap& t, auto&) { t["@scaler.hysteresis"] = count_of(2); });
        }),
        hostile::expect<ValueError>("WarmupCosineLR with negative warm-up", {"WarmupCosineLR", "warmup_steps", "-1"}, [] {
            SGD sgd(one_parameter());
            WarmupCosineLR(sgd, -1, 10);
        }),
        hostile::expect<ValueError>("WarmupCosineLR with total_steps equal to warmup_steps",
                                    {"WarmupCosineLR", "total_steps", "10"}, [] {
            SGD sgd(one_parameter());
            WarmupCosineLR(sgd, 10, 10);
        }),
        hostile::expect<ValueError>("WarmupCosineLR with total_steps below warmup_steps", {"total_steps (3)"}, [] {
            SGD sgd(one_parameter());
            WarmupCosineLR(sgd, 5, 3);
        }),
        hostile::expect<ValueError>("WarmupCosineLR with negative min_lr", {"WarmupCosineLR", "min_lr"}, [] {
            SGD sgd(one_parameter());
            WarmupCosineLR(sgd, 1, 10, -0.1);
        }),
        hostile::expect<ValueError>("WarmupCosineLR with min_lr inf", {"min_lr", "inf"}, [] {
            SGD sgd(one_parameter());
            WarmupCosineLR(sgd, 1, 10, kInf);
        }),
        hostile::expect<ValueError>("WarmupCosineLR loading a StepLR checkpoint", {"StepLR", "WarmupCosineLR"}, [] {
            SGD sgd(one_parameter());
            StepLR step(sgd, 2);
            TensorMap tensors;
            SafetensorsMetadata metadata;
            step.save_state(tensors, metadata);
            WarmupCosineLR(sgd, 1, 10).load_state(tensors, metadata, "step.safetensors");
        }),
        hostile::expect<DTypeError>("dropout seed tensor of float32", {"dropout", "seed", "int64", "float32"},
                                    [] { dropout_with_seed(Tensor::zeros({1}, DType::f32)); }),
        hostile::expect<DTypeError>("dropout seed tensor of float64", {"seed", "float64"},
                                    [] { dropout_with_seed(Tensor::zeros({1}, DType::f64)); }),
        hostile::expect<ShapeError>("dropout seed tensor of two elements", {"seed", "one element", "(2)"},
                                    [] { dropout_with_seed(Tensor::zeros({2}, DType::i64)); }),
        hostile::expect<ShapeError>("dropout seed tensor of no elements", {"seed", "one element", "(0)"},
                                    [] { dropout_with_seed(Tensor::zeros({0}, DType::i64)); }),
        hostile::expect<DTypeError>("dropout seed Var of float32 in a graph", {"dropout", "seed", "float32"}, [] {
            ComputeGraph graph;
            dropout(graph.input(Tensor::ones({2, 3})), 0.5, true, graph.constant(Tensor::zeros({1})));
        }),
        hostile::expect<ValueError>("a gated optimizer step without its flags", {"inv_scale", "found_inf"}, [] {
            const std::vector<Parameter> params = one_parameter();
            Adam adam(params);
            backward(params);
            adam.step(Optimizer::Gate{});
        }),
        hostile::expect<ValueError>("CapturedStep guard_replays without guard_state", {"guard_replays = 2", "guard_state"},
                                    [] {
                                        cuda::CapturedStep([](std::span<const Tensor> in) { return in[0]; },
                                                           {.guard_replays = 2});
                                    }),
    });

}  // namespace
