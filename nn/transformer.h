// Transformer layers over scaled_dot_product_attention (ops/attention.h): multi-head self-attention with one
// fused QKV projection, the pre-LayerNorm block of GPT-2, learned positional embeddings, and a GPT model
// (token + position embeddings -> N blocks -> final LayerNorm -> LM head). Implemented in nn/transformer.cpp
// on top of the op functions; no kernels of their own.
//
// Shapes: x (B,T,E) with E = heads · head_dim; tokens (B,T) int64.
// Parameter names are those of bench/torch_gpt.py's PyTorch twin, so one safetensors file loads into both:
//   token_embedding.weight  position_embedding.weight
//   blocks.<i>.ln1.{weight,bias}  blocks.<i>.attn.qkv.{weight,bias}  blocks.<i>.attn.proj.{weight,bias}
//   blocks.<i>.ln2.{weight,bias}  blocks.<i>.mlp.fc.{weight,bias}    blocks.<i>.mlp.proj.{weight,bias}
//   ln_f.{weight,bias}  lm_head.weight
// Initialisation as nanoGPT's: every Linear and embedding weight normal(0, 0.02), biases zero, LayerNorms
// ones/zeros, and the projections that end a residual branch (attn.proj, mlp.proj) normal(0, 0.02/√(2·layers)).
// The LM head is a Linear of its own unless GPTConfig::tie_embeddings (GPT-2's and llm.c's choice): then the
// logits are x·token_embedding.weightᵀ, and lm_head.weight is neither registered nor written (one tensor, one
// name). gpt2_small() is GPT-2 small (124M) as llm.c trains it.
#pragma once
#include <cstdint>
#include <memory>
#include <source_location>

#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/nn/layers.h"
#include "dyngrad/ops/linear_cross_entropy.h"

namespace dyngrad {

// The settings shared by the attention layer and the block.
struct TransformerOptions {
    bool causal = true;     // each position attends to itself and earlier ones only
    double dropout = 0.0;   // on the attention weights and on each residual branch, in [0, 1)
    std::uint64_t seed = 0; // dropout masks: a function of (seed, layer, call), so runs repeat exactly
    bool bias = true;       // biases of the Linear layers
    // The standard deviation of the weights of the projections that end a residual branch
    // (GPT: 0.02 / √(2·layers)); the other Linear weights use 0.02.
    double residual_init_std = 0.02;
    GeluApproximation gelu = GeluApproximation::None;  // of the MLP; GPT-2 uses Tanh
    // Under autocast: the residual stream and the LayerNorms in the autocast dtype (LayerNorm's statistics still in
    // float32, its weight and bias rounded to the dtype), as llm.c trains GPT-2: no cast of an activation is left in
    // the step. Off (the default): PyTorch's autocast recipe, the residual stream and LayerNorm in float32, with a
    // cast into and out of every Linear (docs/mixed_precision.md "Reduced residual stream").
    bool reduced_residual = false;
};

// x (B,T,E) -> (B,T,E): qkv = x·Wqkvᵀ + b (one Linear of width 3E, split into heads by reshape + permute),
// y = sdpa(q, k, v, causal, dropout) with heads merged back, then proj and the residual dropout.
// ValueError when E is not a multiple of heads or dropout is outside [0, 1); ShapeError for an x that is not
// (B,T,E) with this E.
class MultiheadAttention : public Module {
public:
    MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, Generator& gen,
                       const TransformerOptions& options = {});
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;

    Linear qkv;   // (3E, E): rows [0, E) make q, [E, 2E) k, [2E, 3E) v; head h is rows [h·D, (h+1)·D) of each
    Linear proj;  // (E, E)
    std::int64_t embed_dim;
    std::int64_t num_heads;
    TransformerOptions options;

private:
    Dropout residual_dropout_;
    std::shared_ptr<std::uint64_t> attention_calls_;  // shared by copies, like Dropout's counter
};

// x (B,T,E) -> (B,T,E), pre-LayerNorm (GPT-2):  x = x + attn(ln1(x));  x = x + mlp(ln2(x)),
// mlp(h) = dropout(proj(gelu(fc(h)))) with fc E -> 4E and proj 4E -> E (GELU as options.gelu: exact by default).
class TransformerBlock : public Module {
public:
    TransformerBlock(std::int64_t embed_dim, std::int64_t num_heads, Generator& gen,
                     const TransformerOptions& options = {});
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;
    // The MLP branch alone (without ln2 and the residual): (B,T,E) -> (B,T,E).
    Var mlp(const Var& h, std::source_location where = std::source_location::current()) const;
    // Activation checkpointing (graph/checkpoint.h): the block keeps none of its intermediate values and replays
    // them in the backward; gradients are bitwise those without it. Per block, off by default.
    bool checkpoint = false;

