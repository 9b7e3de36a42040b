// scaled_dot_product_attention beyond the op table's cases: against the same attention composed of other ops
// (matmul, masked_fill, softmax), queries that lose every key, dropout's replayable masks, bad mask values, CPU
// thread counts; on a GPU (skipped visibly without one): large cases against the float64 CPU replay, memory
// linear in T, deterministic gradients, bad mask values reported by the kernel.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "catch.h"
#include "attention_support.h"
#include "check_reporting.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/ops/dropout_mask.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::MessageHas;
using dgtest::max_abs_diff;

namespace {

AttentionOptions options_of(bool causal, double dropout_p, std::uint64_t seed) {
    return {.is_causal = causal, .dropout_p = dropout_p, .seed = seed};
}

struct Inputs {
    Tensor q, k, v, keep;  // keep: 0/1, (T,S)
};

// q (B,H,T,D), k, v (B,H,S,D) from normal(0, 1); keep (T,S) a fair coin, but key 0 always kept so that no query
// loses every key (the composed reference would give NaN there).
Inputs random_inputs(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t S, std::int64_t D,
                     std::uint64_t seed, DType dtype = DType::f64) {
    Generator gen(seed);
    Inputs in;
    in.q = Tensor::normal({B, H, T, D}, 0.0, 1.0, gen, dtype);
    in.k = Tensor::normal({B, H, S, D}, 0.0, 1.0, gen, dtype);
    in.v = Tensor::normal({B, H, S, D}, 0.0, 1.0, gen, dtype);
    std::vector<double> keep(static_cast<std::size_t>(T * S));
    std::bernoulli_distribution coin(0.5);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t s = 0; s < S; ++s) keep[t * S + s] = s == 0 || coin(gen.engine()) ? 1.0 : 0.0;
    in.keep = Tensor::from_vector(keep, {T, S}, dtype);
    return in;
}

// Dropout factors (B,H,T,S) from the documented counter: index ((b·H + h)·T + t)·S + s.
Tensor dropout_factors(const Shape& shape, double p, std::uint64_t seed) {
    std::vector<double> f(static_cast<std::size_t>(numel(shape)));
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = math::dropout_keep(seed, i, p) ? 1.0 / (1.0 - p) : 0.0;
    return Tensor::from_vector(f, shape, DType::f64);
}

// Causal as a 0/1 (T,S) keep mask, top-left aligned: s <= t.
Tensor causal_keep(std::int64_t T, std::int64_t S) {
    std::vector<double> keep(static_cast<std::size_t>(T * S));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t s = 0; s < S; ++s) keep[t * S + s] = s <= t ? 1.0 : 0.0;
    return Tensor::from_vector(keep, {T, S}, DType::f64);
}

}  // namespace

TEST_CASE("attention matches its composition from matmul, masked_fill and softmax, with gradients",
          "[attention]") {
    const bool causal = GENERATE(false, true);
    const double dropout_p = GENERATE(0.0, 0.4);
    const std::int64_t B = 2, H = 3, T = 7, S = 11, D = 6;
    const Inputs in = random_inputs(B, H, T, S, D, 101);
    AttentionOptions options = options_of(causal, dropout_p, 99);
    options.scale = 0.37;
    Generator gen(5);
    const Tensor seed_grad = Tensor::normal({B, H, T, D}, 0.0, 1.0, gen, DType::f64);

    ComputeGraph fused;
    Var q1 = fused.input(in.q, "q", true), k1 = fused.input(in.k, "k", true), v1 = fused.input(in.v, "v", true);
    Var y1 = scaled_dot_product_attention(q1, k1, v1, fused.input(in.keep, "keep"), options);
    fused.backward(y1, seed_grad);

    // matmul takes 3-D operands: the composition sees (B·H, T|S, D), the same elements in the same order.
    ComputeGraph composed;
    Var q2 = composed.input(in.q.reshaped({B * H, T, D}), "q", true);
    Var k2 = composed.input(in.k.reshaped({B * H, S, D}), "k", true);
    Var v2 = composed.input(in.v.reshaped({B * H, S, D}), "v", true);
    Tensor keep = in.keep;
    if (causal) keep = eager(OpType::Mul, {keep, causal_keep(T, S)});
    const Tensor dropped = eager(OpType::Eq, {keep, Tensor::zeros({}, DType::f64)});
    Var scores = mul_scalar(matmul(q2, transpose(k2)), 0.37);
    Var probs = softmax(masked_fill(scores, composed.input(dropped, "dropped"),
                                    -std::numeric_limits<double>::infinity()));
    if (dropout_p > 0) probs = mul(probs, composed.input(dropout_factors({B * H, T, S}, dropout_p, 99), "factors"));
    Var y2 = matmul(probs, v2);
    composed.backward(y2, seed_grad.reshaped({B * H, T, D}));

    CHECK(max_abs_diff(y1.value(), y2.value()) < 1e-12);
    CHECK(max_abs_diff(q1.grad(), q2.grad()) < 1e-12);
    CHECK(max_abs_diff(k1.grad(), k2.grad()) < 1e-12);
    CHECK(max_abs_diff(v1.grad(), v2.grad()) < 1e-12);
}

