// Hostile inputs to the transformer layers and the GPT model (nn/transformer.h) and the warm-up + cosine
// schedule (nn/optim.h): widths that do not split into heads, bad dropout, sequences beyond the positional
// table, inputs of the wrong shape, dtype or range, and weight files that do not fit the model.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;
using hostile::expect;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The layers built from a fixed generator: what the cases probe is their constructors' checks.
void mha(std::int64_t embed_dim, std::int64_t num_heads, const TransformerOptions& options = {}) {
    Generator gen(1);
    MultiheadAttention(embed_dim, num_heads, gen, options);
}
void block(std::int64_t embed_dim, std::int64_t num_heads, const TransformerOptions& options = {}) {
    Generator gen(1);
    TransformerBlock(embed_dim, num_heads, gen, options);
}
void positions(std::int64_t max_positions, std::int64_t embed_dim) {
    Generator gen(1);
    PositionalEmbedding(max_positions, embed_dim, gen);
}

GPTConfig tiny_config() { return {.vocab_size = 7, .context = 8, .layers = 1, .heads = 2, .width = 8}; }

// Runs a model or layer on an input made in a fresh graph.
void gpt_on(const Tensor& tokens, GPTConfig config = tiny_config()) {
    Generator gen(3);
    GPT model(config, gen);
    ComputeGraph graph;
    model(graph.input(tokens));
}

Tensor tokens(std::int64_t batch, std::int64_t length, std::int64_t value = 1) {
    return Tensor::from_vector(std::vector<std::int64_t>(static_cast<std::size_t>(batch * length), value),
                               {batch, length});
}

Tensor activations(const Shape& shape, DType dtype = DType::f32) {
    Generator gen(5);
    return Tensor::normal(shape, 0.0, 1.0, gen, dtype);
}

void attention_on(const Tensor& x) {
    Generator gen(7);
    MultiheadAttention mha(8, 2, gen);
    ComputeGraph graph;
    mha(graph.input(x));
}

void block_on(const Tensor& x) {
    Generator gen(9);
    TransformerBlock block(8, 2, gen);
    ComputeGraph graph;
    block(graph.input(x));
}

void positions_on(const Tensor& x) {
    Generator gen(11);
    PositionalEmbedding table(4, 8, gen);
    ComputeGraph graph;
    table(graph.input(x));
}

// The tensors of a GPT of config `saved` loaded into one of config `loaded` (what load_parameters does with a file).
void load_across(GPTConfig saved, GPTConfig loaded) {
    Generator gen(13);
    const TensorMap tensors = named_tensors(GPT(saved, gen));
    GPT target(loaded, gen);
    load_parameters(target, tensors, "saved.safetensors");
}

void schedule(std::int64_t warmup, std::int64_t total, double min_lr) {
    Parameter p(Tensor::ones({2}), "p");
    AdamW optimizer({p});
    WarmupCosineLR(optimizer, warmup, total, min_lr);
}

GPTConfig with(GPTConfig config, void (*edit)(GPTConfig&)) {
    edit(config);
    return config;
}

