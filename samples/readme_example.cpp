#include <cstdint>
#include <iostream>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    const Device device = cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
    Generator gen(42);
    // Parameters outlive graphs; their gradients accumulate until zero_grad().
    Parameter w(Tensor::normal({3, 4}, 0.0, 0.5, gen, DType::f32, device), "w");
    Parameter b(Tensor::zeros({3}, DType::f32, device), "b");

    ComputeGraph graph;  // records the nodes of one forward pass
    Var x = graph.input(Tensor::uniform({8, 4}, -1.0, 1.0, gen, DType::f32, device), "x");
    Var labels = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0, 1}, {8}, device));
    Var logits = linear(x, graph.parameter(w), graph.parameter(b));  // x·wᵀ + b
    Var loss = cross_entropy(logits, labels);

    graph.backward(loss);  // one reverse sweep over the recorded nodes
    std::cout << "loss " << loss.item() << " on " << device.to_string() << "\n";
    std::cout << "dloss/dw " << w.grad().to(Device::cpu()) << "\n";
}
