#include <cstdint>
#include <iostream>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(0);  // random factories take an explicit, seeded generator (no global seed)
    Tensor zeros = Tensor::zeros({2, 3});                  // float32 on the CPU unless told otherwise
    Tensor halves = Tensor::full({2, 3}, 0.5, DType::f64);
    Tensor steps = Tensor::arange(0, 6).reshaped({2, 3});  // [[0, 1, 2], [3, 4, 5]]
    Tensor values = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor labels = Tensor::from_vector(std::vector<std::int64_t>{2, 0, 1}, {3});  // int64: class indices
    Tensor weights = Tensor::normal({4, 3}, 0.0, 0.1, gen);                       // torch::randn({4, 3}) * 0.1
    Tensor inputs = Tensor::uniform({8, 3}, -1.0, 1.0, gen, DType::f64);         // U[-1, 1)

    std::cout << describe(weights) << "\n";  // (4,3) float32 cpu
    std::cout << steps << "\n";              // as PyTorch prints it: nested rows, dtype and device when not the default
    std::cout << "rank " << inputs.rank() << ", size(-1) " << inputs.size(-1) << ", numel " << inputs.numel()
              << ", " << dtype_name(inputs.dtype()) << " on " << inputs.device().to_string() << "\n";

    // Reading values: at() and item() on CPU tensors, to_vector() (as doubles) from any device,
    // data<T>() for a typed pointer to the storage (DTypeError when T is not the tensor's type).
    const double corner = steps.at({1, 2});
    const std::vector<double> flat = values.to_vector();
    const std::int64_t* label = labels.data<std::int64_t>();
    const double one = Tensor::full({1}, 1.0).item();
    std::cout << "steps[1][2] = " << corner << ", values[5] = " << flat[5] << ", labels[0] = " << label[0] << "\n";

    const bool ok = corner == 5 && flat[5] == 6 && label[0] == 2 && one == 1 && zeros.at({1, 1}) == 0 &&
                    halves.dtype() == DType::f64 && weights.numel() == 12 && inputs.shape() == Shape{8, 3};
    return ok ? 0 : 1;
}
