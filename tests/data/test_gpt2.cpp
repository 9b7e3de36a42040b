// Issue 32's CPU parts: token files in llm.c's format (round trips with fresh random tokens, windows, every bad
// input with its typed error naming the file or the value), the fixed vocabulary of dyngrad-tokens, and the GPT-2
// configuration of nn/transformer.h (tied embeddings, the padded vocabulary, the tanh GELU).
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "temp_file.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;
using dgtest::TempFile;
namespace fs = std::filesystem;

namespace {

std::mt19937_64 fresh_engine() {
    const std::uint64_t seed = std::random_device{}();
    UNSCOPED_INFO("engine seed " << seed);
    return std::mt19937_64(seed);
}

std::vector<std::int64_t> random_tokens(std::mt19937_64& engine, std::int64_t count, std::int64_t vocab) {
    std::uniform_int_distribution<std::int64_t> token(0, vocab - 1);
    std::vector<std::int64_t> out(static_cast<std::size_t>(count));
    for (std::int64_t& t : out) t = token(engine);
    return out;
}

std::vector<std::int64_t> values(const Tensor& t) {
    return {t.data<std::int64_t>(), t.data<std::int64_t>() + t.numel()};
}

// The file's bytes with `edit` applied, written back.
template <typename Edit>
void rewrite(const fs::path& path, Edit edit) {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    edit(bytes);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

void set_int(std::string& bytes, int index, std::int32_t value) {
    std::memcpy(bytes.data() + 4 * index, &value, sizeof value);
}

}  // namespace

TEST_CASE("token files: llm.c's header and uint16 tokens, read back exactly", "[gpt2][tokens]") {
    auto engine = fresh_engine();
    const std::int64_t count = std::uniform_int_distribution<std::int64_t>(100, 5000)(engine);
    const std::vector<std::int64_t> tokens = random_tokens(engine, count, kTokenFileMaxVocabulary);
    const TempFile file("gpt2", "a.bin");
    write_token_file(file.path, tokens);

    CHECK(fs::file_size(file.path) == static_cast<std::uintmax_t>(1024 + 2 * count));
    std::ifstream in(file.path, std::ios::binary);
    std::int32_t header[256];
    in.read(reinterpret_cast<char*>(header), sizeof header);
    CHECK(header[0] == 20240520);
    CHECK(header[1] == 1);
    CHECK(header[2] == count);
    for (int i = 3; i < 256; ++i) CHECK(header[i] == 0);

    const std::vector<std::uint16_t> read = read_token_file(file.path);
    REQUIRE(read.size() == tokens.size());
    for (std::size_t i = 0; i < read.size(); ++i) REQUIRE(read[i] == tokens[i]);
}

TEST_CASE("TokenWindows: random windows from (seed, step), llm.c's sequential batches", "[gpt2][tokens]") {
    auto engine = fresh_engine();
    const std::int64_t vocab = 97, count = 1000, B = 3, T = 16;
    const std::vector<std::int64_t> tokens = random_tokens(engine, count, vocab);
    const TempFile file("gpt2", "w.bin");
    write_token_file(file.path, tokens);
    const TokenWindows windows(file.path, vocab, B, T);
    CHECK(windows.size() == count);

    const std::uint64_t seed = engine();
    const std::vector<std::int64_t> offsets = windows.random_offsets(seed, 7);
    CHECK(offsets == windows.random_offsets(seed, 7));
    CHECK(offsets != windows.random_offsets(seed, 8));
    const TokenBatch batch = windows.random(seed, 7);
    CHECK(batch.inputs.shape() == Shape{B, T});
    CHECK(batch.targets.shape() == Shape{B, T});
    const auto inputs = values(batch.inputs), targets = values(batch.targets);
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t offset = offsets[static_cast<std::size_t>(b)];
        REQUIRE(offset >= 0);
        REQUIRE(offset + T < count);
        for (std::int64_t t = 0; t < T; ++t) {
            CHECK(inputs[static_cast<std::size_t>(b * T + t)] == tokens[static_cast<std::size_t>(offset + t)]);
            CHECK(targets[static_cast<std::size_t>(b * T + t)] == tokens[static_cast<std::size_t>(offset + t + 1)]);
        }
    }

    CHECK(windows.sequential_batches() == (count - 1) / (B * T));
    const std::int64_t k = windows.sequential_batches() - 1;
    const auto sequential = values(windows.sequential(k).inputs);
    const auto sequential_targets = values(windows.sequential(k).targets);
    for (std::int64_t i = 0; i < B * T; ++i) {
        CHECK(sequential[static_cast<std::size_t>(i)] == tokens[static_cast<std::size_t>(k * B * T + i)]);
        CHECK(sequential_targets[static_cast<std::size_t>(i)] == tokens[static_cast<std::size_t>(k * B * T + i + 1)]);
    }
    CHECK_THROWS_MATCHES(windows.sequential(k + 1), IndexError, MessageHas({"w.bin", std::to_string(k + 1)}));
    CHECK_THROWS_MATCHES(windows.at({0, count - T}), IndexError, MessageHas({"w.bin", std::to_string(count - T)}));
}

