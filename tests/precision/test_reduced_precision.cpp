// bf16 / f16 through every op on the CPU: the engine runs ops without native reduced-precision kernels through
// f32 (graph/through_f32.h), and the CPU has none, so every op-table row takes that path here. Each case in bf16
// and f16 is compared with the float64 run from the same rounded inputs (reduced_precision_check), within the
// dtype's tolerance (reduced_precision_tolerance). Also the cast op, mixed-dtype errors and the engine helpers.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "catch.h"
#include "check_reporting.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

std::uint64_t seed_base() { return dgtest::seed_base("test_reduced_precision", 20251125); }

using dgtest::describe_result;

}  // namespace

TEST_CASE("every op-table case runs in bf16 and f16 through f32 on the CPU", "[reduced][table]") {
    for (const OpDef& def : op_table()) {
        for (const OpCase& op_case : def.cases()) {
            for (const DType dtype : {DType::bf16, DType::f16}) {
                DYNAMIC_SECTION(def.name << ": " << op_case.label << " " << dtype_name(dtype)) {
                    Generator gen(seed_for_name(seed_base(), def.name));
                    const CheckResult r = reduced_precision_check(def, op_case, gen, dtype,
                                                                  reduced_precision_tolerance(def, dtype));
                    INFO(describe_result(r));
                    CHECK(r.pass);
                }
            }
        }
    }
}

TEST_CASE("reduced_precision_check fails a wrong result", "[reduced]") {
    // The check itself must be able to fail: a case whose tolerance is below one rounding of bf16 fails.
    const OpDef& exp_def = op_def(OpType::Exp);
    Generator gen(seed_base());
    const CheckResult r = reduced_precision_check(exp_def, exp_def.cases().at(1), gen, DType::bf16, 1e-9);
    INFO(describe_result(r));
    CHECK_FALSE(r.pass);
    CHECK(r.max_rel_err > 1e-5);
    CHECK(r.max_rel_err < reduced_precision_tolerance(exp_def, DType::bf16));
}

TEST_CASE("cast rounds to nearest even exactly as core/half.h, both ways, with gradients", "[reduced][cast]") {
    Generator gen(seed_base() + 1);
    const Tensor x = Tensor::normal({5, 7}, 0.0, 3.0, gen, DType::f64);
    const std::vector<double> xs = x.to_vector();
    for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
        INFO(dtype_name(dtype));
        const Tensor y = to_dtype(x, dtype);
        REQUIRE(y.dtype() == dtype);
        const std::vector<double> ys = y.to_vector();
        for (std::size_t i = 0; i < xs.size(); ++i) {
            const double expected = dtype == DType::bf16  ? to_double(to_bfloat16(xs[i]))
                                    : dtype == DType::f16 ? to_double(to_float16(xs[i]))
                                                          : static_cast<double>(static_cast<float>(xs[i]));
            REQUIRE(ys[i] == expected);
        }
        // And back: every bf16/f16 value is exact in f32 and f64.
        CHECK(to_dtype(y, DType::f64).to_vector() == ys);
        CHECK(to_dtype(y, DType::f32).to_vector() == ys);
    }
    // bf16 -> f16 rounds once from the exact bf16 value.
    const Tensor b = to_dtype(x, DType::bf16);
    const std::vector<double> bs = b.to_vector();
    const std::vector<double> hs = to_dtype(b, DType::f16).to_vector();
    for (std::size_t i = 0; i < bs.size(); ++i) REQUIRE(hs[i] == to_double(to_float16(bs[i])));

    // Gradient: converted back to x's dtype.
    ComputeGraph graph;
    const Var xv = graph.input(x.to(DType::f32), "x", true);
    const Var yb = to_dtype(xv, DType::bf16);
    REQUIRE(yb.value().dtype() == DType::bf16);
    const Tensor w = Tensor::normal({5, 7}, 0.0, 1.0, gen, DType::bf16);
    graph.backward(yb, w);
    REQUIRE(xv.grad().dtype() == DType::f32);
    CHECK(xv.grad().to_vector() == w.to_vector());
}

