// Sorting and sampling (ops/sampling.h) beyond the op table's cases: what finite differences and goldens cannot see.
// argsort against std::stable_sort on data full of ties, NaN and signed zeros; sort's and topk's values and their
// gradients (a gather at the indices); topk's edge cases; cumsum's dtypes; multinomial's distribution (chi-square
// with fixed seeds and generous bounds), its reproducibility and its typed errors. With a CUDA device: the GPU
// gives the CPU's indices and samples (ties and seeds included) and reports bad weights through the error record.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

// Values from {-2, ..., 2} (and so many ties), as doubles.
Tensor tied_values(const Shape& shape, Generator& gen, DType dtype = DType::f64) {
    std::uniform_int_distribution<int> dist(-2, 2);
    std::vector<double> values(static_cast<std::size_t>(numel(shape)));
    for (auto& v : values) v = dist(gen.engine());
    return Tensor::from_vector(values, shape, dtype);
}

std::vector<std::int64_t> ints(const Tensor& t) {
    std::vector<std::int64_t> out;
    for (const double v : t.to_vector()) out.push_back(static_cast<std::int64_t>(v));
    return out;
}

// The stable argsort of each row of a (rows, n) tensor, NaN counting as the largest value.
std::vector<std::int64_t> reference_argsort(const std::vector<double>& x, std::int64_t rows, std::int64_t n,
                                            bool descending) {
    std::vector<std::int64_t> out;
    for (std::int64_t r = 0; r < rows; ++r) {
        std::vector<std::int64_t> order(static_cast<std::size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        const auto value = [&](std::int64_t j) { return x[r * n + j]; };
        std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
            const double u = value(a), v = value(b);
            if (std::isnan(u) || std::isnan(v)) return descending ? std::isnan(u) && !std::isnan(v)
                                                                  : !std::isnan(u) && std::isnan(v);
            return descending ? u > v : u < v;
        });
        out.insert(out.end(), order.begin(), order.end());
    }
    return out;
}

// Pearson's chi-square of observed counts against expected probabilities (categories with probability 0 must
// have no count).
double chi_square(const std::vector<std::int64_t>& counts, const std::vector<double>& probabilities, double draws) {
    double chi = 0;
    for (std::size_t c = 0; c < counts.size(); ++c) {
        if (probabilities[c] == 0) {
            CHECK(counts[c] == 0);
            continue;
        }
        const double expected = probabilities[c] * draws;
        chi += (counts[c] - expected) * (counts[c] - expected) / expected;
    }
    return chi;
}

}  // namespace

TEST_CASE("argsort is std::stable_sort's order on tied data, ascending and descending", "[sampling][sort]") {
    Generator gen(2901);
    for (const DType dtype : {DType::f64, DType::f32}) {
        for (const bool descending : {false, true}) {
            INFO(dtype_name(dtype) << (descending ? " descending" : " ascending"));
            const Tensor x = tied_values({7, 40}, gen, dtype);
            CHECK(ints(argsort(x, -1, descending)) == reference_argsort(x.to_vector(), 7, 40, descending));
            // Along axis 0: the transpose's rows.
            const Tensor columns = argsort(x, 0, descending);
            const std::vector<std::int64_t> expected =
                reference_argsort(transpose(x, 0, 1).clone().to_vector(), 40, 7, descending);
            CHECK(ints(transpose(columns.to(DType::f64), 0, 1).clone()) == expected);  // transpose takes floats
        }
    }
}

TEST_CASE("argsort puts NaN last (first descending) and keeps -0.0 and +0.0 in their order", "[sampling][sort]") {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    const std::vector<double> values = {0.0, nan, -0.0, -inf, 1.0, -nan, inf, -0.0, -1.0};
    const Tensor x = Tensor::from_vector(values, {9}, DType::f64);
    CHECK(ints(argsort(x)) == std::vector<std::int64_t>{3, 8, 0, 2, 7, 4, 6, 1, 5});
    CHECK(ints(argsort(x, 0, true)) == std::vector<std::int64_t>{1, 5, 6, 4, 0, 2, 7, 8, 3});
    CHECK(ints(argsort(x.to(DType::f32))) == std::vector<std::int64_t>{3, 8, 0, 2, 7, 4, 6, 1, 5});
}

