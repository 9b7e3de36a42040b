// Recurrent layers (nn/recurrent.h): the weight, initialised like PyTorch's, and one rnn op per call.
#include "dyngrad/nn/recurrent.h"

#include <cmath>
#include <utility>

namespace dyngrad {

Recurrent::Recurrent(RnnMode mode, std::int64_t input_size, const RnnOptions& options, Generator& gen)
    : mode(mode), input_size(input_size), options(options) {
    const std::int64_t size = rnn_weight_size(mode, options, input_size);
    const double bound = 1.0 / std::sqrt(static_cast<double>(options.hidden_size));
    weight = register_parameter("weight", Tensor::uniform({size}, -bound, bound, gen));
}

RnnResult Recurrent::operator()(const Var& x, std::optional<Var> h0, std::optional<Var> c0,
                                std::source_location where) const {
    const Shape& xs = x.shape();
    if (xs.size() == 3 && xs[2] != input_size)
        throw ShapeError(str(rnn_mode_name(mode), " layer at ", describe_site(where), ": x ", to_string(xs), " has ",
                             xs[2], " features (x is (T,N,I)), but the layer was built for input size ", input_size));
    return rnn(mode, x, x.graph().parameter(weight, where), options, std::move(h0), std::move(c0), where);
}

}  // namespace dyngrad
