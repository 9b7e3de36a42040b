#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Tensor a = Tensor::of({1, 2, 3, 4});
    Tensor alias = a;                     // a handle: both name one storage (like a torch::Tensor copy)
    Tensor matrix = a.reshaped({2, 2});   // a view: the same storage under a new shape
    Tensor same = a.to(Device::cpu());    // already there: shares the storage
    Tensor copy = a.clone();              // an independent copy
    Tensor doubles = a.to(DType::f64);    // a conversion: new storage

    a.set({0}, 10.0);  // an in-place write, seen through every handle of the storage
    std::cout << "alias " << alias.at({0}) << ", matrix " << matrix.at({0, 0}) << ", same " << same.at({0})
              << ", clone " << copy.at({0}) << ", f64 " << doubles.at({0}) << "\n";

    // In-place writes count in the storage's version (graphs check it before a backward reads a value).
    // Writes through a raw pointer do not count by themselves: bump the version after them.
    const auto before = copy.version();
    float* p = copy.data<float>();
    p[3] = 40.0f;
    copy.bump_version();
    copy.fill(0.5);  // copy_from(), fill() and set() bump it themselves
    std::cout << "clone version " << before << " -> " << copy.version() << "\n";

    const bool ok = alias.at({0}) == 10 && matrix.at({0, 0}) == 10 && same.shares_storage_with(a) &&
                    copy.at({0}) == 0.5 && !copy.shares_storage_with(a) && doubles.at({0}) == 1 &&
                    copy.version() == before + 2;
    return ok ? 0 : 1;
}
