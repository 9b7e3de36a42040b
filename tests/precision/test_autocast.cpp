// Autocast (graph/autocast.h) on the CPU: the policy decisions, the guard's scope, the cast nodes it records and
// the gradients that flow back through them to f32 parameters, the per-step parameter-cast cache, eager calls,
// mixing dtypes without autocast, f16 overflow in a forward with a GradScaler, and anomaly mode naming the op.
// bf16/f16 ops compute through f32 on the CPU (graph/through_f32.h), so every value here is the f32 result of the
// rounded inputs, rounded once; the GPU's tensor-core kernels are checked in tests/precision/test_gpu_amp.cpp.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

std::vector<DType> dtypes(std::initializer_list<DType> list) { return list; }

// Nodes of `graph` recorded with op `op`.
int count_nodes(const ComputeGraph& graph, OpType op) {
    int count = 0;
    for (NodeId id = 0; id < graph.size(); ++id) count += graph.node(id).op == op;
    return count;
}

// x rounded to `dtype` and back to f64, element by element (the CPU's exact conversions, core/half.h).
std::vector<double> rounded(const Tensor& x, DType dtype) { return x.to(dtype).to(DType::f64).to_vector(); }

// Row-major (n,k)·(m,k)ᵀ + b in double: the reference of a linear layer from already rounded values.
std::vector<double> linear_reference(const std::vector<double>& x, const std::vector<double>& w,
                                     const std::vector<double>& b, std::int64_t n, std::int64_t k, std::int64_t m) {
    std::vector<double> y(static_cast<std::size_t>(n * m));
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < m; ++j) {
            double sum = b[static_cast<std::size_t>(j)];
            for (std::int64_t l = 0; l < k; ++l)
                sum += x[static_cast<std::size_t>(i * k + l)] * w[static_cast<std::size_t>(j * k + l)];
            y[static_cast<std::size_t>(i * m + j)] = sum;
        }
    return y;
}

double max_relative_error(const std::vector<double>& got, const std::vector<double>& want) {
    double scale = 0, worst = 0;
    for (const double v : want) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    return worst / std::max(scale, 1e-30);
}

}  // namespace

TEST_CASE("autocast policy: products reduced, sums and losses f32, the rest follows", "[autocast]") {
    for (const DType reduced : {DType::bf16, DType::f16}) {
        const DType other = reduced == DType::bf16 ? DType::f16 : DType::bf16;
        CHECK(autocast_policy(OpType::Matmul) == AutocastPolicy::Reduced);
        CHECK(autocast_policy(OpType::Conv2d) == AutocastPolicy::Reduced);
        CHECK(autocast_policy(OpType::ScaledDotProductAttention) == AutocastPolicy::Reduced);
        CHECK(autocast_policy(OpType::CrossEntropy) == AutocastPolicy::Float32);
        CHECK(autocast_policy(OpType::LayerNorm) == AutocastPolicy::Float32);
        CHECK(autocast_policy(OpType::Relu) == AutocastPolicy::Follow);
        // Reduced: f32 and the other reduced type go to the autocast dtype; already there: nothing to do.
        CHECK(autocast_target(OpType::Linear, dtypes({DType::f32, DType::f32, DType::f32}), reduced) == reduced);
        CHECK(autocast_target(OpType::Matmul, dtypes({other, DType::f32}), reduced) == reduced);
        CHECK_FALSE(autocast_target(OpType::Matmul, dtypes({reduced, reduced}), reduced).has_value());
        // f64 is never cast (as PyTorch): a double matmul stays double.
        CHECK_FALSE(autocast_target(OpType::Matmul, dtypes({DType::f64, DType::f64}), reduced).has_value());
        // Float32: reduced inputs widen; labels (i64) are never cast.
        CHECK(autocast_target(OpType::CrossEntropy, dtypes({reduced, DType::i64}), reduced) == DType::f32);
        CHECK_FALSE(autocast_target(OpType::CrossEntropy, dtypes({DType::f32, DType::i64}), reduced).has_value());
        CHECK(autocast_target(OpType::Softmax, dtypes({reduced}), reduced) == DType::f32);
        // Follow: one dtype stays; a mix promotes to f32.
        CHECK_FALSE(autocast_target(OpType::Relu, dtypes({reduced}), reduced).has_value());
        CHECK_FALSE(autocast_target(OpType::Add, dtypes({reduced, reduced}), reduced).has_value());
        CHECK(autocast_target(OpType::Add, dtypes({reduced, DType::f32}), reduced) == DType::f32);
        CHECK(autocast_target(OpType::Add, dtypes({reduced, other}), reduced) == DType::f32);
        // The casts autocast records are never cast again.
        CHECK_FALSE(autocast_target(OpType::Cast, dtypes({DType::f32}), reduced).has_value());
    }
    CHECK_THROWS_MATCHES(autocast_target(OpType::Matmul, dtypes({DType::f32}), DType::f32), DTypeError,
                         MessageHas({"autocast", "bfloat16 or float16", "float32"}));
}