TEST_CASE("a query whose keys are all masked gets 0 and no gradient; no NaN anywhere", "[attention]") {
    const Inputs in = random_inputs(1, 2, 4, 5, 3, 7);
    std::vector<double> keep = in.keep.to_vector();
    for (std::int64_t s = 0; s < 5; ++s) keep[2 * 5 + s] = 0.0;  // query 2 loses every key
    ComputeGraph g;
    Var q = g.input(in.q, "q", true), k = g.input(in.k, "k", true), v = g.input(in.v, "v", true);
    Var y = scaled_dot_product_attention(q, k, v, g.input(Tensor::from_vector(keep, {4, 5}, DType::f64), "keep"));
    g.backward(sum(y));
    const std::vector<double> out = y.value().to_vector(), dq = q.grad().to_vector();
    for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t t = 0; t < 4; ++t)
            for (std::int64_t d = 0; d < 3; ++d) {
                const std::size_t i = static_cast<std::size_t>((h * 4 + t) * 3 + d);
                CHECK(std::isfinite(out[i]));
                CHECK(std::isfinite(dq[i]));
                if (t == 2) {
                    CHECK(out[i] == 0.0);
                    CHECK(dq[i] == 0.0);
                } else {
                    CHECK(out[i] != 0.0);
                }
            }
    for (const double x : k.grad().to_vector()) CHECK(std::isfinite(x));
}

TEST_CASE("attention dropout: the seed alone fixes the mask; another seed drops others", "[attention]") {
    const Inputs in = random_inputs(2, 2, 9, 9, 4, 3);
    const auto run = [&](std::uint64_t seed) {
        return scaled_dot_product_attention(in.q, in.k, in.v, options_of(false, 0.5, seed));
    };
    CHECK(max_abs_diff(run(11), run(11)) == 0.0);
    CHECK(max_abs_diff(run(11), run(12)) > 1e-3);
    CHECK(max_abs_diff(run(11), scaled_dot_product_attention(in.q, in.k, in.v)) > 1e-3);
}

TEST_CASE("attention: a mask value other than 0 or 1 is a ValueError, not an inverted mask", "[attention]") {
    const Inputs in = random_inputs(1, 1, 3, 4, 2, 9);
    // A PyTorch additive mask (0 / -inf) read as a keep mask would silently invert it.
    std::vector<double> additive(12, 0.0);
    additive[1] = -std::numeric_limits<double>::infinity();
    const Tensor mask = Tensor::from_vector(additive, {3, 4}, DType::f64);
    REQUIRE_THROWS_MATCHES(scaled_dot_product_attention(in.q, in.k, in.v, mask), ValueError,
                           MessageHas({"scaled_dot_product_attention", "mask", "0", "1"}));
}

TEST_CASE("attention's CPU results do not depend on the thread count", "[attention]") {
    const Inputs in = random_inputs(4, 8, 33, 47, 16, 21, DType::f32);
    const int saved = cpu_threads();
    const auto run = [&](int threads) {
        set_cpu_threads(threads);
        ComputeGraph g;
        Var q = g.input(in.q, "q", true), k = g.input(in.k, "k", true), v = g.input(in.v, "v", true);
        Var y = scaled_dot_product_attention(q, k, v, options_of(true, 0.1, 4));
        g.backward(sum(y));
        return std::vector<Tensor>{y.value().clone(), q.grad().clone(), k.grad().clone(), v.grad().clone()};
    };
    const std::vector<Tensor> one = run(1), two = run(2);
    set_cpu_threads(saved);
    for (std::size_t i = 0; i < one.size(); ++i) CHECK(max_abs_diff(one[i], two[i]) == 0.0);
}

// ---- GPU ----

namespace {

using dgtest::attention_attrs;
using dgtest::have_gpu;

// Each of `cases` in a section of its own, named `prefix` and the case's label, its inputs drawn from `seed` + the
// case's index: `check(op_case, gen)` passes.
template <typename Check>
void check_each_case(const std::vector<OpCase>& cases, const std::string& prefix, std::uint64_t seed, Check&& check) {
    for (std::size_t index = 0; index < cases.size(); ++index) {
        DYNAMIC_SECTION(prefix << cases[index].label) {
            Generator gen(seed + index);
            const CheckResult r = check(cases[index], gen);
            INFO(dgtest::describe_result(r));
            CHECK(r.pass);
        }
    }
}

}  // namespace

