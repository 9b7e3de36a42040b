// Hostile call orders (issue 35): stateful helpers called out of order or twice (the loss scaler, the
// schedules, the captured step), the rethrow helper outside a catch block. Each would otherwise compute
// something wrong in silence (a step 65536 times too short, a negative lr) or end the process.
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

std::vector<Parameter> two_parameters() {
    Generator gen(53);
    return {Parameter(Tensor::normal({3, 2}, 0, 1, gen), "w"), Parameter(Tensor::normal({2}, 0, 1, gen), "b")};
}

// One backward of Σ(w·b)² over `params`, its loss scaled when a scaler is given.
void backward(const std::vector<Parameter>& params, GradScaler* scaler = nullptr) {
    ComputeGraph graph;
    Var y = graph.parameter(params[0]) * graph.parameter(params[1]);
    Var loss = sum(y * y);
    graph.backward(scaler != nullptr ? scaler->scale(loss) : loss);
}

// `use` (GradScaler::step or unscale) of a fresh scaler on an Opt over fresh parameters after a backward of the
// unscaled loss: the scaler must refuse, as it never scaled the loss.
template <typename Opt>
void use_after_unscaled_backward(void (GradScaler::*use)(Optimizer&), const GradScalerOptions& scaler_options = {}) {
    const std::vector<Parameter> params = two_parameters();
    Opt optimizer(params);
    GradScaler scaler(scaler_options);
    backward(params);
    (scaler.*use)(optimizer);
}

// A scaler, an optimizer over fresh parameters and one scaled step (scale, backward, step, update) done.
struct AfterOneStep {
    std::vector<Parameter> params = two_parameters();
    SGD sgd{params, {.lr = 0.1}};
    GradScaler scaler;
    AfterOneStep() {
        backward(params, &scaler);
        scaler.step(sgd);
        scaler.update();
        sgd.zero_grad();
    }
};

const bool added = hostile::add(
    "call order",
    {
        hostile::expect<ValueError>("GradScaler::step after a backward of the unscaled loss (SGD)",
                                    {"GradScaler::step", "scale(loss)"},
                                    [] { use_after_unscaled_backward<SGD>(&GradScaler::step); }),
        hostile::expect<ValueError>("GradScaler::step after a backward of the unscaled loss (AdamW)",
                                    {"GradScaler::step", "no loss was scaled"},
                                    [] { use_after_unscaled_backward<AdamW>(&GradScaler::step, {.init_scale = 1024}); }),
        hostile::expect<ValueError>("GradScaler::unscale after a backward of the unscaled loss",
                                    {"GradScaler::unscale", "scale(loss)"},
                                    [] { use_after_unscaled_backward<Adam>(&GradScaler::unscale); }),
        hostile::expect<ValueError>("GradScaler::step in a second iteration that forgot scale()",
                                    {"GradScaler::step", "since the last step()"}, [] {
            AfterOneStep run;
            backward(run.params);
            run.scaler.step(run.sgd);
        }),
        hostile::expect<ValueError>("GradScaler::step twice before update()", {"GradScaler::step", "update()"}, [] {
            AfterOneStep run;
            backward(run.params, &run.scaler);
            run.scaler.step(run.sgd);
            run.scaler.step(run.sgd);
        }),
        hostile::expect<ValueError>("GradScaler::scale after unscale() in the same step",
                                    {"GradScaler::scale", "unscale()", "step()"}, [] {
            AfterOneStep run;
            backward(run.params, &run.scaler);
            run.scaler.unscale(run.sgd);
            backward(run.params, &run.scaler);
        }),
        hostile::expect<ValueError>("GradScaler::step before any scale() or backward",
                                    {"GradScaler::step", "scale(loss)"}, [] {
            const std::vector<Parameter> params = two_parameters();
            SGD sgd(params);
            GradScaler().step(sgd);
        }),
        hostile::expect<ValueError>("GradScaler::load_state between scale() and step()",
                                    {"GradScaler", "between scale() and step()"}, [] {
            AfterOneStep run;
            TensorMap tensors;
            SafetensorsMetadata metadata;
            GradScaler({.init_scale = 8.0}).save_state(tensors, metadata);
            backward(run.params, &run.scaler);
            run.scaler.load_state(tensors, metadata, "scaler.safetensors");
        }),
        hostile::expect<ValueError>("WarmupCosineLR lr_at epoch -1", {"WarmupCosineLR", "epoch -1", "negative"}, [] {
            const std::vector<Parameter> params = two_parameters();
            SGD sgd(params);
            WarmupCosineLR(sgd, 10, 100).lr_at(-1);
        }),
        hostile::expect<ValueError>("WarmupCosineLR lr_at epoch INT64_MIN", {"WarmupCosineLR", "negative"}, [] {
            const std::vector<Parameter> params = two_parameters();
            SGD sgd(params);
            WarmupCosineLR(sgd, 10, 100).lr_at(std::numeric_limits<std::int64_t>::min());
        }),
        hostile::expect<ValueError>("StepLR lr_at epoch -4", {"StepLR", "epoch -4"}, [] {
            const std::vector<Parameter> params = two_parameters();
            SGD sgd(params);
            StepLR(sgd, 3, 0.5).lr_at(-4);
        }),
        hostile::expect<ValueError>("CosineAnnealingLR lr_at epoch -1 of group 1", {"CosineAnnealingLR", "epoch -1"}, [] {
            const std::vector<Parameter> params = two_parameters();
            SGD sgd(std::vector<ParamGroup>{{.parameters = {params[0]}}, {.parameters = {params[1]}, .lr = 0.5}});
            CosineAnnealingLR(sgd, 8).lr_at(-1, 1);
        }),
        hostile::expect<ValueError>("CapturedStep of an empty step function", {"CapturedStep", "step function is empty"},
                                    [] { cuda::CapturedStep(cuda::CapturedStep::StepFn{}); }),
        hostile::expect<ValueError>("CapturedStep of a null step function with guard options",
                                    {"CapturedStep", "empty"}, [] {
            cuda::CapturedStep(nullptr, {.guard_replays = 1, .guard_state = [] {
                                             return std::vector<std::pair<std::string, Tensor>>{};
                                         }});
        }),
        hostile::expect<ValueError>("rethrow_with_context outside a catch block",
                                    {"rethrow_with_context", "no exception is being handled"},
                                    [] { rethrow_with_context("loading"); }),
        hostile::expect<ValueError>("rethrow_with_context after the catch block has ended",
                                    {"rethrow_with_context", "step 2"}, [] {
            try {
                throw ShapeError("handled");
            } catch (const ShapeError&) {
            }
            rethrow_with_context("step 2");
        }),
        hostile::expect<DistributedError>("rethrow_with_context of a DistributedError keeps its type",
                                          {"epoch 1: ", "all_reduce timed out"}, [] {
            try {
                throw DistributedError("all_reduce timed out");
            } catch (...) {
                rethrow_with_context("epoch 1");
            }
        }),
    });

}  // namespace
