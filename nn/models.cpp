#include "dyngrad/nn/models.h"

#include "dyngrad/core/error.h"
#include "dyngrad/nn/recurrent.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/pool.h"

namespace dyngrad::models {

namespace {

Var pool_layer(const Var& x) { return max_pool2d(x, {2, 2}); }
Var flatten_layer(const Var& x) { return flatten(x); }

// Reads each image as a sequence of its rows and returns the top layer's final hidden state.
// x (N,1,H,W) -> rows (H,N,W) -> LSTM -> h_n (L,N,hidden) -> (N,hidden). Parameter "lstm.weight".
class RowLstm : public Module {
public:
    RowLstm(std::int64_t width, const RnnOptions& options, Generator& gen) : lstm(width, options, gen) {
        register_module("lstm", lstm);
    }
    Var operator()(const Var& x, std::source_location where) const {
        if (x.shape().size() != 4)
            throw ShapeError(str("lstm model: x must be (N,1,H,W), got shape ", to_string(x.shape())));
        const std::int64_t n = x.shape()[0], height = x.shape()[2], width = x.shape()[3];
        const Var rows = transpose(reshape(x, {n, height, width}, where), 0, 1, where);
        const Var h_n = lstm(rows, {}, {}, where).h_n;
        const std::int64_t layers = lstm.options.num_layers, hidden = lstm.options.hidden_size;
        return reshape(narrow(h_n, 0, layers - 1, 1, where), {n, hidden}, where);
    }

    LSTM lstm;
};

}  // namespace

void add_mlp(Sequential& model, const std::vector<std::int64_t>& widths, Generator& gen) {
    if (widths.size() < 2) throw ValueError(str("add_mlp: needs at least two widths, got ", widths.size()));
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
        if (i + 2 == widths.size()) {
            model.add(Linear(widths[i], widths[i + 1], true, gen));
        } else {
            model.add(Linear(widths[i], widths[i + 1], true, gen, Activation::Relu)).skip_index();
        }
    }
}

Sequential make_mlp(const std::vector<std::int64_t>& widths, Generator& gen) {
    Sequential model;
    add_mlp(model, widths, gen);
    return model;
}

Sequential make_model(const std::string& name, std::int64_t height, std::int64_t width, Generator& gen) {
    const std::int64_t classes = kMnistClasses;
    // Spatial size after a valid 5×5 convolution and a 2×2 max-pool, twice.
    const std::int64_t h2 = ((height - 4) / 2 - 4) / 2, w2 = ((width - 4) / 2 - 4) / 2;
    Sequential model;
    if (name == "lenet5") {
        model.add(Conv2d(1, 6, {5, 5}, {.activation = Activation::Relu}, true, gen)).skip_index().add(pool_layer);
        model.add(Conv2d(6, 16, {5, 5}, {.activation = Activation::Relu}, true, gen)).skip_index();
        model.add(pool_layer).add(flatten_layer);
        model.add(Linear(16 * h2 * w2, 120, true, gen, Activation::Relu)).skip_index();
        model.add(Linear(120, classes, true, gen));
    } else if (name == "lenet") {
        model.add(Conv2d(1, 20, {5, 5}, {}, true, gen)).add(pool_layer);
        model.add(Conv2d(20, 50, {5, 5}, {}, true, gen)).add(pool_layer).add(flatten_layer);
        model.add(Linear(50 * h2 * w2, 500, true, gen, Activation::Relu)).skip_index();
        model.add(Linear(500, classes, true, gen));
    } else if (name == "simplecnn") {
        model.add(Conv2d(1, 16, {3, 3}, {.padding = {1, 1}, .activation = Activation::Relu}, true, gen)).skip_index();
        model.add(pool_layer).add(flatten_layer).add(Linear(16 * (height / 2) * (width / 2), classes, true, gen));
    } else if (name == "mlp") {
        model.add(flatten_layer);
        add_mlp(model, {height * width, 500, classes}, gen);
    } else if (name == "lstm") {
        constexpr std::int64_t hidden = 128;
        model.add(RowLstm(width, {.hidden_size = hidden, .num_layers = 2}, gen));
        model.add(Linear(hidden, classes, true, gen));
    } else {
        throw ValueError(str("make_model: unknown model '", name, "' (lenet5, lenet, simplecnn, mlp or lstm)"));
    }
    return model;
}

}  // namespace dyngrad::models
