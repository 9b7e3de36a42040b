// Recurrent layers: LSTM, GRU and the Elman RNN, each one `rnn` op (ops/rnn.h) over one flat weight.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>

#include "dyngrad/nn/layers.h"
#include "dyngrad/ops/rnn.h"

namespace dyngrad {

// One flat Parameter "weight" (the layout of ops/rnn.h), uniform(±1/√H) like PyTorch.

class Recurrent : public Module {
public:
    Recurrent(RnnMode mode, std::int64_t input_size, const RnnOptions& options, Generator& gen);
    // x (T,N,I); h0 (and c0 for LSTM) (L·D,N,H) or left out.
    RnnResult operator()(const Var& x, std::optional<Var> h0 = {}, std::optional<Var> c0 = {},
                         std::source_location where = std::source_location::current()) const;

    Parameter weight;
    RnnMode mode;
    std::int64_t input_size;
    RnnOptions options;
};

class LSTM : public Recurrent {
public:
    LSTM(std::int64_t input_size, const RnnOptions& options, Generator& gen)
        : Recurrent(RnnMode::Lstm, input_size, options, gen) {}
};

class GRU : public Recurrent {
public:
    GRU(std::int64_t input_size, const RnnOptions& options, Generator& gen)
        : Recurrent(RnnMode::Gru, input_size, options, gen) {}
};

// The Elman RNN: h' = tanh(...) or, with relu, max(..., 0).
class RNN : public Recurrent {
public:
    RNN(std::int64_t input_size, const RnnOptions& options, bool relu, Generator& gen)
        : Recurrent(relu ? RnnMode::RnnRelu : RnnMode::RnnTanh, input_size, options, gen) {}
};

}  // namespace dyngrad
