// linear_cross_entropy (ops/linear_cross_entropy.h, issue 32) against linear + narrow + cross_entropy: values and
// gradients in f64 (1e-12) and f32 (1e-5) with padded weight rows full of large garbage, ignored rows, label
// smoothing, every reduction, and chunk sizes that split N unevenly; the backward that recomputes the chunks;
// second order through it; typed errors; and GPT::loss against cross_entropy of GPT's logits.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

// Restores the default chunk size on scope exit.
struct ChunkElements {
    explicit ChunkElements(std::int64_t elements) : previous(detail::set_linear_cross_entropy_chunk_elements(elements)) {}
    ~ChunkElements() { detail::set_linear_cross_entropy_chunk_elements(previous); }
    std::int64_t previous;
};

struct Problem {
    Tensor x, weight, labels;
    std::int64_t classes;
};

// x (n,e) normal; weight (classes + padding, e) with the padded rows ±50: were they in the softmax, they would
// take all the probability mass. Labels in [0, classes), every third row set to ignore_index.
Problem problem(std::int64_t n, std::int64_t e, std::int64_t classes, std::int64_t padding, std::int64_t ignore_index,
                DType dtype, Generator& gen) {
    std::vector<double> rows = Tensor::normal({classes, e}, 0.0, 1.0, gen, dtype).to_vector();
    const std::vector<double> garbage = Tensor::normal({padding, e}, 0.0, 50.0, gen, dtype).to_vector();
    rows.insert(rows.end(), garbage.begin(), garbage.end());
    const Tensor weight = Tensor::from_vector(rows, {classes + padding, e}, dtype);
    std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
        labels[static_cast<std::size_t>(i)] = i % 3 == 1 ? ignore_index : (i * 7 + 3) % classes;
    return {Tensor::normal({n, e}, 0.0, 1.0, gen, dtype), weight, Tensor::from_vector(labels, {n}), classes};
}

struct Result {
    std::vector<double> loss, dx, dw;
};

// The loss and, through a random upstream gradient, dx and dW: fused, or the reference composition.
Result run(const Problem& p, const LinearCrossEntropyOptions& options, bool fused, const Tensor& upstream) {
    ComputeGraph graph;
    const Var x = graph.input(p.x, "x", true);
    const Var w = graph.input(p.weight, "weight", true);
    const Var y = graph.input(p.labels);
    Var loss;
    if (fused) {
        loss = linear_cross_entropy(x, w, y, options);
    } else {
        CrossEntropyOptions ce{.reduction = options.reduction, .ignore_index = options.ignore_index,
                               .label_smoothing = options.label_smoothing};
        loss = cross_entropy(linear(x, narrow(w, 0, 0, p.classes)), y, ce);
    }
    graph.backward(sum(mul(loss, graph.input(upstream.reshaped(loss.shape())))));
    return {loss.value().to_vector(), x.grad().to_vector(), w.grad().to_vector()};
}

void require_close(const std::vector<double>& a, const std::vector<double>& b, double tolerance, const char* what) {
    INFO(what);
    REQUIRE(a.size() == b.size());
    double scale = 1.0;
    for (const double v : b) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO("element " << i << ": " << a[i] << " vs " << b[i]);
        REQUIRE(std::abs(a[i] - b[i]) <= tolerance * scale);
    }
}

// One step of `model` on a (2, t) batch of tokens and targets in [0, vocab): the loss `loss_of` records from the
// tokens (2, t) and the flat targets (2t), and every parameter's gradient after its backward (copied out: the
// next step zeroes the gradients).
struct GptStep {
    Tensor loss;
    std::vector<std::vector<double>> grads;
    std::vector<DType> grad_dtypes;
};
template <typename LossOf>
GptStep gpt_step(GPT& model, std::int64_t t, std::int64_t vocab, LossOf&& loss_of) {
    std::vector<std::int64_t> tokens, targets;
    for (std::int64_t i = 0; i < 2 * t; ++i) {
        tokens.push_back((i * 5 + 3) % vocab);
        targets.push_back((i * 3 + 1) % vocab);
    }
    model.zero_grad();
    ComputeGraph graph;
    const Var loss =
        loss_of(graph.input(Tensor::from_vector(tokens, {2, t})), graph.input(Tensor::from_vector(targets, {2 * t})));
    graph.backward(loss);
    GptStep step{loss.value(), {}, {}};
    for (const Parameter& p : model.parameters()) {
        step.grads.push_back(p.grad().to_vector());
        step.grad_dtypes.push_back(p.grad().dtype());
    }
    return step;
}

