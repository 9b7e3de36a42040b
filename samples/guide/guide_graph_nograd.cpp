#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(2);
    Parameter w(Tensor::normal({3, 3}, 0.0, 0.5, gen), "w");
    const Tensor x_value = Tensor::normal({5, 3}, 0.0, 1.0, gen);
    ComputeGraph graph;
    Var x = graph.input(x_value);

    {
        NoGradGuard no_grad;  // evaluation: values only, no history, the parameter is not bound
        Var prediction = linear(x, graph.parameter(w));
        std::cout << "under NoGradGuard requires_grad = " << prediction.requires_grad() << "\n";
        if (prediction.requires_grad()) return 1;
    }

    Var h = tanh(linear(x, graph.parameter(w)));
    Var target = detach(h) * 0.5;  // a leaf holding h's value: no gradient flows into it
    Var loss = mse_loss(h, target);
    graph.backward(loss);
    std::cout << "target requires_grad = " << target.requires_grad() << ", w has a gradient: " << w.grad().defined()
              << "\n";

    // A non-scalar output needs an explicit gradient of its shape, dtype and device.
    ComputeGraph vector_graph;
    Var v = vector_graph.input(Tensor::of({1, 2, 3}), "v", true);
    Var tripled = v * 3.0;
    vector_graph.backward(tripled, Tensor::full({3}, 2.0));  // vector-Jacobian product: dv = 3 · 2
    std::cout << "dv " << v.grad() << "\n";
    return !target.requires_grad() && w.grad().defined() && v.grad().at({1}) == 6 ? 0 : 1;
}
