// A character-level GPT (nn/transformer.h) trained on real text: by default the fortunes that Debian's
// `fortunes` package installs (scripts/setup.sh installs it). bench/torch_gpt.py is its PyTorch twin: the same
// corpus, model, parameter names, schedule, batches and validation windows (run both: scripts/run-gpt-compare.sh).
//
//   char_gpt [--data DIR] [--layers 6 --heads 6 --width 384 --context 256] [--batch 64 --steps 5000]
//            [--lr 1e-3 --warmup 100 --min-lr 1e-4 --weight-decay 0.1 --clip 1 --dropout 0.2]
//            [--eval-every 250 --eval-batches 20] [--seed 0] [--device cpu|cuda] [--csv FILE]
//            [--checkpoint FILE] [--resume FILE] [--init-weights FILE.safetensors] [--batch-order FILE]
//            [--sample N] [--stop-at STEP] [--require-drop FRACTION] [--precision f32|bf16|f16]
//            [--profile-step N] [--checkpoint-activations]
//
// The corpus: the regular files of DIR (symbolic links and the strfile indexes *.dat and *.u8 skipped), in
// byte order of their names, concatenated; the vocabulary is its sorted set of distinct bytes. The first 90%
// is the training split, the last 10% the validation split. A step trains on --batch windows of --context + 1
// bytes of the training split (inputs and next-byte targets) at random offsets, or at the offsets of line
// <step> of --batch-order (one line per step, --batch offsets each). The validation loss is the mean over
// --eval-batches batches of windows spread evenly over the validation split, the same ones every time.
// AdamW (betas 0.9, 0.99; weight decay on the weights and embeddings, not on biases and LayerNorms) with
// linear warm-up and cosine decay to --min-lr over --steps, and gradient clipping at --clip (0: none).
//
// Output: a progress bar (plain lines when stdout is not a terminal), the validation loss every --eval-every
// steps and at the end, --sample N sampled characters at the end, and the CSV curve (step, train_loss,
// val_loss, lr, tokens_per_second; val_loss empty between evaluations). --checkpoint writes model, optimizer
// and schedule at every evaluation and at --stop-at STEP, where the run ends early (to continue it later, in
// pieces shorter than a job's time limit); --resume continues from a checkpoint (the same options and data: with
// dropout 0 the resumed run is the uninterrupted one, step for step; dropout masks restart). --require-drop F: exit 1 unless the mean training loss of the last 5 steps is below (1 − F) times
// that of the first 5 (CTest's quick run: the model must learn).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "../cli/command_line.h"
#include "byte_tokens.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kDefaultData = "/usr/share/games/fortunes";

const char* const kUsage =
    "usage: char_gpt [--data DIR] [--layers N] [--heads N] [--width E] [--context T] [--batch B] [--steps N]\n"
    "                [--lr X] [--warmup N] [--min-lr X] [--weight-decay X] [--clip X] [--dropout P]\n"
    "                [--eval-every N] [--eval-batches N] [--seed N] [--device cpu|cuda|cuda:N] [--csv FILE]\n"
    "                [--checkpoint FILE] [--resume FILE] [--init-weights FILE] [--batch-order FILE]\n"
    "                [--sample N] [--stop-at STEP] [--require-drop FRACTION] [--precision f32|bf16|f16]\n"
    "                [--profile-step N] [--checkpoint-activations]\n"
    "  --data DIR          text files to train on (default /usr/share/games/fortunes; *.dat, *.u8 skipped)\n"
    "  --layers/--heads/--width/--context   the model (default 6, 6, 384, 256)\n"
    "  --batch B --steps N  windows per step (default 64), optimizer steps (default 5000)\n"
    "  --lr --warmup --min-lr   peak lr (1e-3), linear warm-up steps (100), cosine floor (1e-4)\n"
    "  --weight-decay --clip --dropout   AdamW decay (0.1), gradient norm clip (1; 0: none), dropout (0.2)\n"
    "  --eval-every N --eval-batches N   validation loss every N steps (250) over N batches (20)\n"
    "  --csv FILE          step,train_loss,val_loss,lr,tokens_per_second per step\n"
    "  --checkpoint FILE   model + optimizer + schedule at every evaluation; --resume FILE continues one\n"
    "  --init-weights FILE initial parameters from a safetensors file (bench/torch_gpt.py --prepare writes one)\n"
    "  --batch-order FILE  the training offsets: line k holds step k's B window offsets\n"
    "  --sample N          characters sampled at the end (default 200)\n"
    "  --stop-at STEP      end after STEP steps (with --checkpoint: resume later with --resume)\n"
    "  --require-drop F    exit 1 unless the last 5 steps' mean loss is below (1 - F) x the first 5's\n"
    "  --profile-step N    (cuda) step N alone between cudaProfilerStart/Stop, for ncu --profile-from-start off\n"
    "  --precision NAME    f32 | bf16 | f16: the forward under autocast into that dtype (f16 with loss scaling;\n"
    "                      f32 master weights and optimizer state either way; default f32)\n"
    "  --checkpoint-activations  every block checkpointed (graph/checkpoint.h): its activations are replayed in\n"
    "                      the backward instead of kept (the same gradients; --checkpoint names the training file)\n";

