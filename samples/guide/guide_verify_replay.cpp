#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(16);
    Sequential model;
    model.add(Linear(8, 16, true, gen, Activation::Relu)).skip_index().add(Linear(16, 3, true, gen));
    const Tensor x = Tensor::normal({32, 8}, 0.0, 1.0, gen);
    const Tensor y = Tensor::normal({32, 3}, 0.0, 1.0, gen);

    // verify(): replays the recorded graph on the CPU in float64 from copies of its leaves and compares
    // every node's value and gradient (on a GPU run: the GPU against the CPU).
    ComputeGraph graph;
    Var loss = mse_loss(model(graph.input(x)), graph.input(y));
    const VerifyReport report = verify(graph, loss);  // no backward yet: verify runs it
    std::cout << report.summary() << "\n" << report.table();
    model.zero_grad();

    // ShadowVerifier: the same check on every k-th step of a real training loop.
    SGD sgd(model.parameters(), {.lr = 0.05});
    ShadowVerifier shadow(/*every_k_steps=*/5);  // throws GraphError with the report when a check fails
    for (std::int64_t step = 0; step < 20; ++step) {
        ComputeGraph g;
        Var l = mse_loss(model(g.input(x)), g.input(y));
        sgd.zero_grad();
        g.backward(l, shadow.backward_options(step));  // keeps every node's gradient on due steps
        if (shadow.due(step)) shadow.check(g, l);      // after backward, before the step
        sgd.step();
    }
    std::cout << "shadow checks " << shadow.checks() << ", failures " << shadow.failures() << ": "
              << shadow.last_report().summary() << "\n";
    return report.pass && shadow.checks() == 4 && shadow.failures() == 0 ? 0 : 1;
}
