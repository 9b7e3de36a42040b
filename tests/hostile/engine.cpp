// Hostile uses of the engine (issue 11): handles into destroyed graphs, values written in place between a
// forward and its backward, and one graph used from two threads at once. Each must throw GraphError.
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

Tensor randn(const Shape& shape) {
    static Generator gen(1111);
    return Tensor::normal(shape, 0.0, 1.0, gen, DType::f64);
}

// A Var whose graph is gone: exp(x) of a graph destroyed on return.
Var from_destroyed_graph() {
    ComputeGraph g;
    return exp(g.input(randn({3}), "x", true));
}

// ---- in-place writes: a forward of y = Σ exp(x·w) waits for its backward while `write` changes something ----
struct Pending {
    Parameter w{randn({3}), "w"};
    ComputeGraph g;
    Var x = g.input(randn({3}), "x");
    Var e = exp(mul(x, g.parameter(w)));
    Var loss = sum(e);
};
std::function<void()> written_before_backward(std::function<void(Pending&)> write) {
    return [write] {
        Pending p;
        write(p);
        p.g.backward(p.loss);
    };
}
// A parameter with a gradient, so that an optimizer step changes it.
Parameter with_gradient(const std::string& name) {
    Parameter w(randn({3}), name);
    ComputeGraph warm;
    warm.backward(sum(mul(warm.parameter(w), warm.input(randn({3})))));
    return w;
}
template <typename Optim, typename Options>
std::function<void()> step_before_backward(Options options) {
    return [options] {
        Parameter w = with_gradient("layer.w");
        Optim optimizer({w}, options);
        ComputeGraph g;
        Var loss = sum(mul(g.input(randn({3})), g.parameter(w)));
        optimizer.step();
        g.backward(loss);
    };
}

// ---- threads: a custom op that stops inside record or backward until released ----
std::atomic<bool> hold_forward{false}, hold_backward{false}, entered{false}, released{false};
void wait_for(const std::atomic<bool>& flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!flag.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
}
void hold() {
    entered = true;
    wait_for(released);
}
const CustomOp& gate() {
    static const CustomOp op = CustomOp::define(
        {.name = "engine_gate",
         .arity = 1,
         .infer = [](OpType, std::span<const Tensor> in, const OpAttrs&) { return OutputSpec{in[0].shape(), in[0].dtype()}; },
         .cpu = {.forward =
                     [](const ForwardArgs& args) {
                         if (hold_forward.exchange(false)) hold();
                         return args.inputs[0].clone();
                     },
                 .backward =
                     [](const BackwardArgs& args) {
                         if (hold_backward.exchange(false)) hold();
                         return std::vector<Tensor>{args.grad_output};
                     }}});
    return op;
}
// While another thread is inside a record (forward_side) or a backward of graph g, runs `attempt(g, x)` on
// this thread; then lets the other thread finish and rethrows what the attempt threw.
std::function<void()> while_busy(bool forward_side, std::function<void(ComputeGraph&, Var&)> attempt) {
    return [forward_side, attempt] {
        ComputeGraph g;
        Var x = g.input(randn({3}), "x", true);
        Var loss = sum(gate()({x}));
        entered = false;
        released = false;
        (forward_side ? hold_forward : hold_backward) = true;
        std::thread other([&] {
            try {
                if (forward_side) static_cast<void>(gate()({x}));
                else g.backward(loss);
            } catch (...) {
            }
        });
        wait_for(entered);
        std::exception_ptr error;
        try {
            attempt(g, x);
        } catch (...) {
            error = std::current_exception();
        }
        released = true;
        other.join();
        if (error) std::rethrow_exception(error);
    };
}

const std::vector<std::string> kInPlace{"parameter 'w'", "mul", "modified in place"};

