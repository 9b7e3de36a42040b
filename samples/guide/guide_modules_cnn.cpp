#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(4);
    Sequential model;
    model.add(Conv2d(1, 8, {3, 3}, {.padding = {1, 1}}, /*bias=*/true, gen))  // "0": (N,1,8,8) -> (N,8,8,8)
        .add(BatchNorm(8))                                                     // "1": per-channel statistics
        .add([](const Var& x) { return relu(x); })                             // "2": any Var(const Var&)
        .add([](const Var& x) { return max_pool2d(x, {2, 2}); })              // "3": -> (N,8,4,4)
        .add([](const Var& x) { return flatten(x); })                          // "4": -> (N,128)
        .add(Linear(8 * 4 * 4, 10, true, gen));                                // "5"
    for (const auto& [name, p] : model.named_parameters()) std::cout << name << " ";
    for (const auto& [name, t] : model.buffers()) std::cout << name << " ";
    std::cout << "\n";

    const Tensor running_mean = model.buffers()[0].second;  // shares the buffer's storage
    const double before = running_mean.at({0});
    ComputeGraph graph;
    Var logits = model(graph.input(Tensor::normal({4, 1, 8, 8}, 1.0, 1.0, gen)));
    std::cout << "logits " << describe(logits.value()) << "; running_mean[0] " << before << " -> "
              << running_mean.at({0}) << " (training mode updates it)\n";
    return logits.shape() == Shape{4, 10} && running_mean.at({0}) != before &&
                   model.named_parameters().back().first == "5.bias"
               ? 0
               : 1;
}