TEST_CASE("sort returns gathered values; their gradient goes back to the sorted positions", "[sampling][sort]") {
    Generator gen(2902);
    ComputeGraph graph;
    const Tensor x0 = Tensor::normal({3, 6}, 0.0, 1.0, gen, DType::f64);
    Var x = graph.input(x0, "x", true);
    auto [values, indices] = sort(x, 1, true);
    CHECK_FALSE(indices.requires_grad());
    CHECK(indices.dtype() == DType::i64);
    const Tensor w = Tensor::normal({3, 6}, 0.0, 1.0, gen, DType::f64);
    graph.backward(values, w);
    const std::vector<double> xs = x0.to_vector(), ys = values.value().to_vector(), ws = w.to_vector();
    const std::vector<std::int64_t> idx = ints(indices.value());
    const std::vector<double> dx = x.grad().to_vector();
    for (std::int64_t r = 0; r < 3; ++r) {
        for (std::int64_t j = 0; j < 6; ++j) {
            const std::int64_t k = r * 6 + j;
            CHECK(ys[k] == xs[r * 6 + idx[k]]);
            if (j > 0) CHECK(ys[k - 1] >= ys[k]);
            CHECK(dx[r * 6 + idx[k]] == ws[k]);  // a permutation: each position gets exactly one weight
        }
    }
    // The eager form gives the same.
    const auto eager_sorted = sort(x0, 1, true);
    CHECK(eager_sorted.values.to_vector() == ys);
    CHECK(ints(eager_sorted.indices) == idx);
}

TEST_CASE("topk: the first k of the stable sort, gradients to the chosen entries, k's range", "[sampling][topk]") {
    Generator gen(2903);
    const Tensor x = tied_values({5, 12}, gen);
    for (const bool largest : {true, false}) {
        const auto [values, indices] = topk(x, 4, -1, largest);
        CHECK(indices.shape() == Shape{5, 4});
        const std::vector<std::int64_t> full = ints(argsort(x, -1, largest)), top = ints(indices);
        for (std::int64_t r = 0; r < 5; ++r)
            for (std::int64_t j = 0; j < 4; ++j) CHECK(top[r * 4 + j] == full[r * 12 + j]);  // ties: lower index
        CHECK(values.to_vector() == gather(x, 1, indices).to_vector());
    }
    // Along a middle axis, and k = 0 and k = size.
    const Tensor cube = Tensor::normal({2, 5, 3}, 0.0, 1.0, gen, DType::f64);
    CHECK(topk(cube, 2, 1).indices.shape() == Shape{2, 2, 3});
    CHECK(topk(cube, 0, 1).values.numel() == 0);
    CHECK(ints(topk(cube, 5, 1).indices) == ints(argsort(cube, 1, true)));
    REQUIRE_THROWS_MATCHES(topk(cube, 6, 1), ValueError, MessageHas({"topk_indices", "k = 6", "(2,5,3)"}));
    REQUIRE_THROWS_MATCHES(topk(cube, -1, 1), ValueError, MessageHas({"k = -1"}));
    REQUIRE_THROWS_AS(topk(cube, 1, 3), ShapeError);
    // A 0-d x is one element (PyTorch's rule): index 0.
    const Tensor scalar = Tensor::full({}, 2.5, DType::f64);
    CHECK(sort(scalar).values.shape().empty());
    CHECK(sort(scalar).values.item() == 2.5);
    CHECK(topk(scalar, 1).indices.item() == 0);

    ComputeGraph graph;
    Var v = graph.input(cube, "v", true);
    auto [values, indices] = topk(v, 2, 1);
    graph.backward(sum(values));
    const std::vector<double> dv = v.grad().to_vector();
    CHECK(std::accumulate(dv.begin(), dv.end(), 0.0) == 12.0);  // 2·3 chosen entries in each of 2 slices, weight 1
}

TEST_CASE("cumsum: running sums along an axis, its gradient, its dtypes", "[sampling][cumsum]") {
    const Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);
    CHECK(cumsum(x, 1).to_vector() == std::vector<double>{1, 3, 6, 4, 9, 15});
    CHECK(cumsum(x, 0).to_vector() == std::vector<double>{1, 2, 3, 5, 7, 9});
    CHECK(cumsum(x.to(DType::f32), -1).to_vector() == std::vector<double>{1, 3, 6, 4, 9, 15});
    ComputeGraph graph;
    Var v = graph.input(x, "x", true);
    graph.backward(cumsum(v, 1), Tensor::from_vector(std::vector<double>{1, 10, 100, 2, 20, 200}, {2, 3}, DType::f64));
    CHECK(v.grad().to_vector() == std::vector<double>{111, 110, 100, 222, 220, 200});
    REQUIRE_THROWS_MATCHES(cumsum(Tensor::from_vector(std::vector<std::int64_t>{1, 2}, {2}), 0), DTypeError,
                           MessageHas({"cumsum", "int64"}));
    REQUIRE_THROWS_AS(cumsum(x, 2), ShapeError);
}

