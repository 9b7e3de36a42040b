#include <cmath>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(3);
    Linear embed(4, 16, true, gen, Activation::Relu), body(16, 16, true, gen, Activation::Relu),
        head(16, 1, true, gen);
    // Freeze the first layer: recorded as constants, no gradient, skipped by optimizers and clipping.
    for (Parameter& p : embed.parameters()) p.set_requires_grad(false);
    const Tensor embed_before = embed.weight.value().clone();

    // Two groups: the body takes the optimizer's defaults, the head its own lr and no weight decay.
    SGD sgd({{.parameters = body.parameters()}, {.parameters = head.parameters(), .lr = 0.05, .weight_decay = 0}},
            {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
    StepLR schedule(sgd, 2, 0.5);  // each group decays from its own base lr

    const Tensor x = Tensor::normal({32, 4}, 0.0, 1.0, gen), y = Tensor::normal({32, 1}, 0.0, 1.0, gen);
    bool clipped = true;
    for (int epoch = 0; epoch < 4; ++epoch) {
        ComputeGraph graph;
        Var loss = mse_loss(head(body(embed(graph.input(x)))), graph.input(y));
        sgd.zero_grad();
        graph.backward(loss);
        // Rescales all gradients together so their 2-norm is at most 0.1; returns the norm before clipping
        // as a 0-d tensor (on a GPU it stays there: reading it with item() is the only synchronisation).
        Tensor norm = clip_grad_norm(sgd.parameters(), 0.1);
        double squares = 0;  // the norm after clipping, from the gradients themselves
        for (const Parameter& p : sgd.parameters()) squares += sum(p.grad() * p.grad()).item();
        clipped = clipped && norm.item() > 0.1 && std::sqrt(squares) <= 0.1 * (1 + 1e-6);
        sgd.step();
        schedule.step();
        std::cout << "epoch " << epoch << " loss " << loss.item() << " grad norm " << norm.item() << " lr "
                  << sgd.lr(0) << " / " << sgd.lr(1) << "\n";
    }
    // After 4 epochs with step_size 2: each base lr times 0.5^2.
    bool ok = sgd.lr(0) == 0.01 * 0.25 && sgd.lr(1) == 0.05 * 0.25 && !embed.weight.grad().defined() &&
              equal(embed.weight.value(), embed_before) && clipped;
    std::cout << (ok ? "ok" : "MISMATCH") << "\n";
    return ok ? 0 : 1;
}
