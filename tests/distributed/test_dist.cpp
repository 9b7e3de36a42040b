// The distributed layer on the CPU through MPI (distributed/process_group.h, distributed/ddp.h). CTest runs this binary alone
// (a group of one: every collective a no-op or a copy) and under `mpirun -np 2` (dist_mpi2), where each rank
// runs every case in the same order. Inputs come from Generators seeded by rank, so every rank can rebuild
// every other rank's data and the single-process reference.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <set>

#include "catch.h"
#include "dist_support.h"
#include "dyngrad/distributed/ddp.h"
#include "dyngrad/distributed/process_group.h"
#include "dyngrad/core/half.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;
using dgtest::Rows;
using dgtest::global_batch;
using dgtest::loss_of;
using dgtest::relative;
using dgtest::shard;

namespace {

dist::ProcessGroup& group() { return dgtest::launched_group(); }

Var max_pool_2(const Var& x) { return max_pool2d(x, {2, 2}); }
Var flatten_all(const Var& x) { return flatten(x); }

Sequential make_mlp(Generator& gen, DType dtype) { return dgtest::make_mlp(gen, dtype, 5); }

// lenet (nn/models.h) on 12×12 images: conv 1→4 5×5, pool, conv 4→6 3×3 (1×1 left after the pool), linear.
Sequential make_lenet(Generator& gen, DType dtype) {
    Sequential m;
    m.add(Conv2d(1, 4, {5, 5}, {}, true, gen)).add(max_pool_2);
    m.add(Conv2d(4, 6, {3, 3}, {}, true, gen)).add(max_pool_2).add(flatten_all);
    m.add(Linear(6, 16, true, gen, Activation::Relu)).skip_index();
    m.add(Linear(16, 5, true, gen));
    m.to(dtype);
    return m;
}

std::vector<std::vector<double>> grads(const Sequential& model) {
    std::vector<std::vector<double>> out;
    for (const Parameter& p : model.parameters()) out.push_back(p.grad().to_vector());
    return out;
}

// Averaged gradient of `world` ranks == single-process gradient of the concatenated batch; in f64 also bitwise
// equal to the mean of the per-shard gradients (the order a 2-rank sum allows: (a + b) / 2).
template <typename Make>
void check_gradient_equivalence(Make make, const Shape& sample, DType dtype, double tolerance) {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    Generator init(7);
    Sequential model = make(init, dtype);
    dist::DistributedDataParallel ddp(model, g);
    const Rows all = global_batch(11, sample, 6 * world, dtype);
    {
        ComputeGraph graph;
        ddp.backward(graph, loss_of(model, graph, shard(all, g.rank(), world)));
    }
    const auto averaged = grads(model);

    Generator init_again(7);
    Sequential reference = make(init_again, dtype);
    {
        ComputeGraph graph;
        graph.backward(loss_of(reference, graph, all));
    }
    const auto want = grads(reference);
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(relative(averaged[i], want[i]) <= tolerance);

    if (dtype == DType::f64 && world == 2) {
        std::vector<std::vector<double>> per_shard(want.size());
        for (int r = 0; r < world; ++r) {
            reference.zero_grad();
            ComputeGraph graph;
            graph.backward(loss_of(reference, graph, shard(all, r, world)));
            const auto g_r = grads(reference);
            for (std::size_t i = 0; i < g_r.size(); ++i) {
                if (r == 0) per_shard[i] = g_r[i];
                else
                    for (std::size_t k = 0; k < g_r[i].size(); ++k) per_shard[i][k] = (per_shard[i][k] + g_r[i][k]) / 2;
            }
        }
        for (std::size_t i = 0; i < want.size(); ++i) CHECK(averaged[i] == per_shard[i]);
    }
}

}  // namespace