TEST_CASE("AutocastGuard nests, turns off with f32, is per thread and refuses other dtypes", "[autocast]") {
    CHECK_FALSE(autocast_dtype().has_value());
    {
        const AutocastGuard outer(DType::bf16);
        CHECK(autocast_dtype() == DType::bf16);
        {
            const AutocastGuard inner(DType::f16);
            CHECK(autocast_dtype() == DType::f16);
            {
                const AutocastGuard off(DType::f32);
                CHECK_FALSE(autocast_dtype().has_value());
            }
            CHECK(autocast_dtype() == DType::f16);
        }
        CHECK(autocast_dtype() == DType::bf16);
        bool other_thread_on = true;
        std::thread([&] { other_thread_on = autocast_dtype().has_value(); }).join();
        CHECK_FALSE(other_thread_on);
    }
    CHECK_FALSE(autocast_dtype().has_value());
    CHECK_THROWS_MATCHES(AutocastGuard(DType::f64), DTypeError, MessageHas({"AutocastGuard", "float64"}));
    CHECK_THROWS_MATCHES(AutocastGuard(DType::i64), DTypeError, MessageHas({"AutocastGuard", "int64"}));
    CHECK_FALSE(autocast_dtype().has_value());  // a refused guard changed nothing
}

TEST_CASE("autocast records casts: a bf16 linear, an f32 loss, f32 gradients of the f32 parameters", "[autocast]") {
    for (const DType reduced : {DType::bf16, DType::f16}) {
        Generator gen(11);
        const std::int64_t n = 6, k = 10, m = 4;
        const Parameter w(Tensor::normal({m, k}, 0.0, 0.5, gen), "w");
        const Parameter b(Tensor::normal({m}, 0.0, 0.5, gen), "b");
        const Tensor x = Tensor::normal({n, k}, 0.0, 1.0, gen);
        const Tensor target = Tensor::normal({n, m}, 0.0, 1.0, gen);
        ComputeGraph graph;
        Var y, loss;
        {
            const AutocastGuard autocast(reduced);
            y = linear(graph.input(x), graph.parameter(w), graph.parameter(b));
            loss = mse_loss(y, graph.input(target));
        }
        CHECK(y.dtype() == reduced);
        CHECK(loss.dtype() == DType::f32);        // mse_loss is f32: y was cast back up
        CHECK(count_nodes(graph, OpType::Cast) == 4);  // x, w, b down; y up for the loss
        // The forward is the f32 product of the rounded inputs, rounded once to `reduced`.
        const std::vector<double> want =
            linear_reference(rounded(x, reduced), rounded(w.value(), reduced), rounded(b.value(), reduced), n, k, m);
        CHECK(max_relative_error(y.value().to(DType::f64).to_vector(), want) < (reduced == DType::bf16 ? 8e-3 : 1e-3));
        graph.backward(loss);
        CHECK(w.grad().dtype() == DType::f32);  // the cast's backward took the gradient back to the master's dtype
        CHECK(b.grad().dtype() == DType::f32);
        // db = Σ over rows of dL/dy = 2(y − t)/(n·m), from the rounded forward: the same to the rounding of dy.
        const std::vector<double> yv = y.value().to(DType::f64).to_vector();
        const std::vector<double> tv = target.to_vector();
        std::vector<double> db(static_cast<std::size_t>(m), 0.0);
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < m; ++j)
                db[static_cast<std::size_t>(j)] +=
                    2.0 * (yv[static_cast<std::size_t>(i * m + j)] - tv[static_cast<std::size_t>(i * m + j)]) /
                    static_cast<double>(n * m);
        CHECK(max_relative_error(b.grad().to_vector(), db) < (reduced == DType::bf16 ? 2e-2 : 3e-3));
    }
}

