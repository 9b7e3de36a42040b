#include <cstdint>
#include <iostream>
#include <thread>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

// One model per thread, each with its own graphs and optimizer: nothing is shared, nothing is locked.
double train(std::uint64_t seed) {
    Generator gen(seed);
    Linear model(4, 1, true, gen);
    const Tensor x = Tensor::normal({32, 4}, 0.0, 1.0, gen);
    const Tensor y = Tensor::normal({32, 1}, 0.0, 1.0, gen);
    SGD sgd(model.parameters(), {.lr = 0.05});
    double last = 0;
    for (int step = 0; step < 50; ++step) {
        ComputeGraph graph;
        Var loss = mse_loss(model(graph.input(x)), graph.input(y));
        sgd.zero_grad();
        graph.backward(loss);
        sgd.step();
        last = loss.item();
    }
    return last;
}

int main() {
    double a = 0, b = 0;
    std::thread first([&] { a = train(1); });
    std::thread second([&] { b = train(2); });
    first.join();
    second.join();
    std::cout << "final losses " << a << " and " << b << ", one thread alone " << train(1) << "\n";
    return a == train(1) && b == train(2) ? 0 : 1;  // threads change nothing in the results
}
