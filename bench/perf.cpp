// dyngrad-perf: training steps timed on the GPU, eager and captured, for the side-by-side comparison with
// PyTorch of issue 7. bench/torch_reference.py runs the same workloads with the same measurement,
// bench/compare_perf.py prints the table, scripts/run-perf.sh runs all three.
//
// Workloads (names shared with torch_reference.py):
//   lenet5_b1, lenet5_b64, lenet_b256   nn/models.h's lenet5 / lenet on (N,1,28,28)
//   mlp784_b64                          784→256→256→10 with ReLU, (64,784)
//   mlp4096_fp32, mlp4096_tf32          4096→4096→4096→4096→4096 with ReLU, (4096,4096), 4096 classes;
//                                       float32, then TF32 GEMMs (cuda::set_allow_tf32)
//   matmul_relu                         x (100,100) @ w (100,50), ReLU, sum, backward: dx, dw (no optimizer)
//   mul64m                              y = a·b of two 64M-element float32 vectors, backward from a given dy
//   written_norm_softmax                x (256,1024): a layer norm (weight, no bias) and a softmax written out of
//                                       pointwise ops, means, a max and a sum over the last axis, @ w (1024,16),
//                                       sum, backward: dx, dweight, dw (no optimizer; the fusion's row programs)
//   lenet5_b64_bf16, mlp4096_bf16,     lenet5_b64 / mlp4096 under AutocastGuard (graph/autocast.h): GEMMs and
//   mlp4096_f16                         convolutions in bf16/f16 on tensor cores, f32 master weights and loss;
//                                       f16 scales the loss with a GradScaler (torch.autocast + GradScaler)
//   lenet5_b64_full, mlp784_b64_full    (only with --only; no PyTorch counterpart) lenet5_b64 / mlp784_b64 with
//                                       everything a real training step has (issue 15): dropout 0.1 on the
//                                       logits, clip_grad_norm_and_step(1.0) of AdamW (lr 1e-3, wd 0.01), WarmupCosineLR
//                                       stepped per step; its captured row against the captured SGD row of the
//                                       same model is the "at least as fast" target.
//   lenet5_b64_adamw, mlp784_b64_adamw  (only with --only) the exact configuration: the _full rows
//                                       without clipping (dropout 0.1 on the logits, AdamW step(), WarmupCosineLR
//                                       stepped per step).
// A training step is forward, cross-entropy, backward, SGD update (lr 0.01, no momentum) on random inputs
// and labels resident on the GPU. Modes:
//   eager     the graph is recorded anew every step (the dynamic case);
//   captured  the same step function through cuda::CapturedStep: run() copies the inputs into the
//             variant's static buffers and replays the CUDA graph captured on the second run. mul64m
//             reads a, b, dy from the closure (their addresses never change; copying 768 MB per step would
//             swamp what is measured) and passes a 1-element input only to key the variant.
//
// Timing (torch_reference.py does exactly the same): W warm-up steps; a probe of 3 steps sizes K, the
// steps of one repetition, so that a repetition lasts at least 20 ms (K in [10, 200]); R repetitions,
// each timed by the host clock from a synchronised device to the return of cudaDeviceSynchronize() after
// its K steps (torch.cuda.synchronize() is the same call), so both sides time the host's recording and
// dispatch and the GPU's work of K whole steps. The figure: median over R of (repetition time / K).
// Memory: cudaDeviceSynchronize, reset_peak_memory, one step, cudaDeviceSynchronize, then the allocator's
// peak_bytes_in_use: ABSOLUTE, i.e. parameters, optimizer state, inputs and static buffers included,
// like PyTorch's max_memory_allocated() after reset_peak_memory_stats(). A replay allocates nothing, so in
// captured mode both sides count the tensors alive across the step; the graph's working memory sits in
// its private pool (reported apart: capture_reserved_bytes; PyTorch's lies in memory_reserved()).
// Host overhead: see host_overhead() below.
//
// Usage: dyngrad-perf [--json FILE] [--only NAME[,NAME...]] [--quick] [--list]
//   e.g. dyngrad-perf --only lenet5_b64,lenet5_b64_full,lenet5_b64_adamw,mlp784_b64,mlp784_b64_full,mlp784_b64_adamw
// Exit status: 0 all measured, 1 a workload failed (its row carries the error), 2 usage or setup error,
// 77 no CUDA device.
#include <dyngrad/dyngrad.h>
#include <dyngrad/cuda/capture.h>
#include <dyngrad/graph/fusion_plan.h>

#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <tuple>
#include <sstream>
#include <string>
#include <vector>

#include "../cli/command_line.h"
#include "dyngrad/nn/models.h"
#include "kernel_trace.h"

cudaError_t launch_empty_kernels(int count, cudaStream_t stream);  // bench/perf_launch.cu
cudaError_t graph_kernel_node_us(int count, int repetitions, cudaStream_t stream, double* us_per_node);

using namespace dyngrad;