const bool added = hostile::add(
    "engine",
    {
        // a Var used after its graph was destroyed
        hostile::expect<GraphError>("value() of a Var whose graph was destroyed", {"Var #1", "destroyed"},
                                    [] { from_destroyed_graph().value(); }),
        hostile::expect<GraphError>("grad() of a Var whose graph was destroyed", {"destroyed"},
                                    [] { from_destroyed_graph().grad(); }),
        hostile::expect<GraphError>("shape() of a Var whose graph was destroyed", {"destroyed"},
                                    [] { from_destroyed_graph().shape(); }),
        hostile::expect<GraphError>("item() of a Var whose graph was destroyed", {"destroyed"},
                                    [] { from_destroyed_graph().item(); }),
        hostile::expect<GraphError>("requires_grad() of a Var whose graph was destroyed", {"destroyed"},
                                    [] { from_destroyed_graph().requires_grad(); }),
        hostile::expect<GraphError>("name() on a Var whose graph was destroyed", {"destroyed"},
                                    [] { from_destroyed_graph().name("late"); }),
        hostile::expect<GraphError>("graph() of a Var whose graph was destroyed", {"destroyed"},
                                    [] { from_destroyed_graph().graph(); }),
        hostile::expect<GraphError>("an op on a Var whose graph was destroyed", {"destroyed"},
                                    [] { relu(from_destroyed_graph()); }),
        hostile::expect<GraphError>("detach of a Var whose graph was destroyed", {"destroyed"},
                                    [] { detach(from_destroyed_graph()); }),
        hostile::expect<GraphError>("a live Var and one of a destroyed graph into one op",
                                    {"add", "input 1", "destroyed"},
                                    [] {
                                        ComputeGraph g;
                                        add(g.input(randn({3})), from_destroyed_graph());
                                    }),
        hostile::expect<GraphError>("backward from a loss of a destroyed graph", {"backward", "loss", "destroyed"},
                                    [] {
                                        ComputeGraph g;
                                        g.backward(from_destroyed_graph());
                                    }),
        hostile::expect<GraphError>("backward with a gradient from an output of a destroyed graph",
                                    {"backward", "output", "destroyed"},
                                    [] {
                                        ComputeGraph g;
                                        g.backward(from_destroyed_graph(), randn({3}));
                                    }),
        hostile::expect<GraphError>("a Var of a graph destroyed and rebuilt in the same memory",
                                    {"Var #0", "cleared or destroyed"},
                                    [] {
                                        std::optional<ComputeGraph> g(std::in_place);
                                        Var x = g->input(randn({2}), "x");
                                        g.emplace();
                                        g->input(randn({2}), "y");
                                        x.value();
                                    }),

        // a value written in place between a forward and its backward
        hostile::expect<GraphError>("SGD step between a forward and its backward",
                                    {"parameter 'layer.w'", "mul", "modified in place", "step()"},
                                    step_before_backward<SGD>(SgdOptions{.lr = 0.1})),
        hostile::expect<GraphError>("SGD with Nesterov momentum between a forward and its backward",
                                    {"parameter 'layer.w'", "modified in place"},
                                    step_before_backward<SGD>(SgdOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true})),
        hostile::expect<GraphError>("Adam step between a forward and its backward",
                                    {"parameter 'layer.w'", "mul", "modified in place"},
                                    step_before_backward<Adam>(AdamOptions{.lr = 0.01})),
        hostile::expect<GraphError>("AdamW step between a forward and its backward",
                                    {"parameter 'layer.w'", "mul", "modified in place"},
                                    step_before_backward<AdamW>(AdamOptions{.lr = 0.01, .weight_decay = 0.01})),
        hostile::expect<GraphError>("fill() on a parameter's value before the backward", kInPlace,
                                    written_before_backward([](Pending& p) { p.w.value().fill(0.5); })),
        hostile::expect<GraphError>("copy_from() into a parameter's value before the backward", kInPlace,
                                    written_before_backward([](Pending& p) { p.w.value().copy_from(randn({3})); })),
        hostile::expect<GraphError>("set() of one element of a parameter before the backward", kInPlace,
                                    written_before_backward([](Pending& p) { p.w.value().set({2}, 1.0); })),
        hostile::expect<GraphError>("bump_version() by a raw writer before the backward", kInPlace,
                                    written_before_backward([](Pending& p) {
                                        p.w.value().data<double>()[0] = 4.0;
                                        p.w.value().bump_version();
                                    })),
        hostile::expect<GraphError>("load_parameters() between a forward and its backward", kInPlace,
                                    written_before_backward([](Pending& p) {
                                        const auto path =
                                            std::filesystem::temp_directory_path() / "dyngrad_hostile_engine.safetensors";
                                        save_parameters(std::vector<Parameter>{Parameter(randn({3}), "w")}, path);
                                        load_parameters(std::vector<Parameter>{p.w}, path);
                                        std::filesystem::remove(path);
                                    })),
        hostile::expect<GraphError>("fill() on an input's value before the backward",
                                    {"input 0", "'x'", "mul", "modified in place"},
                                    written_before_backward([](Pending& p) {
                                        Tensor value = p.x.value();
                                        value.fill(1.0);
                                    })),
        hostile::expect<GraphError>("fill() on an intermediate's value before the backward",
                                    {"exp", "sum", "modified in place"},
                                    written_before_backward([](Pending& p) {
                                        Tensor value = p.e.value();
                                        value.fill(1.0);
                                    })),
        hostile::expect<GraphError>("backward from an output whose value was overwritten",
                                    {"the output of exp", "modified in place"},
                                    [] {
                                        Pending p;
                                        Tensor value = p.e.value();
                                        value.copy_from(randn({3}));
                                        p.g.backward(p.e, randn({3}));
                                    }),
        hostile::expect<GraphError>("copy_from() into a reshaped alias of a parameter's value", kInPlace,
                                    written_before_backward([](Pending& p) {
                                        Tensor alias = p.w.value().reshaped({3, 1});
                                        alias.copy_from(randn({3, 1}));
                                    })),
        hostile::expect<GraphError>("a constant matrix overwritten before matmul's backward",
                                    {"input 0", "matmul", "modified in place"},
                                    [] {
                                        ComputeGraph g;
                                        Tensor a = randn({2, 3});
                                        Var y = matmul(g.constant(a), g.input(randn({3, 2}), "b", true));
                                        a.fill(0.0);
                                        g.backward(sum(y));
                                    }),
        hostile::expect<GraphError>("a Linear layer's weight stepped before the backward",
                                    {"parameter '0.weight'", "linear", "modified in place"},
                                    [] {
                                        Generator gen(5);
                                        Sequential model;
                                        model.add(Linear(3, 2, true, gen));
                                        model.to(DType::f64);
                                        SGD sgd(model.parameters(), {.lr = 0.1});
                                        {
                                            ComputeGraph warm;
                                            warm.backward(sum(model(warm.input(randn({4, 3})))));
                                        }
                                        ComputeGraph g;
                                        Var loss = sum(model(g.input(randn({4, 3}))));
                                        sgd.step();
                                        g.backward(loss);
                                    }),
        hostile::expect<GraphError>("a retained graph, a step, then its second backward",
                                    {"parameter 'layer.w'", "modified in place"},
                                    [] {
                                        Parameter w = with_gradient("layer.w");
                                        SGD sgd({w}, {.lr = 0.1});
                                        ComputeGraph g;
                                        Var loss = sum(mul(g.parameter(w), g.input(randn({3}))));
                                        g.backward(loss, {.retain_graph = true});
                                        sgd.step();
                                        g.backward(loss);
                                    }),

        // one graph, two threads
        hostile::expect<GraphError>("an op recorded while another thread records into the graph",
                                    {"exp", "in use by another thread", "engine_gate"},
                                    while_busy(true, [](ComputeGraph&, Var& x) { exp(x); })),
        hostile::expect<GraphError>("input() while another thread records into the graph",
                                    {"input()", "another thread"},
                                    while_busy(true, [](ComputeGraph& g, Var&) { g.input(randn({2})); })),
        hostile::expect<GraphError>("constant() while another thread records into the graph",
                                    {"constant()", "another thread"},
                                    while_busy(true, [](ComputeGraph& g, Var&) { g.constant(randn({2})); })),
        hostile::expect<GraphError>("parameter() while another thread records into the graph",
                                    {"parameter()", "another thread"},
                                    while_busy(true, [](ComputeGraph& g, Var&) { g.parameter(Parameter(randn({2}), "p")); })),
        hostile::expect<GraphError>("clear() while another thread records into the graph",
                                    {"clear()", "another thread"},
                                    while_busy(true, [](ComputeGraph& g, Var&) { g.clear(); })),
        hostile::expect<GraphError>("reading a Var's value while another thread records",
                                    {"another thread"},
                                    while_busy(true, [](ComputeGraph&, Var& x) { x.value(); })),
        hostile::expect<GraphError>("an op recorded while another thread runs backward",
                                    {"relu", "in use by another thread", "backward()"},
                                    while_busy(false, [](ComputeGraph&, Var& x) { relu(x); })),
        hostile::expect<GraphError>("a second backward while another thread runs backward",
                                    {"backward()", "another thread"},
                                    while_busy(false, [](ComputeGraph& g, Var& x) { g.backward(sum(x)); })),
        hostile::expect<GraphError>("reading a gradient while another thread runs backward",
                                    {"gradient", "another thread"},
                                    while_busy(false, [](ComputeGraph&, Var& x) { x.grad(); })),
        hostile::expect<GraphError>("naming a Var while another thread runs backward",
                                    {"naming", "another thread"},
                                    while_busy(false, [](ComputeGraph&, Var& x) { x.name("racy"); })),
        hostile::expect<GraphError>("node() while another thread runs backward",
                                    {"node()", "another thread"},
                                    while_busy(false, [](ComputeGraph& g, Var&) { g.node(0); })),
    });

}  // namespace
