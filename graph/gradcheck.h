// Checks an op (a row of the op table) on one of its cases:
//  - finite_difference: float64 analytic gradients vs central differences (CPU);
//  - float32_vs_float64: the float32 CPU forward and gradients vs the float64 ones.
// Shared by the tests and dyngrad-verify; usable on user-defined graphs' ops as well.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

struct CheckResult {
    std::string op;
    std::string case_label;
    std::string shapes;  // "(3,4) (4)"
    std::string check;   // "finite_diff", "f32_vs_f64", "gpu_vs_cpu"
    double max_rel_err = 0;  // worst relative-norm error over the output and every gradient
    double max_abs_err = 0;
    double tolerance = 0;
    bool pass = false;
    std::string detail;  // which tensor was worst, or why the check failed
    double gpu_ms = 0;   // gpu_vs_cpu only: forward+backward on the GPU
    double cpu_ms = 0;   // gpu_vs_cpu only: forward+backward of the float64 CPU replay
};

// Error measures. relative_norm_error = ‖a − b‖ / max(‖b‖, tiny); NaN or Inf anywhere → +inf.
double relative_norm_error(const Tensor& actual, const Tensor& reference);
double max_abs_error(const Tensor& actual, const Tensor& reference);

// Fresh random inputs for a case in `dtype` (labels stay int64), following its InputDomains.
// A reproducible seed for random inputs keyed by a name: base XOR the FNV-1a hash of `name` (the same on
// every platform, unlike std::hash). Seeding by op name instead of table position lets a new OpType sit
// with its family in the enum without changing any other op's inputs.
std::uint64_t seed_for_name(std::uint64_t base, std::string_view name);

std::vector<Tensor> make_case_inputs(const OpCase& op_case, DType dtype, Generator& gen,
                                     Device device = Device::cpu());

// Output and gradients of one op applied to `inputs`, back-propagating `grad_output`
// (grads[i] is undefined for inputs that are not float; all are, with no backward, when the output requires no
// grad: a non-differentiable op such as argmax, or no input checked).
struct OpRun {
    Tensor output;
    std::vector<Tensor> grads;
};
// Inputs whose gradient is checked: float inputs whose domain is not Labels, Constant, Indices or Mask.
bool gradient_checked(const OpCase& op_case, std::size_t input, const Tensor& value);
OpRun run_op(const OpDef& def, const OpCase& op_case, const std::vector<Tensor>& inputs, const Tensor& grad_output);

CheckResult finite_difference_check(const OpDef& def, const OpCase& op_case, Generator& gen,
                                    double tolerance = 1e-6);
CheckResult float32_check(const OpDef& def, const OpCase& op_case, Generator& gen, double tolerance = 1e-5);

// higher_order_check (gradgradcheck and beyond), float64 on the CPU: for order k >= 2, the directional derivative
// F = <∇(…<∇<y, w>, v1>…), v_{k-2}> built with create_graph (graph/higher_order.h) for random w, v, differentiated
// once more by the engine (the k-th order gradient) and by central differences of F. Check "second_order",
// "third_order" or "order_<k>". Every float input whose domain is checked (gradient_checked) is differentiated:
// element by element up to 32 elements, along 16 random unit directions beyond (the projections compared).
CheckResult higher_order_check(const OpDef& def, const OpCase& op_case, Generator& gen, int order,
                               double tolerance = 1e-5);
// gpu_second_order: the engine's second-order gradient (of F = <∇<y, w>, v>) of the float32 graph on `device`
// against the float64 CPU one from the same inputs, w and v (rounded through float32): the device's kernels run the
// recorded backward's ops. Meant for a CUDA device (dyngrad-verify's gpu_second_order column).
CheckResult gpu_second_order_check(const OpDef& def, const OpCase& op_case, Generator& gen, double tolerance,
                                   Device device);

// The unit roundoff of a floating dtype, 2^-(mantissa bits + 1): bf16 2^-8, f16 2^-11, f32 2^-24, f64 2^-53.
double unit_roundoff(DType dtype);
// The tolerance of the reduced-precision checks: a few unit roundoffs of `dtype` (the output rounded once, the
// backward reading the rounded output and output gradient), times the conditioning of the case's op
// (reduced_precision_conditioning).
double reduced_precision_tolerance(const OpDef& def, DType dtype);
// reduced_precision check: the op in `dtype` (bf16/f16) on `device` against the float64 CPU run from the same
// rounded inputs (and the same rounded output gradient); output and every gradient, relative-norm errors. On the
// CPU this checks the engine's path through f32, on a GPU the native kernels (or that path where there are none).
CheckResult reduced_precision_check(const OpDef& def, const OpCase& op_case, Generator& gen, DType dtype,
                                    double tolerance, Device device = Device::cpu());

}  // namespace dyngrad
