// max_pool2d on the GPU (ops/pool.cu's own kernels) against the CPU, bit for bit: the same first-maximal-element
// rule on inputs full of ties, NaN propagation, overlapping windows, padding and rows no window covers.
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp).
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;

namespace {

struct PoolRun {
    Tensor y, dx;
};

PoolRun run_max_pool(const Tensor& x, const Tensor& dy, std::array<std::int64_t, 2> kernel,
                     std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> padding) {
    ComputeGraph graph;
    const Var input = graph.input(x, "x", true);
    const Var y = max_pool2d(input, kernel, stride, padding);
    graph.backward(y, dy);
    return {y.value().to(Device::cpu()), input.grad().to(Device::cpu())};
}

// Equal as values, NaN equal to NaN.
bool same(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
    const std::vector<double> u = a.to_vector(), v = b.to_vector();
    for (std::size_t i = 0; i < u.size(); ++i)
        if (!(u[i] == v[i] || (std::isnan(u[i]) && std::isnan(v[i])))) return false;
    return true;
}

}  // namespace

TEST_CASE("max_pool2d on the GPU equals the CPU bit for bit: ties, NaN, overlapping windows", "[gpu][ops][pool]") {
    struct PoolCase {
        const char* label;
        Shape x;
        std::array<std::int64_t, 2> kernel, stride, padding;
    };
    const PoolCase cases[] = {
        {"2x2 stride 2 (lenet)", {4, 6, 24, 24}, {2, 2}, {2, 2}, {0, 0}},
        {"2x2 stride 2, odd sizes: a row and a column in no window", {3, 5, 9, 7}, {2, 2}, {2, 2}, {0, 0}},
        {"3x3 stride 1 pad 1: every element in up to 9 windows", {2, 4, 11, 13}, {3, 3}, {1, 1}, {1, 1}},
        {"3x3 stride 2 pad 1", {2, 3, 10, 9}, {3, 3}, {2, 2}, {1, 1}},
        {"5x2 stride 3,1 pad 2,1", {2, 2, 17, 8}, {5, 2}, {3, 1}, {2, 1}},
    };
    std::mt19937_64 rng(kSeedBase + 9100 + std::random_device{}());
    std::uniform_int_distribution<int> small(-3, 3);  // ties in nearly every window
    std::bernoulli_distribution nan_here(0.01);
    for (const PoolCase& c : cases)
        for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
            DYNAMIC_SECTION(c.label << " " << dtype_name(dtype)) {
                std::int64_t n = 1;
                for (const std::int64_t d : c.x) n *= d;
                std::vector<double> values(static_cast<std::size_t>(n));
                for (double& v : values)
                    v = nan_here(rng) ? std::numeric_limits<double>::quiet_NaN() : small(rng) * 0.5;
                const Tensor x = Tensor::from_vector(values, c.x, dtype);
                const Shape y_shape = max_pool2d(x, c.kernel, c.stride, c.padding).shape();
                std::int64_t m = 1;
                for (const std::int64_t d : y_shape) m *= d;
                std::vector<double> grads(static_cast<std::size_t>(m));
                for (double& g : grads) g = small(rng);  // integers: every sum exact in every dtype, any order
                const Tensor dy = Tensor::from_vector(grads, y_shape, dtype);
                const PoolRun cpu = run_max_pool(x, dy, c.kernel, c.stride, c.padding);
                const PoolRun gpu = run_max_pool(x.to(kGpu), dy.to(kGpu), c.kernel, c.stride, c.padding);
                CHECK(same(gpu.y, cpu.y));
                CHECK(same(gpu.dx, cpu.dx));
                // The backward gathers: run twice, the same bits (no atomics).
                CHECK(same(run_max_pool(x.to(kGpu), dy.to(kGpu), c.kernel, c.stride, c.padding).dx, gpu.dx));
            }
        }
}

// max over the last axis (ops/reduce.cu's row kernel: 16-byte loads when every row starts 16-byte aligned, element
// loads otherwise) against the CPU: values and the int64 argmax bit for bit, ties to the first index, the first NaN
// winning, in every floating dtype; the gradient lands on the argmax.
TEST_CASE("max over rows on the GPU equals the CPU: ties, NaN, packed and unpacked rows, every dtype",
          "[gpu][ops][reduce]") {
    std::mt19937_64 rng(kSeedBase + 9200 + std::random_device{}());
    std::uniform_int_distribution<int> small(-3, 3);  // ties in every row
    std::bernoulli_distribution nan_here(0.02);
    const Shape shapes[] = {{256, 1024}, {37, 64}, {9, 40}, {5, 7}, {3, 130}, {1, 4096}};
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64})
        for (const Shape& shape : shapes) {
            INFO(dtype_name(dtype) << " " << to_string(shape));
            std::vector<double> values(static_cast<std::size_t>(numel(shape)));
            for (double& v : values)
                v = nan_here(rng) ? std::numeric_limits<double>::quiet_NaN() : static_cast<double>(small(rng));
            const Tensor x = Tensor::from_vector(values, shape).to(dtype);
            const auto run = [&](Device device) {
                ComputeGraph graph;
                const Var input = graph.input(x.to(device), "x", true);
                const auto [peak, index] = max_with_indices(input, -1, true);
                graph.backward(peak, Tensor::ones(peak.shape(), dtype).to(device));
                return std::array<Tensor, 3>{peak.value().to(Device::cpu()), index.value().to(Device::cpu()),
                                             input.grad().to(Device::cpu())};
            };
            const std::array<Tensor, 3> cpu = run(Device::cpu()), gpu = run(kGpu);
            CHECK(same(gpu[0], cpu[0]));
            CHECK(gpu[1].to_vector() == cpu[1].to_vector());
            CHECK(same(gpu[2], cpu[2]));
        }
}