namespace {

using Clock = std::chrono::steady_clock;

#define BENCH_CHECK(expr)                                                                   \
    do {                                                                                    \
        if ((expr) != 0) throw Error(str("bench: ", #expr, " failed at line ", __LINE__)); \
    } while (0)

struct Settings {
    int warmup = 5;
    int repetitions = 7;
    double min_repetition_ms = 20;
    int min_steps = 10;
    int max_steps = 200;
    int probe_steps = 3;
    int chain = 2000;              // host overhead: ops per chain
    int chain_repetitions = 9;
};

Settings quick_settings() {
    return {.warmup = 3, .repetitions = 3, .min_repetition_ms = 5, .min_steps = 3, .max_steps = 20, .probe_steps = 2,
            .chain = 500, .chain_repetitions = 3};
}

void device_sync() { BENCH_CHECK(cudaDeviceSynchronize()); }

double ms_since(Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

struct Timing {
    double ms = 0;  // per step: the median over repetitions
    int steps = 0;  // K
    std::vector<double> samples_ms;
};

// See the top of the file.
Timing time_steps(const std::function<void()>& body, const Settings& s) {
    for (int i = 0; i < s.warmup; ++i) body();
    device_sync();
    auto start = Clock::now();
    for (int i = 0; i < s.probe_steps; ++i) body();
    device_sync();
    const double estimate = std::max(ms_since(start) / s.probe_steps, 1e-6);
    Timing t;
    t.steps = std::clamp(static_cast<int>(std::ceil(s.min_repetition_ms / estimate)), s.min_steps, s.max_steps);
    for (int r = 0; r < s.repetitions; ++r) {
        start = Clock::now();
        for (int i = 0; i < t.steps; ++i) body();
        device_sync();
        t.samples_ms.push_back(ms_since(start) / t.steps);
    }
    t.ms = median(t.samples_ms);
    return t;
}

struct Memory {
    std::size_t before_bytes = 0, peak_bytes = 0, reserved_bytes = 0;
    std::size_t capture_reserved_bytes = 0;  // captured steps' private pools (their graphs' working memory)
};

Memory step_memory(const std::function<void()>& body) {
    device_sync();
    Memory m;
    m.before_bytes = cuda::memory_stats(0).bytes_in_use;
    cuda::reset_peak_memory(0);
    body();
    device_sync();
    const cuda::MemoryStats stats = cuda::memory_stats(0);
    m.peak_bytes = stats.peak_bytes_in_use;
    m.reserved_bytes = stats.pool_reserved_bytes;
    m.capture_reserved_bytes = stats.capture_reserved_bytes;
    return m;
}

// ---- workloads ----

using StepFn = std::function<Tensor(std::span<const Tensor>)>;

// A workload ready to run: the step on `inputs`, holding its model, optimizer and data.
// What one step must at least do, for the distance-to-floor report: floating-point operations of its GEMMs and
// convolutions (forward, and backward only for the operands that need a gradient), and an estimate of the bytes
// it must move (every op's inputs read and output written once forward and once more backward, and the
// optimizer's read of parameters and gradients and write of parameters).
struct Work {
    double flops = 0;
    double bytes = 0;
};

struct Prepared {
    std::vector<Tensor> inputs;
    StepFn step;
    std::function<Work()> work;
};

double nbytes(const Tensor& t) { return static_cast<double>(t.nbytes()); }

// Work of a recorded forward pass (see Work), walking its nodes.
Work forward_work(const ComputeGraph& graph) {
    Work w;
    for (NodeId id = 0; id < graph.size(); ++id) {
        const ComputeNode& node = graph.node(id);
        if (node.op == OpType::Leaf) continue;
        double traffic = nbytes(node.value);
        for (const NodeInput& in : node.inputs) traffic += nbytes(graph.node(in.id).value);
        w.bytes += node.requires_grad ? 2 * traffic : traffic;
        double macs = 0;  // multiply-adds of the forward
        const double out = static_cast<double>(node.value.numel());
        if (node.op == OpType::Matmul || node.op == OpType::Linear) {
            macs = out * static_cast<double>(graph.node(node.inputs[0].id).value.shape().back());
        } else if (node.op == OpType::Conv2d) {
            const Tensor& weight = graph.node(node.inputs[1].id).value;
            macs = out * static_cast<double>(weight.numel()) / static_cast<double>(weight.shape()[0]);
        }
        if (macs == 0) continue;
        double passes = 1;  // forward, then one GEMM per operand that needs a gradient
        for (std::size_t k = 0; k < std::min<std::size_t>(node.inputs.size(), 2); ++k)
            passes += graph.node(node.inputs[k].id).requires_grad ? 1 : 0;
        w.flops += 2 * macs * passes;
    }
    return w;
}

struct Workload {
    std::string name;
    std::string description;
    std::function<Prepared()> prepare;
    bool tf32 = false;
    double bytes_per_step = 0;  // > 0: report bandwidth over these minimum bytes
    bool opt_in = false;        // run only when named by --only
};

const Device kGpu = Device::cuda(0);

// Random inputs of `input_shape` in [-1, 1) and labels in [0, classes), on the GPU. `precision` bf16/f16: the
// forward under autocast into it (f16 with loss scaling); f32: no autocast.
Prepared training(Sequential model, const Shape& input_shape, std::int64_t classes,
                  DType precision = DType::f32) {
    model.to(kGpu);
    auto optimizer = std::make_shared<SGD>(model.parameters(), SgdOptions{.lr = 0.01});
    auto scaler = std::make_shared<GradScaler>(GradScalerOptions{.enabled = precision == DType::f16});
    Generator gen(7);
    const Tensor x = Tensor::uniform(input_shape, -1, 1, gen).to(kGpu);
    std::vector<std::int64_t> labels(static_cast<std::size_t>(input_shape[0]));
    for (std::int64_t& label : labels) label = static_cast<std::int64_t>(gen.engine()() % static_cast<std::uint64_t>(classes));
    const Tensor y = Tensor::from_vector(labels, {input_shape[0]}).to(kGpu);
    StepFn step = [model, optimizer, scaler, precision](std::span<const Tensor> in) {
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(precision);  // f32: off
            loss = cross_entropy(model(graph.input(in[0], "x")), graph.input(in[1], "labels"));
        }
        // The loss before the sweep: with loss scaling it is an inner node, whose value free_values releases.
        const Tensor loss_value = loss.value();
        // Activations are released as the sweep passes them, as PyTorch's backward frees saved tensors.
        graph.backward(scaler->scale(loss), {.free_values = true});
        if (scaler->enabled()) {
            scaler->step(*optimizer);
            scaler->update();
        } else {
            optimizer->step();
        }
        optimizer->zero_grad();
        return loss_value;
    };
    std::function<Work()> work = [model, x, precision] {
        ComputeGraph graph;
        const AutocastGuard autocast(precision);
        static_cast<void>(model(graph.input(x, "x")));
        Work w = forward_work(graph);
        for (const Parameter& p : model.parameters()) w.bytes += 3 * nbytes(p.value());  // SGD: read p, g; write p
        return w;
    };
    return {{x, y}, step, work};
}

// training() with everything a real step has: dropout on the logits, clipping (`clip`), AdamW, a per-step
// schedule.
Prepared full_training(Sequential body, const Shape& input_shape, std::int64_t classes, bool clip = true) {
    Sequential model;
    model.add(body).add(Dropout(0.1, 1));
    model.to(kGpu);
    auto optimizer = std::make_shared<AdamW>(model.parameters(), AdamOptions{.lr = 1e-3, .weight_decay = 0.01});
    auto schedule = std::make_shared<WarmupCosineLR>(*optimizer, 100, 100'000, 1e-5);
    Prepared p = training(model, input_shape, classes);  // the inputs; its SGD step is replaced
    p.step = [model, optimizer, schedule, clip](std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var loss = cross_entropy(model(graph.input(in[0], "x")), graph.input(in[1], "labels"));
        graph.backward(loss, {.free_values = true});
        if (clip)
            optimizer->clip_grad_norm_and_step(1.0);  // clip_grad_norm + step(), the scaling fused into the step
        else
            optimizer->step();
        schedule->step();
        optimizer->zero_grad();
        return loss.value();
    };
    return p;
}

Prepared matmul_relu() {
    Generator gen(42);
    const Tensor x = Tensor::uniform({100, 100}, 0, 1, gen).to(kGpu);
    const Tensor w = Tensor::uniform({100, 50}, 0, 1, gen).to(kGpu);
    StepFn step = [](std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var x = graph.input(in[0], "x", true);
        const Var w = graph.input(in[1], "w", true);
        const Var loss = sum(relu(matmul(x, w)));
        graph.backward(loss);  // dx (100,100), dw (100,50)
        return loss.value();
    };
    std::function<Work()> work = [x, w] {
        ComputeGraph graph;
        static_cast<void>(sum(relu(matmul(graph.input(x, "x", true), graph.input(w, "w", true)))));
        return forward_work(graph);
    };
    return {{x, w}, step, work};
}

// A layer norm and a softmax written out of pointwise ops and row reductions (no fused norm or softmax op), as a
// user's own normalisation is: issue 33's pointwise + row-reduction patterns, the fusion compiler's row programs.
Var written_norm_softmax_loss(ComputeGraph& graph, std::span<const Tensor> in) {
    const Var x = graph.input(in[0], "x", true);
    const Var weight = graph.input(in[1], "weight", true);
    const Var w = graph.input(in[2], "w", true);
    const Var centred = sub(x, mean(x, {-1}, true));
    const Var inverse = pow(add_scalar(mean(mul(centred, centred), {-1}, true), 1e-5), -0.5);
    const Var normed = mul(mul(centred, inverse), weight);
    const Var exps = exp(sub(normed, max(normed, -1, true)));
    const Var probs = div(exps, sum(exps, {-1}, true));
    return sum(matmul(probs, w));
}

Prepared written_norm_softmax() {
    Generator gen(7);
    const std::vector<Tensor> inputs = {Tensor::uniform({256, 1024}, -1, 1, gen).to(kGpu),
                                        Tensor::uniform({1024}, 0.5, 1.5, gen).to(kGpu),
                                        Tensor::uniform({1024, 16}, -1, 1, gen).to(kGpu)};
    StepFn step = [](std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var loss = written_norm_softmax_loss(graph, in);
        graph.backward(loss);  // dx, dweight, dw
        return loss.value();
    };
    std::function<Work()> work = [inputs] {
        ComputeGraph graph;
        static_cast<void>(written_norm_softmax_loss(graph, inputs));
        return forward_work(graph);
    };
    return {inputs, step, work};
}

constexpr std::int64_t kMulElements = 64LL << 20;

Prepared mul64m() {
    Generator gen(1);
    const Tensor a = Tensor::uniform({kMulElements}, -1, 1, gen).to(kGpu);
    const Tensor b = Tensor::uniform({kMulElements}, -1, 1, gen).to(kGpu);
    const Tensor dy = Tensor::uniform({kMulElements}, -1, 1, gen).to(kGpu);
    StepFn step = [a, b, dy](std::span<const Tensor>) {
        ComputeGraph graph;
        const Var va = graph.input(a, "a", true);
        const Var vb = graph.input(b, "b", true);
        const Var y = mul(va, vb);
        graph.backward(y, dy);  // da = dy·b, db = dy·a
        return y.value();
    };
    // fwd reads a, b, writes y; bwd reads dy, a, b, writes da, db.
    std::function<Work()> work = [] { return Work{static_cast<double>(3 * kMulElements), 8.0 * 4.0 * kMulElements}; };
    return {{Tensor::zeros({1}, DType::f32, kGpu)}, step, work};
}

std::vector<Workload> workloads() {
    auto model = [](const char* name, std::int64_t batch) {
        return [name, batch] {
            Generator gen(0);
            return training(models::make_model(name, 28, 28, gen), {batch, 1, 28, 28}, kMnistClasses);
        };
    };
    auto mlp = [](std::vector<std::int64_t> widths, std::int64_t batch, DType precision = DType::f32) {
        return [widths, batch, precision] {
            Generator gen(0);
            return training(models::make_mlp(widths, gen), {batch, widths.front()}, widths.back(), precision);
        };
    };
    auto reduced_model = [](const char* name, std::int64_t batch, DType precision) {
        return [name, batch, precision] {
            Generator gen(0);
            return training(models::make_model(name, 28, 28, gen), {batch, 1, 28, 28}, kMnistClasses, precision);
        };
    };
    auto full = [](const char* name, std::int64_t batch, bool clip = true) {
        return [name, batch, clip] {
            Generator gen(0);
            return full_training(models::make_model(name, 28, 28, gen), {batch, 1, 28, 28}, kMnistClasses, clip);
        };
    };
    auto full_mlp = [](std::vector<std::int64_t> widths, std::int64_t batch, bool clip = true) {
        return [widths, batch, clip] {
            Generator gen(0);
            return full_training(models::make_mlp(widths, gen), {batch, widths.front()}, widths.back(), clip);
        };
    };
    const std::vector<std::int64_t> wide = {4096, 4096, 4096, 4096, 4096};
    // fwd reads a, b, writes y; bwd reads dy, a, b, writes da, db: 8 vectors of 4 bytes.
    const double mul_bytes = 8.0 * 4.0 * static_cast<double>(kMulElements);
    return {
        {"lenet5_b1", "lenet5, batch 1, SGD step", model("lenet5", 1)},
        {"lenet5_b64", "lenet5, batch 64, SGD step", model("lenet5", 64)},
        {"lenet_b256", "lenet, batch 256, SGD step", model("lenet", 256)},
        {"mlp784_b64", "MLP 784-256-256-10, batch 64, SGD step", mlp({784, 256, 256, 10}, 64)},
        {"mlp4096_fp32", "MLP 4096x4 layers, batch 4096, float32, SGD step", mlp(wide, 4096)},
        {"mlp4096_tf32", "MLP 4096x4 layers, batch 4096, TF32 GEMMs, SGD step", mlp(wide, 4096), true},
        {"lenet5_b64_bf16", "lenet5, batch 64, bf16 autocast, SGD step", reduced_model("lenet5", 64, DType::bf16)},
        {"mlp4096_bf16", "MLP 4096x4 layers, batch 4096, bf16 autocast, SGD step", mlp(wide, 4096, DType::bf16)},
        {"mlp4096_f16", "MLP 4096x4 layers, batch 4096, f16 autocast + GradScaler, SGD step",
         mlp(wide, 4096, DType::f16)},
        {"matmul_relu", "x 100x100 @ w 100x50, ReLU, sum, backward (dx, dw)", matmul_relu},
        {"mul64m", "a*b of 64M floats, forward + backward", mul64m, false, mul_bytes},
        {"written_norm_softmax", "x 256x1024: layer norm and softmax written out, @ w 1024x16, sum, backward",
         written_norm_softmax},
        {"lenet5_b64_full", "lenet5, batch 64, dropout + clip + AdamW + warm-up/cosine", full("lenet5", 64), false, 0,
         true},
        {"mlp784_b64_full", "MLP 784-256-256-10, batch 64, dropout + clip + AdamW + warm-up/cosine",
         full_mlp({784, 256, 256, 10}, 64), false, 0, true},
        {"lenet5_b64_adamw", "lenet5, batch 64, dropout + AdamW + warm-up/cosine (no clipping)",
         full("lenet5", 64, false), false, 0, true},
        {"mlp784_b64_adamw", "MLP 784-256-256-10, batch 64, dropout + AdamW + warm-up/cosine (no clipping)",
         full_mlp({784, 256, 256, 10}, 64, false), false, 0, true},
    };
}

struct Row {
    std::string workload, mode, description;
    Timing timing;
    Memory memory;
    double gbs = 0, copy_fraction = 0;  // mul64m only
    std::string error;
    bool tf32 = false;
    Work work;
    cuda::CapturedStep::GraphCounts graph;  // captured rows: what one replay launches
};

// Device-to-device copy bandwidth (read + write) of a 64M-float buffer, timed like a step.
double copy_bandwidth_gbs(const Settings& s) {
    const Tensor src = Tensor::zeros({kMulElements}, DType::f32, kGpu);
    Tensor dst = Tensor::empty({kMulElements}, DType::f32, kGpu);
    const Timing t = time_steps([&] {
        BENCH_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDeviceToDevice, nullptr));
    }, s);
    return 2.0 * static_cast<double>(src.nbytes()) / (t.ms * 1e6);
}

Row measure(const Workload& w, bool captured, const Settings& s, double copy_gbs) {
    Row row{w.name, captured ? "captured" : "eager", w.description, {}, {}, 0, 0, "", w.tf32, {}, {}};
    cuda::set_allow_tf32(w.tf32);
    try {
        Prepared p = w.prepare();
        std::unique_ptr<cuda::CapturedStep> capture;
        if (captured) capture = std::make_unique<cuda::CapturedStep>(p.step);
        const std::function<void()> body = captured ? std::function<void()>([&] { capture->run(p.inputs); })
                                                    : std::function<void()>([&] { p.step(p.inputs); });
        row.timing = time_steps(body, s);
        row.memory = step_memory(body);
        cuda::synchronize(0);  // raises any error a kernel reported
        if (capture) row.graph = capture->last_graph_counts();
        if (p.work) row.work = p.work();
        if (w.bytes_per_step > 0) {
            row.gbs = w.bytes_per_step / (row.timing.ms * 1e6);
            row.copy_fraction = copy_gbs > 0 ? row.gbs / copy_gbs : 0;
        }
    } catch (const std::exception& e) {
        row.error = e.what();
    }
    cuda::set_allow_tf32(false);
    return row;
}

// --profile: one replay of each wanted workload's captured step between cudaProfilerStart/Stop, for
// `ncu --profile-from-start off dyngrad-perf --profile --only NAME` (per-kernel times of exactly one step).
void profile_one_replay(const Workload& w) {
    cuda::set_allow_tf32(w.tf32);
    Prepared p = w.prepare();
    cuda::CapturedStep capture(p.step);
    for (int i = 0; i < 3; ++i) capture.run(p.inputs);  // warm-up, capture, first replay
    device_sync();
    BENCH_CHECK(cudaProfilerStart());
    capture.run(p.inputs);
    device_sync();
    BENCH_CHECK(cudaProfilerStop());
    cuda::set_allow_tf32(false);
    std::printf("%s: profiled one replay of %zu kernels\n", w.name.c_str(), capture.last_graph_counts().kernels);
}

// The convolution passes searched since the log was cleared (ops/conv.h): per pass, cuDNN's candidates fastest
// first, then the graph API's engine configs, each with its time, workspace, tensor cores (tc) and determinism (det),
// and ops/conv.cu's verdict (with cuDNN's reason where a graph candidate failed or was refused).
void print_conv_searches() {
    std::string current;
    for (const ConvSearchEntry& e : conv_search_log()) {
        const std::string pass = str(e.convolution, ", ", e.pass);
        if (pass != current) {
            std::printf("    conv search: %s:\n", pass.c_str());
            current = pass;
        }
        std::printf("        %-22s %9.4f ms %8.2f MiB%s%s  %s%s%s\n", e.algorithm.c_str(), e.ms,
                    static_cast<double>(e.workspace_bytes) / (1 << 20), e.tensor_ops ? " tc" : "",
                    e.deterministic ? " det" : "", e.verdict.c_str(), e.detail.empty() ? "" : ": ",
                    e.detail.c_str());
    }
    std::fflush(stdout);
}

// --kernel-times: the device's kernels of `steps` steps (eager: recorded anew each time; captured: replays after the
// warm-up and the capture), each step alone (synchronised before and after), from CUPTI's trace (bench/kernel_trace.h).
void kernel_times(const Workload& w, bool captured, int steps, bool verbose) {
    clear_conv_search_log();
    cuda::set_allow_tf32(w.tf32);
    Prepared p = w.prepare();
    std::unique_ptr<cuda::CapturedStep> capture;
    if (captured) capture = std::make_unique<cuda::CapturedStep>(p.step);
    const auto body = [&] {
        if (capture) capture->run(p.inputs);
        else p.step(p.inputs);
    };
    for (int i = 0; i < 5; ++i) body();  // warm-up (captured: warm-up, capture, replays)
    device_sync();
    bench::KernelTrace trace;
    for (int i = 0; i < steps; ++i) {
        body();
        device_sync();
        trace.mark();
    }
    const auto per_step = trace.stop();
    cuda::synchronize(0);
    cuda::set_allow_tf32(false);
    bench::print_kernel_times(w.name, captured ? "captured" : "eager", bench::summarize(per_step), verbose);
    if (verbose) print_conv_searches();
}

// ---- host overhead ----

struct HostOverhead {
    int chain = 0;
    double cpu_record_us = 0, cpu_backward_us = 0;  // per op / per node, 1-element CPU tensors
    double cuda_record_us = 0, cuda_backward_us = 0;  // host time only, 1-element CUDA tensors
    double launch_us = 0;  // one bare launch of an empty kernel
};

// A chain x ← add(x, c) of s.chain ops on 1-element tensors: host µs per recorded op (forward: record,
// infer, allocate, run or launch the kernel) and per node of the backward sweep. On a GPU the clock
// stops before the device is synchronised: the launches are asynchronous, so this is host time alone.
std::pair<double, double> chain_us(Device device, const Settings& s) {
    const Tensor one = Tensor::ones({1}, DType::f32, device);
    std::vector<double> record, backward;
    for (int r = 0; r <= s.chain_repetitions; ++r) {  // repetition 0 warms up
        ComputeGraph graph;
        Var x = graph.input(one, "x", true);
        const Var c = graph.input(one, "c");
        auto start = Clock::now();
        for (int i = 0; i < s.chain; ++i) x = add(x, c);
        const double record_ms = ms_since(start);
        if (device.is_cuda()) device_sync();
        start = Clock::now();
        graph.backward(x);
        const double backward_ms = ms_since(start);
        if (device.is_cuda()) device_sync();
        if (r == 0) continue;
        record.push_back(1e3 * record_ms / s.chain);
        backward.push_back(1e3 * backward_ms / s.chain);
    }
    return {median(record), median(backward)};
}

double launch_us(const Settings& s) {
    cudaStream_t stream = nullptr;
    BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::vector<double> samples;
    for (int r = 0; r <= s.chain_repetitions; ++r) {
        const auto start = Clock::now();
        const cudaError_t status = launch_empty_kernels(s.chain, stream);
        const double ms = ms_since(start);
        BENCH_CHECK(status);
        BENCH_CHECK(cudaStreamSynchronize(stream));
        if (r > 0) samples.push_back(1e3 * ms / s.chain);
    }
    BENCH_CHECK(cudaStreamDestroy(stream));
    return median(samples);
}

HostOverhead host_overhead(const Settings& s) {
    HostOverhead h;
    h.chain = s.chain;
    std::tie(h.cpu_record_us, h.cpu_backward_us) = chain_us(Device::cpu(), s);
    std::tie(h.cuda_record_us, h.cuda_backward_us) = chain_us(kGpu, s);
    h.launch_us = launch_us(s);
    return h;
}

void print_host_overhead(const HostOverhead& h) {
    std::printf("\nhost overhead (chain of %d adds on 1-element tensors, median):\n", h.chain);
    std::printf("  (a) CPU tensors:  record + dispatch %.3f us/op, backward %.3f us/node\n", h.cpu_record_us,
                h.cpu_backward_us);
    std::printf("  (b) CUDA tensors: record + dispatch %.3f us/op, backward %.3f us/node (host time, GPU work "
                "excluded)\n", h.cuda_record_us, h.cuda_backward_us);
    std::printf("      of which one bare kernel launch costs %.3f us; (b) minus one launch: %.3f us/op\n", h.launch_us,
                h.cuda_record_us - h.launch_us);
    std::printf("  The <= 1 us/op target is (a): the engine's own cost to record and dispatch a node. (b) adds the\n"
                "  CUDA driver's launch (and the stream-ordered allocation) every GPU op pays in any framework;\n"
                "  (b) minus one launch is the engine's share on the GPU path.\n");
}

// ---- distance to the floors ----

// The GPU's floors, measured in this run: device time per kernel node of a replayed graph, the
// device-to-device copy bandwidth, and the FLOP rate of a large cuBLAS GEMM in exact float32 and in TF32.
struct Floors {
    double us_per_node = 0;
    double copy_gbs = 0;
    double gemm_tflops_f32 = 0, gemm_tflops_tf32 = 0;
};

double gemm_tflops(bool tf32, const Settings& s) {
    constexpr int n = 8192;
    const Tensor a = Tensor::ones({n, n}, DType::f32, kGpu);
    const Tensor b = Tensor::ones({n, n}, DType::f32, kGpu);
    Tensor c = Tensor::empty({n, n}, DType::f32, kGpu);
    cublasHandle_t handle = nullptr;
    BENCH_CHECK(cublasCreate(&handle));
    const float one = 1, zero = 0;
    const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    Settings gemm = s;
    gemm.min_steps = 1;
    gemm.max_steps = 5;
    const Timing t = time_steps([&] {
        BENCH_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.raw_data(), CUDA_R_32F, n,
                                 b.raw_data(), CUDA_R_32F, n, &zero, c.raw_data(), CUDA_R_32F, n, compute,
                                 CUBLAS_GEMM_DEFAULT));
    }, gemm);
    BENCH_CHECK(cublasDestroy(handle));
    return 2.0 * n * static_cast<double>(n) * n / (t.ms * 1e9);
}

