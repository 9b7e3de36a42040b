// The GPU halves of the optimizers, schedules, clipping and loss scaling (nn/optim_internal.h)
// in a build without CUDA, so that their callers need no #if: no tensor can live on a
// GPU there, so none of these is reached; each throws DeviceError if one were. Replaced by nn/optim.cu
// and nn/clip.cu in a CUDA build (CMakeLists.txt).
#include "dyngrad/core/error.h"
#include "dyngrad/nn/optim_internal.h"

namespace dyngrad::cuda {

StepTable::StepTable(int device) : device_(device), copied_{StreamEvent(device), StreamEvent(device)} {}
StepTable::~StepTable() = default;
const StepChunk* StepTable::upload(const std::vector<StepChunk>&) { throw_not_built("the optimizer's step table"); }
bool sgd_step(StepTable&, std::span<const StepOperands>, const StepState&) { throw_not_built("SGD on a GPU"); }
bool adam_step(StepTable&, std::span<const StepOperands>, const StepState&) { throw_not_built("Adam on a GPU"); }
void refuse_in_capture(int, const char*, const char*) {}  // nothing is captured without CUDA
void apply_schedule(int, const StepState&) { throw_not_built("a schedule on a GPU"); }
void next_lrs(int, const StepState&, double*) { throw_not_built("a schedule on a GPU"); }
void clip_norm(int, std::span<const GradOperand>, double, double, double, Tensor&, Tensor*) {
    throw_not_built("clip_grad_norm on a GPU");
}
void clip_value(int, std::span<const GradOperand>, double) { throw_not_built("clip_grad_value on a GPU"); }
void scaler_check(int, std::span<const GradOperand>, const float*, float*, float*, bool) {
    throw_not_built("GradScaler on a GPU");
}
void scaler_update(int, const ScalerRule&, float*, long long*, long long*, const float*) {
    throw_not_built("GradScaler on a GPU");
}

}  // namespace dyngrad::cuda
