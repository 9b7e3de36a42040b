// dyngrad-dist-bench: data-parallel training steps on 1 or N GPUs (mpirun -np N, one process per GPU) and the
// all-reduce bandwidth, for scripts/run-dist-bench.sh, which runs bench/torch_ddp.py on the same workloads under
// torchrun and compares. Rank 0 prints one line per result:
//   step model=mlp4096x4_f32 world=2 overlap=1 batch_per_gpu=4096 step_ms=12.3 samples_per_s=665000
//   allreduce bytes=67108864 world=2 ms=0.41 algbw_GBps=163 busbw_GBps=163
// Workloads (per GPU): mlp4096x4 (4 linear layers 4096→4096, ReLU between, batch 4096) in f32 and TF32; lenet
// (nn/models.h) on (256,1,28,28). World 1 trains without DDP (the baseline); world N with DDP, with
// overlap (buckets all-reduced during the backward) and without (every bucket after it). SGD with momentum,
// cross-entropy over 10 classes, random data fixed per rank.
//   mpirun -np 2 dyngrad-dist-bench [--steps 30] [--warmup 5] [--only mlp|lenet|allreduce]
#include <dyngrad/cuda/runtime.h>
#include <dyngrad/distributed/ddp.h>
#include <dyngrad/dyngrad.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../cli/command_line.h"
#include "dyngrad/nn/models.h"

using namespace dyngrad;
using Clock = std::chrono::steady_clock;

namespace {

struct Workload {
    std::string name;
    bool tf32;
    std::int64_t batch;
    std::function<Sequential(Generator&)> make;
    Shape sample;
};

void step_bench(dist::ProcessGroup& group, const Workload& w, bool overlap, int steps, int warmup) {
    const Device device = group.device();
    cuda::set_allow_tf32(w.tf32);
    Generator init(1);
    Sequential model = w.make(init);
    model.to(device);
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    if (group.world_size() > 1) ddp = std::make_unique<dist::DistributedDataParallel>(model, group, dist::DDPOptions{.overlap = overlap});
    SGD sgd(model.parameters(), {.lr = 1e-3, .momentum = 0.9});
    Generator data(100 + static_cast<std::uint64_t>(group.rank()));
    Shape shape{w.batch};
    shape.insert(shape.end(), w.sample.begin(), w.sample.end());
    const Tensor x = Tensor::uniform(shape, -1, 1, data).to(device);
    std::vector<std::int64_t> labels;
    for (std::int64_t i = 0; i < w.batch; ++i) labels.push_back(static_cast<std::int64_t>(data.engine()() % 10));
    const Tensor y = Tensor::from_vector(labels, {w.batch}).to(device);
    const auto one_step = [&] {
        ComputeGraph graph;
        const Var loss = cross_entropy(model(graph.input(x)), graph.input(y));
        if (ddp) ddp->backward(graph, loss, {.free_values = true});
        else graph.backward(loss, {.free_values = true});
        sgd.step();
        sgd.zero_grad();
    };
    for (int i = 0; i < warmup; ++i) one_step();
    cuda::synchronize(device.index);
    group.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < steps; ++i) one_step();
    cuda::synchronize(device.index);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps;
    Tensor mean_ms = Tensor::full({1}, ms, DType::f64, device);  // the ranks run in lockstep: their mean
    group.all_reduce(mean_ms, dist::ReduceOp::Avg);
    const double step_ms = mean_ms.item();
    if (group.rank() == 0)
        std::printf("step model=%s world=%d overlap=%d batch_per_gpu=%lld step_ms=%.4f samples_per_s=%.1f\n",
                    w.name.c_str(), group.world_size(), group.world_size() > 1 ? int(overlap) : 0,
                    static_cast<long long>(w.batch), step_ms,
                    1000.0 * static_cast<double>(w.batch * group.world_size()) / step_ms);
    std::fflush(stdout);
}

void allreduce_bench(dist::ProcessGroup& group, int steps) {
    if (group.world_size() < 2) return;
    for (std::int64_t bytes = 1 << 16; bytes <= (std::int64_t{1} << 30); bytes *= 4) {
        Tensor t = Tensor::ones({bytes / 4}, DType::f32, group.device());
        for (int i = 0; i < 3; ++i) group.all_reduce(t);
        cuda::synchronize(group.device().index);
        group.barrier();
        const auto start = Clock::now();
        for (int i = 0; i < steps; ++i) group.all_reduce(t);
        cuda::synchronize(group.device().index);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps;
        const double algbw = static_cast<double>(bytes) / (ms * 1e6);
        const int n = group.world_size();
        if (group.rank() == 0)
            std::printf("allreduce bytes=%lld world=%d ms=%.4f algbw_GBps=%.2f busbw_GBps=%.2f\n",
                        static_cast<long long>(bytes), n, ms, algbw, algbw * 2.0 * (n - 1) / n);
        std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 30, warmup = 5;
    std::string only;
    try {
        const cli::Arguments args(argc, argv, {.options = {"--steps", "--warmup", "--only"}});
        if (auto v = args.value("--steps")) steps = static_cast<int>(cli::parse_int("--steps", *v, 1, 100000));
        if (auto v = args.value("--warmup")) warmup = static_cast<int>(cli::parse_int("--warmup", *v, 0, 100000));
        if (auto v = args.value("--only")) only = cli::parse_choice("--only", *v, {"mlp", "lenet", "allreduce"});
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "dyngrad-dist-bench: %s\nusage: mpirun -np N dyngrad-dist-bench [--steps N] [--warmup N] "
                             "[--only mlp|lenet|allreduce]\n", e.what());
        return 2;
    }
    try {
        dist::ProcessGroup group = dist::ProcessGroup::init();
        if (group.device().is_cpu()) throw DeviceError("dyngrad-dist-bench needs a CUDA device per rank");
        if (group.rank() == 0)
            std::printf("# %s, %s, NCCL_NVLS_ENABLE=%s\n", group.describe().c_str(),
                        cuda::device_name(group.device().index).c_str(),
                        std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)");
        const auto mlp = [](Generator& gen) { return models::make_mlp({4096, 4096, 4096, 4096, 4096}, gen); };
        const auto lenet = [](Generator& gen) { return models::make_model("lenet", 28, 28, gen); };
        const std::vector<Workload> workloads = {{"mlp4096x4_f32", false, 4096, mlp, {4096}},
                                                 {"mlp4096x4_tf32", true, 4096, mlp, {4096}},
                                                 {"lenet_b256", false, 256, lenet, {1, 28, 28}}};
        for (const Workload& w : workloads) {
            if (!only.empty() && w.name.rfind(only, 0) != 0) continue;
            step_bench(group, w, true, steps, warmup);
            if (group.world_size() > 1) step_bench(group, w, false, steps, warmup);
        }
        if (only.empty() || only == "allreduce") allreduce_bench(group, 20);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dyngrad-dist-bench: error: %s\n", e.what());
        return 1;
    }
}
