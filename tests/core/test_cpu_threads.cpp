// CPU threads (core/parallel.h): the kernels cut their work into chunks fixed by the sizes, so a training
// step gives bitwise the same values and gradients on 1 thread and on N. The sizes below are chosen so
// that every parallel path is really split: the convolution over images (forward, dx, dw partial sums),
// the GEMM panels of linear's forward and backward, and the elementwise chunks (tanh, the fan-out's
// accumulation).
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

// Restores the thread count a test changed.
struct ThreadCountGuard {
    int saved = cpu_threads();
    ~ThreadCountGuard() { set_cpu_threads(saved); }
};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() &&
           std::memcmp(a.raw_data(), b.raw_data(), static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

struct StepResult {
    Tensor loss;
    std::vector<Tensor> grads;  // x, conv weight, conv bias, linear weight, linear bias
};

// conv2d (relu fused) -> tanh(h) + 0.5·h (h used twice: the engine accumulates its gradients) -> linear
// -> cross_entropy; one forward and backward on `threads` threads.
StepResult training_step(int threads, const std::vector<Tensor>& values, const Tensor& labels) {
    set_cpu_threads(threads);
    ComputeGraph graph;
    std::vector<Parameter> params;
    for (std::size_t i = 1; i < values.size(); ++i) params.emplace_back(values[i].clone());
    Var x = graph.input(values[0], "x", true);
    Conv2dOptions conv;
    conv.padding = {2, 2};
    conv.activation = Activation::Relu;
    Var h = conv2d(x, graph.parameter(params[0]), graph.parameter(params[1]), conv);
    Var a = tanh(h) + h * 0.5;
    Var logits = linear(reshape(a, {a.shape()[0], -1}), graph.parameter(params[2]), graph.parameter(params[3]));
    Var loss = cross_entropy(logits, graph.input(labels, "labels"));
    graph.backward(loss);
    StepResult r{loss.value().clone(), {x.grad().clone()}};
    for (Parameter& p : params) r.grads.push_back(p.grad().clone());
    return r;
}

}  // namespace

TEST_CASE("a conv + linear + elementwise training step is bitwise the same on 1 and N threads", "[threads]") {
    const ThreadCountGuard guard;
    // x (8,3,64,64), conv 16 filters 5x5 pad 2 -> (8,16,64,64) = 524288 elements -> linear 65536 -> 64 classes
    const std::int64_t batch = 8, classes = 64;
    REQUIRE(chunk_count(batch, 16 * 64 * 64 * 75 * 2) > 1);               // conv2d: chunks of images
    REQUIRE(chunk_count(64, batch * 65536, 32) > 1);                       // linear forward: column panels
    REQUIRE(chunk_count(batch * 16 * 64 * 64, 1, 64) > 1);                 // tanh, add, accumulate_into
    for (const DType dtype : {DType::f32, DType::f64}) {
        INFO(dtype_name(dtype));
        Generator gen(20261125 + static_cast<int>(dtype));
        const std::vector<Tensor> values = {
            Tensor::normal({batch, 3, 64, 64}, 0.0, 1.0, gen, dtype), Tensor::normal({16, 3, 5, 5}, 0.0, 0.2, gen, dtype),
            Tensor::normal({16}, 0.0, 0.1, gen, dtype), Tensor::normal({classes, 65536}, 0.0, 0.005, gen, dtype),
            Tensor::normal({classes}, 0.0, 0.1, gen, dtype)};
        std::uniform_int_distribution<std::int64_t> pick(0, classes - 1);
        std::vector<std::int64_t> label_values(batch);
        for (auto& v : label_values) v = pick(gen.engine());
        const Tensor labels = Tensor::from_vector(label_values, {batch});

        const StepResult one = training_step(1, values, labels);
        for (const int threads : {2, 3, 8}) {
            INFO(threads << " threads");
            const StepResult many = training_step(threads, values, labels);
            CHECK(bitwise_equal(many.loss, one.loss));
            for (std::size_t i = 0; i < one.grads.size(); ++i) {
                INFO("gradient " << i);
                CHECK(bitwise_equal(many.grads[i], one.grads[i]));
            }
        }
    }
}