void require_close_grads(const GptStep& a, const GptStep& b, double tolerance) {
    REQUIRE(a.grads.size() == b.grads.size());
    for (std::size_t k = 0; k < a.grads.size(); ++k)
        require_close(a.grads[k], b.grads[k], tolerance, "parameter gradient");
}

}  // namespace

TEST_CASE("linear_cross_entropy equals cross_entropy(linear(x, W[:C])), padded rows ignored, any chunking",
          "[linear_cross_entropy]") {
    for (const DType dtype : {DType::f64, DType::f32}) {
        const double tolerance = dtype == DType::f64 ? 1e-12 : 1e-5;
        for (const std::int64_t rows_per_chunk : {0, 1, 3, 4}) {  // 0: the default (one chunk here)
            const std::int64_t n = 10, e = 6, classes = 7;        // 10 rows: chunks of 3 and 4 leave a remainder
            const ChunkElements chunking(rows_per_chunk * classes);
            for (const Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
                for (const double smoothing : {0.0, 0.15}) {
                    Generator gen(41 + static_cast<std::uint64_t>(rows_per_chunk));
                    const std::int64_t ignore_index = smoothing == 0.0 ? -100 : 2;  // also one inside [0, C)
                    const Problem p = problem(n, e, classes, 5, ignore_index, dtype, gen);
                    const Tensor upstream =
                        Tensor::normal(reduction == Reduction::None ? Shape{n} : Shape{}, 0.0, 1.0, gen, dtype);
                    const LinearCrossEntropyOptions options{.reduction = reduction, .ignore_index = ignore_index,
                                                            .label_smoothing = smoothing, .classes = classes};
                    INFO(dtype_name(dtype) << ", rows per chunk " << rows_per_chunk << ", reduction "
                                           << static_cast<int>(reduction) << ", smoothing " << smoothing);
                    const Result fused = run(p, options, true, upstream);
                    const Result reference = run(p, options, false, upstream);
                    require_close(fused.loss, reference.loss, tolerance, "loss");
                    require_close(fused.dx, reference.dx, tolerance, "dx");
                    require_close(fused.dw, reference.dw, tolerance, "dW");
                    for (std::size_t i = static_cast<std::size_t>(classes * e); i < fused.dw.size(); ++i)
                        REQUIRE(fused.dw[i] == 0.0);  // the padded rows get exactly no gradient
                    // The eager overload runs the same forward (no gradients kept).
                    const Tensor eager = linear_cross_entropy(p.x, p.weight, p.labels, options);
                    require_close(eager.to_vector(), reference.loss, tolerance, "eager loss");
                }
            }
        }
    }
}

TEST_CASE("linear_cross_entropy: the backward that recomputes the chunks when the forward kept no gradients",
          "[linear_cross_entropy]") {
    const ChunkElements chunking(3 * 9);
    for (const Reduction reduction : {Reduction::Mean, Reduction::Sum}) {
        Generator gen(5);
        const Problem p = problem(11, 4, 9, 3, -100, DType::f64, gen);
        const Tensor upstream = Tensor::normal({}, 0.0, 1.0, gen, DType::f64);
        const LinearCrossEntropyOptions options{.reduction = reduction, .classes = 9};
        ComputeGraph graph;
        const Var x = graph.input(p.x, "x", true);
        const Var w = graph.input(p.weight, "weight", true);
        OpAttrs attrs;
        attrs.reduction = reduction;
        attrs.length = 9;
        attrs.save_for_backward = false;  // as Python's dg.ops under no_grad-free eager use, or an explicit keyword
        const Var loss = apply_op(OpType::LinearCrossEntropy, {x, w, graph.input(p.labels)}, attrs,
                                  std::source_location::current(), reads("length", "save_for_backward"));
        graph.backward(mul(loss, graph.input(upstream)));
        const Result reference = run(p, options, false, upstream);
        require_close(loss.value().to_vector(), reference.loss, 1e-12, "loss");
        require_close(x.grad().to_vector(), reference.dx, 1e-12, "dx");
        require_close(w.grad().to_vector(), reference.dw, 1e-12, "dW");
    }
}

