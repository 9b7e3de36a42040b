// The distributed layer on GPUs through NCCL: run by dist_gpu2 as `mpirun -np 2 test_dist_gpu` and by dist_gpu4 as
// `mpirun -np 4 test_dist_gpu`, one rank per GPU (NCCL_NVLS_ENABLE=0). Exits 77 (skipped) unless it runs as N >= 2
// ranks on a machine with at least N CUDA devices.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <thread>

#include "catch.h"
#include "dist_support.h"
#include "dyngrad/cuda/capture.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/distributed/ddp.h"
#include "dyngrad/distributed/process_group.h"
#include "dyngrad/distributed/zero.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::Approx;
using dgtest::MessageHas;
using dgtest::relative;

namespace {

dist::ProcessGroup& group() { return dgtest::launched_group(); }

Sequential make_mlp(Generator& gen) {
    Sequential m;
    m.add(Linear(32, 64, true, gen, Activation::Relu)).skip_index();
    m.add(Linear(64, 64, true, gen, Activation::Relu)).skip_index();
    m.add(Linear(64, 10, true, gen));
    return m;
}

Tensor rows(std::uint64_t seed, std::int64_t n, Device device) {
    Generator gen(seed);
    return Tensor::uniform({n, 32}, -1, 1, gen).to(device);
}
Tensor labels(std::uint64_t seed, std::int64_t n, Device device) {
    Generator gen(seed);
    std::vector<std::int64_t> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<std::int64_t>(gen.engine()() % 10));
    return Tensor::from_vector(v, {n}).to(device);
}

// Every rank's copy of `t` equal to rank 0's.
void check_same_on_every_rank(dist::ProcessGroup& g, const Tensor& t) {
    const Tensor all = g.all_gather(t);
    for (int r = 1; r < g.world_size(); ++r) CHECK(all.select(0, r).to_vector() == all.select(0, 0).to_vector());
}

// One ZeRO step (clipped at 0.5) on this rank's 32 rows of a (32 x ranks)-row f64 batch drawn from `seed`, and one
// single-GPU AdamW step (clipped alike) of the reference on all of them.
void step_both(dist::ZeroOptimizer& zero, const std::function<Var(const Var&)>& forward,
               const std::function<Var(const Var&)>& reference, const std::vector<Parameter>& reference_parameters,
               AdamW& adam, std::uint64_t seed) {
    const dist::ProcessGroup& g = zero.group();
    const Device device = g.device();
    const std::int64_t n = 32 * static_cast<std::int64_t>(g.world_size());
    const Tensor x = rows(seed, n, device).to(DType::f64), y = labels(seed + 1, n, device);
    ComputeGraph graph;
    zero.backward(graph, cross_entropy(forward(graph.input(x.narrow(0, 32 * g.rank(), 32))),
                                       graph.input(y.narrow(0, 32 * g.rank(), 32))));
    zero.clip_grad_norm(0.5);
    zero.step();
    zero.zero_grad();
    ComputeGraph ref_graph;
    ref_graph.backward(cross_entropy(reference(ref_graph.input(x)), ref_graph.input(y)));
    clip_grad_norm(reference_parameters, 0.5);
    adam.step();
    adam.zero_grad();
}

}  // namespace

