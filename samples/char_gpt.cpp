// A GPT (nn/transformer.h) trained on real text: by default a character-level model on the fortunes that Debian's
// `fortunes` package installs (scripts/setup.sh installs it). bench/torch_gpt.py is its PyTorch twin: the same
// corpus, model, parameter names, schedule, batches and validation windows (run both: scripts/run-gpt-compare.sh).
// --model gpt2 trains GPT-2 small as llm.c does (nn/transformer.h's gpt2_small(); shrink it with --layers,
// --heads, --width, --context) on token files in llm.c's format (--train-tokens, --val-tokens; dyngrad-tokens
// writes them from any text); bench/torch_gpt2.py is that model's PyTorch twin (scripts/run-gpt2-bench.sh).
//
//   char_gpt [--model char|gpt2] [--data DIR | --train-tokens FILE --val-tokens FILE [--vocab V]]
//            [--layers 6 --heads 6 --width 384 --context 256] [--seq-len T] [--batch 64 --steps 5000]
//            [--lr 1e-3 --warmup 100 --min-lr 1e-4 --weight-decay 0.1 --clip 1 --dropout 0.2]
//            [--eval-every 250 --eval-batches 20] [--seed 0] [--device cpu|cuda] [--csv FILE]
//            [--checkpoint FILE] [--resume FILE] [--init-weights FILE.safetensors] [--batch-order FILE]
//            [--sample N] [--stop-at STEP] [--require-drop FRACTION] [--precision f32|bf16|f16]
//            [--profile-step N] [--distributed [--zero 1|2|3 [--zero-recompute | --no-zero-prefetch]] [--ddp-compression bf16|f16]]
//            [--checkpoint-activations] [--deterministic]
//            [--reduced-residual] [--capture]
//
// Token files: windows of --seq-len (default --context) + 1 tokens of --train-tokens; the validation windows
// are spread over --val-tokens by the rule below; every token id must be below --vocab (default 50257 for gpt2,
// 256 otherwise: dyngrad-tokens' byte vocabulary). --model gpt2 also changes the defaults to dropout 0, lr 6e-4,
// min-lr 6e-5 and AdamW's beta2 0.95 (llm.c's); the character model keeps beta2 0.99.
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
// On CUDA it ends with peak_memory_bytes= (the run's peak allocation) and step_memory_bytes= (the largest step's
// peak over what was in use when the step began: its activations, gradients and temporaries).
//
// --distributed (under mpirun, or torchrun's variables for GPUs): every rank takes its --batch / world windows
// of each step's --batch (so the step is the single-process step on the whole batch), gradients averaged by
// DistributedDataParallel (distributed/ddp.h), or with --zero 1|2|3 by a ZeroOptimizer (distributed/zero.h: AdamW's state,
// then the gradients, then the parameters sharded; stage 3 makes the embeddings, each block and the head a unit).
// ZeroOptimizer has one parameter group, so with --zero the weight decay applies to every parameter. Rank 0
// prints and writes the CSV. Not with --checkpoint/--resume (a ZeroOptimizer's checkpoint is a folder of shards).
//
// --deterministic: cuda::set_deterministic (cuda/runtime.h), so that two runs with the same options give the same
// losses bit for bit on one GPU: the embedding's backward sums in index order instead of with float atomics, and
// attention's backward neither adds dq with float atomics (the f32 kernel) nor takes a cuDNN engine marked
// nondeterministic (bf16/f16). Those are the step's only scheduling-dependent sums: every other kernel reduces in a
// fixed order (its atomics count finished blocks), and cuBLAS gives each stream its own workspace. The CPU is
// deterministic either way: there the flag changes nothing. --distributed's all-reduce is NCCL's or MPI's, not covered.
// It also ends the output with parameters_fnv1a= (a hash of the final parameters' bytes) to compare runs by.
//
// --capture (cuda, one process): the training step (forward, loss, backward, unscale, clip, AdamW, schedule) is a
// cuda::CapturedStep (cuda/capture.h): the first step runs eagerly, the second is captured into a CUDA graph, later
// steps replay it, one launch each, so the GPU does not wait between kernels for the host to queue them. The
// same step: the gradients are zeroed at its end rather than its start (the capture's rule), which is the same state.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "../cli/command_line.h"
#include "byte_tokens.h"
#include "text_files.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_replay.h"
#if DYNGRAD_WITH_DIST
#include <memory>

#include "dyngrad/distributed/ddp.h"
#include "dyngrad/distributed/zero.h"
#endif

using namespace dyngrad;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kDefaultData = "/usr/share/games/fortunes";

