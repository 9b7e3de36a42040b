// dyngrad-perf-floor: the CUDA backend's performance floor, measured on the GPU in one run.
//  1. elementwise mul of two 64M-element float32 vectors, forward + backward through the graph,
//     in GB/s over the minimum bytes (forward reads a, b and writes y; backward reads dy, a, b and
//     writes da, db), against the device-to-device copy bandwidth (read + write) of the same run;
//  2. matmul (2-D and batched) forward + backward through the graph against the same three GEMMs
//     called on cuBLAS directly.
// Usage: dyngrad-perf-floor [--json FILE]
#include <dyngrad/dyngrad.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../cli/command_line.h"

using namespace dyngrad;

namespace {

#define BENCH_CHECK(expr)                                                                   \
    do {                                                                                    \
        if ((expr) != 0) throw Error(str("bench: ", #expr, " failed at line ", __LINE__)); \
    } while (0)

// Median over `repetitions` of the mean time of `inner` calls, in ms, after warm-up. The whole device
// is synchronised: the references run on the legacy default stream, dyngrad on its own stream.
double time_ms(const std::function<void()>& body, int repetitions = 7, int inner = 10) {
    for (int i = 0; i < 3; ++i) body();
    BENCH_CHECK(cudaDeviceSynchronize());
    std::vector<double> samples;
    for (int r = 0; r < repetitions; ++r) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < inner; ++i) body();
        BENCH_CHECK(cudaDeviceSynchronize());
        samples.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                          inner);
    }
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2];
}

struct Row {
    std::string name;
    double ours_ms, reference_ms, ratio;  // ratio: ours as a fraction of the reference's throughput
    std::string unit_note;
};

Row elementwise_row() {
    constexpr std::int64_t n = 64LL << 20;
    const Device gpu = Device::cuda(0);
    Generator gen(1);
    const Tensor a = Tensor::uniform({n}, -1, 1, gen, DType::f32).to(gpu);
    const Tensor b = Tensor::uniform({n}, -1, 1, gen, DType::f32).to(gpu);
    const Tensor dy = Tensor::uniform({n}, -1, 1, gen, DType::f32).to(gpu);
    Tensor copy_dst = Tensor::empty({n}, DType::f32, gpu);

    const double copy_ms = time_ms([&] {
        BENCH_CHECK(cudaMemcpyAsync(copy_dst.raw_data(), a.raw_data(), a.nbytes(), cudaMemcpyDeviceToDevice, nullptr));
    });
    const double copy_gbs = 2.0 * static_cast<double>(a.nbytes()) / (copy_ms * 1e6);

    const double ours_ms = time_ms([&] {
        ComputeGraph graph;
        Var va = graph.input(a, "a", true);
        Var vb = graph.input(b, "b", true);
        Var y = mul(va, vb);
        graph.backward(y, dy);
    });
    const double bytes = 8.0 * static_cast<double>(a.nbytes());  // fwd: 2 reads + 1 write; bwd: 3 reads + 2 writes
    const double ours_gbs = bytes / (ours_ms * 1e6);
    std::printf("device-to-device copy: %.3f ms, %.1f GB/s (read + write)\n", copy_ms, copy_gbs);
    std::printf("mul 64M fwd+bwd: %.3f ms, %.1f GB/s over %.2f GB = %.1f%% of copy bandwidth\n", ours_ms, ours_gbs,
                bytes / 1e9, 100 * ours_gbs / copy_gbs);
    return {"elementwise mul 64M fwd+bwd (GB/s vs D2D copy)", ours_ms, copy_ms, ours_gbs / copy_gbs,
            str(ours_gbs, " GB/s vs ", copy_gbs, " GB/s")};
}

// Row-major C (M,N) = A (M,K) · B (K,N) on column-major cuBLAS: Cᵀ = Bᵀ·Aᵀ.
void gemm_rm(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float* c,
             int batch) {
    const float one = 1.0f, zero = 0.0f;
    const int lda = ta ? m : k, ldb = tb ? k : n;
    BENCH_CHECK(cublasGemmStridedBatchedEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                                           k, &one, b, CUDA_R_32F, ldb, static_cast<long long>(k) * n, a, CUDA_R_32F,
                                           lda, static_cast<long long>(m) * k, &zero, c, CUDA_R_32F, n,
                                           static_cast<long long>(m) * n, batch, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT));
}