TEST_CASE("NCCL collectives on each rank's GPU", "[dist][gpu]") {
    dist::ProcessGroup& g = group();
    REQUIRE(g.has_nccl());
    const Device device = g.device();
    const int world = g.world_size();
    Tensor t = Tensor::full({1000}, g.rank() + 1.0, DType::f32, device);
    g.all_reduce(t, dist::ReduceOp::Avg);
    for (double v : t.to_vector()) CHECK(v == Approx((world + 1) / 2.0));
    Tensor b = Tensor::full({7}, g.rank(), DType::f64, device);
    g.broadcast(b, 1);
    for (double v : b.to_vector()) CHECK(v == 1.0);
    const Tensor gathered = g.all_gather(Tensor::full({3}, g.rank(), DType::f32, device));
    for (int r = 0; r < world; ++r) CHECK(gathered.select(0, r).to_vector() == std::vector<double>(3, r));
    const Tensor scattered = g.reduce_scatter(Tensor::ones({2 * world, 2}, DType::f32, device));
    CHECK(scattered.to_vector() == std::vector<double>(4, world));
    // 16-bit (NCCL's bf16/f16; DDP's compressed buckets): integers, exact in both and in their sums.
    for (DType dtype : {DType::bf16, DType::f16}) {
        Tensor h = Tensor::full({1000}, g.rank() + 1.0, dtype, device);
        g.all_reduce(h, dist::ReduceOp::Sum);
        CHECK(h.dtype() == dtype);
        CHECK(h.to_vector() == std::vector<double>(1000, world * (world + 1) / 2.0));
        const Tensor hg = g.all_gather(Tensor::full({3}, g.rank(), dtype, device));
        for (int r = 0; r < world; ++r) CHECK(hg.select(0, r).to_vector() == std::vector<double>(3, r));
        CHECK(g.reduce_scatter(Tensor::ones({2 * world, 2}, dtype, device)).to_vector() == std::vector<double>(4, world));
    }
    g.barrier();
    // Tensors on two devices, or on another GPU than this rank's: DeviceError before anything is sent.
    Tensor cpu_out = Tensor::empty({world, 3}, DType::f32);
    CHECK_THROWS_MATCHES(g.all_gather(Tensor::ones({3}, DType::f32, device), cpu_out), DeviceError,
                         MessageHas({"all_gather", "cpu", "cuda"}));
    Tensor other = Tensor::ones({3}, DType::f32, Device::cuda((device.index + 1) % cuda::device_count()));
    CHECK_THROWS_MATCHES(g.all_reduce(other), DeviceError, MessageHas({"all_reduce", "this rank's device"}));
}

TEST_CASE("DDP on GPUs: averaged gradient == one GPU's gradient of the concatenated batch", "[dist][gpu][ddp]") {
    dist::ProcessGroup& g = group();
    const Device device = g.device();
    const int world = g.world_size();
    Generator init(4);
    Sequential model = make_mlp(init);
    model.to(device);
    dist::DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 0.01, .first_bucket_cap_mb = 0.002});
    REQUIRE(ddp.buckets().size() >= 3);
    const Tensor x = rows(50, 16 * world, device), y = labels(51, 16 * world, device);
    ComputeGraph graph;
    ddp.backward(graph, cross_entropy(model(graph.input(x.narrow(0, 16 * g.rank(), 16))),
                                      graph.input(y.narrow(0, 16 * g.rank(), 16))));
    CHECK(ddp.stats().buckets_launched_during_backward == static_cast<std::int64_t>(ddp.buckets().size()));
    Generator init0(4);
    Sequential reference = make_mlp(init0);
    reference.to(device);
    ComputeGraph ref;
    ref.backward(cross_entropy(reference(ref.input(x)), ref.input(y)));
    const auto params = model.parameters(), ref_params = reference.parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
        CHECK(relative(params[i].grad().to_vector(), ref_params[i].grad().to_vector()) <= 1e-5);
}

// Each bucket's gradients reach it in one batched copy when its last one is ready (during the backward with
// overlap, after it without); two steps, so that the second starts from the first's bucket views.
TEST_CASE("DDP on GPUs: overlap on and off, gradients as bucket views or copies, two steps", "[dist][gpu][ddp]") {
    dist::ProcessGroup& g = group();
    const Device device = g.device();
    const int world = g.world_size();
    for (const bool overlap : {true, false})
        for (const bool view : {true, false}) {
            CAPTURE(overlap, view);
            Generator init(6);
            Sequential model = make_mlp(init);
            model.to(device);
            dist::DistributedDataParallel ddp(
                model, g, {.bucket_cap_mb = 0.01, .first_bucket_cap_mb = 0.002, .overlap = overlap,
                           .gradient_as_bucket_view = view});
            Generator init0(6);
            Sequential reference = make_mlp(init0);
            reference.to(device);
            for (std::uint64_t step = 0; step < 2; ++step) {
                const Tensor x = rows(60 + step, 16 * world, device), y = labels(61 + step, 16 * world, device);
                for (Parameter& p : model.parameters()) p.zero_grad();
                for (Parameter& p : reference.parameters()) p.zero_grad();
                ComputeGraph graph;
                ddp.backward(graph, cross_entropy(model(graph.input(x.narrow(0, 16 * g.rank(), 16))),
                                                  graph.input(y.narrow(0, 16 * g.rank(), 16))));
                ComputeGraph ref;
                ref.backward(cross_entropy(reference(ref.input(x)), ref.input(y)));
                const auto params = model.parameters(), ref_params = reference.parameters();
                for (std::size_t i = 0; i < params.size(); ++i)
                    CHECK(relative(params[i].grad().to_vector(), ref_params[i].grad().to_vector()) <= 1e-5);
            }
        }
}

