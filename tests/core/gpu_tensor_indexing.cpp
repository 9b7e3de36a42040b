// Tensor's select and narrow on a CUDA tensor (core/tensor_indexing.cpp over device_memory::copy_blocks: one
// strided copy, or one plain copy where the window is contiguous) against the same calls on the CPU, bit for bit,
// in every dtype; inside a captured step too.
// Part of the test_gpu executable (tests/CMakeLists.txt: every tests/*/gpu_*.cpp; its main is in
// tests/gpu/test_gpu.cpp); the helpers several of its files share are in tests/support/gpu_support.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "catch.h"
#include "dyngrad/core/device_memory.h"
#include "dyngrad/dyngrad.h"
#include "gpu_support.h"
#include "test_support.h"

using namespace dyngrad;
using namespace dgtest::gpu;

TEST_CASE("select and narrow of a cuda tensor copy the CPU's window bit for bit", "[gpu][core][indexing]") {
    Generator gen(kSeedBase + 7000);
    const auto draw = [&](std::int64_t low, std::int64_t high) {
        return std::uniform_int_distribution<std::int64_t>(low, high)(gen.engine());
    };
    for (const DType dtype : {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16}) {
        DYNAMIC_SECTION(dtype_name(dtype)) {
            for (int trial = 0; trial < 40; ++trial) {
                // Up to (40, 33, 17, 9): strided windows of many rows, row lengths off every vector width; an
                // empty axis in every seventh trial.
                constexpr std::int64_t kLargest[] = {40, 33, 17, 9};
                Shape shape;
                const std::int64_t rank = 1 + trial % 4;
                for (std::int64_t i = 0; i < rank; ++i) shape.push_back(draw(trial % 7 == 6 ? 0 : 1, kLargest[i]));
                std::vector<double> values = Tensor::normal(shape, 0.0, 30.0, gen, DType::f64).to_vector();
                for (double& v : values) v = std::round(v);  // exact in every dtype, int64 included
                const Tensor cpu = Tensor::from_vector(values, shape, dtype);
                const Tensor gpu = cpu.to(kGpu);
                const std::int64_t axis = draw(-rank, rank - 1);
                const std::int64_t n = shape[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)];
                const std::int64_t start = draw(0, n), length = draw(0, n - start);
                INFO(to_string(shape) << " axis " << axis << " narrow " << start << " " << length);
                const Tensor window = gpu.narrow(axis, start, length);
                CHECK(window.device() == kGpu);
                CHECK(window.dtype() == dtype);
                CHECK(equal(window.to(Device::cpu()), cpu.narrow(axis, start, length)));
                if (n > 0) {
                    const std::int64_t index = draw(-n, n - 1);
                    INFO("select " << index);
                    CHECK(equal(gpu.select(axis, index).to(Device::cpu()), cpu.select(axis, index)));
                }
            }
        }
    }
}

TEST_CASE("narrow of a cuda tensor runs inside a captured step", "[gpu][core][indexing][capture]") {
    Generator gen(kSeedBase + 7100);
    const Tensor x = Tensor::normal({64, 37}, 0.0, 1.0, gen).to(kGpu);
    cuda::CapturedStep step([](std::span<const Tensor> in) { return in[0].narrow(1, 5, 19).select(0, -1); });
    const Tensor eager = x.narrow(1, 5, 19).select(0, -1);
    const std::vector<Tensor> inputs = {x};
    for (int i = 0; i < 3; ++i) {  // warm-up, capture, replay
        const Tensor captured = step.run(inputs);
        CHECK(equal(captured.to(Device::cpu()), eager.to(Device::cpu())));
    }
    CHECK(step.variants() == 1);
}

// device_memory::copy_ranges (distributed/: gradients into a flat buffer): many ranges, one kernel per 64; every
// alignment from 1 to 16 bytes (offsets and lengths drawn freely), lengths from 0 to past one block's share.
TEST_CASE("copy_ranges on a cuda device copies every range and nothing else", "[gpu][core][copy_ranges]") {
    Generator gen(kSeedBase + 7100);
    const auto draw = [&](std::int64_t low, std::int64_t high) {
        return std::uniform_int_distribution<std::int64_t>(low, high)(gen.engine());
    };
    for (const int count : {1, 63, 64, 65, 150}) {
        INFO(count << " ranges");
        std::vector<std::int64_t> lengths, src_at, dst_at;
        std::int64_t src_bytes = 0, dst_bytes = 0;
        for (int i = 0; i < count; ++i) {
            const std::int64_t length = i % 17 == 0 ? draw(20000, 90000) : draw(0, 300);
            lengths.push_back(length);
            src_at.push_back(src_bytes + draw(0, 15));
            dst_at.push_back(dst_bytes + draw(0, 15));
            src_bytes = src_at.back() + length;
            dst_bytes = dst_at.back() + length;
        }
        // Random bytes on both sides: a byte written outside a range would show.
        std::vector<std::uint8_t> src_host(static_cast<std::size_t>(src_bytes)), dst_host(static_cast<std::size_t>(dst_bytes));
        for (auto& b : src_host) b = static_cast<std::uint8_t>(draw(0, 255));
        for (auto& b : dst_host) b = static_cast<std::uint8_t>(draw(0, 255));
        // f64 tensors as byte buffers (the device's allocation), written and read through device_memory::copy.
        const Tensor src = Tensor::empty({(src_bytes + 7) / 8 + 1}, DType::f64, kGpu);
        const Tensor dst = Tensor::empty({(dst_bytes + 7) / 8 + 1}, DType::f64, kGpu);
        device_memory::copy(src.raw_data(), kGpu, src_host.data(), Device::cpu(), src_host.size());
        device_memory::copy(dst.raw_data(), kGpu, dst_host.data(), Device::cpu(), dst_host.size());
        std::vector<device_memory::CopyRange> ranges;
        for (int i = 0; i < count; ++i) {
            const auto k = static_cast<std::size_t>(i);
            ranges.push_back({static_cast<char*>(dst.raw_data()) + dst_at[k],
                              static_cast<const char*>(src.raw_data()) + src_at[k], static_cast<std::size_t>(lengths[k])});
            std::copy_n(src_host.begin() + src_at[k], lengths[k], dst_host.begin() + dst_at[k]);  // the expected bytes
        }
        device_memory::copy_ranges(ranges, kGpu.index);
        std::vector<std::uint8_t> got(dst_host.size());
        device_memory::copy(got.data(), Device::cpu(), dst.raw_data(), kGpu, got.size());
        CHECK(got == dst_host);
    }
}