TEST_CASE("a deep matmul is bitwise the same on 1 and N threads and close to float64", "[threads]") {
    const ThreadCountGuard guard;
    Generator gen(77);
    // K = 3000 is deeper than Eigen's depth blocking, whose size depends on the thread count when Eigen
    // parallelises itself: the case where its own threads change the result (docs/performance.md).
    const Tensor a = Tensor::normal({96, 3000}, 0.0, 1.0, gen);
    const Tensor b = Tensor::normal({3000, 200}, 0.0, 1.0, gen);
    set_cpu_threads(1);
    const Tensor one = eager(OpType::Matmul, {a, b});
    const Tensor reference = eager(OpType::Matmul, {a.to(DType::f64), b.to(DType::f64)});
    CHECK(relative_norm_error(one.to(DType::f64), reference) < 1e-5);
    for (const int threads : {2, 5}) {
        set_cpu_threads(threads);
        CHECK(bitwise_equal(eager(OpType::Matmul, {a, b}), one));
    }
}

TEST_CASE("parallel_chunks runs every chunk once, on several threads", "[threads]") {
    const ThreadCountGuard guard;
    set_cpu_threads(2);
    std::vector<int> runs(16, 0);
    std::mutex mutex;
    std::set<std::thread::id> ids;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    parallel_chunks(16, [&](std::int64_t c) {
        ++runs[static_cast<std::size_t>(c)];
        {
            const std::lock_guard<std::mutex> lock(mutex);
            ids.insert(std::this_thread::get_id());
        }
        // Each chunk holds its thread until a second thread has taken one (or 10 s have passed).
        for (;;) {
            {
                const std::lock_guard<std::mutex> lock(mutex);
                if (ids.size() >= 2) break;
            }
            if (std::chrono::steady_clock::now() > deadline) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    });
    CHECK(runs == std::vector<int>(16, 1));
    CHECK(ids.size() == 2);
    // An exception in a chunk comes back to the caller once, as itself; the pool stays usable.
    CHECK_THROWS_AS(parallel_chunks(8, [](std::int64_t c) {
                        if (c == 5) throw IndexError("chunk 5");
                    }),
                    IndexError);
    std::atomic<int> count{0};
    parallel_chunks(8, [&](std::int64_t) { ++count; });
    CHECK(count == 8);
}

TEST_CASE("chunks started inside a chunk, or from two threads at once, run in turn with the same results",
          "[threads]") {
    const ThreadCountGuard guard;
    set_cpu_threads(2);
    std::vector<int> runs(64, 0);
    parallel_chunks(8, [&](std::int64_t outer) {
        parallel_chunks(8, [&](std::int64_t inner) { ++runs[static_cast<std::size_t>(outer * 8 + inner)]; });
    });
    CHECK(runs == std::vector<int>(64, 1));
    Generator gen(5);
    const Tensor a = Tensor::normal({300, 1000}, 0.0, 1.0, gen);
    const Tensor b = Tensor::normal({1000, 300}, 0.0, 1.0, gen);
    const Tensor expected = eager(OpType::Matmul, {a, b});
    Tensor first, second;
    std::thread other([&] { first = eager(OpType::Matmul, {a, b}); });
    second = eager(OpType::Matmul, {a, b});
    other.join();
    CHECK(bitwise_equal(first, expected));
    CHECK(bitwise_equal(second, expected));
}

TEST_CASE("chunks depend on the sizes only and cover every item once", "[threads]") {
    for (const std::int64_t items : {1, 7, 64, 1000, 1 << 20}) {
        const std::int64_t chunks = chunk_count(items, 1000, 32);
        REQUIRE(chunks >= 1);
        REQUIRE(chunks <= kMaxChunks);
        std::int64_t next = 0;
        for (std::int64_t c = 0; c < chunks; ++c) {
            const ChunkRange r = chunk_range(items, chunks, c, 32);
            CHECK(r.begin == next);
            CHECK(r.end >= r.begin);
            if (r.end < items) CHECK(r.end % 32 == 0);
            next = r.end;
        }
        CHECK(next == items);
    }
}

TEST_CASE("set_cpu_threads rejects a count below 1", "[threads]") {
    const ThreadCountGuard guard;
    CHECK_THROWS_AS(set_cpu_threads(0), ValueError);
    CHECK_THROWS_AS(set_cpu_threads(-4), ValueError);
    CHECK(cpu_threads() == guard.saved);
}