struct Options {
    std::string data = kDefaultData;
    GPTConfig model{.vocab_size = 0, .context = 256, .layers = 6, .heads = 6, .width = 384, .dropout = 0.2};
    std::int64_t batch = 64, steps = 5000, warmup = 100, eval_every = 250, eval_batches = 20, sample = 200;
    double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, clip = 1.0;
    std::uint64_t seed = 0;
    Device device = Device::cpu();
    std::string csv, checkpoint, resume, init_weights, batch_order;
    std::optional<double> require_drop;
    std::optional<std::int64_t> stop_at, profile_step;
    DType precision = DType::f32;
};

// Every argument is checked before the corpus is read (cli/command_line.h).
Options parse_options(int argc, char** argv) {
    const cli::Arguments args(
        argc, argv,
        {.flags = {"--checkpoint-activations"},
         .options = {"--data", "--layers", "--heads", "--width", "--context", "--batch", "--steps", "--lr", "--warmup",
                     "--min-lr", "--weight-decay", "--clip", "--dropout", "--eval-every", "--eval-batches", "--seed",
                     "--device", "--csv", "--checkpoint", "--resume", "--init-weights", "--batch-order", "--sample",
                     "--stop-at", "--require-drop", "--precision", "--profile-step"}});
    if (args.help()) {
        std::fputs(kUsage, stdout);
        std::exit(0);
    }
    constexpr double kMax = std::numeric_limits<double>::max();
    Options o;
    const auto given = [&](const char* name) { return args.value(name); };
    if (auto v = given("--layers")) o.model.layers = cli::parse_int("--layers", *v, 1, 1024);
    if (auto v = given("--heads")) o.model.heads = cli::parse_int("--heads", *v, 1, 1024);
    if (auto v = given("--width")) o.model.width = cli::parse_int("--width", *v, 1, 1 << 16);
    if (auto v = given("--context")) o.model.context = cli::parse_int("--context", *v, 1, 1 << 20);
    if (o.model.width % o.model.heads != 0)
        throw cli::UsageError(str("--width ", o.model.width, " is not divisible by --heads ", o.model.heads));
    if (auto v = given("--batch")) o.batch = cli::parse_int("--batch", *v, 1, 1 << 20);
    if (auto v = given("--steps")) o.steps = cli::parse_int("--steps", *v, 1, 100'000'000);
    if (auto v = given("--lr")) o.lr = cli::parse_real("--lr", *v, 0, kMax, /*min_exclusive=*/true);
    if (auto v = given("--warmup")) o.warmup = cli::parse_int("--warmup", *v, 0, 100'000'000);
    if (o.warmup >= o.steps)
        throw cli::UsageError(str("--warmup ", o.warmup, " must be below --steps ", o.steps));
    if (auto v = given("--min-lr")) o.min_lr = cli::parse_real("--min-lr", *v, 0, kMax);
    if (auto v = given("--weight-decay")) o.weight_decay = cli::parse_real("--weight-decay", *v, 0, kMax);
    if (auto v = given("--clip")) o.clip = cli::parse_real("--clip", *v, 0, kMax);
    if (auto v = given("--dropout")) o.model.dropout = cli::parse_real("--dropout", *v, 0, 0.99);
    if (auto v = given("--eval-every")) o.eval_every = cli::parse_int("--eval-every", *v, 1);
    if (auto v = given("--eval-batches")) o.eval_batches = cli::parse_int("--eval-batches", *v, 1, 1'000'000);
    if (auto v = given("--seed")) o.seed = static_cast<std::uint64_t>(cli::parse_int("--seed", *v, 0));
    if (auto v = given("--device")) o.device = cli::parse_device("--device", *v);
    if (auto v = given("--csv")) o.csv = cli::output_file("--csv", *v);
    if (auto v = given("--checkpoint")) o.checkpoint = cli::output_file("--checkpoint", *v);
    if (auto v = given("--resume")) o.resume = cli::existing_file("--resume", *v);
    if (auto v = given("--init-weights")) o.init_weights = cli::existing_file("--init-weights", *v);
    if (auto v = given("--batch-order")) o.batch_order = cli::existing_file("--batch-order", *v);
    if (auto v = given("--sample")) o.sample = cli::parse_int("--sample", *v, 0, 1'000'000);
    if (auto v = given("--stop-at")) o.stop_at = cli::parse_int("--stop-at", *v, 1, o.steps);
    if (auto v = given("--require-drop")) o.require_drop = cli::parse_real("--require-drop", *v, 0, 1);
    if (auto v = given("--precision")) {
        const std::string precision = cli::parse_choice("--precision", *v, {"f32", "bf16", "f16"});
        o.precision = precision == "bf16" ? DType::bf16 : precision == "f16" ? DType::f16 : DType::f32;
    }
    if (auto v = given("--profile-step")) o.profile_step = cli::parse_int("--profile-step", *v, 1, o.steps);
    o.model.seed = o.seed;
    o.model.checkpoint = args.has("--checkpoint-activations");
    o.data = cli::existing_directory("--data", given("--data").value_or(o.data));
    return o;
}

