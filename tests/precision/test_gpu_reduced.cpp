// bf16 / f16 on the GPU: every op-table case in bf16 and f16 on cuda:0 (native kernels where the op table says
// so, the engine's path through f32 elsewhere) against the float64 CPU run from the same rounded inputs; the
// conversion kernel against core/half.h bit for bit; the engine's native accumulation and broadcast sums.
// Without a CUDA device (or in a CPU-only build) the executable prints why and exits 77 (CTest: skipped).
#include <cmath>
#include <cstdint>
#include <array>
#include <limits>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/ops/dropout_mask.h"

using namespace dyngrad;

namespace {
constexpr std::uint64_t kSeedBase = 20251125;
const Device kGpu = Device::cuda(0);
}  // namespace

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "reduced-precision GPU tests"); }

TEST_CASE("every op-table case in bf16 and f16 on the GPU agrees with float64 from the same rounded inputs",
          "[gpu][reduced]") {
    for (const OpDef& def : op_table()) {
        if (!def.cuda.forward) continue;
        for (const OpCase& op_case : def.cases()) {
            for (const DType dtype : {DType::bf16, DType::f16}) {
                DYNAMIC_SECTION(def.name << ": " << op_case.label << " " << dtype_name(dtype)) {
                    Generator gen(seed_for_name(kSeedBase, def.name));
                    const CheckResult r = reduced_precision_check(def, op_case, gen, dtype,
                                                                  reduced_precision_tolerance(def, dtype), kGpu);
                    INFO(r.check << " of " << r.op << " '" << r.case_label << "' " << r.shapes << ": max rel err "
                                 << r.max_rel_err << " (tolerance " << r.tolerance << "), " << r.detail);
                    CHECK(r.pass);
                }
            }
        }
    }
}

TEST_CASE("the GPU conversion kernel rounds exactly as core/half.h", "[gpu][reduced][cast]") {
    Generator gen(kSeedBase + 1);
    // Wide range: normals, subnormals of f16, overflow to inf in f16, NaN and signed zeros.
    std::vector<double> values;
    for (const double scale : {1e-9, 1e-6, 1e-3, 1.0, 1e3, 7e4, 1e39})
        for (const double v : Tensor::normal({64}, 0.0, scale, gen, DType::f64).to_vector()) values.push_back(v);
    values.push_back(std::numeric_limits<double>::quiet_NaN());
    values.push_back(std::numeric_limits<double>::infinity());
    values.push_back(-0.0);
    const Tensor x64 = Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())}, DType::f64);
    for (const DType from : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
        const Tensor source = x64.to(from);  // rounded on the host
        for (const DType to : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
            INFO(dtype_name(from) << " -> " << dtype_name(to));
            const std::vector<double> host = source.to(to).to_vector();
            const std::vector<double> device = source.to(kGpu).to(to).to_vector();
            REQUIRE(host.size() == device.size());
            for (std::size_t i = 0; i < host.size(); ++i) {
                if (std::isnan(host[i])) {
                    CHECK(std::isnan(device[i]));
                    continue;
                }
                CHECK(host[i] == device[i]);
                CHECK(std::signbit(host[i]) == std::signbit(device[i]));
            }
        }
    }
}

TEST_CASE("a bf16 graph on the GPU: gradients accumulate and broadcast sums run natively in f32", "[gpu][reduced]") {
    Generator gen(kSeedBase + 2);
    const Tensor a64 = Tensor::normal({64, 96}, 0.0, 1.0, gen, DType::f64);
    const Tensor b64 = Tensor::normal({96}, 0.0, 1.0, gen, DType::f64);
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        auto run = [&](DType d, Device device) {
            ComputeGraph graph;
            const Var a = graph.input(a64.to(dtype).to(d).to(device), "a", true);
            const Var b = graph.input(b64.to(dtype).to(d).to(device), "b", true);
            const Var y = sum(tanh(a * b) + a * b + a);  // b broadcast (sum_to), a and b used twice (accumulate)
            graph.backward(y);
            return std::array<Tensor, 3>{y.value(), a.grad(), b.grad()};
        };
        const auto low = run(dtype, kGpu);
        const auto exact = run(DType::f64, Device::cpu());
        for (const Tensor& t : low) CHECK(t.dtype() == dtype);
        // b's gradient sums 64 rows: f32 accumulation keeps it within a few roundings of the result.
        for (std::size_t i = 0; i < low.size(); ++i) {
            INFO("tensor " << i);
            CHECK(relative_norm_error(low[i], exact[i]) < 16 * unit_roundoff(dtype));
        }
    }
}