const bool added = hostile::add(
    "transformer",
    {
        // ---- construction ----
        expect<ValueError>("MultiheadAttention width 10 with 3 heads", {"MultiheadAttention", "10", "not divisible", "3"},
                           [] { mha(10, 3); }),
        expect<ValueError>("MultiheadAttention width 0", {"MultiheadAttention", "embed_dim", "positive", "0"},
                           [] { mha(0, 1); }),
        expect<ValueError>("MultiheadAttention 0 heads", {"MultiheadAttention", "num_heads", "positive"},
                           [] { mha(8, 0); }),
        expect<ValueError>("MultiheadAttention -2 heads", {"MultiheadAttention", "num_heads", "-2"},
                           [] { mha(8, -2); }),
        expect<ValueError>("MultiheadAttention dropout 1", {"MultiheadAttention", "dropout", "[0, 1)"},
                           [] { mha(8, 2, {.dropout = 1.0}); }),
        expect<ValueError>("MultiheadAttention dropout -0.1", {"dropout", "-0.1"},
                           [] { mha(8, 2, {.dropout = -0.1}); }),
        expect<ValueError>("MultiheadAttention dropout NaN", {"dropout", "nan"}, [] { mha(8, 2, {.dropout = kNaN}); }),
        expect<ValueError>("MultiheadAttention dropout inf", {"dropout", "inf"}, [] { mha(8, 2, {.dropout = kInf}); }),
        expect<ValueError>("TransformerBlock width 6 with 4 heads", {"6", "not divisible", "4"}, [] { block(6, 4); }),
        expect<ValueError>("TransformerBlock dropout 1.5", {"dropout", "1.5"}, [] { block(8, 2, {.dropout = 1.5}); }),
        expect<ValueError>("PositionalEmbedding of 0 positions", {"PositionalEmbedding", "max_positions", "0"},
                           [] { positions(0, 8); }),
        expect<ValueError>("PositionalEmbedding width -1", {"PositionalEmbedding", "embed_dim", "-1"},
                           [] { positions(4, -1); }),
        expect<ValueError>("GPT vocabulary 0", {"GPT", "vocab_size", "0"},
                           [] { gpt_on(tokens(1, 2), with(tiny_config(), [](GPTConfig& c) { c.vocab_size = 0; })); }),
        expect<ValueError>("GPT context 0", {"GPT", "context", "0"},
                           [] { gpt_on(tokens(1, 2), with(tiny_config(), [](GPTConfig& c) { c.context = 0; })); }),
        expect<ValueError>("GPT 0 layers", {"GPT", "layers", "0"},
                           [] { gpt_on(tokens(1, 2), with(tiny_config(), [](GPTConfig& c) { c.layers = 0; })); }),
        expect<ValueError>("GPT width 10 with 4 heads", {"GPT", "10", "not divisible", "4"}, [] {
            gpt_on(tokens(1, 2), with(tiny_config(), [](GPTConfig& c) {
                       c.width = 10;
                       c.heads = 4;
                   }));
        }),
        expect<ValueError>("GPT dropout 1", {"GPT", "dropout", "[0, 1)"},
                           [] { gpt_on(tokens(1, 2), with(tiny_config(), [](GPTConfig& c) { c.dropout = 1.0; })); }),
        expect<ValueError>("GPT dropout NaN", {"GPT", "dropout", "nan"},
                           [] { gpt_on(tokens(1, 2), with(tiny_config(), [](GPTConfig& c) { c.dropout = kNaN; })); }),

        // ---- inputs ----
        expect<ShapeError>("GPT sequence of 9 for a context of 8", {"GPT", "T=9", "context of 8"},
                           [] { gpt_on(tokens(2, 9)); }),
        expect<ShapeError>("GPT tokens of rank 1", {"GPT", "(B,T)", "(5)"},
                           [] { gpt_on(Tensor::from_vector(std::vector<std::int64_t>(5, 1), {5})); }),
        expect<ShapeError>("GPT tokens of rank 3", {"GPT", "(B,T)"}, [] { gpt_on(reshape(tokens(2, 3), {2, 3, 1})); }),
        expect<DTypeError>("GPT float tokens", {"embedding", "int64"}, [] { gpt_on(Tensor::ones({1, 3})); }),
        expect<IndexError>("GPT token 7 of a vocabulary of 7", {"embedding", "7"}, [] { gpt_on(tokens(1, 3, 7)); }),
        expect<IndexError>("GPT token -1", {"embedding", "-1"}, [] { gpt_on(tokens(1, 3, -1)); }),
        expect<ShapeError>("PositionalEmbedding T=5 beyond a table of 4", {"PositionalEmbedding", "T=5", "4 positions"},
                           [] { positions_on(activations({1, 5, 8})); }),
        expect<ShapeError>("PositionalEmbedding width 6 for a table of width 8", {"PositionalEmbedding", "(B,T,8)"},
                           [] { positions_on(activations({1, 3, 6})); }),
        expect<ShapeError>("PositionalEmbedding input of rank 2", {"PositionalEmbedding", "(B,T,8)"},
                           [] { positions_on(activations({3, 8})); }),
        expect<ShapeError>("MultiheadAttention input of rank 2", {"MultiheadAttention", "(B,T,8)", "(6,8)"},
                           [] { attention_on(activations({6, 8})); }),
        expect<ShapeError>("MultiheadAttention width 12 for a layer of 8", {"MultiheadAttention", "(B,T,8)", "12"},
                           [] { attention_on(activations({2, 3, 12})); }),
        expect<ShapeError>("MultiheadAttention input of rank 4", {"MultiheadAttention", "(B,T,8)"},
                           [] { attention_on(activations({2, 3, 1, 8})); }),
        expect<DTypeError>("MultiheadAttention float64 input for float32 weights", {"float64", "float32"},
                           [] { attention_on(activations({2, 3, 8}, DType::f64)); }),
        expect<ShapeError>("TransformerBlock width 4 for a block of 8", {"TransformerBlock", "(B,T,8)"},
                           [] { block_on(activations({2, 3, 4})); }),

        // ---- weights that do not fit ----
        expect<ShapeError>("GPT weights of width 8 into width 16", {"token_embedding.weight", "shape"}, [] {
            load_across(tiny_config(), with(tiny_config(), [](GPTConfig& c) { c.width = 16; }));
        }),
        expect<IoError>("GPT weights of 1 layer into 2", {"blocks.1."},
                        [] { load_across(tiny_config(), with(tiny_config(), [](GPTConfig& c) { c.layers = 2; })); }),
        expect<ShapeError>("GPT weights of context 8 into context 4", {"position_embedding.weight", "(8,8)"}, [] {
            load_across(tiny_config(), with(tiny_config(), [](GPTConfig& c) { c.context = 4; }));
        }),

        // ---- the warm-up + cosine schedule ----
        expect<ValueError>("WarmupCosineLR warmup -1", {"WarmupCosineLR", "warmup", "-1"}, [] { schedule(-1, 10, 0); }),
        expect<ValueError>("WarmupCosineLR total equal to warmup", {"WarmupCosineLR", "total 5", "warmup 5"},
                           [] { schedule(5, 5, 0); }),
        expect<ValueError>("WarmupCosineLR total 0", {"WarmupCosineLR", "total 0"}, [] { schedule(0, 0, 0); }),
        expect<ValueError>("WarmupCosineLR min_lr NaN", {"WarmupCosineLR", "min_lr"}, [] { schedule(1, 10, kNaN); }),
        expect<ValueError>("WarmupCosineLR min_lr -1", {"WarmupCosineLR", "min_lr"}, [] { schedule(1, 10, -1); }),
    });

}  // namespace
