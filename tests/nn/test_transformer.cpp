// The transformer layers of nn/transformer.h (issue 16): MultiheadAttention and TransformerBlock against a
// composition written out head by head from matmul/softmax/layer_norm (values and every gradient), finite
// differences on a tiny block in float64, dropout in train and eval mode, GPT's shapes, parameter names and
// typed errors, and the warm-up + cosine schedule.
#include <cmath>
#include <map>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

Tensor random(const Shape& shape, Generator& gen, DType dtype = DType::f64) {
    return Tensor::normal(shape, 0.0, 1.0, gen, dtype);
}

// Replaces every parameter of `module` by fresh random values (non-zero biases, non-unit LayerNorm weights),
// so that the comparison exercises every term.
void randomise(Module& module, Generator& gen, double scale = 0.5) {
    for (Parameter p : module.parameters())
        p.value().copy_from(Tensor::normal(p.value().shape(), 0.0, scale, gen, p.value().dtype()));
}

// The causal mask (T,T) as 0/1 in x's dtype: 1 above the diagonal (the future).
Tensor future_mask(std::int64_t T, DType dtype) {
    std::vector<double> values(static_cast<std::size_t>(T * T), 0.0);
    for (std::int64_t i = 0; i < T; ++i)
        for (std::int64_t j = i + 1; j < T; ++j) values[static_cast<std::size_t>(i * T + j)] = 1.0;
    return Tensor::from_vector(values, {T, T}, dtype);
}

// y = x·Wᵀ + b on x (N,in).
Var affine(const Var& x, const Var& w, const Var& b) { return add(matmul(x, transpose(w)), b); }

// Multi-head self-attention written out head by head: q_h = x·Wq_hᵀ + bq_h (rows h·D.. of the Q third of
// qkv.weight), softmax(q_h k_hᵀ / √D, future masked) v_h, heads concatenated, then proj.
Var reference_attention(ComputeGraph& g, const MultiheadAttention& mha, const Var& x) {
    const std::int64_t B = x.shape()[0], T = x.shape()[1], E = mha.embed_dim, H = mha.num_heads, D = E / H;
    const Var x2 = reshape(x, {B * T, E});
    const Var w = g.parameter(mha.qkv.weight), b = g.parameter(mha.qkv.bias);
    std::vector<Var> heads;
    for (std::int64_t h = 0; h < H; ++h) {
        const auto project = [&](std::int64_t part) {
            const std::int64_t row = part * E + h * D;
            return reshape(affine(x2, narrow(w, 0, row, D), narrow(b, 0, row, D)), {B, T, D});
        };
        Var scores = mul_scalar(matmul(project(0), transpose(project(1), 1, 2)), 1.0 / std::sqrt(double(D)));
        if (mha.options.causal)
            scores = masked_fill(scores, g.constant(future_mask(T, x.value().dtype())), -INFINITY);
        heads.push_back(matmul(softmax(scores, -1), project(2)));  // (B,T,D)
    }
    const Var merged = reshape(concat(heads, 2), {B * T, E});
    return reshape(affine(merged, g.parameter(mha.proj.weight), g.parameter(mha.proj.bias)), {B, T, E});
}

Var reference_block(ComputeGraph& g, const TransformerBlock& block, const Var& x) {
    const std::int64_t B = x.shape()[0], T = x.shape()[1], E = x.shape()[2];
    const auto norm = [&](const LayerNorm& ln, const Var& v) {
        return layer_norm(v, {E}, g.parameter(ln.weight), g.parameter(ln.bias), ln.eps);
    };
    const Var h = add(x, reference_attention(g, block.attn, norm(block.ln1, x)));
    const Var hidden = gelu(affine(reshape(norm(block.ln2, h), {B * T, E}), g.parameter(block.fc.weight),
                                   g.parameter(block.fc.bias)));
    return add(h, reshape(affine(hidden, g.parameter(block.proj.weight), g.parameter(block.proj.bias)), {B, T, E}));
}

struct Gradients {
    Tensor output, dx;
    std::map<std::string, Tensor> parameters;
};

