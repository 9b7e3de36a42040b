// dyngrad-train: trains a classic network or an LSTM on Fashion-MNIST (or any MNIST-format directory) on
// the CPU or a GPU, with a progress bar, per-epoch test accuracy, a CSV learning curve and, on request, shadow
// verification of every k-th step against the float64 CPU replay.
//
//   dyngrad-train --model lenet --epochs 10 --device cuda --csv lenet.csv
//   dyngrad-train --model mlp --epochs 1 --limit 2000 --device cpu
//   dyngrad-train --model lstm --epochs 2 --limit 4000 --device cpu
//   dyngrad-train --model lenet --device cuda --resident --schedule none --target-accuracy 0.9 --epochs 30
//   dyngrad-train --model mlp --device cuda --precision bf16
//
// The last line is `test_accuracy=0.XXXX`; with --target-accuracy the lines `epochs_to_target=N` (0 when
// the target was not reached), `time_to_target_s=S` (training seconds of those epochs, evaluation excluded)
// and `evaluation_s=S` come before it. Run with --help for every option.
#include <dyngrad/dyngrad.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../cli/command_line.h"
#include "dyngrad/nn/models.h"
#if DYNGRAD_WITH_DIST
#include <dyngrad/distributed/ddp.h>
#include <dyngrad/distributed/zero.h>
#endif

