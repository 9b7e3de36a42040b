#include <cmath>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Parameter p(Tensor::zeros({1}), "p");
    SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
    StepLR decay(sgd, /*step_size=*/2, /*gamma=*/0.5);  // lr = 0.1 · 0.5^floor(epoch / 2)
    for (int epoch = 0; epoch < 6; ++epoch) {
        std::cout << "epoch " << epoch << " lr " << sgd.lr() << "\n";
        // ... this epoch's optimizer steps ...
        decay.step();  // once per epoch, after its steps
    }

    Adam adam({p}, {.lr = 1e-3});
    CosineAnnealingLR cosine(adam, /*t_max=*/10, /*eta_min=*/1e-5);
    std::cout << "cosine lr at epochs 0, 5, 10: " << cosine.lr_at(0) << " " << cosine.lr_at(5) << " "
              << cosine.lr_at(10) << "\n";
    const bool ok = std::abs(sgd.lr() - 0.0125) < 1e-12 && decay.epoch() == 6 &&
                    std::abs(cosine.lr_at(5) - (1e-3 + 1e-5) / 2) < 1e-12 && std::abs(cosine.lr_at(10) - 1e-5) < 1e-12;
    return ok ? 0 : 1;
}