TEST_CASE("linear_cross_entropy: bf16/f16 inputs give a float32 loss and gradients in the inputs' dtype",
          "[linear_cross_entropy][reduced]") {
    // Outside autocast. The CPU computes 16-bit inputs through f32 (graph/through_f32.h): the loss is exactly the
    // f32 loss of the rounded inputs, and each gradient the f32 gradient rounded once to the input's dtype.
    const ChunkElements chunking(3 * 7);  // 10 rows in chunks of 3: a remainder
    for (const DType dtype : {DType::bf16, DType::f16}) {
        for (const Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
            INFO(dtype_name(dtype) << ", reduction " << static_cast<int>(reduction));
            Generator gen(61);
            Problem p = problem(10, 6, 7, 2, -100, DType::f32, gen);
            const Tensor x16 = p.x.to(dtype), w16 = p.weight.to(dtype);
            const Tensor upstream =
                Tensor::normal(reduction == Reduction::None ? Shape{10} : Shape{}, 0.0, 1.0, gen, DType::f32);
            const LinearCrossEntropyOptions options{.reduction = reduction, .label_smoothing = 0.1, .classes = 7};
            ComputeGraph graph;
            const Var x = graph.input(x16, "x", true);
            const Var w = graph.input(w16, "weight", true);
            const Var loss = linear_cross_entropy(x, w, graph.input(p.labels), options);
            REQUIRE(loss.dtype() == DType::f32);
            graph.backward(sum(mul(loss, graph.input(upstream.reshaped(loss.shape())))));
            REQUIRE(x.grad().dtype() == dtype);
            REQUIRE(w.grad().dtype() == dtype);
            p.x = x16.to(DType::f32);
            p.weight = w16.to(DType::f32);
            const Result f32 = run(p, options, true, upstream);
            CHECK(loss.value().to_vector() == f32.loss);
            CHECK(x.grad().to_vector() == Tensor::from_vector(f32.dx, {10, 6}, DType::f32).to(dtype).to_vector());
            CHECK(w.grad().to_vector() == Tensor::from_vector(f32.dw, {9, 6}, DType::f32).to(dtype).to_vector());
            // The eager overload: the same float32 loss.
            CHECK(linear_cross_entropy(x16, w16, p.labels, options).dtype() == DType::f32);
        }
    }
}

TEST_CASE("linear_cross_entropy and GPT::loss under autocast: 16-bit GEMMs, a float32 loss, f32 gradients",
          "[linear_cross_entropy][reduced][autocast]") {
    for (const DType reduced : {DType::bf16, DType::f16}) {
        INFO(dtype_name(reduced));
        // bf16 keeps 8 significant bits, f16 11: the loss and gradients of rounded inputs, against the f32 run.
        const double tolerance = reduced == DType::bf16 ? 3e-2 : 4e-3;
        Generator gen(67);
        const Problem p = problem(12, 8, 9, 3, -100, DType::f32, gen);
        const LinearCrossEntropyOptions options{.label_smoothing = 0.05, .classes = 9};
        const Result f32 = run(p, options, true, Tensor::ones({}, DType::f32));
        ComputeGraph graph;
        const Var x = graph.input(p.x, "x", true);
        const Var w = graph.input(p.weight, "weight", true);
        Var loss;
        {
            const AutocastGuard autocast(reduced);
            loss = linear_cross_entropy(x, w, graph.input(p.labels), options);
        }
        int casts = 0;
        for (NodeId id = 0; id < graph.size(); ++id) casts += graph.node(id).op == OpType::Cast;
        CHECK(casts == 2);  // x and the weight down to `reduced`; the loss is float32 already
        REQUIRE(loss.dtype() == DType::f32);
        graph.backward(loss);
        REQUIRE(x.grad().dtype() == DType::f32);  // the casts' backward: back to the f32 inputs' dtype
        REQUIRE(w.grad().dtype() == DType::f32);
        require_close(loss.value().to_vector(), f32.loss, tolerance, "loss");
        require_close(x.grad().to_vector(), f32.dx, tolerance, "dx");
        require_close(w.grad().to_vector(), f32.dw, tolerance, "dW");

        // GPT-2's path: GPT::loss under autocast against the same model in f32.
        Generator model_gen(71);
        const GPTConfig config{.vocab_size = 13, .context = 8, .layers = 1, .heads = 2, .width = 16,
                               .padded_vocab_size = 16, .tie_embeddings = true};
        GPT model(config, model_gen);
        const auto step_under = [&](DType autocast_dtype) {
            return gpt_step(model, 8, 13, [&](const Var& input, const Var& target) {
                const AutocastGuard autocast(autocast_dtype);  // DType::f32: off
                return model.loss(input, target);
            });
        };
        const GptStep low = step_under(reduced), f32_step = step_under(DType::f32);
        REQUIRE(low.loss.dtype() == DType::f32);
        for (const DType dtype : low.grad_dtypes) REQUIRE(dtype == DType::f32);
        CHECK(std::abs(low.loss.item() - f32_step.loss.item()) <= tolerance * std::abs(f32_step.loss.item()));
        // Every parameter's gradient, the tied head's (the token embedding's) through the fused op.
        require_close_grads(low, f32_step, 2 * tolerance);
    }
}

