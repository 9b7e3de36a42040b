// Issue 29: Tensor's in-place arithmetic guarded by the version counter, boolean-mask selection
// (masked_select, x[mask] in C++) and PyTorch's nested printing. References are computed element by element
// in double here, or are PyTorch's own printed text (torch 2.x, default print options), never dyngrad's ops.
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {
std::vector<double> random_values(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> dist;
    std::vector<double> v(n);
    for (double& x : v) x = dist(rng);
    return v;
}
std::string printed(const Tensor& t) {
    std::ostringstream out;
    out << t;
    return out.str();
}
}  // namespace

TEST_CASE("in-place arithmetic on Tensor matches double references and broadcasts the other operand", "[inplace]") {
    const std::vector<double> a = random_values(6, std::random_device{}()), b = random_values(3, std::random_device{}());
    Tensor x = Tensor::from_vector(a, {2, 3}, DType::f64);
    const Tensor row = Tensor::from_vector(b, {3}, DType::f64);
    const std::uint32_t v0 = x.version();
    x.add_(row, 2.0).mul_(row).sub_(row).div_(Tensor::full({}, 4.0, DType::f64)).add_(0.5).mul_(3.0);
    x.clamp_(-1.0, 1.0);
    const std::vector<double> got = x.to_vector();
    for (std::size_t i = 0; i < 6; ++i) {
        const double r = b[i % 3];
        const double want = std::clamp((((a[i] + 2.0 * r) * r - r) / 4.0 + 0.5) * 3.0, -1.0, 1.0);
        CHECK(got[i] == Approx(want).epsilon(1e-12));
    }
    CHECK(x.version() == v0 + 7);  // every in-place op is one write
    x.zero_();
    for (double e : x.to_vector()) CHECK(e == 0.0);

    // a result larger than the tensor: PyTorch's "output with shape ... doesn't match the broadcast shape"
    Tensor small = Tensor::from_vector(b, {3}, DType::f64);
    CHECK_THROWS_MATCHES(small.add_(Tensor::ones({2, 3}, DType::f64)), ShapeError, MessageHas({"add_", "(2,3)", "(3)"}));
    // a float64 operand into a float32 tensor: converted to float32, as PyTorch does
    Tensor f = Tensor::from_vector(std::vector<double>{1.5, -2.25, 3.0}, {3}, DType::f32);
    f.mul_(row);
    for (std::size_t i = 0; i < 3; ++i)
        CHECK(f.to_vector()[i] == Approx(static_cast<float>(std::vector<double>{1.5, -2.25, 3.0}[i] * b[i])).epsilon(1e-6));
    CHECK(f.dtype() == DType::f32);
    Tensor m = Tensor::from_vector(a, {2, 3}, DType::f64);
    m.masked_fill_(Tensor::from_vector(std::vector<double>{1, 0, 1}, {3}, DType::f64), 7.0);
    for (std::size_t i = 0; i < 6; ++i) CHECK(m.to_vector()[i] == (i % 3 == 1 ? a[i] : 7.0));
}

TEST_CASE("an in-place write into a tensor a recorded node needs fails that node's backward", "[inplace][version]") {
    ComputeGraph graph;
    const std::vector<double> w_values = random_values(4, std::random_device{}());
    Var w = graph.input(Tensor::from_vector(w_values, {4}, DType::f64), "w", true);
    Tensor c = Tensor::from_vector(random_values(4, std::random_device{}()), {4}, DType::f64);
    Var loss = sum(mul(w, graph.input(c, "c")));
    c.add_(1.0);  // allowed at write time, as in PyTorch
    CHECK_THROWS_MATCHES(graph.backward(loss), GraphError, MessageHas({"mul", "'c'", "modified in place"}));

    // the same without the write: the backward runs, and d(sum(w*c))/dw = c
    ComputeGraph fresh;
    Var w2 = fresh.input(Tensor::from_vector(w_values, {4}, DType::f64), "w", true);
    fresh.backward(sum(mul(w2, fresh.input(c, "c"))));
    const std::vector<double> grad = w2.grad().to_vector(), cv = c.to_vector();
    for (std::size_t i = 0; i < 4; ++i) CHECK(grad[i] == cv[i]);
}