TEST_CASE("token files: bad inputs raise typed errors naming the file or the value", "[gpt2][tokens][errors]") {
    auto engine = fresh_engine();
    const std::vector<std::int64_t> tokens = random_tokens(engine, 300, 50);
    const TempFile file("gpt2", "bad.bin"), missing("gpt2", "missing.bin");
    const fs::path& path = file.path;

    write_token_file(path, tokens);
    rewrite(path, [](std::string& bytes) { set_int(bytes, 0, 20240521); });
    CHECK_THROWS_MATCHES(read_token_file(path), IoError, MessageHas({"bad.bin", "magic 20240521"}));

    write_token_file(path, tokens);
    rewrite(path, [](std::string& bytes) { set_int(bytes, 1, 2); });
    CHECK_THROWS_MATCHES(read_token_file(path), IoError, MessageHas({"bad.bin", "version 2"}));

    write_token_file(path, tokens);
    rewrite(path, [](std::string& bytes) { bytes.resize(bytes.size() - 3); });
    CHECK_THROWS_MATCHES(read_token_file(path), IoError, MessageHas({"bad.bin", "truncated", "300 tokens"}));

    write_token_file(path, tokens);
    rewrite(path, [](std::string& bytes) { bytes.resize(1000); });
    CHECK_THROWS_MATCHES(read_token_file(path), IoError, MessageHas({"bad.bin", "truncated", "1024-byte header"}));

    write_token_file(path, tokens);
    rewrite(path, [](std::string& bytes) { bytes += "xy"; });
    CHECK_THROWS_MATCHES(read_token_file(path), IoError, MessageHas({"bad.bin", "after its tokens"}));

    write_token_file(path, tokens);
    rewrite(path, [](std::string& bytes) { set_int(bytes, 2, 0); });
    CHECK_THROWS_MATCHES(read_token_file(path), IoError, MessageHas({"bad.bin", "count is 0"}));

    // The largest token against a vocabulary one smaller than it: named with its position.
    write_token_file(path, tokens);
    const std::int64_t largest = *std::max_element(tokens.begin(), tokens.end());
    const auto position = std::find(tokens.begin(), tokens.end(), largest) - tokens.begin();
    CHECK_THROWS_MATCHES(read_token_file(path, largest), IndexError,
                         MessageHas({"bad.bin", str("token id ", largest, " at position ", position),
                                     str("vocabulary of ", largest)}));
    CHECK(read_token_file(path, largest + 1).size() == tokens.size());
    CHECK_THROWS_MATCHES(TokenWindows(path, 50, 2, 300), ValueError, MessageHas({"bad.bin", "300 tokens", "301"}));

    CHECK_THROWS_MATCHES(read_token_file(missing.path), IoError, MessageHas({"missing.bin"}));
    CHECK_THROWS_MATCHES(write_token_file(path, {1, 65536}), ValueError, MessageHas({"bad.bin", "token 65536"}));
    CHECK_THROWS_MATCHES(write_token_file(path, {}), ValueError, MessageHas({"bad.bin", "no tokens"}));
}

TEST_CASE("TokenVocabulary: bytes and fortunes-style words round-trip any text", "[gpt2][tokens]") {
    auto engine = fresh_engine();
    const std::vector<std::string> words{"the", "fortune", "cookie", "says", "Truth", "is", "a", "rare", "thing"};
    std::uniform_int_distribution<std::size_t> pick(0, words.size() - 1);
    std::uniform_int_distribution<int> byte(0, 255), coin(0, 3);
    std::string reference;
    for (int i = 0; i < 400; ++i) reference += words[pick(engine)] + (coin(engine) == 0 ? ".\n" : " ");

    const TokenVocabulary bytes = TokenVocabulary::bytes();
    const TokenVocabulary vocabulary = TokenVocabulary::words(reference, 1000);
    CHECK(bytes.size() == 256);
    CHECK(vocabulary.size() > 256);
    CHECK(vocabulary.size() <= 256 + 2 * static_cast<std::int64_t>(words.size()));  // each word, with and without space
    CHECK(TokenVocabulary::words(reference, 3).size() == 259);

    // Fresh text: reference-like words mixed with arbitrary bytes (NULs, high bytes, letters).
    std::string text;
    for (int i = 0; i < 300; ++i) {
        if (coin(engine) == 0) text += static_cast<char>(byte(engine));
        else text += (coin(engine) == 0 ? "" : " ") + words[pick(engine)];
    }
    for (const TokenVocabulary* v : {&bytes, &vocabulary}) {
        const std::vector<std::int64_t> tokens = v->encode(text);
        for (const std::int64_t t : tokens) REQUIRE((t >= 0 && t < v->size()));
        CHECK(v->decode(tokens) == text);
    }
    CHECK(bytes.encode(text).size() == text.size());
    CHECK(vocabulary.encode(text).size() < text.size());
    // Words of the reference are one token each, with their space; a word it lacks is its bytes.
    CHECK(vocabulary.encode("Truth says the cookie").size() == 4);
    CHECK(vocabulary.encode(" zq").size() == 3);
    CHECK_THROWS_MATCHES(vocabulary.decode({vocabulary.size()}), IndexError,
                         MessageHas({std::to_string(vocabulary.size())}));
    CHECK_THROWS_MATCHES(TokenVocabulary::words(reference, 65536 - 255), ValueError, MessageHas({"65281"}));
}

