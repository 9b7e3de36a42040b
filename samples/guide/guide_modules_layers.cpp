#include <algorithm>
#include <cmath>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(12);
    Embedding embed(10, 8, gen, /*padding_idx=*/0);  // row 0 starts at zero and never gets a gradient
    LayerNorm norm({8});                               // weight ones, bias zeros, eps 1e-5
    Linear hidden(8, 16, true, gen);                   // Init::Torch: weight and bias uniform(±1/√8)
    GELU gelu_tanh(GeluApproximation::Tanh);           // GELU() is the exact erf form
    RMSNorm rms({16});
    SiLU silu_layer;
    Linear classify(16, 3, true, gen);

    ComputeGraph graph;
    Var tokens = graph.input(Tensor::from_vector(std::vector<std::int64_t>{3, 0, 7, 3, 9, 0}, {6}));
    Var features = norm(embed(tokens));                                  // (6, 8)
    Var logits = classify(silu_layer(rms(gelu_tanh(hidden(features)))));  // (6, 3)
    // Label -100 (the default ignore_index) leaves a position out of the loss, e.g. padding.
    Var labels = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, -100, 2, 1, 2, -100}, {6}));
    Var loss = cross_entropy(logits, labels, {.label_smoothing = 0.1});
    graph.backward(loss);

    const Tensor& embed_grad = embed.weight.grad();
    const Tensor row_means = mean(features.value(), {1});  // LayerNorm: each row has mean 0
    double largest_mean = 0, padding_grad = 0, largest_w = 0;
    for (double m : row_means.to_vector()) largest_mean = std::max(largest_mean, std::abs(m));
    for (std::int64_t j = 0; j < 8; ++j) padding_grad += std::abs(embed_grad.at({0, j}));
    for (double w : hidden.weight.value().to_vector()) largest_w = std::max(largest_w, std::abs(w));
    std::cout << "loss " << loss.item() << ", largest row mean " << largest_mean << ", padding-row gradient "
              << padding_grad << ", largest |w| " << largest_w << " (bound " << 1 / std::sqrt(8.0) << ")\n";

    // The layers' functions also run eagerly on Tensors.
    const Tensor x = Tensor::of({-1.0, 0.0, 2.0});
    std::cout << "gelu " << gelu(x) << ", silu " << silu(x) << "\n";
    return std::isfinite(loss.item()) && largest_mean < 1e-5 && padding_grad == 0 &&
                   embed_grad.at({3, 0}) != 0 && largest_w <= 1 / std::sqrt(8.0) &&
                   allclose(silu(x), x * sigmoid(x))
               ? 0
               : 1;
}
