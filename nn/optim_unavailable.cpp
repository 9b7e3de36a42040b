// The GPU halves of the optimizers, schedules, clipping and loss scaling (nn/optim_internal.h)
// in a build without CUDA, so that their callers need no #if: no tensor can live on a
// GPU there, so none of these is reached; each throws DeviceError if one were. Replaced by nn/optim.cu
// and nn/clip.cu in a CUDA build (CMakeLists.txt).
#include "dyngrad/core/error.h"
#include "dyngrad/nn/optim_internal.h"

namespace dyngrad::cuda {

namespace {
[[noreturn]] void unavailable(const char* what) { throw_not_built(what, kNoCudaBackend); }
}  // namespace

StepTable::StepTable(int device) : device_(device), copied_{StreamEvent(device), StreamEvent(device)} {}
StepTable::~StepTable() = default;
const StepChunk* StepTable::upload(const std::vector<StepChunk>&) { unavailable("the optimizer's step table"); }
bool sgd_step(StepTable&, std::span<const StepOperands>, const StepState&) { unavailable("SGD on a GPU"); }
bool adam_step(StepTable&, std::span<const StepOperands>, const StepState&) { unavailable("Adam on a GPU"); }
void refuse_in_capture(int, const char*, const char*) {}  // nothing is captured without CUDA
void apply_schedule(int, const StepState&) { unavailable("a schedule on a GPU"); }
void next_lrs(int, const StepState&, double*) { unavailable("a schedule on a GPU"); }
void clip_norm(int, std::span<const GradOperand>, double, double, double, Tensor&, Tensor*) {
    unavailable("clip_grad_norm on a GPU");
}
void clip_value(int, std::span<const GradOperand>, double) { unavailable("clip_grad_value on a GPU"); }
void scaler_check(int, std::span<const GradOperand>, const float*, float*, float*, bool) {
    unavailable("GradScaler on a GPU");
}
void scaler_update(int, const ScalerRule&, float*, long long*, long long*, const float*) {
    unavailable("GradScaler on a GPU");
}

}  // namespace dyngrad::cuda