    LayerNorm ln1;
    MultiheadAttention attn;
    LayerNorm ln2;
    Linear fc;    // "mlp.fc"
    Linear proj;  // "mlp.proj"
    GeluApproximation gelu;

private:
    Var body(const Var& x, std::source_location where) const;  // the block without checkpointing
    Dropout residual_dropout_;
};

// Learned absolute positions: x (B,T,E) -> x + weight[0:T], weight (max_positions, E) ~ normal(0, 0.02).
// An Embedding over positions 0..T-1 (nn.Embedding in the PyTorch twin), read as one slice of the table
// (narrow: no index tensor to copy to the device each step). ShapeError naming T and the table size when T
// exceeds it.
class PositionalEmbedding : public Module {
public:
    PositionalEmbedding(std::int64_t max_positions, std::int64_t embed_dim, Generator& gen);
    Var operator()(const Var& x, std::source_location where = std::source_location::current()) const;

    Parameter weight;
    std::int64_t max_positions;
};

struct GPTConfig {
    std::int64_t vocab_size = 0;
    std::int64_t context = 256;  // the positional table's size: the longest input
    std::int64_t layers = 6;
    std::int64_t heads = 6;
    std::int64_t width = 384;    // E
    double dropout = 0.0;        // after the embeddings, on the attention weights and on each residual branch
    std::uint64_t seed = 0;      // dropout masks
    bool bias = true;
    // Rows of the token embedding (and LM head): vocab_size rounded up to a multiple of 64 as llm.c does, so the
    // LM head's GEMM has a friendly shape. 0: vocab_size. The logits of the extra rows are cut off before they
    // are returned, so they never take probability mass (their embedding rows get no gradient).
    std::int64_t padded_vocab_size = 0;
    bool tie_embeddings = false;                      // the LM head reuses token_embedding.weight
    GeluApproximation gelu = GeluApproximation::None;  // GPT-2: Tanh

    std::int64_t embedding_rows() const { return padded_vocab_size > 0 ? padded_vocab_size : vocab_size; }
    bool checkpoint = false;     // every block checkpointed (TransformerBlock::checkpoint)
    bool reduced_residual = false;  // TransformerOptions::reduced_residual for every block, and ln_f
};

// GPT-2 small as llm.c's `-e d12` builds it: 12 layers, 12 heads, width 768, context 1024, vocabulary 50257
// padded to 50304, tied embeddings, tanh GELU, biases, no dropout (124,475,904 parameters with the padding).
GPTConfig gpt2_small();
// vocab rounded up to a multiple of 64 (llm.c's padded vocabulary); ValueError unless vocab > 0.
std::int64_t padded_vocabulary(std::int64_t vocab);

// tokens (B,T) int64 in [0, vocab_size), T <= context -> logits (B,T,vocab_size).
class GPT : public Module {
public:
    GPT(const GPTConfig& config, Generator& gen);
    Var operator()(const Var& tokens, std::source_location where = std::source_location::current()) const;
    // tokens (B,T), targets (B,T) or (B·T) int64 in [0, vocab_size) (or ignore_index) -> the loss, equal to
    // cross_entropy of the logits above (as (B·T, vocab_size)) against the targets, through linear_cross_entropy
    // (ops/linear_cross_entropy.h): the LM head and the loss in chunks of rows, so the (B·T, V) logits are never
    // materialised and the padded vocabulary rows never enter the softmax. For training: when only the loss is
    // needed, this is what to call; operator() still gives the logits (sampling, evaluation of the distribution).
    Var loss(const Var& tokens, const Var& targets, const LinearCrossEntropyOptions& options = {},
             std::source_location where = std::source_location::current()) const;

    GPTConfig config;
    Embedding token_embedding;
    PositionalEmbedding position_embedding;
    std::vector<TransformerBlock> blocks;
    LayerNorm ln_f;
    Linear lm_head;  // undefined weight when config.tie_embeddings

    // The dropout after the embeddings (config.dropout; ZeRO-3's "embed" unit applies it, distributed/zero.h).
    const Dropout& embedding_dropout() const { return embedding_dropout_; }

private:
    // tokens (B,T) -> the final hidden states ln_f(x) (B,T,E); the LM head's weight (embedding_rows(), E).
    Var hidden(const Var& tokens, std::source_location where) const;
    Var head_weight(const Var& like, std::source_location where) const;

    Dropout embedding_dropout_;
};

}  // namespace dyngrad