Floors measure_floors(const Settings& s, double copy_gbs) {
    Floors f;
    cudaStream_t stream = nullptr;
    BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    BENCH_CHECK(graph_kernel_node_us(1000, 9, stream, &f.us_per_node));
    BENCH_CHECK(cudaStreamDestroy(stream));
    f.copy_gbs = copy_gbs > 0 ? copy_gbs : copy_bandwidth_gbs(s);
    f.gemm_tflops_f32 = gemm_tflops(false, s);
    f.gemm_tflops_tf32 = gemm_tflops(true, s);
    return f;
}

struct Distance {
    double launch_ms = 0, memory_ms = 0, compute_ms = 0;
    double floor_ms() const { return std::max({launch_ms, memory_ms, compute_ms}); }
    const char* bound() const {
        return floor_ms() == launch_ms ? "launches" : floor_ms() == memory_ms ? "memory" : "compute";
    }
};

Distance distance(const Row& r, const Floors& f) {
    Distance d;
    // The nodes a replay runs in sequence: its longest dependency path (the side lane's branches run beside it).
    const std::size_t sequential = r.graph.longest_chain > 0 ? r.graph.longest_chain
                                                              : r.graph.kernels + r.graph.memsets + r.graph.memcpys;
    d.launch_ms = static_cast<double>(sequential) * f.us_per_node * 1e-3;
    d.memory_ms = r.work.bytes / (f.copy_gbs * 1e6);
    d.compute_ms = r.work.flops / ((r.tf32 ? f.gemm_tflops_tf32 : f.gemm_tflops_f32) * 1e9);
    return d;
}

