// The timing loop the GPU benches share (bench/attention_bench.cpp, rnn_bench.cpp, op_bench.cpp): the median of
// several timed calls, each ended by a device synchronisation, after warm-up calls (which also let cuDNN and
// cuBLAS build their plans). Header only; not installed.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include <dyngrad/dyngrad.h>

namespace dyngrad::cli {

// Median over `repetitions` of one call's time in ms, after `warmups` untimed calls, on CUDA device 0.
inline double median_ms(const std::function<void()>& body, int warmups, int repetitions) {
    for (int i = 0; i < warmups; ++i) body();
    cuda::synchronize(0);
    std::vector<double> samples;
    for (int r = 0; r < repetitions; ++r) {
        const auto start = std::chrono::steady_clock::now();
        body();
        cuda::synchronize(0);
        samples.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2];
}

}  // namespace dyngrad::cli