// Runs forward(graph, x) and backward with the upstream gradient dy; collects the output, dx and every
// parameter's gradient (cloned, then dropped from the parameters).
template <typename Forward>
Gradients run(Module& module, const Tensor& x, const Tensor& dy, Forward forward) {
    module.zero_grad();
    ComputeGraph g;
    const Var xv = g.input(x, "x", true);
    const Var y = forward(g, xv);
    g.backward(y, dy);
    Gradients out{y.value().clone(), xv.grad().clone(), {}};
    for (const auto& [name, p] : module.named_parameters()) out.parameters[name] = p.grad().clone();
    module.zero_grad();
    return out;
}

void check_same(const Gradients& actual, const Gradients& reference, double tolerance) {
    CHECK(relative_norm_error(actual.output, reference.output) < tolerance);
    CHECK(relative_norm_error(actual.dx, reference.dx) < tolerance);
    REQUIRE(actual.parameters.size() == reference.parameters.size());
    for (const auto& [name, grad] : reference.parameters) {
        INFO("parameter " << name);
        REQUIRE(actual.parameters.at(name).defined());
        CHECK(relative_norm_error(actual.parameters.at(name), grad) < tolerance);
    }
}

}  // namespace

TEST_CASE("MultiheadAttention equals attention written out head by head, values and gradients",
          "[transformer][attention]") {
    for (const bool causal : {true, false}) {
        INFO("causal " << causal);
        Generator gen(causal ? 11 : 12);
        MultiheadAttention mha(12, 3, gen, {.causal = causal});
        mha.to(DType::f64);
        randomise(mha, gen);
        const Tensor x = random({2, 5, 12}, gen), dy = random({2, 5, 12}, gen);
        const Gradients layer = run(mha, x, dy, [&](ComputeGraph&, const Var& xv) { return mha(xv); });
        const Gradients reference =
            run(mha, x, dy, [&](ComputeGraph& g, const Var& xv) { return reference_attention(g, mha, xv); });
        check_same(layer, reference, 1e-10);
    }
}

TEST_CASE("causal attention: an output never depends on later positions; without causal it does",
          "[transformer][attention][causal]") {
    for (const bool causal : {true, false}) {
        INFO("causal " << causal);
        Generator gen(13);
        MultiheadAttention mha(8, 2, gen, {.causal = causal});
        randomise(mha, gen);
        const Tensor x = random({2, 6, 8}, gen, DType::f32);
        Tensor changed = x.clone();
        for (std::int64_t b = 0; b < 2; ++b)  // positions 3.. of every sequence
            for (std::int64_t i = 3 * 8; i < 6 * 8; ++i) changed.data<float>()[b * 6 * 8 + i] += 1.0f;
        const auto forward = [&](const Tensor& input) {
            ComputeGraph g;
            return mha(g.input(input)).value().narrow(1, 0, 3);  // outputs at positions 0..2
        };
        const double difference = relative_norm_error(forward(changed), forward(x));
        if (causal) CHECK(difference == 0.0);
        else CHECK(difference > 1e-3);
    }
}

TEST_CASE("TransformerBlock equals x + attn(ln1(x)); x + mlp(ln2(x)) written out, values and gradients",
          "[transformer][block]") {
    Generator gen(21);
    TransformerBlock block(8, 2, gen);
    block.to(DType::f64);
    randomise(block, gen);
    const Tensor x = random({3, 4, 8}, gen), dy = random({3, 4, 8}, gen);
    const Gradients layer = run(block, x, dy, [&](ComputeGraph&, const Var& xv) { return block(xv); });
    const Gradients reference =
        run(block, x, dy, [&](ComputeGraph& g, const Var& xv) { return reference_block(g, block, xv); });
    check_same(layer, reference, 1e-10);
    // The names the PyTorch twin (bench/torch_gpt.py) uses.
    std::set<std::string> names;
    for (const auto& [name, p] : block.named_parameters()) names.insert(name);
    CHECK(names == std::set<std::string>{"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                         "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                                         "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"});
}