TEST_CASE("masked_select selects elements or rows in row-major order and scatters the gradient back", "[mask]") {
    const std::vector<double> xs = random_values(12, std::random_device{}());
    std::vector<double> full_mask(12), row_mask{1, 0, 1};
    for (std::size_t i = 0; i < 12; ++i) full_mask[i] = xs[i] > 0 ? 1 : 0;
    full_mask[0] = 1;  // at least one element
    ComputeGraph graph;
    Var x = graph.input(Tensor::from_vector(xs, {3, 4}, DType::f64), "x", true);
    Var picked = masked_select(x, Tensor::from_vector(full_mask, {3, 4}, DType::f64));
    std::vector<double> want;
    for (std::size_t i = 0; i < 12; ++i)
        if (full_mask[i] != 0) want.push_back(xs[i]);
    REQUIRE(picked.value().shape() == Shape{static_cast<std::int64_t>(want.size())});
    CHECK(picked.value().to_vector() == want);
    // weights 1, 2, 3, ... on the selected elements: the gradient is that weight where selected, 0 elsewhere
    std::vector<double> weights(want.size());
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<double>(i + 1);
    graph.backward(sum(mul(picked, graph.input(Tensor::from_vector(weights, {static_cast<std::int64_t>(weights.size())}, DType::f64)))));
    const std::vector<double> grad = x.grad().to_vector();
    for (std::size_t i = 0, k = 0; i < 12; ++i) CHECK(grad[i] == (full_mask[i] != 0 ? weights[k++] : 0.0));

    // a mask over the leading dim selects rows (PyTorch's x[mask] with mask.shape == x.shape[:1])
    const Tensor rows = masked_select(Tensor::from_vector(xs, {3, 4}, DType::f64), Tensor::from_vector(row_mask, {3}));
    REQUIRE(rows.shape() == Shape{2, 4});
    const std::vector<double> r = rows.to_vector();
    for (std::size_t j = 0; j < 4; ++j) CHECK((r[j] == xs[j] && r[4 + j] == xs[8 + j]));
    // none selected: an empty result of the row shape
    CHECK(masked_select(Tensor::from_vector(xs, {3, 4}, DType::f64), Tensor::zeros({3})).shape() == Shape{0, 4});
}

TEST_CASE("masked_select refuses masks of the wrong shape or with values other than 0 and 1", "[mask][errors]") {
    const Tensor x = Tensor::from_vector(random_values(12, 7), {3, 4}, DType::f64);
    CHECK_THROWS_MATCHES(masked_select(x, Tensor::ones({4, 3})), ShapeError, MessageHas({"masked_select", "(4,3)", "(3,4)"}));
    CHECK_THROWS_MATCHES(masked_select(x, Tensor::ones({2})), ShapeError, MessageHas({"(2)", "(3,4)"}));
    CHECK_THROWS_MATCHES(masked_select(x, Tensor::full({3}, 0.5)), ValueError, MessageHas({"0 and 1", "0.5"}));
}

TEST_CASE("printing is PyTorch's: nested, aligned, summarised above 1000 elements", "[tensor][print]") {
    // each expected text is what torch prints for the same values (torch.tensor(...) / torch.arange(...))
    CHECK(printed(Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2})) == "tensor([[1., 2.],\n        [3., 4.]])");
    CHECK(printed(Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6.5}, {2, 3}, DType::f64)) ==
          "tensor([[1.0000, 2.0000, 3.0000],\n        [4.0000, 5.0000, 6.5000]], dtype=dyngrad.float64)");
    CHECK(printed(Tensor::from_vector(std::vector<std::int64_t>{3, 1, -20}, {3})) == "tensor([  3,   1, -20])");
    CHECK(printed(Tensor::from_vector(std::vector<double>{1e-5, 1.0}, {2})) == "tensor([1.0000e-05, 1.0000e+00])");
    CHECK(printed(Tensor::full({}, 2.5)) == "tensor(2.5000)");
    CHECK(printed(Tensor::zeros({0, 3})) == "tensor([], size=(0, 3))");
    CHECK(printed(Tensor::arange(0, 8).reshaped({2, 2, 2})) ==
          "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]])");
    CHECK(printed(Tensor::arange(0, 30)) ==
          "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
          "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n"
          "        28., 29.])");
    CHECK(printed(Tensor::arange(0, 2000, 1, DType::i64)) == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
    CHECK(printed(Tensor::zeros({100, 100}, DType::f64)) ==
          "tensor([[0., 0., 0.,  ..., 0., 0., 0.],\n"
          "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
          "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
          "        ...,\n"
          "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
          "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
          "        [0., 0., 0.,  ..., 0., 0., 0.]], dtype=dyngrad.float64)");
    CHECK(printed(Tensor::from_vector(std::vector<double>{NAN, -INFINITY, 1.5}, {3})) == "tensor([   nan,   -inf, 1.5000])");
}