// ---- the corpus ----

struct Corpus {
    std::vector<char> vocabulary;  // sorted distinct bytes
    std::vector<std::int64_t> train, validation;
    std::int64_t files = 0;

    explicit Corpus(const std::string& directory) {
        namespace fs = std::filesystem;
        std::vector<fs::path> paths;
        for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
            const std::string name = entry.path().filename().string();
            if (entry.is_symlink() || !entry.is_regular_file() || name.ends_with(".dat") || name.ends_with(".u8"))
                continue;
            paths.push_back(entry.path());
        }
        std::sort(paths.begin(), paths.end(),
                  [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
        std::string text;
        for (const fs::path& path : paths) {
            std::ifstream in(path, std::ios::binary);
            if (!in) throw IoError(str("char_gpt: cannot read '", path.string(), "'"));
            text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        }
        files = static_cast<std::int64_t>(paths.size());
        ByteTokens bytes(text);
        vocabulary = std::move(bytes.vocabulary);
        // The PyTorch twin splits at int(0.9 · n) too.
        const auto split = bytes.tokens.begin() + static_cast<std::ptrdiff_t>(bytes.tokens.size() * 9 / 10);
        train.assign(bytes.tokens.begin(), split);
        validation.assign(split, bytes.tokens.end());
    }
};

// Offsets of windows of context + 1 tokens: step k's batch (B offsets into the training split).
class BatchOrder {
public:
    BatchOrder(const Options& o, std::int64_t train_length) : o_(o), last_(train_length - o.model.context - 1) {
        if (o.batch_order.empty()) return;
        std::ifstream in(o.batch_order);
        std::string line;
        for (std::int64_t number = 1; std::getline(in, line); ++number) {
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            std::istringstream fields(line);
            std::vector<std::int64_t> offsets;
            std::string field;
            while (fields >> field) {
                std::int64_t value = 0;
                const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
                if (error != std::errc() || end != field.data() + field.size())
                    throw ValueError(str("--batch-order '", o.batch_order, "' line ", number, ": '", field,
                                         "' is not an integer"));
                if (value < 0 || value > last_)
                    throw IndexError(str("--batch-order '", o.batch_order, "' line ", number, ": offset ", value,
                                         " is outside [0, ", last_, "] (training split of ", train_length,
                                         " tokens, windows of ", o.model.context + 1, ")"));
                offsets.push_back(value);
            }
            if (static_cast<std::int64_t>(offsets.size()) != o.batch)
                throw ValueError(str("--batch-order '", o.batch_order, "' line ", number, " holds ", offsets.size(),
                                     " offsets, --batch is ", o.batch));
            lines_.push_back(std::move(offsets));
        }
        if (static_cast<std::int64_t>(lines_.size()) < o.steps)
            throw ValueError(str("--batch-order '", o.batch_order, "' holds ", lines_.size(), " batches, --steps is ",
                                 o.steps));
    }