void print_floors(const std::vector<Row>& rows, const Floors& f) {
    std::printf("\ndistance to the floors (captured steps; floors measured in this run: %.3f us per kernel node of a\n"
                "replayed graph, %.1f GB/s device copy, cuBLAS 8192^3 GEMM %.1f TFLOP/s float32, %.1f TFLOP/s TF32):\n",
                f.us_per_node, f.copy_gbs, f.gemm_tflops_f32, f.gemm_tflops_tf32);
    std::printf("%-14s %7s %7s %11s %11s %11s %10s %9s  %s\n", "workload", "kernels", "memsets", "launch ms",
                "memory ms", "compute ms", "measured", "x floor", "bound by");
    for (const Row& r : rows) {
        if (r.mode != "captured" || !r.error.empty()) continue;
        const Distance d = distance(r, f);
        std::printf("%-14s %7zu %7zu %11.4f %11.4f %11.4f %10.4f %9.2f  %s\n", r.workload.c_str(), r.graph.kernels,
                    r.graph.memsets, d.launch_ms, d.memory_ms, d.compute_ms, r.timing.ms, r.timing.ms / d.floor_ms(),
                    d.bound());
    }
    std::printf("launch = graph nodes on the longest dependency path x the per-node time; memory = estimated minimum bytes / copy bandwidth (each op's\n"
                "inputs read and output written once forward and once backward, plus the optimizer's parameter\n"
                "traffic); compute = GEMM and convolution FLOPs (forward, and backward per operand that needs a\n"
                "gradient) / the GEMM rate.\n");
}