Row gemm_row(int batch, int m, int k, int n) {
    const Device gpu = Device::cuda(0);
    Generator gen(2);
    const Shape sa = batch > 1 ? Shape{batch, m, k} : Shape{m, k};
    const Shape sb = batch > 1 ? Shape{batch, k, n} : Shape{k, n};
    const Shape sc = batch > 1 ? Shape{batch, m, n} : Shape{m, n};
    const Tensor a = Tensor::uniform(sa, -1, 1, gen, DType::f32).to(gpu);
    const Tensor b = Tensor::uniform(sb, -1, 1, gen, DType::f32).to(gpu);
    const Tensor dy = Tensor::uniform(sc, -1, 1, gen, DType::f32).to(gpu);
    Tensor c = Tensor::empty(sc, DType::f32, gpu), da = Tensor::empty(sa, DType::f32, gpu),
           db = Tensor::empty(sb, DType::f32, gpu);

    cublasHandle_t handle;
    BENCH_CHECK(cublasCreate(&handle));
    const double direct_ms = time_ms([&] {
        gemm_rm(handle, false, false, m, n, k, a.data<float>(), b.data<float>(), c.data<float>(), batch);   // C = A·B
        gemm_rm(handle, false, true, m, k, n, dy.data<float>(), b.data<float>(), da.data<float>(), batch);  // dA = dY·Bᵀ
        gemm_rm(handle, true, false, k, n, m, a.data<float>(), dy.data<float>(), db.data<float>(), batch);  // dB = Aᵀ·dY
    });
    cublasDestroy(handle);

    const double ours_ms = time_ms([&] {
        ComputeGraph graph;
        Var va = graph.input(a, "a", true);
        Var vb = graph.input(b, "b", true);
        graph.backward(matmul(va, vb), dy);
    });
    const std::string name = str("matmul ", batch > 1 ? str(batch, "x") : "", m, "x", k, " @ ", k, "x", n,
                                 " fwd+bwd (vs cuBLAS direct)");
    std::printf("%s: ours %.3f ms, cuBLAS %.3f ms, ours/cuBLAS time %.3f\n", name.c_str(), ours_ms, direct_ms,
                ours_ms / direct_ms);
    return {name, ours_ms, direct_ms, direct_ms / ours_ms, ""};
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string json_path;
        try {  // every argument is checked before anything runs (cli/command_line.h)
            const cli::Arguments args(argc, argv, {.options = {"--json"}});
            if (args.help()) {
                std::puts("usage: dyngrad-perf-floor [--json FILE]");
                return 0;
            }
            if (auto v = args.value("--json")) json_path = cli::output_file("--json", *v);
        } catch (const cli::UsageError& e) {
            std::fprintf(stderr, "dyngrad-perf-floor: %s\nusage: dyngrad-perf-floor [--json FILE]\n", e.what());
            return 2;
        }
        if (cuda_device_count() == 0) {
            std::printf("dyngrad-perf-floor: no CUDA device; nothing to measure\n");
            return 77;
        }
        std::vector<Row> rows;
        rows.push_back(elementwise_row());
        rows.push_back(gemm_row(1, 2048, 2048, 2048));
        rows.push_back(gemm_row(1, 4096, 1024, 512));
        rows.push_back(gemm_row(16, 256, 512, 128));
        const bool elementwise_ok = rows[0].ratio >= 0.80;
        bool gemm_ok = true;
        for (std::size_t i = 1; i < rows.size(); ++i) gemm_ok = gemm_ok && rows[i].ours_ms <= 1.10 * rows[i].reference_ms;
        std::printf("floor: elementwise >= 80%% of copy bandwidth: %s; GEMMs within 10%% of cuBLAS: %s\n",
                    elementwise_ok ? "met" : "NOT met", gemm_ok ? "met" : "NOT met");
        if (!json_path.empty()) {
            std::ofstream out(json_path);
            out << "{\"device\": \"" << cuda::device_name(0) << "\", \"rows\": [";
            for (std::size_t i = 0; i < rows.size(); ++i)
                out << (i ? ", " : "") << "{\"name\": \"" << rows[i].name << "\", \"ours_ms\": " << rows[i].ours_ms
                    << ", \"reference_ms\": " << rows[i].reference_ms << ", \"ratio\": " << rows[i].ratio << "}";
            out << "], \"elementwise_floor_met\": " << (elementwise_ok ? "true" : "false")
                << ", \"gemm_floor_met\": " << (gemm_ok ? "true" : "false") << "}\n";
        }
        return elementwise_ok && gemm_ok ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dyngrad-perf-floor: %s\n", e.what());
        return 2;
    }
}