TEST_CASE("DDP inside a captured step: replays keep the ranks in step", "[dist][gpu][capture]") {
    dist::ProcessGroup& g = group();
    const Device device = g.device();
    Generator init(9 + static_cast<std::uint64_t>(g.rank()));
    Sequential model = make_mlp(init);
    model.to(device);
    dist::DistributedDataParallel ddp(model, g);
    SGD sgd(model.parameters(), {.lr = 0.05});
    cuda::CapturedStep step([&](std::span<const Tensor> in) {
        ComputeGraph graph;
        const Var loss = cross_entropy(model(graph.input(in[0])), graph.input(in[1]));
        ddp.backward(graph, loss);
        sgd.step();
        sgd.zero_grad();
        return loss.value();
    });
    for (int i = 0; i < 6; ++i) {
        const std::uint64_t seed = 100 + 10 * static_cast<std::uint64_t>(i) + static_cast<std::uint64_t>(g.rank());
        const Tensor x = rows(seed, 32, device), y = labels(seed + 1, 32, device);
        step.run(std::vector<Tensor>{x, y});
    }
    CHECK(step.variants() == 1);
    for (const Parameter& p : model.parameters()) check_same_on_every_rank(g, p.value());
}

// ZeRO-1/2 through NCCL's all_reduce / reduce_scatter and all_gather: the shard-local AdamW (the fused GPU kernel)
// with the global norm over the shards, against one GPU running AdamW on the concatenated batch. In float64: in
// f32, AdamW's m/√v turns rounding differences on near-zero gradient elements into full-size steps.
TEST_CASE("ZeRO-1/2 on GPUs == one GPU's AdamW on the concatenated batch", "[dist][gpu][zero]") {
    dist::ProcessGroup& g = group();
    const Device device = g.device();
    const AdamOptions options{.lr = 1e-2, .weight_decay = 0.01};
    for (int stage : {1, 2}) {
        Generator init(21 + static_cast<std::uint64_t>(g.rank()));
        Sequential model = make_mlp(init);
        model.to(DType::f64);
        model.to(device);
        dist::ZeroOptimizer zero(model, g, options, {.stage = stage});
        Generator init0(21);
        Sequential reference = make_mlp(init0);
        reference.to(DType::f64);
        reference.to(device);
        AdamW adam(reference.parameters(), options);
        for (int step = 0; step < 5; ++step)
            step_both(zero, [&](const Var& x) { return model(x); }, [&](const Var& x) { return reference(x); },
                      reference.parameters(), adam, 500 + static_cast<std::uint64_t>(step));
        const auto params = model.parameters(), ref_params = reference.parameters();
        for (std::size_t i = 0; i < params.size(); ++i) {
            CHECK(relative(params[i].value().to_vector(), ref_params[i].value().to_vector()) <= 1e-10);
            check_same_on_every_rank(g, params[i].value());
        }
        const dist::ZeroMemory m = zero.memory();
        CHECK(m.optimizer_bytes == m.formula_optimizer_bytes);
    }
}

