// Transformer layers and the GPT model (nn/transformer.h). Layers only compose op functions.
#include "dyngrad/nn/transformer.h"

#include <cmath>
#include <string>

#include "dyngrad/graph/autocast.h"
#include "dyngrad/graph/checkpoint.h"
#include "dyngrad/ops/attention.h"
#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/linalg.h"
#include "dyngrad/ops/norm.h"

namespace dyngrad {

namespace {

constexpr double kInitStd = 0.02;  // nanoGPT's (GPT-2's) weight scale

// A seed for sub-stream `stream` of `seed`: unrelated masks for each dropout of a model.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) {
    return math::splitmix64_mix(seed + (stream + 1) * math::kSplitMixGamma);
}

void fill_normal(Parameter& p, double stddev, Generator& gen) {
    p.value().copy_from(Tensor::normal(p.value().shape(), 0.0, stddev, gen, p.value().dtype()));
}

void fill_zeros(Parameter& p) {
    if (p.defined()) p.value().copy_from(Tensor::zeros(p.value().shape(), p.value().dtype()));
}

// A Linear with nanoGPT's initialisation: weight normal(0, stddev), bias zero.
Linear make_linear(std::int64_t in, std::int64_t out, bool bias, double stddev, Generator& gen) {
    Linear layer(in, out, bias, gen);
    fill_normal(layer.weight, stddev, gen);
    fill_zeros(layer.bias);
    return layer;
}

void check_dropout(const char* layer, double p) {
    if (!(p >= 0 && p < 1)) throw ValueError(str(layer, ": dropout must be in [0, 1), got ", p));
}

void check_heads(const char* layer, std::int64_t embed_dim, std::int64_t num_heads) {
    if (embed_dim <= 0) throw ValueError(str(layer, ": embed_dim must be positive, got ", embed_dim));
    if (num_heads <= 0) throw ValueError(str(layer, ": num_heads must be positive, got ", num_heads));
    if (embed_dim % num_heads != 0)
        throw ValueError(str(layer, ": embed_dim ", embed_dim, " is not divisible by num_heads ", num_heads));
}

// x (B,T,E) with this E, or ShapeError naming the layer.
void check_sequence(const char* layer, const Var& x, std::int64_t embed_dim) {
    const Shape& s = x.shape();
    if (s.size() != 3 || s[2] != embed_dim)
        throw ShapeError(str(layer, ": expects x of shape (B,T,", embed_dim, "), got ", to_string(s)));
}

// layer applied to the last axis of x (B,T,in) -> (B,T,out): Linear takes (N,in); reshape is metadata only.
Var linear_over_rows(const Linear& layer, const Var& x, std::source_location where) {
    const Shape& s = x.shape();
    const Var y = layer(reshape(x, {s[0] * s[1], s[2]}, where), where);
    return reshape(y, {s[0], s[1], y.shape()[1]}, where);
}

// ln(x), where TransformerOptions::reduced_residual keeps an x already in the autocast dtype in it: the LayerNorm
// runs with autocast off on x and its weight and bias rounded to x's dtype (its kernels sum in float32), so neither x
// nor the output pays a cast (autocast's Float32 policy would cast x up and the next Linear the output down).
Var layer_norm_of(const LayerNorm& ln, const Var& x, bool reduced_residual, std::source_location where) {
    const std::optional<DType> autocast = autocast_dtype();
    if (!reduced_residual || !autocast || x.dtype() != *autocast) return ln(x, where);
    const AutocastGuard off(DType::f32);
    ComputeGraph& graph = x.graph();
    const auto rounded = [&](const Parameter& p) {
        return p.defined() ? to_dtype(graph.parameter(p, where), *autocast, where) : Var();
    };
    return layer_norm(x, ln.normalized_shape, rounded(ln.weight), rounded(ln.bias), ln.eps, where);
}

}  // namespace

MultiheadAttention::MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, Generator& gen,
                                       const TransformerOptions& options)
    : qkv((check_heads("MultiheadAttention", embed_dim, num_heads),
           make_linear(embed_dim, 3 * embed_dim, options.bias, kInitStd, gen))),
      proj(make_linear(embed_dim, embed_dim, options.bias, options.residual_init_std, gen)),
      embed_dim(embed_dim),
      num_heads(num_heads),
      options(options),
      residual_dropout_((check_dropout("MultiheadAttention", options.dropout), options.dropout),
                        derive_seed(options.seed, 0)),
      attention_calls_(std::make_shared<std::uint64_t>(0)) {
    register_module("qkv", qkv);
    register_module("proj", proj);
    register_module("residual_dropout", residual_dropout_);
}