TEST_CASE("a tiny TransformerBlock's gradients match central finite differences in float64",
          "[transformer][gradcheck]") {
    Generator gen(31);
    TransformerBlock block(4, 2, gen);
    block.to(DType::f64);
    randomise(block, gen);
    Tensor x = random({2, 3, 4}, gen);
    const Tensor weights = random({2, 3, 4}, gen);
    // loss = Σ block(x) ⊙ weights, so every output element matters with its own weight.
    const auto loss_of = [&](const Tensor& input) {
        const NoGradGuard no_grad;
        ComputeGraph g;
        return sum(mul(block(g.input(input)), g.constant(weights))).item();
    };
    const Gradients analytic = run(block, x, weights, [&](ComputeGraph&, const Var& xv) { return block(xv); });
    constexpr double h = 1e-6;
    const auto check_tensor = [&](Tensor target, const Tensor& gradient, const std::string& what) {
        double worst = 0;
        for (std::int64_t i = 0; i < target.numel(); ++i) {
            double* value = target.data<double>() + i;
            const double saved = *value;
            *value = saved + h;
            const double up = loss_of(x);
            *value = saved - h;
            const double down = loss_of(x);
            *value = saved;
            const double numeric = (up - down) / (2 * h);
            worst = std::max(worst, std::abs(numeric - gradient.data<double>()[i]) / (1 + std::abs(numeric)));
        }
        INFO(what << ": worst error " << worst);
        CHECK(worst < 1e-6);
    };
    for (const auto& [name, p] : block.named_parameters()) check_tensor(p.value(), analytic.parameters.at(name), name);
    check_tensor(x, analytic.dx, "x");  // a handle sharing x's storage: loss_of sees each perturbation
}

TEST_CASE("transformer dropout: masks differ between calls in training, none in eval mode",
          "[transformer][dropout]") {
    Generator gen(41);
    TransformerBlock plain(8, 2, gen, {.dropout = 0.0});
    Generator gen2(41);
    TransformerBlock dropping(8, 2, gen2, {.dropout = 0.3, .seed = 5});
    const Tensor x = random({2, 6, 8}, gen, DType::f32);
    const auto forward = [&](const TransformerBlock& block) {
        ComputeGraph g;
        return block(g.input(x)).value().clone();
    };
    // Same seed for the weights: the blocks differ only in dropout.
    const Tensor reference = forward(plain);
    const Tensor first = forward(dropping), second = forward(dropping);
    CHECK(relative_norm_error(first, reference) > 1e-3);
    CHECK(relative_norm_error(second, first) > 1e-3);
    dropping.eval();
    CHECK(relative_norm_error(forward(dropping), reference) < 1e-6);
    dropping.train();
    CHECK(relative_norm_error(forward(dropping), reference) > 1e-3);
}

TEST_CASE("GPT: logits of (B,T,V), the PyTorch twin's parameter names, and nanoGPT's initialisation",
          "[transformer][gpt]") {
    Generator gen(51);
    const GPTConfig config{.vocab_size = 11, .context = 8, .layers = 2, .heads = 2, .width = 16};
    GPT model(config, gen);
    ComputeGraph g;
    std::vector<std::int64_t> tokens;
    for (int i = 0; i < 2 * 7; ++i) tokens.push_back((i * 5 + 3) % 11);
    const Var logits = model(g.input(Tensor::from_vector(tokens, {2, 7})));
    CHECK(logits.shape() == Shape{2, 7, 11});

    std::vector<std::string> names;
    for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
    CHECK(names.front() == "token_embedding.weight");
    CHECK(names[1] == "position_embedding.weight");
    CHECK(names[2] == "blocks.0.ln1.weight");
    CHECK(names.back() == "lm_head.weight");
    CHECK(names.size() == 2 + 2 * 12 + 2 + 1);
    for (const auto& [name, p] : model.named_parameters()) {
        INFO(name);
        const Tensor& v = p.value();
        double sum_squares = 0;
        for (std::int64_t i = 0; i < v.numel(); ++i) sum_squares += v.data<float>()[i] * v.data<float>()[i];
        const double rms = std::sqrt(sum_squares / static_cast<double>(v.numel()));
        if (name.ends_with(".bias")) CHECK(rms == 0.0);
        else if (name.starts_with("ln") || name.find(".ln") != std::string::npos) CHECK(rms == 1.0);
        else if (name.ends_with("proj.weight")) CHECK(rms == Approx(0.02 / std::sqrt(4.0)).epsilon(0.2));
        else CHECK(rms == Approx(0.02).epsilon(0.2));
    }
}

