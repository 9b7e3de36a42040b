#include <cmath>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    // A critic trained on the gradient penalty alone, E[(‖∇x D(x)‖ − 1)²] (WGAN-GP's term; samples/wgan_gp.cpp has
    // the whole Fashion-MNIST training): the penalty's gradient with respect to the critic's weights is second order.
    Generator gen(3);
    Linear fc1(8, 16, true, gen), fc2(16, 1, true, gen);
    std::vector<Parameter> params = fc1.parameters();
    for (const Parameter& p : fc2.parameters()) params.push_back(p);
    Adam opt(params, {.lr = 1e-2});
    const auto critic = [&](const Var& x) { return fc2(tanh(fc1(x))); };

    double first = 0, last = 0;
    for (int step = 0; step < 200; ++step) {
        ComputeGraph graph;
        const Var x = graph.input(Tensor::normal({32, 8}, 0.0, 1.0, gen), "x", true);
        const Var g = grad({sum(critic(x))}, {x}, {}, {.create_graph = true})[0];  // ∇x D, one row per sample
        const Var norm = sqrt(sum(mul(g, g), {1}) + 1e-12);
        const Var penalty = mean(mul(norm - 1.0, norm - 1.0));
        opt.zero_grad();
        graph.backward(penalty);  // through the gradient into fc1 and fc2
        opt.step();
        (step == 0 ? first : last) = penalty.item();
    }
    std::cout << "penalty: first step " << first << ", last step " << last << "\n";
    return last < 0.1 * first ? 0 : 1;
}
