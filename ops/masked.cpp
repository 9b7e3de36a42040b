#include "dyngrad/ops/masked.h"

#include <vector>

#include "dyngrad/core/error.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/indexing.h"
#include "dyngrad/ops/layout.h"

namespace dyngrad {

Tensor mask_positions(const Shape& x_shape, const Tensor& mask, const char* who) {
    if (!mask.defined()) throw ValueError(str(who, ": the mask is undefined"));
    const std::size_t k = mask.rank();
    bool fits = k <= x_shape.size();
    for (std::size_t i = 0; fits && i < k; ++i) fits = mask.shape()[i] == x_shape[i];
    if (!fits)
        throw ShapeError(str(who, ": the mask's shape ", to_string(mask.shape()), " does not match the indexed tensor's shape ",
                             to_string(x_shape), " (a mask covers the leading dims of the tensor, as in PyTorch)"));
    if (!mask.device().is_cpu() && cuda::capturing(mask.device().index))
        throw GraphError(str(who, ": the number of selected elements is read on the host (a device synchronisation), "
                             "which a captured CUDA step cannot do; use where() or masked_fill() inside the step"));
    const std::vector<double> values = mask.to_vector();  // the count is data-dependent: a sync on a device
    std::vector<std::int64_t> picks;
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (values[i] != 0.0 && values[i] != 1.0)
            throw ValueError(str(who, ": a mask holds only 0 and 1 (a comparison's result); element ", i, " is ",
                                 values[i]));
        if (values[i] != 0.0) picks.push_back(static_cast<std::int64_t>(i));
    }
    const auto count = static_cast<std::int64_t>(picks.size());
    return Tensor::from_vector(picks, {count}, mask.device());
}

namespace {
// x viewed as (rows of the mask's numel, the trailing dims...).
Shape rows_shape(const Shape& x_shape, std::size_t k) {
    std::int64_t rows = 1;
    for (std::size_t i = 0; i < k; ++i) rows *= x_shape[i];
    Shape out{rows};
    for (std::size_t i = k; i < x_shape.size(); ++i) out.push_back(x_shape[i]);
    return out;
}
}  // namespace

template <Operand T>
T masked_select(const T& x, const Tensor& mask, Loc where) {
    const Tensor& value = value_of(x);
    const Tensor positions = mask_positions(value.shape(), mask, "masked_select");
    const T rows = reshape(x, rows_shape(value.shape(), mask.rank()), where);
    return index_select(rows, 0, as_operand(positions.to(value.device()), x, where), where);
}
template Var masked_select(const Var&, const Tensor&, Loc);
template Tensor masked_select(const Tensor&, const Tensor&, Loc);

// ---- Tensor's in-place arithmetic: the eager op, then its result written into this storage (copy_from,
// which bumps the version: a recorded backward that still needs the old values throws GraphError). ----
namespace {
void write_result(Tensor& self, const Tensor& result, const char* who) {
    if (result.shape() != self.shape())
        throw ShapeError(str(who, ": the result's shape ", to_string(result.shape()), " does not match the tensor's ",
                             to_string(self.shape()), " (an in-place op broadcasts the other operand only)"));
    self.copy_from(result.dtype() == self.dtype() ? result : result.to(self.dtype()));
}
// The other operand in this tensor's dtype: the elementwise ops want one dtype, and PyTorch casts an
// in-place result back to self's dtype anyway.
Tensor as_dtype(const Tensor& other, DType dtype) { return other.dtype() == dtype ? other : other.to(dtype); }
}  // namespace

Tensor& Tensor::add_(const Tensor& other, double alpha) {
    const Tensor b = as_dtype(other, dtype_);
    write_result(*this, add(*this, alpha == 1.0 ? b : mul_scalar(b, alpha)), "add_");
    return *this;
}
Tensor& Tensor::sub_(const Tensor& other, double alpha) { return add_(other, -alpha); }
Tensor& Tensor::mul_(const Tensor& other) {
    write_result(*this, mul(*this, as_dtype(other, dtype_)), "mul_");
    return *this;
}
Tensor& Tensor::div_(const Tensor& other) {
    write_result(*this, div(*this, as_dtype(other, dtype_)), "div_");
    return *this;
}
Tensor& Tensor::add_(double value) {
    write_result(*this, add_scalar(*this, value), "add_");
    return *this;
}
Tensor& Tensor::mul_(double value) {
    write_result(*this, mul_scalar(*this, value), "mul_");
    return *this;
}
Tensor& Tensor::clamp_(std::optional<double> min, std::optional<double> max) {
    write_result(*this, clamp(*this, min, max), "clamp_");
    return *this;
}
Tensor& Tensor::zero_() {
    fill(0.0);
    return *this;
}
Tensor& Tensor::masked_fill_(const Tensor& mask, double value) {
    write_result(*this, masked_fill(*this, as_dtype(mask, dtype_), value), "masked_fill_");
    return *this;
}

}  // namespace dyngrad