TEST_CASE("multinomial with replacement follows the weights (chi-square)", "[sampling][multinomial]") {
    const std::vector<double> weights = {1, 2, 0, 3, 4, 10};  // not normalised; one zero
    const double total = 20;
    constexpr std::int64_t kRows = 50, kSamples = 2000;
    std::vector<double> rows;
    for (std::int64_t r = 0; r < kRows; ++r) rows.insert(rows.end(), weights.begin(), weights.end());
    const Tensor probs = Tensor::from_vector(rows, {kRows, 6}, DType::f32);
    Generator gen(2904);
    const Tensor draws = multinomial(probs, kSamples, true, gen);
    REQUIRE(draws.shape() == Shape{kRows, kSamples});
    REQUIRE(draws.dtype() == DType::i64);
    std::vector<std::int64_t> counts(6, 0);
    for (const std::int64_t c : ints(draws)) ++counts.at(static_cast<std::size_t>(c));
    std::vector<double> p;
    for (const double w : weights) p.push_back(w / total);
    // 4 degrees of freedom: P(chi² > 30) < 1e-5.
    CHECK(chi_square(counts, p, kRows * kSamples) < 30.0);
}

TEST_CASE("multinomial without replacement draws distinct categories in PyTorch's sequential law",
          "[sampling][multinomial]") {
    const std::vector<double> w = {1, 2, 3, 4};
    constexpr std::int64_t kRows = 40000;
    std::vector<double> rows;
    for (std::int64_t r = 0; r < kRows; ++r) rows.insert(rows.end(), w.begin(), w.end());
    const Tensor probs = Tensor::from_vector(rows, {kRows, 4}, DType::f64);
    const std::vector<std::int64_t> draws = ints(multinomial(probs, 2, false, std::uint64_t{2905}));
    std::vector<std::int64_t> first(4, 0), second(4, 0);
    for (std::int64_t r = 0; r < kRows; ++r) {
        CHECK(draws[r * 2] != draws[r * 2 + 1]);
        ++first[draws[r * 2]];
        ++second[draws[r * 2 + 1]];
    }
    // First draw ∝ w; second: Σ_{i≠j} w_i/W · w_j/(W − w_i).
    std::vector<double> p_first, p_second(4, 0.0);
    for (double wi : w) p_first.push_back(wi / 10);
    for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 4; ++j)
            if (i != j) p_second[j] += w[i] / 10 * w[j] / (10 - w[i]);
    CHECK(chi_square(first, p_first, kRows) < 30.0);  // 3 degrees of freedom: P(chi² > 30) < 2e-6
    CHECK(chi_square(second, p_second, kRows) < 30.0);

    // Every category once: each row is a permutation; zero weights never come while others remain.
    const Tensor all = multinomial(Tensor::from_vector(std::vector<double>{0.5, 0, 2, 1}, {4}, DType::f64), 3, false,
                                   std::uint64_t{7});
    std::vector<std::int64_t> sorted = ints(all);
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == std::vector<std::int64_t>{0, 2, 3});
}

TEST_CASE("multinomial is a function of the seed: Generator draws, eager and recorded agree", "[sampling][multinomial]") {
    Generator data(2906);
    const Tensor probs = Tensor::uniform({3, 9}, 0.0, 1.0, data, DType::f64);
    Generator a(11), b(11);
    const Tensor first = multinomial(probs, 5, true, a);
    CHECK(ints(first) == ints(multinomial(probs, 5, true, b)));
    CHECK(ints(multinomial(probs, 5, true, a)) != ints(first));  // the generator moved on: a new seed
    ComputeGraph graph;
    Var p = graph.input(probs, "p", true);
    Var drawn = multinomial(p, 4, false, std::uint64_t{99});
    CHECK_FALSE(drawn.requires_grad());
    CHECK(ints(drawn.value()) == ints(multinomial(probs, 4, false, std::uint64_t{99})));
    // A row's draws depend on the seed and its index only: row 0 alone draws as row 0 of the batch.
    const std::vector<std::int64_t> batch = ints(multinomial(probs, 5, true, std::uint64_t{3}));
    CHECK(std::vector<std::int64_t>(batch.begin(), batch.begin() + 5) ==
          ints(multinomial(reshape(probs.narrow(0, 0, 1), {9}), 5, true, std::uint64_t{3})));
}