TEST_CASE("linear_cross_entropy takes x (*, E) with labels (*) and gives None its shape", "[linear_cross_entropy]") {
    Generator gen(9);
    const Tensor x = Tensor::normal({2, 3, 4}, 0.0, 1.0, gen, DType::f64);
    const Tensor w = Tensor::normal({6, 4}, 0.0, 1.0, gen, DType::f64);
    const Tensor y = Tensor::from_vector(std::vector<std::int64_t>{0, 5, 2, -100, 1, 3}, {2, 3});
    const Tensor per_row = linear_cross_entropy(x, w, y, {.reduction = Reduction::None});
    CHECK(per_row.shape() == Shape{2, 3});
    const Tensor reference = cross_entropy(linear(x.reshaped({6, 4}), w), y.reshaped({6}), {.reduction = Reduction::None});
    require_close(per_row.to_vector(), reference.to_vector(), 1e-12, "per-row loss");
    CHECK(per_row.to_vector()[3] == 0.0);  // the ignored row
}

TEST_CASE("linear_cross_entropy: create_graph differentiates the composition", "[linear_cross_entropy]") {
    Generator gen(21);
    const Problem p = problem(5, 3, 4, 2, -100, DType::f64, gen);
    std::vector<double> second[2];
    for (const bool fused : {true, false}) {
        ComputeGraph graph;
        const Var x = graph.input(p.x, "x", true);
        const Var w = graph.input(p.weight, "weight", true);
        const Var y = graph.input(p.labels);
        const Var loss = fused ? linear_cross_entropy(x, w, y, {.label_smoothing = 0.1, .classes = 4})
                               : cross_entropy(linear(x, narrow(w, 0, 0, 4)), y, {.label_smoothing = 0.1});
        const Var dx = grad({loss}, {x}, {}, {.create_graph = true})[0];
        second[fused ? 0 : 1] = grad({sum(mul(dx, dx))}, {w})[0].value().to_vector();
    }
    require_close(second[0], second[1], 1e-12, "d|dx|²/dW");
}

TEST_CASE("linear_cross_entropy: typed errors name the op, shapes and dtypes", "[linear_cross_entropy]") {
    Generator gen(3);
    const Tensor x = Tensor::normal({4, 3}, 0.0, 1.0, gen);
    const Tensor w = Tensor::normal({6, 3}, 0.0, 1.0, gen);
    const Tensor y = Tensor::from_vector(std::vector<std::int64_t>{0, 1, 4, 2}, {4});
    CHECK_THROWS_AS(linear_cross_entropy(x, w, y, {.classes = 4}), IndexError);  // label 4 of 4 classes
    CHECK_THROWS_MATCHES(linear_cross_entropy(x, w, y, {.classes = 4}), IndexError,
                         MessageHas({"linear_cross_entropy", "label 4", "4 classes"}));
    CHECK(std::isfinite(linear_cross_entropy(x, w, y, {.ignore_index = 4, .classes = 4}).item()));
    CHECK_THROWS_MATCHES(linear_cross_entropy(x, Tensor::normal({6, 5}, 0.0, 1.0, gen), y), ShapeError,
                         MessageHas({"linear_cross_entropy", "(6,5)", "(4,3)"}));
    CHECK_THROWS_MATCHES(linear_cross_entropy(x, w, y, {.classes = 7}), ValueError,
                         MessageHas({"linear_cross_entropy", "classes", "7"}));
    CHECK_THROWS_MATCHES(linear_cross_entropy(x, w.to(DType::f64), y), DTypeError,
                         MessageHas({"linear_cross_entropy", "float64", "float32"}));
    CHECK_THROWS_MATCHES(linear_cross_entropy(x, w, y.to(DType::f32)), DTypeError,
                         MessageHas({"linear_cross_entropy", "int64"}));
    CHECK_THROWS_MATCHES(linear_cross_entropy(x, w, Tensor::from_vector(std::vector<std::int64_t>{0, 1}, {2})),
                         ShapeError, MessageHas({"linear_cross_entropy", "labels", "(2)"}));
}

