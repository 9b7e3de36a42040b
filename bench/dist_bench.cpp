// dyngrad-dist-bench: data-parallel training steps on 1 or N GPUs (mpirun -np N, one process per GPU), sharded
// (ZeRO-1/2/3) steps against DDP, and the all-reduce bandwidth, for scripts/run-dist-bench.sh, which runs
// bench/torch_ddp.py on the same workloads under torchrun and compares (bench/dist_report.py). Rank 0 prints one
// line per result:
//   step model=mlp4096x4_f32 world=2 mode=ddp optim=sgd overlap=1 batch_per_gpu=4096 step_ms=12.3 samples_per_s=665000 peak_mib=900.1
//   allreduce bytes=67108864 world=2 ms=0.41 algbw_GBps=163 busbw_GBps=163
// Workloads (per GPU): mlp4096x4 (4 linear layers 4096→4096, ReLU between, batch 4096) in f32 and TF32; lenet
// (nn/models.h) on (256,1,28,28), cross-entropy over 10 classes, SGD with momentum; gpt_char_bf16: the character
// GPT as samples/char_gpt.cpp builds it (nn/transformer.h: 6 layers, 6 heads, width 384, context 256, vocabulary
// 96, no dropout) on random tokens, batch 32, the forward under bf16 autocast, the fused-head loss, AdamW.
// Random data, fixed per rank. World 1 trains without DDP (the baseline); world N with DDP, with overlap
// (buckets all-reduced during the backward) and without (every bucket after it).
// --zero 0,1,2,3 (any of them, in that order) runs, instead, per workload: 0: DDP with AdamW (mode=ddp
// optim=adamw), 1-3: that stage's distributed/zero.h ZeroOptimizer (mode=zero1|2|3, AdamW as char_gpt --zero uses
// it; stage 3 prefetches the neighbouring unit's all-gather, ZeroOptions::prefetch's default); with --no-zero-prefetch
// stage 3 without that prefetch (mode=zero3np); with --zero-recompute stage 3 recomputes each unit's forward in its backward (mode=zero3r) instead of keeping
// its activations. run-dist-bench.sh runs stage 3 in a process of its own, so that a failure there costs only its rows. ZeRO-3's units:
// the GPT's embeddings, blocks and head (dist::gpt_units); the MLP's and lenet's whole model as one unit.
// peak_mib: rank 0's cuda::memory_stats peak of bytes in use over the row (model, data, optimizer, steps), reset
// before it. --tiny: the same workloads shrunk (MLP 64x4 batch 32, lenet batch 8, GPT 2 layers, 2 heads, width 32,
// context 16, batch 4; all-reduce to 1 MiB) so that ranks on the CPU (MPI) run the whole program in seconds (CTest
// dist_bench_tiny); on the CPU there is no peak_mib.
// --phases: after each step row, a phases row: forward, backward (with DDP's or ZeRO's communication) and the
// optimizer's update, each timed alone over --steps steps: the host's time to queue it and the time until the
// device finished it.
// --kernel-times (CUDA, with CUPTI): after each step row, rank 0's kernels of 10 more steps, each alone, from CUPTI's
// trace (bench/kernel_trace.h): a "kernels" line (count, kernel time, busy, span and idle per step, as dyngrad-perf
// --kernel-times prints) and the kernels grouped by name, most time first (where the sharded modes' time goes).
// --capture (GPUs): each DDP row's step (forward, backward with its all-reduces, update) is a cuda::CapturedStep,
// captured once and replayed: the step without its host work, on 1 GPU and N alike.
// --repeats R (default 5): R timed windows of --steps steps each; step_ms is the median window's time per step,
// step_ms_min and step_ms_max the fastest and slowest (bench/torch_ddp.py times the same way).
//   mpirun -np 2 dyngrad-dist-bench [--steps 30] [--warmup 5] [--repeats 5] [--only mlp|lenet|gpt|allreduce] [--zero 0,1,2,3 [--zero-recompute | --no-zero-prefetch]] [--tiny] [--phases] [--kernel-times] [--capture]
//       [--bucket-cap-mb 25] [--first-bucket-cap-mb 1] [--gradient-as-bucket-view] [--ddp-compression bf16|f16]
//       (DDPOptions; with compression the DDP rows' lines carry compression=bf16|f16, run them apart from the others)
#include <dyngrad/cuda/runtime.h>
#include <dyngrad/distributed/ddp.h>
#include <dyngrad/distributed/zero.h>
#include <dyngrad/dyngrad.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "../cli/command_line.h"
#include "kernel_trace.h"
#include "dyngrad/graph/autocast.h"
#include "dyngrad/nn/models.h"

