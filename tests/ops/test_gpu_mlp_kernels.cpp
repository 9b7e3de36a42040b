// The elementwise, loss and conversion kernels of the MLP 4096 training step (16-byte packs, the class losses'
// one-launch forward and per-row backward), bit for bit against what they must equal: the class losses' batch sum
// against the fixed order of the one-block finish kernel the forward folded in (emulated on the host from the
// per-row losses), the fused ReLU and its gradient against the unfused linear on the same GPU, the dtype
// conversions against core/half.h, each past the grid-stride wrap and with a scalar tail. Their values against
// the CPU: the op-table cases of tests/verification/gpu_op_table.cpp and tests/precision/test_gpu_reduced.cpp.
// gelu_mlp's cuBLASLt GELU epilogues against the float64 CPU run and the composition.
// Without a CUDA device (or in a CPU-only build) it prints why and exits 77 (CTest: skipped).
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

const Device kGpu = Device::cuda(0);

bool same_bytes(const Tensor& a, const Tensor& b) {
    const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
    return x.shape() == y.shape() && x.dtype() == y.dtype() &&
           std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// Σ values as one block of 256 threads forms it (ops/loss.cu class_loss_batch_sums with
// ops/row_reduction.cuh block_reduce): thread t adds values t, t + 256, ... from 0.0; each warp folds its 32
// partials by xor shuffles (offsets 16, 8, 4, 2, 1); the first warp folds the 8 warp sums (0 in lanes 8–31)
// the same way.
double block_sum_256(const std::vector<double>& values) {
    constexpr int kThreads = 256, kWarp = 32;
    using Lanes = std::array<double, kWarp>;
    const auto warp_sum = [](Lanes v) {
        for (int offset = kWarp / 2; offset > 0; offset /= 2) {
            Lanes next{};
            for (int lane = 0; lane < kWarp; ++lane) next[lane] = v[lane] + v[lane ^ offset];
            v = next;
        }
        return v[0];
    };
    Lanes warps{};
    for (int w = 0; w < kThreads / kWarp; ++w) {
        Lanes lanes{};
        for (int lane = 0; lane < kWarp; ++lane) {
            double sum = 0.0;
            for (std::size_t i = static_cast<std::size_t>(w * kWarp + lane); i < values.size(); i += kThreads)
                sum += values[i];
            lanes[lane] = sum;
        }
        warps[w] = warp_sum(lanes);
    }
    return warp_sum(warps);
}

struct ClassLossCase {
    const char* label;
    std::int64_t rows, classes;
    bool weighted, nll;
    double smoothing;
};

}  // namespace

TEST_CASE("class losses: the one-launch forward reduces the batch in the finish kernel's fixed order",
          "[gpu][loss]") {
    // cross_entropy's one-block kernel (C <= 32, N times C rounded up to a power of two <= 1024), warp-per-row
    // (C <= 512) and block-per-row tilings, C a multiple of the pack width and not, one row and many more rows
    // than the 256 threads that sum them.
    const ClassLossCase cases[] = {
        {"(37,10)", 37, 10, false, false, 0.0},
        {"(2000,10) weighted, smoothing", 2000, 10, true, false, 0.1},
        {"(32,32) weighted", 32, 32, true, false, 0.0},
        {"(1000,12) weighted, smoothing", 1000, 12, true, false, 0.1},
        {"(1,7)", 1, 7, false, false, 0.0},
        {"(600,1001) weighted", 600, 1001, true, false, 0.0},
        {"(300,4096)", 300, 4096, false, false, 0.0},
        {"nll (513,33) weighted", 513, 33, true, true, 0.0},
        {"nll (64,10)", 64, 10, false, true, 0.0},
    };
    std::uint64_t seed = 9100;
    for (const ClassLossCase& c : cases)
        for (const DType dtype : {DType::f32, DType::f64}) {
            ++seed;
            DYNAMIC_SECTION(c.label << " " << dtype_name(dtype)) {
                Generator gen(seed);
                const Tensor logits = Tensor::normal({c.rows, c.classes}, 0.0, 2.0, gen, dtype).to(kGpu);
                const Tensor weight = Tensor::uniform({c.classes}, 0.25, 2.0, gen, dtype);
                std::vector<std::int64_t> labels(static_cast<std::size_t>(c.rows));
                for (std::size_t i = 0; i < labels.size(); ++i)  // every seventh row ignored
                    labels[i] = i % 7 == 3 ? -100
                                           : static_cast<std::int64_t>(gen.engine()() %
                                                                       static_cast<std::uint64_t>(c.classes));
                const Tensor gpu_labels = Tensor::from_vector(labels, {c.rows}).to(kGpu);
                const Tensor gpu_weight = weight.to(kGpu);
                const auto loss = [&](Reduction reduction) {
                    if (c.nll) {
                        const NllLossOptions o{.reduction = reduction};
                        return c.weighted ? nll_loss(logits, gpu_labels, gpu_weight, o)
                                          : nll_loss(logits, gpu_labels, o);
                    }
                    const CrossEntropyOptions o{.reduction = reduction, .label_smoothing = c.smoothing};
                    return c.weighted ? cross_entropy(logits, gpu_labels, gpu_weight, o)
                                      : cross_entropy(logits, gpu_labels, o);
                };
                // The row losses as the rows kernel stores them (double of the dtype's value) and the row weights.
                const std::vector<double> row_loss = loss(Reduction::None).to_vector();
                const std::vector<double> w = weight.to_vector();
                std::vector<double> row_weight(labels.size(), 0.0);
                for (std::size_t i = 0; i < labels.size(); ++i)
                    if (labels[i] != -100) row_weight[i] = c.weighted ? w[static_cast<std::size_t>(labels[i])] : 1.0;
                const double sum = block_sum_256(row_loss);
                const double denominator = block_sum_256(row_weight);
                const double sum_value = loss(Reduction::Sum).item();
                const double mean_value = loss(Reduction::Mean).item();
                if (dtype == DType::f32) {
                    CHECK(sum_value == static_cast<double>(static_cast<float>(sum)));
                    CHECK(mean_value == static_cast<double>(static_cast<float>(sum / denominator)));
                } else {
                    CHECK(sum_value == sum);
                    CHECK(mean_value == sum / denominator);
                }
                // Launch after launch (the block counter goes back to 0 each time): the same bits.
                for (int again = 0; again < 3; ++again) CHECK(loss(Reduction::Mean).item() == mean_value);
            }
        }
}

