// Recurrent ops: cuDNN's four cells (LSTM, GRU, tanh and ReLU RNN), multi-layer, uni- or
// bidirectional. CPU: ops/rnn.cpp (Eigen, backpropagation through time). GPU: ops/rnn.cu (cuDNN's
// cudnnRNNForward / cudnnRNNBackwardData_v8 / cudnnRNNBackwardWeights_v8).
//
// Shapes: T time steps, N sequences, I input features, H hidden units, L layers, D directions (2 when
// bidirectional), G gates (lstm 4, gru 3, rnn_tanh and rnn_relu 1).
//   x (T,N,I) sequence-major; h0, c0 (L·D,N,H), zeros when left out (c0: lstm only);
//   output (T,N,D·H): the last layer's hidden states, forward direction in the first H features;
//   h_n, c_n (L·D,N,H): the final states (c_n: lstm only), row l·D + d for layer l, direction d
//   (0 forward, 1 backward). Layer l > 0 reads the D·H outputs of layer l − 1.
//
// Equations (cuDNN's and PyTorch's; σ the logistic function, ⊙ the elementwise product), per step with
// h the previous hidden state, every gate g having W_g x + b_Wg + R_g h + b_Rg:
//   rnn_tanh / rnn_relu: h' = act(W x + b_W + R h + b_R)
//   lstm: i, f, o = σ(·), g = tanh(·); c' = f ⊙ c + i ⊙ g; h' = o ⊙ tanh(c')
//   gru:  r, z = σ(·); n = tanh(W_n x + b_Wn + r ⊙ (R_n h + b_Rn)); h' = (1 − z) ⊙ n + z ⊙ h
//
// The weights are ONE flat 1-D tensor in cuDNN's weight-space order, so the GPU hands it to cuDNN as
// is (ops/rnn.cu checks every offset against cuDNN's cudnnGetRNNWeightParams once per configuration).
// With pseudo-layers p = l·D + d and in_l = I for l = 0, D·H above: first the matrices of every
// pseudo-layer in turn,
//   W_ih (G·H, in_l)  the input matrices of the G gates, one (H, in_l) block per gate, stacked
//   W_hh (G·H, H)     the recurrent matrices, likewise
// then the biases of every pseudo-layer in turn,
//   b_ih (G·H)        the input biases
//   b_hh (G·H)        the recurrent biases
// Gate order: lstm i, f, g, o; gru r, z, n (as cuDNN's linLayerID and PyTorch's weight_ih_l*).
// rnn_weight_layout() names every block, e.g. "l1.bwd.W_hh.f" or "l0.fwd.b_ih" for the single-gate cells.
//
// The recorded node is one `rnn` op whose value packs [output | h_n | c_n] into one 1-D tensor (a node
// has one output); the functions below return views of it made with narrow and reshape.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "dyngrad/graph/graph.h"

namespace dyngrad {

struct RnnOptions {
    std::int64_t hidden_size = 0;
    std::int64_t num_layers = 1;
    bool bidirectional = false;
};

struct RnnResult {
    Var output;  // (T,N,D·H)
    Var h_n;     // (L·D,N,H)
    Var c_n;     // (L·D,N,H) for lstm; undefined for the other cells
};

// "lstm", "gru", "rnn_tanh", "rnn_relu"
std::string_view rnn_mode_name(RnnMode mode);

// h0 and c0 may be left out (zeros); c0 is for lstm only, and needs h0 (ValueError otherwise).
RnnResult rnn(RnnMode mode, const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0 = {},
              std::optional<Var> c0 = {}, std::source_location where = std::source_location::current());
RnnResult lstm(const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0 = {},
               std::optional<Var> c0 = {}, std::source_location where = std::source_location::current());
RnnResult gru(const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0 = {},
              std::source_location where = std::source_location::current());
RnnResult rnn_tanh(const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0 = {},
                   std::source_location where = std::source_location::current());
RnnResult rnn_relu(const Var& x, const Var& w, const RnnOptions& options, std::optional<Var> h0 = {},
                   std::source_location where = std::source_location::current());

// One block of the flat weight: elements [offset, offset + numel(shape)).
struct RnnWeightEntry {
    std::string name;  // "l<layer>.<fwd|bwd>.<W_ih|W_hh|b_ih|b_hh>[.<gate>]"
    std::int64_t offset = 0;
    Shape shape;       // (H, in) for matrices, (H) for biases
};
// Every block of the flat weight in memory order; together they cover it exactly once.
// ValueError for a non-positive hidden size, layer count or input size.
std::vector<RnnWeightEntry> rnn_weight_layout(RnnMode mode, const RnnOptions& options, std::int64_t input_size);
// Number of elements of the flat weight.
std::int64_t rnn_weight_size(RnnMode mode, const RnnOptions& options, std::int64_t input_size);

// The layers (LSTM, GRU, RNN) on top of these functions: nn/recurrent.h.

}  // namespace dyngrad