TEST_CASE("attention on the GPU matches the float64 CPU replay on large ragged cases", "[attention][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const OpDef* def = &dgtest::attention_def();
    const std::vector<InputDomain>& masked = dgtest::kMaskedDomains;
    const std::vector<OpCase> cases = {
        {"B2 H3 T77 S130 D64 causal", {{2, 3, 77, 64}, {2, 3, 130, 64}, {2, 3, 130, 64}}, attention_attrs(true), {}},
        {"B2 H3 T77 S130 D64 mask (B,1,T,S)", {{2, 3, 77, 64}, {2, 3, 130, 64}, {2, 3, 130, 64}, {2, 1, 77, 130}},
         attention_attrs(false), masked},
        {"B2 H3 T130 S77 D64 causal, mask (T,S)", {{2, 3, 130, 64}, {2, 3, 77, 64}, {2, 3, 77, 64}, {130, 77}},
         attention_attrs(true), masked},
        {"B1 H2 T200 S65 D128", {{1, 2, 200, 128}, {1, 2, 65, 128}, {1, 2, 65, 128}}, attention_attrs(false), {}},
        {"B1 H2 T129 S129 D96 causal", {{1, 2, 129, 96}, {1, 2, 129, 96}, {1, 2, 129, 96}}, attention_attrs(true), {}},
        {"B3 H1 T100 S90 D32 dropout 0.2", {{3, 1, 100, 32}, {3, 1, 90, 32}, {3, 1, 90, 32}},
         attention_attrs(false, 0.2, 77), {}},
        {"B1 H1 T65 S65 D17 causal dropout 0.1", {{1, 1, 65, 17}, {1, 1, 65, 17}, {1, 1, 65, 17}},
         attention_attrs(true, 0.1, 5), {}},
    };
    check_each_case(cases, "", 8'000'000,
                    [&](const OpCase& c, Generator& gen) { return gpu_vs_cpu_check(*def, c, gen, 1e-5); });
}