// ---- output ----

const char* overlap_name(cuda::WeightGradientOverlap mode) {
    switch (mode) {
        case cuda::WeightGradientOverlap::never: return "never";
        case cuda::WeightGradientOverlap::captured: return "captured";
        case cuda::WeightGradientOverlap::always: return "always";
    }
    return "?";
}

std::string json_string(const std::string& text) {
    std::string out = "\"";
    for (const char c : text) {
        if (c == '"' || c == '\\') out += {'\\', c};
        else if (static_cast<unsigned char>(c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
            out += escaped;
        } else out += c;
    }
    return out + "\"";
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Settings& s, double copy_gbs,
                const HostOverhead* host, const Floors& floors) {
    std::ofstream out(path);
    if (!out) throw IoError(str("--json: cannot write '", path, "'"));
    out.precision(9);
    out << "{\n  \"tool\": \"dyngrad-perf\",\n  \"device\": " << json_string(cuda::device_name(0)) << ",\n"
        << "  \"weight_gradient_overlap\": " << json_string(overlap_name(cuda::weight_gradient_overlap())) << ",\n"
        << "  \"fusion\": " << json_string(fusion::fusion_mode_name(fusion::fusion_settings().mode)) << ",\n"
        << "  \"timing\": \"median over repetitions of the mean ms per step; each repetition timed on the host clock "
           "from a synchronised device to the end of cudaDeviceSynchronize after K steps\",\n"
        << "  \"memory\": \"peak bytes in use during one step after reset_peak_memory, absolute (parameters, "
           "optimizer state, inputs and static buffers included)\",\n"
        << "  \"settings\": {\"warmup\": " << s.warmup << ", \"repetitions\": " << s.repetitions
        << ", \"min_repetition_ms\": " << s.min_repetition_ms << ", \"min_steps\": " << s.min_steps
        << ", \"max_steps\": " << s.max_steps << "},\n";
    if (copy_gbs > 0) out << "  \"copy_bandwidth_gbs\": " << copy_gbs << ",\n";
    out << "  \"floors\": {\"us_per_graph_kernel_node\": " << floors.us_per_node << ", \"copy_gbs\": " << floors.copy_gbs
        << ", \"gemm_tflops_f32\": " << floors.gemm_tflops_f32 << ", \"gemm_tflops_tf32\": " << floors.gemm_tflops_tf32
        << "},\n";
    if (host)
        out << "  \"host_overhead\": {\"chain\": " << host->chain << ", \"cpu_record_us_per_op\": " << host->cpu_record_us
            << ", \"cpu_backward_us_per_node\": " << host->cpu_backward_us
            << ", \"cuda_record_host_us_per_op\": " << host->cuda_record_us
            << ", \"cuda_backward_host_us_per_node\": " << host->cuda_backward_us
            << ", \"cuda_empty_launch_us\": " << host->launch_us
            << ", \"target_refers_to\": \"cpu_record_us_per_op\"},\n";
    out << "  \"rows\": [";
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        out << (i ? "," : "") << "\n    {\"workload\": " << json_string(r.workload) << ", \"mode\": " << json_string(r.mode)
            << ", \"description\": " << json_string(r.description);
        if (!r.error.empty()) {
            out << ", \"error\": " << json_string(r.error) << "}";
            continue;
        }
        out << ", \"ms\": " << r.timing.ms << ", \"steps_per_repetition\": " << r.timing.steps << ", \"samples_ms\": [";
        for (std::size_t k = 0; k < r.timing.samples_ms.size(); ++k) out << (k ? ", " : "") << r.timing.samples_ms[k];
        out << "], \"before_bytes\": " << r.memory.before_bytes << ", \"peak_bytes\": " << r.memory.peak_bytes
            << ", \"reserved_bytes\": " << r.memory.reserved_bytes
            << ", \"capture_reserved_bytes\": " << r.memory.capture_reserved_bytes;
        if (r.gbs > 0) out << ", \"gbs\": " << r.gbs << ", \"copy_fraction\": " << r.copy_fraction;
        out << ", \"flops\": " << r.work.flops << ", \"min_bytes\": " << r.work.bytes;
        if (r.mode == "captured") {
            const Distance d = distance(r, floors);
            out << ", \"graph_nodes\": " << r.graph.nodes << ", \"graph_kernels\": " << r.graph.kernels
                << ", \"graph_memsets\": " << r.graph.memsets << ", \"graph_memcpys\": " << r.graph.memcpys
                << ", \"graph_longest_chain\": " << r.graph.longest_chain
                << ", \"floor_launch_ms\": " << d.launch_ms << ", \"floor_memory_ms\": " << d.memory_ms
                << ", \"floor_compute_ms\": " << d.compute_ms << ", \"bound_by\": " << json_string(d.bound());
        }
        out << "}";
    }
    out << "\n  ]\n}\n";
}