TEST_CASE("autocast casts a parameter once per graph; an in-place write or a new graph casts again",
          "[autocast]") {
    Generator gen(12);
    Parameter w(Tensor::normal({5, 5}, 0.0, 0.5, gen), "w");
    const Tensor x = Tensor::normal({3, 5}, 0.0, 1.0, gen);
    const AutocastGuard autocast(DType::bf16);
    ComputeGraph graph;
    // The same weight three times (a tied layer applied repeatedly), recorded as three leaves.
    Var h = graph.input(x);
    for (int i = 0; i < 3; ++i) h = matmul(h, graph.parameter(w));
    CHECK(autocast_cache_stats().casts == 1);
    CHECK(autocast_cache_stats().hits == 2);
    CHECK(count_nodes(graph, OpType::Cast) == 2);  // the weight once, the input once
    // One cast node: its gradient is the sum over the three uses, and reaches the parameter once.
    graph.backward(sum(h));
    const Tensor grad_once = w.grad().clone();
    CHECK(grad_once.dtype() == DType::f32);
    CHECK(std::isfinite(grad_once.to_vector()[0]));

    // An in-place write to the parameter (an optimizer step) invalidates the cached cast.
    ComputeGraph second;
    Var a = matmul(second.input(x), second.parameter(w));
    CHECK(autocast_cache_stats().casts == 2);  // a new graph: a new cast
    w.value().fill(0.25);                      // bumps the storage version
    Var c = matmul(second.input(x), second.parameter(w));
    CHECK(autocast_cache_stats().casts == 3);
    CHECK(c.value().to_vector()[0] != a.value().to_vector()[0]);  // it read the new value, not the stale cast
}

namespace {

// Three AdamW steps of a two-layer model under autocast, from weights of `seed`: the losses and the final weights.
struct KeptCopyRun {
    std::vector<double> losses;
    std::vector<Tensor> weights;
    std::int64_t copies_used = 0;
    std::int64_t casts = 0;
};
KeptCopyRun train_with_copies(bool keep, DType dtype, std::uint64_t seed) {
    set_autocast_parameter_copies(keep);
    Generator gen(seed);
    Linear fc1(12, 16, true, gen), fc2(16, 4, true, gen);
    std::vector<Parameter> params = fc1.parameters();
    for (const Parameter& p : fc2.parameters()) params.push_back(p);
    AdamW opt(params, {.lr = 0.01});
    const Tensor x = Tensor::normal({8, 12}, 0.0, 1.0, gen);
    const Tensor y = Tensor::normal({8, 4}, 0.0, 1.0, gen);
    KeptCopyRun run;
    const AutocastGuard autocast(dtype);
    for (int step = 0; step < 3; ++step) {
        ComputeGraph graph;
        const Var loss = mse_loss(fc2(relu(fc1(graph.input(x)))), graph.input(y));
        graph.backward(loss);
        opt.step();
        opt.zero_grad();
        run.losses.push_back(loss.item());
        if (keep)  // each copy is the new value rounded as the cast op rounds
            for (const Parameter& p : params) {
                const Tensor copy = p.current_reduced_copy(dtype);
                REQUIRE(copy.defined());
                CHECK(copy.to(DType::f64).to_vector() == p.value().to(dtype).to(DType::f64).to_vector());
            }
    }
    for (const Parameter& p : params) run.weights.push_back(p.value().clone());
    run.copies_used = autocast_cache_stats().copies_used;
    run.casts = autocast_cache_stats().casts;
    set_autocast_parameter_copies(true);
    return run;
}

}  // namespace

TEST_CASE("a parameter an optimizer updates keeps its cast: the step rewrites it, the next graph takes it, the same "
          "bits as casting afresh", "[autocast][copies]") {
    const std::uint64_t seed = std::random_device{}();
    for (const DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype) << ", seed " << seed);
        const KeptCopyRun fresh = train_with_copies(false, dtype, seed);
        const KeptCopyRun kept = train_with_copies(true, dtype, seed);
        set_batched_gradient_casts(false);  // the kept copies with each gradient cast on its own
        const KeptCopyRun unbatched = train_with_copies(true, dtype, seed);
        set_batched_gradient_casts(true);
        CHECK(unbatched.losses == kept.losses);
        for (std::size_t i = 0; i < kept.weights.size(); ++i)
            CHECK(unbatched.weights[i].to_vector() == kept.weights[i].to_vector());
        CHECK(fresh.copies_used == 0);
        CHECK(kept.casts == fresh.casts);  // 4 parameters a step (and the inputs, which are no parameters)
        CHECK(kept.copies_used == 2 * 4);  // steps 2 and 3 take the four copies the steps before rewrote
        CHECK(kept.losses == fresh.losses);
        for (std::size_t i = 0; i < kept.weights.size(); ++i)
            CHECK(kept.weights[i].to_vector() == fresh.weights[i].to_vector());
    }
}