TEST_CASE("attention on the GPU: memory linear in T in both backward designs, deterministic gradients in "
          "deterministic mode",
          "[attention][gpu][deterministic]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    // Outside deterministic mode the f32 backward adds dq with atomics (a later test case compares the two).
    const bool deterministic = GENERATE(false, true);
    INFO("deterministic " << deterministic);
    const dgtest::DeterministicMode mode(deterministic);
    const Device gpu = Device::cuda(0);
    const std::int64_t T = 4096, D = 64;
    Generator gen(31);
    const Tensor q = Tensor::normal({1, 2, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor k = Tensor::normal({1, 2, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor v = Tensor::normal({1, 2, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor dy = Tensor::normal({1, 2, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const auto run = [&] {
        ComputeGraph g;
        Var qv = g.input(q, "q", true), kv = g.input(k, "k", true), vv = g.input(v, "v", true);
        Var y = scaled_dot_product_attention(qv, kv, vv, options_of(true, 0.0, 0));
        g.backward(y, dy);
        return std::vector<Tensor>{qv.grad().clone(), kv.grad().clone(), vv.grad().clone()};
    };
    cuda::synchronize(0);
    const std::size_t before = cuda::memory_stats(0).bytes_in_use;
    cuda::reset_peak_memory(0);
    const std::vector<Tensor> first = run();
    cuda::synchronize(0);
    // y, its gradient's three results, lse, delta and the clones: a few (T, D) tensors per head. One T×T matrix of
    // one head alone would be 64 MiB.
    const std::size_t per_tensor = static_cast<std::size_t>(2 * T * D) * sizeof(float);
    CHECK(cuda::memory_stats(0).peak_bytes_in_use - before < 16 * per_tensor);
    const std::vector<Tensor> second = run();
    for (std::size_t i = 0; i < first.size(); ++i)
        if (deterministic || i > 0) CHECK(max_abs_diff(first[i], second[i]) == 0.0);  // dk, dv: no atomics
}

TEST_CASE("attention on the GPU, bf16 at GPT-2's shape: deterministic mode repeats its gradients bit for bit",
          "[attention][gpu][deterministic]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const dgtest::DeterministicMode mode(true);
    const Device gpu = Device::cuda(0);
    Generator gen(47);
    const auto draw = [&] { return Tensor::normal({4, 12, 1024, 64}, 0.0, 1.0, gen, DType::bf16, gpu); };
    const Tensor q = draw(), k = draw(), v = draw(), dy = draw();
    const auto run = [&] {
        ComputeGraph g;
        Var qv = g.input(q, "q", true), kv = g.input(k, "k", true), vv = g.input(v, "v", true);
        g.backward(scaled_dot_product_attention(qv, kv, vv, options_of(true, 0.0, 0)), dy);
        return std::vector<Tensor>{qv.grad().clone(), kv.grad().clone(), vv.grad().clone()};
    };
    const std::vector<Tensor> first = run(), second = run();
    for (std::size_t i = 0; i < first.size(); ++i) {
        INFO("gradient " << i << " (q, k, v)");
        CHECK(max_abs_diff(first[i], second[i]) == 0.0);
    }
}

TEST_CASE("attention on the GPU: a mask value other than 0 or 1 is a ValueError at the next synchronisation",
          "[attention][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const Device gpu = Device::cuda(0);
    Generator gen(3);
    const Tensor q = Tensor::normal({1, 1, 3, 8}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor mask = Tensor::from_vector(std::vector<double>{1, 0, 1, 0.5, 1, 1, 1, 1, 1}, {3, 3}, DType::f32, gpu);
    const Tensor y = scaled_dot_product_attention(q, q, q, mask);
    REQUIRE_THROWS_MATCHES(cuda::synchronize(0), ValueError,
                           MessageHas({"scaled_dot_product_attention", "mask", "position 3", "neither 0 nor 1"}));
    cuda::synchronize(0);  // the record was cleared: the device stays usable
}

namespace {

// Sets the GPU path for a scope and restores the previous one (also when a check throws).
// Our kernels for bf16/f16 too, while in scope (cuDNN takes the cases without mask or dropout otherwise).
struct CudnnOff : dgtest::CudnnSwitch {
    CudnnOff() : dgtest::CudnnSwitch(false) {}
};

class GpuPathScope {
public:
    explicit GpuPathScope(AttentionGpuPath path) : saved_(attention_gpu_path()) { set_attention_gpu_path(path); }
    ~GpuPathScope() { set_attention_gpu_path(saved_); }
    GpuPathScope(const GpuPathScope&) = delete;
    GpuPathScope& operator=(const GpuPathScope&) = delete;

private:
    AttentionGpuPath saved_;
};

double relative_norm_diff(const Tensor& a, const Tensor& b) {
    const std::vector<double> x = a.to_vector(), y = b.to_vector();
    REQUIRE(x.size() == y.size());
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        diff += (x[i] - y[i]) * (x[i] - y[i]);
        norm += y[i] * y[i];
    }
    return std::sqrt(diff / std::max(norm, 1e-300));
}

}  // namespace

TEST_CASE("attention on the GPU: the tensor-core and SIMT float32 paths both match the float64 CPU replay",
          "[attention][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const OpDef* def = &dgtest::attention_def();
    const std::vector<InputDomain>& masked = dgtest::kMaskedDomains;
    // Every padded head dim (32, 64, 128) and a D that pads (and so takes scalar loads); T, S off the tile of 64.
    const std::vector<OpCase> cases = {
        {"B2 H2 T150 S150 D64 causal", {{2, 2, 150, 64}, {2, 2, 150, 64}, {2, 2, 150, 64}}, attention_attrs(true), {}},
        {"B1 H3 T70 S200 D32", {{1, 3, 70, 32}, {1, 3, 200, 32}, {1, 3, 200, 32}}, attention_attrs(false), {}},
        {"B1 H2 T200 S70 D32 causal (keys end before queries)", {{1, 2, 200, 32}, {1, 2, 70, 32}, {1, 2, 70, 32}},
         attention_attrs(true), {}},
        {"B1 H2 T129 S65 D128 mask (H,T,S)", {{1, 2, 129, 128}, {1, 2, 65, 128}, {1, 2, 65, 128}, {2, 129, 65}},
         attention_attrs(false), masked},
        {"B2 H1 T97 S131 D128 causal", {{2, 1, 97, 128}, {2, 1, 131, 128}, {2, 1, 131, 128}}, attention_attrs(true), {}},
        {"B2 H2 T80 S90 D40 dropout 0.3", {{2, 2, 80, 40}, {2, 2, 90, 40}, {2, 2, 90, 40}},
         attention_attrs(false, 0.3, 12), {}},
        {"B1 H1 T33 S47 D17 causal", {{1, 1, 33, 17}, {1, 1, 47, 17}, {1, 1, 47, 17}}, attention_attrs(true), {}},
        {"B1 H2 T64 S64 D96 causal dropout 0.1, mask (T,S)", {{1, 2, 64, 96}, {1, 2, 64, 96}, {1, 2, 64, 96}, {64, 64}},
         attention_attrs(true, 0.1, 3), masked},
    };
    for (const AttentionGpuPath path : {AttentionGpuPath::simt, AttentionGpuPath::tensor_cores}) {
        const GpuPathScope scope(path);
        const char* name = path == AttentionGpuPath::simt ? "simt" : "tensor cores";
        check_each_case(cases, str(name, ": "), 9'000'000,
                        [&](const OpCase& c, Generator& gen) { return gpu_vs_cpu_check(*def, c, gen, 1e-5); });
    }
}

TEST_CASE("attention on the GPU, f32 tensor cores: deterministic mode repeats its gradients bit for bit; the "
          "fused backward with dq atomics agrees with it",
          "[attention][gpu][deterministic]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const GpuPathScope scope(AttentionGpuPath::tensor_cores);
    const bool causal = GENERATE(false, true);
    const std::int64_t D = GENERATE(32, 64, 128);  // every padded head dim: one fused kernel each
    INFO("causal " << causal << ", D " << D);
    const Device gpu = Device::cuda(0);
    const std::int64_t B = 2, H = 4, T = 333, S = 300;  // ragged: 6 query tiles, 5 key blocks adding into dq
    Generator gen(47 + static_cast<std::uint64_t>(D));
    const Tensor q = Tensor::normal({B, H, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor k = Tensor::normal({B, H, S, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor v = Tensor::normal({B, H, S, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor dy = Tensor::normal({B, H, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    // y, dq, dk, dv; `only_q`: k and v need no gradient (the dq kernel alone, in either mode).
    const auto run = [&](bool deterministic, bool only_q) {
        const dgtest::DeterministicMode mode(deterministic);
        ComputeGraph g;
        Var qv = g.input(q, "q", true), kv = g.input(k, "k", !only_q), vv = g.input(v, "v", !only_q);
        Var y = scaled_dot_product_attention(qv, kv, vv, options_of(causal, 0.0, 0));
        g.backward(y, dy);
        std::vector<Tensor> out{y.value().clone(), qv.grad().clone()};
        if (!only_q) {
            out.push_back(kv.grad().clone());
            out.push_back(vv.grad().clone());
        }
        return out;
    };
    const std::vector<Tensor> first = run(true, false), second = run(true, false);
    const std::vector<Tensor> fused = run(false, false), fused_again = run(false, false);
    const std::vector<Tensor> dq_only = run(false, true);
    const char* names[] = {"y", "dq", "dk", "dv"};
    for (std::size_t i = 0; i < first.size(); ++i) {
        INFO(names[i]);
        CHECK(max_abs_diff(first[i], second[i]) == 0.0);  // bit for bit
        // Atomics add dq's key blocks in the order they finish: equal to rounding, not bit for bit.
        CHECK(relative_norm_diff(fused[i], first[i]) < 1e-5);
        CHECK(relative_norm_diff(fused_again[i], first[i]) < 1e-5);
    }
    // dq came from the fused kernel: its partial sums (one per key block, each scaled, then added in f32) round
    // differently from the dq kernel's single accumulator.
    CHECK(max_abs_diff(fused[1], first[1]) > 0.0);
    CHECK(max_abs_diff(fused[0], first[0]) == 0.0);  // the same forward
    CHECK(relative_norm_diff(dq_only[1], first[1]) < 1e-5);
}

TEST_CASE("attention on the GPU, f32 tensor cores: NaNs of any bits reach the output through the 3xTF32 split",
          "[attention][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const GpuPathScope scope(AttentionGpuPath::tensor_cores);
    const std::int64_t T = 70, S = 80, D = 64;
    Generator gen(53);
    Tensor q = Tensor::normal({1, 1, T, D}, 0.0, 1.0, gen, DType::f32);
    const Tensor k = Tensor::normal({1, 1, S, D}, 0.0, 1.0, gen, DType::f32);
    Tensor v = Tensor::normal({1, 1, S, D}, 0.0, 1.0, gen, DType::f32);
    // All-ones mantissas: adding half a TF32 unit to these bits (the split's rounding of the large part) carries
    // past the exponent and sign, so only the small part x − large keeps the NaN.
    q.data<float>()[5 * D + 3] = std::bit_cast<float>(0x7fffffffu);  // query 5: every score NaN
    v.data<float>()[7 * D + 1] = std::bit_cast<float>(0xffffffffu);  // value column 1 of key 7
    const Tensor expected = scaled_dot_product_attention(q, k, v);
    const std::vector<double> y =
        scaled_dot_product_attention(q.to(Device::cuda(0)), k.to(Device::cuda(0)), v.to(Device::cuda(0)))
            .to_vector();
    const std::vector<double> want = expected.to_vector();
    REQUIRE(y.size() == want.size());
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t d = 0; d < D; ++d) {
            const std::size_t i = static_cast<std::size_t>(t * D + d);
            INFO("t " << t << ", d " << d << ": " << y[i] << " (CPU " << want[i] << ")");
            const bool nan = t == 5 || d == 1;
            REQUIRE(std::isnan(want[i]) == nan);
            CHECK(std::isnan(y[i]) == nan);
            if (!nan) CHECK(std::abs(y[i] - want[i]) <= 1e-5 * (1.0 + std::abs(want[i])));
        }
}

TEST_CASE("attention on the GPU: the tensor-core path runs when selected and agrees with SIMT to ~1e-6",
          "[attention][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const Device gpu = Device::cuda(0);
    const bool causal = GENERATE(false, true);
    const std::int64_t B = 2, H = 4, T = 333, D = 64;
    Generator gen(41);
    const Tensor q = Tensor::normal({B, H, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor k = Tensor::normal({B, H, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor v = Tensor::normal({B, H, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const Tensor dy = Tensor::normal({B, H, T, D}, 0.0, 1.0, gen, DType::f32, gpu);
    const auto run = [&](AttentionGpuPath path) {
        const GpuPathScope scope(path);
        ComputeGraph g;
        Var qv = g.input(q, "q", true), kv = g.input(k, "k", true), vv = g.input(v, "v", true);
        Var y = scaled_dot_product_attention(qv, kv, vv, options_of(causal, 0.0, 0));
        g.backward(y, dy);
        return std::vector<Tensor>{y.value().clone(), qv.grad().clone(), kv.grad().clone(), vv.grad().clone()};
    };
    const std::vector<Tensor> simt = run(AttentionGpuPath::simt);
    const std::vector<Tensor> tensor = run(AttentionGpuPath::tensor_cores);
    {
        const GpuPathScope scope(AttentionGpuPath::tensor_cores);
        // The project's builds target sm_90 (CMAKE_CUDA_ARCHITECTURES): tensor cores are there on every device
        // these tests run on.
        REQUIRE(attention_uses_tensor_cores());
    }
    {
        const GpuPathScope scope(AttentionGpuPath::simt);
        CHECK_FALSE(attention_uses_tensor_cores());
    }
    const char* names[] = {"y", "dq", "dk", "dv"};
    for (std::size_t i = 0; i < simt.size(); ++i) {
        INFO(names[i]);
        // Another arithmetic (3xTF32 products): not the same bits, but the same values to ~float32 accuracy.
        CHECK(max_abs_diff(simt[i], tensor[i]) > 0.0);
        CHECK(relative_norm_diff(tensor[i], simt[i]) < 1e-5);
    }
}

namespace {

// The cases that break fragment code (the mma.sync kernels, ops/attention_mma.cu): every length of
// `lengths` as T and as S, both equal and not, against every head dim (32 and 64 as they are, 40 and 80 padded to 64
// and 128, 128), each (T, S) pair and each D taking every variant once: plain, causal, a padding mask (B,1,1,S)
// (a fair coin per key: at S 15 whole rows may lose every key), causal with dropout, and causal with a padding
// mask and dropout. Then head dims whose rows are not whole 16-byte vectors (the plain loads instead of cp.async):
// D 17 in both dtypes, D 100 in bf16 (200 bytes; 400 in f32, which copies them).
std::vector<OpCase> fragment_sweep_cases() {
    using D = InputDomain;
    const std::int64_t lengths[] = {1, 15, 64, 65, 127, 200, 300};
    const std::int64_t head_dims[] = {32, 40, 64, 80, 128};
    constexpr int kLengths = 7, kDims = 5, kVariants = 5;
    std::vector<OpCase> cases;
    for (int pair = 0; pair < 2 * kLengths; ++pair) {
        // A query that sees a single key has softmax 1 and dq = 0 exactly; the GPU's dq is then the rounding of
        // dP - D (two sums of the same products taken different ways), which no relative norm can judge — the H100
        // failed every such case at 1e25 relative with absolute errors at the rounding level. So S >= 2, T = 1 is
        // never causal, and a padding mask (shared by every query) needs S >= 15 to leave a row two keys.
        const std::int64_t T = lengths[pair / 2];
        const std::int64_t S = std::max<std::int64_t>(2, pair % 2 == 0 ? T : lengths[(pair / 2 + 3) % kLengths]);
        for (int d = 0; d < kDims; ++d) {
            const std::int64_t head_dim = head_dims[d];
            const int variant = (pair + d) % kVariants;
            const bool causal = (variant == 1 || variant >= 3) && T > 1;
            const bool padding = (variant == 2 || variant == 4) && S >= 15;
            const double dropout = variant >= 3 ? 0.15 : 0.0;
            OpCase c;
            c.label = str("T", T, " S", S, " D", head_dim, causal ? " causal" : "", padding ? " padding mask" : "",
                          dropout > 0 ? " dropout 0.15" : "");
            c.shapes = {{1, 2, T, head_dim}, {1, 2, S, head_dim}, {1, 2, S, head_dim}};
            if (padding) {
                c.shapes.push_back({1, 1, 1, S});
                c.domains = {D::Any, D::Any, D::Any, D::Mask};
            }
            c.attrs = attention_attrs(causal, dropout, 1000 + static_cast<std::uint64_t>(cases.size()));
            cases.push_back(c);
        }
    }
    const std::vector<D> padded = {D::Any, D::Any, D::Any, D::Mask};
    cases.push_back({"T77 S130 D17 causal padding mask dropout 0.15",
                     {{1, 2, 77, 17}, {1, 2, 130, 17}, {1, 2, 130, 17}, {1, 1, 1, 130}},
                     attention_attrs(true, 0.15, 2000), padded});
    cases.push_back({"T200 S65 D17", {{1, 2, 200, 17}, {1, 2, 65, 17}, {1, 2, 65, 17}}, attention_attrs(false), {}});
    cases.push_back({"T130 S77 D100 padding mask", {{1, 2, 130, 100}, {1, 2, 77, 100}, {1, 2, 77, 100}, {1, 1, 1, 77}},
                     attention_attrs(false), padded});
    cases.push_back(
        {"T65 S200 D100 causal", {{1, 2, 65, 100}, {1, 2, 200, 100}, {1, 2, 200, 100}}, attention_attrs(true), {}});
    return cases;
}

}  // namespace

TEST_CASE("the GPU sweep's cases are well-formed: float32 on the CPU agrees with float64 on each", "[attention]") {
    const OpDef* def = &dgtest::attention_def();
    check_each_case(fragment_sweep_cases(), "", 12'000'000,
                    [&](const OpCase& c, Generator& gen) { return float32_check(*def, c, gen, 1e-5); });
}

TEST_CASE("attention on the GPU: the tensor-core kernels over ragged T, S and every head dim, f32 and bf16, forward "
          "and gradients against the float64 replay",
          "[attention][gpu][mma]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const OpDef* def = &dgtest::attention_def();
    const GpuPathScope scope(AttentionGpuPath::tensor_cores);
    const CudnnOff kernels_only;  // bf16 cases without mask or dropout would otherwise run on cuDNN
    const std::vector<OpCase> cases = fragment_sweep_cases();
    REQUIRE(cases.size() == 74);
    // Both f32 backward designs: fused with dq atomics (default) and the deterministic pair of kernels.
    for (const bool deterministic : {false, true}) {
        const dgtest::DeterministicMode mode(deterministic);
        const char* mode_name = deterministic ? "deterministic" : "atomics";
        for (const DType dtype : {DType::f32, DType::bf16}) {
            const auto check = [&](const OpCase& c, Generator& gen) {
                if (dtype == DType::f32) return gpu_vs_cpu_check(*def, c, gen, 1e-5);
                return reduced_precision_check(*def, c, gen, dtype, reduced_precision_tolerance(*def, dtype),
                                               Device::cuda(0));
            };
            check_each_case(cases, str(mode_name, ", ", dtype_name(dtype), ": "), 11'000'000, check);
        }
    }
}

// ---- bf16 / f16 on the GPU (native: 16-bit tensor-core products, f32 softmax and accumulators) ----

TEST_CASE("attention on the GPU in bf16 and f16 matches the float64 replay from the same rounded inputs",
          "[attention][gpu][reduced]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const CudnnOff kernels_only;  // our 16-bit kernels (cuDNN has tests/attention/test_attention_cudnn.cpp)
    const OpDef* def = &dgtest::attention_def();
    const std::vector<InputDomain>& masked = dgtest::kMaskedDomains;
    // T = 300 (4 full tiles and a ragged one), both big head dims, a D that pads (scalar loads), causal, a padding
    // mask, dropout.
    const std::vector<OpCase> cases = {
        {"B2 H2 T300 S300 D64 causal", {{2, 2, 300, 64}, {2, 2, 300, 64}, {2, 2, 300, 64}}, attention_attrs(true), {}},
        {"B1 H2 T300 S300 D128 causal", {{1, 2, 300, 128}, {1, 2, 300, 128}, {1, 2, 300, 128}},
         attention_attrs(true), {}},
        {"B2 H2 T300 S300 D64 padding mask (B,1,1,S)",
         {{2, 2, 300, 64}, {2, 2, 300, 64}, {2, 2, 300, 64}, {2, 1, 1, 300}}, attention_attrs(false), masked},
        {"B2 H1 T300 S300 D128 padding mask (B,1,1,S), causal",
         {{2, 1, 300, 128}, {2, 1, 300, 128}, {2, 1, 300, 128}, {2, 1, 1, 300}}, attention_attrs(true), masked},
        {"B2 H2 T300 S300 D64 dropout 0.2", {{2, 2, 300, 64}, {2, 2, 300, 64}, {2, 2, 300, 64}},
         attention_attrs(false, 0.2, 23), {}},
        {"B1 H2 T300 S300 D128 causal dropout 0.1", {{1, 2, 300, 128}, {1, 2, 300, 128}, {1, 2, 300, 128}},
         attention_attrs(true, 0.1, 7), {}},
        {"B1 H2 T300 S170 D40 mask (T,S)", {{1, 2, 300, 40}, {1, 2, 170, 40}, {1, 2, 170, 40}, {300, 170}},
         attention_attrs(false), masked},
        {"B1 H1 T100 S300 D32 causal", {{1, 1, 100, 32}, {1, 1, 300, 32}, {1, 1, 300, 32}}, attention_attrs(true), {}},
    };
    for (const DType dtype : {DType::bf16, DType::f16}) {
        const double tolerance = reduced_precision_tolerance(*def, dtype);
        check_each_case(cases, str(dtype_name(dtype), ": "), 10'000'000, [&](const OpCase& c, Generator& gen) {
            return reduced_precision_check(*def, c, gen, dtype, tolerance, Device::cuda(0));
        });
    }
}

TEST_CASE("attention on the GPU in bf16 and f16 runs natively: not the float32 result rounded, deterministic",
          "[attention][gpu][reduced]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const CudnnOff kernels_only;  // our 16-bit kernels (cuDNN has tests/attention/test_attention_cudnn.cpp)
    const Device gpu = Device::cuda(0);
    const DType dtype = GENERATE(DType::bf16, DType::f16);
    INFO(dtype_name(dtype));
    const std::int64_t B = 2, H = 2, T = 300, D = 64;
    Generator gen(43);
    const auto rounded = [&](const Shape& shape) {
        return Tensor::normal(shape, 0.0, 1.0, gen, DType::f32).to(dtype).to(gpu);
    };
    const Tensor q = rounded({B, H, T, D}), k = rounded({B, H, T, D}), v = rounded({B, H, T, D});
    const Tensor dy = rounded({B, H, T, D});
    const auto run = [&](DType compute) {
        ComputeGraph g;
        Var qv = g.input(q.to(compute), "q", true), kv = g.input(k.to(compute), "k", true);
        Var vv = g.input(v.to(compute), "v", true);
        Var y = scaled_dot_product_attention(qv, kv, vv, options_of(true, 0.1, 19));
        g.backward(y, dy.to(compute));
        return std::vector<Tensor>{y.value().clone(), qv.grad().clone(), kv.grad().clone(), vv.grad().clone()};
    };
    const std::vector<Tensor> native = run(dtype);
    const std::vector<Tensor> again = run(dtype);
    const std::vector<Tensor> wide = run(DType::f32);
    const char* names[] = {"y", "dq", "dk", "dv"};
    for (std::size_t i = 0; i < native.size(); ++i) {
        INFO(names[i]);
        CHECK(native[i].dtype() == dtype);
        CHECK(max_abs_diff(native[i], again[i]) == 0.0);
        // Through f32, y would be the f32 kernel's y rounded once, bit for bit; the native forward rounds P for
        // P·V, so some elements differ. Every result stays within a few units of the dtype's rounding.
        if (i == 0) CHECK(max_abs_diff(native[i], wide[i].to(dtype)) > 0.0);
        CHECK(relative_norm_diff(native[i], wide[i]) < 16 * unit_roundoff(dtype));
    }
}

TEST_CASE("qkv_attention: bad shapes, heads, dropout and scale are typed errors naming the op; nothing recorded",
          "[attention][qkv_attention]") {
    Generator gen(7);
    const Tensor qkv = Tensor::normal({2, 5, 12}, 0.0, 1.0, gen, DType::f64);
    ComputeGraph g;
    const Var x = g.input(qkv, "qkv", true);
    const Var flat = g.input(Tensor::normal({10, 12}, 0.0, 1.0, gen, DType::f64));
    const Var integers = g.input(Tensor::zeros({2, 5, 12}, DType::i64));
    const std::size_t nodes = g.size();
    CHECK_THROWS_MATCHES(qkv_attention(x, 5), ShapeError, MessageHas({"qkv_attention", "(2,5,12)", "num_heads 5"}));
    CHECK_THROWS_MATCHES(qkv_attention(x, 0), ValueError, MessageHas({"qkv_attention", "num_heads must be >= 1"}));
    CHECK_THROWS_MATCHES(qkv_attention(flat, 2), ShapeError, MessageHas({"qkv_attention", "(B, T, 3·E)"}));
    CHECK_THROWS_MATCHES(qkv_attention(x, 2, {.dropout_p = 1.0}), ValueError, MessageHas({"dropout_p", "[0, 1)"}));
    CHECK_THROWS_MATCHES(qkv_attention(x, 2, {.scale = std::numeric_limits<double>::infinity()}), ValueError,
                         MessageHas({"scale must be finite"}));
    CHECK_THROWS_AS(qkv_attention(integers, 2), DTypeError);
    CHECK(g.size() == nodes);  // no failed call left a node
    // The valid call still works after the refusals, and equals the composition it stands for.
    const Var y = qkv_attention(x, 2, {.is_causal = true});
    const Var parts = permute(reshape(x, {2, 5, 3, 2, 2}), {2, 0, 3, 1, 4});
    const Var composed = reshape(permute(scaled_dot_product_attention(select(parts, 0, 0), select(parts, 0, 1),
                                                                      select(parts, 0, 2), {.is_causal = true}),
                                         {0, 2, 1, 3}),
                                 {2, 5, 4});
    CHECK(max_abs_diff(y.value(), composed.value()) == 0.0);
}
