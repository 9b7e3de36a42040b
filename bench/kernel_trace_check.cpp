// kernel_trace_check: the arithmetic of dyngrad-perf --kernel-times (bench/kernel_trace.cpp, built here without
// CUPTI) on hand-made steps; the trace itself needs CUPTI and a GPU, the figures it reports do not. A bench
// program's own check, not a tests/ case: the tests include only the library (scripts/check-layers.sh), and this
// file is the benchmark's. Prints each failed check; exit status 1 when one failed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "kernel_trace.h"

using dyngrad::bench::DeviceActivity;
using dyngrad::bench::readable_kernel_name;
using dyngrad::bench::summarize;

namespace {

int failures = 0;

void check(bool ok, const char* what, int line) {
    if (!ok) {
        std::printf("kernel_trace_check.cpp:%d: FAILED: %s\n", line, what);
        ++failures;
    }
}
#define CHECK(expr) check((expr), #expr, __LINE__)
bool near(double a, double b) { return std::abs(a - b) <= 1e-9; }

DeviceActivity kernel(std::string name, std::uint64_t start_ns, std::uint64_t end_ns, std::uint32_t stream = 7) {
    return {DeviceActivity::Kind::kernel, std::move(name), start_ns, end_ns, stream};
}

void busy_is_the_union() {
    // a [0, 10) µs, a memset [5, 12) overlapping it, b [20, 30) on a side lane overlapping c [25, 40).
    const std::vector<DeviceActivity> step = {
        kernel("a", 0, 10'000),
        {DeviceActivity::Kind::memset, "memset", 5'000, 12'000, 7},
        kernel("b", 20'000, 30'000, 9),
        kernel("c", 25'000, 40'000),
    };
    const auto t = summarize({step});
    CHECK(t.steps == 1);
    CHECK(t.kernels == 3 && t.memsets == 1 && t.memcpys == 0);
    CHECK(near(t.kernel_us, 10 + 10 + 15));
    CHECK(near(t.busy_us, 12 + 20));  // [0, 12) and [20, 40)
    CHECK(near(t.span_us, 40));
    CHECK(near(t.idle_us(), 8));
    CHECK(t.per_kernel_us.size() == 3 && t.per_kernel_us[1].first == "b");
    CHECK(t.by_name.size() == 4 && t.by_name[0].name == "c" && near(t.by_name[0].us, 15));  // the memset is a name too
}

void medians_over_steps() {
    std::mt19937_64 rng(std::random_device{}());
    std::uniform_int_distribution<std::uint64_t> jitter(0, 999);
    std::vector<std::vector<DeviceActivity>> steps;
    std::vector<double> first_us;
    for (int s = 0; s < 5; ++s) {
        const std::uint64_t base = 1'000'000ull * static_cast<std::uint64_t>(s + 1), d = 3'000 + jitter(rng);
        steps.push_back({kernel("gemm", base, base + d), kernel("relu", base + d + 500, base + d + 1'500)});
        first_us.push_back(static_cast<double>(d) * 1e-3);
    }
    auto t = summarize(steps);
    std::sort(first_us.begin(), first_us.end());
    CHECK(t.per_kernel_us.size() == 2);
    CHECK(t.per_kernel_us.size() == 2 && near(t.per_kernel_us[0].second, first_us[2]));  // the median of five
    CHECK(t.per_kernel_us.size() == 2 && near(t.per_kernel_us[1].second, 1.0));
    CHECK(near(t.idle_us(), 0.5));
    std::swap(steps[1][0], steps[1][1]);  // side lanes: another start order, the same kernels
    t = summarize(steps);
    CHECK(t.per_kernel_us.size() == 2 && t.per_kernel_us[0].first == "gemm" &&
          near(t.per_kernel_us[0].second, first_us[2]));
    steps.back().pop_back();  // one step launched other kernels: no per-kernel medians
    t = summarize(steps);
    CHECK(t.per_kernel_us.empty());
    CHECK(t.kernels == 2);  // the median count
    // By name, means per step over all five (one relu fewer): gemm first (the most time).
    double gemm_us = 0;
    for (double us : first_us) gemm_us += us;
    CHECK(t.by_name.size() == 2 && t.by_name[0].name == "gemm" && near(t.by_name[0].count, 1.0) &&
          near(t.by_name[0].us, gemm_us / 5));
    CHECK(t.by_name.size() == 2 && t.by_name[1].name == "relu" && near(t.by_name[1].count, 0.8) &&
          near(t.by_name[1].us, 0.8));
}

void empty_steps() {
    CHECK(summarize({}).steps == 0);
    const auto t = summarize({{}});
    CHECK(t.kernels == 0 && t.span_us == 0 && t.idle_us() == 0);
}

void names() {
    CHECK(readable_kernel_name("_Z6kernelIfLi4EEvPfi") == "kernel<float, 4>");
    CHECK(readable_kernel_name("_ZN2dg4gemmEPKfS1_Pfi") == "dg::gemm");
    CHECK(readable_kernel_name("triton_poi_fused_relu_11") == "triton_poi_fused_relu_11");
    // dyngrad::cuda::(anonymous namespace)::max_pool_forward_kernel<float>(float const*, float*, long)
    CHECK(readable_kernel_name("_ZN7dyngrad4cuda12_GLOBAL__N_123max_pool_forward_kernelIfEEvPKfPfl") ==
          "dyngrad::cuda::(anonymous namespace)::max_pool_forward_kernel<float>");
    CHECK(readable_kernel_name(nullptr) == "?");
}

}  // namespace

int main() {
    busy_is_the_union();
    medians_over_steps();
    empty_steps();
    names();
    std::printf("kernel_trace_check: %s\n", failures == 0 ? "all checks passed" : "FAILED");
    return failures == 0 ? 0 : 1;
}