TEST_CASE("gpt2_small: llm.c's d12 shape; a tied, padded GPT equals the untied one with the same weights",
          "[gpt2][transformer]") {
    const GPTConfig gpt2 = gpt2_small();
    CHECK(gpt2.padded_vocab_size == padded_vocabulary(gpt2.vocab_size));
    CHECK(gpt2.padded_vocab_size % 64 == 0);
    CHECK(gpt2.padded_vocab_size - gpt2.vocab_size < 64);
    CHECK(gpt2.tie_embeddings);
    CHECK(gpt2.gelu == GeluApproximation::Tanh);
    CHECK(padded_vocabulary(64) == 64);
    CHECK(padded_vocabulary(65) == 128);
    CHECK_THROWS_AS(padded_vocabulary(0), ValueError);

    auto engine = fresh_engine();
    Generator gen(engine());
    GPTConfig tiny = gpt2;
    tiny.vocab_size = 61;
    tiny.padded_vocab_size = padded_vocabulary(61);
    tiny.layers = 2;
    tiny.heads = 2;
    tiny.width = 16;
    tiny.context = 8;
    tiny.dropout = 0.0;
    GPT tied(tiny, gen);
    std::int64_t count = 0;
    for (const auto& [name, p] : tied.named_parameters()) {
        CHECK(name.find("lm_head") == std::string::npos);
        count += p.value().numel();
    }
    // llm.c's count: embeddings (Vp + T)·E, per layer 12E² + 13E, the final LayerNorm 2E.
    const std::int64_t E = tiny.width;
    CHECK(tied.blocks[0].gelu == GeluApproximation::Tanh);
    CHECK(count == (64 + 8) * E + tiny.layers * (12 * E * E + 13 * E) + 2 * E);

    GPTConfig untied_config = tiny;
    untied_config.tie_embeddings = false;
    untied_config.padded_vocab_size = 0;
    GPT untied(untied_config, gen);
    for (const auto& [name, p] : untied.named_parameters()) {
        Parameter target = p;
        if (name == "lm_head.weight" || name == "token_embedding.weight") {
            target.value().copy_from(tied.token_embedding.weight.value().narrow(0, 0, tiny.vocab_size));
            continue;
        }
        for (const auto& [tied_name, q] : tied.named_parameters())
            if (tied_name == name) target.value().copy_from(q.value());
    }

    const std::vector<std::int64_t> tokens = random_tokens(engine, 2 * 7, tiny.vocab_size);
    const Tensor targets = Tensor::from_vector(random_tokens(engine, 2 * 7, tiny.vocab_size), {14});
    const auto loss_of = [&](GPT& model) {
        ComputeGraph graph;
        const Var logits = model(graph.input(Tensor::from_vector(tokens, {2, 7})));
        REQUIRE(logits.shape() == Shape{2, 7, tiny.vocab_size});
        const Var loss = cross_entropy(reshape(logits, {14, tiny.vocab_size}), graph.input(targets));
        graph.backward(loss);
        return loss.item();
    };
    CHECK(loss_of(tied) == Approx(loss_of(untied)).epsilon(1e-6));
    // The tied table's gradient is the sum of the untied embedding's and head's; its padding rows get none.
    const Tensor tied_grad = tied.token_embedding.weight.grad();
    const Tensor expected = add(untied.token_embedding.weight.grad(), untied.lm_head.weight.grad());
    for (std::int64_t v = 0; v < tiny.padded_vocab_size; ++v)
        for (std::int64_t e = 0; e < E; ++e) {
            const float got = tied_grad.data<float>()[v * E + e];
            if (v >= tiny.vocab_size) REQUIRE(got == 0.0f);
            else REQUIRE(got == Approx(expected.data<float>()[v * E + e]).margin(1e-6).epsilon(1e-4));
        }

    ComputeGraph graph;
    const Var too_long = graph.input(Tensor::from_vector(std::vector<std::int64_t>(9, 1), {1, 9}));
    CHECK_THROWS_MATCHES(tied(too_long), ShapeError, MessageHas({"T=9", "8 positions"}));
    CHECK_THROWS_MATCHES(GPT(GPTConfig{.vocab_size = 70, .heads = 2, .width = 4, .padded_vocab_size = 64}, gen),
                         ValueError, MessageHas({"padded_vocab_size 64", "vocab_size 70"}));
}
