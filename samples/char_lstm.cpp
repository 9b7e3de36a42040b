// A character-level language model on any text file: embedding -> LSTM -> linear, trained with AdamW and
// gradient clipping on random windows of the text, then a greedy continuation of its first characters.
//   char_lstm --text FILE [--steps N] [--hidden H] [--device cpu|cuda] [--seed N]
// Prints the mean loss every 25 steps; exits 1 unless the mean loss of the last 25 steps is below 80% of the
// first 25's (the model must learn something of the text).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "../cli/command_line.h"
#include "byte_tokens.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

// The whole file, read as bytes.
std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct CharModel : Module {
    Embedding embed;
    LSTM lstm;
    Linear head;
    CharModel(std::int64_t vocabulary, std::int64_t hidden, Generator& gen)
        : embed(vocabulary, 32, gen), lstm(32, {.hidden_size = hidden}, gen), head(hidden, vocabulary, true, gen) {
        register_module("embed", embed);
        register_module("lstm", lstm);
        register_module("head", head);
    }
    // tokens (T,N) int64 -> logits (T·N, V), and the LSTM's final states for the next call.
    RnnResult step(const Var& tokens, std::optional<Var> h0, std::optional<Var> c0, Var& logits) const {
        RnnResult r = lstm(embed(tokens), std::move(h0), std::move(c0));
        const std::int64_t rows = tokens.shape()[0] * tokens.shape()[1];
        logits = head(reshape(r.output, {rows, r.output.shape()[2]}));
        return r;
    }
};

int main(int argc, char** argv) {
    const char* const usage =
        "usage: char_lstm --text FILE [--steps N] [--hidden H] [--device cpu|cuda] [--seed N]\n";
    std::string text_path;
    std::int64_t steps = 200, hidden = 128, seed = 0;
    Device device = Device::cpu();
    try {
        const cli::Arguments args(argc, argv, {.options = {"--text", "--steps", "--hidden", "--device", "--seed"}});
        if (args.help()) {
            std::fputs(usage, stdout);
            return 0;
        }
        const auto text = args.value("--text");
        if (!text) throw cli::UsageError("--text is required");
        text_path = cli::existing_file("--text", *text);
        if (auto v = args.value("--steps")) steps = cli::parse_int("--steps", *v, 50, 1'000'000);
        if (auto v = args.value("--hidden")) hidden = cli::parse_int("--hidden", *v, 1, 4096);
        if (auto v = args.value("--seed")) seed = cli::parse_int("--seed", *v, 0);
        if (auto v = args.value("--device")) device = cli::parse_device("--device", *v, {"cpu", "cuda"});
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "char_lstm: %s\n%s", e.what(), usage);
        return 2;
    }
    try {
        const ByteTokens corpus(read_text(text_path));
        constexpr std::int64_t kWindow = 32, kBatch = 16, kReport = 25;
        const auto length = static_cast<std::int64_t>(corpus.tokens.size());
        if (length <= kWindow + 1)
            throw ValueError(str("char_lstm: ", text_path, " holds ", length, " characters; it needs more than ",
                                 kWindow + 1));
        const auto vocabulary = static_cast<std::int64_t>(corpus.vocabulary.size());
        Generator gen(static_cast<std::uint64_t>(seed));
        CharModel model(vocabulary, hidden, gen);
        model.to(device);
        AdamW optimizer(model.parameters(), {.lr = 3e-3, .weight_decay = 0.01});
        std::printf("%lld characters, %lld distinct; %lld parameter tensors on %s\n", static_cast<long long>(length),
                    static_cast<long long>(vocabulary), static_cast<long long>(model.parameters().size()),
                    device.to_string().c_str());

        std::mt19937_64 offsets(static_cast<std::uint64_t>(seed));
        std::uniform_int_distribution<std::int64_t> start(0, length - kWindow - 2);
        double first = 0, window_sum = 0, last = 0;
        for (std::int64_t step = 1; step <= steps; ++step) {
            // Inputs (T,N) and next-character targets (T·N), column n a random window of the text.
            std::vector<std::int64_t> inputs(kWindow * kBatch), targets(kWindow * kBatch);
            for (std::int64_t n = 0; n < kBatch; ++n) {
                const std::int64_t at = start(offsets);
                for (std::int64_t t = 0; t < kWindow; ++t) {
                    inputs[t * kBatch + n] = corpus.tokens[at + t];
                    targets[t * kBatch + n] = corpus.tokens[at + t + 1];
                }
            }
            ComputeGraph graph;
            Var logits;
            model.step(graph.input(Tensor::from_vector(inputs, {kWindow, kBatch}, device)), {}, {}, logits);
            Var loss = cross_entropy(logits, graph.input(Tensor::from_vector(targets, {kWindow * kBatch}, device)));
            optimizer.zero_grad();
            graph.backward(loss);
            clip_grad_norm(model.parameters(), 1.0);
            optimizer.step();
            window_sum += loss.item();
            if (step % kReport == 0) {
                last = window_sum / kReport;
                if (step == kReport) first = last;
                std::printf("step %lld loss %.4f\n", static_cast<long long>(step), last);
                window_sum = 0;
            }
        }

        // Greedy continuation: feed the first characters, then each predicted one, carrying the LSTM state.
        std::string sample;
        {
            const NoGradGuard no_grad;
            ComputeGraph graph;
            std::optional<Var> h, c;
            std::int64_t token = corpus.tokens[0];
            for (int i = 0; i < 80; ++i) {
                Var logits;
                const Tensor input = Tensor::from_vector(std::vector<std::int64_t>{token}, {1, 1}, device);
                RnnResult r = model.step(graph.input(input), h, c, logits);
                h = r.h_n;
                c = r.c_n;
                token = static_cast<std::int64_t>(argmax(logits.value(), 1).to(Device::cpu()).at({0}));
                sample += corpus.vocabulary[static_cast<std::size_t>(token)];
            }
        }
        std::printf("sample: %s\n", sample.c_str());
        if (!(last < 0.8 * first)) {
            std::printf("FAILED: the loss fell from %.4f to %.4f only\n", first, last);
            return 1;
        }
        std::printf("ok: loss %.4f -> %.4f\n", first, last);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "char_lstm: %s\n", e.what());
        return 1;
    }
}
