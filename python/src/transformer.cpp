// The transformer layers of nn/transformer.h for Python (dyngrad.nn.MultiheadAttention, TransformerBlock,
// PositionalEmbedding, GPT): the C++ layers themselves, so a Python model initialises, names its parameters and
// computes exactly as its C++ twin. dyngrad/transformer.py wraps each in a Module whose parameters are the C++
// layer's (shared Parameter state: an optimizer step, load_state_dict or .to() seen from either side is the same).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "binding.h"

namespace dyngrad::python {

namespace {

nb::list named_parameters_of(const Module& layer) {
    nb::list out;
    for (const auto& [name, p] : layer.named_parameters()) {
        PyTensor t(p.value());
        t.parameter = p;
        out.append(nb::make_tuple(name, std::move(t)));
    }
    return out;
}

// fn(inputs) as a call of `layer` from Python: the module's train/eval mode first (Python's Module.training is the
// one users set); recorded into the graph when a parameter requires grad.
template <typename Layer>
PyTensor call_layer(Layer& layer, std::span<const PyTensor* const> inputs, bool training, const VarFunction& fn) {
    if (layer.is_training() != training) layer.train(training);
    bool trainable = false;
    for (const Parameter& p : layer.parameters()) trainable = trainable || p.requires_grad();
    return call_with_vars(inputs, trainable, fn);
}

// layer(x) from Python.
template <typename Layer>
PyTensor forward(Layer& layer, const PyTensor& x, bool training) {
    const PyTensor* inputs[] = {&x};
    return call_layer(layer, inputs, training,
                      [&layer](std::span<const Var> v, std::source_location where) { return layer(v[0], where); });
}

template <typename Layer>
void common(nb::class_<Layer>& cls) {
    cls.def("named_parameters", [](const Layer& l) { return named_parameters_of(l); })
        .def("forward", &forward<Layer>, nb::arg("x"), nb::arg("training"))
        .def("train", [](Layer& l, bool training) { l.train(training); }, nb::arg("training"));
}

// F.gelu's spelling ("none", "tanh") as GeluApproximation; ValueError naming `who` otherwise.
GeluApproximation gelu_of(const std::string& name, const char* who) {
    const auto names = choice_names(GeluApproximation{});
    for (std::size_t i = 0; i < names.size(); ++i)
        if (name == names[i]) return static_cast<GeluApproximation>(i);
    throw ValueError(str(who, "(): gelu='", name, "': expected 'none' or 'tanh'"));
}

// MultiheadAttention and TransformerBlock take the same arguments (TransformerOptions spelled out).
template <typename Layer>
void attention_init(nb::class_<Layer>& cls) {
    cls.def("__init__", [](Layer* self, std::int64_t embed_dim, std::int64_t num_heads, bool causal, double dropout,
                           std::uint64_t seed, bool bias, double residual_init_std, const std::string& gelu,
                           bool reduced_residual) {
        new (self) Layer(embed_dim, num_heads, default_generator(),
                         {.causal = causal, .dropout = dropout, .seed = seed, .bias = bias,
                          .residual_init_std = residual_init_std, .gelu = gelu_of(gelu, "TransformerBlock"),
                          .reduced_residual = reduced_residual});
    }, nb::arg("embed_dim"), nb::arg("num_heads"), nb::arg("causal"), nb::arg("dropout"), nb::arg("seed"),
       nb::arg("bias"), nb::arg("residual_init_std"), nb::arg("gelu") = "none", nb::arg("reduced_residual") = false);
}

}  // namespace

void bind_transformer(nb::module_& m) {
    nb::class_<MultiheadAttention> mha(m, "_MultiheadAttention");
    attention_init(mha);
    common(mha);
    nb::class_<TransformerBlock> block(m, "_TransformerBlock");
    attention_init(block);
    common(block);
    // A handle on the block's own attention layer (copies of a C++ module share its parameters and counters).
    block.def("attn", [](const TransformerBlock& b) { return b.attn; });
    block.def_rw("checkpoint", &TransformerBlock::checkpoint);  // activation checkpointing (graph/checkpoint.h)

    nb::class_<PositionalEmbedding> positions(m, "_PositionalEmbedding");
    positions.def("__init__", [](PositionalEmbedding* self, std::int64_t max_positions, std::int64_t embed_dim) {
        new (self) PositionalEmbedding(max_positions, embed_dim, default_generator());
    }, nb::arg("max_positions"), nb::arg("embed_dim"));
    common(positions);

    nb::class_<GPT> gpt(m, "_GPT");
    gpt.def("__init__", [](GPT* self, std::int64_t vocab_size, std::int64_t context, std::int64_t layers,
                           std::int64_t heads, std::int64_t width, double dropout, std::uint64_t seed, bool bias,
                           bool checkpoint, std::int64_t padded_vocab_size, bool tie_embeddings,
                           const std::string& gelu, bool reduced_residual) {
        const GPTConfig config{.vocab_size = vocab_size, .context = context, .layers = layers, .heads = heads,
                               .width = width, .dropout = dropout, .seed = seed, .bias = bias,
                               .padded_vocab_size = padded_vocab_size, .tie_embeddings = tie_embeddings,
                               .gelu = gelu_of(gelu, "GPT"), .checkpoint = checkpoint,
                               .reduced_residual = reduced_residual};
        new (self) GPT(config, default_generator());
    }, nb::arg("vocab_size"), nb::arg("context"), nb::arg("layers"), nb::arg("heads"), nb::arg("width"),
       nb::arg("dropout"), nb::arg("seed"), nb::arg("bias"), nb::arg("checkpoint") = false,
       nb::arg("padded_vocab_size") = 0, nb::arg("tie_embeddings") = false, nb::arg("gelu") = "none",
       nb::arg("reduced_residual") = false);
    common(gpt);
    gpt.def("block", [](const GPT& g, std::size_t i) {
        if (i >= g.blocks.size()) throw IndexError(str("GPT: block ", i, " does not exist (", g.blocks.size(), " blocks)"));
        return g.blocks[i];
    }, nb::arg("index"));
    gpt.def("position_embedding", [](const GPT& g) { return g.position_embedding; });
    // GPT::loss: the LM head and cross_entropy in one (ops/linear_cross_entropy.h), the logits never materialised.
    // dyngrad/transformer.py checks the tensors' shapes and dtypes first, naming GPT.loss.
    gpt.def("loss", [](GPT& g, const PyTensor& tokens, const PyTensor& targets, bool training, nb::handle reduction,
                       std::int64_t ignore_index, double label_smoothing) {
        const LinearCrossEntropyOptions options{.reduction = parse_choice<Reduction>(reduction, "GPT.loss", "reduction"),
                                                .ignore_index = ignore_index, .label_smoothing = label_smoothing};
        const PyTensor* inputs[] = {&tokens, &targets};
        return call_layer(g, inputs, training, [&g, &options](std::span<const Var> v, std::source_location where) {
            return g.loss(v[0], v[1], options, where);
        });
    }, nb::arg("tokens"), nb::arg("targets"), nb::arg("training"), nb::arg("reduction"), nb::arg("ignore_index"),
       nb::arg("label_smoothing"));

    // gpt2_small() as a dict of GPTConfig's fields (dyngrad/transformer.py builds its GPTConfig from it).
    m.def("_gpt2_small", [] {
        const GPTConfig c = gpt2_small();
        nb::dict d;
        d["vocab_size"] = c.vocab_size;
        d["context"] = c.context;
        d["layers"] = c.layers;
        d["heads"] = c.heads;
        d["width"] = c.width;
        d["dropout"] = c.dropout;
        d["seed"] = c.seed;
        d["bias"] = c.bias;
        d["padded_vocab_size"] = c.padded_vocab_size;
        d["tie_embeddings"] = c.tie_embeddings;
        d["gelu"] = std::string(choice_names(GeluApproximation{})[static_cast<std::size_t>(c.gelu)]);
        d["checkpoint"] = c.checkpoint;
        d["reduced_residual"] = c.reduced_residual;
        return d;
    });
    m.def("_padded_vocabulary", &padded_vocabulary, nb::arg("vocab"));
}

}  // namespace dyngrad::python
