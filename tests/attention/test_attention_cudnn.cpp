// bf16/f16 attention on cuDNN's fused flash attention (ops/attention_cudnn.cu): forward and the three gradients
// against the float64 CPU replay with cuDNN asserted to have run them; the cases it leaves to dyngrad's kernels
// (dropout, a mask, D not a multiple of 8, the switch off) asserted not to; a forward on one path with the
// backward on the other; a captured training step replaying to the eager result. GPU cases skip visibly without
// a device; the switch and the status line are checked everywhere. qkv_attention (the packed layouts): against the
// float64 replay and the unpacked composition, on cuDNN, and on the kernels where cuDNN does not run it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/cuda/capture.h"
#include "attention_support.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

using dgtest::CudnnSwitch;
using dgtest::have_gpu;
using dgtest::attention_attrs;

const char* impl_name(AttentionImpl impl) {
    switch (impl) {
        case AttentionImpl::cudnn: return "cudnn";
        case AttentionImpl::kernels: return "kernels";
        default: return "none";
    }
}

struct Qkv {
    Tensor q, k, v, dy;
};

// Fresh normal inputs rounded to `dtype`, on the GPU.
Qkv random_qkv(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t S, std::int64_t D, DType dtype,
               std::uint64_t seed) {
    Generator gen(seed);
    const auto rounded = [&](const Shape& shape) {
        return Tensor::normal(shape, 0.0, 1.0, gen, DType::f32).to(dtype).to(Device::cuda(0));
    };
    return {rounded({B, H, T, D}), rounded({B, H, S, D}), rounded({B, H, S, D}), rounded({B, H, T, D})};
}

// y, dq, dk, dv of one forward + backward.
std::vector<Tensor> forward_backward(const Qkv& in, const AttentionOptions& options) {
    ComputeGraph g;
    Var q = g.input(in.q, "q", true), k = g.input(in.k, "k", true), v = g.input(in.v, "v", true);
    Var y = scaled_dot_product_attention(q, k, v, options);
    g.backward(y, in.dy);
    return {y.value().clone(), q.grad().clone(), k.grad().clone(), v.grad().clone()};
}

}  // namespace

TEST_CASE("cuDNN attention: the switch and the status line", "[attention][cudnn]") {
    const bool initial = attention_cudnn_enabled();
    {
        CudnnSwitch off(false);
        CHECK_FALSE(attention_cudnn_enabled());
        CHECK(attention_cudnn_status().find(cuda_compiled() ? "disabled" : "unavailable") != std::string::npos);
        set_attention_cudnn(true);
        CHECK(attention_cudnn_enabled());
    }
    CHECK(attention_cudnn_enabled() == initial);
    if (!cuda_compiled()) {
        // No GPU call can have run: the query says so.
        CHECK(attention_last_run().forward == AttentionImpl::none);
        CHECK(attention_last_run().backward == AttentionImpl::none);
    }
}

TEST_CASE("cuDNN attention in bf16 and f16 matches the float64 replay, and cuDNN ran it",
          "[attention][cudnn][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    CudnnSwitch on(true);
    const OpDef* def = &dgtest::attention_def();
    struct Case {
        const char* label;
        std::int64_t B, H, T, S, D;
    };
    const std::vector<Case> cases = {
        {"B2 H2 T64 S64 D32", 2, 2, 64, 64, 32},         {"B2 H2 T200 S200 D64", 2, 2, 200, 200, 64},
        {"B1 H2 T1024 S1024 D128", 1, 2, 1024, 1024, 128}, {"B1 H2 T1024 S1024 D64", 1, 2, 1024, 1024, 64},
        {"B1 H3 T200 S77 D64", 1, 3, 200, 77, 64},       {"B2 H1 T77 S300 D128", 2, 1, 77, 300, 128},
    };
    for (const DType dtype : {DType::bf16, DType::f16}) {
        for (const bool causal : {false, true}) {
            for (std::size_t index = 0; index < cases.size(); ++index) {
                const Case& c = cases[index];
                DYNAMIC_SECTION(dtype_name(dtype) << (causal ? " causal " : " ") << c.label) {
                    const OpCase op_case{c.label,
                                         {{c.B, c.H, c.T, c.D}, {c.B, c.H, c.S, c.D}, {c.B, c.H, c.S, c.D}},
                                         attention_attrs(causal),
                                         {}};
                    Generator gen(20'000'000 + index + (causal ? 100 : 0));
                    const double tolerance = reduced_precision_tolerance(*def, dtype);
                    const CheckResult r =
                        reduced_precision_check(*def, op_case, gen, dtype, tolerance, Device::cuda(0));
                    const AttentionRunInfo ran = attention_last_run();
                    INFO(r.check << ", " << r.case_label << ": max rel err " << r.max_rel_err << " = "
                                 << r.max_rel_err / unit_roundoff(dtype) << " u (tolerance " << r.tolerance << "), "
                                 << r.detail);
                    INFO("forward on " << impl_name(ran.forward) << " (" << ran.forward_reason << "), backward on "
                                       << impl_name(ran.backward) << " (" << ran.backward_reason << "); "
                                       << attention_cudnn_status());
                    CHECK(r.pass);
                    CHECK(ran.forward == AttentionImpl::cudnn);
                    CHECK(ran.backward == AttentionImpl::cudnn);
                }
            }
        }
    }
}

