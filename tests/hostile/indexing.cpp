// Hostile indexing and layout inputs (issue 13): indices outside their axis, index tensors of the wrong
// dtype, rank or shape, padding rows that do not exist, conditions and masks that do not fit, permutations
// that are not permutations, expansions that are not broadcasts, and stack/split arguments that cannot be
// met. Each is a typed error naming the op and the operand, on the recording path and the eager one.
#include <cstdint>
#include <limits>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::randn;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

Tensor ints(std::vector<std::int64_t> values, const Shape& shape) { return Tensor::from_vector(values, shape); }
Tensor ints(std::vector<std::int64_t> values) {
    const auto n = static_cast<std::int64_t>(values.size());
    return Tensor::from_vector(values, {n});
}

// embedding(indices, weight (rows, 3), padding) recorded in a fresh graph.
std::function<void()> embed(Tensor indices, std::int64_t rows, std::optional<std::int64_t> padding = std::nullopt,
                            DType dtype = DType::f32) {
    return [indices, rows, padding, dtype] {
        ComputeGraph g;
        embedding(g.input(indices, "idx"), g.input(randn({rows, 3}, 1, dtype), "w", true), padding);
    };
}

// op(graph, x, index) with x random of `x_shape` and an int64 index.
template <typename Op>
std::function<void()> on_indexed(Shape x_shape, Tensor index, Op op) {
    return [x_shape, index, op] {
        ComputeGraph g;
        op(g, g.input(randn(x_shape, 2), "x", true), g.input(index, "index"));
    };
}

template <typename Op>
std::function<void()> on_input(Shape shape, Op op, DType dtype = DType::f32) {
    return [shape, op, dtype] {
        ComputeGraph g;
        op(g, g.input(randn(shape, 3, dtype), "x", true));
    };
}

const Shape kRank17(17, 1);