TEST_CASE("GPT and the transformer layers refuse bad settings and inputs with typed errors",
          "[transformer][errors]") {
    Generator gen(61);
    CHECK_THROWS_MATCHES(MultiheadAttention(10, 3, gen), ValueError, MessageHas({"10", "not divisible", "3"}));
    CHECK_THROWS_MATCHES(TransformerBlock(8, 2, gen, {.dropout = 1.0}), ValueError, MessageHas({"dropout", "[0, 1)"}));
    GPT model({.vocab_size = 5, .context = 4, .layers = 1, .heads = 1, .width = 4}, gen);
    ComputeGraph g;
    const Var too_long = g.input(Tensor::from_vector(std::vector<std::int64_t>(6, 1), {1, 6}));
    CHECK_THROWS_MATCHES(model(too_long), ShapeError, MessageHas({"T=6", "4 positions"}));
}

TEST_CASE("WarmupCosineLR: linear warm-up, cosine decay to min_lr, min_lr after total", "[nn][schedule]") {
    Generator gen(71);
    Parameter p(Tensor::normal({3}, 0.0, 1.0, gen), "p");
    AdamW opt({p}, {.lr = 1e-2});
    WarmupCosineLR schedule(opt, 4, 14, 1e-3);
    CHECK(opt.lr() == Approx(1e-2 * 1 / 5));  // the constructor sets epoch 0's
    const auto expected = [](std::int64_t e) {
        if (e < 4) return 1e-2 * static_cast<double>(e + 1) / 5;
        if (e >= 14) return 1e-3;
        return 1e-3 + (1e-2 - 1e-3) * (1 + std::cos(std::numbers::pi * static_cast<double>(e - 4) / 10)) / 2;
    };
    for (std::int64_t e = 1; e <= 16; ++e) {
        schedule.step();
        INFO("epoch " << e);
        CHECK(opt.lr() == Approx(expected(e)));
    }
    CHECK(schedule.lr_at(4) == Approx(1e-2));
    CHECK(schedule.lr_at(9) == Approx((1e-2 + 1e-3) / 2));
    CHECK_THROWS_MATCHES(WarmupCosineLR(opt, 5, 5), ValueError, MessageHas({"total 5", "warmup 5"}));
    CHECK_THROWS_AS(WarmupCosineLR(opt, -1, 5), ValueError);
}

TEST_CASE("GPT on the GPU: the same loss and gradients as on the CPU", "[transformer][gpt][gpu]") {
    if (cuda_device_count() == 0) DG_SKIP("needs a CUDA device");
    const GPTConfig config{.vocab_size = 13, .context = 40, .layers = 2, .heads = 2, .width = 64};
    Generator gen(81);
    GPT on_cpu(config, gen);
    randomise(on_cpu, gen, 0.1);
    Generator gen2(82);
    GPT on_gpu(config, gen2);
    for (std::size_t i = 0; i < on_cpu.parameters().size(); ++i)
        on_gpu.parameters()[i].value().copy_from(on_cpu.parameters()[i].value());
    on_gpu.to(Device::cuda(0));
    // T = 37: not a multiple of any tile size.
    std::vector<std::int64_t> inputs, targets;
    for (int i = 0; i < 3 * 37; ++i) {
        inputs.push_back((i * 7 + 2) % 13);
        targets.push_back((i * 5 + 1) % 13);
    }
    const auto loss_and_gradients = [&](GPT& model, Device device) {
        ComputeGraph g;
        const Var logits = model(g.input(Tensor::from_vector(inputs, {3, 37}, device)));
        const Var loss = cross_entropy(reshape(logits, {3 * 37, 13}), g.input(Tensor::from_vector(targets, {3 * 37}, device)));
        model.zero_grad();
        g.backward(loss);
        std::vector<Tensor> grads;
        for (const Parameter& p : model.parameters()) grads.push_back(p.grad().to(Device::cpu()));
        return std::make_pair(loss.item(), grads);
    };
    const auto [cpu_loss, cpu_grads] = loss_and_gradients(on_cpu, Device::cpu());
    const auto [gpu_loss, gpu_grads] = loss_and_gradients(on_gpu, Device::cuda(0));
    CHECK(gpu_loss == Approx(cpu_loss).epsilon(1e-5));
    for (std::size_t i = 0; i < cpu_grads.size(); ++i) {
        INFO(on_cpu.named_parameters()[i].first);
        CHECK(relative_norm_error(gpu_grads[i], cpu_grads[i]) < 1e-4);
    }
}