const char* const kUsage =
    "usage: char_gpt [--model char|gpt2] [--data DIR | --train-tokens FILE --val-tokens FILE [--vocab V]]\n"
    "                [--layers N] [--heads N] [--width E] [--context T] [--seq-len T] [--batch B] [--steps N]\n"
    "                [--lr X] [--warmup N] [--min-lr X] [--weight-decay X] [--clip X] [--dropout P]\n"
    "                [--eval-every N] [--eval-batches N] [--seed N] [--device cpu|cuda|cuda:N] [--csv FILE]\n"
    "                [--checkpoint FILE] [--resume FILE] [--init-weights FILE] [--batch-order FILE]\n"
    "                [--sample N] [--stop-at STEP] [--require-drop FRACTION] [--precision f32|bf16|f16]\n"
    "                [--profile-step N] [--distributed [--zero 1|2|3 [--zero-recompute | --no-zero-prefetch]] [--ddp-compression bf16|f16]]\n"
    "                [--checkpoint-activations] [--deterministic] [--reduced-residual] [--capture]\n"
    "                [--memory-limit-mib N]\n"
    "  --model NAME        char (default) | gpt2: GPT-2 small as llm.c (12, 12, 768, 1024; tied, padded vocabulary)\n"
    "  --data DIR          text files to train on (default /usr/share/games/fortunes; *.dat, *.u8 skipped)\n"
    "  --train-tokens FILE --val-tokens FILE   token files in llm.c's format instead (dyngrad-tokens)\n"
    "  --vocab V           the token files' vocabulary (default 50257 with gpt2, else 256)\n"
    "  --layers/--heads/--width/--context   the model (default 6, 6, 384, 256; gpt2: 12, 12, 768, 1024)\n"
    "  --seq-len T         the windows' length, at most --context (default --context)\n"
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
    "  --distributed       data parallel over the ranks of mpirun (each takes --batch / world windows a step)\n"
    "  --zero N            with --distributed: ZeRO stage 1, 2 or 3 (3: parameters sharded per block, each block's\n"
    "                      activations kept) in place of DDP; one weight decay for all parameters\n"
    "  --zero-recompute    with --zero 3: each block's forward runs again in its backward instead of keeping its\n"
    "                      activations (less memory, one more forward a step; needs --dropout 0)\n"
    "  --no-zero-prefetch  with --zero 3 (kept): no all-gather of the neighbouring block beside a block's compute\n"
    "                      (ZeroOptions::prefetch = false; on by default, as FSDP's prefetch)\n"
    "  --ddp-compression D with --distributed (DDP): the gradients averaged in bf16 or f16 (half the bytes;\n"
    "                      DDPOptions::compression, as PyTorch's bf16/fp16 compress hooks)\n"
    "  --checkpoint-activations  every block checkpointed (graph/checkpoint.h): its activations are replayed in\n"
    "                      the backward instead of kept (the same gradients; --checkpoint names the training file)\n"
    "  --deterministic     (cuda) bitwise-reproducible runs: the embedding and attention backwards without float\n"
    "                      atomics or nondeterministic cuDNN engines (slower); on the CPU (deterministic anyway) a no-op;\n"
    "                      ends with parameters_fnv1a=HASH of the final parameters' bytes\n"
    "  --reduced-residual  with --precision bf16|f16: the residual stream and the LayerNorms in that dtype (statistics\n"
    "                      in f32), as llm.c: no activation casts (nn/transformer.h, TransformerOptions)\n"
    "  --capture           (cuda, one process) the training step captured into a CUDA graph once, then replayed\n"
    "  --memory-limit-mib N  (cuda) this process holds at most N MiB on its GPU (cuda::set_memory_limit): more is an\n"
    "                      OutOfMemory error, as on a GPU that small (scripts/run-zero3-memory-demo.sh)\n";

struct Options {
    std::string data = kDefaultData;
    std::string train_tokens, val_tokens;  // token files instead of the corpus
    GPTConfig model{.vocab_size = 0, .context = 256, .layers = 6, .heads = 6, .width = 384, .dropout = 0.2};
    std::int64_t seq_len = 0;  // the windows' T (0: model.context)
    double beta2 = 0.99;
    std::int64_t batch = 64, steps = 5000, warmup = 100, eval_every = 250, eval_batches = 20, sample = 200;
    double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, clip = 1.0;
    std::uint64_t seed = 0;
    Device device = Device::cpu();
    std::string csv, checkpoint, resume, init_weights, batch_order;
    std::optional<double> require_drop;
    std::optional<std::int64_t> stop_at, profile_step;
    DType precision = DType::f32;
    bool distributed = false;
    bool deterministic = false;  // cuda::set_deterministic for the run
    bool capture = false;        // the training step as a cuda::CapturedStep
    int zero = 0;  // ZeRO stage; 0: DistributedDataParallel
    bool zero_recompute = false;  // --zero 3: ZeroOptions::recompute
    bool zero_no_prefetch = false;  // --zero 3: ZeroOptions::prefetch = false
    std::optional<DType> ddp_compression;  // --ddp-compression: DDPOptions::compression
    std::int64_t memory_limit_mib = 0;  // cuda::set_memory_limit on the run's GPU (0: none)
};