const bool added = hostile::add(
    "indexing",
    {
        // ---- embedding ----
        hostile::expect<IndexError>("embedding index equal to the row count", {"embedding", "index 5", "[0, 5)"},
                                    embed(ints({0, 5}), 5)),
        hostile::expect<IndexError>("embedding negative index", {"embedding", "index -1", "position 1"},
                                    embed(ints({2, -1, 0}), 5)),
        hostile::expect<IndexError>("embedding index INT64_MAX", {"embedding", "9223372036854775807"},
                                    embed(ints({kMax}), 5)),
        hostile::expect<IndexError>("embedding index INT64_MIN in a 2-D index", {"embedding", "-9223372036854775808"},
                                    embed(ints({0, 1, kMin, 2}, {2, 2}), 5)),
        hostile::expect<IndexError>("embedding any index into a weight of 0 rows", {"embedding", "index 0", "[0, 0)"},
                                    embed(ints({0}), 0)),
        hostile::expect<DTypeError>("embedding float indices", {"embedding", "indices", "int64", "float32"},
                                    [] {
                                        ComputeGraph g;
                                        embedding(g.input(randn({4}, 4), "idx"), g.input(randn({5, 3}, 5), "w"));
                                    }),
        hostile::expect<ShapeError>("embedding 1-D weight", {"embedding", "weight", "2-D", "(5)"},
                                    [] {
                                        ComputeGraph g;
                                        embedding(g.input(ints({0})), g.input(randn({5}, 6), "w"));
                                    }),
        hostile::expect<ShapeError>("embedding 3-D weight", {"embedding", "weight", "(2,5,3)"},
                                    [] {
                                        ComputeGraph g;
                                        embedding(g.input(ints({0})), g.input(randn({2, 5, 3}, 7), "w"));
                                    }),
        hostile::expect<DTypeError>("embedding int64 weight", {"embedding", "weight", "int64"},
                                    [] {
                                        ComputeGraph g;
                                        embedding(g.input(ints({0})), g.input(ints({0, 1, 2, 3}, {2, 2})));
                                    }),
        hostile::expect<IndexError>("embedding padding_idx equal to the row count", {"embedding", "padding_idx 5", "[-5, 5)"},
                                    embed(ints({0}), 5, 5)),
        hostile::expect<IndexError>("embedding padding_idx below -rows", {"embedding", "padding_idx -6"},
                                    embed(ints({0}), 5, -6)),
        hostile::expect<IndexError>("embedding padding_idx INT64_MIN", {"embedding", "padding_idx -9223372036854775808"},
                                    embed(ints({0}), 5, kMin)),
        hostile::expect<IndexError>("embedding recorded with attrs.padding_idx -7", {"embedding", "padding_idx -7"},
                                    [] {
                                        ComputeGraph g;
                                        OpAttrs attrs;
                                        attrs.padding_idx = -7;
                                        g.record(OpType::Embedding, {g.input(randn({5, 3}, 8)), g.input(ints({0}))}, attrs,
                                                 std::source_location::current());
                                    }),
        hostile::expect<IndexError>("eager embedding index out of range", {"embedding", "eager", "index 9"},
                                    [] { embedding(ints({9}), randn({5, 3}, 9)); }),
        hostile::expect<IndexError>("Embedding layer padding_idx out of range", {"Embedding", "padding_idx 10"},
                                    [] {
                                        Generator gen(10);
                                        Embedding layer(10, 4, gen, 10);
                                    }),
        hostile::expect<ValueError>("Embedding layer with 0 embeddings", {"Embedding", "num_embeddings", "0"},
                                    [] {
                                        Generator gen(11);
                                        Embedding layer(0, 4, gen);
                                    }),
        hostile::expect<ValueError>("Embedding layer with a negative dim", {"Embedding", "embedding_dim", "-3"},
                                    [] {
                                        Generator gen(12);
                                        Embedding layer(4, -3, gen);
                                    }),
        hostile::expect<IndexError>("Embedding layer called with a bad token", {"embedding", "index 4"},
                                    [] {
                                        Generator gen(13);
                                        Embedding layer(4, 2, gen);
                                        ComputeGraph g;
                                        layer(g.input(ints({1, 4})));
                                    }),

        // ---- gather ----
        hostile::expect<ShapeError>("gather index of another rank", {"gather", "index", "rank 1", "rank 2"},
                                    on_indexed({3, 4}, ints({0, 1}), [](ComputeGraph&, Var x, Var i) { gather(x, 1, i); })),
        hostile::expect<ShapeError>("gather index larger outside the axis", {"gather", "larger", "axis 0"},
                                    on_indexed({3, 4}, ints({0, 0, 0, 0}, {4, 1}),
                                               [](ComputeGraph&, Var x, Var i) { gather(x, 1, i); })),
        hostile::expect<ShapeError>("gather axis 2 of a 2-D x", {"gather", "axis 2", "rank 2"},
                                    on_indexed({3, 4}, ints({0}, {1, 1}), [](ComputeGraph&, Var x, Var i) { gather(x, 2, i); })),
        hostile::expect<IndexError>("gather index equal to the axis size", {"gather", "index 4", "[0, 4)"},
                                    on_indexed({3, 4}, ints({0, 4}, {1, 2}), [](ComputeGraph&, Var x, Var i) { gather(x, 1, i); })),
        hostile::expect<IndexError>("gather negative index", {"gather", "index -3"},
                                    on_indexed({3, 4}, ints({-3}, {1, 1}), [](ComputeGraph&, Var x, Var i) { gather(x, 0, i); })),
        hostile::expect<DTypeError>("gather float index", {"gather", "index", "int64", "float32"},
                                    on_input({3, 4}, [](ComputeGraph& g, Var x) { gather(x, 0, g.input(randn({1, 1}, 14))); })),
        hostile::expect<ShapeError>("gather of rank 17", {"gather", "rank 17", "16"},
                                    on_indexed(kRank17, ints({0}, kRank17), [](ComputeGraph&, Var x, Var i) { gather(x, 0, i); })),
        hostile::expect<IndexError>("eager gather index out of range", {"gather", "eager", "index 7"},
                                    [] { gather(randn({2, 3}, 15), 1, ints({7}, {1, 1})); }),

        // ---- index_select ----
        hostile::expect<ShapeError>("index_select 2-D index", {"index_select", "1-D", "(2,1)"},
                                    on_indexed({3, 4}, ints({0, 1}, {2, 1}), [](ComputeGraph&, Var x, Var i) { index_select(x, 0, i); })),
        hostile::expect<ShapeError>("index_select axis -3 of 2-D", {"index_select", "axis -3"},
                                    on_indexed({3, 4}, ints({0}), [](ComputeGraph&, Var x, Var i) { index_select(x, -3, i); })),
        hostile::expect<IndexError>("index_select index past the axis", {"index_select", "index 3", "position 2"},
                                    on_indexed({3, 4}, ints({0, 1, 3}), [](ComputeGraph&, Var x, Var i) { index_select(x, 0, i); })),
        hostile::expect<DTypeError>("index_select float index", {"index_select", "index", "int64"},
                                    on_input({3, 4}, [](ComputeGraph& g, Var x) { index_select(x, 0, g.input(randn({2}, 16))); })),

        // ---- scatter_add ----
        hostile::expect<ShapeError>("scatter_add src of another shape than index", {"scatter_add", "src", "index's shape"},
                                    on_indexed({3, 4}, ints({0, 1}, {1, 2}), [](ComputeGraph& g, Var x, Var i) {
                                        scatter_add(x, 1, i, g.input(randn({1, 3}, 17)));
                                    })),
        hostile::expect<DTypeError>("scatter_add float64 src into float32 base", {"scatter_add", "src", "float64", "float32"},
                                    on_indexed({3, 4}, ints({0, 1}, {1, 2}), [](ComputeGraph& g, Var x, Var i) {
                                        scatter_add(x, 1, i, g.input(randn({1, 2}, 18, DType::f64)));
                                    })),
        hostile::expect<DTypeError>("scatter_add into an int64 base", {"scatter_add", "base", "int64"},
                                    [] {
                                        ComputeGraph g;
                                        scatter_add(g.input(ints({0, 0})), 0, g.input(ints({0})), g.input(ints({1})));
                                    }),
        hostile::expect<IndexError>("scatter_add index past the axis", {"scatter_add", "index 4", "[0, 4)"},
                                    on_indexed({3, 4}, ints({4}, {1, 1}), [](ComputeGraph& g, Var x, Var i) {
                                        scatter_add(x, 1, i, g.input(randn({1, 1}, 19)));
                                    })),
        hostile::expect<ShapeError>("scatter_add index larger than base outside the axis", {"scatter_add", "larger", "axis 1"},
                                    on_indexed({3, 4}, ints(std::vector<std::int64_t>(5, 0), {1, 5}),
                                               [](ComputeGraph& g, Var x, Var i) {
                                                   scatter_add(x, 0, i, g.input(randn({1, 5}, 20)));
                                               })),

        // ---- where, masked_fill ----
        hostile::expect<DTypeError>("where float64 condition with float32 branches", {"where", "condition", "float64"},
                                    [] {
                                        ComputeGraph g;
                                        where(g.input(randn({3}, 21, DType::f64)), g.input(randn({3}, 22)), g.input(randn({3}, 23)));
                                    }),
        hostile::expect<DTypeError>("where branches of two dtypes", {"where", "b", "float64", "float32"},
                                    [] {
                                        ComputeGraph g;
                                        where(g.input(randn({3}, 24)), g.input(randn({3}, 25)), g.input(randn({3}, 26, DType::f64)));
                                    }),
        hostile::expect<ShapeError>("where shapes that do not broadcast", {"where", "(3)", "(4)"},
                                    [] {
                                        ComputeGraph g;
                                        where(g.input(randn({3}, 27)), g.input(randn({3}, 28)), g.input(randn({4}, 29)));
                                    }),
        hostile::expect<DTypeError>("where int64 condition (conditions are float 0/1)", {"where", "int64"},
                                    [] { where(ints({1, 0}), randn({2}, 30), randn({2}, 31)); }),
        hostile::expect<ShapeError>("masked_fill mask larger than x", {"masked_fill", "mask", "does not broadcast", "(2,3)"},
                                    on_input({3}, [](ComputeGraph& g, Var x) { masked_fill(x, g.input(randn({2, 3}, 32)), 0.0); })),
        hostile::expect<ShapeError>("masked_fill mask of another length", {"masked_fill", "mask", "(3)", "(2,4)"},
                                    on_input({2, 4}, [](ComputeGraph& g, Var x) { masked_fill(x, g.input(randn({3}, 33)), 0.0); })),
        hostile::expect<DTypeError>("masked_fill int64 mask", {"masked_fill", "mask", "int64"},
                                    on_input({2}, [](ComputeGraph& g, Var x) { masked_fill(x, g.input(ints({1, 0})), 0.0); })),
        hostile::expect<DTypeError>("masked_fill of an int64 x", {"masked_fill", "x", "int64"},
                                    [] { masked_fill(ints({1, 2}), randn({2}, 34), 0.0); }),

        // ---- permute, expand ----
        hostile::expect<ShapeError>("permute with too few dims", {"permute", "dims", "2 axes", "has 3"},
                                    on_input({2, 3, 4}, [](ComputeGraph&, Var x) { permute(x, {1, 0}); })),
        hostile::expect<ValueError>("permute naming an axis twice", {"permute", "axis 1 twice"},
                                    on_input({2, 3, 4}, [](ComputeGraph&, Var x) { permute(x, {1, 0, -2}); })),
        hostile::expect<ShapeError>("permute axis out of range", {"permute", "axis 3"},
                                    on_input({2, 3, 4}, [](ComputeGraph&, Var x) { permute(x, {0, 1, 3}); })),
        hostile::expect<ShapeError>("permute of rank 17", {"permute", "rank 17"},
                                    on_input(kRank17, [](ComputeGraph&, Var x) {
                                        std::vector<std::int64_t> dims(17);
                                        for (std::int64_t i = 0; i < 17; ++i) dims[i] = 16 - i;
                                        permute(x, dims);
                                    })),
        hostile::expect<ValueError>("eager permute naming an axis twice", {"permute", "eager", "twice"},
                                    [] { permute(randn({2, 2}, 35), {0, 0}); }),
        hostile::expect<ShapeError>("expand to fewer dims", {"expand", "fewer dims"},
                                    on_input({2, 3}, [](ComputeGraph&, Var x) { expand(x, {3}); })),
        hostile::expect<ShapeError>("expand a size-2 axis to 4", {"expand", "neither 1 nor 4"},
                                    on_input({2, 3}, [](ComputeGraph&, Var x) { expand(x, {4, 3}); })),
        hostile::expect<ValueError>("expand with -1 on a new axis", {"expand", "-1", "new axis 0"},
                                    on_input({2}, [](ComputeGraph&, Var x) { expand(x, {-1, 2}); })),
        hostile::expect<ValueError>("expand with -2", {"expand", "negative"},
                                    on_input({1}, [](ComputeGraph&, Var x) { expand(x, {-2}); })),
        hostile::expect<ShapeError>("expand to 2^62 x 2^62 elements", {"expand", "output"},
                                    on_input({1, 1}, [](ComputeGraph&, Var x) {
                                        expand(x, {std::int64_t{1} << 62, std::int64_t{1} << 62});
                                    })),
        hostile::expect<ShapeError>("expand to rank 17", {"expand", "rank 17"},
                                    on_input({1}, [](ComputeGraph&, Var x) { expand(x, Shape(17, 2)); })),

        // ---- stack, split ----
        hostile::expect<ValueError>("stack of nothing", {"stack", "at least one"},
                                    [] { stack(std::vector<Var>{}); }),
        hostile::expect<ShapeError>("stack of two shapes", {"stack", "input 1", "(2,4)", "(2,3)"},
                                    [] {
                                        ComputeGraph g;
                                        stack({g.input(randn({2, 3}, 36)), g.input(randn({2, 4}, 37))});
                                    }),
        hostile::expect<ShapeError>("stack at axis rank + 1", {"stack", "axis 3"},
                                    [] {
                                        ComputeGraph g;
                                        stack({g.input(randn({2, 3}, 38)), g.input(randn({2, 3}, 39))}, 3);
                                    }),
        hostile::expect<DTypeError>("stack of two dtypes", {"concat", "input 1", "float64"},
                                    [] {
                                        ComputeGraph g;
                                        stack({g.input(randn({2}, 40)), g.input(randn({2}, 41, DType::f64))});
                                    }),
        hostile::expect<ShapeError>("eager stack of two shapes", {"stack", "input 1"},
                                    [] { stack(std::vector<Tensor>{randn({2}, 42), randn({3}, 43)}); }),
        hostile::expect<ValueError>("split into pieces of 0", {"split", "piece size", "got 0"},
                                    on_input({4}, [](ComputeGraph&, Var x) { split(x, 0); })),
        hostile::expect<ValueError>("split into pieces of INT64_MIN", {"split", "piece size"},
                                    on_input({4}, [](ComputeGraph&, Var x) { split(x, kMin); })),
        hostile::expect<ShapeError>("split along axis 1 of a 1-D x", {"split", "axis 1"},
                                    on_input({4}, [](ComputeGraph&, Var x) { split(x, 2, 1); })),
        hostile::expect<ValueError>("split_with_sizes with a negative size", {"split_with_sizes", "negative", "-1"},
                                    on_input({4}, [](ComputeGraph&, Var x) { split_with_sizes(x, {5, -1}); })),
        hostile::expect<ShapeError>("split_with_sizes not adding up", {"split_with_sizes", "add up to 3", "size 4"},
                                    on_input({4}, [](ComputeGraph&, Var x) { split_with_sizes(x, {1, 2}); })),
        hostile::expect<ShapeError>("split_with_sizes sizes overflowing int64", {"split_with_sizes", "sum of the split sizes"},
                                    on_input({4}, [](ComputeGraph&, Var x) { split_with_sizes(x, {kMax, kMax}); })),
        hostile::expect<ShapeError>("eager split_with_sizes not adding up", {"split_with_sizes", "add up to 5"},
                                    [] { split_with_sizes(randn({4}, 44), {2, 3}); }),
    });

}  // namespace
