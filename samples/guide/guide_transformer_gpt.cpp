#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    // Characters are the tokens; a repetitive text, so that a small model learns it in a few dozen steps.
    std::string text;
    for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog. ";
    std::string vocab = text;
    std::sort(vocab.begin(), vocab.end());
    vocab.erase(std::unique(vocab.begin(), vocab.end()), vocab.end());
    std::vector<std::int64_t> tokens;
    for (const char c : text) tokens.push_back(static_cast<std::int64_t>(vocab.find(c)));

    const std::int64_t B = 8, T = 16, steps = 60;
    const GPTConfig config{.vocab_size = static_cast<std::int64_t>(vocab.size()), .context = T, .layers = 2,
                           .heads = 2, .width = 32};
    Generator gen(0);
    GPT model(config, gen);  // token + position embeddings, pre-LayerNorm blocks, final LayerNorm, LM head
    AdamW optimizer(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
    WarmupCosineLR schedule(optimizer, /*warmup_steps=*/10, /*total_steps=*/steps, /*min_lr=*/3e-4);

    const auto batch = [&](std::int64_t step) {  // B windows and their next characters
        std::vector<std::int64_t> x, y;
        for (std::int64_t b = 0; b < B; ++b) {
            const auto at = static_cast<std::ptrdiff_t>((step * 37 + b * 101) % (std::ssize(tokens) - T - 1));
            x.insert(x.end(), tokens.begin() + at, tokens.begin() + at + T);
            y.insert(y.end(), tokens.begin() + at + 1, tokens.begin() + at + T + 1);
        }
        return std::pair{Tensor::from_vector(x, {B, T}), Tensor::from_vector(y, {B * T})};
    };
    const auto next_token_loss = [&](GPT& gpt, ComputeGraph& graph, std::int64_t step) {
        const auto [x, y] = batch(step);
        const AutocastGuard autocast(DType::bf16);    // the products and attention in bf16, the loss in f32
        const Var logits = gpt(graph.input(x));       // (B, T, V)
        return cross_entropy(reshape(logits, {B * T, config.vocab_size}), graph.input(y));
    };

    double first = 0, last = 0;
    model.train();
    for (std::int64_t step = 0; step < steps; ++step) {
        ComputeGraph graph;
        const Var loss = next_token_loss(model, graph, step);
        optimizer.zero_grad();
        graph.backward(loss);
        clip_grad_norm(model.parameters(), 1.0);
        optimizer.step();
        schedule.step();  // per optimizer step: lr·(t+1)/(warmup+1), then a half cosine down to min_lr
        (step == 0 ? first : last) = loss.item();
    }
    std::cout << "loss " << first << " -> " << last << ", lr now " << optimizer.lr() << "\n";

    // Checkpoint: model, optimizer moments and the schedule's position in one safetensors file.
    const auto path = std::filesystem::temp_directory_path() / "guide_transformer_gpt.safetensors";
    save_checkpoint(path, model, optimizer, &schedule);
    Generator other(1);
    GPT restored(config, other);  // other initial weights, overwritten by the load
    AdamW restored_optimizer(restored.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
    WarmupCosineLR restored_schedule(restored_optimizer, 10, steps, 3e-4);
    load_checkpoint(path, restored, restored_optimizer, &restored_schedule);
    std::filesystem::remove(path);

    // Sampling with a temperature and top-k: the k most likely next characters, one drawn by their softmax.
    model.eval();
    restored.eval();
    const NoGradGuard no_grad;
    const double temperature = 0.8;
    const std::int64_t top_k = 5;
    std::vector<std::int64_t> context(tokens.begin(), tokens.begin() + 4);
    bool same_logits = true;
    for (int i = 0; i < 40; ++i) {
        const std::int64_t n = std::min<std::int64_t>(std::ssize(context), T);
        const Tensor window = Tensor::from_vector(std::vector<std::int64_t>(context.end() - n, context.end()), {1, n});
        ComputeGraph graph;
        const Tensor logits = model(graph.input(window)).value().select(1, n - 1);  // (1, V): the last position
        same_logits = same_logits && restored(graph.input(window)).value().select(1, n - 1).to_vector() ==
                                         logits.to_vector();
        const auto [values, indices] = topk(logits / temperature, top_k);  // (1, k), largest first
        const Tensor choice = multinomial(softmax(values), 1, /*replacement=*/false, gen);  // (1, 1), in [0, k)
        context.push_back(static_cast<std::int64_t>(indices.at({0, static_cast<std::int64_t>(choice.item())})));
    }
    std::string sample;
    for (const std::int64_t token : context) sample += vocab[static_cast<std::size_t>(token)];
    std::cout << "sample: " << sample << "\n";
    std::cout << "restored schedule at step " << restored_schedule.epoch() << ", same logits: " << same_logits << "\n";
    return last < 0.7 * first && restored_schedule.epoch() == steps && same_logits ? 0 : 1;
}
