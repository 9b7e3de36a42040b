// The classic demo: a batch of 32 inputs of 100×100 times a 100×50 weight, ReLU, summed; forward and
// backward on the GPU and on the CPU, the first 5×5 of the output and of both gradients for each,
// the average differences and the speedup.
//
//   x (32,100,100) → reshape (3200,100) → matmul w (100,50) → relu → sum
#include <dyngrad/dyngrad.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "../cli/command_line.h"

using namespace dyngrad;

namespace {

struct Result {
    Tensor output, input_grad, weight_grad;
    double ms = 0;
};

constexpr std::int64_t kBatch = 32, kRows = 100, kCols = 100, kOut = 50;

Result run(const Tensor& x_host, const Tensor& w_host, Device device, int repetitions) {
    const Tensor x_value = x_host.to(device);
    const Tensor w_value = w_host.to(device);
    Result result;
    double best = 1e30;
    for (int rep = 0; rep < repetitions; ++rep) {
        if (device.is_cuda()) cuda::synchronize(device.index);
        const auto start = std::chrono::steady_clock::now();
        ComputeGraph graph;
        Var x = graph.input(x_value, "input", true);
        Var w = graph.input(w_value, "weight", true);
        Var y = relu(reshape(matmul(reshape(x, {kBatch * kRows, kCols}), w), {kBatch, kRows, kOut}));
        Var loss = sum(y);
        graph.backward(loss);
        result.output = y.value().to(Device::cpu());
        result.input_grad = x.grad().to(Device::cpu());
        result.weight_grad = w.grad().to(Device::cpu());
        best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    result.ms = best;
    return result;
}

void print_corner(const char* title, const Tensor& t) {
    std::printf("%s first 5x5:\n", title);
    const Tensor m = t.reshaped({t.numel() / t.shape().back(), t.shape().back()});
    for (std::int64_t r = 0; r < 5; ++r) {
        for (std::int64_t c = 0; c < 5; ++c) std::printf("%g ", m.at({r, c}));
        std::printf("\n");
    }
}

double average_difference(const Tensor& a, const Tensor& b) {
    const auto va = a.to_vector(), vb = b.to_vector();
    double total = 0;
    for (std::size_t i = 0; i < va.size(); ++i) total += std::fabs(va[i] - vb[i]);
    return total / static_cast<double>(va.size());
}

void print_result(const char* title, const Result& r) {
    std::printf("====== %s ======\n", title);
    print_corner("Output", r.output);
    print_corner("Input gradient", r.input_grad);
    print_corner("Weight gradient", r.weight_grad);
}

}  // namespace

int main(int argc, char** argv) {
    return cli::guarded_main("matmul_relu", [&] {
        const cli::Arguments args(argc, argv, {.flags = {"--cpu"}});
        if (args.help()) {
            std::puts("usage: matmul_relu [--cpu]");
            return 0;
        }
        const bool cpu_only = args.has("--cpu");
        Generator gen(42);
        const Tensor x = Tensor::uniform({kBatch, kRows, kCols}, 0.0, 1.0, gen);
        const Tensor w = Tensor::uniform({kCols, kOut}, 0.0, 1.0, gen);
        std::printf("====== Configuration ======\nInput matrix: %lld x %lld\nWeight matrix: %lld x %lld\n"
                    "Batch size: %lld\nActivation: ReLU\n",
                    (long long)kRows, (long long)kCols, (long long)kCols, (long long)kOut, (long long)kBatch);
        const Result cpu = run(x, w, Device::cpu(), 3);
        if (cpu_only || cuda_device_count() == 0) {
            print_result("CPU Results", cpu);
            std::printf("CPU computation time: %.3f ms\n(no CUDA device: GPU part skipped)\n", cpu.ms);
            return 0;
        }
        const Result gpu = run(x, w, Device::cuda(0), 20);
        print_result("CUDA Results", gpu);
        print_result("CPU Verification", cpu);
        std::printf("====== Verification Results ======\n");
        std::printf("Average output difference: %g\n", average_difference(gpu.output, cpu.output));
        std::printf("Average input gradient difference: %g\n", average_difference(gpu.input_grad, cpu.input_grad));
        std::printf("Average weight gradient difference: %g\n", average_difference(gpu.weight_grad, cpu.weight_grad));
        std::printf("====== Performance Comparison ======\n");
        std::printf("CUDA computation time: %.3f ms (best of 20, forward+backward+copies back)\n", gpu.ms);
        std::printf("CPU computation time: %.3f ms (best of 3)\n", cpu.ms);
        std::printf("Speedup: %.1fx\n", cpu.ms / gpu.ms);
        return 0;
    }, " (--help shows the usage)");
}
