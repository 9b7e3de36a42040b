#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    // Any op of the table on Tensors, without a graph or a gradient: the same shape rule, checks and
    // kernels as a recorded op.
    Tensor x = Tensor::of({-1.0, 0.5, 2.0});
    Tensor y = eager(OpType::Relu, {x});                     // [0, 0.5, 2]
    Tensor total = eager(OpType::Sum, {y});  // attributes left empty: no axes, so every axis
    OpAttrs twice;
    twice.scalar = 2.0;  // the fields each op reads are listed in graph/op_def.h
    Tensor scaled = eager(OpType::MulScalar, {y}, twice);
    std::cout << "relu " << y << "\nsum " << total.item() << ", scaled[2] " << scaled.at({2}) << "\n";
    return total.item() == 2.5 && scaled.at({2}) == 4.0 ? 0 : 1;
}