Var MultiheadAttention::operator()(const Var& x, std::source_location where) const {
    check_sequence("MultiheadAttention", x, embed_dim);
    AttentionOptions attention;
    attention.is_causal = options.causal;
    if (is_training() && options.dropout > 0) {
        attention.dropout_p = options.dropout;
        attention.seed = derive_seed(derive_seed(options.seed, 1), ++*attention_calls_);
    }
    // (B,T,3E) -> (B,T,E): the heads' q, k, v read from the projection where it wrote them, their outputs merged
    // (on cuDNN without a layout copy either way; ops/attention.h).
    const Var merged = qkv_attention(linear_over_rows(qkv, x, where), num_heads, attention, where);
    return residual_dropout_(linear_over_rows(proj, merged, where), where);
}

TransformerBlock::TransformerBlock(std::int64_t embed_dim, std::int64_t num_heads, Generator& gen,
                                   const TransformerOptions& options)
    : ln1(Shape{embed_dim}),
      attn(embed_dim, num_heads, gen, options),
      ln2(Shape{embed_dim}),
      fc(make_linear(embed_dim, 4 * embed_dim, options.bias, kInitStd, gen)),
      proj(make_linear(4 * embed_dim, embed_dim, options.bias, options.residual_init_std, gen)),
      gelu(options.gelu),
      residual_dropout_(options.dropout, derive_seed(options.seed, 2)) {
    register_module("ln1", ln1);
    register_module("attn", attn);
    register_module("ln2", ln2);
    Module mlp_names;  // the PyTorch twin's "mlp" submodule: parameter names mlp.fc.*, mlp.proj.*
    mlp_names.register_module("fc", fc);
    mlp_names.register_module("proj", proj);
    register_module("mlp", mlp_names);
    register_module("residual_dropout", residual_dropout_);
}

Var TransformerBlock::mlp(const Var& h, std::source_location where) const {
    if (fc.bias.defined() && proj.bias.defined()) {  // one op: GELU in the GEMMs' epilogues on the GPU (ops/linalg.h)
        ComputeGraph& graph = h.graph();
        return residual_dropout_(gelu_mlp(h, graph.parameter(fc.weight, where), graph.parameter(fc.bias, where),
                                          graph.parameter(proj.weight, where), graph.parameter(proj.bias, where), gelu,
                                          where),
                                 where);
    }
    const Var hidden = dyngrad::gelu(linear_over_rows(fc, h, where), gelu, where);
    return residual_dropout_(linear_over_rows(proj, hidden, where), where);
}

Var TransformerBlock::operator()(const Var& x, std::source_location where) const {
    check_sequence("TransformerBlock", x, attn.embed_dim);
    if (checkpoint && grad_enabled())  // fn runs within the call: `this` outlives it
        return dyngrad::checkpoint([this, where](const Var& in) { return body(in, where); }, x, where);
    return body(x, where);
}

Var TransformerBlock::body(const Var& x, std::source_location where) const {
    const bool reduced = attn.options.reduced_residual;
    const Var after_attention = add(x, attn(layer_norm_of(ln1, x, reduced, where), where), where);
    return add(after_attention, mlp(layer_norm_of(ln2, after_attention, reduced, where), where), where);
}

PositionalEmbedding::PositionalEmbedding(std::int64_t max_positions, std::int64_t embed_dim, Generator& gen)
    : max_positions(max_positions) {
    if (max_positions <= 0)
        throw ValueError(str("PositionalEmbedding: max_positions must be positive, got ", max_positions));
    if (embed_dim <= 0) throw ValueError(str("PositionalEmbedding: embed_dim must be positive, got ", embed_dim));
    weight = register_parameter("weight", Tensor::normal({max_positions, embed_dim}, 0.0, kInitStd, gen));
}

Var PositionalEmbedding::operator()(const Var& x, std::source_location where) const {
    const Var table = x.graph().parameter(weight, where);
    const Shape& s = x.shape();
    const std::int64_t width = table.shape()[1];
    if (s.size() != 3 || s[2] != width)
        throw ShapeError(str("PositionalEmbedding: expects x of shape (B,T,", width, "), got ", to_string(s)));
    if (s[1] > max_positions)
        throw ShapeError(str("PositionalEmbedding: sequence length T=", s[1], " exceeds the table of ", max_positions,
                             " positions"));
    return add(x, narrow(table, 0, 0, s[1], where), where);  // (T,E) broadcast over B
}

namespace {
TransformerOptions block_options(const GPTConfig& config, std::int64_t layer) {
    return {.causal = true,
            .dropout = config.dropout,
            .seed = derive_seed(config.seed, static_cast<std::uint64_t>(layer) + 1),
            .bias = config.bias,
            .residual_init_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config.layers)),
            .gelu = config.gelu,
            .reduced_residual = config.reduced_residual};
}

const GPTConfig& checked(const GPTConfig& config) {
    if (config.vocab_size <= 0) throw ValueError(str("GPT: vocab_size must be positive, got ", config.vocab_size));
    if (config.context <= 0) throw ValueError(str("GPT: context must be positive, got ", config.context));
    if (config.layers <= 0) throw ValueError(str("GPT: layers must be positive, got ", config.layers));
    check_heads("GPT", config.width, config.heads);
    check_dropout("GPT", config.dropout);
    if (config.padded_vocab_size != 0 && config.padded_vocab_size < config.vocab_size)
        throw ValueError(str("GPT: padded_vocab_size ", config.padded_vocab_size, " is below vocab_size ",
                             config.vocab_size, " (0: no padding)"));
    return config;
}
}  // namespace