// ZeRO-3 through NCCL's all_gather (each unit's parameters, forward and backward) and reduce_scatter (its
// gradients), one unit per layer, against one GPU's AdamW with clipping on the concatenated batch (f64, as above).
TEST_CASE("ZeRO-3 on GPUs == one GPU's AdamW on the concatenated batch", "[dist][gpu][zero][zero3]") {
    dist::ProcessGroup& g = group();
    const Device device = g.device();
    // Both ways: ZeroOptions::prefetch runs the neighbouring unit's all-gather on the communication stream.
    const bool prefetch = GENERATE(false, true);
    INFO("prefetch " << prefetch);
    const AdamOptions options{.lr = 1e-2, .weight_decay = 0.01};
    // make_mlp's layers, in its order of drawing, one unit each.
    const auto units_of = [&](Generator& gen) {
        std::vector<dist::ZeroUnit> units;
        const std::int64_t widths[] = {32, 64, 64, 10};
        for (int i = 0; i < 3; ++i) {
            Linear layer(widths[i], widths[i + 1], true, gen, i < 2 ? Activation::Relu : Activation::None);
            layer.to(DType::f64);
            layer.to(device);
            units.push_back({str("fc", i), layer, [layer](const Var& x) { return layer(x); }});
        }
        return units;
    };
    Generator init(31 + static_cast<std::uint64_t>(g.rank()));
    dist::ZeroOptimizer zero(units_of(init), g, options, {.stage = 3, .prefetch = prefetch});
    Generator init0(31);
    const auto reference_units = units_of(init0);
    std::vector<Parameter> reference_parameters;
    for (const auto& unit : reference_units)
        for (const Parameter& p : unit.module.parameters()) reference_parameters.push_back(p);
    const auto reference = [&](Var x) {
        for (const auto& unit : reference_units) x = unit.forward(x);
        return x;
    };
    AdamW adam(reference_parameters, options);
    for (int step = 0; step < 5; ++step)
        step_both(zero, [&](const Var& x) { return zero.forward(x); }, reference, reference_parameters, adam,
                  700 + static_cast<std::uint64_t>(step));
    const auto full = zero.full_parameters();
    const auto& ref_params = reference_parameters;
    REQUIRE(full.size() == ref_params.size());
    for (std::size_t i = 0; i < full.size(); ++i) {
        CHECK(relative(full[i].second.to_vector(), ref_params[i].value().to_vector()) <= 1e-10);
        check_same_on_every_rank(g, full[i].second);
    }
    const dist::ZeroMemory m = zero.memory();
    CHECK(m.parameter_bytes == m.formula_parameter_bytes);
    CHECK(m.gathered_peak_bytes == m.formula_gathered_bytes);  // with prefetch two neighbouring units at once
    if (prefetch && g.world_size() > 1) CHECK(m.formula_gathered_bytes == (2112 + 4160) * 8);
}

TEST_CASE("ZeRO: CUDA parameters on a group without NCCL are refused on every rank", "[dist][gpu][zero]") {
    dist::ProcessGroup plain = dist::ProcessGroup::from_mpi({.use_nccl = false});
    REQUIRE_FALSE(plain.has_nccl());
    Generator init(3);
    Sequential model = make_mlp(init);
    model.to(group().device());
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(model, plain), DeviceError, MessageHas({"ZeroOptimizer", "NCCL", "cuda"}));
    const Module first = model;
    std::vector<dist::ZeroUnit> units{{"mlp", first, [model](const Var& x) { return model(x); }}};
    CHECK_THROWS_MATCHES(dist::ZeroOptimizer(units, plain, {}, {.stage = 3}), DeviceError,
                         MessageHas({"ZeroOptimizer (stage 3)", "NCCL", "cuda"}));
}

// Run alone by dist_gpu2_dead_peer and dist_gpu4_dead_peer (DYNGRAD_DIST_TIMEOUT=3): rank 1 stays alive but skips
// an all-reduce. The other ranks' collective spins on their GPUs until the watchdog aborts the communicator; the
// stream then drains and the next call throws, well before the test's own limit.
TEST_CASE("NCCL: a peer that skips an all-reduce: the watchdog aborts, the next call throws", "[.dead_peer]") {
    dist::ProcessGroup& g = group();
    const double timeout = g.timeout_seconds();
    REQUIRE(timeout <= 10);
    if (g.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::duration<double>(timeout + 3));
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    Tensor t = Tensor::ones({1 << 20}, DType::f32, g.device());
    g.all_reduce(t);  // queued: it waits on the GPU for rank 1
    try {
        cuda::synchronize(g.device().index);  // returns once the abort ended the kernel
    } catch (const Error&) {
    }
    CHECK_THROWS_MATCHES(g.all_reduce(t), DistributedError, MessageHas({"aborted earlier", "not finished after"}));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(waited >= timeout);
    CHECK(waited < timeout + 20);
}

int main(int argc, char* argv[]) {
    const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
    const int ranks = size != nullptr ? std::atoi(size) : 0;
    if (ranks < 2 || cuda::device_count() < ranks) {
        std::cout << "dyngrad: needs mpirun -np N (N >= 2) and N CUDA devices (has " << cuda::device_count()
                  << " for " << ranks << " ranks): distributed GPU tests skipped" << std::endl;
        return 77;
    }
    return dgtest::run_session(argc, argv);
}
