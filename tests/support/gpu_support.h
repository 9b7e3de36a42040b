// Shared by the files of the test_gpu executable (tests/gpu/test_gpu.cpp and the gpu_*.cpp files of the subject
// folders): the device, seeds and tolerance of the checks, their one-line report, random labels on a device,
// and the small SGD-trained model that the capture, clipping and NVTX cases step.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/dyngrad.h"

namespace dgtest::gpu {

inline constexpr double kTolerance = 1e-5;
inline constexpr std::uint64_t kSeedBase = 7'000'000;
inline const dyngrad::Device kGpu = dyngrad::Device::cuda(0);

// A gpu_vs_cpu_check result in one line, with the two sides' times.
std::string describe_result(const dyngrad::CheckResult& r);

// Under compute-sanitizer (scripts/gpu-sanitize.sh sets DYNGRAD_UNDER_SANITIZER) the large cases shrink
// sixteenfold and the deliberate out-of-memory test is left out: the tools make them take minutes.
bool under_sanitizer();

// Fills `values` with labels in [0, classes).
dyngrad::Tensor random_labels(std::int64_t n, std::int64_t classes, dyngrad::Generator& gen, dyngrad::Device device);

// A small model trained with SGD (momentum) on the GPU. Built twice from one seed, it is stepped eagerly
// once and through a cuda::CapturedStep once, and the two must agree.
struct Model {
    bool cnn;
    std::vector<dyngrad::Parameter> params;
    dyngrad::SGD optimizer;

    Model(bool cnn, std::uint64_t seed);

    // x (N,20) or (N,3,8,8) -> logits (N,10)
    dyngrad::Var forward(dyngrad::ComputeGraph& graph, const dyngrad::Var& x) const;
    // The training step: forward, loss, backward, update; returns the loss.
    dyngrad::Tensor step(std::span<const dyngrad::Tensor> in);
};

// A batch for Model: inputs (rows,20) or (rows,3,8,8) and labels in [0, 10), on the GPU.
std::vector<dyngrad::Tensor> model_batch(bool cnn, std::int64_t rows, std::uint64_t seed);

}  // namespace dgtest::gpu