TEST_CASE("collectives: all_reduce, broadcast, all_gather, reduce_scatter, barrier", "[dist][collectives]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size(), rank = g.rank();
    for (DType dtype : {DType::f32, DType::f64}) {
        std::vector<Tensor> each;
        for (int r = 0; r < world; ++r) {
            Generator gen(100 + r);
            each.push_back(Tensor::uniform({2 * world, 3}, -1, 1, gen, dtype));
        }
        std::vector<double> sum(each[0].to_vector().size(), 0.0);
        for (const Tensor& t : each) {
            const auto v = t.to_vector();
            for (std::size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
        }
        const double tol = dtype == DType::f32 ? 1e-6 : 1e-14;

        Tensor t = each[static_cast<std::size_t>(rank)].clone();
        g.all_reduce(t, dist::ReduceOp::Sum);
        for (std::size_t i = 0; i < sum.size(); ++i) CHECK(std::abs(t.to_vector()[i] - sum[i]) <= tol * 4);
        Tensor m = each[static_cast<std::size_t>(rank)].clone();
        g.all_reduce(m, dist::ReduceOp::Avg);
        for (std::size_t i = 0; i < sum.size(); ++i) CHECK(std::abs(m.to_vector()[i] - sum[i] / world) <= tol * 4);

        Tensor b = each[static_cast<std::size_t>(rank)].clone();
        g.broadcast(b, world - 1);
        CHECK(b.to_vector() == each[static_cast<std::size_t>(world - 1)].to_vector());

        const Tensor gathered = g.all_gather(each[static_cast<std::size_t>(rank)]);
        REQUIRE(gathered.shape() == Shape{world, 2 * world, 3});
        for (int r = 0; r < world; ++r) CHECK(gathered.select(0, r).to_vector() == each[static_cast<std::size_t>(r)].to_vector());
        // In place: the input is this rank's block of the output (ZeroOptimizer gathers its parameters so).
        Tensor blocks = Tensor::full({world, 2 * world, 3}, -7.0, dtype);
        const Tensor& own = each[static_cast<std::size_t>(rank)];
        Tensor mine = Tensor::from_external(static_cast<char*>(blocks.raw_data()) + static_cast<std::size_t>(rank) * own.nbytes(),
                                            own.shape(), dtype, Device::cpu(), [keep = blocks] {});
        mine.copy_from(own);
        g.all_gather(mine, blocks);
        for (int r = 0; r < world; ++r) CHECK(blocks.select(0, r).to_vector() == each[static_cast<std::size_t>(r)].to_vector());

        const Tensor scattered = g.reduce_scatter(each[static_cast<std::size_t>(rank)], dist::ReduceOp::Sum);
        REQUIRE(scattered.shape() == Shape{2, 3});
        const auto sv = scattered.to_vector();
        for (std::size_t i = 0; i < sv.size(); ++i) CHECK(std::abs(sv[i] - sum[static_cast<std::size_t>(rank) * 6 + i]) <= tol * 4);
    }
    // bf16 and f16: small integers, exact in both and in their sums, so Sum, the gathers and the broadcast are exact;
    // Avg within one 16-bit rounding of the exact mean (2^-8 relative for bf16).
    for (DType dtype : {DType::bf16, DType::f16}) {
        INFO(dtype_name(dtype));
        std::vector<std::vector<double>> values;
        for (int r = 0; r < world; ++r) {
            std::vector<double> v;
            for (int i = 0; i < 6 * world; ++i) v.push_back(static_cast<double>((i * 7 + r * 5) % 17 - 8));
            values.push_back(v);
        }
        const auto of = [&](int r) { return Tensor::from_vector(values[static_cast<std::size_t>(r)], {2 * world, 3}, dtype); };
        std::vector<double> sum(values[0].size(), 0.0);
        for (const auto& v : values)
            for (std::size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
        Tensor t = of(rank);
        g.all_reduce(t, dist::ReduceOp::Sum);
        CHECK(t.dtype() == dtype);
        CHECK(t.to_vector() == sum);
        Tensor m = of(rank);
        g.all_reduce(m, dist::ReduceOp::Avg);
        const auto mv = m.to_vector();
        for (std::size_t i = 0; i < sum.size(); ++i) CHECK(std::abs(mv[i] - sum[i] / world) <= std::abs(sum[i] / world) / 256);
        Tensor b = of(rank);
        g.broadcast(b, world - 1);
        CHECK(b.to_vector() == values[static_cast<std::size_t>(world - 1)]);
        const Tensor gathered = g.all_gather(of(rank));
        for (int r = 0; r < world; ++r) CHECK(gathered.select(0, r).to_vector() == values[static_cast<std::size_t>(r)]);
        const auto scattered = g.reduce_scatter(of(rank), dist::ReduceOp::Sum).to_vector();
        for (std::size_t i = 0; i < scattered.size(); ++i) CHECK(scattered[i] == sum[static_cast<std::size_t>(rank) * 6 + i]);
    }
    Tensor counts = Tensor::full({1}, g.rank() + 1, DType::i64);
    g.all_reduce(counts);
    CHECK(counts.item() == world * (world + 1) / 2);
    g.barrier();
}

TEST_CASE("DDP: averaged gradient == single-process gradient of the concatenated batch (MLP)", "[dist][ddp]") {
    check_gradient_equivalence(make_mlp, {12}, DType::f32, 1e-6);
    check_gradient_equivalence(make_mlp, {12}, DType::f64, 1e-12);
}

TEST_CASE("DDP: averaged gradient == single-process gradient of the concatenated batch (lenet)", "[dist][ddp]") {
    check_gradient_equivalence(make_lenet, {1, 12, 12}, DType::f32, 1e-6);
    check_gradient_equivalence(make_lenet, {1, 12, 12}, DType::f64, 1e-12);
}

TEST_CASE("DDP: parameters after 20 steps agree across ranks and with single-process training", "[dist][ddp]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    for (const bool views : {false, true}) {
        INFO("gradient_as_bucket_view " << views);
        Generator init(3 + static_cast<std::uint64_t>(g.rank()));  // different on every rank: the broadcast fixes it
        Sequential model = make_mlp(init, DType::f32);
        dist::DistributedDataParallel ddp(model, g, {.gradient_as_bucket_view = views});
        SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
        Generator init0(3);
        Sequential reference = make_mlp(init0, DType::f32);
        SGD sgd_ref(reference.parameters(), {.lr = 0.1, .momentum = 0.9});
        const auto params = model.parameters();
        Tensor held;  // step 0's first gradient, kept past the next synchronised backward
        std::vector<double> held_then;
        for (int step = 0; step < 20; ++step) {
            const Rows all = global_batch(1000 + step, {12}, 4 * world, DType::f32);
            ComputeGraph graph;
            ddp.backward(graph, loss_of(model, graph, shard(all, g.rank(), world)));
            if (step == 0) {
                held = params[0].grad();
                held_then = held.to_vector();
            }
            if (step == 1)  // a view is rewritten by the next backward (as PyTorch's); a copy is the holder's
                CHECK((held.to_vector() == held_then) == !views);
            sgd.step();
            sgd.zero_grad();
            ComputeGraph ref_graph;
            ref_graph.backward(loss_of(reference, ref_graph, all));
            sgd_ref.step();
            sgd_ref.zero_grad();
        }
        const auto ref_params = reference.parameters();
        for (std::size_t i = 0; i < params.size(); ++i) {
            // Bitwise the same on every rank: every rank applied the same averaged gradients.
            const Tensor all = g.all_gather(params[i].value());
            for (int r = 1; r < world; ++r) CHECK(all.select(0, r).to_vector() == all.select(0, 0).to_vector());
            CHECK(relative(params[i].value().to_vector(), ref_params[i].value().to_vector()) <= 1e-5);
        }
    }
}

// DDPOptions::compression: the bucket averaged in 16 bits. On the CPU each rank's gradient is divided by W in
// float32, rounded to the 16-bit dtype, and MPI sums the ranks' values pairwise in float rounded back; for 2 ranks
// that is exactly round16(float(round16(g0 / 2)) + float(round16(g1 / 2))), which the test computes from each
// shard's own gradient. Every rank ends with the same bits; every gradient is a 16-bit value; a group of one does
// not communicate, so nothing is rounded.
TEST_CASE("DDP: bf16 and f16 gradient compression averages in 16 bits", "[dist][ddp][compression]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::uint64_t seed = dgtest::shared_seed(g);
    for (const DType wire : {DType::bf16, DType::f16}) {
        INFO(dtype_name(wire) << ", seed " << seed);
        const HalfFormat format = half_format(wire);
        const auto round16 = [&](double v) { return half_bits_to_double(round_to_half_bits(v, format), format); };
        Generator init(seed);
        Sequential model = make_lenet(init, DType::f32);
        dist::DistributedDataParallel ddp(model, g, {.compression = wire});
        const Rows all = global_batch(seed + 1, {1, 12, 12}, 4 * world, DType::f32);
        {
            ComputeGraph graph;
            ddp.backward(graph, loss_of(model, graph, shard(all, g.rank(), world)));
        }
        const auto got = grads(model);
        // Each rank's own gradient, from a copy of the model on this process.
        Generator init_again(seed);
        Sequential reference = make_lenet(init_again, DType::f32);
        std::vector<std::vector<std::vector<double>>> per_rank;
        for (int r = 0; r < world; ++r) {
            reference.zero_grad();
            ComputeGraph graph;
            graph.backward(loss_of(reference, graph, shard(all, r, world)));
            per_rank.push_back(grads(reference));
        }
        for (std::size_t i = 0; i < got.size(); ++i) {
            INFO("parameter " << i);
            std::vector<double> exact(got[i].size(), 0.0), emulated(got[i].size(), 0.0);
            for (std::size_t k = 0; k < got[i].size(); ++k) {
                for (int r = 0; r < world; ++r) exact[k] += per_rank[static_cast<std::size_t>(r)][i][k] / world;
                if (world == 2) {
                    const auto part = [&](int r) {
                        return static_cast<float>(round16(static_cast<float>(per_rank[static_cast<std::size_t>(r)][i][k]) / 2.0f));
                    };
                    emulated[k] = round16(part(0) + part(1));
                }
            }
            bool representable = true;
            for (double v : got[i]) representable = representable && round16(v) == v;
            if (world == 1) {
                CHECK(got[i] == per_rank[0][i]);  // nothing sent, nothing rounded
                continue;
            }
            CHECK(representable);
            if (world == 2) CHECK(got[i] == emulated);
            // Against the exact mean: two 16-bit roundings per element (bf16 2^-8, f16 2^-11 relative each).
            CHECK(relative(got[i], exact) <= (wire == DType::bf16 ? 2e-2 : 3e-3));
            const Tensor gathered = g.all_gather(model.parameters()[i].grad());
            for (int r = 1; r < world; ++r) CHECK(gathered.select(0, r).to_vector() == gathered.select(0, 0).to_vector());
        }
    }
    // Switched after construction (Python's register_comm_hook): on, the gradients are bf16 values; off again, not.
    {
        Generator init(seed);
        Sequential model = make_lenet(init, DType::f32);
        dist::DistributedDataParallel ddp(model, g);
        const Rows all = global_batch(seed + 2, {1, 12, 12}, 4 * world, DType::f32);
        const auto all_bf16 = [&] {
            model.zero_grad();
            ComputeGraph graph;
            ddp.backward(graph, loss_of(model, graph, shard(all, g.rank(), world)));
            bool representable = true;
            for (const auto& v : grads(model))
                for (double x : v)
                    representable = representable &&
                                    half_bits_to_double(round_to_half_bits(x, kBFloat16Format), kBFloat16Format) == x;
            return representable;
        };
        ddp.set_compression(DType::bf16);
        CHECK(all_bf16() == (world > 1));
        ddp.set_compression(std::nullopt);
        if (world > 1) CHECK_FALSE(all_bf16());
    }
    // check_gradients with compression: the default tolerance is the 16-bit one (the f32 one would refuse every step).
    {
        Generator init(seed + 3);
        Sequential model = make_mlp(init, DType::f32);
        dist::DistributedDataParallel ddp(model, g, {.compression = DType::bf16, .check_gradients = true});
        const Rows all = global_batch(seed + 4, {12}, 4 * world, DType::f32);
        const Rows mine = shard(all, g.rank(), world);
        const auto loss_fn = [&](ComputeGraph& graph, std::span<const Tensor> batch) {
            return cross_entropy(model(graph.input(batch[0])), graph.input(batch[1]));
        };
        const std::vector<Tensor> batch{mine.x, mine.y};
        CHECK_NOTHROW(ddp.forward_backward(batch, loss_fn));
        CHECK(ddp.check_gradients(batch, loss_fn).worst_relative_error <= 2e-2);
    }
    // Bad options: a compression dtype that is not 16-bit; a float64 model (compression is for float32 gradients).
    Generator init(1);
    Sequential f32_model = make_mlp(init, DType::f32);
    CHECK_THROWS_MATCHES(dist::DistributedDataParallel(f32_model, g, {.compression = DType::f32}), ValueError,
                         MessageHas({"not a 16-bit dtype"}));
    Generator init64(1);
    Sequential f64_model = make_mlp(init64, DType::f64);
    CHECK_THROWS_MATCHES(dist::DistributedDataParallel(f64_model, g, {.compression = DType::bf16}), DTypeError,
                         MessageHas({"is for float32 gradients", "float64"}));
    dist::DistributedDataParallel f64_ddp(f64_model, g);
    CHECK_THROWS_AS(f64_ddp.set_compression(DType::f16), DTypeError);
}

TEST_CASE("DDP: buckets, readiness order and launches during the backward", "[dist][ddp][buckets]") {
    dist::ProcessGroup& g = group();
    Generator init(5);
    Sequential model = make_mlp(init, DType::f32);
    // Caps of a few hundred bytes: several buckets (fc3 is 16·5 + 5 floats = 340 bytes; fc2 = 2112 bytes).
    dist::DistributedDataParallel ddp(model, g, {.bucket_cap_mb = 2500.0 / 1048576, .first_bucket_cap_mb = 400.0 / 1048576});
    const auto buckets = ddp.buckets();
    REQUIRE(buckets.size() >= 3);
    CHECK(buckets[0] == std::vector<std::string>{"4.bias", "4.weight"});  // reverse registration order, first small
    const Rows all = global_batch(21, {12}, 4 * g.world_size(), DType::f32);
    ComputeGraph graph;
    ddp.backward(graph, loss_of(model, graph, shard(all, g.rank(), g.world_size())));
    const dist::DDPStats& s = ddp.stats();
    // The engine finished the parameters last layer first; every bucket launched before the backward returned.
    CHECK(s.ready_order == std::vector<std::string>{"4.bias", "4.weight", "2.bias", "2.weight", "0.bias", "0.weight"});
    CHECK(s.buckets_launched_during_backward == static_cast<std::int64_t>(buckets.size()));
    CHECK(s.buckets_launched_after_backward == 0);
    std::vector<std::size_t> in_order(buckets.size());
    std::iota(in_order.begin(), in_order.end(), std::size_t{0});
    CHECK(s.launch_order == in_order);
    CHECK(s.unused_parameters == 0);

    // Without overlap: the same buckets, all launched after the backward, the same gradients.
    const auto overlapped = grads(model);
    Generator init2(5);
    Sequential plain_model = make_mlp(init2, DType::f32);
    dist::DistributedDataParallel plain(plain_model, g, {.bucket_cap_mb = 2500.0 / 1048576,
                                                         .first_bucket_cap_mb = 400.0 / 1048576, .overlap = false});
    ComputeGraph graph2;
    plain.backward(graph2, loss_of(plain_model, graph2, shard(all, g.rank(), g.world_size())));
    CHECK(plain.stats().buckets_launched_during_backward == 0);
    CHECK(plain.stats().buckets_launched_after_backward == static_cast<std::int64_t>(buckets.size()));
    CHECK(grads(plain_model) == overlapped);
}

TEST_CASE("DDP: a parameter unused on some ranks contributes zeros", "[dist][ddp][unused]") {
    dist::ProcessGroup& g = group();
    Generator init(8);
    Linear used(6, 3, true, init), side(6, 3, true, init);
    Sequential model;
    model.add(used).add(side);  // a container whose forward we write ourselves
    dist::DistributedDataParallel ddp(model, g);
    Generator data(9 + static_cast<std::uint64_t>(g.rank()));
    const Tensor x = Tensor::uniform({4, 6}, -1, 1, data);
    ComputeGraph graph;
    Var y = used(graph.input(x));
    if (g.rank() == 0) y = y + side(graph.input(x));  // only rank 0 uses `side`
    ddp.backward(graph, sum(y * y));
    CHECK(ddp.stats().unused_parameters == (g.rank() == 0 ? 0 : 2));
    // Rank 0's gradient of `side`, divided by the world size, on every rank.
    Generator data0(9);
    const Tensor x0 = Tensor::uniform({4, 6}, -1, 1, data0);
    Generator init0(8);
    Linear u0(6, 3, true, init0), s0(6, 3, true, init0);
    ComputeGraph ref;
    const Var y0 = u0(ref.input(x0)) + s0(ref.input(x0));
    ref.backward(sum(y0 * y0));
    const auto want = s0.parameters()[0].grad().to_vector();
    const auto got = side.parameters()[0].grad().to_vector();
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got[i] - want[i] / g.world_size()) <= 1e-6);
}

