#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(7);
    // Synthetic regression data: y = x·w_true + 0.5, computed without recording a history.
    const Tensor x = Tensor::uniform({128, 3}, -1.0, 1.0, gen);
    Tensor y;
    {
        NoGradGuard no_grad;
        ComputeGraph data;
        const Tensor w_true = Tensor::of({2.0, -1.0, 0.5}).reshaped({3, 1});
        y = (matmul(data.input(x), data.input(w_true)) + 0.5).value();  // the tensor outlives its graph
    }

    Sequential model;
    model.add(Linear(3, 32, true, gen, Activation::Relu)).skip_index().add(Linear(32, 1, true, gen));
    Adam adam(model.parameters(), {.lr = 1e-2});  // also: SGD(params, {.lr, .momentum, .nesterov, .weight_decay})
                                                  //       AdamW(params, {.lr, .weight_decay = 0.01})
    double first = 0, last = 0;
    for (int step = 0; step < 300; ++step) {
        ComputeGraph graph;
        Var loss = mse_loss(model(graph.input(x)), graph.input(y));
        adam.zero_grad();
        graph.backward(loss);
        adam.step();
        last = loss.item();
        if (step == 0) first = last;
        if (step % 100 == 0) std::cout << "step " << step << " loss " << last << "\n";
    }
    std::cout << "loss " << first << " -> " << last << "; parameter 0 took " << adam.step_count(0) << " steps\n";
    return last < 0.01 * first ? 0 : 1;
}
