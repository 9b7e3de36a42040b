// Hostile sizes (issue 11, class 3): dimensions and attributes whose size arithmetic overflows int64, and
// negative dimensions. Each must be a typed error naming the op or the quantity, never a wrapped size.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include "dyngrad/dyngrad.h"
#include "hostile.h"
#include "size_limits.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::randn;
using namespace dgtest::size_limits;

namespace {

// One graph per case: an input x of `shape` (random values) handed to `op`.
template <typename Op>
std::function<void()> on_input(Shape shape, std::uint64_t seed, Op op) {
    return [shape, seed, op] {
        ComputeGraph g;
        op(g, g.input(randn(shape, seed), "x"));
    };
}

// A safetensors file holding only `header` (no data), loaded.
std::function<void()> load_header(std::string header) {
    return [header] {
        const auto path = std::filesystem::temp_directory_path() /
                          ("dyngrad_hostile_sizes_" + std::to_string(::getpid()) + ".safetensors");
        {
            std::ofstream out(path, std::ios::binary);
            const std::uint64_t length = header.size();
            out.write(reinterpret_cast<const char*>(&length), sizeof length);
            out << header;
        }
        struct Remove {
            std::filesystem::path path;
            ~Remove() { std::filesystem::remove(path); }
        } remove{path};
        load_safetensors(path);
    };
}

const bool added = hostile::add(
    "sizes",
    {
        // ---- tensor factories ----
        hostile::expect<ShapeError>("empty (2^32,2^32): count wraps to 0", {"Tensor::empty", "(4294967296,4294967296)"},
                                    [] { Tensor::empty({k2p32, k2p32}); }),
        hostile::expect<ShapeError>("zeros (2^32,2,2^32) float64", {"(4294967296,2,4294967296)"},
                                    [] { Tensor::zeros({k2p32, 2, k2p32}, DType::f64); }),
        hostile::expect<ShapeError>("ones (INT64_MAX,2)", {"9223372036854775807"}, [] { Tensor::ones({kMax, 2}); }),
        hostile::expect<ShapeError>("full (0,2^40,2^40): empty but strides overflow", {"(0,1099511627776,1099511627776)"},
                                    [] { Tensor::full({0, k2p40, k2p40}, 1.0); }),
        hostile::expect<ShapeError>("empty (2^61) float32: 2^63 bytes", {"bytes", "overflow"},
                                    [] { Tensor::empty({k2p61}); }),
        hostile::expect<ShapeError>("empty (2^60) float64: 2^63 bytes", {"bytes"},
                                    [] { Tensor::empty({std::int64_t{1} << 60}, DType::f64); }),
        hostile::expect<ShapeError>("from_vector with no values for (2^32,2^32)", {"from_vector"},
                                    [] { Tensor::from_vector(std::vector<double>{}, {k2p32, k2p32}); }),
        hostile::expect<ShapeError>("int64 from_vector with no values for (2^32,2^32)", {"from_vector"},
                                    [] { Tensor::from_vector(std::vector<std::int64_t>{}, {k2p32, k2p32}); }),
        hostile::expect<ShapeError>("uniform (2^32,2^32)", {"(4294967296,4294967296)"},
                                    [] {
                                        Generator gen(1);
                                        Tensor::uniform({k2p32, k2p32}, 0, 1, gen);
                                    }),
        hostile::expect<ShapeError>("normal (2^32,2^32)", {"(4294967296,4294967296)"},
                                    [] {
                                        Generator gen(2);
                                        Tensor::normal({k2p32, k2p32}, 0, 1, gen);
                                    }),
        hostile::expect<ValueError>("uniform with a negative dim", {"(-3)", "negative"},
                                    [] {
                                        Generator gen(3);
                                        Tensor::uniform({-3}, 0, 1, gen);
                                    }),
        hostile::expect<ValueError>("normal with a negative dim", {"(4,-1)", "negative"},
                                    [] {
                                        Generator gen(4);
                                        Tensor::normal({4, -1}, 0, 1, gen);
                                    }),
        hostile::expect<ValueError>("arange's result reshaped to a negative dim", {"(-2,-2)", "negative"},
                                    [] { Tensor::arange(0, 4).reshaped({-2, -2}); }),
        hostile::expect<ShapeError>("reshaped to (6,7,7^-1 mod 2^64): wraps to 6", {"(6,7,7905747460161236407)"},
                                    [] { randn({6}, 5).reshaped({6, 7, kInverseOf7}); }),
        hostile::expect<ShapeError>("reshaped to (2^32,2^32,0) from 0 elements", {"(4294967296,4294967296,0)"},
                                    [] { Tensor::zeros({0}).reshaped({k2p32, k2p32, 0}); }),
        hostile::expect<ShapeError>("numel of (2^32,2^32)", {"numel"}, [] { numel({k2p32, k2p32}); }),
        hostile::expect<ValueError>("numel of a negative dim", {"numel", "negative"}, [] { numel({2, -2}); }),
        hostile::expect<ShapeError>("contiguous strides of (2,2^62,2^62)", {"contiguous_strides", "overflows"},
                                    [] { contiguous_strides({2, k2p62, k2p62}); }),
        hostile::expect<ShapeError>("broadcast_shapes to (2^40,2^40,0)", {"broadcast to", "(1099511627776,1099511627776,0)"},
                                    [] { broadcast_shapes({k2p40, 1, 0}, {1, k2p40, 0}); }),

        // ---- shape rules ----
        hostile::expect<ShapeError>("reshape to (6,7,7^-1 mod 2^64)", {"reshape", "(6,7,7905747460161236407)"},
                                    on_input({6}, 6, [](ComputeGraph&, Var x) { reshape(x, {6, 7, kInverseOf7}); })),
        hostile::expect<ShapeError>("reshape to (7,7^-1 mod 2^64,-1): -1 inferred from a wrapped 1", {"reshape"},
                                    on_input({6}, 7, [](ComputeGraph&, Var x) { reshape(x, {7, kInverseOf7, -1}); })),
        hostile::expect<ShapeError>("reshape to (INT64_MAX,INT64_MAX)", {"reshape", "9223372036854775807"},
                                    on_input({6}, 8, [](ComputeGraph&, Var x) { reshape(x, {kMax, kMax}); })),
        hostile::expect<ShapeError>("reshape of 0 elements to (2^40,2^40,0)", {"reshape"},
                                    [] {
                                        ComputeGraph g;
                                        reshape(g.input(Tensor::zeros({0}), "x"), {k2p40, k2p40, 0});
                                    }),
        hostile::expect<ValueError>("reshape to a negative dim other than -1", {"reshape", "negative"},
                                    on_input({6}, 9, [](ComputeGraph&, Var x) { reshape(x, {-2, -3}); })),
        hostile::expect<IndexError>("narrow start INT64_MAX, length 2", {"narrow", "9223372036854775807"},
                                    on_input({5}, 10, [](ComputeGraph&, Var x) { narrow(x, 0, kMax, 2); })),
        hostile::expect<IndexError>("narrow start INT64_MAX-1, length 3", {"narrow"},
                                    on_input({5}, 11, [](ComputeGraph&, Var x) { narrow(x, 0, kMax - 1, 3); })),
        hostile::expect<IndexError>("narrow length INT64_MAX", {"narrow", "9223372036854775807"},
                                    on_input({5}, 12, [](ComputeGraph&, Var x) { narrow(x, 0, 1, kMax); })),
        hostile::expect<IndexError>("narrow start INT64_MIN", {"narrow"},
                                    on_input({5}, 13, [](ComputeGraph&, Var x) {
                                        narrow(x, 0, std::numeric_limits<std::int64_t>::min(), 2);
                                    })),
        hostile::expect<ShapeError>("concat of four (0,2^62) along axis 1: sum wraps to 0", {"concat", "joined axis"},
                                    [] {
                                        ComputeGraph g;
                                        const Var a = g.input(Tensor::zeros({0, k2p62}), "a");
                                        concat({a, a, a, a}, 1);
                                    }),
        hostile::expect<ShapeError>("concat of two (0,2^62) along axis 1", {"concat"},
                                    [] {
                                        ComputeGraph g;
                                        const Var a = g.input(Tensor::zeros({0, k2p62}), "a");
                                        concat({a, a}, 1);
                                    }),
        hostile::expect<ShapeError>("concat of two (2^31,2^31,0) to (2^32,2^31,0)", {"concat", "output"},
                                    [] {
                                        ComputeGraph g;
                                        const Var a = g.input(Tensor::zeros({k2p31, k2p31, 0}), "a");
                                        concat({a, a}, 0);
                                    }),
        hostile::expect<ShapeError>("matmul (2^32,0)@(0,2^32)", {"matmul", "(4294967296,0)"},
                                    [] {
                                        ComputeGraph g;
                                        matmul(g.input(Tensor::zeros({k2p32, 0}), "a"),
                                               g.input(Tensor::zeros({0, k2p32}), "b"));
                                    }),
        hostile::expect<ShapeError>("batched matmul (2^21,2^21,0)@(2^21,0,2^21)", {"matmul"},
                                    [] {
                                        constexpr std::int64_t n = std::int64_t{1} << 21;
                                        ComputeGraph g;
                                        matmul(g.input(Tensor::zeros({n, n, 0}), "a"),
                                               g.input(Tensor::zeros({n, 0, n}), "b"));
                                    }),
        hostile::expect<ShapeError>("add broadcasting to (2^40,2^40,0)", {"add", "(1099511627776,1,0)"},
                                    [] {
                                        ComputeGraph g;
                                        add(g.input(Tensor::zeros({k2p40, 1, 0}), "a"),
                                            g.input(Tensor::zeros({1, k2p40, 0}), "b"));
                                    }),
        hostile::expect<ShapeError>("mul broadcasting to (2^62,4,0)", {"mul"},
                                    [] {
                                        ComputeGraph g;
                                        mul(g.input(Tensor::zeros({k2p62, 1, 0}), "a"),
                                            g.input(Tensor::zeros({1, 4, 0}), "b"));
                                    }),

        // ---- convolution ----
        hostile::expect<ShapeError>("conv2d dilation INT64_MAX with a 3x3 kernel", {"conv2d", "height"},
                                    on_input({1, 1, 5, 5}, 14, [](ComputeGraph& g, Var x) {
                                        conv2d(x, g.input(randn({1, 1, 3, 3}, 15), "w"), {.dilation = {kMax, 1}});
                                    })),
        hostile::expect<ShapeError>("conv2d dilation 2^62 in width", {"conv2d", "width"},
                                    on_input({1, 1, 5, 5}, 16, [](ComputeGraph& g, Var x) {
                                        conv2d(x, g.input(randn({1, 1, 3, 3}, 17), "w"), {.dilation = {1, k2p62}});
                                    })),
        hostile::expect<ShapeError>("conv2d padding INT64_MAX", {"conv2d", "padding"},
                                    on_input({1, 1, 5, 5}, 18, [](ComputeGraph& g, Var x) {
                                        conv2d(x, g.input(randn({1, 1, 3, 3}, 19), "w"), {.padding = {kMax, 0}});
                                    })),
        hostile::expect<ShapeError>("conv2d padding 2^62: output rows overflow", {"conv2d", "height"},
                                    on_input({1, 1, 5, 5}, 20, [](ComputeGraph& g, Var x) {
                                        conv2d(x, g.input(randn({1, 1, 3, 3}, 21), "w"), {.padding = {k2p62, 0}});
                                    })),
        hostile::expect<ShapeError>("conv2d of an empty batch with padding 2^61: (0,1,2^62+3,3)", {"conv2d", "output"},
                                    [] {
                                        ComputeGraph g;
                                        conv2d(g.input(Tensor::zeros({0, 1, 5, 5}), "x"),
                                               g.input(randn({1, 1, 3, 3}, 22), "w"), {.padding = {k2p61, 0}});
                                    }),
        hostile::expect<ShapeError>("conv2d of an empty batch with padding (2^30,2^30): im2col buffer",
                                    {"conv2d", "im2col"},
                                    [] {
                                        ComputeGraph g;
                                        conv2d(g.input(Tensor::zeros({0, 4, 5, 5}), "x"),
                                               g.input(randn({1, 4, 3, 3}, 23), "w"), {.padding = {k2p31 / 2, k2p31 / 2}});
                                    }),
        hostile::expect<ShapeError>("conv2d groups 2^62 against weight channels 4", {"conv2d", "groups"},
                                    on_input({1, 4, 5, 5}, 24, [](ComputeGraph& g, Var x) {
                                        conv2d(x, g.input(randn({4, 4, 3, 3}, 25), "w"), {.groups = k2p62});
                                    })),
        hostile::expect<ValueError>("conv2d stride INT64_MIN", {"conv2d", "stride"},
                                    on_input({1, 1, 5, 5}, 26, [](ComputeGraph& g, Var x) {
                                        conv2d(x, g.input(randn({1, 1, 3, 3}, 27), "w"),
                                               {.stride = {std::numeric_limits<std::int64_t>::min(), 1}});
                                    })),
        hostile::expect<ValueError>("conv2d padding INT64_MIN", {"conv2d", "padding"},
                                    on_input({1, 1, 5, 5}, 28, [](ComputeGraph& g, Var x) {
                                        conv2d(x, g.input(randn({1, 1, 3, 3}, 29), "w"),
                                               {.padding = {std::numeric_limits<std::int64_t>::min(), 0}});
                                    })),

        // ---- pooling ----
        hostile::expect<ShapeError>("max_pool2d window 2^62 with padding 2^61-1 on height 1",
                                    {"max_pool2d", "height", "window 4611686018427387904"},
                                    on_input({1, 1, 1, 5}, 30, [](ComputeGraph&, Var x) {
                                        max_pool2d(x, {k2p62, 1}, {1, 1}, {k2p61 - 1, 0});
                                    })),
        hostile::expect<ShapeError>("avg_pool2d kernel (INT64_MAX,1) without padding", {"avg_pool2d", "window"},
                                    on_input({1, 1, 5, 5}, 31,
                                             [](ComputeGraph&, Var x) { avg_pool2d(x, {kMax, 1}); })),
        hostile::expect<ValueError>("max_pool2d padding 2^62 above kernel/2", {"max_pool2d", "padding"},
                                    on_input({1, 1, 5, 5}, 32, [](ComputeGraph&, Var x) {
                                        max_pool2d(x, {3, 3}, {1, 1}, {k2p62, 0});
                                    })),
        hostile::expect<ValueError>("avg_pool2d kernel INT64_MIN", {"avg_pool2d", "kernel"},
                                    on_input({1, 1, 5, 5}, 33, [](ComputeGraph&, Var x) {
                                        avg_pool2d(x, {std::numeric_limits<std::int64_t>::min(), 1});
                                    })),
        hostile::expect<ValueError>("max_pool2d stride -1", {"max_pool2d", "stride"},
                                    on_input({1, 1, 5, 5}, 34,
                                             [](ComputeGraph&, Var x) { max_pool2d(x, {2, 2}, {-1, 1}); })),

        // ---- recurrent weights and layers ----
        hostile::expect<ShapeError>("lstm weight size with hidden 2^32: 4·2^32·(1+2^32) wraps to 2^34",
                                    {"lstm", "hidden 4294967296", "weight"},
                                    [] { rnn_weight_size(RnnMode::Lstm, {.hidden_size = k2p32}, 1); }),
        hostile::expect<ShapeError>("gru weight layout with hidden 2^32, 2 layers", {"gru", "weight"},
                                    [] { rnn_weight_layout(RnnMode::Gru, {.hidden_size = k2p32, .num_layers = 2}, 3); }),
        hostile::expect<ShapeError>("rnn_tanh with INT64_MAX layers", {"rnn_tanh", "9223372036854775807 layer"},
                                    [] {
                                        rnn_weight_size(RnnMode::RnnTanh, {.hidden_size = 1, .num_layers = kMax}, 3);
                                    }),
        hostile::expect<ShapeError>("rnn_relu with input size INT64_MAX", {"rnn_relu", "weight"},
                                    [] { rnn_weight_size(RnnMode::RnnRelu, {.hidden_size = 2}, kMax); }),
        hostile::expect<ShapeError>("bidirectional lstm with hidden 2^31", {"lstm", "bidirectional"},
                                    [] {
                                        rnn_weight_size(RnnMode::Lstm,
                                                        {.hidden_size = k2p31, .num_layers = 3, .bidirectional = true},
                                                        8);
                                    }),
        hostile::expect<ShapeError>("LSTM layer with hidden 2^32", {"lstm", "weight"},
                                    [] {
                                        Generator gen(35);
                                        LSTM(1, {.hidden_size = k2p32}, gen);
                                    }),
        hostile::expect<ShapeError>("lstm op with hidden 2^32 on a small input", {"lstm", "weight"},
                                    [] {
                                        ComputeGraph g;
                                        lstm(g.input(randn({2, 1, 3}, 36), "x"), g.input(randn({8}, 37), "w"),
                                             {.hidden_size = k2p32});
                                    }),
        hostile::expect<ShapeError>("Linear(2^32, 2^32)", {"Tensor::empty", "(4294967296,4294967296)"},
                                    [] {
                                        Generator gen(38);
                                        Linear(k2p32, k2p32, true, gen);
                                    }),
        hostile::expect<ShapeError>("Conv2d with a (2^32, 2^32) kernel", {"fan"},
                                    [] {
                                        Generator gen(39);
                                        Conv2d(2, 2, {k2p32, k2p32}, {}, true, gen);
                                    }),
        hostile::expect<ShapeError>("compute_fans of (2,2^32,2^32,1)", {"fan_in"},
                                    [] { compute_fans({2, k2p32, k2p32, 1}); }),
        hostile::expect<ShapeError>("kaiming_uniform of (2^62,2^62)", {"fan"},
                                    [] {
                                        Generator gen(40);
                                        kaiming_uniform({k2p62, 4, k2p62}, gen);
                                    }),

        // ---- files ----
        hostile::expect<IoError>("safetensors shape (0,2^62,4): empty but its strides overflow",
                                 {"'t'", "(0,4611686018427387904,4)", "too large"},
                                 load_header(R"({"t":{"dtype":"F32","shape":[0,4611686018427387904,4],)"
                                             R"("data_offsets":[0,0]}})")),
        hostile::expect<IoError>("safetensors shape (2^32,2^32) float64", {"'w'", "too large"},
                                 load_header(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],)"
                                             R"("data_offsets":[0,0]}})")),
        hostile::expect<IoError>("safetensors shape (2^61) float32: 2^63 bytes", {"'b'", "too large"},
                                 load_header(R"({"b":{"dtype":"F32","shape":[2305843009213693952],)"
                                             R"("data_offsets":[0,0]}})")),
    });
}  // namespace