// Every argument is checked before the corpus is read (cli/command_line.h).
Options parse_options(int argc, char** argv) {
    const cli::Arguments args(
        argc, argv,
        {.flags = {"--distributed", "--checkpoint-activations", "--deterministic", "--reduced-residual", "--capture",
                   "--zero-recompute", "--no-zero-prefetch"},
         .options = {"--model", "--train-tokens", "--val-tokens", "--vocab", "--seq-len", "--data", "--layers",
                     "--heads", "--width", "--context", "--batch", "--steps", "--lr", "--warmup",
                     "--min-lr", "--weight-decay", "--clip", "--dropout", "--eval-every", "--eval-batches", "--seed",
                     "--device", "--csv", "--checkpoint", "--resume", "--init-weights", "--batch-order", "--sample",
                     "--stop-at", "--require-drop", "--precision", "--profile-step", "--zero", "--memory-limit-mib",
                     "--ddp-compression"}});
    if (args.help()) {
        std::fputs(kUsage, stdout);
        std::exit(0);
    }
    constexpr double kMax = std::numeric_limits<double>::max();
    Options o;
    const auto given = [&](const char* name) { return args.value(name); };
    const bool gpt2 = cli::parse_choice("--model", given("--model").value_or("char"), {"char", "gpt2"}) == "gpt2";
    if (gpt2) {
        o.model = gpt2_small();
        o.lr = 6e-4;
        o.min_lr = 6e-5;
        o.beta2 = 0.95;
    }
    if (auto v = given("--train-tokens")) o.train_tokens = cli::existing_file("--train-tokens", *v);
    if (auto v = given("--val-tokens")) o.val_tokens = cli::existing_file("--val-tokens", *v);
    if (o.train_tokens.empty() != o.val_tokens.empty())
        throw cli::UsageError("--train-tokens and --val-tokens go together");
    const bool tokens = !o.train_tokens.empty();
    if (tokens && given("--data")) throw cli::UsageError("--data and --train-tokens exclude each other");
    if (!tokens && given("--vocab")) throw cli::UsageError("--vocab is for token files (the corpus makes its own)");
    if (tokens && given("--sample") && *given("--sample") != "0")  // --sample 0 (none) is what token files get anyway
        throw cli::UsageError("--sample needs the text corpus (--data): token files carry no vocabulary");
    if (tokens) {
        o.sample = 0;
        o.model.vocab_size = gpt2 ? o.model.vocab_size : 256;
        if (auto v = given("--vocab")) o.model.vocab_size = cli::parse_int("--vocab", *v, 1, kTokenFileMaxVocabulary);
    }
    if (auto v = given("--layers")) o.model.layers = cli::parse_int("--layers", *v, 1, 1024);
    if (auto v = given("--heads")) o.model.heads = cli::parse_int("--heads", *v, 1, 1024);
    if (auto v = given("--width")) o.model.width = cli::parse_int("--width", *v, 1, 1 << 16);
    if (auto v = given("--context")) o.model.context = cli::parse_int("--context", *v, 1, 1 << 20);
    if (o.model.width % o.model.heads != 0)
        throw cli::UsageError(str("--width ", o.model.width, " is not divisible by --heads ", o.model.heads));
    o.seq_len = o.model.context;
    if (auto v = given("--seq-len")) o.seq_len = cli::parse_int("--seq-len", *v, 1, 1 << 20);
    if (o.seq_len > o.model.context)
        throw cli::UsageError(str("--seq-len ", o.seq_len, " exceeds --context ", o.model.context,
                                  " (the position table)"));
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
    o.distributed = args.has("--distributed");
    o.deterministic = args.has("--deterministic");
#if !DYNGRAD_WITH_DIST
    if (o.distributed) throw cli::UsageError("--distributed: this build has no dist layer (MPI was not found)");
#endif
    if (args.has("--zero-recompute") && given("--zero").value_or("") != "3")
        throw cli::UsageError("--zero-recompute: for --zero 3");
    if (args.has("--no-zero-prefetch") && (given("--zero").value_or("") != "3" || args.has("--zero-recompute")))
        throw cli::UsageError("--no-zero-prefetch: for --zero 3 without --zero-recompute (the kept forward prefetches)");
    if (auto v = given("--ddp-compression")) {
        o.ddp_compression = cli::parse_choice("--ddp-compression", *v, {"bf16", "f16"}) == "bf16" ? DType::bf16 : DType::f16;
        if (!o.distributed || given("--zero"))
            throw cli::UsageError("--ddp-compression: compresses DDP's all-reduce, which needs --distributed without --zero");
    }
    if (auto v = given("--zero")) {
        o.zero = static_cast<int>(cli::parse_int("--zero", *v, 1, 3));
        if (!o.distributed) throw cli::UsageError("--zero: shards across the ranks of --distributed, which is not given");
        if (!o.checkpoint.empty() || !o.resume.empty())
            throw cli::UsageError("--zero: not with --checkpoint or --resume (a ZeroOptimizer checkpoint is a folder "
                                  "of shards, distributed/zero.h)");
        o.zero_recompute = args.has("--zero-recompute");
        o.zero_no_prefetch = args.has("--no-zero-prefetch");
        if (o.zero_recompute && o.model.dropout != 0)
            throw cli::UsageError(str("--zero-recompute: needs --dropout 0 (each unit's forward runs again in the "
                                      "backward; fresh dropout masks would differentiate another function), got ",
                                      o.model.dropout));
        if (o.zero == 3 && o.model.tie_embeddings)
            throw cli::UsageError("--zero 3: not with --model gpt2 (its LM head is the token embedding, which two "
                                  "ZeRO-3 units would hold); --zero 1 or 2 shard it");
    }
    o.model.seed = o.seed;
    o.model.checkpoint = args.has("--checkpoint-activations");
    o.model.reduced_residual = args.has("--reduced-residual");
    if (o.model.reduced_residual && o.precision == DType::f32)
        throw cli::UsageError("--reduced-residual: keeps the residual stream in --precision's reduced dtype; give "
                              "--precision bf16 or f16");
    o.capture = args.has("--capture");
    if (auto v = given("--memory-limit-mib")) {
        o.memory_limit_mib = cli::parse_int("--memory-limit-mib", *v, 1, std::int64_t{1} << 30);
        if (!o.device.is_cuda()) throw cli::UsageError("--memory-limit-mib: limits a GPU's memory; give --device cuda");
    }
    if (o.capture && !o.device.is_cuda()) throw cli::UsageError("--capture: captures CUDA graphs; give --device cuda");
    if (o.capture && o.distributed)
        throw cli::UsageError("--capture: one process only (not with --distributed)");
    if (!tokens) o.data = cli::existing_directory("--data", given("--data").value_or(o.data));
    return o;
}