TEST_CASE("cuDNN attention: dropout, a mask, D = 36 and the switch off run on the kernels, correctly",
          "[attention][cudnn][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const OpDef* def = &dgtest::attention_def();
    const std::vector<InputDomain>& masked = dgtest::kMaskedDomains;
    struct Case {
        OpCase op_case;
        bool enabled;
        const char* reason;  // words of the recorded reason
    };
    const std::vector<Case> cases = {
        {{"dropout 0.1", {{1, 2, 200, 64}, {1, 2, 200, 64}, {1, 2, 200, 64}}, attention_attrs(true, 0.1, 3), {}},
         true, "dropout"},
        {{"padding mask (B,1,1,S)", {{2, 2, 200, 64}, {2, 2, 200, 64}, {2, 2, 200, 64}, {2, 1, 1, 200}},
          attention_attrs(false), masked},
         true, "mask"},
        {{"D36", {{1, 2, 200, 36}, {1, 2, 200, 36}, {1, 2, 200, 36}}, attention_attrs(true), {}}, true, "head dim"},
        {{"switch off", {{1, 2, 200, 64}, {1, 2, 200, 64}, {1, 2, 200, 64}}, attention_attrs(true), {}}, false,
         "disabled"},
    };
    for (const DType dtype : {DType::bf16, DType::f16}) {
        for (const Case& c : cases) {
            DYNAMIC_SECTION(dtype_name(dtype) << " " << c.op_case.label) {
                CudnnSwitch set(c.enabled);
                Generator gen(30'000'000);
                const double tolerance = reduced_precision_tolerance(*def, dtype);
                const CheckResult r = reduced_precision_check(*def, c.op_case, gen, dtype, tolerance, Device::cuda(0));
                const AttentionRunInfo ran = attention_last_run();
                INFO(r.case_label << ": max rel err " << r.max_rel_err << " (tolerance " << r.tolerance << "), "
                                  << r.detail << "; forward reason: " << ran.forward_reason);
                CHECK(r.pass);
                CHECK(ran.forward == AttentionImpl::kernels);
                CHECK(ran.backward == AttentionImpl::kernels);
                CHECK(ran.forward_reason.find(c.reason) != std::string::npos);
                CHECK(ran.backward_reason.find(c.reason) != std::string::npos);
            }
        }
    }
}

TEST_CASE("cuDNN attention: a forward on one path and the backward on the other agree with either alone",
          "[attention][cudnn][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const DType dtype = GENERATE(DType::bf16, DType::f16);
    const bool causal = GENERATE(false, true);
    INFO(dtype_name(dtype) << (causal ? " causal" : ""));
    const Qkv in = random_qkv(2, 2, 300, 300, 64, dtype, 41);
    AttentionOptions options;
    options.is_causal = causal;
    std::vector<Tensor> kernels, cudnn;
    {
        CudnnSwitch off(false);
        kernels = forward_backward(in, options);
    }
    {
        CudnnSwitch on(true);
        cudnn = forward_backward(in, options);
        REQUIRE(attention_last_run().forward == AttentionImpl::cudnn);
        REQUIRE(attention_last_run().backward == AttentionImpl::cudnn);
    }
    for (const bool forward_on_cudnn : {false, true}) {
        INFO("forward on " << (forward_on_cudnn ? "cudnn" : "kernels") << ", backward on the other");
        ComputeGraph g;
        Var q = g.input(in.q, "q", true), k = g.input(in.k, "k", true), v = g.input(in.v, "v", true);
        Var y;
        {
            CudnnSwitch forward(forward_on_cudnn);
            y = scaled_dot_product_attention(q, k, v, options);
        }
        {
            CudnnSwitch backward(!forward_on_cudnn);
            g.backward(y, in.dy);
        }
        const AttentionRunInfo ran = attention_last_run();
        CHECK(ran.forward == (forward_on_cudnn ? AttentionImpl::cudnn : AttentionImpl::kernels));
        CHECK(ran.backward == (forward_on_cudnn ? AttentionImpl::kernels : AttentionImpl::cudnn));
        const std::vector<Tensor> mixed = {y.value(), q.grad(), k.grad(), v.grad()};
        const std::vector<Tensor>& same_forward = forward_on_cudnn ? cudnn : kernels;
        const char* names[] = {"y", "dq", "dk", "dv"};
        for (std::size_t i = 0; i < mixed.size(); ++i) {
            INFO(names[i]);
            // The forward is the same call as that path's own run; the gradients differ from both pure runs by
            // rounding only (the saved log-sum-exp means the same on both paths).
            if (i == 0) CHECK(max_abs_error(mixed[i], same_forward[i]) == 0.0);
            CHECK(relative_norm_error(mixed[i], kernels[i]) < 8 * unit_roundoff(dtype));
            CHECK(relative_norm_error(mixed[i], cudnn[i]) < 8 * unit_roundoff(dtype));
        }
    }
}