namespace {

// Casts in `g` of a value that is not a parameter leaf: the activation casts a step pays.
int activation_casts(const ComputeGraph& g) {
    int casts = 0;
    for (NodeId id = 0; id < g.size(); ++id) {
        const ComputeNode& node = g.node(id);
        if (node.op != OpType::Cast) continue;
        const ComputeNode& input = g.node(node.inputs.at(0));
        if (input.op != OpType::Leaf || !input.parameter.defined()) ++casts;
    }
    return casts;
}

struct GptRun {
    double loss = 0;
    std::vector<Tensor> grads;  // on the CPU, float32
    int activation_casts = 0;
};

// One next-token loss of `model` on fixed random tokens, under autocast into `autocast` (f32: off).
GptRun gpt_loss_and_gradients(GPT& model, Device device, DType autocast, std::uint64_t seed) {
    Generator tokens_gen(seed);
    std::vector<std::int64_t> inputs, targets;
    const std::int64_t V = model.config.vocab_size;
    for (int i = 0; i < 2 * 9; ++i) {
        inputs.push_back(static_cast<std::int64_t>(tokens_gen.engine()() % static_cast<std::uint64_t>(V)));
        targets.push_back(static_cast<std::int64_t>(tokens_gen.engine()() % static_cast<std::uint64_t>(V)));
    }
    ComputeGraph g;
    GptRun run;
    {
        const AutocastGuard guard(autocast);
        const Var logits = model(g.input(Tensor::from_vector(inputs, {2, 9}, device)));
        const Var loss = cross_entropy(reshape(logits, {2 * 9, V}), g.input(Tensor::from_vector(targets, {2 * 9}, device)));
        run.activation_casts = activation_casts(g);
        model.zero_grad();
        g.backward(loss);
        run.loss = loss.item();
    }
    for (const Parameter& p : model.parameters()) run.grads.push_back(p.grad().to(Device::cpu()).to(DType::f32));
    return run;
}

GPT gpt_with_weights_of(const GPT& source, GPTConfig config) {
    Generator unused(1);
    GPT copy(config, unused);
    for (std::size_t i = 0; i < source.parameters().size(); ++i)
        copy.parameters()[i].value().copy_from(source.parameters()[i].value());
    return copy;
}

}  // namespace