using namespace dyngrad;

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = R"(usage: dyngrad-train [options]
  --model NAME        lenet5 | lenet | simplecnn | mlp | lstm                (default lenet)
  --epochs N          passes over the training set                           (default 10)
  --batch N           mini-batch size                                        (default 64)
  --lr X              learning rate               (default 0.001 for adam/adamw, 0.01 for sgd)
  --optimizer NAME    sgd | adam | adamw                                     (default adam)
  --momentum X        sgd momentum                                           (default 0.9)
  --weight-decay X    L2 for sgd/adam, decoupled for adamw     (default 0; 0.01 for adamw)
  --schedule NAME     none | cosine: learning rate per epoch                (default cosine)
  --device NAME       cpu | cuda | cuda:N                                    (default cpu)
  --resident          cuda: keep the data sets on the GPU, batches sliced there
  --seed N            initialisation and shuffling                           (default 0)
  --limit N           use only the first N samples of each split
  --data DIR          MNIST-format directory    (default /usr/share/datasets/fashion-mnist)
  --save FILE         save the parameters after training (safetensors)
  --load FILE         load parameters before training (with --epochs 0: evaluate only)
  --csv FILE          write the learning curve, one row per epoch
  --shadow K          verify every K-th step against the float64 CPU replay
  --shadow-tolerance T  relative-norm tolerance of those checks (default 1e-3: a float32 conv
                      weight gradient sums ~10^4-10^5 products and loses ~1e-4 to cancellation)
  --log-every N       read loss and accuracy back every N batches (a host sync on a GPU)
                      (default 1 on the CPU, 50 on a GPU)
  --distributed       data parallel over the processes of `mpirun -np N` (or torchrun's variables): each
                      rank trains on its shard of every epoch with --batch samples per step, gradients
                      averaged (distributed/ddp.h); --device cuda picks the rank's GPU (local rank); rank 0
                      prints, saves and writes the CSV
  --zero N            with --distributed: ZeRO stage 1 (AdamW's moments sharded across the ranks), 2
                      (the averaged gradients too) or 3 (the parameters too, the model one unit gathered
                      for its forward and backward) in place of DDP (distributed/zero.h); AdamW only
  --zero-recompute    with --zero 3: the model's forward runs again in its backward instead of keeping its
                      activations (ZeroOptions::recompute: less memory, one more forward a step)
  --ddp-compression D with --distributed (DDP): bf16 | f16, the gradients averaged in that dtype (half the
                      bytes; DDPOptions::compression, as PyTorch's bf16/fp16 compress hooks)
  --target-accuracy X stop after the first epoch whose test accuracy reaches X (0 to 1) and print
                      time_to_target_s: the training seconds up to then, evaluation excluded
  --precision NAME    f32 | bf16 | f16: the forward under autocast into that dtype (graph/autocast.h;
                      parameters, gradients and optimizer states stay f32); f16 scales the loss with a
                      GradScaler (skipped steps and the scale are printed per epoch). On the CPU the
                      reduced ops compute through f32 from the rounded values          (default f32)
)";

struct Options {
    std::string model = "lenet";
    std::int64_t epochs = 10;
    std::int64_t batch = 64;
    std::optional<double> lr;
    std::string optimizer = "adam";
    double momentum = 0.9;
    std::optional<double> weight_decay;
    std::string schedule = "cosine";
    Device device = Device::cpu();
    bool resident = false;
    std::uint64_t seed = 0;
    std::int64_t limit = -1;
    std::string data = kDefaultMnistDirectory;
    std::string save, load, csv;
    std::int64_t shadow = 0;
    double shadow_tolerance = 1e-3;
    std::int64_t log_every = 0;  // 0: by device
    std::optional<double> target_accuracy;
    bool distributed = false;
    int zero = 0;  // ZeRO stage, 0: DDP
    bool zero_recompute = false;  // --zero 3: ZeroOptions::recompute
    std::optional<DType> ddp_compression;  // --ddp-compression: DDPOptions::compression
    DType precision = DType::f32;
};

using cli::UsageError;

// Every argument is checked here, before the data is read or a step is taken (cli/command_line.h).
Options parse_options(int argc, char** argv) {
    const cli::Arguments args(
        argc, argv,
        {.flags = {"--resident", "--distributed", "--zero-recompute"},
         .options = {"--model", "--epochs", "--batch", "--lr", "--optimizer", "--momentum", "--weight-decay",
                     "--schedule", "--device", "--seed", "--limit", "--data", "--save", "--load", "--csv", "--shadow",
                     "--shadow-tolerance", "--log-every", "--target-accuracy", "--precision", "--zero",
                     "--ddp-compression"}});
    constexpr double kMax = std::numeric_limits<double>::max();
    Options o;
    const auto given = [&](const char* name) { return args.value(name); };
    if (auto v = given("--model")) o.model = cli::parse_choice("--model", *v, {"lenet5", "lenet", "simplecnn", "mlp", "lstm"});
    if (auto v = given("--epochs")) o.epochs = cli::parse_int("--epochs", *v, 0, 1'000'000);
    if (auto v = given("--batch")) o.batch = cli::parse_int("--batch", *v, 1, 1 << 24);
    if (auto v = given("--lr")) o.lr = cli::parse_real("--lr", *v, 0, kMax);
    if (auto v = given("--optimizer")) o.optimizer = cli::parse_choice("--optimizer", *v, {"sgd", "adam", "adamw"});
    if (auto v = given("--momentum")) o.momentum = cli::parse_real("--momentum", *v, 0, 1);
    if (auto v = given("--weight-decay")) o.weight_decay = cli::parse_real("--weight-decay", *v, 0, kMax);
    if (auto v = given("--schedule")) o.schedule = cli::parse_choice("--schedule", *v, {"none", "cosine"});
    if (auto v = given("--device")) o.device = cli::parse_device("--device", *v);
    o.resident = args.has("--resident");
    o.distributed = args.has("--distributed");
#if !DYNGRAD_WITH_DIST
    if (o.distributed) throw UsageError("--distributed: this build has no dist layer (MPI was not found when configuring)");
#endif
    if (auto v = given("--zero")) {
        o.zero = static_cast<int>(cli::parse_int("--zero", *v, 1, 3));
        if (!o.distributed) throw UsageError("--zero: shards across the ranks of --distributed, which is not given");
        if (given("--optimizer") && o.optimizer != "adamw")
            throw UsageError("--zero: shards AdamW's state; --optimizer " + o.optimizer + " is not adamw");
        o.optimizer = "adamw";
    }
    o.zero_recompute = args.has("--zero-recompute");
    if (o.zero_recompute && o.zero != 3) throw UsageError("--zero-recompute: for --zero 3");
    if (auto v = given("--ddp-compression")) {
        o.ddp_compression = cli::parse_choice("--ddp-compression", *v, {"bf16", "f16"}) == "bf16" ? DType::bf16 : DType::f16;
        if (!o.distributed || o.zero > 0)
            throw UsageError("--ddp-compression: compresses DDP's all-reduce, which needs --distributed without --zero");
    }
    if (auto v = given("--seed")) o.seed = static_cast<std::uint64_t>(cli::parse_int("--seed", *v, 0));
    if (auto v = given("--limit")) o.limit = cli::parse_int("--limit", *v, 1);
    if (auto v = given("--save")) o.save = cli::output_file("--save", *v);
    if (auto v = given("--load")) o.load = cli::existing_file("--load", *v);
    if (auto v = given("--csv")) o.csv = cli::output_file("--csv", *v);
    if (auto v = given("--shadow")) o.shadow = cli::parse_int("--shadow", *v, 0);
    if (auto v = given("--shadow-tolerance"))
        o.shadow_tolerance = cli::parse_real("--shadow-tolerance", *v, 0, kMax, /*min_exclusive=*/true);
    if (auto v = given("--log-every")) o.log_every = cli::parse_int("--log-every", *v, 1);
    if (o.zero > 0 && o.shadow > 0)
        throw UsageError("--shadow: not with --zero (stage 2 keeps only this rank's shard of the gradients)");
    if (auto v = given("--target-accuracy")) o.target_accuracy = cli::parse_real("--target-accuracy", *v, 0, 1);
    if (auto v = given("--precision")) {
        const std::string precision = cli::parse_choice("--precision", *v, {"f32", "bf16", "f16"});
        o.precision = precision == "bf16" ? DType::bf16 : precision == "f16" ? DType::f16 : DType::f32;
    }
    // Last, so that a mistake in another argument is reported without the data set installed.
    o.data = cli::existing_directory(given("--data") ? "--data" : "--data (default)", given("--data").value_or(o.data));
    if (o.log_every == 0) o.log_every = o.device.is_cpu() ? 1 : 50;
    return o;
}

std::unique_ptr<Optimizer> make_optimizer(const Options& o, const std::vector<Parameter>& parameters) {
    if (o.optimizer == "sgd")
        return std::make_unique<SGD>(parameters, SgdOptions{.lr = o.lr.value_or(0.01), .momentum = o.momentum,
                                                            .weight_decay = o.weight_decay.value_or(0.0)});
    if (o.optimizer == "adamw")
        return std::make_unique<AdamW>(parameters,
                                       AdamOptions{.lr = o.lr.value_or(1e-3), .weight_decay = o.weight_decay.value_or(0.01)});
    return std::make_unique<Adam>(parameters, AdamOptions{.lr = o.lr.value_or(1e-3), .weight_decay = o.weight_decay.value_or(0.0)});
}

// ---- metrics ----

// Rows of `logits` (N,C) whose largest entry is at the label's index (first maximum on ties).
std::int64_t count_correct(const Tensor& logits, const Tensor& labels) {
    // Under autocast the logits may be bf16/f16 (a linear's output).
    const Tensor scores = logits.to(Device::cpu()).to(DType::f32);
    const Tensor truth = labels.to(Device::cpu());
    const std::int64_t rows = scores.size(0), classes = scores.size(1);
    const float* s = scores.data<float>();
    const std::int64_t* y = truth.data<std::int64_t>();
    std::int64_t correct = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = s + r * classes;
        correct += (std::max_element(row, row + classes) - row) == y[r];
    }
    return correct;
}

struct Metrics {
    double loss = 0;
    double accuracy = 0;
};

// Mean loss and accuracy over a whole split, in eval mode and without recording history.
// `forward`: the model itself, or ZeRO-3's sharded forward over it.
Metrics evaluate(Sequential& model, const std::function<Var(const Var&)>& forward, BatchLoader& loader,
                 DType precision) {
    model.eval();
    const NoGradGuard no_grad;
    const AutocastGuard autocast(precision);  // f32: off
    double loss_sum = 0;
    std::int64_t correct = 0, seen = 0;
    Batch batch;
    loader.start_epoch(0);
    while (loader.next(batch)) {
        ComputeGraph graph;
        const Var logits = forward(graph.input(batch.images, "images"));
        const Var loss = cross_entropy(logits, graph.input(batch.labels, "labels"));
        loss_sum += loss.item() * static_cast<double>(batch.size());
        correct += count_correct(logits.value(), batch.labels);
        seen += batch.size();
    }
    model.train();
    return {loss_sum / static_cast<double>(std::max<std::int64_t>(seen, 1)),
            static_cast<double>(correct) / static_cast<double>(std::max<std::int64_t>(seen, 1))};
}

// ---- progress ----

std::string clock_time(double seconds) {
    const auto s = static_cast<long long>(std::max(0.0, std::round(seconds)));
    char text[32];
    if (s >= 3600)
        std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    else
        std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
    return text;
}

// Training progress of one epoch: a redrawn bar on a terminal, about ten plain lines otherwise.
// Loss and accuracy are running means over the batches read back so far (every --log-every batches).
class Progress {
public:
    Progress(std::int64_t epoch, std::int64_t epochs, std::int64_t batches, bool terminal)
        : epoch_(epoch), epochs_(epochs), batches_(batches), terminal_(terminal),
          line_every_(std::max<std::int64_t>(1, (batches + 9) / 10)), start_(Clock::now()) {}

    // True when batch `index` (from 0) should be read back for the display or the plain log.
    bool wants(std::int64_t index, std::int64_t log_every) const {
        return (index + 1) % log_every == 0 || (index + 1) % line_every_ == 0 || index + 1 == batches_;
    }

    void add(std::int64_t index, double loss, std::int64_t correct, std::int64_t size, std::int64_t images_done) {
        loss_sum_ += loss * static_cast<double>(size);
        correct_ += correct;
        sampled_ += size;
        const double elapsed = seconds();
        const bool last = index + 1 == batches_;
        if (terminal_) {
            if (!last && elapsed - drawn_at_ < 0.1) return;  // redraw at most ten times a second
            drawn_at_ = elapsed;
            constexpr int kWidth = 24;
            const int filled = static_cast<int>(kWidth * (index + 1) / batches_);
            std::printf("\r\x1b[Kepoch %lld/%lld [%s%s] %lld/%lld  %s", static_cast<long long>(epoch_ + 1),
                        static_cast<long long>(epochs_), std::string(filled, '#').c_str(),
                        std::string(kWidth - filled, '.').c_str(), static_cast<long long>(index + 1),
                        static_cast<long long>(batches_), status(index, images_done, elapsed).c_str());
        } else if ((index + 1) % line_every_ == 0 || last) {
            std::printf("epoch %lld/%lld batch %lld/%lld  %s\n", static_cast<long long>(epoch_ + 1),
                        static_cast<long long>(epochs_), static_cast<long long>(index + 1),
                        static_cast<long long>(batches_), status(index, images_done, elapsed).c_str());
        }
        std::fflush(stdout);
    }

    // The bar's line is reused by the epoch summary.
    void finish() const {
        if (terminal_) std::printf("\r\x1b[K");
    }
    double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
    Metrics train_metrics() const {
        const auto n = static_cast<double>(std::max<std::int64_t>(sampled_, 1));
        return {loss_sum_ / n, static_cast<double>(correct_) / n};
    }

private:
    std::string status(std::int64_t index, std::int64_t images_done, double elapsed) const {
        const Metrics m = train_metrics();
        const double rate = static_cast<double>(images_done) / std::max(elapsed, 1e-9);
        const double eta = elapsed / static_cast<double>(index + 1) * static_cast<double>(batches_ - index - 1);
        char text[128];
        std::snprintf(text, sizeof text, "loss %.4f  acc %.2f%%  %.0f img/s  ETA %s", m.loss, 100 * m.accuracy, rate,
                      clock_time(eta).c_str());
        return text;
    }

    std::int64_t epoch_, epochs_, batches_;
    bool terminal_;
    std::int64_t line_every_;
    Clock::time_point start_;
    double drawn_at_ = -1;
    double loss_sum_ = 0;
    std::int64_t correct_ = 0, sampled_ = 0;
};

int run(Options o) {
    if (o.device.is_cuda() && o.device.index >= cuda_device_count())
        throw DeviceError(str("--device ", o.device.to_string(), ": ",
                              cuda_compiled() ? str(cuda_device_count(), " CUDA device(s) found")
                                              : std::string("this build of dyngrad has no CUDA backend")));
    std::ofstream csv;
    if (!o.csv.empty()) {
        csv.open(o.csv);
        if (!csv) throw IoError(str("--csv: cannot write '", o.csv, "'"));
        csv << "epoch,train_loss,train_accuracy,test_loss,test_accuracy,lr,train_seconds,images_per_second\n";
    }

    const auto load_start = Clock::now();
    MnistData data = load_mnist(o.data);
    if (o.limit > 0) {
        data.train = data.train.head(o.limit);
        data.test = data.test.head(o.limit);
    }
    const std::int64_t height = data.train.images.size(2), width = data.train.images.size(3);
    std::printf("data: %s, %lld training and %lld test images of %lldx%lld (pixel mean %.4f, std %.4f), %.1f s\n",
                o.data.c_str(), static_cast<long long>(data.train.size()), static_cast<long long>(data.test.size()),
                static_cast<long long>(height), static_cast<long long>(width), data.normalization.mean,
                data.normalization.stddev, std::chrono::duration<double>(Clock::now() - load_start).count());

    Generator gen(o.seed);
    Sequential model = models::make_model(o.model, height, width, gen);
#if DYNGRAD_WITH_DIST
    std::optional<dist::ProcessGroup> group;
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    std::unique_ptr<dist::ZeroOptimizer> zero;
    if (o.distributed) {
        group = dist::ProcessGroup::init();
        if (o.device.is_cuda()) o.device = group->device();  // this rank's GPU
        std::printf("distributed: %s, %d rank%s, %lld samples per rank and step\n", group->describe().c_str(),
                    group->world_size(), group->world_size() == 1 ? "" : "s", static_cast<long long>(o.batch));
        if (group->rank() != 0) {  // rank 0 reports
            if (!std::freopen("/dev/null", "w", stdout)) throw IoError("--distributed: cannot silence stdout");
            csv.close();
        }
    }
#endif
    model.to(o.device);
    if (!o.load.empty()) {
        load_parameters(model, o.load);
        std::printf("loaded parameters from %s\n", o.load.c_str());
    }
    std::int64_t parameter_count = 0;  // before ZeRO-3 frees the model's own copies
    for (const Parameter& p : model.parameters()) parameter_count += p.value().numel();
    std::function<Var(const Var&)> forward = [model](const Var& x) { return model(x); };
#if DYNGRAD_WITH_DIST
    // Each broadcasts rank 0's weights everywhere.
    if (group && o.zero == 3) {
        // The whole Sequential is one unit (its layers are not reachable one by one): sharded between steps,
        // gathered whole for the forward and again for the backward. char_gpt splits its model per block.
        zero = std::make_unique<dist::ZeroOptimizer>(
            std::vector<dist::ZeroUnit>{{"model", model, forward}}, *group,
            AdamOptions{.lr = o.lr.value_or(1e-3), .weight_decay = o.weight_decay.value_or(0.01)},
            dist::ZeroOptions{.stage = 3, .recompute = o.zero_recompute});
        forward = [z = zero.get()](const Var& x) { return z->forward(x); };
    } else if (group && o.zero > 0)
        zero = std::make_unique<dist::ZeroOptimizer>(
            model, *group, AdamOptions{.lr = o.lr.value_or(1e-3), .weight_decay = o.weight_decay.value_or(0.01)},
            dist::ZeroOptions{.stage = o.zero});
    else if (group)
        ddp = std::make_unique<dist::DistributedDataParallel>(model, *group,
                                                              dist::DDPOptions{.compression = o.ddp_compression});
    const int rank = group ? group->rank() : 0, world = group ? group->world_size() : 1;
#else
    const int rank = 0, world = 1;
#endif

#if DYNGRAD_WITH_DIST
    // With --zero the AdamW over this rank's shards (the same settings as make_optimizer's adamw).
    const std::unique_ptr<Optimizer> own = zero ? nullptr : make_optimizer(o, model.parameters());
    Optimizer* const optimizer = zero ? &zero->optimizer() : own.get();
#else
    const std::unique_ptr<Optimizer> optimizer = make_optimizer(o, model.parameters());
#endif
    std::optional<CosineAnnealingLR> cosine;
    if (o.schedule == "cosine" && o.epochs > 0) cosine.emplace(*optimizer, o.epochs);
    std::printf("model: %s, %lld parameters | %s lr %g, %s schedule | batch %lld | %lld epoch%s | %s%s | seed %llu"
                " | precision %s\n",
                o.model.c_str(), static_cast<long long>(parameter_count), o.optimizer.c_str(), optimizer->lr(),
                o.schedule.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.epochs),
                o.epochs == 1 ? "" : "s", o.device.to_string().c_str(),
                o.device.is_cuda() ? (o.resident ? " (data resident on the GPU)" : " (pinned, asynchronous batches)") : "",
                static_cast<unsigned long long>(o.seed),
                o.precision == DType::f32 ? "f32" : o.precision == DType::bf16 ? "bf16 autocast" : "f16 autocast + loss scaling");
    // f16's 5 exponent bits underflow small gradients: scale the loss (bf16 has f32's range and needs none).
    GradScaler scaler(GradScalerOptions{.enabled = o.precision == DType::f16});
    std::int64_t skipped_steps = 0;
    if (o.device.is_cuda()) std::printf("device: %s\n", cuda::device_name(o.device.index).c_str());

    BatchLoader train_loader(data.train, {.batch_size = o.batch, .shuffle = true, .seed = o.seed, .device = o.device,
                                          .resident = o.resident, .num_shards = world, .shard = rank});
    BatchLoader test_loader(data.test, {.batch_size = 1000, .shuffle = false, .device = o.device, .resident = o.resident});
    ShadowVerifier shadow(o.shadow, VerifyOptions{.tolerance = o.shadow_tolerance});
    double shadow_worst_value = 0, shadow_worst_grad = 0;
    const bool terminal = ::isatty(STDOUT_FILENO) != 0;

    Metrics test{};
    double train_seconds_total = 0, evaluation_seconds_total = 0;
    std::int64_t step = 0, epochs_done = 0, epochs_to_target = 0;
    for (std::int64_t epoch = 0; epoch < o.epochs && epochs_to_target == 0; ++epoch) {
        const double lr = optimizer->lr();
        Progress progress(epoch, o.epochs, train_loader.batches_per_epoch(), terminal);
        train_loader.start_epoch(epoch);  // counted in the epoch's time: with --resident it uploads the epoch's order
        std::int64_t images_done = 0;
        Batch batch;
        while (train_loader.next(batch)) {
            ComputeGraph graph;
            Var logits, loss;
            {
                const AutocastGuard autocast(o.precision);  // f32: off; the loss is f32 under every policy
                logits = forward(graph.input(batch.images, "images"));
                loss = cross_entropy(logits, graph.input(batch.labels, "labels"));
            }
            const Var scaled_loss = scaler.scale(loss);  // the loss itself unless f16
            optimizer->zero_grad();
#if DYNGRAD_WITH_DIST
            if (zero) zero->zero_grad(), zero->backward(graph, scaled_loss);
            else if (ddp) ddp->backward(graph, scaled_loss, shadow.backward_options(step));
            else
#endif
                graph.backward(scaled_loss, shadow.backward_options(step));
            if (shadow.due(step)) {
                // Throws GraphError naming the first diverging node.
                for (const NodeCheck& n : shadow.check(graph, loss).nodes) {
                    shadow_worst_value = std::max(shadow_worst_value, n.value_rel_err);
                    shadow_worst_grad = std::max(shadow_worst_grad, n.grad_rel_err);
                }
            }
#if DYNGRAD_WITH_DIST
            if (zero && scaler.enabled()) zero->step(scaler);  // one skip verdict for all ranks
            else if (zero) zero->step();  // shard-local AdamW, then (stages 1, 2) the all_gather of the parameters
            else
#endif
                scaler.step(*optimizer);  // skipped whole when an f16 gradient overflowed; no host sync
            scaler.update();
            images_done += batch.size();
            ++step;
            if (progress.wants(batch.index, o.log_every)) {
                progress.add(batch.index, loss.item(), count_correct(logits.value(), batch.labels), batch.size(),
                             images_done);
                if (scaler.enabled()) skipped_steps += scaler.last_step_skipped();  // read back with the loss
            }
        }
        if (o.device.is_cuda()) cuda::synchronize(o.device.index);
        const double seconds = progress.seconds();
        train_seconds_total += seconds;
        progress.finish();
        if (cosine) cosine->step();

        const auto evaluation_start = Clock::now();
        test = evaluate(model, forward, test_loader, o.precision);
        evaluation_seconds_total += std::chrono::duration<double>(Clock::now() - evaluation_start).count();
        ++epochs_done;
        if (o.target_accuracy && test.accuracy >= *o.target_accuracy) epochs_to_target = epochs_done;
        const Metrics train = progress.train_metrics();
        const double rate = static_cast<double>(images_done) / seconds;
        std::printf("epoch %lld/%lld  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  %.1f s (%.0f img/s)  lr %.3g",
                    static_cast<long long>(epoch + 1), static_cast<long long>(o.epochs), train.loss,
                    100 * train.accuracy, test.loss, 100 * test.accuracy, seconds, rate, lr);
        if (scaler.enabled())
            std::printf("  loss scale %g, %lld skipped of the steps read back", scaler.scale_value(),
                        static_cast<long long>(skipped_steps));
        std::printf("\n");
        std::fflush(stdout);
        if (csv.is_open())
            csv << epoch + 1 << ',' << train.loss << ',' << train.accuracy << ',' << test.loss << ',' << test.accuracy
                << ',' << lr << ',' << seconds << ',' << rate << std::endl;
    }
    if (o.epochs == 0) test = evaluate(model, forward, test_loader, o.precision);
    else
        std::printf("trained %lld epoch%s in %.1f s (%.1f s per epoch)\n", static_cast<long long>(epochs_done),
                    epochs_done == 1 ? "" : "s", train_seconds_total,
                    train_seconds_total / static_cast<double>(epochs_done));
    if (o.shadow > 0)
        std::printf("shadow verification: %lld of %lld steps checked against the float64 CPU replay, all passed "
                    "(tolerance %.0e; worst value error %.2e, worst gradient error %.2e)\n",
                    static_cast<long long>(shadow.checks()), static_cast<long long>(step), o.shadow_tolerance,
                    shadow_worst_value, shadow_worst_grad);
#if DYNGRAD_WITH_DIST
    if (!o.save.empty() && zero && zero->stage() == 3) {  // every rank gathers; rank 0 writes the model's names
        std::vector<Parameter> full;
        for (const auto& [name, value] : zero->full_parameters()) full.emplace_back(value, name.substr(name.find('.') + 1));
        if (rank == 0) save_parameters(full, o.save);
    } else
#endif
    if (!o.save.empty() && rank == 0)
        save_parameters(model, o.save);
    if (!o.save.empty() && rank == 0) std::printf("saved parameters to %s\n", o.save.c_str());
    if (o.target_accuracy) {
        if (epochs_to_target > 0)
            std::printf("test accuracy %.4f reached the target %.4f after %lld epoch%s\n", test.accuracy,
                        *o.target_accuracy, static_cast<long long>(epochs_to_target), epochs_to_target == 1 ? "" : "s");
        else
            std::printf("target test accuracy %.4f not reached in %lld epoch%s\n", *o.target_accuracy,
                        static_cast<long long>(epochs_done), epochs_done == 1 ? "" : "s");
        std::printf("epochs_to_target=%lld\ntime_to_target_s=%.3f\nevaluation_s=%.3f\n",
                    static_cast<long long>(epochs_to_target), epochs_to_target > 0 ? train_seconds_total : 0.0,
                    evaluation_seconds_total);
    }
    std::printf("test_accuracy=%.4f\n", test.accuracy);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    try {
        for (int i = 1; i < argc; ++i) {
            if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
                std::fputs(kUsage, stdout);
                return 0;
            }
        }
        options = parse_options(argc, argv);
    } catch (const UsageError& error) {
        std::fprintf(stderr, "dyngrad-train: %s\n%s", error.what(), kUsage);
        return 2;
    }
    try {
        return run(options);
    } catch (const std::exception& error) {
        std::fflush(stdout);
        // On a terminal the progress bar's line is still open.
        std::fprintf(stderr, "%sdyngrad-train: error: %s\n", ::isatty(STDOUT_FILENO) ? "\n" : "", error.what());
        return 1;
    }
}