    std::vector<std::int64_t> offsets(std::int64_t step) const {
        if (!lines_.empty()) return lines_[static_cast<std::size_t>(step)];
        // A generator per step, so a resumed run draws the batches the uninterrupted one would.
        const auto s = static_cast<std::uint64_t>(step);
        std::seed_seq seeds{o_.seed & 0xffffffffu, o_.seed >> 32, s & 0xffffffffu, s >> 32};
        std::mt19937_64 engine(seeds);
        std::uniform_int_distribution<std::int64_t> start(0, last_);
        std::vector<std::int64_t> out(static_cast<std::size_t>(o_.batch));
        for (std::int64_t& offset : out) offset = start(engine);
        return out;
    }

private:
    const Options& o_;
    std::int64_t last_;
    std::vector<std::vector<std::int64_t>> lines_;
};

struct Batch {
    Tensor inputs, targets;  // (B,T), (B·T)
};

Batch make_batch(const std::vector<std::int64_t>& tokens, const std::vector<std::int64_t>& offsets,
                 std::int64_t context, Device device) {
    const auto B = static_cast<std::int64_t>(offsets.size());
    std::vector<std::int64_t> inputs(static_cast<std::size_t>(B * context)), targets(inputs.size());
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < context; ++t) {
            const auto at = static_cast<std::size_t>(offsets[static_cast<std::size_t>(b)] + t);
            inputs[static_cast<std::size_t>(b * context + t)] = tokens[at];
            targets[static_cast<std::size_t>(b * context + t)] = tokens[at + 1];
        }
    return {Tensor::from_vector(inputs, {B, context}, device), Tensor::from_vector(targets, {B * context}, device)};
}

// Mean cross-entropy of the model's next-token predictions: logits (B,T,V) against targets (B·T).
// Under autocast into `precision` (f32: off): the GEMMs and attention in the reduced dtype, the loss in f32.
Var next_token_loss(const GPT& model, ComputeGraph& graph, const Batch& batch, DType precision) {
    const AutocastGuard autocast(precision);
    const Var logits = model(graph.input(batch.inputs));
    const Shape& s = logits.shape();
    return cross_entropy(reshape(logits, {s[0] * s[1], s[2]}), graph.input(batch.targets));
}

// The validation loss over `batches` batches of windows spread evenly over the split (window k of n starts at
// k·(length − T − 1) / (n − 1)): the same windows every evaluation, and in bench/torch_gpt.py.
double validation_loss(GPT& model, const std::vector<std::int64_t>& tokens, const Options& o) {
    const std::int64_t T = o.model.context, windows = o.eval_batches * o.batch;
    const auto last = static_cast<std::int64_t>(tokens.size()) - T - 1;
    model.eval();
    const NoGradGuard no_grad;
    double total = 0;
    for (std::int64_t b = 0; b < o.eval_batches; ++b) {
        std::vector<std::int64_t> offsets;
        for (std::int64_t k = b * o.batch; k < (b + 1) * o.batch; ++k)
            offsets.push_back(windows == 1 ? 0 : k * last / (windows - 1));
        ComputeGraph graph;
        total += next_token_loss(model, graph, make_batch(tokens, offsets, T, o.device), o.precision).item();
    }
    model.train();
    return total / static_cast<double>(o.eval_batches);
}

// `count` bytes sampled from the model (temperature 1), starting after a newline.
std::string sample_text(GPT& model, const Corpus& corpus, const Options& o) {
    const auto newline = std::find(corpus.vocabulary.begin(), corpus.vocabulary.end(), '\n');
    std::vector<std::int64_t> context{newline == corpus.vocabulary.end() ? 0 : newline - corpus.vocabulary.begin()};
    std::mt19937_64 engine(o.seed);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::string text;
    model.eval();
    const NoGradGuard no_grad;
    for (std::int64_t i = 0; i < o.sample; ++i) {
        const auto T = std::min<std::int64_t>(static_cast<std::int64_t>(context.size()), o.model.context);
        const std::vector<std::int64_t> window(context.end() - T, context.end());
        ComputeGraph graph;
        const Var logits = model(graph.input(Tensor::from_vector(window, {1, T}, o.device)));
        const Tensor last = softmax(logits.value().select(1, T - 1).select(0, 0)).to(Device::cpu()).to(DType::f64);
        double u = uniform(engine), cumulative = 0;
        std::int64_t token = last.numel() - 1;
        for (std::int64_t v = 0; v < last.numel(); ++v) {
            cumulative += last.data<double>()[v];
            if (u < cumulative) {
                token = v;
                break;
            }
        }
        context.push_back(token);
        text += corpus.vocabulary[static_cast<std::size_t>(token)];
    }
    model.train();
    return text;
}