TEST_CASE("GPT reduced_residual: under autocast one activation cast, the float32 recipe's loss and gradients "
          "to bf16's precision; without autocast nothing changes",
          "[transformer][gpt][autocast]") {
    const GPTConfig config{.vocab_size = 17, .context = 12, .layers = 2, .heads = 2, .width = 32};
    Generator gen(91);
    GPT standard(config, gen);
    randomise(standard, gen, 0.2);
    GPTConfig reduced_config = config;
    reduced_config.reduced_residual = true;
    GPT reduced = gpt_with_weights_of(standard, reduced_config);
    const std::uint64_t seed = 92 + static_cast<std::uint64_t>(gen.engine()() % 1000);

    const GptRun f32_standard = gpt_loss_and_gradients(standard, Device::cpu(), DType::f32, seed);
    const GptRun f32_reduced = gpt_loss_and_gradients(reduced, Device::cpu(), DType::f32, seed);
    CHECK(f32_reduced.loss == f32_standard.loss);  // off without autocast: the same graph
    CHECK(f32_reduced.activation_casts == 0);
    for (std::size_t i = 0; i < f32_standard.grads.size(); ++i)
        CHECK(relative_norm_error(f32_reduced.grads[i], f32_standard.grads[i]) == 0.0);

    const GptRun bf16_standard = gpt_loss_and_gradients(standard, Device::cpu(), DType::bf16, seed);
    const GptRun bf16_reduced = gpt_loss_and_gradients(reduced, Device::cpu(), DType::bf16, seed);
    // The float32 recipe casts into every Linear and out of each branch into the residual stream; the reduced one
    // casts the embeddings once, and as the standard one the LM head's weight (through its transpose: the bias-less
    // linear is matmul(x, wᵀ)) and the logits up for the float32 loss.
    CHECK(bf16_standard.activation_casts >= 4 * config.layers + 3);
    CHECK(bf16_reduced.activation_casts == 3);
    CHECK(bf16_reduced.loss == Approx(f32_standard.loss).epsilon(2e-2));
    for (std::size_t i = 0; i < f32_standard.grads.size(); ++i) {
        INFO(standard.named_parameters()[i].first);
        CHECK(relative_norm_error(bf16_reduced.grads[i], f32_standard.grads[i]) < 0.1);
        CHECK(relative_norm_error(bf16_reduced.grads[i], bf16_standard.grads[i]) < 0.1);
    }

    // float64 is never cast: an f64 model under autocast runs as without it, reduced_residual or not.
    GPT standard64 = gpt_with_weights_of(standard, config);
    GPT reduced64 = gpt_with_weights_of(standard, reduced_config);
    standard64.to(DType::f64);
    reduced64.to(DType::f64);
    const GptRun f64_standard = gpt_loss_and_gradients(standard64, Device::cpu(), DType::bf16, seed);
    const GptRun f64_reduced = gpt_loss_and_gradients(reduced64, Device::cpu(), DType::bf16, seed);
    CHECK(f64_reduced.activation_casts == 0);
    CHECK(f64_reduced.loss == f64_standard.loss);

    // Checkpointed blocks replay what was recorded (the casts and the LayerNorms with autocast off included): the
    // same loss and gradients, bit for bit.
    GPTConfig checkpointed_config = reduced_config;
    checkpointed_config.checkpoint = true;
    GPT checkpointed = gpt_with_weights_of(standard, checkpointed_config);
    const GptRun bf16_checkpointed = gpt_loss_and_gradients(checkpointed, Device::cpu(), DType::bf16, seed);
    CHECK(bf16_checkpointed.loss == bf16_reduced.loss);
    for (std::size_t i = 0; i < bf16_reduced.grads.size(); ++i)
        CHECK(relative_norm_error(bf16_checkpointed.grads[i], bf16_reduced.grads[i]) == 0.0);
}

TEST_CASE("GPT reduced_residual on the GPU: the CPU's loss and gradients under bf16 autocast",
          "[transformer][gpt][autocast][gpu]") {
    if (cuda_device_count() == 0) DG_SKIP("needs a CUDA device");
    GPTConfig config{.vocab_size = 17, .context = 12, .layers = 2, .heads = 2, .width = 64};
    config.reduced_residual = true;
    Generator gen(93);
    GPT on_cpu(config, gen);
    randomise(on_cpu, gen, 0.2);
    GPT on_gpu = gpt_with_weights_of(on_cpu, config);
    on_gpu.to(Device::cuda(0));
    const GptRun cpu = gpt_loss_and_gradients(on_cpu, Device::cpu(), DType::bf16, 94);
    const GptRun gpu = gpt_loss_and_gradients(on_gpu, Device::cuda(0), DType::bf16, 94);
    CHECK(gpu.activation_casts == cpu.activation_casts);
    CHECK(gpu.loss == Approx(cpu.loss).epsilon(1e-2));
    for (std::size_t i = 0; i < cpu.grads.size(); ++i) {
        INFO(on_cpu.named_parameters()[i].first);
        CHECK(relative_norm_error(gpu.grads[i], cpu.grads[i]) < 5e-2);
    }
}