TEST_CASE("a kept copy is read only while current: an in-place write, a replaced value or no optimizer casts afresh",
          "[autocast][copies]") {
    Generator gen(31);
    Parameter w(Tensor::normal({6, 6}, 0.0, 0.5, gen), "w");
    const Tensor x = Tensor::normal({2, 6}, 0.0, 1.0, gen);
    const AutocastGuard autocast(DType::bf16);
    {  // no optimizer updates w: nothing is kept
        ComputeGraph graph;
        static_cast<void>(matmul(graph.input(x), graph.parameter(w)));
        CHECK_FALSE(w.reduced_copy().defined());
    }
    auto sgd = std::make_unique<SGD>(std::vector<Parameter>{w}, SgdOptions{.lr = 0.1});
    const auto step = [&] {
        ComputeGraph graph;
        const Var y = matmul(graph.input(x), graph.parameter(w));
        graph.backward(sum(y));
        sgd->step();
        sgd->zero_grad();
        return y.value();
    };
    const auto used = [] { return autocast_cache_stats().copies_used; };
    step();
    REQUIRE(w.current_reduced_copy(DType::bf16).defined());
    CHECK_FALSE(w.current_reduced_copy(DType::f16).defined());  // another dtype: not this copy
    std::int64_t before = used();
    step();
    CHECK(used() == before + 1);

    // An in-place write outside the optimizer: the copy is stale, the next graph casts the new value.
    w.value().fill(0.5);
    CHECK_FALSE(w.current_reduced_copy(DType::bf16).defined());
    before = used();
    {
        ComputeGraph graph;
        const Var y = matmul(graph.input(x), graph.parameter(w));
        CHECK(used() == before);
        const Tensor expected = matmul(x.to(DType::bf16), Tensor::full({6, 6}, 0.5, DType::bf16));
        CHECK(y.value().to(DType::f64).to_vector() == expected.to(DType::f64).to_vector());
    }
    // A replaced value (same shape, new storage): stale too.
    step();
    REQUIRE(w.current_reduced_copy(DType::bf16).defined());
    w.value() = Tensor::normal({6, 6}, 0.0, 0.5, gen);
    CHECK_FALSE(w.current_reduced_copy(DType::bf16).defined());
    // A value of another shape (same size) under an existing copy: the step drops the copy and updates the value.
    step();
    REQUIRE(w.reduced_copy().defined());
    w.value() = Tensor::normal({4, 9}, 0.0, 0.5, gen);
    w.grad_slot() = Tensor::ones({4, 9});
    const std::vector<double> old_value = w.value().to_vector();
    sgd->step();
    CHECK_FALSE(w.reduced_copy().defined());
    CHECK(w.value().to_vector()[0] == dgtest::Approx(old_value[0] - 0.1));
    sgd->zero_grad();
    w.value() = Tensor::normal({6, 6}, 0.0, 0.5, gen);
    // The optimizer gone: the copy is no longer kept current, so no new one is kept.
    sgd.reset();
    CHECK_FALSE(w.has_updater());
    w.drop_reduced_copy();
    {
        ComputeGraph graph;
        static_cast<void>(matmul(graph.input(x), graph.parameter(w)));
    }
    CHECK_FALSE(w.reduced_copy().defined());
}

TEST_CASE("a retained graph whose backward reads a kept copy refuses to run after a step rewrote it",
          "[autocast][copies]") {
    Generator gen(32);
    Parameter w(Tensor::normal({4, 4}, 0.0, 0.5, gen), "w");
    SGD sgd({w}, {.lr = 0.1});
    const Tensor x = Tensor::normal({3, 4}, 0.0, 1.0, gen);
    const AutocastGuard autocast(DType::bf16);
    ComputeGraph graph;
    const Var y = sum(matmul(graph.input(x, "x", true), graph.parameter(w)));  // x's gradient reads the bf16 weight
    graph.backward(y, {.retain_graph = true});
    sgd.step();
    CHECK_THROWS_AS(graph.backward(y), GraphError);
}