TEST_CASE("DDP: no_sync accumulates locally, the next backward averages the sum", "[dist][ddp][no_sync]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    Generator init(12);
    Sequential model = make_mlp(init, DType::f64);
    dist::DistributedDataParallel ddp(model, g);
    const Rows first = global_batch(31, {12}, 4 * world, DType::f64), second = global_batch(32, {12}, 4 * world, DType::f64);
    {
        auto guard = ddp.no_sync();
        ComputeGraph graph;
        ddp.backward(graph, loss_of(model, graph, shard(first, g.rank(), world)));
        CHECK(ddp.stats().synchronised_calls == 0);
    }
    ComputeGraph graph;
    ddp.backward(graph, loss_of(model, graph, shard(second, g.rank(), world)));
    CHECK(ddp.stats().synchronised_calls == 1);
    CHECK(ddp.stats().backward_calls == 2);
    Generator init0(12);
    Sequential reference = make_mlp(init0, DType::f64);
    for (const Rows* b : {&first, &second}) {
        ComputeGraph ref;
        ref.backward(loss_of(reference, ref, *b));
    }
    const auto want = grads(reference), got = grads(model);
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(relative(got[i], want[i]) <= 1e-12);
}

TEST_CASE("DDP: check_gradients mode passes for a correct step and names a corrupted parameter", "[dist][ddp][check]") {
    dist::ProcessGroup& g = group();
    Generator init(14);
    Sequential model = make_mlp(init, DType::f64);
    dist::DistributedDataParallel ddp(model, g, {.check_gradients = true});
    const Rows all = global_batch(41, {12}, 4 * g.world_size(), DType::f64);
    const Rows mine = shard(all, g.rank(), g.world_size());
    const auto loss_fn = [&](ComputeGraph& graph, std::span<const Tensor> batch) {
        return cross_entropy(model(graph.input(batch[0])), graph.input(batch[1]));
    };
    const std::vector<Tensor> batch{mine.x, mine.y};
    ddp.forward_backward(batch, loss_fn);  // checks, and would throw
    const auto result = ddp.check_gradients(batch, loss_fn);
    CHECK(result.worst_relative_error <= 1e-10);
    // Corrupt one gradient: the check names it (on every rank, each checks its own).
    Tensor& g0 = model.parameters()[2].grad_slot();
    g0 = g0.clone();
    g0.set({0, 0}, g0.at({0, 0}) + 1.0);
    CHECK_THROWS_MATCHES(ddp.check_gradients(batch, loss_fn), NumericalError, MessageHas({"'2.weight'", "global batch"}));
}

