#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Parameter w(Tensor::of({1, 2, 3}, DType::f64), "w");
    SGD sgd({w}, {.lr = 0.1});

    ComputeGraph graph;
    Var loss = sum(pow(graph.parameter(w), 2.0));      // Σ w², gradient 2w
    graph.backward(loss, {.retain_graph = true});       // keeps what a second backward needs
    graph.backward(loss);                                // adds a second 2w: w.grad() = 4w
    std::cout << "after two passes dloss/dw[2] = " << w.grad().at({2}) << "\n";
    bool ok = w.grad().at({2}) == 12;
    try {
        graph.backward(loss);  // the second pass released the saved tensors
        ok = false;
    } catch (const GraphError& e) {
        std::cout << "third backward: " << e.what() << "\n";
    }

    // The version counter: a step() between a forward and its backward changes the value the
    // backward needs (here w itself, which pow's gradient reads); the backward refuses to mix the two.
    ComputeGraph next;
    Var next_loss = sum(pow(next.parameter(w), 2.0));
    sgd.step();  // w -= 0.1 · w.grad(), in place
    try {
        next.backward(next_loss);
        ok = false;
    } catch (const GraphError& e) {
        std::cout << "backward after step(): " << e.what() << "\n";
    }
    return ok ? 0 : 1;
}
