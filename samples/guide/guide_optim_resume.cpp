#include <filesystem>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

// A few Adam steps with a cosine schedule on fixed data.
void train(Linear& model, Adam& adam, LRScheduler& schedule, const Tensor& x, const Tensor& y, int epochs) {
    for (int epoch = 0; epoch < epochs; ++epoch) {
        ComputeGraph graph;
        Var loss = mse_loss(model(graph.input(x)), graph.input(y));
        adam.zero_grad();
        graph.backward(loss);
        adam.step();
        schedule.step();
    }
}

int main() {
    Generator data_gen(5);
    const Tensor x = Tensor::normal({16, 3}, 0.0, 1.0, data_gen), y = Tensor::normal({16, 2}, 0.0, 1.0, data_gen);

    // The reference: 6 epochs without a break.
    Generator gen_a(1);
    Linear straight(3, 2, true, gen_a);
    Adam adam_a(straight.parameters(), {.lr = 0.05});
    CosineAnnealingLR cosine_a(adam_a, 6);
    train(straight, adam_a, cosine_a, x, y, 6);

    // 3 epochs, a checkpoint (weights, Adam moments and step counts, the schedule's epoch), then a fresh
    // process would rebuild model, optimizer and schedule and load it before going on.
    const auto path = std::filesystem::temp_directory_path() / "guide_resume.safetensors";
    {
        Generator gen_b(1);
        Linear first_half(3, 2, true, gen_b);
        Adam adam_b(first_half.parameters(), {.lr = 0.05});
        CosineAnnealingLR cosine_b(adam_b, 6);
        train(first_half, adam_b, cosine_b, x, y, 3);
        save_checkpoint(path, first_half, adam_b, &cosine_b);
    }
    Generator gen_c(99);  // other initial weights: the checkpoint replaces them
    Linear resumed(3, 2, true, gen_c);
    Adam adam_c(resumed.parameters(), {.lr = 0.05});
    CosineAnnealingLR cosine_c(adam_c, 6);
    load_checkpoint(path, resumed, adam_c, &cosine_c);  // checks everything first; on error nothing changes
    std::cout << "resumed at epoch " << cosine_c.epoch() << ", lr " << adam_c.lr() << ", step count "
              << adam_c.step_count(0) << "\n";
    train(resumed, adam_c, cosine_c, x, y, 3);
    std::filesystem::remove(path);

    // Bit for bit the uninterrupted run.
    bool ok = cosine_c.epoch() == 6 && adam_c.step_count(0) == 6 &&
              equal(resumed.weight.value(), straight.weight.value()) &&
              equal(resumed.bias.value(), straight.bias.value());
    std::cout << "weight[0][0] " << resumed.weight.value().at({0, 0}) << " vs " << straight.weight.value().at({0, 0})
              << "\n" << (ok ? "ok" : "MISMATCH") << "\n";
    return ok ? 0 : 1;
}