TEST_CASE("DataLoader shards: disjoint, complete, equal step counts", "[dist][data]") {
    dist::ProcessGroup& g = group();
    const int world = g.world_size();
    const std::int64_t n = 37;
    auto data = std::make_shared<TensorDataset>(std::vector<Tensor>{Tensor::arange(0, n, 1, DType::i64)});
    for (bool even : {false, true}) {
        DataLoader loader(data, {.batch_size = 4, .shuffle = true, .seed = 5, .num_shards = world, .shard = g.rank(), .even_shards = even,
                                 .prefetch = 0});
        std::vector<std::int64_t> mine;
        std::vector<Tensor> b;
        while (loader.next(b))
            for (double v : b[0].to_vector()) mine.push_back(static_cast<std::int64_t>(v));
        Tensor count = Tensor::full({1}, static_cast<double>(mine.size()), DType::i64);
        const Tensor counts = g.all_gather(count);
        const std::vector<double> count_of = counts.to_vector();
        const auto most = static_cast<std::int64_t>(*std::max_element(count_of.begin(), count_of.end()));
        std::vector<double> padded(static_cast<std::size_t>(most), -1);
        for (std::size_t i = 0; i < mine.size(); ++i) padded[i] = static_cast<double>(mine[i]);
        const Tensor every = g.all_gather(Tensor::from_vector(padded, {most}, DType::i64));
        std::multiset<std::int64_t> seen;
        for (double v : every.to_vector())
            if (v >= 0) seen.insert(static_cast<std::int64_t>(v));
        CHECK(std::set<std::int64_t>(seen.begin(), seen.end()).size() == seen.size());  // disjoint
        if (even) {
            CHECK(static_cast<std::int64_t>(seen.size()) == n / world * world);  // every rank n / world samples
            for (double c : count_of) CHECK(c == static_cast<double>(n / world));
        } else {
            CHECK(static_cast<std::int64_t>(seen.size()) == n);  // complete
        }
    }
}