std::string clock_time(double seconds) {
    const auto s = static_cast<long long>(std::max(0.0, std::round(seconds)));
    char text[32];
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
    return text;
}

// A redrawn bar on a terminal; otherwise about twenty plain lines over the run.
class Progress {
public:
    Progress(std::int64_t first, std::int64_t steps)
        : first_(first), steps_(steps), terminal_(isatty(fileno(stdout)) != 0),
          line_every_(std::max<std::int64_t>(1, steps / 20)), start_(Clock::now()) {}

    void update(std::int64_t done, double loss, double lr, double tokens_per_second) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
        const double eta = elapsed / static_cast<double>(done - first_) * static_cast<double>(steps_ - done);
        char status[160];
        std::snprintf(status, sizeof status, "step %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s",
                      static_cast<long long>(done), static_cast<long long>(steps_), loss, lr, tokens_per_second,
                      clock_time(eta).c_str());
        if (terminal_) {
            if (done != steps_ && elapsed - drawn_at_ < 0.1) return;
            drawn_at_ = elapsed;
            constexpr int kWidth = 24;
            const int filled = static_cast<int>(kWidth * done / steps_);
            std::printf("\r\x1b[K[%s%s] %s", std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                        status);
        } else if (done % line_every_ == 0 || done == steps_) {
            std::printf("%s\n", status);
        }
        std::fflush(stdout);
    }
    // A line of its own (an evaluation) below the bar.
    void message(const std::string& line) {
        std::printf(terminal_ ? "\r\x1b[K%s\n" : "%s\n", line.c_str());
        std::fflush(stdout);
    }

private:
    std::int64_t first_, steps_;
    bool terminal_;
    std::int64_t line_every_;
    Clock::time_point start_;
    double drawn_at_ = -1;
};

