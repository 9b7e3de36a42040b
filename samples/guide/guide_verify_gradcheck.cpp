#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    // The op table drives the checks: every op has cases (shapes, attributes, input domains).
    Generator gen(15);
    bool ok = true;
    for (const char* name : {"softmax", "conv2d"}) {
        const OpDef* op = find_op(name);
        for (const OpCase& c : op->cases()) {
            const CheckResult fd = finite_difference_check(*op, c, gen);  // float64 vs central differences
            const CheckResult f32 = float32_check(*op, c, gen);          // float32 vs float64
            std::cout << name << " '" << c.label << "' " << fd.shapes << ": finite_diff " << fd.max_rel_err
                      << (fd.pass ? " pass" : " FAIL") << ", f32_vs_f64 " << f32.max_rel_err
                      << (f32.pass ? " pass" : " FAIL") << "\n";
            ok = ok && fd.pass && f32.pass;
        }
    }

    // The error measures the checks use, for your own comparisons.
    const Tensor a = Tensor::of({1.0, 2.0, 3.0}), b = Tensor::of({1.0, 2.0, 3.001});
    std::cout << "relative_norm_error " << relative_norm_error(a, b) << ", max_abs_error " << max_abs_error(a, b)
              << "\n";
    return ok && relative_norm_error(a, b) < 1e-3 ? 0 : 1;
}
