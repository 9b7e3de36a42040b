// Indexing and layout ops (ops/indexing.h, ops/layout.h) on the CPU: what the table-driven checks
// (finite differences, float32, goldens) cannot see. embedding's padding row gets no gradient although the
// forward reads it; repeated indices add their gradients; conditions and masks take any non-zero value as
// true and get zero gradients; the stack and split composites; the Tensor (eager) overloads agree with the
// recorded ops; the Embedding layer; and index errors name the op and the bad index.
#include <cmath>
#include <cstdint>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

Tensor random_indices(const Shape& shape, std::int64_t bound, Generator& gen) {
    std::uniform_int_distribution<std::int64_t> dist(0, bound - 1);
    std::vector<std::int64_t> values(static_cast<std::size_t>(numel(shape)));
    for (auto& v : values) v = dist(gen.engine());
    return Tensor::from_vector(values, shape);
}

std::vector<std::int64_t> int_values(const Tensor& t) {
    std::vector<std::int64_t> out;
    for (const double v : t.to_vector()) out.push_back(static_cast<std::int64_t>(v));
    return out;
}

}  // namespace

TEST_CASE("embedding: repeated indices add their gradients; padding_idx's row gets none", "[indexing][embedding]") {
    Generator gen(1301);
    constexpr std::int64_t kRows = 4, kDim = 3;
    const Tensor w = Tensor::normal({kRows, kDim}, 0.0, 1.0, gen, DType::f64);
    // 20 indices over 4 rows: every row repeats; row 2 is the padding row and is hit at least once.
    Tensor idx = random_indices({4, 5}, kRows, gen);
    idx.set({0, 0}, 2);
    idx.set({3, 4}, 2);
    const Tensor dy = Tensor::normal({4, 5, kDim}, 0.0, 1.0, gen, DType::f64);

    for (const std::optional<std::int64_t> padding : {std::optional<std::int64_t>{}, std::optional<std::int64_t>{2},
                                                      std::optional<std::int64_t>{-2}}) {
        INFO("padding_idx " << (padding ? std::to_string(*padding) : "none"));
        ComputeGraph graph;
        Var weight = graph.input(w, "w", true);
        Var y = embedding(graph.input(idx), weight, padding);
        REQUIRE(y.shape() == Shape{4, 5, kDim});
        graph.backward(y, dy);

        // Expected by hand: dw[r] = Σ over positions p with idx[p] == r of dy[p], except the padding row.
        std::vector<double> expected(kRows * kDim, 0.0);
        const std::vector<std::int64_t> rows = int_values(idx);
        const std::vector<double> g = dy.to_vector();
        for (std::size_t p = 0; p < rows.size(); ++p)
            for (std::int64_t c = 0; c < kDim; ++c) expected[rows[p] * kDim + c] += g[p * kDim + c];
        if (padding)
            for (std::int64_t c = 0; c < kDim; ++c) expected[2 * kDim + c] = 0.0;
        const std::vector<double> actual = weight.grad().to_vector();
        for (std::size_t i = 0; i < expected.size(); ++i) CHECK(actual[i] == dgtest::Approx(expected[i]).epsilon(1e-12));
        if (padding)
            for (std::int64_t c = 0; c < kDim; ++c) CHECK(actual[2 * kDim + c] == 0.0);
        // The forward still reads the padding row (PyTorch's rule).
        for (std::int64_t c = 0; c < kDim; ++c) CHECK(y.value().at({0, 0, c}) == w.at({2, c}));
    }
}

