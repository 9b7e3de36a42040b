#include <cmath>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    // d/dx and d²/dx² of u(x) = sin(x)·x, pointwise: grad with create_graph returns a Var that is differentiated
    // again (each u(x_i) depends on x_i alone, so the gradient of Σu is the vector u'(x)).
    ComputeGraph graph;
    const Tensor points = Tensor::of({0.3, 1.1, 2.0}, DType::f64);
    const Var x = graph.input(points, "x", true);
    const Var u = mul(sin(x), x);
    const Var du = grad({sum(u)}, {x}, {}, {.create_graph = true})[0];
    const Var d2u = grad({sum(du)}, {x}, {}, {.create_graph = true})[0];
    bool ok = true;
    for (std::int64_t i = 0; i < 3; ++i) {
        const double v = points.at({i});
        const double exact = 2 * std::cos(v) - v * std::sin(v);  // (x sin x)'' = 2 cos x − x sin x
        std::cout << "u''(" << v << ") = " << d2u.value().at({i}) << " (exact " << exact << ")\n";
        ok = ok && std::abs(d2u.value().at({i}) - exact) < 1e-12;
    }
    // A PDE residual built from d2u is a Var like any other: its loss back-propagates into the weights that made
    // u (samples/pinn_poisson.cpp trains a network this way). Here: d/dx of Σ (u'')² = 2·u''·u'''.
    graph.backward(sum(mul(d2u, d2u)));
    for (std::int64_t i = 0; i < 3; ++i) {
        const double v = points.at({i});
        const double third = -3 * std::sin(v) - v * std::cos(v);
        ok = ok && std::abs(x.grad().at({i}) - 2 * d2u.value().at({i}) * third) < 1e-12;
    }
    std::cout << (ok ? "second and third derivatives match" : "MISMATCH") << "\n";
    return ok ? 0 : 1;
}