namespace {

// The parameters' gradients of one backward under autocast with the gradient casts batched or not: a linear whose
// weight is read through its cast (bf16) and, when `twice`, also directly in f32 (a second contribution to the
// same leaf), and a bias cast to bf16 and f16 (two casts of one leaf).
struct CastGradients {
    std::vector<std::vector<double>> grads;
    std::int64_t batched = 0;  // casts the sweep batched
};
CastGradients gradients_with_batching(bool batch, bool twice, std::uint64_t seed,
                                      const BackwardOptions& options = {}) {
    set_batched_gradient_casts(batch);
    Generator gen(seed);
    Parameter w(Tensor::normal({7, 5}, 0.0, 0.5, gen), "w");
    Parameter b(Tensor::normal({5}, 0.0, 0.5, gen), "b");
    const Tensor x = Tensor::normal({3, 7}, 0.0, 1.0, gen);
    const std::int64_t before = batched_gradient_cast_stats().casts;
    ComputeGraph graph;
    Var loss;
    {
        const AutocastGuard autocast(DType::bf16);
        const Var wv = graph.parameter(w);
        const Var bv = graph.parameter(b);
        Var y = to_dtype(matmul(graph.input(x), wv), DType::f32);  // x and w cast to bf16
        y = add(y, to_dtype(to_dtype(bv, DType::bf16), DType::f32));
        y = add(y, to_dtype(to_dtype(bv, DType::f16), DType::f32));
        if (twice) y = add(y, sum(mul(wv, wv)));  // f32: w's own leaf, no cast
        loss = sum(mul(y, y));
    }
    graph.backward(loss, options);
    CastGradients out;
    out.grads = {w.grad().to_vector(), b.grad().to_vector()};
    out.batched = batched_gradient_cast_stats().casts - before;
    set_batched_gradient_casts(true);
    return out;
}

}  // namespace

TEST_CASE("batched parameter-gradient casts: the same gradients as one cast at a time, every leaf complete",
          "[autocast][copies]") {
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    for (const bool twice : {false, true}) {
        INFO("weight read in f32 too: " << twice);
        const CastGradients single = gradients_with_batching(false, twice, seed);
        const CastGradients batched = gradients_with_batching(true, twice, seed);
        CHECK(single.batched == 0);
        CHECK(batched.batched == 3);  // w's bf16 cast, b's bf16 and f16 casts
        CHECK(batched.grads == single.grads);
    }
    // A readiness callback (data parallel's) is called once per parameter, after its gradient is complete.
    for (const bool twice : {false, true}) {
        std::vector<std::vector<double>> reported_grads;
        const CastGradients reported = gradients_with_batching(
            true, twice, seed,
            {.on_parameter_ready = [&](const Parameter& p) { reported_grads.push_back(p.grad().to_vector()); }});
        CHECK(reported.batched == 3);
        REQUIRE(reported_grads.size() == 2);
        const CastGradients single = gradients_with_batching(false, twice, seed);
        CHECK(reported.grads == single.grads);
        // b (recorded after w) is reported first: the sweep runs back to front.
        CHECK(reported_grads[0] == single.grads[1]);
        CHECK(reported_grads[1] == single.grads[0]);
    }
    // Kept gradients of the cast nodes (retain_grads) stay their 16-bit gradients.
    CHECK(gradients_with_batching(true, true, seed, {.retain_grads = true}).grads ==
          gradients_with_batching(false, true, seed).grads);
}

// More held 16-bit gradient than a batch takes with a readiness callback (4 MiB): the casts are converted in
// several batches during the sweep, each parameter reported once its gradient is complete.
TEST_CASE("batched parameter-gradient casts convert in several batches when the held gradients grow",
          "[autocast][copies]") {
    const std::uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    const auto run = [&](bool batch, std::vector<std::vector<double>>* reported) {
        set_batched_gradient_casts(batch);
        Generator gen(seed);
        Linear fc1(64, 1100, true, gen), fc2(1100, 1100, true, gen), fc3(1100, 1100, true, gen), fc4(1100, 8, true, gen);
        std::vector<Parameter> params;
        for (const Linear* layer : {&fc1, &fc2, &fc3, &fc4})
            for (const Parameter& p : layer->parameters()) params.push_back(p);
        const Tensor x = Tensor::normal({2, 64}, 0.0, 1.0, gen);
        const BatchedGradientCastStats before = batched_gradient_cast_stats();
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(DType::bf16);
            loss = sum(fc4(relu(fc3(relu(fc2(relu(fc1(graph.input(x)))))))));
        }
        BackwardOptions options;
        if (reported != nullptr)
            options.on_parameter_ready = [&](const Parameter& p) { reported->push_back(p.grad().to_vector()); };
        graph.backward(loss, options);
        const BatchedGradientCastStats after = batched_gradient_cast_stats();
        set_batched_gradient_casts(true);
        std::vector<std::vector<double>> grads;
        for (const Parameter& p : params) grads.push_back(p.grad().to_vector());
        return std::pair{grads, std::pair{after.casts - before.casts, after.batches - before.batches}};
    };
    std::vector<std::vector<double>> reported;
    const auto [batched, counts] = run(true, &reported);
    const auto [single, none] = run(false, nullptr);
    CHECK(none.first == 0);
    CHECK(counts.first == 8);
    CHECK(counts.second >= 2);  // fc3's and fc2's weights are 2.4 MB each in bf16
    CHECK(batched == single);
    REQUIRE(reported.size() == 8);
    for (std::size_t i = 0; i < reported.size(); ++i) CHECK(reported[i] == single[single.size() - 1 - i]);
}

