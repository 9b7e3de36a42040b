#include <algorithm>
#include <cmath>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(6);
    Linear layer(256, 128, true, gen);  // Init::Torch: weight and bias uniform(±1/√256)

    // Another scheme for a tanh layer: draw a fresh tensor and copy it into the parameter.
    const Shape shape = layer.weight.value().shape();
    layer.weight.value().copy_from(xavier_uniform(shape, gen));
    const Fans fans = compute_fans(shape);  // (out, in) -> in 256, out 128
    const double bound = std::sqrt(6.0 / double(fans.in + fans.out));
    double largest = 0;
    for (double w : layer.weight.value().to_vector()) largest = std::max(largest, std::abs(w));
    std::cout << "xavier_uniform: fan_in " << fans.in << ", fan_out " << fans.out << ", bound " << bound
              << ", largest |w| " << largest << "\n";

    // kaiming_normal: standard deviation gain / sqrt(fan_in).
    const Tensor he = kaiming_normal({512, 256}, gen);
    double squares = 0;
    for (double w : he.to_vector()) squares += w * w;
    const double stddev = std::sqrt(squares / double(he.numel())), expected = kReluGain / std::sqrt(256.0);
    std::cout << "kaiming_normal: stddev " << stddev << ", expected " << expected << "\n";
    return largest <= bound && largest > 0.95 * bound && std::abs(stddev / expected - 1) < 0.02 ? 0 : 1;
}