// Native bf16/f16 dropout (ops/dropout.cu): the keep decision is a function of (seed, index) alone, so the 16-bit
// kernels keep exactly the elements the f32 kernel and the CPU (ops/dropout_mask.h) keep, with the attribute seed
// and with the device seed tensor alike; each kept value is the f32 kernel's rounded once, forward and backward.
// Odd sizes: the 16-byte packs and the scalar tail both run.
TEST_CASE("bf16 and f16 dropout on the GPU keep exactly the elements f32 dropout keeps, for both seed forms",
          "[gpu][reduced][dropout]") {
    Generator gen(kSeedBase + 3);
    constexpr double kP = 0.3;
    const Tensor x64 = Tensor::normal({37, 129}, 0.0, 1.0, gen, DType::f64);
    const Tensor w64 = Tensor::normal({37, 129}, 0.0, 1.0, gen, DType::f64);
    const auto seed = static_cast<std::uint64_t>(gen.engine()());
    const Tensor seed_tensor = Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(seed)}, {1});
    for (const DType dtype : {DType::bf16, DType::f16}) {
        const Tensor x = x64.to(dtype), w = w64.to(dtype);
        // y and dx of dropout(x) with loss sum(y · w) in `d` on `device`; `tensor_seed`: the seed-tensor form.
        auto run = [&](DType d, Device device, bool tensor_seed) {
            ComputeGraph graph;
            const Var xv = graph.input(x.to(d).to(device), "x", true);
            const Var y = tensor_seed ? dropout(xv, kP, true, graph.constant(seed_tensor.to(device)))
                                      : dropout(xv, kP, true, seed);
            graph.backward(sum(y * graph.constant(w.to(d).to(device))));
            return std::array<Tensor, 2>{y.value(), xv.grad()};
        };
        const std::vector<double> xs = x.to_vector(), ws = w.to_vector();
        for (const bool tensor_seed : {false, true}) {
            INFO(dtype_name(dtype) << (tensor_seed ? ", seed tensor" : ", attribute seed"));
            const auto low = run(dtype, kGpu, tensor_seed);
            const auto f32 = run(DType::f32, kGpu, tensor_seed);
            const auto exact = run(DType::f64, Device::cpu(), tensor_seed);
            REQUIRE(low[0].dtype() == dtype);
            REQUIRE(low[1].dtype() == dtype);
            for (std::size_t t = 0; t < low.size(); ++t) {
                INFO((t == 0 ? "y" : "dx"));
                // The f32 kernel's result rounded once, bit for bit.
                CHECK(low[t].to_vector() == f32[t].to(dtype).to_vector());
                const std::vector<double> values = low[t].to_vector(), reference = exact[t].to_vector();
                const std::vector<double>& scaled = t == 0 ? xs : ws;
                std::size_t kept = 0, mismatches = 0;
                for (std::size_t i = 0; i < values.size(); ++i) {
                    const bool keep = math::dropout_keep(seed, i, kP);
                    kept += keep ? 1 : 0;
                    // A kept element is nonzero wherever its input is (no value here underflows when scaled).
                    if (scaled[i] != 0 && ((values[i] != 0) != keep || (reference[i] != 0) != keep)) ++mismatches;
                }
                CHECK(mismatches == 0);
                CHECK(kept > values.size() / 2);  // about 70 % kept: the mask is not all-drop or all-keep
                CHECK(kept < values.size());
                CHECK(relative_norm_error(low[t], exact[t]) < 2 * unit_roundoff(dtype));
            }
        }
    }
}
