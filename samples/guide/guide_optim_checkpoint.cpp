#include <filesystem>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

Sequential make_model(Generator& gen) {
    Sequential model;
    model.add(Linear(4, 8, true, gen)).add(BatchNorm(8)).add([](const Var& x) { return relu(x); });
    model.add(Linear(8, 2, true, gen));
    return model;
}

double output_sum(Sequential& model, const Tensor& x) {
    NoGradGuard no_grad;
    ComputeGraph graph;
    return sum(model(graph.input(x))).item();
}

int main() {
    Generator gen(8);
    Sequential model = make_model(gen);
    const Tensor x = Tensor::normal({16, 4}, 0.0, 1.0, gen);
    output_sum(model, x);  // a training-mode forward moves batch norm's running statistics
    model.eval();

    const auto path = std::filesystem::temp_directory_path() / "guide_checkpoint.safetensors";
    save_parameters(model, path);  // parameters and buffers under their dotted names, as safetensors

    Generator other(9);
    Sequential restored = make_model(other);  // different initial weights
    load_parameters(restored, path);           // checks names and shapes first, then copies in place
    restored.eval();

    const TensorMap file = load_safetensors(path);  // any safetensors file, as name -> CPU tensor
    for (const auto& [name, tensor] : file) std::cout << name << " " << describe(tensor) << "\n";
    const double a = output_sum(model, x), b = output_sum(restored, x);
    std::cout << "saved model " << a << ", restored model " << b << "\n";
    std::filesystem::remove(path);
    return a == b && file.size() == 8 ? 0 : 1;
}
