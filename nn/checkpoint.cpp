// Checkpoints (nn/optim.h): the model, optimizer, schedule and loss scaler in one safetensors file; the optimizer's
// and the loss scaler's save_state / stage_state; and the entry readers and checks those and the schedules'
// stage_state share (nn/optim_internal.h).
#include <array>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/optim_internal.h"

namespace dyngrad {

// ---- shared by the optimizers and schedules (nn/optim_internal.h) ----

namespace optim_detail {

void check_non_negative(const std::string& who, const char* what, double value) {
    if (!(value >= 0) || !std::isfinite(value))
        throw ValueError(str(who, ": ", what, " must be finite and non-negative, got ", value));
}

const Tensor& entry(const TensorMap& tensors, const std::string& key, DType dtype, const Shape& shape,
                    const std::string& source) {
    const auto found = tensors.find(key);
    if (found == tensors.end()) throw IoError(str("checkpoint '", source, "' has no tensor '", key, "'"));
    const Tensor& t = found->second;
    if (t.dtype() != dtype)
        throw DTypeError(str("checkpoint '", source, "': tensor '", key, "' is ", dtype_name(t.dtype()), ", expected ",
                             dtype_name(dtype)));
    if (t.shape() != shape)
        throw ShapeError(str("checkpoint '", source, "': tensor '", key, "' has shape ", to_string(t.shape()),
                             ", expected ", to_string(shape)));
    return t;
}

void check_group_count(const TensorMap& tensors, const std::string& key, std::int64_t groups, const std::string& what,
                       const std::string& source) {
    const auto found = tensors.find(key);
    if (found == tensors.end() || found->second.rank() != 1) return;  // entry() names what is wrong with it
    const std::int64_t saved = found->second.shape()[0];
    if (saved != groups)
        throw ValueError(str("checkpoint '", source, "': tensor '", key, "' holds ", saved, " ", what, " there and ",
                             groups, " here (another group layout)"));
}

void check_no_extra(const TensorMap& tensors, const std::string& prefix, const std::set<std::string>& used,
                    const std::string& source) {
    for (const auto& [key, value] : tensors)
        if (key.starts_with(prefix) && !used.contains(key))
            throw IoError(str("checkpoint '", source, "' has tensor '", key,
                              "' that this optimizer or schedule does not have"));
}

void check_type_entry(const SafetensorsMetadata& metadata, const char* key, const char* what, const char* expected,
                      const std::string& source) {
    const auto found = metadata.find(key);
    if (found == metadata.end())
        throw IoError(str("checkpoint '", source, "' holds no ", what, " state (no metadata '", key, "')"));
    if (found->second != expected)
        throw ValueError(str("checkpoint '", source, "' holds the state of a ", found->second, " ", what, ", not of ",
                             expected));
}

}  // namespace optim_detail

// ---- the optimizer's and the loss scaler's checkpoint state ----

namespace {

using optim_detail::check_group_count;
using optim_detail::check_no_extra;
using optim_detail::check_non_negative;
using optim_detail::check_type_entry;
using optim_detail::entry;

constexpr const char* kOptimizerPrefix = "@optimizer.";
constexpr const char* kOptimizerType = "dyngrad.optimizer";
// Columns of "@optimizer.settings", one row per group.
constexpr std::int64_t kSettingColumns = 7;

std::vector<double> settings_row(const GroupSettings& s) {
    return {s.lr, s.weight_decay, s.momentum, s.nesterov ? 1.0 : 0.0, s.beta1, s.beta2, s.eps};
}

GroupSettings settings_from_row(const double* row) {
    return {.lr = row[0], .weight_decay = row[1], .momentum = row[2], .nesterov = row[3] != 0,
            .beta1 = row[4], .beta2 = row[5], .eps = row[6]};
}


constexpr const char* kScalerPrefix = "@scaler.";
constexpr const char* kScalerType = "dyngrad.scaler";

// The one-element entry `key` of a checkpoint as a double (IoError when missing, DTypeError/ShapeError when
// it is not one element of `dtype`).
double scalar_entry(const TensorMap& tensors, const std::string& key, DType dtype, const std::string& source) {
    const auto found = tensors.find(key);
    if (found == tensors.end()) throw IoError(str("checkpoint '", source, "' has no tensor '", key, "'"));
    if (found->second.dtype() != dtype)
        throw DTypeError(str("checkpoint '", source, "': tensor '", key, "' is ", dtype_name(found->second.dtype()),
                             ", expected ", dtype_name(dtype)));
    if (found->second.numel() != 1)
        throw ShapeError(str("checkpoint '", source, "': tensor '", key, "' has shape ",
                             to_string(found->second.shape()), ", expected one element"));
    return found->second.item();
}

}  // namespace

void Optimizer::save_state(TensorMap& tensors, SafetensorsMetadata& metadata) const {
    pull_device_scalars();
    const auto groups = static_cast<std::int64_t>(groups_.size());
    std::vector<std::int64_t> sizes;
    std::vector<double> rows;
    for (const Group& group : groups_) {
        sizes.push_back(static_cast<std::int64_t>(group.end - group.begin));
        const std::vector<double> row = settings_row(group.settings);
        rows.insert(rows.end(), row.begin(), row.end());
    }
    const std::string prefix = kOptimizerPrefix;
    metadata[kOptimizerType] = name();
    tensors[prefix + "group_sizes"] = Tensor::from_vector(sizes, {groups});
    tensors[prefix + "settings"] = Tensor::from_vector(rows, {groups, kSettingColumns}, DType::f64);
    tensors[prefix + "steps"] = Tensor::from_vector(steps_, {static_cast<std::int64_t>(steps_.size())});
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        if (steps_[i] == 0) continue;
        const std::vector<const char*> names = state_names(groups_[group_of_[i]].settings);
        for (std::size_t k = 0; k < names.size(); ++k)
            if (state_[i][k].defined()) tensors[str(prefix, "state.", i, ".", names[k])] = state_[i][k];
    }
}