TEST_CASE("gather and index_select: repeated indices add their gradients", "[indexing][gather]") {
    Generator gen(1302);
    const Tensor x = Tensor::normal({3, 4}, 0.0, 1.0, gen, DType::f64);
    const Tensor dy = Tensor::normal({3, 6}, 0.0, 1.0, gen, DType::f64);
    const Tensor idx = random_indices({3, 6}, 4, gen);  // 6 picks from 4 columns per row: repeats

    ComputeGraph graph;
    Var xv = graph.input(x, "x", true);
    Var y = gather(xv, 1, graph.input(idx));
    graph.backward(y, dy);
    std::vector<double> expected(12, 0.0);
    for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 6; ++j) {
            const auto k = static_cast<std::int64_t>(idx.at({i, j}));
            CHECK(y.value().at({i, j}) == x.at({i, k}));
            expected[i * 4 + k] += dy.at({i, j});
        }
    const std::vector<double> dx = xv.grad().to_vector();
    for (std::size_t i = 0; i < dx.size(); ++i) CHECK(dx[i] == dgtest::Approx(expected[i]).epsilon(1e-12));

    // index_select along axis 1 with column 3 twice: its gradient column is the sum of both.
    ComputeGraph g2;
    Var xs = g2.input(x, "x", true);
    Var picked = index_select(xs, 1, g2.input(Tensor::from_vector(std::vector<std::int64_t>{3, 0, 3}, {3})));
    const Tensor dpicked = Tensor::normal({3, 3}, 0.0, 1.0, gen, DType::f64);
    g2.backward(picked, dpicked);
    for (std::int64_t i = 0; i < 3; ++i) {
        CHECK(picked.value().at({i, 1}) == x.at({i, 0}));
        CHECK(xs.grad().at({i, 3}) == dgtest::Approx(dpicked.at({i, 0}) + dpicked.at({i, 2})).epsilon(1e-12));
        CHECK(xs.grad().at({i, 1}) == 0.0);
    }
}

TEST_CASE("scatter_add adds src into base and differentiates both", "[indexing][scatter_add]") {
    Generator gen(1303);
    const Tensor base = Tensor::normal({2, 3}, 0.0, 1.0, gen, DType::f64);
    const Tensor src = Tensor::normal({2, 4}, 0.0, 1.0, gen, DType::f64);
    const Tensor idx = Tensor::from_vector(std::vector<std::int64_t>{0, 2, 0, 0, 1, 1, 2, 1}, {2, 4});
    const Tensor dy = Tensor::normal({2, 3}, 0.0, 1.0, gen, DType::f64);
    ComputeGraph graph;
    Var b = graph.input(base, "base", true);
    Var s = graph.input(src, "src", true);
    Var y = scatter_add(b, 1, graph.input(idx), s);
    graph.backward(y, dy);
    // Row 0: column 0 gets src 0, 2, 3; column 2 gets src 1; column 1 nothing.
    CHECK(y.value().at({0, 0}) == dgtest::Approx(base.at({0, 0}) + src.at({0, 0}) + src.at({0, 2}) + src.at({0, 3})));
    CHECK(y.value().at({0, 1}) == base.at({0, 1}));
    CHECK(y.value().at({1, 1}) == dgtest::Approx(base.at({1, 1}) + src.at({1, 0}) + src.at({1, 1}) + src.at({1, 3})));
    CHECK(b.grad().to_vector() == dy.to_vector());
    for (std::int64_t i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < 4; ++j)
            CHECK(s.grad().at({i, j}) == dy.at({i, static_cast<std::int64_t>(idx.at({i, j}))}));
}

TEST_CASE("where and masked_fill: any non-zero condition is true; conditions get zero gradients",
          "[indexing][where]") {
    const Tensor cond = Tensor::from_vector(std::vector<double>{1, 0, 0.5, -2}, {4}, DType::f64);
    const Tensor a = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {4}, DType::f64);
    const Tensor b = Tensor::from_vector(std::vector<double>{-1, -2, -3, -4}, {4}, DType::f64);
    ComputeGraph graph;
    Var c = graph.input(cond, "cond", true);  // a float condition may require grad: it gets zeros
    Var av = graph.input(a, "a", true);
    Var bv = graph.input(b, "b", true);
    Var y = where(c, av, bv);
    CHECK(y.value().to_vector() == std::vector<double>{1, -2, 3, 4});
    graph.backward(sum(y * y));
    CHECK(av.grad().to_vector() == std::vector<double>{2, 0, 6, 8});
    CHECK(bv.grad().to_vector() == std::vector<double>{0, -4, 0, 0});
    CHECK(c.grad().to_vector() == std::vector<double>{0, 0, 0, 0});

    // masked_fill with a (2,1) mask over (2,3): whole rows filled; the filled places get no gradient.
    ComputeGraph g2;
    Var x = g2.input(Tensor::ones({2, 3}, DType::f64), "x", true);
    Var m = g2.input(Tensor::from_vector(std::vector<double>{0, 1}, {2, 1}, DType::f64), "mask");
    Var filled = masked_fill(x, m, -7.0);
    CHECK(filled.value().to_vector() == std::vector<double>{1, 1, 1, -7, -7, -7});
    g2.backward(sum(filled));
    CHECK(x.grad().to_vector() == std::vector<double>{1, 1, 1, 0, 0, 0});
}

