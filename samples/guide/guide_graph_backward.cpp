#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(1);
    Parameter w(Tensor::normal({3, 1}, 0.0, 1.0, gen, DType::f64), "w");  // outlives graphs
    const Tensor x_value = Tensor::uniform({4, 3}, -1.0, 1.0, gen, DType::f64);

    ComputeGraph graph;  // records one forward pass
    Var x = graph.input(x_value, "x", /*requires_grad=*/true);
    Var y = matmul(x, graph.parameter(w)).name("y");  // (4,1); the name appears in error messages
    Var loss = sum(y * y);                           // operators record nodes like the named functions
    graph.backward(loss);                            // one reverse sweep from the loss

    // By hand: dloss/dw = 2 xᵀ(x w), dloss/dx = 2 (x w) wᵀ.
    const std::vector<double> xs = x_value.to_vector(), ws = w.value().to_vector(), ys = y.value().to_vector();
    double worst = 0;
    for (int j = 0; j < 3; ++j) {
        double dw = 0;
        for (int i = 0; i < 4; ++i) {
            dw += 2 * xs[i * 3 + j] * ys[i];
            worst = std::max(worst, std::abs(x.grad().at({i, j}) - 2 * ys[i] * ws[j]));
        }
        worst = std::max(worst, std::abs(w.grad().at({j, 0}) - dw));
    }
    std::cout << "loss " << loss.item() << ", dloss/dw " << w.grad() << ", worst error " << worst << "\n";

    // A Parameter's gradient accumulates over backward passes and graphs until zero_grad().
    const double first = w.grad().at({0, 0});
    ComputeGraph second;
    Var again = matmul(second.input(x_value), second.parameter(w));
    second.backward(sum(again * again));
    std::cout << "after a second graph: " << w.grad().at({0, 0}) << " = 2 x " << first << "\n";
    const bool accumulated = std::abs(w.grad().at({0, 0}) - 2 * first) < 1e-12;
    w.zero_grad();
    return worst < 1e-12 && accumulated && !w.grad().defined() ? 0 : 1;
}