TEST_CASE("DDP: ranks with different models fail typed on every rank", "[dist][ddp][mismatch]") {
    dist::ProcessGroup& g = group();
    if (g.world_size() < 2) DG_SKIP("needs 2 ranks (mpirun -np 2)");
    Generator init(1);
    Sequential shapes;
    shapes.add(Linear(4, g.rank() == 0 ? 3 : 5, true, init));
    CHECK_THROWS_MATCHES(dist::DistributedDataParallel(shapes, g), ShapeError,
                         MessageHas({"differs across ranks", "'0.weight'", "(3,4)", "(5,4)", "rank 1"}));
    Sequential models;
    models.add(Linear(4, 3, true, init));
    if (g.rank() == 1) models.add(Linear(3, 2, true, init));
    CHECK_THROWS_MATCHES(dist::DistributedDataParallel(models, g), ValueError,
                         MessageHas({"differs across ranks", "'1.weight'", "(no such entry)"}));
    Sequential dtypes;
    dtypes.add(Linear(4, 3, true, init));
    dtypes.to(g.rank() == 0 ? DType::f32 : DType::f64);
    CHECK_THROWS_MATCHES(dist::DistributedDataParallel(dtypes, g), DTypeError, MessageHas({"differs across ranks", "float32", "float64"}));
    // The group is still usable afterwards.
    Tensor t = Tensor::ones({2});
    g.all_reduce(t);
    CHECK(t.to_vector() == std::vector<double>{2, 2});
}

// Run alone by dist_dead_peer (DYNGRAD_DIST_TIMEOUT=3): rank 1 leaves without joining the collective.
TEST_CASE("a peer that never joins: a typed timeout, no hang", "[.dead_peer]") {
    dist::ProcessGroup& g = group();
    if (g.world_size() < 2) DG_SKIP("needs 2 ranks (mpirun -np 2)");
    if (g.rank() == 1) return;  // exits (finalizes MPI) without calling all_reduce
    Tensor t = Tensor::ones({16});
    CHECK_THROWS_MATCHES(g.all_reduce(t), DistributedError, MessageHas({"all_reduce", "timed out", "rank 0/2"}));
}