// ---- the data ----

// The training and validation windows: from the corpus (its distinct bytes as the vocabulary, the first 90% for
// training) or from two token files.
struct Data {
    std::vector<char> vocabulary;  // the corpus' sorted distinct bytes; empty for token files
    std::int64_t vocab_size;
    std::string description;
    TokenWindows train, validation;
};

std::vector<std::uint16_t> narrow_tokens(std::vector<std::int64_t>::const_iterator from,
                                         std::vector<std::int64_t>::const_iterator to) {
    std::vector<std::uint16_t> out;
    out.reserve(static_cast<std::size_t>(to - from));
    for (; from != to; ++from) out.push_back(static_cast<std::uint16_t>(*from));  // < 256: distinct bytes
    return out;
}

Data load_data(const Options& o) {
    const std::int64_t T = o.seq_len;
    if (!o.train_tokens.empty()) {
        TokenWindows train(o.train_tokens, o.model.vocab_size, o.batch, T);
        TokenWindows validation(o.val_tokens, o.model.vocab_size, o.batch, T);
        const std::string description = str("token files ", o.train_tokens, " (", train.size(), " tokens) and ",
                                            o.val_tokens, " (", validation.size(), " tokens), vocabulary ",
                                            o.model.vocab_size);
        return {{}, o.model.vocab_size, description, std::move(train), std::move(validation)};
    }
    const TextFiles corpus(o.data);
    ByteTokens bytes(corpus.text);
    // The PyTorch twin splits at int(0.9 · n) too.
    const auto split = bytes.tokens.cbegin() + static_cast<std::ptrdiff_t>(bytes.tokens.size() * 9 / 10);
    const auto length = static_cast<std::int64_t>(bytes.tokens.size());
    const auto train_length = split - bytes.tokens.cbegin();
    if (std::min<std::int64_t>(train_length, length - train_length) < T + 2)
        throw ValueError(str("char_gpt: '", o.data, "' holds ", length, " bytes in ", corpus.files,
                             " files; each split needs at least --seq-len + 2 = ", T + 2,
                             " (the validation split is the last 10%)"));
    const auto vocab_size = static_cast<std::int64_t>(bytes.vocabulary.size());
    const std::string description = str(length, " bytes from ", corpus.files, " files in ", o.data, ", ", vocab_size,
                                        " distinct; train ", train_length, ", validation ", length - train_length);
    return {std::move(bytes.vocabulary), vocab_size, description,
            TokenWindows(narrow_tokens(bytes.tokens.cbegin(), split), str("the training split of '", o.data, "'"),
                         o.batch, T),
            TokenWindows(narrow_tokens(split, bytes.tokens.cend()), str("the validation split of '", o.data, "'"),
                         o.batch, T)};
}