using namespace dyngrad;
using Clock = std::chrono::steady_clock;

namespace {

// One built model: its parameters, its loss on (x, y), and for ZeRO-3 its units and the loss on the last
// unit's output.
struct Built {
    Module module;
    std::function<Var(const Var& x, const Var& y)> loss;
    std::function<std::vector<dist::ZeroUnit>()> units;
    std::function<Var(const Var& out, const Var& y)> head_loss;
};

struct Workload {
    std::string name;
    bool tf32;
    DType autocast;  // f32: off
    bool adamw;      // the optimizer of the DDP efficiency rows (else SGD with momentum)
    std::int64_t batch;
    std::function<Built(Generator&)> make;
    std::function<std::pair<Tensor, Tensor>(Generator&, std::int64_t batch)> data;
};

constexpr std::int64_t kGptVocabulary = 96;

// Waits for the device's queued work (nothing to wait for on the CPU).
void synchronize(Device device) {
    if (device.is_cuda()) cuda::synchronize(device.index);
}

Built classifier(Sequential model) {
    return {model, [model](const Var& x, const Var& y) { return cross_entropy(model(x), y); },
            [model] { return std::vector<dist::ZeroUnit>{{"model", model, [model](const Var& x) { return model(x); }}}; },
            [](const Var& out, const Var& y) { return cross_entropy(out, y); }};
}

Built char_gpt(Generator& gen, const GPTConfig& config) {
    const GPT model(config, gen);
    return {model, [model](const Var& x, const Var& y) { return model.loss(x, y); },
            [model] { return dist::gpt_units(model); },
            [](const Var& logits, const Var& y) {
                const Shape& s = logits.shape();
                return cross_entropy(reshape(logits, {s[0] * s[1], s[2]}), y);
            }};
}

std::pair<Tensor, Tensor> images(Generator& gen, std::int64_t batch, const Shape& sample) {
    Shape shape{batch};
    shape.insert(shape.end(), sample.begin(), sample.end());
    const Tensor x = Tensor::uniform(shape, -1, 1, gen);
    std::vector<std::int64_t> labels;
    for (std::int64_t i = 0; i < batch; ++i) labels.push_back(static_cast<std::int64_t>(gen.engine()() % 10));
    return {x, Tensor::from_vector(labels, {batch})};
}

std::pair<Tensor, Tensor> tokens(Generator& gen, std::int64_t batch, std::int64_t context) {
    std::vector<std::int64_t> inputs, targets;  // a window of context + 1 tokens: the inputs and the next tokens
    for (std::int64_t b = 0; b < batch; ++b) {
        std::vector<std::int64_t> window;
        for (std::int64_t i = 0; i <= context; ++i)
            window.push_back(static_cast<std::int64_t>(gen.engine()() % kGptVocabulary));
        inputs.insert(inputs.end(), window.begin(), window.end() - 1);
        targets.insert(targets.end(), window.begin() + 1, window.end());
    }
    return {Tensor::from_vector(inputs, {batch, context}), Tensor::from_vector(targets, {batch * context})};
}

// mode: "ddp" (DDP at world > 1, the plain model at world 1), "zero1|2|3", "zero3np" (ZeRO-3 without prefetch) or "zero3r" (ZeRO-3 recomputing each
// unit's forward in its backward: ZeroOptions::recompute); adamw: the optimizer of a DDP row.
struct Reports {
    bool phases = false;
    int repeats = 5;  // timed windows of `steps` steps; the row reports the median window
    bool kernel_times = false;
    bool capture = false;  // DDP rows: each step one cuda::CapturedStep replay (its first run eager)
};

void step_bench(dist::ProcessGroup& group, const Workload& w, const std::string& mode, bool adamw, bool overlap,
                int steps, int warmup, Reports reports, const dist::DDPOptions& ddp_options) {
    const Device device = group.device();
    if (reports.capture && !device.is_cuda())
        throw cli::UsageError("--capture: a CUDA graph per step needs the ranks on GPUs (NCCL)");
    if (device.is_cuda()) {
        cuda::set_allow_tf32(w.tf32);
        cuda::synchronize(device.index);
        cuda::reset_peak_memory(device.index);
    }
    Generator init(1);
    Built built = w.make(init);
    built.module.to(device);
    const bool recompute = mode == "zero3r", no_prefetch = mode == "zero3np";
    const int stage = mode == "ddp" ? 0 : recompute || no_prefetch ? 3 : mode.back() - '0';
    const AdamOptions adam{.lr = 1e-4, .weight_decay = 0.01};
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    std::unique_ptr<dist::ZeroOptimizer> zero;
    std::unique_ptr<Optimizer> optimizer;
    if (stage == 3) {
        const std::optional<bool> prefetch = no_prefetch ? std::optional<bool>(false) : std::nullopt;  // else the default
        zero = std::make_unique<dist::ZeroOptimizer>(built.units(), group, adam,
                                                     dist::ZeroOptions{.stage = 3, .recompute = recompute, .prefetch = prefetch});
    } else if (stage > 0) {
        zero = std::make_unique<dist::ZeroOptimizer>(built.module, group, adam, dist::ZeroOptions{.stage = stage});
    } else {
        if (group.world_size() > 1)
            ddp = std::make_unique<dist::DistributedDataParallel>(built.module, group, [&] {
                dist::DDPOptions o = ddp_options;
                o.overlap = overlap;
                return o;
            }());
        if (adamw) optimizer = std::make_unique<AdamW>(built.module.parameters(), adam);
        else optimizer = std::make_unique<SGD>(built.module.parameters(), SgdOptions{.lr = 1e-3, .momentum = 0.9});
    }
    Generator data(100 + static_cast<std::uint64_t>(group.rank()));
    auto [host_x, host_y] = w.data(data, w.batch);
    const Tensor x = host_x.to(device), y = host_y.to(device);
    // The step's three phases; one_step runs them back to back, --phases times each (below).
    std::unique_ptr<ComputeGraph> graph;
    Var loss;
    // The inputs of the step: x and y, or a captured step's copies of them.
    const Tensor* step_x = &x;
    const Tensor* step_y = &y;
    const auto forward = [&] {
        graph = std::make_unique<ComputeGraph>();
        const AutocastGuard autocast(w.autocast);
        loss = stage == 3 ? built.head_loss(zero->forward(graph->input(*step_x)), graph->input(*step_y))
                          : built.loss(graph->input(*step_x), graph->input(*step_y));
    };
    const auto backward = [&] {
        if (zero) zero->backward(*graph, loss);
        else if (ddp) ddp->backward(*graph, loss, {.free_values = true});
        else graph->backward(loss, {.free_values = true});
    };
    const auto update = [&] {
        if (zero) {
            zero->step();
            zero->zero_grad();
        } else {
            optimizer->step();
            optimizer->zero_grad();
        }
        loss = Var();
        graph.reset();
    };
    std::unique_ptr<cuda::CapturedStep> captured;
    if (reports.capture)
        captured = std::make_unique<cuda::CapturedStep>([&](std::span<const Tensor> in) {
            step_x = &in[0];
            step_y = &in[1];
            forward();
            backward();
            const Tensor value = loss.value();
            update();
            step_x = &x;
            step_y = &y;
            return value;
        });
    const std::vector<Tensor> step_inputs = {x, y};
    const auto one_step = [&] {
        if (captured) {
            captured->run(step_inputs);
            return;
        }
        forward();
        backward();
        update();
    };
    for (int i = 0; i < warmup; ++i) one_step();
    synchronize(device);
    group.barrier();
    // Several windows, the median reported with the fastest and slowest: a window of a small model lasts a few
    // milliseconds, where one stall of the host (or of a peer) moves the mean by tens of percent.
    std::vector<double> windows;
    for (int r = 0; r < reports.repeats; ++r) {
        const auto start = Clock::now();
        for (int i = 0; i < steps; ++i) one_step();
        synchronize(device);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps;
        Tensor mean_ms = Tensor::full({1}, ms, DType::f64, device);  // the ranks run in lockstep: their mean
        group.all_reduce(mean_ms, dist::ReduceOp::Avg);
        windows.push_back(mean_ms.item());
    }
    std::sort(windows.begin(), windows.end());
    const double step_ms = windows[windows.size() / 2];
    // Rank 0's peak: the ranks hold the same but for ZeRO's padding (at most W - 1 elements, on the last ranks).
    const std::string peak =
        device.is_cuda()
            ? str(" peak_mib=", static_cast<double>(cuda::memory_stats(device.index).peak_bytes_in_use) / (1024.0 * 1024.0))
            : "";
    const std::string compression =
        ddp && ddp_options.compression ? str(" compression=", dtype_name(*ddp_options.compression)) : "";
    if (reports.phases) {
        // Each phase alone: the host's time to queue it, then the time until the device finished it (a
        // host-bound phase shows both nearly equal; a device-bound one a small host part).
        double host[3] = {}, done[3] = {};
        const std::function<void()> parts[3] = {forward, backward, update};
        for (int i = 0; i < steps; ++i)
            for (int p = 0; p < 3; ++p) {
                const auto begin = Clock::now();
                parts[p]();
                host[p] += std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
                synchronize(device);
                done[p] += std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
            }
        if (group.rank() == 0)
            std::printf("phases model=%s world=%d mode=%s overlap=%d forward_host_ms=%.4f forward_ms=%.4f "
                        "backward_host_ms=%.4f backward_ms=%.4f update_host_ms=%.4f update_ms=%.4f\n",
                        w.name.c_str(), group.world_size(), mode.c_str(), group.world_size() > 1 && !zero ? int(overlap) : 0,
                        host[0] / steps, done[0] / steps, host[1] / steps, done[1] / steps, host[2] / steps,
                        done[2] / steps);
    }
    if (group.rank() == 0)
        std::printf("step model=%s world=%d mode=%s optim=%s overlap=%d batch_per_gpu=%lld step_ms=%.4f "
                    "step_ms_min=%.4f step_ms_max=%.4f samples_per_s=%.1f%s%s\n",
                    w.name.c_str(), group.world_size(), mode.c_str(), zero || adamw ? "adamw" : "sgd",
                    group.world_size() > 1 && !zero ? int(overlap) : 0, static_cast<long long>(w.batch), step_ms,
                    windows.front(), windows.back(),
                    1000.0 * static_cast<double>(w.batch * group.world_size()) / step_ms,
                    peak.c_str(), compression.c_str());
    if (group.rank() == 0 && captured) std::printf("# captured: the step above is one CUDA-graph replay\n");
    std::fflush(stdout);
    if (reports.kernel_times && device.is_cuda()) {
        // Every rank traces (the steps are collectives); rank 0 reports. Each step alone: synchronised before
        // and after, so the trace's boundaries fall between steps.
        bench::KernelTrace trace;
        for (int i = 0; i < 10; ++i) {
            one_step();
            synchronize(device);
            trace.mark();
        }
        const bench::StepKernelTimes times = bench::summarize(trace.stop());
        if (group.rank() == 0) {
            bench::print_kernel_times(str(w.name, "_world", group.world_size()), mode, times, false);
            bench::print_kernels_by_name(times, 25);
        }
    }
}

void allreduce_bench(dist::ProcessGroup& group, int steps, std::int64_t largest) {
    if (group.world_size() < 2) return;
    for (std::int64_t bytes = 1 << 16; bytes <= largest; bytes *= 4) {
        Tensor t = Tensor::ones({bytes / 4}, DType::f32, group.device());
        for (int i = 0; i < 3; ++i) group.all_reduce(t);
        synchronize(group.device());
        group.barrier();
        const auto start = Clock::now();
        for (int i = 0; i < steps; ++i) group.all_reduce(t);
        synchronize(group.device());
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps;
        const double algbw = static_cast<double>(bytes) / (ms * 1e6);
        const int n = group.world_size();
        if (group.rank() == 0)
            std::printf("allreduce bytes=%lld world=%d ms=%.4f algbw_GBps=%.2f busbw_GBps=%.2f\n",
                        static_cast<long long>(bytes), n, ms, algbw, algbw * 2.0 * (n - 1) / n);
        std::fflush(stdout);
    }
}

// "0,1,2,3" -> {0, 1, 2, 3}; UsageError for anything but 0 (DDP with AdamW) and stages 1 to 3.
std::vector<int> parse_stages(const std::string& text) {
    std::vector<int> stages;
    std::stringstream list(text);
    for (std::string item; std::getline(list, item, ',');)
        stages.push_back(static_cast<int>(cli::parse_int("--zero", item, 0, 3)));
    if (stages.empty()) throw cli::UsageError("--zero: expected stages such as 0,1,2,3");
    return stages;
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 30, warmup = 5;
    std::string only;
    std::vector<int> stages;
    bool tiny = false, zero_recompute = false, zero_no_prefetch = false;
    Reports reports;
    dist::DDPOptions ddp_options;
    try {
        const cli::Arguments args(argc, argv, {.flags = {"--tiny", "--phases", "--kernel-times", "--gradient-as-bucket-view", "--zero-recompute", "--no-zero-prefetch", "--capture"}, .options = {"--steps", "--warmup", "--only", "--zero", "--bucket-cap-mb", "--first-bucket-cap-mb", "--ddp-compression", "--repeats"}});
        tiny = args.has("--tiny");
        reports.phases = args.has("--phases");
        reports.kernel_times = args.has("--kernel-times");
        reports.capture = args.has("--capture");
        if (reports.kernel_times && !bench::kernel_trace_available())
            throw cli::UsageError("--kernel-times: this build has no CUPTI (CUDA::cupti was not found)");
        ddp_options.gradient_as_bucket_view = args.has("--gradient-as-bucket-view");
        if (auto v = args.value("--steps")) steps = static_cast<int>(cli::parse_int("--steps", *v, 1, 100000));
        if (auto v = args.value("--repeats")) reports.repeats = static_cast<int>(cli::parse_int("--repeats", *v, 1, 1000));
        if (auto v = args.value("--warmup")) warmup = static_cast<int>(cli::parse_int("--warmup", *v, 0, 100000));
        if (auto v = args.value("--only")) only = cli::parse_choice("--only", *v, {"mlp", "lenet", "gpt", "allreduce"});
        if (auto v = args.value("--zero")) stages = parse_stages(*v);
        zero_recompute = args.has("--zero-recompute");
        zero_no_prefetch = args.has("--no-zero-prefetch");
        if (zero_no_prefetch && (zero_recompute || std::find(stages.begin(), stages.end(), 3) == stages.end()))
            throw cli::UsageError("--no-zero-prefetch goes with --zero 3, without --zero-recompute");
        if (zero_recompute && std::find(stages.begin(), stages.end(), 3) == stages.end())
            throw cli::UsageError("--zero-recompute goes with --zero 3");
        if (reports.capture && (!stages.empty() || reports.phases))
            throw cli::UsageError("--capture: for the DDP rows (not with --zero) and the whole step (not with --phases)");
        if (auto v = args.value("--ddp-compression"))
            ddp_options.compression = cli::parse_choice("--ddp-compression", *v, {"bf16", "f16"}) == "bf16" ? DType::bf16 : DType::f16;
        if (auto v = args.value("--bucket-cap-mb")) ddp_options.bucket_cap_mb = cli::parse_real("--bucket-cap-mb", *v, 1e-3, 1e6);
        if (auto v = args.value("--first-bucket-cap-mb"))
            ddp_options.first_bucket_cap_mb = cli::parse_real("--first-bucket-cap-mb", *v, 1e-3, 1e6);
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "dyngrad-dist-bench: %s\nusage: mpirun -np N dyngrad-dist-bench [--steps N] [--warmup N] [--repeats R] "
                             "[--only mlp|lenet|gpt|allreduce] [--zero 0,1,2,3 [--zero-recompute | --no-zero-prefetch]] [--tiny] [--phases] [--kernel-times] [--capture] [--bucket-cap-mb MB] "
                             "[--first-bucket-cap-mb MB] [--gradient-as-bucket-view] [--ddp-compression bf16|f16]\n", e.what());
        return 2;
    }
    try {
        dist::ProcessGroup group = dist::ProcessGroup::init();
        if (group.device().is_cpu() && !tiny)
            throw DeviceError("dyngrad-dist-bench needs a CUDA device per rank (the CPU: only with --tiny)");
        if (group.rank() == 0)
            std::printf("# %s, %s, NCCL_NVLS_ENABLE=%s\n", group.describe().c_str(),
                        group.device().is_cuda() ? cuda::device_name(group.device().index).c_str() : "CPU",
                        std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)");
        const std::int64_t width = tiny ? 64 : 4096;
        const GPTConfig gpt = tiny ? GPTConfig{.vocab_size = kGptVocabulary, .context = 16, .layers = 2, .heads = 2,
                                               .width = 32, .dropout = 0.0}
                                   : GPTConfig{.vocab_size = kGptVocabulary, .context = 256, .layers = 6, .heads = 6,
                                               .width = 384, .dropout = 0.0};
        const auto mlp = [width](Generator& gen) {
            return classifier(models::make_mlp({width, width, width, width, width}, gen));
        };
        const auto lenet = [](Generator& gen) { return classifier(models::make_model("lenet", 28, 28, gen)); };
        const auto gpt_model = [gpt](Generator& gen) { return char_gpt(gen, gpt); };
        const auto vectors = [width](Generator& gen, std::int64_t batch) { return images(gen, batch, {width}); };
        const auto digits = [](Generator& gen, std::int64_t batch) { return images(gen, batch, {1, 28, 28}); };
        const auto windows = [gpt](Generator& gen, std::int64_t batch) { return tokens(gen, batch, gpt.context); };
        const std::vector<Workload> workloads = {
            {"mlp4096x4_f32", false, DType::f32, false, tiny ? 32 : 4096, mlp, vectors},
            {"mlp4096x4_tf32", true, DType::f32, false, tiny ? 32 : 4096, mlp, vectors},
            {"lenet_b256", false, DType::f32, false, tiny ? 8 : 256, lenet, digits},
            {"gpt_char_bf16", false, DType::bf16, true, tiny ? 4 : 32, gpt_model, windows}};
        for (const Workload& w : workloads) {
            if (!only.empty() && w.name.rfind(only, 0) != 0) continue;
            for (int stage : stages)  // the sharded rows: DDP with AdamW (0), the ZeRO stages
                step_bench(group, w, stage == 0 ? "ddp" : stage == 3 && zero_recompute ? "zero3r" : stage == 3 && zero_no_prefetch ? "zero3np" : str("zero", stage), true,
                           stage == 0, steps, warmup, reports, ddp_options);
            if (!stages.empty()) continue;
            step_bench(group, w, "ddp", w.adamw, true, steps, warmup, reports, ddp_options);
            if (group.world_size() > 1) step_bench(group, w, "ddp", w.adamw, false, steps, warmup, reports, ddp_options);
        }
        if (stages.empty() && (only.empty() || only == "allreduce")) allreduce_bench(group, tiny ? 3 : 20, tiny ? std::int64_t{1} << 20 : std::int64_t{1} << 30);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dyngrad-dist-bench: error: %s\n", e.what());
        return 1;
    }
}
