// Optimizers over a list of Parameters, and learning-rate schedules.
// CPU: nn/optim.cpp (Eigen). GPU: nn/optim.cu (fused multi-tensor kernels, nn/optim_kernels.h).
//
//   SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
//   for each batch: opt.zero_grad(); graph.backward(loss); opt.step(); graph.clear();
//
// The update rules are PyTorch's (torch.optim.SGD / Adam / AdamW with their default flags).
// step() skips parameters without a gradient. State (momentum buffers, Adam moments) is created on
// the first step that updates a parameter, on that parameter's device, and follows the parameter if
// it moves. On a GPU one step over all parameters of one dtype is one fused kernel launch (a few when
// parameters differ in Adam step counts), with no device synchronisation.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dyngrad/graph/graph.h"

namespace dyngrad {

class Optimizer {
public:
    virtual ~Optimizer();
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    // Updates every parameter that has a gradient, in place.
    virtual void step() = 0;
    // Drops every parameter's gradient (the next backward starts from zero).
    void zero_grad();

    double lr() const { return lr_; }
    void set_lr(double lr);  // ValueError when negative, NaN or infinite
    const std::vector<Parameter>& parameters() const { return parameters_; }

protected:
    // ValueError for an undefined or repeated parameter.
    Optimizer(std::vector<Parameter> parameters, double lr);
    // Indices of the parameters that have a gradient; ValueError when one does not match its parameter.
    std::vector<std::size_t> with_grad() const;
    // Internal: the per-device tables of the fused GPU steps (nn/optim.cpp).
    struct DeviceTables;

    std::vector<Parameter> parameters_;
    double lr_;
    std::unique_ptr<DeviceTables> tables_;
};

struct SgdOptions {
    double lr = 0.01;
    double momentum = 0.0;
    bool nesterov = false;  // needs momentum > 0
    double weight_decay = 0.0;  // L2: added to the gradient as weight_decay · param
};

// g = grad + wd·p;  with momentum: buf = momentum·buf + g;  g = nesterov ? g + momentum·buf : buf;
// p -= lr·g.  (Dampening is 0; the first buf is g, as in PyTorch.)
class SGD : public Optimizer {
public:
    SGD(std::vector<Parameter> parameters, const SgdOptions& options = {});
    void step() override;
    const SgdOptions& options() const { return options_; }
    // Parameter i's momentum buffer: undefined until its first update with momentum (IndexError past the end).
    const Tensor& momentum_buffer(std::size_t i) const;

private:
    SgdOptions options_;
    std::vector<Tensor> momentum_buffers_;  // one per parameter; undefined until its first update
};

struct AdamOptions {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;  // Adam: L2 added to the gradient; AdamW: decoupled, p *= 1 - lr·wd
};

// t = this parameter's step count (from 1); g = grad (+ wd·p for Adam);
// m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;
// p -= lr / (1-β1^t) · m / (√v / √(1-β2^t) + eps).
class Adam : public Optimizer {
public:
    Adam(std::vector<Parameter> parameters, const AdamOptions& options = {});
    void step() override;
    const AdamOptions& options() const { return options_; }
    // Parameter i's state: the moments m and v (undefined until its first update) and how many updates it
    // had, which sets its bias corrections (IndexError past the end).
    const Tensor& exp_avg(std::size_t i) const;
    const Tensor& exp_avg_sq(std::size_t i) const;
    std::int64_t step_count(std::size_t i) const;

protected:
    Adam(std::vector<Parameter> parameters, const AdamOptions& options, bool decoupled_weight_decay);

private:
    AdamOptions options_;
    bool decoupled_;
    std::vector<Tensor> exp_avg_;     // m, one per parameter
    std::vector<Tensor> exp_avg_sq_;  // v
    std::vector<std::int64_t> steps_;
};

// Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr·wd before the Adam update.
// PyTorch's default weight_decay for AdamW is 0.01; pass it explicitly.
class AdamW : public Adam {
public:
    AdamW(std::vector<Parameter> parameters, const AdamOptions& options = {});
};

// ---- learning-rate schedules: call step() once per epoch, after that epoch's optimizer steps ----
// Both record the optimizer's lr at construction as the base lr and set the optimizer's lr for the
// next epoch; lr_at(epoch) is the closed form (epoch 0: the base lr).

// lr = base · gamma^floor(epoch / step_size)
class StepLR {
public:
    StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);
    void step();
    double lr_at(std::int64_t epoch) const;
    std::int64_t epoch() const { return epoch_; }

private:
    Optimizer& optimizer_;
    std::int64_t step_size_;
    double gamma_;
    double base_lr_;
    std::int64_t epoch_ = 0;
};

// lr = eta_min + (base − eta_min) · (1 + cos(π · epoch / T_max)) / 2   (a cosine period of 2·T_max)
class CosineAnnealingLR {
public:
    CosineAnnealingLR(Optimizer& optimizer, std::int64_t t_max, double eta_min = 0.0);
    void step();
    double lr_at(std::int64_t epoch) const;
    std::int64_t epoch() const { return epoch_; }

private:
    Optimizer& optimizer_;
    std::int64_t t_max_;
    double eta_min_;
    double base_lr_;
    std::int64_t epoch_ = 0;
};

}  // namespace dyngrad
