// A physics-informed network (PINN) for the 1-D Poisson problem
//
//     u''(x) = f(x) = -π² sin(πx)  on (0, 1),   u(0) = u(1) = 0,   exact solution u(x) = sin(πx)
//
// The network u(x) (1 → 32 → 32 → 1, tanh) is trained so that its second derivative matches f at collocation
// points: u' and u'' come from grad with create_graph (graph/higher_order.h), and the loss on the residual
// u'' − f is back-propagated through them into the weights (a third reverse pass over the same graph). Prints the
// loss and the maximum error against sin(πx) on a test grid; exits 1 when that error is above --tolerance (CTest
// runs it on the CPU).
//
//   pinn_poisson [--steps N] [--points N] [--lr LR] [--tolerance E]
#include <dyngrad/dyngrad.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>
#include <string>

using namespace dyngrad;

namespace {

struct Network : Module {
    Linear fc1, fc2, fc3;
    explicit Network(Generator&& gen) : fc1(1, 32, true, gen), fc2(32, 32, true, gen), fc3(32, 1, true, gen) {
        register_module("fc1", fc1);
        register_module("fc2", fc2);
        register_module("fc3", fc3);
    }
    // x (N,1) -> u (N,1)
    Var operator()(const Var& x) const { return fc3(tanh(fc2(tanh(fc1(x))))); }
};

// n points of [lo, hi], evenly spaced, as a column (n,1)
Tensor grid(std::int64_t n, double lo, double hi) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
        v[static_cast<std::size_t>(i)] = lo + (hi - lo) * static_cast<double>(i) / static_cast<double>(n - 1);
    return Tensor::from_vector(v, {n, 1}, DType::f32);
}

double flag(int argc, char** argv, const std::string& name, double fallback) {
    for (int i = 1; i + 1 < argc; ++i)
        if (name == argv[i]) return std::atof(argv[i + 1]);
    return fallback;
}

}  // namespace

int main(int argc, char** argv) {
    const auto steps = static_cast<int>(flag(argc, argv, "--steps", 1500));
    const auto points = static_cast<std::int64_t>(flag(argc, argv, "--points", 48));
    const double lr = flag(argc, argv, "--lr", 5e-3);
    const double tolerance = flag(argc, argv, "--tolerance", 2e-3);
    const double pi = std::numbers::pi;

    Network u(Generator(7));
    Adam optimizer(u.parameters(), {.lr = lr});
    const Tensor x_inner = grid(points, 0.02, 0.98);
    std::vector<double> fx;
    for (double x : x_inner.to_vector()) fx.push_back(-pi * pi * std::sin(pi * x));
    const Tensor f_inner = Tensor::from_vector(fx, {points, 1}, DType::f32);
    const Tensor x_boundary = grid(2, 0.0, 1.0);

    double loss_value = 0;
    for (int step = 0; step < steps; ++step) {
        ComputeGraph graph;
        const Var x = graph.input(x_inner, "x", true);
        const Var u_x = u(x);
        // Each u(x_i) depends on x_i alone, so the gradient of Σ u is the pointwise u'(x), and that of Σ u' is u''.
        const Var du = grad({sum(u_x)}, {x}, {}, {.create_graph = true})[0];
        const Var d2u = grad({sum(du)}, {x}, {}, {.create_graph = true})[0];
        const Var residual = d2u - graph.constant(f_inner);
        const Var boundary = u(graph.input(x_boundary));
        const Var loss = mean(mul(residual, residual)) + mul_scalar(mean(mul(boundary, boundary)), 100.0);
        optimizer.zero_grad();
        graph.backward(loss);
        optimizer.step();
        loss_value = loss.item();
        if (step % 250 == 0 || step + 1 == steps) std::printf("step %5d  loss %.6g\n", step, loss_value);
    }

    // The error against the exact solution on a finer grid, boundaries included.
    const Tensor x_test = grid(101, 0.0, 1.0);
    ComputeGraph graph;
    const NoGradGuard no_grad;
    const std::vector<double> predicted = u(graph.input(x_test)).value().to_vector();
    const std::vector<double> xs = x_test.to_vector();
    double worst = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) worst = std::max(worst, std::abs(predicted[i] - std::sin(pi * xs[i])));
    std::printf("max |u - sin(pi x)| on 101 points: %.4g (tolerance %.3g)\n", worst, tolerance);
    return worst <= tolerance ? 0 : 1;
}
