// Checkpoints (nn/optim.h): the model, optimizer, schedule and loss scaler in one safetensors file, and the
// entry readers and checks the optimizers' and schedules' stage_state share (nn/optim_internal.h).
#include <cmath>
#include <functional>

#include "dyngrad/nn/amp.h"
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

// ---- checkpoints ----

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