std::int64_t padded_vocabulary(std::int64_t vocab) {
    if (vocab <= 0) throw ValueError(str("padded_vocabulary: the vocabulary must be positive, got ", vocab));
    constexpr std::int64_t kMultiple = 64;  // llm.c's padding
    return (vocab + kMultiple - 1) / kMultiple * kMultiple;
}

GPTConfig gpt2_small() {
    constexpr std::int64_t kGpt2Vocabulary = 50257;
    return {.vocab_size = kGpt2Vocabulary,
            .context = 1024,
            .layers = 12,
            .heads = 12,
            .width = 768,
            .dropout = 0.0,
            .seed = 0,
            .bias = true,
            .padded_vocab_size = padded_vocabulary(kGpt2Vocabulary),
            .tie_embeddings = true,
            .gelu = GeluApproximation::Tanh};
}

GPT::GPT(const GPTConfig& config_, Generator& gen)
    : config(checked(config_)),
      token_embedding(config.embedding_rows(), config.width, gen),
      position_embedding(config.context, config.width, gen),
      ln_f(Shape{config.width}),
      lm_head(config.tie_embeddings ? Linear() : make_linear(config.width, config.embedding_rows(), false, kInitStd, gen)),
      embedding_dropout_(config.dropout, derive_seed(config.seed, 0)) {
    fill_normal(token_embedding.weight, kInitStd, gen);
    register_module("token_embedding", token_embedding);
    register_module("position_embedding", position_embedding);
    Module block_names;  // the PyTorch twin's nn.ModuleList: blocks.0.*, blocks.1.*, ...
    for (std::int64_t i = 0; i < config.layers; ++i) {
        blocks.emplace_back(config.width, config.heads, gen, block_options(config, i));
        blocks.back().checkpoint = config.checkpoint;
        block_names.register_module(std::to_string(i), blocks.back());
    }
    register_module("blocks", block_names);
    register_module("ln_f", ln_f);
    if (!config.tie_embeddings) register_module("lm_head", lm_head);
    register_module("embedding_dropout", embedding_dropout_);
}

Var GPT::hidden(const Var& tokens, std::source_location where) const {
    const Shape& s = tokens.shape();
    if (s.size() != 2) throw ShapeError(str("GPT: expects tokens of shape (B,T), got ", to_string(s)));
    if (s[1] > config.context)
        throw ShapeError(str("GPT: sequence length T=", s[1], " exceeds the context of ", config.context,
                             " positions (the positional table's size)"));
    Var x = embedding_dropout_(position_embedding(token_embedding(tokens, where), where), where);
    // reduced_residual: a float32 stream enters the autocast dtype once, here, and stays in it (float64 is never
    // cast, as autocast leaves it).
    if (const std::optional<DType> autocast = autocast_dtype();
        config.reduced_residual && autocast && x.dtype() == DType::f32)
        x = to_dtype(x, *autocast, where);
    for (const TransformerBlock& block : blocks) x = block(x, where);
    return layer_norm_of(ln_f, x, config.reduced_residual, where);
}

Var GPT::head_weight(const Var& like, std::source_location where) const {
    // Tied: the token table (rows, E) is the head's weight; otherwise lm_head's (bias-less) weight.
    return like.graph().parameter(config.tie_embeddings ? token_embedding.weight : lm_head.weight, where);
}

Var GPT::operator()(const Var& tokens, std::source_location where) const {
    const Shape& s = tokens.shape();
    const Var h = hidden(tokens, where);
    const Var logits = reshape(linear(reshape(h, {s[0] * s[1], config.width}, where), head_weight(h, where), where),
                               {s[0], s[1], config.embedding_rows()}, where);
    return config.embedding_rows() == config.vocab_size ? logits : narrow(logits, 2, 0, config.vocab_size, where);
}

Var GPT::loss(const Var& tokens, const Var& targets, const LinearCrossEntropyOptions& options,
              std::source_location where) const {
    const Shape& s = tokens.shape();
    const Var h = hidden(tokens, where);
    const std::int64_t rows = s[0] * s[1];
    if (targets.value().numel() != rows || (targets.shape() != s && targets.shape() != Shape{rows}))
        throw ShapeError(str("GPT::loss: targets ", to_string(targets.shape()), " do not match tokens ", to_string(s),
                             ": expected (B,T) or (B·T)"));
    LinearCrossEntropyOptions head = options;
    head.classes = config.vocab_size;  // the padded rows are no classes
    return linear_cross_entropy(reshape(h, {rows, config.width}, where), head_weight(h, where),
                                targets.shape().size() == 1 ? targets : reshape(targets, {rows}, where), head, where);
}

}  // namespace dyngrad
