// Activation checkpointing on the GPU (graph/checkpoint.h): a checkpointed training step captured into a CUDA
// graph (cuda::CapturedStep) gives, replay after replay, what the same steps give eagerly without checkpointing,
// bit for bit in deterministic mode (dropout from the device-resident seed stream, AdamW); and the GPT with every
// block checkpointed, eager, matches the plain GPT, also under bf16 autocast.
//
// Without a CUDA device (or in a CPU-only build) the executable prints why and exits 77 (CTest: skipped).
#include <cstdint>
#include <iostream>
#include <span>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

const Device kGpu = Device::cuda(0);

struct Deterministic {
    bool previous = cuda::deterministic();
    Deterministic() { cuda::set_deterministic(true); }
    ~Deterministic() { cuda::set_deterministic(previous); }
};

// Two residual blocks x + fc2(dropout(tanh(fc1(x)))), each optionally checkpointed, then a classifier.
struct Model {
    Generator gen;
    Linear a1, a2, b1, b2, head;
    Dropout drop;
    bool use_checkpoint;
    Model(std::uint64_t seed, bool use_checkpoint)
        : gen(seed), a1(32, 64, true, gen), a2(64, 32, true, gen), b1(32, 64, true, gen), b2(64, 32, true, gen),
          head(32, 10, true, gen), drop(0.3, seed + 1), use_checkpoint(use_checkpoint) {
        for (Linear* l : {&a1, &a2, &b1, &b2, &head}) l->to(kGpu);
    }
    std::vector<Parameter> parameters() const {
        std::vector<Parameter> out;
        for (const Linear* l : {&a1, &a2, &b1, &b2, &head})
            for (const Parameter& p : l->parameters()) out.push_back(p);
        return out;
    }
    Var block(const Linear& fc1, const Linear& fc2, const Var& x) const {
        const auto body = [&](const Var& h) { return add(h, fc2(drop(tanh(fc1(h))))); };
        return use_checkpoint ? checkpoint(body, x) : body(x);
    }
    Var operator()(const Var& x) const { return head(block(b1, b2, block(a1, a2, x))); }
};

struct Trainer {
    Model model;
    AdamW opt;
    Trainer(std::uint64_t seed, bool use_checkpoint)
        : model(seed, use_checkpoint), opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01}) {}
    Tensor step(std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var loss = cross_entropy(model(graph.input(in[0])), graph.input(in[1]));
        graph.backward(loss);
        opt.step();
        opt.zero_grad();
        return loss.value();
    }
};

std::vector<std::vector<Tensor>> batches(int count, std::int64_t rows, std::uint64_t seed) {
    Generator gen(seed);
    std::vector<std::vector<Tensor>> out;
    for (int i = 0; i < count; ++i) {
        std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
        for (auto& label : labels) label = static_cast<std::int64_t>(gen.engine()() % 10);
        out.push_back({Tensor::normal({rows, 32}, 0.0, 1.0, gen).to(kGpu), Tensor::from_vector(labels, {rows}).to(kGpu)});
    }
    return out;
}

}  // namespace

TEST_CASE("a captured checkpointed step equals the eager plain step bit for bit, replay after replay",
          "[gpu][capture][checkpoint][deterministic]") {
    const Deterministic deterministic;
    constexpr int kSteps = 30;
    Trainer eager(41, false), captured(41, true);
    cuda::CapturedStep step([&](std::span<const Tensor> in) { return captured.step(in); });
    const std::vector<std::vector<Tensor>> data = batches(3, 16, 4100);
    Tensor eager_loss, captured_loss;
    for (int i = 0; i < kSteps; ++i) {
        const std::vector<Tensor>& batch = data[static_cast<std::size_t>(i) % data.size()];
        eager_loss = eager.step(batch);
        captured_loss = step.run(batch);
    }
    CHECK(step.variants() == 1);
    CHECK(captured_loss.item() == eager_loss.item());
    const std::vector<Parameter> a = eager.opt.parameters(), b = captured.opt.parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].value().to_vector() == b[i].value().to_vector());
    CHECK(captured.model.drop.seeds().draws() == 2 * kSteps);  // the replays drew fresh masks
}

TEST_CASE("the GPT with every block checkpointed matches the plain GPT on the GPU, f32 and bf16 autocast",
          "[gpu][checkpoint][gpt]") {
    const Deterministic deterministic;
    for (const DType precision : {DType::f32, DType::bf16}) {
        INFO("precision " << dtype_name(precision));
        const auto run = [&](bool use_checkpoint) {
            Generator gen(43);
            GPTConfig config{.vocab_size = 13, .context = 16, .layers = 2, .heads = 2, .width = 32, .dropout = 0.1,
                             .seed = 5};
            config.checkpoint = use_checkpoint;
            GPT model(config, gen);
            model.to(kGpu);
            model.train(true);
            std::vector<std::int64_t> tokens;
            for (int i = 0; i < 2 * 15; ++i) tokens.push_back((i * 7 + 2) % 13);
            ComputeGraph g;
            Var loss;
            {
                const AutocastGuard autocast(precision);
                const Var logits = model(g.input(Tensor::from_vector(tokens, {2, 15}).to(kGpu)));
                loss = mean(mul(logits, logits));
            }
            g.backward(loss);
            std::vector<std::vector<double>> out{{loss.item()}};
            for (const Parameter& p : model.parameters()) out.push_back(p.grad().to_vector());
            return out;
        };
        CHECK(run(false) == run(true));
    }
}

int main(int argc, char* argv[]) {
    if (cuda_device_count() == 0) {
        std::cout << "dyngrad: no CUDA device: GPU checkpoint tests skipped" << std::endl;
        return 77;
    }
    return dgtest::run_session(argc, argv);
}