TEST_CASE("the fused ReLU and its gradient equal the unfused linear bit for bit, past the grid-stride wrap",
          "[gpu][linear]") {
    // y (3000,3001): 9.0M elements, more 16-byte packs than the grid's threads (132 SMs · 32 blocks · 256 on an
    // H100), and an odd count, so a scalar tail.
    constexpr std::int64_t kRows = 3000, kIn = 64, kOut = 3001;
    std::uint64_t seed = 9200;
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
        ++seed;
        DYNAMIC_SECTION(dtype_name(dtype)) {
            Generator gen(seed);
            const Tensor x = Tensor::normal({kRows, kIn}, 0.0, 1.0, gen).to(dtype).to(kGpu);
            const Tensor w = Tensor::normal({kOut, kIn}, 0.0, 0.2, gen).to(dtype).to(kGpu);
            const Tensor b = Tensor::normal({kOut}, 0.0, 0.5, gen).to(dtype).to(kGpu);
            const Tensor dy = Tensor::normal({kRows, kOut}, 0.0, 1.0, gen).to(dtype).to(kGpu);
            ComputeGraph fused_graph;
            const Var fx = fused_graph.input(x, "x", true), fw = fused_graph.input(w, "w", true),
                      fb = fused_graph.input(b, "b", true);
            const Var fused = linear(fx, fw, fb, Activation::Relu);
            ComputeGraph plain_graph;
            const Var px = plain_graph.input(x, "x", true), pw = plain_graph.input(w, "w", true),
                      pb = plain_graph.input(b, "b", true);
            const Var plain = linear(px, pw, pb);
            // ReluOp on the host: y > 0 ? y : 0; the gradient dy where y > 0, else 0.
            const std::vector<double> z = plain.value().to_vector();
            const std::vector<double> y = fused.value().to_vector();
            const std::vector<double> g = dy.to_vector();
            REQUIRE(y.size() == z.size());
            std::vector<double> masked(g.size());
            std::size_t mismatches = 0;
            for (std::size_t i = 0; i < z.size(); ++i) {
                mismatches += y[i] == (z[i] > 0 ? z[i] : 0.0) ? 0 : 1;
                masked[i] = y[i] > 0 ? g[i] : 0.0;
            }
            CHECK(mismatches == 0);
            fused_graph.backward(fused, dy);
            // The masked dy is exact in the dtype (each value is dy's or 0).
            plain_graph.backward(plain, Tensor::from_vector(masked, {kRows, kOut}, DType::f64).to(dtype).to(kGpu));
            CHECK(same_bytes(fx.grad(), px.grad()));
            CHECK(same_bytes(fw.grad(), pw.grad()));
            CHECK(same_bytes(fb.grad(), pb.grad()));
        }
    }
}

TEST_CASE("dtype conversions by 16-byte groups round as core/half.h, past the grid-stride wrap", "[gpu][cast]") {
    // 9,000,003 elements: more groups than the grid's threads and a tail of 3.
    constexpr std::int64_t kCount = 9'000'003;
    Generator gen(9300);
    const Tensor x64 = Tensor::normal({kCount}, 0.0, 3.0, gen, DType::f64);
    for (const DType from : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
        const Tensor source = x64.to(from);  // rounded on the host
        const Tensor on_gpu = source.to(kGpu);
        for (const DType to : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
            if (to == from) continue;
            INFO(dtype_name(from) << " -> " << dtype_name(to));
            CHECK(same_bytes(on_gpu.to(to), source.to(to)));
        }
    }
}

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "MLP kernel GPU tests"); }