TEST_CASE("permute, expand, stack and split: values and gradients", "[indexing][layout]") {
    Generator gen(1304);
    const Tensor x = Tensor::normal({2, 3, 4}, 0.0, 1.0, gen, DType::f64);
    ComputeGraph graph;
    Var xv = graph.input(x, "x", true);
    Var p = permute(xv, {2, 0, 1});
    REQUIRE(p.shape() == Shape{4, 2, 3});
    CHECK(p.value().at({3, 1, 2}) == x.at({1, 2, 3}));

    Var row = graph.input(Tensor::from_vector(std::vector<double>{1, 2, 3}, {1, 3}, DType::f64), "row", true);
    Var e = expand(row, {2, -1, 3});
    REQUIRE(e.shape() == Shape{2, 1, 3});
    Var e2 = expand(row, {4, 3});
    CHECK(e2.value().at({3, 2}) == 3.0);

    // split then stack back along a new axis: pieces are narrows, so the gradient flows to every piece.
    const std::vector<Var> pieces = split(xv, 2, -1);  // last axis 4 -> 2 + 2
    REQUIRE(pieces.size() == 2);
    CHECK(pieces[1].value().at({1, 2, 0}) == x.at({1, 2, 2}));
    Var stacked = stack(pieces, 0);
    REQUIRE(stacked.shape() == Shape{2, 2, 3, 2});
    CHECK(stacked.value().at({1, 0, 1, 1}) == x.at({0, 1, 3}));
    const std::vector<Var> uneven = split_with_sizes(xv, {1, 2}, 1);
    REQUIRE(uneven.size() == 2);
    CHECK(uneven[1].shape() == Shape{2, 2, 4});
    CHECK(split(xv, 3, 1).size() == 1);  // 3 = 3: one piece, no empty tail
    CHECK(split(xv, 2, 1).back().shape() == Shape{2, 1, 4});  // 3 = 2 + 1: the last piece is shorter

    graph.backward(sum(p * p) + sum(stacked) + sum(e2 * e2));
    // d/dx of Σ x² (through permute) + Σ x (through split + stack) = 2x + 1
    const std::vector<double> dx = xv.grad().to_vector();
    const std::vector<double> xs = x.to_vector();
    for (std::size_t i = 0; i < xs.size(); ++i) CHECK(dx[i] == dgtest::Approx(2 * xs[i] + 1).epsilon(1e-12));
    // expand's gradient is summed back over the 4 copies: 4 · 2 · row
    CHECK(row.grad().to_vector() == std::vector<double>{8, 16, 24});
}

TEST_CASE("the Tensor overloads give the recorded ops' values", "[indexing][eager]") {
    Generator gen(1305);
    const Tensor w = Tensor::normal({5, 3}, 0.0, 1.0, gen);
    const Tensor idx = random_indices({7}, 5, gen);
    const Tensor x = Tensor::normal({3, 5}, 0.0, 1.0, gen);
    const Tensor cond = Tensor::from_vector(std::vector<float>{1, 0, 1, 0, 0}, {5});
    ComputeGraph graph;
    const Var wv = graph.input(w), idxv = graph.input(idx), xv = graph.input(x), cv = graph.input(cond);
    CHECK(embedding(idx, w, 1).to_vector() == embedding(idxv, wv, 1).value().to_vector());
    CHECK(index_select(w, 0, idx).to_vector() == index_select(wv, 0, idxv).value().to_vector());
    const Tensor gidx = random_indices({3, 2}, 5, gen);
    CHECK(gather(x, 1, gidx).to_vector() == gather(xv, 1, graph.input(gidx)).value().to_vector());
    CHECK(scatter_add(x, 1, gidx, Tensor::ones({3, 2})).to_vector() ==
          scatter_add(xv, 1, graph.input(gidx), graph.input(Tensor::ones({3, 2}))).value().to_vector());
    CHECK(where(cond, x, Tensor::zeros({1})).to_vector() == where(cv, xv, graph.input(Tensor::zeros({1}))).value().to_vector());
    CHECK(masked_fill(x, cond, 2.0).to_vector() == masked_fill(xv, cv, 2.0).value().to_vector());
    CHECK(permute(x, {1, 0}).to_vector() == transpose(xv).value().to_vector());
    CHECK(expand(cond, {2, 5}).to_vector() == expand(cv, {2, 5}).value().to_vector());
    const std::vector<Tensor> parts = split(x, 2, 1);
    REQUIRE(parts.size() == 3);
    CHECK(parts[2].shape() == Shape{3, 1});
    const Tensor both = stack(std::vector<Tensor>{parts[0], parts[1]}, 1);
    REQUIRE(both.shape() == Shape{3, 2, 2});
    CHECK(both.at({2, 1, 0}) == x.at({2, 2}));
}

