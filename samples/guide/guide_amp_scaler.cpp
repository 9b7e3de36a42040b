#include <iostream>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(3);
    const Tensor x = Tensor::uniform({64, 8}, -1.0, 1.0, gen);
    const Tensor y = matmul(x, Tensor::uniform({8, 1}, -1.0, 1.0, gen));  // eager: no graph, no history
    Sequential model;
    model.add(Linear(8, 32, true, gen, Activation::Relu)).add(Linear(32, 1, true, gen));
    Adam adam(model.parameters(), {.lr = 1e-2});
    GradScaler scaler;  // float16 needs loss scaling (bfloat16 does not): initial scale 65536

    const auto train_step = [&](double loss_factor) {
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(DType::f16);               // linear in f16 ...
            const Var prediction = model(graph.input(x));
            loss = mse_loss(prediction, graph.input(y)) * loss_factor;  // ... the loss in f32
        }
        adam.zero_grad();
        graph.backward(scaler.scale(loss));  // loss · scale: small f16 gradients stay representable
        scaler.unscale(adam);                // true gradients, for clipping
        clip_grad_norm(model.parameters(), 1.0);
        scaler.step(adam);                   // skipped whole when a gradient is inf/NaN
        scaler.update();                     // halve the scale after a skip, double it after 2000 clean steps
        return loss.item();
    };

    const double first = train_step(1.0);
    double last = first;
    for (int step = 1; step < 100; ++step) last = train_step(1.0);
    std::cout << "f16 autocast: loss " << first << " -> " << last << ", scale " << scaler.scale_value() << "\n";

    // An overflow: the gradients of a huge loss are inf in f16, so the step is skipped and the scale halves.
    const std::vector<double> before = model.parameters()[0].value().to_vector();
    const double scale = scaler.scale_value();
    train_step(1e30);
    const bool skipped = scaler.last_step_skipped() && scaler.scale_value() == scale / 2 &&
                         model.parameters()[0].value().to_vector() == before;
    std::cout << "overflow step skipped: " << skipped << ", scale " << scaler.scale_value() << "\n";

    // bfloat16: the same range as float32, so no scaler; autocast alone.
    ComputeGraph graph;
    const AutocastGuard autocast(DType::bf16);
    const Var prediction = model(graph.input(x));
    std::cout << "bf16 prediction dtype: " << dtype_name(prediction.value().dtype()) << "\n";
    return last < 0.2 * first && skipped && prediction.value().dtype() == DType::bf16 ? 0 : 1;
}
