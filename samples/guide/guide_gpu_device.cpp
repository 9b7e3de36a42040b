#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

double loss_of(Sequential& model, const Tensor& x, const Tensor& labels) {
    NoGradGuard no_grad;
    ComputeGraph graph;
    return cross_entropy(model(graph.input(x)), graph.input(labels)).item();  // item() waits for the GPU
}

int main() {
    std::cout << "CUDA compiled: " << cuda_compiled() << ", devices: " << cuda_device_count() << "\n";
    if (cuda_device_count() == 0) {
        std::cout << "no CUDA device: the GPU part is skipped\n";
        return 77;  // CTest reports the test as skipped
    }
    const Device gpu = Device::cuda(0);
    std::cout << cuda::device_name(0) << "\n";

    Generator gen(13);
    Sequential model;
    model.add(Linear(16, 32, true, gen, Activation::Relu)).skip_index().add(Linear(32, 4, true, gen));
    const Tensor x = Tensor::normal({64, 16}, 0.0, 1.0, gen);
    std::vector<std::int64_t> labels(64);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int64_t(i % 4);
    const Tensor y = Tensor::from_vector(labels, {64});

    const double on_cpu = loss_of(model, x, y);
    model.to(gpu);  // moves every parameter and buffer; create optimizers after moving
    const Tensor x_gpu = x.to(gpu), y_gpu = y.to(gpu);
    const double on_gpu = loss_of(model, x_gpu, y_gpu);
    std::cout << "loss on the CPU " << on_cpu << ", on the GPU " << on_gpu << "\n";

    SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});  // one fused update kernel per step
    for (int step = 0; step < 20; ++step) {
        ComputeGraph graph;
        Var loss = cross_entropy(model(graph.input(x_gpu)), graph.input(y_gpu));
        sgd.zero_grad();
        graph.backward(loss);
        sgd.step();  // queued on the device's stream: nothing here waits for the GPU
    }
    const double trained = loss_of(model, x_gpu, y_gpu);
    const cuda::MemoryStats memory = cuda::memory_stats(0);
    std::cout << "after 20 steps " << trained << "; device memory in use " << memory.bytes_in_use << " bytes, peak "
              << memory.peak_bytes_in_use << "\n";
    return std::abs(on_cpu - on_gpu) < 1e-4 * std::abs(on_cpu) && trained < on_gpu ? 0 : 1;
}