std::function<void()> Optimizer::stage_state(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                                             const std::string& source) {
    check_type_entry(metadata, kOptimizerType, "optimizer", name(), source);
    const std::string prefix = kOptimizerPrefix;
    std::set<std::string> used;
    const auto read = [&](const std::string& key, DType dtype, const Shape& shape) -> const Tensor& {
        used.insert(key);
        return entry(tensors, key, dtype, shape, source);
    };
    const auto groups = static_cast<std::int64_t>(groups_.size());
    // Another number of groups is another group layout (ValueError, as other group sizes), not a bad tensor.
    check_group_count(tensors, prefix + "group_sizes", groups, str(name(), " parameter groups"), source);
    const Tensor& sizes = read(prefix + "group_sizes", DType::i64, {groups});
    for (std::size_t g = 0; g < groups_.size(); ++g) {
        const std::int64_t saved = sizes.data<std::int64_t>()[g];
        const auto here = static_cast<std::int64_t>(groups_[g].end - groups_[g].begin);
        if (saved != here)
            throw ValueError(str("checkpoint '", source, "': ", name(), " parameter group ", g, " holds ", saved,
                                 " parameters there and ", here, " here"));
    }
    std::vector<Group> new_groups = groups_;
    const Tensor& rows = read(prefix + "settings", DType::f64, {groups, kSettingColumns});
    for (std::size_t g = 0; g < groups_.size(); ++g) {
        new_groups[g].settings = settings_from_row(rows.data<double>() + g * kSettingColumns);
        check_non_negative(str("checkpoint '", source, "': ", group_name(g)), "lr", new_groups[g].settings.lr);
        check_settings(new_groups[g].settings, str("checkpoint '", source, "': ", group_name(g)));
    }
    const Tensor& steps = read(prefix + "steps", DType::i64, {static_cast<std::int64_t>(parameters_.size())});
    std::vector<std::int64_t> new_steps(steps.data<std::int64_t>(), steps.data<std::int64_t>() + steps.numel());
    std::vector<std::array<Tensor, 2>> new_state(parameters_.size());
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        if (new_steps[i] < 0)
            throw ValueError(str("checkpoint '", source, "': parameter ", i, " has step count ", new_steps[i]));
        if (new_steps[i] == 0) continue;
        const Tensor& value = parameters_[i].value();
        const std::vector<const char*> names = state_names(new_groups[group_of_[i]].settings);
        for (std::size_t k = 0; k < names.size(); ++k) {
            const std::string key = str(prefix, "state.", i, ".", names[k]);
            used.insert(key);
            const auto found = tensors.find(key);
            if (found == tensors.end())
                throw IoError(str("checkpoint '", source, "' has no tensor '", key, "' (state of parameter '",
                                  parameters_[i].name(), "', updated ", new_steps[i], " times)"));
            if (found->second.shape() != value.shape())
                throw ShapeError(str("checkpoint '", source, "': tensor '", key, "' has shape ",
                                     to_string(found->second.shape()), ", parameter '", parameters_[i].name(), "' ",
                                     to_string(value.shape())));
            if (!is_floating(found->second.dtype()))
                throw DTypeError(str("checkpoint '", source, "': tensor '", key, "' is ",
                                     dtype_name(found->second.dtype()), ", optimizer state must be floating"));
            new_state[i][k] = found->second.to(value.dtype()).to(value.device()).clone();
        }
    }
    check_no_extra(tensors, prefix, used, source);
    return [this, new_groups = std::move(new_groups), new_steps = std::move(new_steps),
            new_state = std::move(new_state)]() mutable {
        groups_ = std::move(new_groups);
        steps_ = std::move(new_steps);
        state_ = std::move(new_state);
        // The device scalars keep their addresses (a captured step reads them) and take the loaded values.
        std::vector<double> lrs;
        for (const Group& group : groups_) lrs.push_back(group.settings.lr);
        for (auto& [device, on] : tables_->by_device) {
            // Under a deferred schedule advance the loaded lrs are overrides, as set_lr's (the schedule's own
            // checkpoint entry puts its epoch back).
            Tensor& target = on.deferred.count > 0 ? on.lr_overrides : on.lrs;
            target.copy_from(Tensor::from_vector(lrs, {static_cast<std::int64_t>(lrs.size())}, DType::f64));
            on.steps.copy_from(Tensor::from_vector(steps_, {static_cast<std::int64_t>(steps_.size())}));
        }
    };
}

