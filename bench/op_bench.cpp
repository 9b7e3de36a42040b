// dyngrad-op-bench: forward + backward of the single ops a transformer-style model spends its time in, at
// realistic float32 sizes, on the GPU (issue 13). bench/torch_ops.py runs exactly the same ops and sizes in
// PyTorch; bench/compare_ops.py joins the two JSON files into a markdown table; scripts/run-op-bench.sh
// builds and runs all three.
//
// Each step records the op in a fresh ComputeGraph from inputs already on the device (requires_grad on
// every float input), then runs backward: from the scalar itself for the losses, otherwise with a random
// output gradient (graph.backward(y, dy)), so no extra reduction is timed. A step is timed from a
// synchronised device to a synchronised device (cuda::synchronize: dyngrad's stream), which is what
// torch_ops.py's CUDA events around one step measure on an idle device: host recording + kernels.
// Reported: the median over --repetitions steps after --warmup untimed ones.
//
// Usage: dyngrad-op-bench [--op NAME,NAME...] [--warmup N] [--repetitions N] [--list] [--json FILE]
#include <dyngrad/dyngrad.h>

#include "../cli/command_line.h"
#include "../cli/timing.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace dyngrad;

namespace {

struct Options {
    std::vector<std::string> ops;  // empty: all
    int warmup = 10, repetitions = 50;
    bool list = false;
    std::string json;
};

// One benchmarked op: `prepare` builds the device inputs once and returns the step to time.
struct Case {
    std::string op, size;
    std::function<std::function<void()>()> prepare;
    double bytes = 0;  // bytes a step reads and writes, for a GB/s column (0: not reported)
};

const Device gpu = Device::cuda(0);

Tensor randn(const Shape& shape, Generator& gen) { return Tensor::normal(shape, 0, 1, gen, DType::f32, gpu); }

// int64 in [0, high), some set to `ignore` when ignore_every > 0 (every ignore_every-th entry, as padding).
Tensor random_indices(std::int64_t count, std::int64_t high, std::uint64_t seed, std::int64_t ignore = 0,
                      std::int64_t ignore_every = 0) {
    std::mt19937_64 engine(seed);
    std::uniform_int_distribution<std::int64_t> pick(0, high - 1);
    std::vector<std::int64_t> values(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
        values[static_cast<std::size_t>(i)] = ignore_every > 0 && i % ignore_every == 0 ? ignore : pick(engine);
    return Tensor::from_vector(values, {count}, gpu);
}

// A causal mask (1 above the diagonal: the positions to hide), float as dyngrad's where/masked_fill take it.
Tensor causal_mask(std::int64_t n) {
    std::vector<float> values(static_cast<std::size_t>(n * n));
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < n; ++j) values[static_cast<std::size_t>(i * n + j)] = j > i ? 1.0f : 0.0f;
    return Tensor::from_vector(values, {n, n}, gpu);
}

// Unary float op with a random output gradient (of out_shape where the op changes the shape).
Case unary_case(const std::string& op, Shape shape, std::function<Var(const Var&)> fn, Shape out_shape = {}) {
    if (out_shape.empty()) out_shape = shape;
    std::string size;
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) size.push_back('x');
        size.append(std::to_string(shape[i]));
    }
    return {op, size, [shape, out_shape, fn] {
                Generator gen(1);
                const Tensor x = randn(shape, gen), dy = randn(out_shape, gen);
                return std::function<void()>([x, dy, fn] {
                    ComputeGraph graph;
                    graph.backward(fn(graph.input(x, "x", true)), dy);
                });
            }};
}

Case norm_case(const std::string& op, std::int64_t rows, std::int64_t width) {
    return {op, std::to_string(rows) + "x" + std::to_string(width), [=] {
                Generator gen(2);
                const Tensor x = randn({rows, width}, gen), dy = randn({rows, width}, gen);
                const Tensor weight = Tensor::uniform({width}, 0.5, 1.5, gen, DType::f32, gpu);
                const Tensor bias = randn({width}, gen);
                const bool layer = op == "layer_norm";
                return std::function<void()>([=] {
                    ComputeGraph graph;
                    const Var vx = graph.input(x, "x", true), vw = graph.input(weight, "weight", true);
                    const Var y = layer ? layer_norm(vx, {width}, vw, graph.input(bias, "bias", true))
                                        : rms_norm(vx, {width}, vw);
                    graph.backward(y, dy);
                });
            }};
}

