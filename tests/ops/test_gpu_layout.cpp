// permute/expand on the GPU (ops/layout.cu: collapsed walks copied in 16/8/4-byte words, tiled transposes when the
// innermost dim changes, one element per thread otherwise) and narrow's in-place backward, against the CPU bit for
// bit in every dtype. Without a CUDA device (or in a CPU-only build) it prints why and exits 77 (CTest: skipped).
#include <cstdint>
#include <cstring>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {
const Device kGpu = Device::cuda(0);

bool same_bytes(const Tensor& gpu, const Tensor& cpu) {
    const Tensor back = gpu.to(Device::cpu());
    return back.shape() == cpu.shape() && back.dtype() == cpu.dtype() &&
           std::memcmp(back.raw_data(), cpu.raw_data(), cpu.nbytes()) == 0;
}

std::vector<std::int64_t> inverse_dims(const std::vector<std::int64_t>& dims) {
    std::vector<std::int64_t> inverse(dims.size());
    for (std::size_t i = 0; i < dims.size(); ++i) inverse[static_cast<std::size_t>(dims[i])] = static_cast<std::int64_t>(i);
    return inverse;
}

struct PermuteCase {
    Shape x;
    std::vector<std::int64_t> dims;
};
}  // namespace

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "GPU layout tests"); }

TEST_CASE("permute on the GPU matches the CPU bit for bit in every dtype and kernel path", "[gpu][layout]") {
    const std::vector<PermuteCase> cases = {
        {{4, 16, 3, 6, 64}, {2, 0, 3, 1, 4}},  // the GPT's head split: 16-byte runs of D
        {{4, 6, 16, 64}, {0, 2, 1, 3}},        // and the merge back
        {{3, 4, 6, 16, 64}, {1, 3, 0, 2, 4}},  // the split's backward (inverse permutation)
        {{2, 5, 3, 7}, {0, 2, 1, 3}},          // odd runs of 7: 4-byte words for bf16 only where they divide
        {{2, 5, 3, 6}, {2, 1, 0, 3}},          // runs of 6: 4/8-byte words
        {{3, 5, 2, 1}, {3, 2, 1, 0}},          // size-1 dims
        {{37, 45}, {1, 0}},                    // a 2-D transpose with partial tiles
        {{3, 40, 50}, {0, 2, 1}},              // batched transposes
        {{33, 2, 41}, {2, 1, 0}},              // innermost change with a batch dim between
        {{5, 3, 9}, {2, 0, 1}},                // short dims: the element-per-thread kernel
        {{1, 1, 1}, {2, 0, 1}},
        {{4, 0, 3}, {2, 1, 0}},                // empty
        {{6, 1, 8, 10}, {3, 2, 1, 0}},
    };
    Generator gen(1611);
    for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
        for (const PermuteCase& c : cases) {
            DYNAMIC_SECTION(dtype_name(dtype) << " " << to_string(c.x) << " dims " << to_string(c.dims)) {
                const Tensor x = Tensor::normal(c.x, 0.0, 1.0, gen, dtype);
                const Tensor expected = permute(x, c.dims);
                CHECK(same_bytes(permute(x.to(kGpu), c.dims), expected));
                // and the backward through the graph (the inverse permutation on the GPU)
                ComputeGraph graph;
                const Var xv = graph.input(x.to(kGpu), "x", true);
                const Tensor w = Tensor::normal(expected.shape(), 0.0, 1.0, gen, dtype);
                graph.backward(permute(xv, c.dims), w.to(kGpu));
                CHECK(same_bytes(xv.grad(), permute(w, inverse_dims(c.dims))));
            }
        }
    }
}

TEST_CASE("expand on the GPU matches the CPU bit for bit, broadcast innermost dims included", "[gpu][layout]") {
    const std::vector<std::pair<Shape, Shape>> cases = {
        {{256, 384}, {8, 256, 384}},  // a positional table over a batch: 16-byte runs
        {{5, 1}, {3, 5, 7}},          // broadcast along the innermost dim
        {{1, 7}, {4, 6, 7}},          // odd runs
        {{3, 1, 5}, {2, 3, 4, 5}},
        {{1}, {9, 10}},
        {{2, 1}, {2, 0}},  // empty
    };
    Generator gen(1612);
    for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
        for (const auto& [from, to] : cases) {
            DYNAMIC_SECTION(dtype_name(dtype) << " " << to_string(from) << " -> " << to_string(to)) {
                const Tensor x = Tensor::normal(from, 0.0, 1.0, gen, dtype);
                CHECK(same_bytes(expand(x.to(kGpu), to), expand(x, to)));
            }
        }
    }
}

TEST_CASE("the q, k, v slices' gradients land in one GPU buffer as on the CPU", "[gpu][layout][narrow]") {
    Generator gen(1613);
    for (const DType dtype : {DType::f32, DType::bf16}) {
        const Tensor value = Tensor::normal({3, 2, 4, 8}, 0.0, 1.0, gen, dtype);
        std::vector<Tensor> weights;
        for (int i = 0; i < 3; ++i) weights.push_back(Tensor::normal({2, 4, 8}, 0.0, 1.0, gen, dtype));
        Tensor grads[2];
        for (const Device device : {Device::cpu(), kGpu}) {
            ComputeGraph graph;
            const Var heads = graph.input(value.to(device), "heads", true);
            Var total;
            for (std::int64_t i = 0; i < 3; ++i) {
                const Var term = mul(select(heads, 0, i), graph.constant(weights[i].to(device)));
                total = i == 0 ? term : add(total, term);
            }
            graph.backward(total, Tensor::ones({2, 4, 8}, dtype, device));
            grads[device.is_cuda()] = heads.grad();
        }
        INFO(dtype_name(dtype));
        CHECK(same_bytes(grads[1], grads[0]));
    }
}