// Offsets of windows of context + 1 tokens: step k's batch (B offsets into the training split).
class BatchOrder {
public:
    BatchOrder(const Options& o, const TokenWindows& train)
        : o_(o), train_(train), last_(train.size() - o.seq_len - 1) {
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
                                         " is outside [0, ", last_, "] (", train.name(), ": ", train.size(),
                                         " tokens, windows of ", o.seq_len + 1, ")"));
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
        return train_.random_offsets(o_.seed, step);  // a resumed run draws what the uninterrupted one would
    }

private:
    const Options& o_;
    const TokenWindows& train_;
    std::int64_t last_;
    std::vector<std::vector<std::int64_t>> lines_;
};

struct Batch {
    Tensor inputs, targets;  // (B,T), (B·T)
};

Batch make_batch(const TokenWindows& windows, const std::vector<std::int64_t>& offsets, Device device) {
    TokenBatch batch = windows.at(offsets, device);
    return {batch.inputs, batch.targets.reshaped({batch.targets.numel()})};
}

// `forward`: the model's logits (B,T,V), or ZeRO-3's sharded forward over it.
using Forward = std::function<Var(const Var&)>;
// The mean cross-entropy of the next-token predictions from tokens (B,T) and targets (B·T).
using LossPath = std::function<Var(const Var& tokens, const Var& targets)>;
// The model's own loss path: GPT::loss, the LM head fused with the loss (ops/linear_cross_entropy.h), no logits.
LossPath fused_head_loss(const GPT& model) {
    return [&model](const Var& tokens, const Var& targets) { return model.loss(tokens, targets); };
}
// cross_entropy on the logits of `forward` (ZeRO-3: its sharded forward owns the head's weight).
LossPath logits_loss(Forward forward) {
    return [forward = std::move(forward)](const Var& tokens, const Var& targets) {
        const Var logits = forward(tokens);
        const Shape& s = logits.shape();
        return cross_entropy(reshape(logits, {s[0] * s[1], s[2]}), targets);
    };
}
// Under autocast into `precision` (f32: off): the GEMMs and attention in the reduced dtype, the loss in f32.
Var next_token_loss(const LossPath& loss, ComputeGraph& graph, const Batch& batch, DType precision) {
    const AutocastGuard autocast(precision);
    return loss(graph.input(batch.inputs), graph.input(batch.targets));
}

// The validation loss over `batches` batches of windows spread evenly over the split (window k of n starts at
// k·(length − T − 1) / (n − 1)): the same windows every evaluation, and in bench/torch_gpt.py.
double validation_loss(GPT& model, const LossPath& loss, const TokenWindows& split, const Options& o) {
    const std::int64_t windows = o.eval_batches * o.batch;
    const std::int64_t last = split.size() - o.seq_len - 1;
    model.eval();
    const NoGradGuard no_grad;
    double total = 0;
    for (std::int64_t b = 0; b < o.eval_batches; ++b) {
        std::vector<std::int64_t> offsets;
        for (std::int64_t k = b * o.batch; k < (b + 1) * o.batch; ++k)
            offsets.push_back(windows == 1 ? 0 : k * last / (windows - 1));
        ComputeGraph graph;
        total += next_token_loss(loss, graph, make_batch(split, offsets, o.device), o.precision).item();
    }
    model.train();
    return total / static_cast<double>(o.eval_batches);
}