TEST_CASE("index errors name the op, the bad index and the axis' size", "[indexing][errors]") {
    ComputeGraph graph;
    Var w = graph.input(Tensor::zeros({4, 2}), "w", true);
    Var bad = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, 3, 4}, {3}), "idx");
    CHECK_THROWS_MATCHES(embedding(bad, w), IndexError, MessageHas({"embedding", "index 4", "position 2", "[0, 4)"}));
    CHECK_THROWS_MATCHES(index_select(w, 0, bad), IndexError, MessageHas({"index_select", "index 4", "[0, 4)"}));
    Var negative = graph.input(Tensor::from_vector(std::vector<std::int64_t>{-1, 0}, {1, 2}), "idx");
    CHECK_THROWS_MATCHES(gather(w, 1, negative), IndexError, MessageHas({"gather", "index -1", "[0, 2)"}));
    CHECK_THROWS_MATCHES(scatter_add(w, 1, negative, graph.input(Tensor::ones({1, 2}))), IndexError,
                         MessageHas({"scatter_add", "index -1"}));
    CHECK_THROWS_MATCHES(embedding(bad, w, 4), IndexError, MessageHas({"embedding", "padding_idx 4", "[-4, 4)"}));
    CHECK_THROWS_MATCHES(embedding(w, w), DTypeError, MessageHas({"embedding", "indices must be int64"}));
    CHECK_THROWS_MATCHES(stack(std::vector<Var>{w, bad}), ShapeError, MessageHas({"stack", "input 1", "(3)"}));
    CHECK_THROWS_MATCHES(split_with_sizes(w, {1, 1}, 0), ShapeError, MessageHas({"split_with_sizes", "add up to 2", "size 4"}));
    CHECK_THROWS_MATCHES(split(w, 0, 0), ValueError, MessageHas({"split", "piece size", "got 0"}));
    // Nothing was recorded by the failing calls: the graph still works.
    CHECK_NOTHROW(embedding(graph.input(Tensor::from_vector(std::vector<std::int64_t>{3}, {1})), w));
}

TEST_CASE("Embedding: normal(0, 1) weights, a zero padding row that gets no gradient", "[indexing][layer]") {
    Generator gen(1306);
    Embedding table(200, 50, gen, -1);  // padding_idx -1: the last row
    REQUIRE(table.padding_idx == 199);
    REQUIRE(table.weight.value().shape() == Shape{200, 50});
    const std::vector<double> w = table.weight.value().to_vector();
    double mean = 0, square = 0;
    for (std::size_t i = 0; i < 199 * 50; ++i) {
        mean += w[i];
        square += w[i] * w[i];
    }
    mean /= 199 * 50;
    const double stddev = std::sqrt(square / (199 * 50) - mean * mean);
    CHECK(std::abs(mean) < 0.05);          // 9950 draws: the mean's standard error is 0.01
    CHECK(std::abs(stddev - 1.0) < 0.05);  // PyTorch's default N(0, 1), not a fan-scaled init
    for (std::int64_t c = 0; c < 50; ++c) CHECK(table.weight.value().at({199, c}) == 0.0);

    ComputeGraph graph;
    Var tokens = graph.input(Tensor::from_vector(std::vector<std::int64_t>{5, 199, 7, 199, 5}, {5}));
    Var y = table(tokens);
    REQUIRE(y.shape() == Shape{5, 50});
    graph.backward(sum(y * y + y));
    const Tensor grad = table.weight.grad();
    for (std::int64_t c = 0; c < 50; ++c) {
        CHECK(grad.at({199, c}) == 0.0);
        CHECK(grad.at({5, c}) == dgtest::Approx(2 * (2 * w[5 * 50 + c] + 1)).epsilon(1e-5));
        CHECK(grad.at({6, c}) == 0.0);
    }
    CHECK_THROWS_MATCHES(Embedding(10, 4, gen, 10), IndexError, MessageHas({"Embedding", "padding_idx 10"}));
    CHECK_THROWS_AS(Embedding(0, 4, gen), ValueError);
}
