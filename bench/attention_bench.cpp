// dyngrad-attention-bench: scaled_dot_product_attention forward + backward on the GPU (ops/attention*.cu), side by
// side with PyTorch's F.scaled_dot_product_attention (bench/torch_attention.py; scripts/run-attention-bench.sh
// runs both and writes the table).
//
// Default workload (issue 16): B 8, H 8, D 64, T = S = 256, 1024, 4096, float32 (--dtype bf16 | f16: the native
// 16-bit tensor-core kernels), without and with is_causal.
// Per row: the median time of one forward + backward (dq, dk, dv; the output gradient given), its GFLOP/s
// (4·B·H·T·S·D forward, 2.5× that backward; halved when causal), and the peak device memory the step adds to its
// inputs. Before timing, each configuration is checked on a small problem against the float64 CPU replay (in
// bf16/f16: from the same rounded inputs, with the op's reduced-precision tolerance).
//
// --deterministic: cuda::set_deterministic(true), so the float32 backward runs its two deterministic kernels instead
// of the fused one that adds dq with float atomics (the default; ops/attention_mma.cu).
//
// Usage: dyngrad-attention-bench [--lengths 256,1024,4096] [--batch B] [--heads H] [--head-dim D]
//                                [--dtype f32|bf16|f16] [--repetitions R] [--deterministic] [--json FILE]
#include <dyngrad/dyngrad.h>

#include "../cli/command_line.h"
#include "../cli/timing.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

using namespace dyngrad;

namespace {

struct Options {
    std::vector<std::int64_t> lengths{256, 1024, 4096};
    std::int64_t batch = 8, heads = 8, head_dim = 64;
    int repetitions = 10;
    DType dtype = DType::f32;
    bool deterministic = false;
    std::string json;
};

// Every argument is checked before anything runs (cli/command_line.h).
Options parse(int argc, char** argv) {
    const cli::Arguments args(argc, argv,
                              {.flags = {"--deterministic"},
                               .options = {"--lengths", "--batch", "--heads", "--head-dim", "--dtype", "--repetitions",
                                           "--json"}});
    if (args.help()) {
        std::puts("usage: dyngrad-attention-bench [--lengths 256,1024,4096] [--batch B] [--heads H] [--head-dim D]\n"
                  "                               [--dtype f32|bf16|f16] [--repetitions R] [--deterministic]\n"
                  "                               [--json FILE]");
        std::exit(0);
    }
    Options o;
    if (auto v = args.value("--lengths")) o.lengths = cli::parse_int_list("--lengths", *v, 1, 1 << 20);
    if (auto v = args.value("--batch")) o.batch = cli::parse_int("--batch", *v, 1, 1 << 16);
    if (auto v = args.value("--heads")) o.heads = cli::parse_int("--heads", *v, 1, 1 << 16);
    if (auto v = args.value("--head-dim"))
        o.head_dim = cli::parse_int("--head-dim", *v, 1, kAttentionMaxGpuHeadDim);
    if (auto v = args.value("--dtype")) {
        const std::string dtype = cli::parse_choice("--dtype", *v, {"f32", "bf16", "f16"});
        o.dtype = dtype == "bf16" ? DType::bf16 : dtype == "f16" ? DType::f16 : DType::f32;
    }
    if (auto v = args.value("--repetitions"))
        o.repetitions = static_cast<int>(cli::parse_int("--repetitions", *v, 1, 1 << 20));
    if (auto v = args.value("--json")) o.json = cli::output_file("--json", *v);
    o.deterministic = args.has("--deterministic");
    return o;
}

AttentionOptions causal_options(bool causal) {
    AttentionOptions options;
    options.is_causal = causal;
    return options;
}

// The op on a small ragged problem of the same head dim against the float64 CPU replay.
void check_small(const Options& o, bool causal) {
    OpAttrs attrs;
    attrs.is_causal = causal;
    const OpCase c{"bench check", {{2, 3, 77, o.head_dim}, {2, 3, 77, o.head_dim}, {2, 3, 77, o.head_dim}}, attrs, {}};
    Generator gen(5);
    const OpDef& def = *find_op("scaled_dot_product_attention");
    const CheckResult r = is_reduced_precision(o.dtype)
                              ? reduced_precision_check(def, c, gen, o.dtype, reduced_precision_tolerance(def, o.dtype),
                                                        Device::cuda(0))
                              : gpu_vs_cpu_check(def, c, gen, 1e-5);
    if (!r.pass)
        throw NumericalError(str("scaled_dot_product_attention disagrees with the CPU replay (causal ", causal,
                                 "): max rel err ", r.max_rel_err, ", ", r.detail));
}

struct Row {
    std::int64_t length;
    bool causal;
    double ms, gflop, peak_mib;
    std::string path;  // what ran forward/backward: "cudnn", "kernels" (bf16/f16: attention_last_run())
};

const char* impl_name(AttentionImpl impl) {
    return impl == AttentionImpl::cudnn ? "cudnn" : impl == AttentionImpl::kernels ? "kernels" : "none";
}

Row measure(const Options& o, std::int64_t length, bool causal) {
    const Device gpu = Device::cuda(0);
    Generator gen(static_cast<std::uint64_t>(length));
    const Shape shape{o.batch, o.heads, length, o.head_dim};
    const Tensor q = Tensor::normal(shape, 0, 1, gen, DType::f32, gpu).to(o.dtype);
    const Tensor k = Tensor::normal(shape, 0, 1, gen, DType::f32, gpu).to(o.dtype);
    const Tensor v = Tensor::normal(shape, 0, 1, gen, DType::f32, gpu).to(o.dtype);
    const Tensor dy = Tensor::normal(shape, 0, 1, gen, DType::f32, gpu).to(o.dtype);
    const auto step = [&] {
        ComputeGraph graph;
        const Var vq = graph.input(q, "q", true), vk = graph.input(k, "k", true), vv = graph.input(v, "v", true);
        graph.backward(scaled_dot_product_attention(vq, vk, vv, causal_options(causal)), dy);
    };
    Row row{length, causal, 0, 0, 0, "kernels"};
    row.ms = cli::median_ms(step, 1, o.repetitions);
    if (is_reduced_precision(o.dtype)) {
        const AttentionRunInfo ran = attention_last_run();
        row.path = ran.forward == ran.backward ? impl_name(ran.forward)
                                               : str(impl_name(ran.forward), "/", impl_name(ran.backward));
    }
    cuda::synchronize(0);
    const std::size_t before = cuda::memory_stats(0).bytes_in_use;
    cuda::reset_peak_memory(0);
    step();
    cuda::synchronize(0);
    row.peak_mib = double(cuda::memory_stats(0).peak_bytes_in_use - before) / (1 << 20);
    const double forward = 4.0 * double(o.batch * o.heads) * double(length) * double(length) * double(o.head_dim);
    row.gflop = 3.5 * forward * (causal ? 0.5 : 1.0) / 1e9;
    return row;
}

}  // namespace