// `count` bytes sampled from the model (temperature 1), starting after a newline.
std::string sample_text(GPT& model, const Forward& forward, const std::vector<char>& vocabulary, const Options& o) {
    const auto newline = std::find(vocabulary.begin(), vocabulary.end(), '\n');
    std::vector<std::int64_t> context{newline == vocabulary.end() ? 0 : newline - vocabulary.begin()};
    std::mt19937_64 engine(o.seed);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::string text;
    model.eval();
    const NoGradGuard no_grad;
    for (std::int64_t i = 0; i < o.sample; ++i) {
        const auto T = std::min<std::int64_t>(static_cast<std::int64_t>(context.size()), o.model.context);
        const std::vector<std::int64_t> window(context.end() - T, context.end());
        ComputeGraph graph;
        const Var logits = forward(graph.input(Tensor::from_vector(window, {1, T}, o.device)));
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
        text += vocabulary[static_cast<std::size_t>(token)];
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

// The parameters' bytes, in named order, hashed (64-bit FNV-1a): --deterministic prints it at the end, so two runs
// can be checked bit for bit beyond the printed losses.
std::uint64_t parameter_hash(const GPT& model) {
    std::uint64_t hash = 14695981039346656037ull;
    for (const auto& [name, parameter] : model.named_parameters()) {
        const Tensor host = parameter.value().to(Device::cpu());
        const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
        for (std::size_t i = 0; i < host.nbytes(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
    }
    return hash;
}

int run(Options o) {
    if (o.deterministic) cuda::set_deterministic(true);  // before any kernel: the whole run, initialisation included
    const Data data = load_data(o);
    const std::int64_t T = o.seq_len;
    GPTConfig config = o.model;
    config.vocab_size = data.vocab_size;
    if (config.padded_vocab_size > 0) config.padded_vocab_size = padded_vocabulary(config.vocab_size);
    Generator gen(o.seed);
    GPT model(config, gen);
    if (!o.init_weights.empty()) load_parameters(model, o.init_weights);
    int rank = 0, world = 1;
#if DYNGRAD_WITH_DIST
    std::optional<dist::ProcessGroup> group;
    if (o.distributed) {
        group = dist::ProcessGroup::init();
        rank = group->rank();
        world = group->world_size();
        if (o.device.is_cuda()) o.device = group->device();  // this rank's GPU
        if (o.batch % world != 0)
            throw ValueError(str("char_gpt --distributed: --batch ", o.batch, " is not divisible by the ", world,
                                 " ranks (each takes an equal part of every step's windows)"));
        if (rank != 0 && !std::freopen("/dev/null", "w", stdout))  // rank 0 reports
            throw IoError("--distributed: cannot silence stdout");
        std::printf("distributed: %s, %d rank%s, %lld windows per rank and step, %s\n", group->describe().c_str(),
                    world, world == 1 ? "" : "s", static_cast<long long>(o.batch / world),
                    o.zero > 0 ? str("ZeRO-", o.zero).c_str() : "DDP");
    }
#endif
    // --memory-limit-mib: this process may hold no more than that on its GPU (as if it were that small).
    if (o.memory_limit_mib > 0) cuda::set_memory_limit(o.device.index, static_cast<std::size_t>(o.memory_limit_mib) << 20);
    model.to(o.device);

    // Weight decay on matrices (weights, embeddings) only, as nanoGPT and bench/torch_gpt.py.
    std::vector<Parameter> decayed, not_decayed;
    std::int64_t parameter_count = 0;
    for (const Parameter& p : model.parameters()) {
        (p.value().rank() >= 2 ? decayed : not_decayed).push_back(p);
        parameter_count += p.value().numel();
    }
    Forward forward = [&model](const Var& x) { return model(x); };  // logits: sampling
    LossPath loss_path = fused_head_loss(model);                     // training and validation losses
    Optimizer* sharded = nullptr;  // --zero: the AdamW over this rank's shards
#if DYNGRAD_WITH_DIST
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    std::unique_ptr<dist::ZeroOptimizer> zero;
    const AdamOptions zero_adam{.lr = o.lr, .beta1 = 0.9, .beta2 = o.beta2, .eps = 1e-8, .weight_decay = o.weight_decay};
    if (group && o.zero == 3) {
        zero = std::make_unique<dist::ZeroOptimizer>(dist::gpt_units(model), *group, zero_adam,
                                                     dist::ZeroOptions{.stage = 3, .recompute = o.zero_recompute,
                                                                       .prefetch = o.zero_no_prefetch ? std::optional<bool>(false)
                                                                                                      : std::nullopt});
        forward = [z = zero.get()](const Var& x) { return z->forward(x); };
        loss_path = logits_loss(forward);
    } else if (group && o.zero > 0) {
        zero = std::make_unique<dist::ZeroOptimizer>(model, *group, zero_adam, dist::ZeroOptions{.stage = o.zero});
    } else if (group) {
        ddp = std::make_unique<dist::DistributedDataParallel>(model, *group,
                                                              dist::DDPOptions{.compression = o.ddp_compression});
    }
    if (zero) sharded = &zero->optimizer();
#endif
    std::unique_ptr<AdamW> own;
    if (!sharded)
        own = std::make_unique<AdamW>(
            std::vector<ParamGroup>{{.parameters = decayed, .weight_decay = o.weight_decay},
                                    {.parameters = not_decayed, .weight_decay = 0.0}},
            AdamOptions{.lr = o.lr, .beta1 = 0.9, .beta2 = o.beta2, .eps = 1e-8});
    Optimizer& optimizer = sharded ? *sharded : *own;
    WarmupCosineLR schedule(optimizer, o.warmup, o.steps, o.min_lr);
    // f16 only: a dynamic loss scale (its state is not in the checkpoint: a resumed run starts from the initial scale).
    GradScaler scaler(GradScalerOptions{.enabled = o.precision == DType::f16});
    if (!o.resume.empty()) load_checkpoint(o.resume, model, optimizer, &schedule);
    const std::int64_t first = schedule.epoch();
    const std::int64_t last = o.stop_at.value_or(o.steps);
    if (first >= last)
        throw ValueError(str("--resume '", o.resume, "' is at step ", first, ", the run ends at step ", last,
                             ": nothing to do"));
    const BatchOrder order(o, data.train);

    std::printf("char_gpt: %s\n", data.description.c_str());
    std::printf("model: %lld layers, %lld heads, width %lld, context %lld (windows of %lld), %.2fM parameters on %s (%s); batch %lld, steps %lld%s%s%s\n",
                static_cast<long long>(config.layers), static_cast<long long>(config.heads),
                static_cast<long long>(config.width), static_cast<long long>(config.context),
                static_cast<long long>(T), static_cast<double>(parameter_count) / 1e6,
                o.device.to_string().c_str(),
                o.precision == DType::f32 ? "f32" : o.precision == DType::bf16 ? "bf16 autocast" : "f16 autocast + loss scaling",
                static_cast<long long>(o.batch), static_cast<long long>(o.steps),
                (std::string(config.checkpoint ? ", activation checkpointing" : "") +
                 (config.reduced_residual ? ", reduced residual stream" : ""))
                    .c_str(),
                o.deterministic ? ", deterministic" : "",
                first > 0 ? str(", resumed at step ", first).c_str() : "");
    std::fflush(stdout);

    std::ofstream csv;
    if (!o.csv.empty() && rank == 0) {  // one writer: rows of two ranks at their own offsets would interleave
        csv.open(o.csv, first > 0 ? std::ios::app : std::ios::trunc);
        if (!csv) throw IoError(str("--csv: cannot write '", o.csv, "'"));
        if (first == 0) csv << "step,train_loss,val_loss,lr,tokens_per_second,loss_scale,skipped_steps\n";
    }
    std::vector<double> losses;
    std::int64_t skipped_steps = 0;  // f16: steps the scaler skipped (an inf/NaN gradient)
    std::size_t peak_bytes = 0, step_bytes = 0;  // on CUDA: the run's peak allocation; a step's own peak (the largest)
    Progress progress(first, last);
    model.train();
    // The end of a step, captured or not: its time, memory, loss, progress, evaluation and CSV row.
    const auto finish_step = [&](std::int64_t step, double value, Clock::time_point started, bool profiled,
                                 std::size_t step_start_bytes, double lr) {
        if (profiled) cuda::profiler_stop();
        if (o.device.is_cuda()) {
            const std::size_t peak = cuda::memory_stats(o.device.index).peak_bytes_in_use;
            peak_bytes = std::max(peak_bytes, peak);
            step_bytes = std::max(step_bytes, peak - std::min(peak, step_start_bytes));
        }
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
            const double val = validation_loss(model, loss_path, data.validation, o);
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
    };
    // --capture: the step as one CUDA graph (its first run eager, its second captured); zero_grad ends it.
    std::unique_ptr<cuda::CapturedStep> captured;
    if (o.capture)
        captured = std::make_unique<cuda::CapturedStep>([&](std::span<const Tensor> in) {
            ComputeGraph graph;
            const Var loss = next_token_loss(loss_path, graph, Batch{in[0], in[1]}, o.precision);
            graph.backward(scaler.scale(loss));
            scaler.unscale(optimizer);
            if (o.clip > 0) clip_grad_norm(model.parameters(), o.clip);
            scaler.step(optimizer);
            scaler.update();
            schedule.step();
            optimizer.zero_grad();
            return loss.value();
        });
    for (std::int64_t step = first; step < last; ++step) {
        const bool profiled = o.profile_step && *o.profile_step == step + 1 && o.device.is_cuda();
        if (profiled) {
            cuda::synchronize(o.device.index);
            cuda::profiler_start();
        }
        // The step's own memory (activations, gradients, temporaries): its peak over what was in use when it began.
        std::size_t step_start_bytes = 0;
        if (o.device.is_cuda()) {
            cuda::reset_peak_memory(o.device.index);
            step_start_bytes = cuda::memory_stats(o.device.index).bytes_in_use;
        }
        const auto started = Clock::now();
        const double lr = optimizer.lr();
        std::vector<std::int64_t> offsets = order.offsets(step);
        if (world > 1) {  // this rank's part of the step's windows
            const auto per = static_cast<std::ptrdiff_t>(o.batch / world);
            offsets = std::vector<std::int64_t>(offsets.begin() + rank * per, offsets.begin() + (rank + 1) * per);
        }
        const Batch batch = make_batch(data.train, offsets, o.device);
        if (captured) {
            const Tensor inputs[] = {batch.inputs, batch.targets};
            const double value = captured->run(inputs).item();  // waits for the step: the time below is the step's
            finish_step(step, value, started, profiled, step_start_bytes, lr);
            continue;
        }
        ComputeGraph graph;
        const Var loss = next_token_loss(loss_path, graph, batch, o.precision);
        bool stepped = false, backpropagated = false;
#if DYNGRAD_WITH_DIST
        if (zero) {
            zero->zero_grad();
            zero->backward(graph, scaler.scale(loss));  // reduced (stage 3: per unit, during the sweep)
            if (scaler.enabled()) zero->unscale(scaler);
            if (o.clip > 0) zero->clip_grad_norm(o.clip);  // one global norm over the shards
            if (scaler.enabled()) zero->step(scaler);
            else zero->step();
            stepped = true;
        } else if (ddp) {
            optimizer.zero_grad();
            ddp->backward(graph, scaler.scale(loss));  // averaged over the ranks
            backpropagated = true;
        }
#endif
        if (!stepped && !backpropagated) {
            optimizer.zero_grad();
            graph.backward(scaler.scale(loss));  // the loss itself unless f16
        }
        if (!stepped) {
            scaler.unscale(optimizer);  // clipping sees true gradients; no-op unless f16
            if (o.clip > 0) clip_grad_norm(model.parameters(), o.clip);
            scaler.step(optimizer);  // skipped whole when an f16 gradient overflowed; no host sync
        }
        scaler.update();
        schedule.step();
        double value = loss.item();  // waits for the step: the time below is the step's
#if DYNGRAD_WITH_DIST
        if (group && group->has_mpi()) {  // the whole batch's mean: the mean of the ranks' equal parts
            Tensor mean = Tensor::full({1}, value, DType::f64);
            group->all_reduce(mean, dist::ReduceOp::Avg);
            value = mean.item();
        }
#endif
        finish_step(step, value, started, profiled, step_start_bytes, lr);
    }

    if (captured && fusion::fusion_settings().enabled) {  // read by scripts/run-gpt-compare.sh's report
        const fusion::ReplayStats fused = fusion::replay_stats();
        std::printf("fusion: plans=%zu groups_compiled=%zu groups_from_cache=%zu groups_dropped=%zu captures=%zu "
                    "launches_saved=%zu chains_compiled=%zu chains_run=%zu prepare_ms=%.1f nvrtc_ms=%.1f\n",
                    fused.plans, fused.groups_compiled, fused.groups_from_cache, fused.groups_dropped, fused.captures,
                    fused.last_launches_saved, fused.backward_chains_compiled, fused.backward_chains_run,
                    fused.prepare_ms, fused.nvrtc_ms);
    }
    if (o.sample > 0)
        std::printf("--- sample ---\n%s\n--- end of sample ---\n", sample_text(model, forward, data.vocabulary, o).c_str());
    const auto window = std::min<std::size_t>(5, losses.size());
    const double head = std::accumulate(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(window), 0.0) /
                        static_cast<double>(window);
    const double tail = std::accumulate(losses.end() - static_cast<std::ptrdiff_t>(window), losses.end(), 0.0) /
                        static_cast<double>(window);
    std::printf("train loss: first %zu steps %.4f, last %zu steps %.4f\n", window, head, window, tail);
    if (o.device.is_cuda())  // key=value lines, read by bench/gpt2_report.py and scripts/run-second-order-bench.sh
        std::printf("peak_memory_bytes=%zu\nstep_memory_bytes=%zu\n", peak_bytes, step_bytes);
    if (o.deterministic && o.zero != 3)  // (ZeRO-3: each rank holds only its shards)
        std::printf("parameters_fnv1a=%016llx\n", static_cast<unsigned long long>(parameter_hash(model)));
    if (o.require_drop && !(tail < (1 - *o.require_drop) * head)) {
        std::printf("FAILED: the training loss fell from %.4f to %.4f, less than %.0f%%\n", head, tail,
                    100 * *o.require_drop);
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return cli::run_program("char_gpt", kUsage, [&] { return parse_options(argc, argv); }, run);
}
