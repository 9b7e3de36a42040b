#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

// A model is a Module that registers its layers; layers are Modules too, and handles: a copy shares
// the parameters of the original, so a layer can be a plain member.
struct Mlp : Module {
    Linear hidden;
    Dropout dropout;
    Linear out;

    explicit Mlp(Generator& gen)
        : hidden(4, 16, /*bias=*/true, gen, Activation::Relu),  // relu(x·Wᵀ + b) as one fused node
          dropout(0.2, /*seed=*/7),
          out(16, 3, true, gen) {
        register_module("hidden", hidden);  // parameters "hidden.weight", "hidden.bias"
        register_module("dropout", dropout);  // no parameters, but train()/eval() must reach it
        register_module("out", out);
    }
    Var operator()(const Var& x) const { return out(dropout(hidden(x))); }
};

int main() {
    Generator gen(3);
    Mlp model(gen);
    for (const auto& [name, p] : model.named_parameters()) std::cout << name << " " << describe(p.value()) << "\n";

    const Tensor x = Tensor::normal({8, 4}, 0.0, 1.0, gen);
    ComputeGraph graph;
    Var logits = model(graph.input(x));  // training mode: dropout is active
    graph.backward(sum(logits));
    std::cout << "logits " << describe(logits.value()) << ", hidden.weight has a gradient: "
              << model.hidden.weight.grad().defined() << "\n";

    model.eval();  // dropout becomes the identity (batch norm would use its running statistics)
    NoGradGuard no_grad;
    ComputeGraph eval_graph;
    const double a = sum(model(eval_graph.input(x))).item(), b = sum(model(eval_graph.input(x))).item();
    std::cout << "eval: two forwards give " << a << " and " << b << "\n";
    return model.parameters().size() == 4 && logits.shape() == Shape{8, 3} && a == b && !model.is_training() ? 0 : 1;
}