std::vector<Case> all_cases() {
    constexpr std::int64_t rows = 8192, hidden = 768, ffn = 3072, vocab = 50257, batch = 8, seq = 1024, heads = 12;
    std::vector<Case> cases;
    for (const std::int64_t width : {hidden, std::int64_t(4096)}) cases.push_back(norm_case("layer_norm", rows, width));
    for (const std::int64_t width : {hidden, std::int64_t(4096)}) cases.push_back(norm_case("rms_norm", rows, width));
    cases.push_back(unary_case("gelu_erf", {rows, ffn}, [](const Var& x) { return gelu(x); }));
    cases.push_back(unary_case("gelu_tanh", {rows, ffn}, [](const Var& x) { return gelu(x, GeluApproximation::Tanh); }));
    cases.push_back(unary_case("silu", {rows, ffn}, [](const Var& x) { return silu(x); }));
    cases.push_back({"embedding", "50257x768[8x1024]", [=] {
                         Generator gen(3);
                         const Tensor weight = randn({vocab, hidden}, gen), dy = randn({batch, seq, hidden}, gen);
                         const Tensor ids = random_indices(batch * seq, vocab, 3).reshaped({batch, seq});
                         return std::function<void()>([=] {
                             ComputeGraph graph;
                             graph.backward(embedding(graph.input(ids, "ids"), graph.input(weight, "weight", true)), dy);
                         });
                     }});
    // Losses: mean over the rows, every 8th label the ignore_index (padding), backward from the scalar.
    for (const std::string op : {"cross_entropy", "nll_loss"}) {
        cases.push_back({op, "8192x50257", [=] {
                             Generator gen(4);
                             const Tensor x = randn({rows, vocab}, gen);
                             const Tensor labels = random_indices(rows, vocab, 4, -100, 8);
                             return std::function<void()>([=] {
                                 ComputeGraph graph;
                                 const Var vx = graph.input(x, "x", true), vl = graph.input(labels, "labels");
                                 graph.backward(op == "cross_entropy" ? cross_entropy(vx, vl) : nll_loss(vx, vl));
                             });
                         }});
    }
    cases.push_back(unary_case("softmax", {rows, 1024}, [](const Var& x) { return softmax(x, -1); }));
    // Attention masking: scores (8,12,1024,1024), a causal (1024,1024) mask broadcast over batch and heads.
    const Shape scores{batch, heads, seq, seq};
    cases.push_back({"where", "8x12x1024x1024", [=] {
                         Generator gen(5);
                         const Tensor a = randn(scores, gen), b = randn(scores, gen), dy = randn(scores, gen);
                         const Tensor mask = causal_mask(seq);
                         return std::function<void()>([=] {
                             ComputeGraph graph;
                             graph.backward(where(graph.input(mask, "mask"), graph.input(b, "b", true),
                                                  graph.input(a, "a", true)),
                                            dy);
                         });
                     }});
    cases.push_back({"masked_fill", "8x12x1024x1024", [=] {
                         Generator gen(6);
                         const Tensor x = randn(scores, gen), dy = randn(scores, gen);
                         const Tensor mask = causal_mask(seq);
                         return std::function<void()>([=] {
                             ComputeGraph graph;
                             graph.backward(masked_fill(graph.input(x, "x", true), graph.input(mask, "mask"), -1e9), dy);
                         });
                     }});
    cases.push_back(unary_case("permute", {batch, seq, heads, 64}, [](const Var& x) { return permute(x, {0, 2, 1, 3}); },
                                {batch, heads, seq, 64}));
    // The char GPT's head permutes (B=64, T=256, H=6, D=64), forward + backward = two copies of the tensor, each
    // reading and writing it once: achieved GB/s against the device's copy bandwidth.
    for (const DType dtype : {DType::f32, DType::bf16}) {
        const std::string suffix = dtype == DType::f32 ? "" : "_bf16";
        const auto gpt_permute = [&](const std::string& op, const Shape& x_shape, std::vector<std::int64_t> dims) {
            Shape y_shape(dims.size());
            for (std::size_t i = 0; i < dims.size(); ++i) y_shape[i] = x_shape[static_cast<std::size_t>(dims[i])];
            std::string size;
            for (std::size_t i = 0; i < x_shape.size(); ++i) {
                if (i) size.push_back('x');
                size.append(std::to_string(x_shape[i]));
            }
            const double bytes = 4.0 * static_cast<double>(numel(x_shape) * static_cast<std::int64_t>(dtype_size(dtype)));
            cases.push_back({op + suffix, size, [=] {
                                 Generator gen(9);
                                 const Tensor x = Tensor::normal(x_shape, 0, 1, gen, dtype, gpu);
                                 const Tensor dy = Tensor::normal(y_shape, 0, 1, gen, dtype, gpu);
                                 return std::function<void()>([=] {
                                     ComputeGraph graph;
                                     graph.backward(permute(graph.input(x, "x", true), dims), dy);
                                 });
                             },
                             bytes});
        };
        gpt_permute("gpt_qkv_permute", {64, 256, 3, 6, 64}, {2, 0, 3, 1, 4});
        gpt_permute("gpt_merge_permute", {64, 6, 256, 64}, {0, 2, 1, 3});
    }
    cases.push_back({"index_select", "8192x3072[8192]", [=] {
                         Generator gen(7);
                         const Tensor x = randn({rows, ffn}, gen), dy = randn({rows, ffn}, gen);
                         const Tensor index = random_indices(rows, rows, 7);
                         return std::function<void()>([=] {
                             ComputeGraph graph;
                             graph.backward(index_select(graph.input(x, "x", true), 0, graph.input(index, "index")), dy);
                         });
                     }});
    cases.push_back(unary_case("clamp", {rows, ffn}, [](const Var& x) { return clamp(x, -1.0, 1.0); }));
    cases.push_back({"maximum", "8192x3072", [=] {
                         Generator gen(8);
                         const Tensor a = randn({rows, ffn}, gen), b = randn({rows, ffn}, gen), dy = randn({rows, ffn}, gen);
                         return std::function<void()>([=] {
                             ComputeGraph graph;
                             graph.backward(maximum(graph.input(a, "a", true), graph.input(b, "b", true)), dy);
                         });
                     }});
    return cases;
}