TEST_CASE("cuDNN attention in a captured training step replays to the eager result", "[attention][cudnn][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    CudnnSwitch on(true);
    const DType dtype = GENERATE(DType::bf16, DType::f16);
    INFO(dtype_name(dtype));
    // The step's result: y and the three gradients, flattened into one tensor.
    const auto step_fn = [](std::span<const Tensor> in) {
        ComputeGraph g;
        Var q = g.input(in[0], "q", true), k = g.input(in[1], "k", true), v = g.input(in[2], "v", true);
        AttentionOptions options;
        options.is_causal = true;
        Var y = scaled_dot_product_attention(q, k, v, options);
        g.backward(y, in[3]);
        const Shape flat{y.value().numel()};
        return concat({y.value().reshaped(flat), q.grad().reshaped(flat), k.grad().reshaped(flat),
                       v.grad().reshaped(flat)},
                      0);
    };
    cuda::CapturedStep step(step_fn);
    for (int run = 0; run < 4; ++run) {  // warm-up (eager), capture, two replays
        INFO("run " << run);
        const Qkv in = random_qkv(2, 2, 256, 256, 64, dtype, 50 + static_cast<std::uint64_t>(run));
        const std::vector<Tensor> inputs{in.q, in.k, in.v, in.dy};
        const Tensor stepped = step.run(inputs).clone();
        const Tensor eager = step_fn(inputs);
        CHECK(attention_last_run().forward == AttentionImpl::cudnn);
        CHECK(attention_last_run().backward == AttentionImpl::cudnn);
        // cuDNN's backward accumulates dQ with atomics: the same up to rounding, not bit for bit.
        CHECK(relative_norm_error(stepped, eager) < 2 * unit_roundoff(dtype));
    }
    CHECK(step.variants() == 1);
}

namespace {

// qkv_attention's output and dqkv, and the same through the layout ops around scaled_dot_product_attention
// (the composition it replaces), from one qkv and upstream gradient.
struct PackedRun {
    std::vector<double> y, dqkv;
};
PackedRun packed_run(const Tensor& qkv, const Tensor& dy, std::int64_t heads, const AttentionOptions& options,
                     bool composed) {
    ComputeGraph g;
    const Var x = g.input(qkv, "qkv", true);
    Var y;
    if (composed) {
        const std::int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (3 * heads);
        const Var parts = permute(reshape(x, {B, T, 3, heads, D}), {2, 0, 3, 1, 4});
        y = reshape(permute(scaled_dot_product_attention(select(parts, 0, 0), select(parts, 0, 1), select(parts, 0, 2),
                                                         options),
                            {0, 2, 1, 3}),
                    {B, T, heads * D});
    } else {
        y = qkv_attention(x, heads, options);
    }
    g.backward(y, dy);
    return {y.value().to_vector(), x.grad().to_vector()};
}

}  // namespace

