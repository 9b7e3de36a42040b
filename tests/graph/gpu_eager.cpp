// Eager math on CUDA tensors (graph/eager.h) against the CPU, and NVTX ranges around op dispatches
// (graph/profiling.h).
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp); the helpers several of its files share are in tests/support/gpu_support.h.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;

// Eager math on CUDA tensors (graph/eager.h): the same ops as on the CPU, no graph. argmax/argmin go through the
// max kernels: ties to the first index and NaN as the maximum on both paths (rows: warp shuffles; columns),
// exactly as on the CPU; comparisons, operators, indexing and allclose on device tensors.
TEST_CASE("eager math on cuda tensors matches the CPU", "[gpu][graph][eager]") {
    constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    Generator gen(kSeedBase + 6000);
    for (const DType dtype : {DType::f32, DType::f64}) {
        DYNAMIC_SECTION(dtype_name(dtype)) {
            // small integers: many ties; rows longer than a warp so the shuffle's tie-break is exercised
            std::uniform_int_distribution<int> digit(0, 3);
            std::vector<double> values(37 * 70);
            for (double& v : values) v = digit(gen.engine());
            values[5 * 70 + 41] = kNaN;  // row 5: one NaN late in the row
            values[9 * 70 + 0] = kNaN;   // row 9: NaN first
            values[9 * 70 + 66] = kNaN;
            const Tensor cpu = Tensor::from_vector(values, {37, 70}, dtype);
            const Tensor gpu = cpu.to(kGpu);
            for (const std::int64_t axis : {0, 1}) {
                INFO("axis " << axis);
                CHECK(argmax(gpu, axis).device() == kGpu);
                CHECK(argmax(gpu, axis).to_vector() == argmax(cpu, axis).to_vector());
                CHECK(argmin(gpu, axis).to_vector() == argmin(cpu, axis).to_vector());
                const std::vector<double> max_gpu = max(gpu, axis).to_vector(), max_cpu = max(cpu, axis).to_vector();
                REQUIRE(max_gpu.size() == max_cpu.size());
                for (std::size_t i = 0; i < max_gpu.size(); ++i)
                    CHECK((max_gpu[i] == max_cpu[i] || (std::isnan(max_gpu[i]) && std::isnan(max_cpu[i]))));
            }
            const Tensor row_argmax = argmax(gpu, 1).to(Device::cpu());
            CHECK(row_argmax.at({5}) == 41);  // the NaN
            CHECK(row_argmax.at({9}) == 0);   // the first NaN

            // operators, comparisons and indexing on device tensors: the CPU's values bit for bit
            const Tensor a = Tensor::normal({6, 1}, 0, 1, gen, dtype), b = Tensor::uniform({5}, 0.5, 2, gen, dtype);
            const Tensor ag = a.to(kGpu), bg = b.to(kGpu);
            // Bit for bit, NaN where the CPU has NaN (NaN == NaN is false, so vectors holding one never compare equal).
            const auto same = [](const Tensor& on_gpu, const Tensor& on_cpu) {
                CHECK(on_gpu.device() == kGpu);
                const std::vector<double> g = on_gpu.to_vector(), c = on_cpu.to_vector();
                REQUIRE(g.size() == c.size());
                for (std::size_t i = 0; i < g.size(); ++i) CHECK((g[i] == c[i] || (std::isnan(g[i]) && std::isnan(c[i]))));
            };
            same(ag + bg, a + b);
            same(2.0 - bg, 2.0 - b);
            same(1.0 / bg, 1.0 / b);
            same(-ag * 3.0, -a * 3.0);
            same(ag < bg, a < b);
            same(ag >= 0.0, a >= 0.0);
            same(eq(ag, ag), eq(a, a));
            same(sum(gpu, {0}), sum(cpu, {0}));
            same(gpu.select(0, -1), cpu.select(0, -1));
            same(gpu.narrow(1, 3, 4), cpu.narrow(1, 3, 4));
            same(gpu.unsqueeze(0), cpu.unsqueeze(0));
            CHECK(gpu.flatten().shares_storage_with(gpu));
            CHECK(allclose(ag, a.to(kGpu)));
            CHECK_FALSE(allclose(ag, (a + 1e-2).to(kGpu)));
            CHECK(equal(bg, b.to(kGpu)));
            CHECK_THROWS_AS(ag + b, DeviceError);  // one operand on each device
        }
    }
}

TEST_CASE("NVTX ranges around op dispatches can be switched on and off", "[gpu][graph][nvtx]") {
    const bool previous = profiling_ranges();
    set_profiling_ranges(true);
    CHECK(profiling_ranges());
    Model model(false, 15);
    const double loss = model.step(model_batch(false, 16, 900)).item();  // every forward and backward in a range
    set_profiling_ranges(previous);
    CHECK(std::isfinite(loss));
}
