// The cases of the op table's rows (declared in ops/op_cases.h): per op, the shapes, attributes and input
// domains every check runs it on. A case's comment says why its values are where they are (kinks, ties, domains).
// Over 600 lines: every row's cases in one file, found by the op's name, as the table's rows are in one.
#include "dyngrad/ops/op_cases.h"

#include <array>
#include <optional>

#include "dyngrad/ops/rnn.h"

namespace dyngrad::op_cases {

using D = InputDomain;

OpAttrs scalar_attr(double s) { return {.scalar = s}; }
OpAttrs axes_attr(std::vector<std::int64_t> axes, bool keepdim) {
    return {.axes = std::move(axes), .keepdim = keepdim};
}
OpAttrs axis_attr(std::int64_t axis, bool keepdim = false) { return {.axis = axis, .keepdim = keepdim}; }
OpAttrs shape_attr(Shape shape) { return {.shape = std::move(shape)}; }

std::vector<OpCase> no_cases() { return {}; }
std::vector<OpCase> cross_entropy_options_cases();

std::vector<OpCase> binary_cases() {
    return {
        {"same shape", {{3, 4}, {3, 4}}, {}, {D::Any, D::Positive}},
        {"row broadcast", {{5, 3}, {3}}, {}, {D::Any, D::Positive}},
        {"column broadcast", {{4, 1}, {1, 6}}, {}, {D::Any, D::Positive}},
        {"channel bias NCHW", {{2, 3, 4, 5}, {1, 3, 1, 1}}, {}, {D::Any, D::Positive}},
        {"scalar operand", {{7}, {}}, {}, {D::Any, D::Positive}},
        {"odd sizes", {{1, 13}, {11, 1}}, {}, {D::Any, D::Positive}},
    };
}

// Not differentiable: every input Constant (no gradient checked; the output is compared everywhere).
std::vector<OpCase> compare_cases() {
    const std::vector<D> no_grad = {D::Constant, D::Constant};
    return {
        {"same shape", {{3, 4}, {3, 4}}, {}, no_grad},
        {"row broadcast", {{5, 3}, {3}}, {}, no_grad},
        {"column broadcast", {{4, 1}, {1, 6}}, {}, no_grad},
        {"scalar operand", {{7}, {}}, {}, no_grad},
    };
}

std::vector<OpCase> unary_cases(D domain, OpAttrs attrs = {}) {
    return {
        {"vector", {{17}}, attrs, {domain}},
        {"matrix", {{4, 9}}, attrs, {domain}},
        {"NCHW", {{2, 3, 4, 5}}, attrs, {domain}},
        {"scalar", {{}}, attrs, {domain}},
    };
}

std::vector<OpCase> neg_cases() { return unary_cases(D::Any); }
std::vector<OpCase> add_scalar_cases() { return unary_cases(D::Any, scalar_attr(2.5)); }
std::vector<OpCase> mul_scalar_cases() { return unary_cases(D::Any, scalar_attr(-1.75)); }
std::vector<OpCase> exp_cases() { return unary_cases(D::Any); }
std::vector<OpCase> positive_cases() { return unary_cases(D::Positive); }
std::vector<OpCase> pow_cases() {
    auto cases = unary_cases(D::Positive, scalar_attr(2.5));
    cases.push_back({"negative exponent", {{3, 5}}, scalar_attr(-1.5), {D::Positive}});
    return cases;
}
std::vector<OpCase> kink_cases() { return unary_cases(D::AwayFromZero); }
// Cases that every check can run: the checks pick the input dtype (f64 finite differences, f32 vs f64, bf16/f16
// through tests/precision/test_reduced_precision.cpp), the target here is float64, exact from every dtype, so the
// finite differences see no rounding. Conversions to bf16/f16/f32 are checked by
// tests/precision/test_reduced_precision.cpp.
std::vector<OpCase> cast_cases() {
    OpAttrs to_f64;
    to_f64.dtype = DType::f64;
    return unary_cases(D::Any, to_f64);
}
std::vector<OpCase> leaky_relu_cases() { return unary_cases(D::AwayFromZero, scalar_attr(0.1)); }
std::vector<OpCase> elu_cases() { return unary_cases(D::AwayFromZero, scalar_attr(1.3)); }
std::vector<OpCase> clipped_relu_cases() { return unary_cases(D::AwayFromZero, scalar_attr(1.1)); }
std::vector<OpCase> smooth_cases() { return unary_cases(D::Any); }

// Random operands never tie; the tie rule (half each) is tested in tests/ops/test_elementwise_norm.cpp.
std::vector<OpCase> min_max_cases() {
    std::vector<OpCase> cases = binary_cases();
    for (OpCase& c : cases) c.domains = {D::Any, D::Any};
    return cases;
}
std::vector<OpCase> clamp_cases() {
    const auto bounds = [](std::optional<double> min, std::optional<double> max) {
        return OpAttrs{.clamp_min = min, .clamp_max = max};
    };
    // One-sided bounds inside (-0.2, 0.2) with |x| >= 0.2: no input near a kink. The two-sided case draws from
    // normal(0, 1): an input lies within the finite-difference step (1e-6) of a bound with probability ~1e-6.
    return {
        {"min only", {{4, 9}}, bounds(-0.1, std::nullopt), {D::AwayFromZero}},
        {"max only", {{2, 3, 4, 5}}, bounds(std::nullopt, 0.1), {D::AwayFromZero}},
        {"min and max", {{17}}, bounds(-0.75, 0.5), {D::Any}},
        {"min and max NCHW", {{2, 3, 4, 5}}, bounds(-0.5, 1.25), {D::Any}},
        {"scalar", {{}}, bounds(-0.1, 0.1), {D::AwayFromZero}},
    };
}
std::vector<OpCase> gelu_cases() {
    OpAttrs tanh_form;
    tanh_form.gelu_approximation = GeluApproximation::Tanh;
    std::vector<OpCase> cases = unary_cases(D::Any);
    for (OpCase c : unary_cases(D::Any, tanh_form)) {
        c.label = "tanh " + c.label;
        cases.push_back(std::move(c));
    }
    return cases;
}

OpAttrs row_norm_attr(Shape normalized_shape, double eps = 1e-5) {
    return {.shape = std::move(normalized_shape), .eps = eps};
}
// Rows of up to 256 vector units take the one-warp-per-row GPU kernel, longer ones one block per row; rows whose
// length is not a multiple of the vector width (4 floats, 2 doubles) take the scalar loads.
std::vector<OpCase> layer_norm_cases() {
    return {
        {"last dim affine", {{4, 10}, {10}, {10}}, row_norm_attr({10}), {}},
        {"last two dims affine", {{2, 3, 4, 5}, {4, 5}, {4, 5}}, row_norm_attr({4, 5}), {}},
        {"weight only", {{3, 8}, {8}}, row_norm_attr({8}), {}},
        {"no affine", {{5, 6}}, row_norm_attr({6}, 1e-3), {}},
        {"one row of one dim", {{7}, {7}, {7}}, row_norm_attr({7}), {}},
        {"long rows affine", {{2, 1280}, {1280}, {1280}}, row_norm_attr({1280}), {}},
        {"long odd rows", {{2, 1031}}, row_norm_attr({1031}), {}},
    };
}
std::vector<OpCase> rms_norm_cases() {
    return {
        {"last dim weight", {{4, 10}, {10}}, row_norm_attr({10}, 1e-6), {}},
        {"last two dims weight", {{2, 3, 4, 5}, {4, 5}}, row_norm_attr({4, 5}), {}},
        {"no weight", {{5, 6}}, row_norm_attr({6}, 1e-3), {}},
        {"long rows weight", {{2, 1280}, {1280}}, row_norm_attr({1280}), {}},
        {"long odd rows", {{2, 1031}}, row_norm_attr({1031}), {}},
    };
}

std::vector<OpCase> matmul_cases() {
    return {
        {"2-D", {{4, 3}, {3, 5}}, {}, {}},
        {"2-D odd", {{1, 7}, {7, 9}}, {}, {}},
        {"batched 3-D", {{3, 4, 5}, {3, 5, 2}}, {}, {}},
    };
}
std::vector<OpCase> linear_cases() {
    OpAttrs relu;
    relu.activation = Activation::Relu;
    // The ReLU cases draw every input from normal(0, 1): pre-activations of about half the outputs are
    // positive, and each lies within the finite-difference step (1e-6) of the kink with probability ~1e-6.
    return {
        {"with bias", {{5, 4}, {3, 4}, {3}}, {}, {}},
        {"batch 1", {{1, 7}, {6, 7}, {6}}, {}, {}},
        {"relu", {{7, 13}, {5, 13}, {5}}, relu, {}},
        {"relu batch 1", {{1, 9}, {11, 9}, {11}}, relu, {}},
    };
}
std::vector<OpCase> transpose_cases() {
    OpAttrs first_last;
    first_last.axes = {0, 2};
    OpAttrs last_two;
    last_two.axes = {-2, -1};
    return {
        {"2-D", {{3, 5}}, last_two, {}},
        {"3-D axes 0,2", {{2, 3, 4}}, first_last, {}},
    };
}
std::vector<OpCase> reshape_cases() {
    return {
        {"flatten NCHW", {{2, 3, 4, 5}}, shape_attr({2, 60}), {}},
        {"inferred dim", {{6, 4}}, shape_attr({3, -1, 2}), {}},
    };
}
std::vector<OpCase> reduce_cases() {
    return {
        {"all", {{3, 4}}, axes_attr({}, false), {}},
        {"axis 0", {{3, 4}}, axes_attr({0}, false), {}},
        {"axis -1 keepdim", {{2, 3, 5}}, axes_attr({-1}, true), {}},
        {"axes 0,2 NCHW", {{2, 3, 4, 5}}, axes_attr({0, 2, 3}, false), {}},
    };
}
std::vector<OpCase> max_cases() {
    return {
        {"axis 1", {{4, 7}}, axis_attr(1), {}},
        {"axis 0 keepdim", {{5, 3}}, axis_attr(0, true), {}},
        {"3-D middle axis", {{2, 6, 3}}, axis_attr(1), {}},
    };
}
std::vector<OpCase> arg_reduce_cases() {  // not differentiable: the int64 index is compared
    return {
        {"axis 1", {{4, 7}}, axis_attr(1), {D::Constant}},
        {"axis 0 keepdim", {{5, 3}}, axis_attr(0, true), {D::Constant}},
        {"3-D middle axis", {{2, 6, 3}}, axis_attr(1), {D::Constant}},
        {"vector", {{9}}, axis_attr(-1), {D::Constant}},
    };
}
std::vector<OpCase> softmax_cases() {
    return {
        {"rows", {{4, 10}}, axis_attr(-1), {}},
        {"axis 0", {{5, 3}}, axis_attr(0), {}},
        {"3-D middle axis", {{2, 7, 3}}, axis_attr(1), {}},
    };
}
std::vector<OpCase> cross_entropy_cases() {
    std::vector<OpCase> cases = {
        {"batch 8, 10 classes", {{8, 10}, {8}}, {}, {D::Any, D::Labels}},
        {"batch 1", {{1, 5}, {1}}, {}, {D::Any, D::Labels}},
    };
    for (OpCase& c : cross_entropy_options_cases()) cases.push_back(std::move(c));
    return cases;
}
OpAttrs loss_attr(Reduction reduction, std::int64_t ignore_index = -100, double label_smoothing = 0.0) {
    return {.reduction = reduction, .ignore_index = ignore_index, .label_smoothing = label_smoothing};
}
std::vector<OpCase> class_loss_weighted_cases() {
    constexpr Reduction mean = Reduction::Mean, sum = Reduction::Sum, none = Reduction::None;
    return {
        // LabelsIgnored sets the labels at rows 1, 5, ... to ignore_index, an in-range class in some cases.
        {"ignored rows, sum", {{8, 10}, {8}}, loss_attr(sum), {D::Any, D::LabelsIgnored}},
        {"ignore_index 3, none", {{6, 4}, {6}}, loss_attr(none, 3), {D::Any, D::LabelsIgnored}},
        {"class weights, ignored, mean", {{7, 5}, {7}, {5}}, loss_attr(mean), {D::Any, D::LabelsIgnored, D::Constant}},
        {"class weights, sum", {{5, 3}, {5}, {3}}, loss_attr(sum), {D::Any, D::Labels, D::Constant}},
    };
}
std::vector<OpCase> cross_entropy_options_cases() {
    constexpr Reduction mean = Reduction::Mean, none = Reduction::None;
    auto cases = class_loss_weighted_cases();
    cases.push_back({"smoothing 0.1, ignored, mean", {{8, 10}, {8}}, loss_attr(mean, -100, 0.1),
                     {D::Any, D::LabelsIgnored}});
    cases.push_back({"smoothing 0.25, weights, ignore 0, mean", {{9, 6}, {9}, {6}}, loss_attr(mean, 0, 0.25),
                     {D::Any, D::LabelsIgnored, D::Constant}});
    cases.push_back({"smoothing 1, weights, none", {{4, 3}, {4}, {3}}, loss_attr(none, -100, 1.0),
                     {D::Any, D::Labels, D::Constant}});
    return cases;
}
// x (N,E), weight (V_padded,E), labels (N): `length` classes of the weight's rows, the rest padding that must not
// count (their gradient is checked to be 0). Labels are drawn in [0, E) (InputDomain::Labels reads input 0's
// second axis), so every case keeps E <= classes.
std::vector<OpCase> linear_cross_entropy_cases() {
    constexpr Reduction mean = Reduction::Mean, sum = Reduction::Sum, none = Reduction::None;
    const auto attrs = [](Reduction reduction, std::int64_t classes, std::int64_t ignore_index = -100,
                          double smoothing = 0.0) {
        OpAttrs a = loss_attr(reduction, ignore_index, smoothing);
        a.length = classes;
        return a;
    };
    return {
        {"mean, 5 of 7 rows", {{6, 4}, {7, 4}, {6}}, attrs(mean, 5), {D::Any, D::Any, D::Labels}},
        {"sum, ignored rows, no padding", {{9, 3}, {4, 3}, {9}}, attrs(sum, 4), {D::Any, D::Any, D::LabelsIgnored}},
        {"none, smoothing 0.2, padded", {{5, 3}, {6, 3}, {5}}, attrs(none, 3, -100, 0.2),
         {D::Any, D::Any, D::Labels}},
        {"ignore_index 2, smoothing 0.1, mean", {{7, 4}, {8, 4}, {7}}, attrs(mean, 6, 2, 0.1),
         {D::Any, D::Any, D::LabelsIgnored}},
    };
}
std::vector<OpCase> nll_loss_cases() {
    auto cases = class_loss_weighted_cases();
    cases.insert(cases.begin(), {"batch 8, 10 classes", {{8, 10}, {8}}, {}, {D::Any, D::Labels}});
    return cases;
}
std::vector<OpCase> bce_with_logits_cases() {
    constexpr Reduction mean = Reduction::Mean, sum = Reduction::Sum, none = Reduction::None;
    // Targets from Positive ([0.5, 2]): the loss is linear in the target, so any value checks its gradient.
    return {
        {"matrix, mean", {{4, 6}, {4, 6}}, loss_attr(mean), {D::Any, D::Positive}},
        {"vector, sum", {{13}, {13}}, loss_attr(sum), {D::Any, D::Positive}},
        {"weight (6), none", {{4, 6}, {4, 6}, {6}}, loss_attr(none), {D::Any, D::Positive, D::Constant}},
        {"weight (4,6), pos_weight (6), mean", {{4, 6}, {4, 6}, {4, 6}, {6}}, loss_attr(mean),
         {D::Any, D::Positive, D::Constant, D::Constant}},
        {"pos_weight (1,5) only, sum", {{3, 5}, {3, 5}, {}, {1, 5}}, loss_attr(sum),
         {D::Any, D::Positive, D::Constant, D::Constant}},
    };
}
OpAttrs beta_attr(Reduction reduction, double beta) {
    OpAttrs a = loss_attr(reduction);
    a.scalar = beta;
    return a;
}
// l1's kink is at prediction = target: with both from normal(0, 1) a difference falls within the
// finite-difference step (1e-6) of 0 with probability ~1e-6 per element, as for the ReLU cases.
// smooth_l1 is C¹ at |d| = beta (both pieces have slope ±1 there), so differences near beta are fine.
std::vector<OpCase> l1_loss_cases() {
    return {
        {"matrix, mean", {{4, 6}, {4, 6}}, loss_attr(Reduction::Mean), {}},
        {"vector, sum", {{13}, {13}}, loss_attr(Reduction::Sum), {}},
        {"NCHW, none", {{2, 3, 2, 2}, {2, 3, 2, 2}}, loss_attr(Reduction::None), {}},
    };
}
std::vector<OpCase> smooth_l1_loss_cases() {
    return {
        {"beta 1, mean", {{4, 6}, {4, 6}}, beta_attr(Reduction::Mean, 1.0), {}},
        {"beta 0.5, sum", {{13}, {13}}, beta_attr(Reduction::Sum, 0.5), {}},
        {"beta 2, none", {{3, 5}, {3, 5}}, beta_attr(Reduction::None, 2.0), {}},
        {"beta 0 (l1), mean", {{4, 5}, {4, 5}}, beta_attr(Reduction::Mean, 0.0), {}},
    };
}
std::vector<OpCase> mse_cases() {
    return {
        {"matrix", {{4, 6}, {4, 6}}, {}, {}},
        {"vector", {{13}, {13}}, {}, {}},
    };
}

OpAttrs conv_attr(std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> padding,
                  std::array<std::int64_t, 2> dilation, std::int64_t groups, Activation activation = Activation::None) {
    return {.stride = stride, .padding = padding, .dilation = dilation, .groups = groups, .activation = activation};
}
std::vector<OpCase> conv2d_cases() {
    constexpr Activation relu = Activation::Relu;
    return {
        {"3x3 pad 1 bias", {{2, 3, 7, 6}, {4, 3, 3, 3}, {4}}, conv_attr({1, 1}, {1, 1}, {1, 1}, 1), {}},
        {"stride 2 no bias", {{2, 2, 9, 8}, {3, 2, 3, 2}}, conv_attr({2, 2}, {0, 0}, {1, 1}, 1), {}},
        {"dilation 2 pad 2", {{1, 2, 9, 9}, {2, 2, 3, 3}, {2}}, conv_attr({1, 1}, {2, 2}, {2, 2}, 1), {}},
        {"groups 2", {{2, 4, 6, 5}, {6, 2, 3, 3}, {6}}, conv_attr({1, 1}, {1, 0}, {1, 1}, 2), {}},
        {"5x5 lenet", {{2, 1, 12, 12}, {3, 1, 5, 5}, {3}}, conv_attr({1, 1}, {0, 0}, {1, 1}, 1), {}},
        // Fused Relu: random inputs leave pre-activations within the finite-difference step of 0 rarely enough.
        {"relu 3x3 pad 1 bias", {{2, 3, 7, 6}, {4, 3, 3, 3}, {4}}, conv_attr({1, 1}, {1, 1}, {1, 1}, 1, relu), {}},
        {"relu stride 2 no bias", {{2, 2, 9, 8}, {3, 2, 3, 2}}, conv_attr({2, 2}, {0, 0}, {1, 1}, 1, relu), {}},
        {"relu groups 2 pad 1,0", {{2, 4, 6, 5}, {6, 2, 3, 3}, {6}}, conv_attr({1, 1}, {1, 0}, {1, 1}, 2, relu), {}},
        {"relu 5x5 lenet", {{3, 1, 12, 12}, {3, 1, 5, 5}, {3}}, conv_attr({1, 1}, {0, 0}, {1, 1}, 1, relu), {}},
    };
}
OpAttrs pool_attr(std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride,
                  std::array<std::int64_t, 2> padding) {
    return {.kernel = kernel, .stride = stride, .padding = padding};
}
std::vector<OpCase> pool2d_cases() {
    return {
        {"2x2 stride 2", {{2, 3, 6, 8}}, pool_attr({2, 2}, {2, 2}, {0, 0}), {}},
        {"3x3 stride 2 pad 1", {{1, 2, 7, 7}}, pool_attr({3, 3}, {2, 2}, {1, 1}), {}},
        {"3x2 stride 1", {{2, 1, 5, 6}}, pool_attr({3, 2}, {1, 1}, {0, 0}), {}},
    };
}
OpAttrs norm_attr(bool training) { return {.training = training, .eps = 1e-5, .momentum = 0.1}; }
std::vector<OpCase> batch_norm_cases() {
    const std::vector<D> domains = {D::Any, D::Any, D::Any, D::Constant, D::Constant};
    return {
        {"train NCHW", {{4, 3, 3, 2}, {3}, {3}, {3}, {3}}, norm_attr(true), domains},
        {"train (N,C)", {{6, 5}, {5}, {5}, {5}, {5}}, norm_attr(true), domains},
        {"eval NCHW", {{2, 3, 2, 4}, {3}, {3}, {3}, {3}}, norm_attr(false), domains},
    };
}
OpAttrs dropout_attr(double p, bool training, std::uint64_t seed) {
    return {.scalar = p, .training = training, .seed = seed};
}
std::vector<OpCase> dropout_cases() {
    return {
        {"p 0.3 train", {{4, 5}}, dropout_attr(0.3, true, 7), {}},
        {"p 0.5 train NCHW", {{2, 3, 4, 5}}, dropout_attr(0.5, true, 11), {}},
        {"eval", {{3, 7}}, dropout_attr(0.5, false, 3), {}},
        // The seed-tensor form (captured steps): the seed is an int64 in [0, 13) (Indices of the last axis).
        {"p 0.4 train seed tensor", {{5, 13}, {1}}, dropout_attr(0.4, true, 0), {D::Any, D::Indices}},
    };
}

OpAttrs narrow_attr(std::int64_t axis, std::int64_t start, std::int64_t length) {
    return {.axis = axis, .start = start, .length = length};
}
std::vector<OpCase> narrow_cases() {
    return {
        {"axis 1 middle", {{3, 5}}, narrow_attr(1, 1, 3), {}},
        {"axis 0 of 3-D", {{4, 2, 3}}, narrow_attr(0, 2, 2), {}},
        {"last axis whole", {{2, 3, 4}}, narrow_attr(-1, 0, 4), {}},
        {"empty window", {{3, 4}}, narrow_attr(1, 2, 0), {}},
    };
}
std::vector<OpCase> concat_cases() {
    return {
        {"axis 0, three inputs", {{2, 3}, {1, 3}, {4, 3}}, axis_attr(0), {}},
        {"channels of NCHW", {{2, 3, 2, 2}, {2, 1, 2, 2}}, axis_attr(1), {}},
        {"last axis", {{3, 2}, {3, 5}, {3, 1}}, axis_attr(-1), {}},
        {"one input", {{4, 2}}, axis_attr(0), {}},
    };
}

std::vector<OpCase> permute_cases() {
    OpAttrs rotate, nchw_to_nhwc, negative, identity;
    rotate.axes = {2, 0, 1};
    nchw_to_nhwc.axes = {0, 2, 3, 1};
    negative.axes = {-1, 0};
    identity.axes = {0, 1};
    return {
        {"3-D rotate (2,0,1)", {{2, 3, 4}}, rotate, {}},
        {"NCHW to NHWC", {{2, 3, 4, 5}}, nchw_to_nhwc, {}},
        {"negative dims", {{3, 5}}, negative, {}},
        {"identity", {{4, 3}}, identity, {}},
    };
}
std::vector<OpCase> expand_cases() {
    return {
        {"row to matrix", {{1, 4}}, shape_attr({3, 4}), {}},
        {"new leading axes", {{3, 1}}, shape_attr({2, 3, 5}), {}},
        {"-1 keeps sizes", {{2, 1, 3}}, shape_attr({-1, 4, -1}), {}},
        {"scalar", {{}}, shape_attr({3, 2}), {}},
    };
}

// Index inputs draw from [0, size of axis `attrs.axis` of input 0) (InputDomain::Indices), so small axes
// with many indices repeat some: the backward's accumulation of repeats is checked too.
std::vector<OpCase> embedding_cases() {
    // Cases without padding_idx: a padding row's gradient is 0 by definition, not the derivative, so finite
    // differences cannot check it (tests/ops/test_indexing.cpp does).
    const OpAttrs rows = axis_attr(0);
    return {
        {"(10,4) weight, (3,5) indices", {{10, 4}, {3, 5}}, rows, {D::Any, D::Indices}},
        {"3 rows, 12 indices", {{3, 6}, {12}}, rows, {D::Any, D::Indices}},
        {"scalar index", {{7, 3}, {}}, rows, {D::Any, D::Indices}},
    };
}
std::vector<OpCase> gather_cases() {
    return {
        {"axis 1", {{3, 5}, {3, 4}}, axis_attr(1), {D::Any, D::Indices}},
        {"axis 0, index smaller along 1", {{4, 3}, {6, 2}}, axis_attr(0), {D::Any, D::Indices}},
        {"3-D last axis", {{2, 3, 4}, {2, 2, 7}}, axis_attr(-1), {D::Any, D::Indices}},
    };
}
std::vector<OpCase> index_select_cases() {
    return {
        {"axis 0", {{5, 3}, {7}}, axis_attr(0), {D::Any, D::Indices}},
        {"axis 1 of 3-D", {{2, 4, 3}, {5}}, axis_attr(1), {D::Any, D::Indices}},
        {"last axis", {{3, 4}, {2}}, axis_attr(-1), {D::Any, D::Indices}},
    };
}
std::vector<OpCase> scatter_add_cases() {
    const std::vector<D> domains = {D::Any, D::Indices, D::Any};
    return {
        {"axis 0", {{4, 3}, {6, 3}, {6, 3}}, axis_attr(0), domains},
        {"axis 1, index smaller along 0", {{3, 5}, {2, 7}, {2, 7}}, axis_attr(1), domains},
        {"3-D middle axis", {{2, 3, 4}, {2, 5, 3}, {2, 5, 3}}, axis_attr(1), domains},
    };
}
std::vector<OpCase> where_cases() {
    const std::vector<D> domains = {D::Mask, D::Any, D::Any};
    return {
        {"same shape", {{3, 4}, {3, 4}, {3, 4}}, {}, domains},
        {"all three broadcast", {{3, 1}, {1, 4}, {4}}, {}, domains},
        {"scalar branch", {{2, 3}, {2, 3}, {}}, {}, domains},
    };
}
std::vector<OpCase> masked_fill_cases() {
    const std::vector<D> domains = {D::Any, D::Mask};
    return {
        {"same shape", {{3, 4}, {3, 4}}, scalar_attr(-2.5), domains},
        {"row mask", {{2, 3, 4}, {4}}, scalar_attr(-2.5), domains},
        {"column mask", {{3, 5}, {3, 1}}, scalar_attr(3.0), domains},
    };
}

OpAttrs attention_attr(bool causal, double dropout_p = 0.0, std::optional<double> scale = std::nullopt,
                       std::uint64_t seed = 0) {
    return {.scalar = dropout_p, .seed = seed, .is_causal = causal, .attention_scale = scale};
}
// q (B,H,T,D), k, v (B,H,S,D)[, mask]. T ≠ S and odd sizes throughout; masks of 0/1 (InputDomain::Mask) in
// several broadcast shapes, where a query may lose every key (its output is 0). The dropout cases use fixed
// seeds, so their masks are fixed functions of the inputs' positions and finite differences apply.
std::vector<OpCase> attention_cases() {
    const std::vector<D> masked = {D::Any, D::Any, D::Any, D::Mask};
    return {
        {"T 3, S 5, D 4", {{1, 2, 3, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}}, attention_attr(false), {}},
        {"causal T 5 = S", {{2, 1, 5, 3}, {2, 1, 5, 3}, {2, 1, 5, 3}}, attention_attr(true), {}},
        {"causal T 6 > S 4", {{1, 2, 6, 5}, {1, 2, 4, 5}, {1, 2, 4, 5}}, attention_attr(true), {}},
        {"causal T 3 < S 7, scale 0.3", {{2, 1, 3, 4}, {2, 1, 7, 4}, {2, 1, 7, 4}}, attention_attr(true, 0.0, 0.3), {}},
        {"mask (T,S)", {{2, 2, 4, 3}, {2, 2, 6, 3}, {2, 2, 6, 3}, {4, 6}}, attention_attr(false), masked},
        {"padding mask (B,1,1,S)", {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {2, 1, 1, 5}}, attention_attr(false),
         masked},
        {"mask (B,H,T,S) and causal", {{1, 2, 5, 3}, {1, 2, 5, 3}, {1, 2, 5, 3}, {1, 2, 5, 5}}, attention_attr(true),
         masked},
        {"dropout 0.3", {{2, 1, 4, 3}, {2, 1, 6, 3}, {2, 1, 6, 3}}, attention_attr(false, 0.3, std::nullopt, 17), {}},
        {"dropout 0.5, causal, mask (T,S)", {{1, 2, 5, 4}, {1, 2, 5, 4}, {1, 2, 5, 4}, {5, 5}},
         attention_attr(true, 0.5, std::nullopt, 1234), masked},
    };
}

// qkv (B,T,3·H·D): odd T and D, one and several heads, causal, a scale, dropout with a fixed seed.
std::vector<OpCase> qkv_attention_cases() {
    const auto heads = [](std::int64_t h, OpAttrs a) {
        a.num_heads = h;
        return a;
    };
    return {
        {"H 2, T 3, D 4", {{1, 3, 24}}, heads(2, attention_attr(false)), {}},
        {"causal H 1, T 5, D 3", {{2, 5, 9}}, heads(1, attention_attr(true)), {}},
        {"causal H 3, T 4, D 2, scale 0.4", {{2, 4, 18}}, heads(3, attention_attr(true, 0.0, 0.4)), {}},
        {"dropout 0.3, causal", {{2, 4, 12}}, heads(2, attention_attr(true, 0.3, std::nullopt, 29)), {}},
    };
}

// x (N,in), w1 (hidden,in), b1, w2 (out,hidden), b2: odd sizes, both GELU forms, a single row.
std::vector<OpCase> gelu_mlp_cases() {
    const auto form = [](GeluApproximation approximation) { return OpAttrs{.gelu_approximation = approximation}; };
    return {
        {"tanh 5x3 -> 7 -> 4", {{5, 3}, {7, 3}, {7}, {4, 7}, {4}}, form(GeluApproximation::Tanh), {}},
        {"exact 4x6 -> 5 -> 3", {{4, 6}, {5, 6}, {5}, {3, 5}, {3}}, form(GeluApproximation::None), {}},
        {"tanh one row", {{1, 4}, {6, 4}, {6}, {2, 6}, {2}}, form(GeluApproximation::Tanh), {}},
    };
}

// x (T,N,I) = (3,2,3); w flat; h0, c0 (L·D,N,H) where the label says so.
OpCase rnn_case(const char* label, RnnMode mode, std::int64_t hidden, std::int64_t layers, bool bidirectional,
                int states) {
    constexpr std::int64_t kSteps = 3, kBatch = 2, kInput = 3;
    const RnnOptions options{hidden, layers, bidirectional};
    const OpAttrs a{.rnn_mode = mode, .hidden_size = hidden, .num_layers = layers, .bidirectional = bidirectional};
    std::vector<Shape> shapes{{kSteps, kBatch, kInput}, {rnn_weight_size(mode, options, kInput)}};
    for (int i = 0; i < states; ++i) shapes.push_back({layers * (bidirectional ? 2 : 1), kBatch, hidden});
    return {label, shapes, a, {}};
}
std::vector<OpCase> rnn_cases() {
    using M = RnnMode;
    return {
        rnn_case("lstm 1 layer", M::Lstm, 2, 1, false, 0),
        rnn_case("lstm h0 only", M::Lstm, 3, 1, false, 1),
        rnn_case("lstm 2 layers bidir h0 c0", M::Lstm, 2, 2, true, 2),
        rnn_case("gru 1 layer h0", M::Gru, 3, 1, false, 1),
        rnn_case("gru 2 layers bidir", M::Gru, 2, 2, true, 0),
        rnn_case("rnn_tanh 2 layers h0", M::RnnTanh, 3, 2, false, 1),
        rnn_case("rnn_tanh bidir", M::RnnTanh, 2, 1, true, 0),
        rnn_case("rnn_relu 1 layer h0", M::RnnRelu, 3, 1, false, 1),
        rnn_case("rnn_relu 2 layers bidir", M::RnnRelu, 2, 2, true, 0),
    };
}

// Sorting and sampling (ops/sampling). Random inputs never tie; ties, k = 0 and the sampling statistics are
// tests/ops/test_sampling.cpp's. The long rows take the GPU's multi-tile scan.
OpAttrs sort_attr(std::int64_t axis, bool descending, std::int64_t k = 0) {
    OpAttrs a = axis_attr(axis);
    a.descending = descending;
    a.length = k;
    return a;
}
std::vector<OpCase> cumsum_cases() {
    return {{"vector", {{9}}, axis_attr(-1), {}}, {"rows", {{4, 7}}, axis_attr(1), {}},
            {"axis 0", {{5, 3}}, axis_attr(0), {}}, {"3-D middle axis", {{2, 6, 3}}, axis_attr(1), {}},
            {"scalar", {{}}, axis_attr(0), {}}, {"long rows", {{3, 1500}}, axis_attr(-1), {}}};
}
std::vector<OpCase> argsort_cases() {  // not differentiable: every input Constant
    return {{"rows", {{4, 9}}, sort_attr(-1, false), {D::Constant}},
            {"descending axis 0", {{6, 5}}, sort_attr(0, true), {D::Constant}},
            {"3-D middle axis", {{2, 7, 3}}, sort_attr(1, false), {D::Constant}},
            {"long rows descending", {{2, 1000}}, sort_attr(-1, true), {D::Constant}}};
}
std::vector<OpCase> topk_indices_cases() {
    return {{"largest 3 of rows", {{4, 9}}, sort_attr(-1, true, 3), {D::Constant}},
            {"smallest 2 along axis 0", {{6, 5}}, sort_attr(0, false, 2), {D::Constant}},
            {"all of a vector", {{7}}, sort_attr(0, true, 7), {D::Constant}},
            {"3-D middle axis", {{2, 8, 3}}, sort_attr(1, true, 4), {D::Constant}},
            {"long rows", {{2, 1000}}, sort_attr(-1, true, 5), {D::Constant}}};
}
std::vector<OpCase> multinomial_cases() {
    const auto draws = [](std::int64_t n, bool replacement, std::uint64_t seed) {
        OpAttrs a = sort_attr(-1, false, n);
        a.replacement = replacement;
        a.seed = seed;
        return a;
    };
    return {{"rows with replacement", {{4, 10}}, draws(16, true, 11), {D::Constant}},
            {"every category of each row", {{5, 8}}, draws(8, false, 12), {D::Constant}},
            {"vector without replacement", {{12}}, draws(5, false, 13), {D::Constant}},
            {"vector with replacement", {{6}}, draws(20, true, 14), {D::Constant}},
            {"long rows without replacement", {{2, 1500}}, draws(4, false, 15), {D::Constant}}};
}

}  // namespace dyngrad::op_cases