TEST_CASE("autocast stays on under no_grad and for eager calls; the cache keeps grad and no-grad casts apart",
          "[autocast]") {
    Generator gen(13);
    const Parameter w(Tensor::normal({4, 4}, 0.0, 0.5, gen), "w");
    const Tensor x = Tensor::normal({2, 4}, 0.0, 1.0, gen);
    const AutocastGuard autocast(DType::f16);
    CHECK(matmul(x, w.value()).dtype() == DType::f16);  // eager
    CHECK(softmax(x.to(DType::f16), -1).dtype() == DType::f32);
    ComputeGraph graph;
    {
        const NoGradGuard no_grad;
        CHECK(matmul(graph.input(x), graph.parameter(w)).dtype() == DType::f16);
    }
    // With grad on, the weight's no-grad cast (a leaf without history) must not be reused.
    const Var y = matmul(graph.input(x), graph.parameter(w));
    CHECK(autocast_cache_stats().casts == 2);
    graph.backward(sum(y));
    CHECK(w.grad().dtype() == DType::f32);
}

TEST_CASE("without autocast, mixing bf16/f16 with f32 is a DTypeError naming both dtypes", "[autocast]") {
    Generator gen(14);
    const Tensor x = Tensor::normal({2, 3}, 0.0, 1.0, gen);
    const Tensor w = Tensor::normal({3, 3}, 0.0, 1.0, gen);
    ComputeGraph graph;
    CHECK_THROWS_MATCHES(matmul(graph.input(x.to(DType::bf16)), graph.input(w)), DTypeError,
                         MessageHas({"matmul", "bfloat16", "float32"}));
    CHECK_THROWS_MATCHES(add(graph.input(x.to(DType::f16)), graph.input(x)), DTypeError,
                         MessageHas({"float16", "float32"}));
    CHECK_THROWS_MATCHES(matmul(x.to(DType::f16), w.to(DType::bf16)), DTypeError,
                         MessageHas({"float16", "bfloat16"}));
}

TEST_CASE("f16 overflow in a forward: the loss is inf, the scaler skips the step, anomaly mode names the op",
          "[autocast][amp]") {
    Generator gen(15);
    Linear layer(8, 4, true, gen);
    Adam adam(layer.parameters(), {.lr = 0.01});
    GradScaler scaler;
    // Inputs of 6e4 (finite in f16) over 8 features with weights in [0.5, 1]: every sum beyond f16's 65504.
    layer.parameters()[0].value().copy_from(Tensor::uniform({4, 8}, 0.5, 1.0, gen));
    const std::vector<double> before = layer.parameters()[0].value().to_vector();
    const Tensor big = Tensor::full({5, 8}, 6e4, DType::f32);
    const Tensor y = Tensor::normal({5, 4}, 0.0, 1.0, gen);
    {
        ComputeGraph graph;
        Var loss;
        {
            const AutocastGuard autocast(DType::f16);
            loss = mse_loss(layer(graph.input(big)), graph.input(y));
        }
        CHECK(std::isinf(loss.item()));
        graph.backward(scaler.scale(loss));
        scaler.step(adam);
        scaler.update();
    }
    CHECK(scaler.last_step_skipped());
    CHECK(adam.step_count(0) == 0);  // the step counts show the skip
    CHECK(layer.parameters()[0].value().to_vector() == before);
    CHECK(scaler.scale_value() == 32768.0);

    const AnomalyModeGuard anomaly;
    ComputeGraph graph;
    const AutocastGuard autocast(DType::f16);
    CHECK_THROWS_MATCHES(layer(graph.input(big)), NumericalError,
                         MessageHas({"linear", "anomaly mode", "NaN/Inf", "float16"}));
}
