// A small model zoo: the networks dyngrad-train, dyngrad-perf, dyngrad-dist-bench and the tests share (the
// library's, so that no tool reaches into another's folder); bench/torch_reference.py defines lenet5, lenet and mlp
// in PyTorch (keep them in step). Inputs are 1-channel images (N,1,H,W); convolutions are valid 5×5
// (3×3 padded for simplecnn), pools 2×2 with stride 2; 10 classes. For 28×28 inputs:
//
//   lenet5:    conv 1→6, ReLU, pool, conv 6→16, ReLU, pool, flatten (256), linear 256→120, ReLU, linear 120→10
//   lenet:     conv 1→20, pool, conv 20→50, pool, flatten (800), linear 800→500, ReLU, linear 500→10
//   simplecnn: conv 1→16 (3×3, padding 1), ReLU, pool, flatten (3136), linear 3136→10
//   mlp:       flatten (784), linear 784→500, ReLU, linear 500→10
//   lstm:      the image read row by row (28 steps of 28 pixels), LSTM of 2 layers × 128 hidden units, the
//              top layer's final hidden state (128), linear 128→10
//
// A ReLU after a linear or convolution layer is fused into it (Linear(..., Activation::Relu),
// Conv2d(..., {.activation = Activation::Relu}), one node); the index the separate ReLU had stays unused
// (Sequential::skip_index), so parameter names ("7.weight") match PyTorch's.
//
// Weights: kaiming_uniform with the ReLU gain (bound √(6 / fan_in)); biases: zeros (nn/layers.h). The LSTM's
// one flat weight, biases included: uniform(±1/√128) (ops/rnn.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dyngrad/core/tensor.h"
#include "dyngrad/nn/dataset.h"
#include "dyngrad/nn/layers.h"

namespace dyngrad::models {

// The names make_model() takes.
inline const std::vector<std::string> kModelNames = {"lenet5", "lenet", "simplecnn", "mlp", "lstm"};

// One of kModelNames for images of height × width; ValueError for another name.
Sequential make_model(const std::string& name, std::int64_t height, std::int64_t width, Generator& gen);

// Appends linear layers widths[0]→widths[1]→…→widths.back() with a ReLU between two of them (none after
// the last; each fused into the layer before it) to `model`. ValueError for fewer than two widths.
void add_mlp(Sequential& model, const std::vector<std::int64_t>& widths, Generator& gen);

// A model of add_mlp's layers alone, for inputs (N, widths[0]).
Sequential make_mlp(const std::vector<std::int64_t>& widths, Generator& gen);

}  // namespace dyngrad::models
