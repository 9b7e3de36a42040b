// linear and conv2d on the GPU against the float64 CPU: odd shapes, bias, the fused ReLU, TF32, float64;
// NaN through every ReLU variant as on the CPU.
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp); the helpers several of its files share are in tests/support/gpu_support.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;

namespace {

// linear(x, w, b, activation) forward, then backward of `dy`; inputs on one device. db is undefined
// without a bias.
struct LinearRun {
    Tensor y, dx, dw, db;
};
LinearRun run_linear(const std::vector<Tensor>& inputs, const Tensor& dy, bool with_bias, Activation activation) {
    ComputeGraph graph;
    const Var x = graph.input(inputs[0], "x", true);
    const Var w = graph.input(inputs[1], "w", true);
    const Var b = with_bias ? graph.input(inputs[2], "b", true) : Var();
    const Var y = linear(x, w, b, activation);
    graph.backward(y, dy);
    return {y.value(), x.grad(), w.grad(), with_bias ? b.grad() : Tensor()};
}

// normal(0, 1) rounded to multiples of 1/256 in (-8, 8): 11 significant bits, which TF32 holds exactly, so a
// TF32 GEMM's products are exact and no pre-activation crosses the ReLU's kink by TF32 rounding alone.
Tensor tf32_exact_normal(const Shape& shape, Generator& gen) {
    std::vector<double> values = Tensor::normal(shape, 0.0, 1.0, gen, DType::f64).to_vector();
    for (double& v : values) v = std::clamp(std::round(v * 256.0), -2047.0, 2047.0) / 256.0;
    return Tensor::from_vector(values, shape, DType::f64);
}

// cuda::set_allow_tf32 for one scope.
struct Tf32Scope {
    explicit Tf32Scope(bool allow) { cuda::set_allow_tf32(allow); }
    ~Tf32Scope() { cuda::set_allow_tf32(false); }
    Tf32Scope(const Tf32Scope&) = delete;
    Tf32Scope& operator=(const Tf32Scope&) = delete;
};

}  // namespace

// float32 linear runs through cuBLASLt (bias or bias + ReLU epilogue forward, weight and bias gradients in
// one GEMM backward), float64 through cuBLAS and small kernels. Shapes off the multiples of 8 and 16 that
// GEMM kernels tile by, and empty ones; against the float64 CPU on the same inputs.
TEST_CASE("linear matches the CPU on odd shapes: bias, fused ReLU, float32, TF32, float64", "[gpu][ops][linear]") {
    struct Dims {
        std::int64_t rows, in, out;
    };
    const Dims all_dims[] = {{7, 13, 5}, {1, 1, 1}, {33, 17, 65}, {257, 129, 67}, {0, 7, 3}, {4, 0, 3}};
    struct Mode {
        const char* name;
        DType dtype;
        bool tf32;
        double tolerance;
    };
    const Mode modes[] = {{"float32", DType::f32, false, 1e-5}, {"TF32", DType::f32, true, 1e-4},
                          {"float64", DType::f64, false, 1e-12}};
    std::uint64_t seed = kSeedBase + 3000;
    for (const Dims& d : all_dims)
        for (const Mode& mode : modes)
            for (const bool with_bias : {true, false})
                for (const Activation activation : {Activation::None, Activation::Relu}) {
                    ++seed;
                    DYNAMIC_SECTION(d.rows << "x" << d.in << " @ " << d.in << "x" << d.out << " " << mode.name
                                           << (with_bias ? " bias" : " no bias")
                                           << (activation == Activation::Relu ? " relu" : "")) {
                        Generator gen(seed);
                        const std::vector<Tensor> reference_inputs = {tf32_exact_normal({d.rows, d.in}, gen),
                                                                      tf32_exact_normal({d.out, d.in}, gen),
                                                                      tf32_exact_normal({d.out}, gen)};
                        const Tensor reference_dy = tf32_exact_normal({d.rows, d.out}, gen);
                        const LinearRun reference = run_linear(reference_inputs, reference_dy, with_bias, activation);
                        std::vector<Tensor> inputs;
                        for (const Tensor& t : reference_inputs) inputs.push_back(t.to(mode.dtype).to(kGpu));
                        LinearRun gpu;
                        {
                            const Tf32Scope tf32(mode.tf32);
                            gpu = run_linear(inputs, reference_dy.to(mode.dtype).to(kGpu), with_bias, activation);
                        }
                        CHECK(gpu.y.device() == kGpu);
                        CHECK(gpu.y.dtype() == mode.dtype);
                        CHECK(relative_norm_error(gpu.y, reference.y) <= mode.tolerance);
                        CHECK(relative_norm_error(gpu.dx, reference.dx) <= mode.tolerance);
                        CHECK(relative_norm_error(gpu.dw, reference.dw) <= mode.tolerance);
                        if (with_bias) CHECK(relative_norm_error(gpu.db, reference.db) <= mode.tolerance);
                    }
                }
}

