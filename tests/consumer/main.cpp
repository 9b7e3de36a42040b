// Builds a tiny graph through the installed headers and library and checks one gradient:
// loss = Σ (x·x/2 + x), so dloss/dx = x + 1. Then writes a small IDX file (to argv[1], or
// consumer_labels.idx) and reads it back: read_idx goes through zlib, so a static libdyngrad whose
// package leaves zlib out of the link fails to link here. Built with CONSUMER_CUDA, also runs its own
// kernel (kernel.cu) on a GPU when there is one.
#include <dyngrad/dyngrad.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#if CONSUMER_CUDA
#include "kernel.h"
#endif

int main(int argc, char* argv[]) {
    using namespace dyngrad;
    try {
        ComputeGraph graph;
        Var x = graph.input(Tensor::of({1.0, 2.0, 3.0}, DType::f64), "x", true);
        Var loss = sum(x * x * 0.5 + x);
        graph.backward(loss);
        const std::vector<double> grad = x.grad().to_vector();
        const std::vector<double> expected = {2.0, 3.0, 4.0};
        for (std::size_t i = 0; i < expected.size(); ++i) {
            if (std::fabs(grad[i] - expected[i]) > 1e-12) {
                std::fprintf(stderr, "consumer: dloss/dx[%zu] = %g, expected %g\n", i, grad[i], expected[i]);
                return 1;
            }
        }
        std::printf("consumer: loss %g, gradient ok\n", loss.item());

        const std::string path = argc > 1 ? argv[1] : "consumer_labels.idx";
        const std::vector<unsigned char> labels = {7, 0, 9};
        {
            std::ofstream out(path, std::ios::binary);
            const unsigned char header[] = {0, 0, 0x08, 1, 0, 0, 0, 3};  // unsigned bytes, rank 1, 3 elements
            out.write(reinterpret_cast<const char*>(header), sizeof header);
            out.write(reinterpret_cast<const char*>(labels.data()), static_cast<std::streamsize>(labels.size()));
        }
        const IdxArray read = read_idx(path, 1);
        const std::vector<std::uint8_t> expected_data(labels.begin(), labels.end());
        if (read.dims != std::vector<std::int64_t>{3} || read.data != expected_data) {
            std::fprintf(stderr, "consumer: read_idx did not return the labels written to %s\n", path.c_str());
            return 1;
        }
        std::printf("consumer: read_idx ok\n");
#if CONSUMER_CUDA
        if (cuda_device_count() == 0) {
            std::printf("consumer: SKIPPED running the user kernel: no CUDA device (it compiled)\n");
            return 0;
        }
        const std::vector<double> shifted = add_one_on_gpu(x.value().to(Device::cuda())).to_vector();
        for (std::size_t i = 0; i < expected.size(); ++i) {
            if (shifted[i] != expected[i]) {
                std::fprintf(stderr, "consumer: user kernel gave %g at %zu, expected %g\n", shifted[i], i, expected[i]);
                return 1;
            }
        }
        std::printf("consumer: user kernel ok\n");
#endif
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "consumer: %s\n", e.what());
        return 1;
    }
}