TEST_CASE("float32 <-> bf16/f16 on the CPU: bit for bit core/half.h, ties, subnormals, overflow and NaN",
          "[reduced][cast]") {
    // Every bf16/f16 bit pattern to float32 and back.
    std::vector<double> all;
    for (const HalfFormat format : {kBFloat16Format, kFloat16Format}) {
        const DType dtype = format.mantissa_bits == kBFloat16Format.mantissa_bits ? DType::bf16 : DType::f16;
        INFO(dtype_name(dtype));
        Tensor patterns = Tensor::empty({65536}, dtype);
        auto* bits = static_cast<std::uint16_t*>(patterns.raw_data());
        for (std::uint32_t b = 0; b < 65536; ++b) bits[b] = static_cast<std::uint16_t>(b);
        const std::vector<double> wide = patterns.to(DType::f32).to_vector();
        const Tensor back = patterns.to(DType::f32).to(dtype);
        const auto* back_bits = static_cast<const std::uint16_t*>(back.raw_data());
        for (std::uint32_t b = 0; b < 65536; ++b) {
            const double exact = half_bits_to_double(static_cast<std::uint16_t>(b), format);
            if (std::isnan(exact)) {
                REQUIRE(std::isnan(wide[b]));
                continue;
            }
            REQUIRE(wide[b] == exact);
            REQUIRE(back_bits[b] == b);
        }
        // Floats between the patterns: midpoints (ties to even), just above and below them, random floats, the
        // largest finite float, and values beyond the format's range (infinity) and below it (zero).
        std::vector<float> floats;
        for (std::uint32_t b = 0; b + 1 < 65536; b += 7) {
            const double lo = half_bits_to_double(static_cast<std::uint16_t>(b), format);
            const double hi = half_bits_to_double(static_cast<std::uint16_t>(b + 1), format);
            if (!std::isfinite(lo) || !std::isfinite(hi) || std::signbit(lo) != std::signbit(hi)) continue;
            const auto mid = static_cast<float>((lo + hi) / 2);  // exact in float: 8 or 11 bits plus one
            floats.push_back(mid);
            floats.push_back(std::nextafter(mid, 0.0f));
            floats.push_back(std::nextafter(mid, std::numeric_limits<float>::infinity()));
        }
        Generator gen(seed_base() + 6);
        for (const double v : Tensor::normal({4096}, 0.0, 1e3, gen, DType::f64).to_vector())
            floats.push_back(static_cast<float>(v));
        for (const float v : {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 65520.0f,
                              65519.0f, 1e-8f, -3e-39f, std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), -0.0f})
            floats.push_back(v);
        std::vector<double> values(floats.begin(), floats.end());
        const Tensor x = Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())}, DType::f32);
        const Tensor rounded = x.to(dtype);
        const auto* rounded_bits = static_cast<const std::uint16_t*>(rounded.raw_data());
        for (std::size_t i = 0; i < floats.size(); ++i) {
            INFO("float " << floats[i]);
            REQUIRE(rounded_bits[i] == round_to_half_bits(floats[i], format));
        }
    }
}

TEST_CASE("a bf16 graph: values and gradients stay in bf16, the engine accumulates and sums in bf16",
          "[reduced][engine]") {
    Generator gen(seed_base() + 2);
    const Tensor a64 = Tensor::normal({4, 6}, 0.0, 1.0, gen, DType::f64);
    const Tensor b64 = Tensor::normal({6}, 0.0, 1.0, gen, DType::f64);
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        auto run = [&](DType d, const Tensor& a_value, const Tensor& b_value) {
            ComputeGraph graph;
            const Var a = graph.input(a_value.to(d), "a", true);
            const Var b = graph.input(b_value.to(d), "b", true);
            // b is broadcast (sum_to) and used twice (accumulate_into); a reaches the loss by two paths.
            const Var y = sum(tanh(a * b) + a * b + a);
            graph.backward(y);
            return std::array<Tensor, 3>{y.value(), a.grad(), b.grad()};
        };
        const Tensor a_rounded = a64.to(dtype).to(DType::f64);
        const Tensor b_rounded = b64.to(dtype).to(DType::f64);
        const auto low = run(dtype, a64, b64);
        const auto exact = run(DType::f64, a_rounded, b_rounded);
        for (const Tensor& t : low) CHECK(t.dtype() == dtype);
        // Each op rounds its output once: a chain of five ops stays within a few roundings per op.
        const double tol = 16 * unit_roundoff(dtype);
        for (std::size_t i = 0; i < low.size(); ++i) {
            INFO("tensor " << i);
            CHECK(relative_norm_error(low[i], exact[i]) < tol);
        }
    }
}

namespace {
// A user op written for float32/float64 only (dispatch_floating): the engine runs it through f32 for bf16/f16.
OutputSpec cube_shape(OpType, std::span<const Tensor> in, const OpAttrs&) { return {in[0].shape(), in[0].dtype()}; }
Tensor cube_forward(const ForwardArgs& args) {
    return dispatch_floating(args.out.dtype, "cube", [&]<typename T>() {
        Tensor y = Tensor::empty(args.out.shape, args.out.dtype);
        const T* x = args.inputs[0].data<T>();
        for (std::int64_t i = 0; i < y.numel(); ++i) y.data<T>()[i] = x[i] * x[i] * x[i];
        return y;
    });
}
std::vector<Tensor> cube_backward(const BackwardArgs& args) {
    return dispatch_floating(args.grad_output.dtype(), "cube", [&]<typename T>() {
        Tensor dx = Tensor::empty(args.inputs[0].shape(), args.inputs[0].dtype());
        const T* x = args.inputs[0].data<T>();
        const T* dy = args.grad_output.data<T>();
        for (std::int64_t i = 0; i < dx.numel(); ++i) dx.data<T>()[i] = T(3) * x[i] * x[i] * dy[i];
        return std::vector<Tensor>{dx};
    });
}
std::vector<OpCase> cube_cases() { return {{"matrix", {{5, 6}}, {}, {}}, {"scalar", {{}}, {}, {}}}; }
}  // namespace