TEST_CASE("GPT::loss equals cross_entropy of GPT's logits, padded vocabulary, tied and untied",
          "[linear_cross_entropy][gpt]") {
    for (const bool tied : {true, false}) {
        Generator gen(7);
        const GPTConfig config{.vocab_size = 11, .context = 8, .layers = 1, .heads = 2, .width = 8,
                               .padded_vocab_size = 16, .tie_embeddings = tied};
        GPT model(config, gen);
        // Garbage in the padded rows of the head: the fused loss must not see them.
        Parameter head = tied ? model.token_embedding.weight : model.lm_head.weight;
        std::vector<double> values = head.value().to_vector();
        for (std::size_t i = 11 * 8; i < values.size(); ++i) values[i] = 30.0 * std::sin(static_cast<double>(i));
        head.value().copy_from(Tensor::from_vector(values, {16, 8}, DType::f32));
        const GptStep fused = gpt_step(model, 7, 11, [&](const Var& input, const Var& target) {
            return model.loss(input, target);
        });
        const GptStep reference = gpt_step(model, 7, 11, [&](const Var& input, const Var& target) {
            return cross_entropy(reshape(model(input), {14, 11}), target);
        });
        INFO((tied ? "tied" : "untied"));
        CHECK(std::abs(fused.loss.item() - reference.loss.item()) <= 1e-6);
        require_close_grads(fused, reference, 1e-5);
        const std::vector<double>& head_grad = fused.grads.back();
        for (std::size_t i = 11 * 8; i < head_grad.size() && !tied; ++i) CHECK(head_grad[i] == 0.0);
    }
}

TEST_CASE("linear_cross_entropy: the fused-kernel check compares it with linear + narrow + cross_entropy",
          "[linear_cross_entropy][fusion]") {
    // Every dtype on every device there is: 16-bit logits are rounded on the GPU (PyTorch's bf16 logits) and not on
    // the CPU (through f32), and the composition must round where its device does, within the f32 loss's tolerance.
    std::vector<Device> devices{Device::cpu()};
    if (cuda_device_count() > 0) devices.push_back(Device::cuda(0));
    for (const Device device : devices) {
        for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
            INFO(device.to_string() << " " << dtype_name(dtype));
            set_fusion_check(true);
            clear_fusion_check_results();
            Generator gen(13);
            const Problem p = problem(9, 4, 6, 2, -100, DType::f32, gen);
            ComputeGraph graph;
            const Var x = graph.input(p.x.to(device, dtype), "x", true);
            const Var w = graph.input(p.weight.to(device, dtype), "weight", true);
            graph.backward(linear_cross_entropy(x, w, graph.input(p.labels.to(device)),
                                                {.label_smoothing = 0.05, .classes = 6}));
            set_fusion_check(false);
            std::set<std::string> seen;
            for (const FusionCheckResult& r : fusion_check_results()) {
                INFO(r.op << " " << r.pass << ": " << r.max_abs_error << " of " << r.scale);
                CHECK(r.passed);
                seen.insert(r.op + " " + (r.pass.starts_with("backward") ? "backward" : r.pass));
            }
            clear_fusion_check_results();
            CHECK(seen.contains("linear_cross_entropy forward"));
            CHECK(seen.contains("linear_cross_entropy backward"));
        }
    }
}