Options parse(int argc, char** argv, const std::vector<Case>& cases) {
    const cli::Arguments args(argc, argv, {.flags = {"--list"}, .options = {"--op", "--warmup", "--repetitions", "--json"}});
    if (args.help()) {
        std::puts("usage: dyngrad-op-bench [--op NAME,NAME...] [--warmup N] [--repetitions N] [--list] [--json FILE]");
        std::exit(0);
    }
    Options o;
    if (auto v = args.value("--op")) {
        const std::string text(*v);
        std::size_t start = 0;
        while (start <= text.size()) {
            const std::size_t comma = std::min(text.find(',', start), text.size());
            const std::string name = text.substr(start, comma - start);
            if (std::none_of(cases.begin(), cases.end(), [&](const Case& c) { return c.op == name; }))
                throw ValueError(str("--op: unknown op '", name, "' (--list names them)"));
            o.ops.push_back(name);
            start = comma + 1;
        }
    }
    if (auto v = args.value("--warmup")) o.warmup = static_cast<int>(cli::parse_int("--warmup", *v, 0, 1 << 20));
    if (auto v = args.value("--repetitions"))
        o.repetitions = static_cast<int>(cli::parse_int("--repetitions", *v, 1, 1 << 20));
    o.list = args.has("--list");
    if (auto v = args.value("--json")) o.json = cli::output_file("--json", *v);
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    return cli::guarded_main("dyngrad-op-bench", [&] {
        const std::vector<Case> cases = all_cases();
        const Options o = parse(argc, argv, cases);
        if (o.list) {
            for (const Case& c : cases) std::printf("%s %s\n", c.op.c_str(), c.size.c_str());
            return 0;
        }
        if (cli::no_cuda_device("dyngrad-op-bench")) return 77;
        std::printf("device: %s; float32 (bf16 where named), forward + backward, median of %d after %d warm-up\n",
                    cuda::device_name(0).c_str(), o.repetitions, o.warmup);
        std::printf("%-22s %-20s %10s %8s\n", "op", "size", "ms", "GB/s");
        std::ofstream json;
        if (!o.json.empty()) {
            json.open(o.json);
            json << "{\"framework\": \"dyngrad\", \"device\": \"" << cuda::device_name(0) << "\", \"warmup\": " << o.warmup
                 << ", \"repetitions\": " << o.repetitions << ", \"rows\": [";
        }
        bool first = true;
        for (const Case& c : cases) {
            if (!o.ops.empty() && std::find(o.ops.begin(), o.ops.end(), c.op) == o.ops.end()) continue;
            double ms;
            {
                const std::function<void()> step = c.prepare();  // inputs freed when it goes
                ms = cli::median_ms(step, o.warmup, o.repetitions);
            }
            const double gbps = c.bytes > 0 ? c.bytes / (ms * 1e6) : 0.0;
            if (c.bytes > 0)
                std::printf("%-22s %-20s %10.3f %8.0f\n", c.op.c_str(), c.size.c_str(), ms, gbps);
            else
                std::printf("%-22s %-20s %10.3f\n", c.op.c_str(), c.size.c_str(), ms);
            std::fflush(stdout);
            if (json.is_open()) {
                json << (first ? "" : ", ") << "\n {\"op\": \"" << c.op << "\", \"size\": \"" << c.size
                     << "\", \"ms\": " << ms;
                if (c.bytes > 0) json << ", \"gbps\": " << gbps;
                json << "}";
                json.flush();
            }
            first = false;
        }
        if (json.is_open()) json << "\n]}\n";
        return 0;
    }, "", 2);
}