TEST_CASE("a user-defined op with float32/float64 kernels only runs in bf16 and f16 through f32",
          "[reduced][custom]") {
    static const CustomOp cube = CustomOp::define(
        {.name = "cube_f32_only", .arity = 1, .infer = cube_shape, .cpu = {cube_forward, cube_backward},
         .cases = cube_cases});
    for (const OpCase& op_case : cube_cases()) {
        for (const DType dtype : {DType::bf16, DType::f16}) {
            INFO(op_case.label << " " << dtype_name(dtype));
            Generator gen(seed_base() + 5);
            const CheckResult r = reduced_precision_check(cube.def(), op_case, gen, dtype,
                                                          reduced_precision_tolerance(cube.def(), dtype));
            INFO(describe_result(r));
            CHECK(r.pass);
        }
    }
}

TEST_CASE("batch_norm's running statistics in bf16 are updated through f32", "[reduced][engine]") {
    Generator gen(seed_base() + 3);
    const Tensor x = Tensor::normal({8, 3}, 2.0, 1.0, gen, DType::bf16);
    const Tensor gamma = Tensor::ones({3}, DType::bf16);
    const Tensor beta = Tensor::zeros({3}, DType::bf16);
    Tensor running_mean = Tensor::zeros({3}, DType::bf16);
    Tensor running_var = Tensor::ones({3}, DType::bf16);
    Tensor mean32 = Tensor::zeros({3}, DType::f32);
    Tensor var32 = Tensor::ones({3}, DType::f32);
    batch_norm(x, gamma, beta, running_mean, running_var, true, 0.5, 1e-5);
    batch_norm(x.to(DType::f32), gamma.to(DType::f32), beta.to(DType::f32), mean32, var32, true, 0.5, 1e-5);
    // The f32 update, rounded to bf16: the means moved from 0 towards ~1.
    CHECK(running_mean.to_vector() == mean32.to(DType::bf16).to_vector());
    CHECK(running_var.to_vector() == var32.to(DType::bf16).to_vector());
    CHECK(running_mean.to_vector()[0] > 0.5);
}

TEST_CASE("mixing bf16 or f16 with another floating dtype is a DTypeError naming the op and both dtypes",
          "[reduced][errors]") {
    Generator gen(seed_base() + 4);
    const Tensor a = Tensor::normal({3}, 0.0, 1.0, gen, DType::bf16);
    const Tensor b = Tensor::normal({3}, 0.0, 1.0, gen, DType::f32);
    const Tensor h = Tensor::normal({3}, 0.0, 1.0, gen, DType::f16);
    auto message_of = [](auto&& call) -> std::string {
        try {
            call();
        } catch (const DTypeError& e) {
            return e.what();
        }
        return "";
    };
    const std::string add_message = message_of([&] { add(a, b); });
    CHECK(add_message.find("add") != std::string::npos);
    CHECK(add_message.find("bfloat16") != std::string::npos);
    CHECK(add_message.find("float32") != std::string::npos);
    const std::string mul_message = message_of([&] { mul(h, a); });
    CHECK(mul_message.find("mul") != std::string::npos);
    CHECK(mul_message.find("float16") != std::string::npos);
    CHECK(mul_message.find("bfloat16") != std::string::npos);
    ComputeGraph graph;
    const Var x = graph.input(a, "x", true);
    const Var w = graph.input(Tensor::normal({3, 3}, 0.0, 1.0, gen, DType::f64), "w", true);
    const std::string matmul_message = message_of([&] { matmul(reshape(x, {1, 3}), w); });
    CHECK(matmul_message.find("matmul") != std::string::npos);
    CHECK(matmul_message.find("float64") != std::string::npos);
}

TEST_CASE("anomaly mode reads bf16 and f16 values", "[reduced][anomaly]") {
    const Tensor t = Tensor::from_vector(std::vector<double>{1.0, std::numeric_limits<double>::infinity(), -2.0,
                                                             std::numeric_limits<double>::quiet_NaN()},
                                         {4}, DType::bf16);
    const TensorStats stats = tensor_stats(t);
    CHECK(stats.nan_count == 1);
    CHECK(stats.inf_count == 1);
    CHECK(stats.min == -2.0);
    CHECK(stats.max == 1.0);
    // f16 overflow in a forward: 300² = 90000 > 65504, so anomaly mode names the op that made the Inf.
    const AnomalyModeGuard anomaly;
    const Tensor x = Tensor::full({2}, 300.0, DType::f16);
    CHECK_THROWS_AS(mul(x, x), NumericalError);
}