std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> parts;
    std::stringstream in(text);
    for (std::string part; std::getline(in, part, ',');)
        if (!part.empty()) parts.push_back(part);
    return parts;
}

constexpr const char* kUsage =
    "usage: dyngrad-perf [--json FILE] [--only NAME[,NAME...]] [--quick] [--list] [--profile]\n"
    "                    [--kernel-times [--verbose-kernels] [--kernel-steps N]]\n"
    "  --only   workloads to run (see --list); 'host' is the host-overhead figure\n"
    "  --quick  fewer, shorter repetitions (smoke runs; not for reported numbers)\n"
    "  --profile  only one captured replay per workload between cudaProfilerStart/Stop (for ncu\n"
    "           --profile-from-start off)\n"
    "  --kernel-times  instead of timing: per workload and mode (eager, captured) the kernels of N steps\n"
    "           (--kernel-steps, default 20) from CUPTI's trace: count, kernel time, busy, span, idle\n"
    "           (medians over the steps); --verbose-kernels adds each kernel's median time\n";

}  // namespace

int main(int argc, char** argv) {
    std::string json_path;
    std::vector<std::string> only;
    Settings settings;
    bool list = false;
    bool profile = false;
    bool kernel_times_mode = false, verbose_kernels = false;
    int kernel_steps = 20;
    try {  // every argument is checked before anything runs (cli/command_line.h)
        const cli::Arguments args(argc, argv, {.flags = {"--quick", "--list", "--profile", "--kernel-times", "--verbose-kernels"},
                                              .options = {"--json", "--only", "--kernel-steps"}});
        if (args.help()) {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (auto v = args.value("--json")) json_path = cli::output_file("--json", *v);
        if (auto v = args.value("--only")) {
            only = split(*v);
            if (only.empty() || std::count(v->begin(), v->end(), ',') + 1 != static_cast<std::ptrdiff_t>(only.size()))
                throw cli::UsageError(str("--only: empty workload name in '", *v, "'"));
        }
        if (args.has("--quick")) settings = quick_settings();
        list = args.has("--list");
        profile = args.has("--profile");
        kernel_times_mode = args.has("--kernel-times");
        verbose_kernels = args.has("--verbose-kernels");
        if (auto v = args.value("--kernel-steps")) kernel_steps = static_cast<int>(cli::parse_int("--kernel-steps", *v, 1, 10000));
        if ((verbose_kernels || args.value("--kernel-steps")) && !kernel_times_mode)
            throw cli::UsageError("--verbose-kernels and --kernel-steps go with --kernel-times");
    } catch (const cli::UsageError& e) {
        std::fprintf(stderr, "dyngrad-perf: %s\n%s", e.what(), kUsage);
        return 2;
    }
    const std::vector<Workload> all = workloads();
    if (list) {
        for (const Workload& w : all) std::printf("%-14s %s\n", w.name.c_str(), w.description.c_str());
        std::printf("%-14s %s\n", "host", "host overhead per recorded op");
        return 0;
    }
    const auto wanted = [&](const std::string& name) {
        return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
    };
    for (const std::string& name : only) {
        if (name != "host" && std::none_of(all.begin(), all.end(), [&](const Workload& w) { return w.name == name; })) {
            std::fprintf(stderr, "dyngrad-perf: --only: unknown workload '%s' (see --list)\n", name.c_str());
            return 2;
        }
    }
    try {
        if (cuda_device_count() == 0) {
            std::printf("dyngrad-perf: no CUDA device; nothing to measure\n");
            return 77;
        }
        if (profile) {
            for (const Workload& w : all)
                if (wanted(w.name)) profile_one_replay(w);
            return 0;
        }
        if (kernel_times_mode) {
            if (!bench::kernel_trace_available()) {
                std::fprintf(stderr, "dyngrad-perf: --kernel-times: built without CUPTI (CMake found no CUDA::cupti)\n");
                return 2;
            }
            bool failed_any = false;
            std::printf("dyngrad-perf --kernel-times on %s, fusion %s (DYNGRAD_FUSION)\n", cuda::device_name(0).c_str(),
                        fusion::fusion_mode_name(fusion::fusion_settings().mode));
            for (const Workload& w : all) {
                if (!wanted(w.name) || (only.empty() && w.opt_in)) continue;
                for (const bool captured : {false, true}) {
                    try {
                        kernel_times(w, captured, kernel_steps, verbose_kernels);
                    } catch (const std::exception& e) {
                        failed_any = true;
                        std::printf("kernels %s %s: FAILED: %s\n", w.name.c_str(), captured ? "captured" : "eager",
                                    e.what());
                    }
                }
            }
            return failed_any ? 1 : 0;
        }
        std::printf("dyngrad-perf on %s, weight-gradient overlap: %s, fusion %s (DYNGRAD_FUSION)\n",
                    cuda::device_name(0).c_str(), overlap_name(cuda::weight_gradient_overlap()),
                    fusion::fusion_mode_name(fusion::fusion_settings().mode));
        std::printf("ms per step: median of %d repetitions of K steps (>= %.0f ms each), after %d warm-up steps; "
                    "peak = absolute peak bytes in use during one step\n\n",
                    settings.repetitions, settings.min_repetition_ms, settings.warmup);
        double copy_gbs = 0;
        if (wanted("mul64m")) {
            copy_gbs = copy_bandwidth_gbs(settings);
            std::printf("device-to-device copy bandwidth: %.1f GB/s (read + write)\n\n", copy_gbs);
        }
        std::printf("%-14s %-9s %10s %5s %12s  %s\n", "workload", "mode", "ms/step", "K", "peak MiB", "");
        std::vector<Row> rows;
        bool failed = false;
        for (const Workload& w : all) {
            if (!wanted(w.name) || (only.empty() && w.opt_in)) continue;
            for (const bool captured : {false, true}) {
                Row row = measure(w, captured, settings, copy_gbs);
                if (!row.error.empty()) {
                    failed = true;
                    std::printf("%-14s %-9s FAILED: %s\n", row.workload.c_str(), row.mode.c_str(), row.error.c_str());
                } else {
                    std::printf("%-14s %-9s %10.4f %5d %12.1f", row.workload.c_str(), row.mode.c_str(), row.timing.ms,
                                row.timing.steps, static_cast<double>(row.memory.peak_bytes) / (1 << 20));
                    if (captured) {
                        std::printf("  %zu kernels/step (longest chain %zu nodes)", row.graph.kernels,
                                    row.graph.longest_chain);
                        if (row.graph.memcpys != 0) std::printf(", %zu copies", row.graph.memcpys);
                    }
                    if (row.gbs > 0)
                        std::printf("  %.1f GB/s = %.1f%% of copy", row.gbs, 100 * row.copy_fraction);
                    std::printf("\n");
                }
                std::fflush(stdout);
                rows.push_back(std::move(row));
            }
        }
        const Floors floors = measure_floors(settings, copy_gbs);
        print_floors(rows, floors);
        std::unique_ptr<HostOverhead> host;
        if (wanted("host")) {
            host = std::make_unique<HostOverhead>(host_overhead(settings));
            print_host_overhead(*host);
        }
        if (!json_path.empty()) {
            write_json(json_path, rows, settings, copy_gbs, host.get(), floors);
            std::printf("\nwrote %s\n", json_path.c_str());
        }
        return failed ? 1 : 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dyngrad-perf: %s\n", e.what());
        return 2;
    }
}