int run(const Options& o) {
    const Corpus corpus(o.data);
    const std::int64_t T = o.model.context;
    for (const auto* split : {&corpus.train, &corpus.validation})
        if (static_cast<std::int64_t>(split->size()) < T + 2)
            throw ValueError(str("char_gpt: '", o.data, "' holds ", corpus.train.size() + corpus.validation.size(),
                                 " bytes in ", corpus.files, " files; each split needs at least --context + 2 = ",
                                 T + 2, " (the validation split is the last 10%)"));
    GPTConfig config = o.model;
    config.vocab_size = static_cast<std::int64_t>(corpus.vocabulary.size());
    Generator gen(o.seed);
    GPT model(config, gen);
    if (!o.init_weights.empty()) load_parameters(model, o.init_weights);
    model.to(o.device);

    // Weight decay on matrices (weights, embeddings) only, as nanoGPT and bench/torch_gpt.py.
    std::vector<Parameter> decayed, not_decayed;
    std::int64_t parameter_count = 0;
    for (const Parameter& p : model.parameters()) {
        (p.value().rank() >= 2 ? decayed : not_decayed).push_back(p);
        parameter_count += p.value().numel();
    }
    AdamW optimizer({{.parameters = decayed, .weight_decay = o.weight_decay}, {.parameters = not_decayed, .weight_decay = 0.0}},
                    {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8});
    WarmupCosineLR schedule(optimizer, o.warmup, o.steps, o.min_lr);
    // f16 only: a dynamic loss scale (its state is not in the checkpoint: a resumed run starts from the initial scale).
    GradScaler scaler(GradScalerOptions{.enabled = o.precision == DType::f16});
    if (!o.resume.empty()) load_checkpoint(o.resume, model, optimizer, &schedule);
    const std::int64_t first = schedule.epoch();
    const std::int64_t last = o.stop_at.value_or(o.steps);
    if (first >= last)
        throw ValueError(str("--resume '", o.resume, "' is at step ", first, ", the run ends at step ", last,
                             ": nothing to do"));
    const BatchOrder order(o, static_cast<std::int64_t>(corpus.train.size()));

    std::printf("char_gpt: %lld bytes from %lld files in %s, %lld distinct; train %lld, validation %lld\n",
                static_cast<long long>(corpus.train.size() + corpus.validation.size()),
                static_cast<long long>(corpus.files), o.data.c_str(), static_cast<long long>(config.vocab_size),
                static_cast<long long>(corpus.train.size()), static_cast<long long>(corpus.validation.size()));
    std::printf("model: %lld layers, %lld heads, width %lld, context %lld, %.2fM parameters on %s (%s); batch %lld, steps %lld%s%s\n",
                static_cast<long long>(config.layers), static_cast<long long>(config.heads),
                static_cast<long long>(config.width), static_cast<long long>(T), static_cast<double>(parameter_count) / 1e6,
                o.device.to_string().c_str(),
                o.precision == DType::f32 ? "f32" : o.precision == DType::bf16 ? "bf16 autocast" : "f16 autocast + loss scaling",
                static_cast<long long>(o.batch), static_cast<long long>(o.steps),
                config.checkpoint ? ", activation checkpointing" : "",
                first > 0 ? str(", resumed at step ", first).c_str() : "");
    std::fflush(stdout);

    std::ofstream csv;
    if (!o.csv.empty()) {
        csv.open(o.csv, first > 0 ? std::ios::app : std::ios::trunc);
        if (!csv) throw IoError(str("--csv: cannot write '", o.csv, "'"));
        if (first == 0) csv << "step,train_loss,val_loss,lr,tokens_per_second,loss_scale,skipped_steps\n";
    }
    std::vector<double> losses;
    std::int64_t skipped_steps = 0;  // f16: steps the scaler skipped (an inf/NaN gradient)
    Progress progress(first, last);
    model.train();
    for (std::int64_t step = first; step < last; ++step) {
        const bool profiled = o.profile_step && *o.profile_step == step + 1 && o.device.is_cuda();
        if (profiled) {
            cuda::synchronize(o.device.index);
            cuda::profiler_start();
        }
        const auto started = Clock::now();
        const double lr = optimizer.lr();
        const Batch batch = make_batch(corpus.train, order.offsets(step), T, o.device);
        ComputeGraph graph;
        const Var loss = next_token_loss(model, graph, batch, o.precision);
        optimizer.zero_grad();
        graph.backward(scaler.scale(loss));  // the loss itself unless f16
        scaler.unscale(optimizer);           // clipping sees true gradients; no-op unless f16
        if (o.clip > 0) clip_grad_norm(model.parameters(), o.clip);
        scaler.step(optimizer);  // skipped whole when an f16 gradient overflowed; no host sync
        scaler.update();
        schedule.step();
        const double value = loss.item();  // waits for the step: the time below is the step's
        if (profiled) cuda::profiler_stop();
        if (scaler.enabled() && scaler.last_step_skipped()) ++skipped_steps;
        const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
        if (!std::isfinite(value))
            throw NumericalError(str("char_gpt: the training loss is ", value, " at step ", step + 1));
        losses.push_back(value);
        const double tokens_per_second = static_cast<double>(o.batch * T) / seconds;
        const std::int64_t done = step + 1;
        progress.update(done, value, lr, tokens_per_second);
        std::string val_cell;
        if (done % o.eval_every == 0 || done == o.steps || done == last) {
            const double val = validation_loss(model, corpus.validation, o);
            char cell[32];
            std::snprintf(cell, sizeof cell, "%.6f", val);
            val_cell = cell;
            progress.message(str("step ", done, ": validation loss ", val_cell));
            if (!o.checkpoint.empty()) save_checkpoint(o.checkpoint, model, optimizer, &schedule);
        }
        if (csv.is_open()) {
            char row[200];
            std::snprintf(row, sizeof row, "%lld,%.6f,%s,%.8g,%.1f,%.8g,%lld\n", static_cast<long long>(done), value,
                          val_cell.c_str(), lr, tokens_per_second, scaler.enabled() ? scaler.scale_value() : 1.0,
                          static_cast<long long>(skipped_steps));
            csv << row << std::flush;
        }
    }

    if (o.sample > 0) std::printf("--- sample ---\n%s\n--- end of sample ---\n", sample_text(model, corpus, o).c_str());
    const auto window = std::min<std::size_t>(5, losses.size());
    const double head = std::accumulate(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(window), 0.0) /
                        static_cast<double>(window);
    const double tail = std::accumulate(losses.end() - static_cast<std::ptrdiff_t>(window), losses.end(), 0.0) /
                        static_cast<double>(window);
    std::printf("train loss: first %zu steps %.4f, last %zu steps %.4f\n", window, head, window, tail);
    if (o.require_drop && !(tail < (1 - *o.require_drop) * head)) {
        std::printf("FAILED: the training loss fell from %.4f to %.4f, less than %.0f%%\n", head, tail,
                    100 * *o.require_drop);
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    try {
        options = parse_options(argc, argv);
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "char_gpt: %s\n%s", e.what(), kUsage);
        return 2;
    }
    try {
        return run(options);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "\nchar_gpt: %s\n", e.what());
        return 1;
    }
}
