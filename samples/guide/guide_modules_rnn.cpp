#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(5);
    LSTM lstm(10, {.hidden_size = 16, .num_layers = 2}, gen);  // input size 10
    GRU gru(10, {.hidden_size = 8, .bidirectional = true}, gen);
    RNN rnn(10, {.hidden_size = 8}, /*relu=*/false, gen);     // Elman, tanh

    ComputeGraph graph;
    Var x = graph.input(Tensor::normal({7, 4, 10}, 0.0, 1.0, gen));  // (T,N,I): sequence-major
    RnnResult l = lstm(x);                                            // zero initial states
    RnnResult g = gru(x, graph.input(Tensor::zeros({2, 4, 8})));      // h0 (L·D,N,H)
    RnnResult r = rnn(x);
    std::cout << "lstm output " << describe(l.output.value()) << ", h_n " << describe(l.h_n.value()) << ", c_n "
              << describe(l.c_n.value()) << "\ngru output " << describe(g.output.value()) << ", rnn h_n "
              << describe(r.h_n.value()) << "\n";

    graph.backward(mean(l.output) + mean(g.h_n) + mean(r.output));
    // One flat weight per layer stack, in cuDNN's layout; rnn_weight_layout() names its blocks.
    const auto layout = rnn_weight_layout(RnnMode::Lstm, lstm.options, lstm.input_size);
    std::cout << "lstm.weight " << describe(lstm.weight.value()) << ": " << layout.size() << " blocks, first "
              << layout.front().name << " " << to_string(layout.front().shape) << "\n";
    return l.output.shape() == Shape{7, 4, 16} && g.output.shape() == Shape{7, 4, 16} &&
                   l.c_n.shape() == Shape{2, 4, 16} && lstm.weight.grad().shape() == lstm.weight.value().shape()
               ? 0
               : 1;
}