// gelu_mlp (ops/linalg.h) on sizes cuBLASLt's GELU epilogues take (the op table's cases are too small and odd for
// them, so they run the composition's kernels): forward and the five gradients against the same op on the CPU in
// float64 from the same rounded inputs, within the dtype's rounding of the largest value, and against the composition
// (linear, gelu, linear) on the same GPU, where the epilogues differ only by rounding pre once less; with the
// epilogues off (set_gelu_mlp_epilogues) or the exact GELU, the op runs the composition's kernels: equal to it.
struct MlpVariant {
    GeluApproximation form;
    GeluMlpEpilogues which;
};
constexpr MlpVariant kMlpVariants[] = {{GeluApproximation::Tanh, GeluMlpEpilogues::all},
                                       {GeluApproximation::Tanh, GeluMlpEpilogues::forward},
                                       {GeluApproximation::Tanh, GeluMlpEpilogues::none},
                                       {GeluApproximation::None, GeluMlpEpilogues::all}};

TEST_CASE("gelu_mlp's GELU epilogues on the GPU agree with the float64 CPU run and with the composition",
          "[gpu][gelu_mlp]") {
    struct Size {
        std::int64_t rows, in, hidden, out;
    };
    for (const Size size : {Size{256, 64, 256, 64}, Size{1024, 96, 384, 96}}) {
        for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
            for (const auto [form, which] : kMlpVariants) {
                set_gelu_mlp_epilogues(which);
                INFO(dtype_name(dtype) << " rows " << size.rows << " hidden " << size.hidden
                                       << (form == GeluApproximation::Tanh ? " tanh" : " exact") << " epilogues "
                                       << static_cast<int>(which) << " (0 none, 1 forward, 2 all)");
                Generator gen(91);
                const auto random = [&](Shape shape, double stddev) {
                    return Tensor::normal(shape, 0.0, stddev, gen, DType::f32).to(dtype);  // rounded to dtype once
                };
                const std::vector<Tensor> inputs = {random({size.rows, size.in}, 1.0),
                                                    random({size.hidden, size.in}, 0.1),
                                                    random({size.hidden}, 0.1),
                                                    random({size.out, size.hidden}, 0.1),
                                                    random({size.out}, 0.1)};
                const Tensor upstream = random({size.rows, size.out}, 1.0);
                // y and the gradients of sum(y ∘ upstream); `composed`: linear, gelu, linear as three ops.
                const auto run = [&](Device device, DType as, bool composed) {
                    ComputeGraph g;
                    std::vector<Var> v;
                    for (const Tensor& t : inputs) v.push_back(g.input(t.to(device, as), "", true));
                    const Var y = composed ? linear(gelu(linear(v[0], v[1], v[2]), form), v[3], v[4])
                                           : gelu_mlp(v[0], v[1], v[2], v[3], v[4], form);
                    g.backward(y, upstream.to(device, as));
                    std::vector<std::vector<double>> out{y.value().to_vector()};
                    for (const Var& x : v) out.push_back(x.grad().to_vector());
                    return out;
                };
                const auto reference = run(Device::cpu(), DType::f64, false);
                const auto fused = run(kGpu, dtype, false);
                const auto composed = run(kGpu, dtype, true);
                // f32: summation error over up to 1024 terms; bf16/f16: their unit roundoff.
                const double u = dtype == DType::f32 ? 1e-5 : dtype == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
                for (std::size_t i = 0; i < reference.size(); ++i) {
                    double scale = 0, to_reference = 0, to_composed = 0;
                    for (std::size_t j = 0; j < reference[i].size(); ++j) {
                        scale = std::max(scale, std::fabs(reference[i][j]));
                        to_reference = std::max(to_reference, std::fabs(fused[i][j] - reference[i][j]));
                        to_composed = std::max(to_composed, std::fabs(fused[i][j] - composed[i][j]));
                    }
                    INFO("output " << i << " (0: y, then dx, dw1, db1, dw2, db2): max |fused - f64| " << to_reference
                                   << ", max |fused - composed| " << to_composed << " of max " << scale);
                    CHECK(to_reference <= 16 * u * scale);
                    CHECK(to_composed <= 16 * u * scale);
                    // Without epilogues the op runs the composition's kernels in its order.
                    if (which == GeluMlpEpilogues::none || form == GeluApproximation::None) CHECK(to_composed == 0);
                }
            }
        }
    }
    set_gelu_mlp_epilogues(GeluMlpEpilogues::all);
}