void Optimizer::load_state(const TensorMap& tensors, const SafetensorsMetadata& metadata, const std::string& source) {
    stage_state(tensors, metadata, source)();
}

void GradScaler::save_state(TensorMap& tensors, SafetensorsMetadata& metadata) const {
    const std::string prefix = kScalerPrefix;
    metadata[kScalerType] = "GradScaler";
    tensors[prefix + "scale"] = Tensor::full({1}, scale_value(), DType::f64);
    tensors[prefix + "growth_tracker"] = Tensor::from_vector(std::vector<std::int64_t>{growth_tracker()}, {1});
    tensors[prefix + "skips"] = Tensor::from_vector(std::vector<std::int64_t>{consecutive_skips()}, {1});
}

std::function<void()> GradScaler::stage_state(const TensorMap& tensors, const SafetensorsMetadata& metadata,
                                              const std::string& source) {
    if (scaled_ || unscaled_)
        throw ValueError(str("checkpoint '", source, "': GradScaler state loaded between scale() and step(); the "
                             "pending gradients were scaled by the current scale: load it before scale() or after step()"));
    if (!metadata.contains(kScalerType))
        throw IoError(str("checkpoint '", source, "' holds no GradScaler state (no metadata '", kScalerType, "')"));
    const std::string prefix = kScalerPrefix;
    const double scale = scalar_entry(tensors, prefix + "scale", DType::f64, source);
    const double tracker = scalar_entry(tensors, prefix + "growth_tracker", DType::i64, source);
    const double skips = scalar_entry(tensors, prefix + "skips", DType::i64, source);
    if (!(scale > 0) || !std::isfinite(scale))
        throw ValueError(str("checkpoint '", source, "': GradScaler scale ", scale, " is not positive and finite"));
    if (tracker < 0 || skips < 0)
        throw ValueError(str("checkpoint '", source, "': GradScaler growth tracker ", tracker, " or skips ", skips,
                             " is negative"));
    for (const auto& [key, value] : tensors)
        if (key.starts_with(prefix) && key != prefix + "scale" && key != prefix + "growth_tracker" &&
            key != prefix + "skips")
            throw IoError(str("checkpoint '", source, "' has tensor '", key, "' that GradScaler does not have"));
    return [this, scale, tracker, skips] {
        // In place: a captured step reads these addresses.
        scale_.copy_from(Tensor::full({}, scale, DType::f32));
        inv_scale_.copy_from(Tensor::full({}, 1.0 / scale, DType::f32));
        tracker_.copy_from(Tensor::full({}, tracker, DType::i64));
        skips_.copy_from(Tensor::full({}, skips, DType::i64));
    };
}

void GradScaler::load_state(const TensorMap& tensors, const SafetensorsMetadata& metadata, const std::string& source) {
    stage_state(tensors, metadata, source)();
}

void save_checkpoint(const std::filesystem::path& path, const Module& model, const Optimizer& optimizer,
                     const LRScheduler* schedule, const GradScaler* scaler) {
    if (schedule != nullptr && &schedule->optimizer() != &optimizer)
        throw ValueError(str("save_checkpoint: the ", schedule->name(), " schedule drives another optimizer than the ",
                             optimizer.name(), " given"));
    TensorMap tensors = named_tensors(model);
    SafetensorsMetadata metadata;
    optimizer.save_state(tensors, metadata);
    if (schedule != nullptr) schedule->save_state(tensors, metadata);
    if (scaler != nullptr) scaler->save_state(tensors, metadata);
    save_safetensors(path, tensors, metadata);
}

void load_checkpoint(const std::filesystem::path& path, Module& model, Optimizer& optimizer, LRScheduler* schedule,
                     GradScaler* scaler) {
    if (schedule != nullptr && &schedule->optimizer() != &optimizer)
        throw ValueError(str("load_checkpoint: the ", schedule->name(), " schedule drives another optimizer than the ",
                             optimizer.name(), " given"));
    SafetensorsMetadata metadata;
    const TensorMap tensors = load_safetensors(path, &metadata);
    const std::string source = path.string();
    // Optimizer and schedule are checked first, the model is checked and written, then the rest is applied.
    const std::function<void()> apply_optimizer = optimizer.stage_state(tensors, metadata, source);
    const std::function<void()> apply_schedule =
        schedule != nullptr ? schedule->stage_state(tensors, metadata, source) : std::function<void()>([] {});
    const std::function<void()> apply_scaler =
        scaler != nullptr ? scaler->stage_state(tensors, metadata, source) : std::function<void()>([] {});
    load_parameters(model, tensors, source);
    apply_optimizer();
    apply_schedule();
    apply_scaler();
}

}  // namespace dyngrad