int main(int argc, char** argv) {
    return cli::guarded_main("dyngrad-attention-bench", [&] {
        const Options o = parse(argc, argv);
        if (cli::no_cuda_device("dyngrad-attention-bench")) return 77;
        // DYNGRAD_ATTENTION_SIMT=1 measures the SIMT kernels instead (ops/attention.h).
        // bf16/f16: cuDNN's fused attention where it applies (each row says what ran), else the 16-bit kernels.
        const char* path = is_reduced_precision(o.dtype)  ? "cuDNN fused attention or tensor cores (16-bit mma.sync)"
                           : attention_uses_tensor_cores() ? "tensor cores (3xTF32)"
                                                           : "SIMT (exact float32 FMA)";
        const std::string dtype(dtype_name(o.dtype));
        cuda::set_deterministic(o.deterministic);
        std::printf("device: %s\nattention: B %lld, H %lld, D %lld, %s, forward + backward, kernels: %s, %s\n",
                    cuda::device_name(0).c_str(), (long long)o.batch, (long long)o.heads, (long long)o.head_dim,
                    dtype.c_str(), path, o.deterministic ? "deterministic mode" : "default mode (dq atomics)");
        for (const bool causal : {false, true}) check_small(o, causal);
        std::printf("checked against the float64 CPU replay (B2 H3 T77, causal and not)\n");
        if (is_reduced_precision(o.dtype)) std::printf("%s\n", attention_cudnn_status().c_str());
        std::printf("%6s %7s %10s %10s %12s %8s\n", "T", "causal", "ms", "GFLOP/s", "peak MiB", "path");
        std::vector<Row> rows;
        for (const std::int64_t length : o.lengths)
            for (const bool causal : {false, true}) {
                const Row row = measure(o, length, causal);
                rows.push_back(row);
                std::printf("%6lld %7s %10.3f %10.1f %12.1f %8s\n", (long long)row.length, causal ? "yes" : "no",
                            row.ms, row.gflop / (row.ms * 1e-3), row.peak_mib, row.path.c_str());
                std::fflush(stdout);
            }
        if (!o.json.empty()) {
            std::ofstream out(o.json);
            out << "{\"device\": \"" << cuda::device_name(0) << "\", \"dtype\": \"" << dtype
                << "\", \"kernels\": \"" << path
                << "\", \"deterministic\": " << (o.deterministic ? "true" : "false")
                << ", \"batch\": " << o.batch << ", \"heads\": " << o.heads
                << ", \"head_dim\": " << o.head_dim << ", \"rows\": [";
            for (std::size_t i = 0; i < rows.size(); ++i)
                out << (i ? ", " : "") << "{\"length\": " << rows[i].length
                    << ", \"causal\": " << (rows[i].causal ? "true" : "false") << ", \"ms\": " << rows[i].ms
                    << ", \"gflop\": " << rows[i].gflop << ", \"peak_mib\": " << rows[i].peak_mib
                    << ", \"path\": \"" << rows[i].path << "\"}";
            out << "]}\n";
        }
        return 0;
    });
}