TEST_CASE("multinomial refuses invalid weights and sizes with typed errors", "[sampling][multinomial]") {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    const auto row = [](std::vector<double> v) { return Tensor::from_vector(v, {1, static_cast<std::int64_t>(v.size())}, DType::f64); };
    REQUIRE_THROWS_MATCHES(multinomial(row({1, nan, 2}), 1, true, std::uint64_t{1}), ValueError,
                           MessageHas({"multinomial", "row 0", "NaN weight", "column 1"}));
    REQUIRE_THROWS_MATCHES(multinomial(row({1, 2, inf}), 1, true, std::uint64_t{1}), ValueError,
                           MessageHas({"multinomial", "infinite weight", "column 2"}));
    REQUIRE_THROWS_MATCHES(multinomial(row({1, -0.5, 2}), 1, true, std::uint64_t{1}), ValueError,
                           MessageHas({"multinomial", "negative weight", "column 1"}));
    REQUIRE_THROWS_MATCHES(multinomial(row({0, 0, 0}), 1, true, std::uint64_t{1}), ValueError,
                           MessageHas({"multinomial", "summing to 0"}));
    REQUIRE_THROWS_MATCHES(multinomial(row({1, 0, 2}), 3, false, std::uint64_t{1}), ValueError,
                           MessageHas({"multinomial", "fewer non-zero weights"}));
    REQUIRE_THROWS_MATCHES(multinomial(row({1, 1, 2}), 4, false, std::uint64_t{1}), ValueError,
                           MessageHas({"multinomial", "num_samples = 4 > 3"}));
    REQUIRE_THROWS_MATCHES(multinomial(row({1, 1}), 0, true, std::uint64_t{1}), ValueError,
                           MessageHas({"num_samples must be positive"}));
    REQUIRE_THROWS_AS(multinomial(Tensor::ones({2, 2, 2}, DType::f64), 1, true, std::uint64_t{1}), ShapeError);
    REQUIRE_THROWS_AS(multinomial(Tensor::from_vector(std::vector<std::int64_t>{1, 2}, {2}), 1, true, std::uint64_t{1}),
                      DTypeError);
    // A later bad row is named as such; the rows before it are fine.
    REQUIRE_THROWS_MATCHES(multinomial(Tensor::from_vector(std::vector<double>{1, 2, 3, -1}, {2, 2}, DType::f64), 1,
                                       true, std::uint64_t{1}),
                           ValueError, MessageHas({"row 1", "negative weight"}));
}

TEST_CASE("the GPU gives the CPU's indices and samples", "[sampling][gpu]") {
    if (cuda_device_count() == 0) DG_SKIP("needs a CUDA device");
    const Device gpu = Device::cuda(0);
    Generator gen(2907);
    for (const DType dtype : {DType::f32, DType::f64}) {
        INFO(dtype_name(dtype));
        const Tensor tied = tied_values({9, 700}, gen, dtype);
        for (const bool descending : {false, true}) {
            CHECK(ints(argsort(tied.to(gpu), 1, descending)) == ints(argsort(tied, 1, descending)));
            CHECK(ints(argsort(tied.to(gpu), 0, descending)) == ints(argsort(tied, 0, descending)));
            CHECK(ints(topk(tied.to(gpu), 17, 1, descending).indices) == ints(topk(tied, 17, 1, descending).indices));
        }
        const Tensor x = Tensor::normal({4, 3000}, 0.0, 1.0, gen, dtype);
        for (const std::int64_t axis : {0, 1}) {
            const std::vector<double> cpu = cumsum(x, axis).to_vector(), dev = cumsum(x.to(gpu), axis).to_vector();
            for (std::size_t i = 0; i < cpu.size(); ++i) CHECK(std::abs(cpu[i] - dev[i]) <= 1e-5 * (1 + std::abs(cpu[i])));
        }
        const Tensor probs = Tensor::uniform({6, 500}, 0.0, 1.0, gen, dtype);
        for (const bool replacement : {true, false}) {
            CHECK(ints(multinomial(probs.to(gpu), 50, replacement, std::uint64_t{31})) ==
                  ints(multinomial(probs, 50, replacement, std::uint64_t{31})));
        }
    }
    // Bad weights: a ValueError at the next host wait (here, reading the result).
    const Tensor bad = Tensor::from_vector(std::vector<double>{1, 2, 3, -1}, {2, 2}, DType::f64).to(gpu);
    REQUIRE_THROWS_MATCHES(multinomial(bad, 1, true, std::uint64_t{1}).to_vector(), ValueError,
                           MessageHas({"multinomial", "negative weight", "row 1"}));
}