TEST_CASE("linear with TF32 on unrounded inputs stays within TF32 accuracy", "[gpu][ops][linear]") {
    OpAttrs attrs;  // no activation: TF32 rounding may flip a ReLU's mask where the pre-activation is tiny
    const OpCase op_case{"TF32 257x129 @ 129x67", {{257, 129}, {67, 129}, {67}}, attrs, {}};
    Generator gen(kSeedBase + 3500);
    const Tf32Scope tf32(true);
    const CheckResult r = gpu_vs_cpu_check(*find_op("linear"), op_case, gen, 5e-3);
    INFO(describe_result(r));
    CHECK(r.pass);
}

namespace {

// conv2d(x, w, b, options) forward, then backward of `dy` unless dy is undefined, on the inputs' device.
// The gradients are undefined without a backward, db without a bias (inputs of size 2).
struct ConvRun {
    Tensor y, dx, dw, db;
};
ConvRun run_conv(const std::vector<Tensor>& inputs, const Tensor& dy, const Conv2dOptions& options) {
    ComputeGraph graph;
    const Var x = graph.input(inputs[0], "x", true);
    const Var w = graph.input(inputs[1], "w", true);
    const Var b = inputs.size() == 3 ? graph.input(inputs[2], "b", true) : Var();
    const Var y = conv2d(x, w, b, options);
    if (!dy.defined()) return {y.value(), Tensor(), Tensor(), Tensor()};
    graph.backward(y, dy);
    return {y.value(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

// dy where mask > 0, else 0 (float64, on the CPU).
Tensor masked(const Tensor& dy, const Tensor& mask) {
    std::vector<double> values = dy.to_vector();
    const std::vector<double> m = mask.to_vector();
    for (std::size_t i = 0; i < values.size(); ++i)
        if (!(m[i] > 0)) values[i] = 0;
    return Tensor::from_vector(values, dy.shape(), DType::f64);
}

}  // namespace

// conv2d with and without a fused ReLU: cuDNN plus our bias/activation kernels against the float64 CPU on
// the same inputs. The backward reference is the CPU's plain conv2d backward of dy masked with the GPU's
// own y > 0, so a pre-activation that float32 rounding moves across 0 cannot fail the check; y itself is
// compared with the CPU's fused forward. Shapes: odd sizes, stride 2, padding, groups, no bias, a bias
// gradient spread over many blocks per channel (lenet5's first layer, batch 64) and one with more channels
// than blocks wanted (one block per channel); the bias gradient must repeat bit for bit.
TEST_CASE("conv2d with a fused ReLU matches the CPU, bias gradient included", "[gpu][ops][conv_relu]") {
    struct ConvCase {
        const char* label;
        Shape x, w;
        Conv2dOptions options;
        bool bias;
    };
    const ConvCase cases[] = {
        {"3x3 pad 1, odd sizes", {3, 5, 11, 9}, {7, 5, 3, 3}, {.padding = {1, 1}}, true},
        {"5x3 stride 2 pad 2,1", {2, 3, 13, 10}, {4, 3, 5, 3}, {.stride = {2, 2}, .padding = {2, 1}}, true},
        {"groups 3", {2, 6, 9, 7}, {9, 2, 3, 3}, {.padding = {1, 1}, .groups = 3}, true},
        {"no bias", {2, 3, 8, 8}, {5, 3, 3, 3}, {}, false},
        {"lenet5 conv1 batch 64", {64, 1, 28, 28}, {6, 1, 5, 5}, {}, true},
        {"1x1, 600 channels", {3, 16, 5, 7}, {600, 16, 1, 1}, {}, true},
    };
    struct Mode {
        const char* name;
        DType dtype;
        double tolerance;     // y, dx, db
        double dw_tolerance;  // dw sums up to 36,864 products per weight (lenet5's first layer at batch 64)
    };
    const Mode modes[] = {{"float32", DType::f32, 1e-4, 1e-4}, {"float64", DType::f64, 1e-10, 1e-10}};
    std::uint64_t seed = kSeedBase + 4000;
    for (const ConvCase& c : cases)
        for (const Mode& mode : modes)
            for (const Activation activation : {Activation::None, Activation::Relu}) {
                ++seed;
                DYNAMIC_SECTION(c.label << " " << mode.name << (activation == Activation::Relu ? " relu" : "")) {
                    Generator gen(seed);
                    Conv2dOptions options = c.options;
                    options.activation = activation;
                    // Inputs and dy in the mode's dtype, and the same values in float64 on the CPU.
                    std::vector<Tensor> inputs, reference_inputs;
                    std::vector<Shape> shapes = {c.x, c.w};
                    if (c.bias) shapes.push_back({c.w[0]});
                    for (const Shape& shape : shapes) {
                        const Tensor value = Tensor::normal(shape, 0.0, 1.0, gen, mode.dtype);
                        inputs.push_back(value.to(kGpu));
                        reference_inputs.push_back(value.to(DType::f64));
                    }
                    const Tensor probe = run_conv(reference_inputs, Tensor(), options).y;
                    const Tensor dy = Tensor::normal(probe.shape(), 0.0, 1.0, gen, mode.dtype);
                    const ConvRun gpu = run_conv(inputs, dy.to(kGpu), options);
                    CHECK(gpu.y.device() == kGpu);
                    CHECK(gpu.y.dtype() == mode.dtype);
                    CHECK(relative_norm_error(gpu.y, probe) <= mode.tolerance);
                    const Tensor dz =
                        activation == Activation::Relu ? masked(dy.to(DType::f64), gpu.y) : dy.to(DType::f64);
                    const ConvRun reference = run_conv(reference_inputs, dz, c.options);  // no activation
                    CHECK(relative_norm_error(gpu.dx, reference.dx) <= mode.tolerance);
                    CHECK(relative_norm_error(gpu.dw, reference.dw) <= mode.dw_tolerance);
                    if (c.bias) {
                        CHECK(relative_norm_error(gpu.db, reference.db) <= mode.tolerance);
                        CHECK(run_conv(inputs, dy.to(kGpu), options).db.to_vector() == gpu.db.to_vector());
                    }
                }
            }
}

// Issue 11 class 7: NaN propagates through relu, clipped_relu and the fused ReLU of linear (float32: the
// BIAS epilogue and our ReLU kernel, never cuBLASLt's RELU_BIAS) and conv2d, as on the CPU; the gradient
// passes dy at a NaN (PyTorch's threshold_backward).
TEST_CASE("every ReLU variant propagates NaN on the GPU as on the CPU", "[gpu][ops][nan]") {
    constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    Generator gen(kSeedBase + 5000);
    for (const DType dtype : {DType::f32, DType::f64}) {
        DYNAMIC_SECTION(dtype_name(dtype)) {
            // Runs y = f(inputs) and dinputs[0] for dy = 1 on `device`; returns y and dx on the CPU.
            const auto run = [&](Device device, const std::vector<Tensor>& values, auto f) {
                ComputeGraph g;
                std::vector<Var> vars;
                for (const Tensor& v : values) vars.push_back(g.input(v.to(device), "", true));
                Var y = f(vars);
                g.backward(sum(y));
                return std::pair{y.value().to(Device::cpu()), vars[0].grad().to(Device::cpu())};
            };
            const auto same_nan_and_values = [](const Tensor& gpu, const Tensor& cpu) {
                const std::vector<double> a = gpu.to_vector(), b = cpu.to_vector();
                REQUIRE(a.size() == b.size());
                std::int64_t nan = 0;
                for (std::size_t i = 0; i < a.size(); ++i) {
                    CHECK(std::isnan(a[i]) == std::isnan(b[i]));
                    nan += std::isnan(a[i]);
                    if (!std::isnan(b[i])) CHECK(std::abs(a[i] - b[i]) <= 1e-4 * (1 + std::abs(b[i])));
                }
                return nan;
            };
            Tensor x = Tensor::normal({4, 33}, 0, 1, gen, dtype);
            x.set({1, 7}, kNaN);
            x.set({3, 30}, kNaN);
            const auto relus = [](const std::vector<Var>& v) { return add(relu(v[0]), clipped_relu(v[0], 0.5)); };
            const auto [y_gpu, dx_gpu] = run(kGpu, {x}, relus);
            const auto [y_cpu, dx_cpu] = run(Device::cpu(), {x}, relus);
            CHECK(same_nan_and_values(y_gpu, y_cpu) == 2);
            CHECK(same_nan_and_values(dx_gpu, dx_cpu) == 0);
            CHECK(dx_gpu.at({1, 7}) == 2);  // dy passes through both at a NaN

            const Tensor w = Tensor::normal({40, 33}, 0, 1, gen, dtype), b = Tensor::normal({40}, 0, 1, gen, dtype);
            const auto fused = [](const std::vector<Var>& v) { return linear(v[0], v[1], v[2], Activation::Relu); };
            CHECK(same_nan_and_values(run(kGpu, {x, w, b}, fused).first, run(Device::cpu(), {x, w, b}, fused).first) ==
                  80);

            Tensor image = Tensor::normal({2, 3, 9, 9}, 0, 1, gen, dtype);
            image.set({1, 2, 4, 4}, kNaN);
            const Tensor k = Tensor::normal({5, 3, 3, 3}, 0, 1, gen, dtype), kb = Tensor::normal({5}, 0, 1, gen, dtype);
            const auto conv = [](const std::vector<Var>& v) {
                return conv2d(v[0], v[1], v[2], {.padding = {1, 1}, .activation = Activation::Relu});
            };
            CHECK(same_nan_and_values(run(kGpu, {image, k, kb}, conv).first,
                                      run(Device::cpu(), {image, k, kb}, conv).first) == 45);
        }
    }
}

// ---- issue 13: parameter groups in the fused optimizer steps, gradient clipping on the device ----

// ops/conv.h's conv_search_log(): each pass a new shape searches lists cuDNN's candidates with ops/conv.cu's verdict;
// exactly one is chosen per pass, and at float32 precision never a tensor-core or transform-based one.
TEST_CASE("conv2d's algorithm search is logged with a verdict per candidate", "[gpu][ops][conv_search]") {
    clear_conv_search_log();
    Generator gen(kSeedBase + 6100);
    // A shape no other case uses, so that its three passes are searched here.
    const Tensor x = Tensor::normal({3, 2, 9, 11}, 0.0, 1.0, gen).to(kGpu);
    const Tensor w = Tensor::normal({5, 2, 3, 2}, 0.0, 1.0, gen).to(kGpu);
    const Tensor b = Tensor::normal({5}, 0.0, 1.0, gen).to(kGpu);
    const ConvRun run = run_conv({x, w, b}, Tensor::normal({3, 5, 7, 10}, 0.0, 1.0, gen).to(kGpu), {});
    CHECK(run.dx.defined());
    const std::vector<ConvSearchEntry> log = conv_search_log();
    for (const char* pass : {"forward", "backward data", "backward filter"}) {
        INFO(pass);
        int chosen = 0, candidates = 0;
        for (const ConvSearchEntry& e : log) {
            if (e.pass != pass) continue;
            ++candidates;
            CHECK(e.convolution.find("x (3,2,9,11) w (5,2,3,2)") == 0);
            CHECK(e.convolution.find("float32") != std::string::npos);
            const bool transform = e.algorithm.find("FFT") != std::string::npos ||
                                   e.algorithm.find("WINOGRAD") != std::string::npos;
            if (e.verdict == "chosen") {
                ++chosen;
                CHECK(e.ms >= 0);
                CHECK_FALSE(transform);
                CHECK_FALSE(e.tensor_ops);
            } else {
                CHECK((e.verdict == "slower" || e.verdict == "failed" || e.verdict == "transform-based" ||
                       e.verdict == "tensor ops at float32 precision" || e.verdict == "down-conversion" ||
                       e.verdict == "workspace over the limit" || e.verdict == "not deterministic" ||
                       e.verdict == "not supported" || e.verdict == "reduced-precision reduction" ||
                       e.verdict == "runtime compilation"));
            }
            if (transform) CHECK((e.verdict != "chosen" && e.verdict != "slower"));  // refused, for one reason or another
        }
        CHECK(candidates > 1);
        CHECK(chosen == 1);
    }
    clear_conv_search_log();
    CHECK(conv_search_log().empty());
}

namespace {
// set_conv_graph_mode for one scope.
struct ConvGraphModeScope {
    ConvGraphMode previous = conv_graph_mode();
    explicit ConvGraphModeScope(ConvGraphMode mode) { set_conv_graph_mode(mode); }
    ~ConvGraphModeScope() { set_conv_graph_mode(previous); }
    ConvGraphModeScope(const ConvGraphModeScope&) = delete;
    ConvGraphModeScope& operator=(const ConvGraphModeScope&) = delete;
};
}  // namespace

// ops/conv.h's ConvGraphMode::Force: each pass runs on a cuDNN graph-API engine (ops/conv_graph.cu) wherever one takes
// it, against the float64 CPU on the same rounded inputs (bf16/f16: one rounding of each output, sums in f32).
// Shapes: lenet5's second convolution at batch 64 (its bf16 backward data ran 72.7 µs on the legacy API, 13 µs on the
// engine PyTorch's graph-API path picked), a padded stride-2 one and groups 2. The search log lists the graph
// candidates of each pass; where one ran, one was chosen.
TEST_CASE("conv2d on cuDNN's graph API matches the CPU", "[gpu][ops][conv_graph]") {
    struct ConvCase {
        const char* label;
        Shape x, w;
        Conv2dOptions options;
        bool lenet;
    };
    const ConvCase cases[] = {
        {"lenet5 conv2 batch 64", {64, 6, 12, 12}, {16, 6, 5, 5}, {}, true},
        {"3x3 stride 2 pad 1", {3, 8, 15, 13}, {16, 8, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, false},
        {"groups 2", {2, 8, 9, 7}, {12, 4, 3, 3}, {.padding = {1, 1}, .groups = 2}, false},
    };
    struct Mode {
        DType dtype;
        double tolerance;  // one rounding of the output (bf16 2^-8, f16 2^-11 relative), TF32's inputs, or float32 FMA sums
        bool tf32;         // float32 only: TF32 allowed (the graph API is tried for float32 only then)
    };
    const Mode modes[] = {{DType::bf16, 1e-2, false}, {DType::f16, 2e-3, false}, {DType::f32, 5e-3, true},
                          {DType::f32, 1e-4, false}};
    std::uint64_t seed = kSeedBase + 6200;
    for (const ConvCase& c : cases)
        for (const Mode& mode : modes) {
            ++seed;
            DYNAMIC_SECTION(c.label << " " << dtype_name(mode.dtype) << (mode.tf32 ? " tf32" : "")) {
                const ConvGraphModeScope forced(ConvGraphMode::Force);
                const Tf32Scope tf32(mode.tf32);
                const bool graph_tried = mode.dtype != DType::f32 || mode.tf32;
                clear_conv_search_log();
                Generator gen(seed);
                std::vector<Tensor> inputs, reference_inputs;
                for (const Shape& shape : {c.x, c.w, Shape{c.w[0]}}) {
                    const Tensor value = Tensor::normal(shape, 0.0, 1.0, gen, mode.dtype);
                    inputs.push_back(value.to(kGpu));
                    reference_inputs.push_back(value.to(DType::f64));
                }
                const Tensor probe = run_conv(reference_inputs, Tensor(), c.options).y;
                const Tensor dy = Tensor::normal(probe.shape(), 0.0, 1.0, gen, mode.dtype);
                const ConvRun gpu = run_conv(inputs, dy.to(kGpu), c.options);
                const ConvRun reference = run_conv(reference_inputs, dy.to(DType::f64), c.options);
                CHECK(gpu.y.dtype() == mode.dtype);
                CHECK(relative_norm_error(gpu.y, reference.y) <= mode.tolerance);
                CHECK(relative_norm_error(gpu.dx, reference.dx) <= mode.tolerance);
                CHECK(relative_norm_error(gpu.dw, reference.dw) <= mode.tolerance);
                CHECK(relative_norm_error(gpu.db, reference.db) <= mode.tolerance);
                // A second run takes the plans the search kept (and its variant packs): the same values.
                const ConvRun again = run_conv(inputs, dy.to(kGpu), c.options);
                CHECK(relative_norm_error(again.dx, gpu.dx) <= mode.tolerance);

                // The plan's description (ops/conv.cu): "… float32 tf32 graph forced" when TF32 is allowed.
                const std::string key = str(" ", dtype_name(mode.dtype), mode.tf32 ? " tf32" : "", " graph forced");
                const std::vector<ConvSearchEntry> log = conv_search_log();
                for (const char* pass : {"forward", "backward data", "backward filter"}) {
                    INFO(pass);
                    int chosen = 0, graph_candidates = 0, graph_timed = 0;
                    bool graph_chosen = false;
                    for (const ConvSearchEntry& e : log) {
                        if (e.pass != pass || e.convolution.find(key) == std::string::npos) continue;
                        INFO(e.algorithm << ": " << e.verdict << " " << e.detail);
                        const bool graph = e.algorithm.rfind("graph", 0) == 0;
                        graph_candidates += graph;
                        if (graph && (e.verdict == "chosen" || e.verdict == "slower")) {
                            ++graph_timed;
                            CHECK(e.ms >= 0);
                            CHECK(e.workspace_bytes <= (std::size_t{256} << 20));
                        }
                        if (e.verdict != "chosen") continue;
                        ++chosen;
                        graph_chosen = graph;
                        if (mode.dtype == DType::f32 && !mode.tf32) CHECK_FALSE(e.tensor_ops);  // no TF32 unless allowed
                    }
                    // Full float32 precision stays on the legacy API (ops/conv_graph.h, conv_graph_allowed).
                    CHECK((graph_tried ? graph_candidates >= 1 : graph_candidates == 0));
                    CHECK(chosen == 1);
                    CHECK(graph_chosen == (graph_timed > 0));  // forced: a graph engine wherever one ran
                    // The case this path exists for: a graph engine runs lenet5's 16-bit backward data.
                    if (c.lenet && mode.dtype != DType::f32 && std::string_view(pass) == "backward data")
                        CHECK(graph_chosen);
                }
            }
        }
}

// A graph-API plan declares 16-byte aligned tensors; a weight that is a window at an odd offset of a larger buffer (as
// ZeRO-3's flat parameter buffers hand out) runs the pass's legacy algorithm instead, with the same results.
TEST_CASE("conv2d's graph-API plan leaves a misaligned operand to the legacy algorithm", "[gpu][ops][conv_graph]") {
    const ConvGraphModeScope forced(ConvGraphMode::Force);
    Generator gen(kSeedBase + 6300);
    const Shape x_shape{64, 6, 12, 12}, w_shape{16, 6, 5, 5};
    std::vector<Tensor> inputs, reference_inputs;
    for (const Shape& shape : {x_shape, w_shape, Shape{16}}) {
        const Tensor value = Tensor::normal(shape, 0.0, 1.0, gen, DType::bf16);
        inputs.push_back(value.to(kGpu));
        reference_inputs.push_back(value.to(DType::f64));
    }
    const Tensor dy = Tensor::normal({64, 16, 8, 8}, 0.0, 1.0, gen, DType::bf16);
    const ConvRun reference = run_conv(reference_inputs, dy.to(DType::f64), {});
    const ConvRun aligned = run_conv(inputs, dy.to(kGpu), {});  // searches (or finds) the forced plans
    const Tensor buffer = Tensor::empty({numel(w_shape) + 1}, DType::bf16, kGpu);
    Tensor window = buffer.window(1, w_shape);  // 2 bytes past an aligned block
    window.copy_from(inputs[1]);
    const ConvRun misaligned = run_conv({inputs[0], window, inputs[2]}, dy.to(kGpu), {});
    for (const ConvRun* run : {&aligned, &misaligned}) {
        CHECK(relative_norm_error(run->y, reference.y) <= 1e-2);
        CHECK(relative_norm_error(run->dx, reference.dx) <= 1e-2);
        CHECK(relative_norm_error(run->dw, reference.dw) <= 1e-2);
    }
}
