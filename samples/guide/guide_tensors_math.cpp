#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    // Every op function has a Tensor form: it runs at once, with no graph and no gradient.
    Tensor x = Tensor::from_vector(std::vector<double>{-2, 1, 3, 0.5, -1, 4}, {2, 3});
    Tensor y = relu(x) * 2.0 + 1.0;                     // operators broadcast like add
    Tensor row_sums = sum(y, {1});                      // (2): reduce axis 1
    Tensor best = argmax(x, 1);                         // (2) int64: first index of the maximum per row
    Tensor positive = x > 0.0;                          // 0/1 in x's dtype: a mask that multiplies into math
    Tensor kept = where(positive, x, Tensor::zeros({1}));  // condition, a, b broadcast together
    Tensor product = matmul(x, transpose(x));           // (2, 3) @ (3, 2)
    Tensor both = stack({x, y});                        // (2, 2, 3): a new leading axis
    std::cout << "y " << y << "\nrow sums " << row_sums << "\nargmax " << best << "\nproduct " << product
              << "\nstacked " << to_string(both.shape()) << "\n";
    // Compare floats with allclose (rtol 1e-5, atol 1e-8 by default); equal asks for exact equality.
    bool ok = allclose(kept, relu(x)) && allclose(row_sums, Tensor::of({11, 12})) &&
              equal(best, Tensor::from_vector(std::vector<std::int64_t>{2, 2}, {2})) &&
              allclose(product, Tensor::from_vector(std::vector<double>{14, 10, 10, 17.25}, {2, 2}));
    std::cout << (ok ? "ok" : "MISMATCH") << "\n";
    return ok ? 0 : 1;
}