TEST_CASE("qkv_attention on cuDNN reads q, k, v in place and writes y and dqkv packed: the float64 replay and "
          "the unpacked composition agree",
          "[attention][cudnn][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    CudnnSwitch on(true);
    const OpDef* def = find_op("qkv_attention");
    REQUIRE(def != nullptr);
    struct Case {
        const char* label;
        std::int64_t B, T, H, D;
    };
    // GPT-2's layer (T 1024, 12 heads of 64) and smaller ones with other head dims and an odd length.
    const std::vector<Case> cases = {
        {"B2 T64 H2 D32", 2, 64, 2, 32}, {"B1 T200 H3 D64", 1, 200, 3, 64}, {"B1 T1024 H12 D64", 1, 1024, 12, 64},
        {"B2 T77 H1 D128", 2, 77, 1, 128}};
    for (const DType dtype : {DType::bf16, DType::f16}) {
        for (const bool causal : {false, true}) {
            for (std::size_t index = 0; index < cases.size(); ++index) {
                const Case& c = cases[index];
                DYNAMIC_SECTION(dtype_name(dtype) << (causal ? " causal " : " ") << c.label) {
                    OpAttrs attrs = attention_attrs(causal);
                    attrs.num_heads = c.H;
                    const OpCase op_case{c.label, {{c.B, c.T, 3 * c.H * c.D}}, attrs, {}};
                    Generator gen(40'000'000 + index + (causal ? 100 : 0));
                    const CheckResult r = reduced_precision_check(*def, op_case, gen, dtype,
                                                                  reduced_precision_tolerance(*def, dtype),
                                                                  Device::cuda(0));
                    const AttentionRunInfo ran = attention_last_run();
                    INFO(r.check << ": max rel err " << r.max_rel_err << " (tolerance " << r.tolerance << "), "
                                 << r.detail << "; forward on " << impl_name(ran.forward) << " (" << ran.forward_reason
                                 << "), backward on " << impl_name(ran.backward) << " (" << ran.backward_reason << ")");
                    CHECK(r.pass);
                    CHECK(ran.forward == AttentionImpl::cudnn);
                    CHECK(ran.backward == AttentionImpl::cudnn);
                    // The composition runs cuDNN on (B,H,T,D) copies: the same math, its own engine choice, so
                    // equal to a couple of units of the dtype's rounding of the largest value.
                    Generator inputs(50'000'000 + index);
                    const Tensor qkv = Tensor::normal({c.B, c.T, 3 * c.H * c.D}, 0.0, 1.0, inputs, DType::f32)
                                           .to(Device::cuda(0), dtype);
                    const Tensor dy =
                        Tensor::normal({c.B, c.T, c.H * c.D}, 0.0, 1.0, inputs, DType::f32).to(Device::cuda(0), dtype);
                    const AttentionOptions options{.is_causal = causal};
                    const PackedRun packed = packed_run(qkv, dy, c.H, options, false);
                    const PackedRun composed = packed_run(qkv, dy, c.H, options, true);
                    const auto close = [&](const std::vector<double>& a, const std::vector<double>& b) {
                        double scale = 0, worst = 0;
                        for (std::size_t i = 0; i < a.size(); ++i) {
                            scale = std::max(scale, std::fabs(b[i]));
                            worst = std::max(worst, std::fabs(a[i] - b[i]));
                        }
                        INFO("max |packed - composed| " << worst << " of max " << scale);
                        CHECK(worst <= 4 * unit_roundoff(dtype) * scale);
                    };
                    close(packed.y, composed.y);
                    close(packed.dqkv, composed.dqkv);
                }
            }
        }
    }
}

TEST_CASE("qkv_attention with dropout, in deterministic mode or with cuDNN off runs the kernels on copies, correctly",
          "[attention][cudnn][gpu]") {
    if (!have_gpu()) DG_SKIP("no CUDA device");
    const OpDef* def = find_op("qkv_attention");
    REQUIRE(def != nullptr);
    enum class Setting { dropout, deterministic, off };
    for (const DType dtype : {DType::bf16, DType::f16}) {
        for (const Setting setting : {Setting::dropout, Setting::deterministic, Setting::off}) {
            DYNAMIC_SECTION(dtype_name(dtype) << " setting " << static_cast<int>(setting)) {
                CudnnSwitch set(setting != Setting::off);
                dgtest::DeterministicMode mode(setting == Setting::deterministic);
                OpAttrs attrs = attention_attrs(true, setting == Setting::dropout ? 0.1 : 0.0, 5);
                attrs.num_heads = 2;
                const OpCase op_case{"B2 T100 H2 D64", {{2, 100, 3 * 2 * 64}}, attrs, {}};
                Generator gen(60'000'000);
                const CheckResult r = reduced_precision_check(*def, op_case, gen, dtype,
                                                              reduced_precision_tolerance(*def, dtype), Device::cuda(0));
                const AttentionRunInfo ran = attention_last_run();
                INFO(r.check << ": max rel err " << r.max_rel_err << " (tolerance " << r.tolerance << "), " << r.detail
                             << "; backward reason: " << ran.backward_reason);
                CHECK(r.pass);
                CHECK(ran.backward == AttentionImpl::kernels);
                if (setting != Setting::deterministic) CHECK(ran.forward == AttentionImpl::kernels);
            }
        }
    }
}
