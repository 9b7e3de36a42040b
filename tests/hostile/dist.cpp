// Hostile inputs to the distributed layer (distributed/): collectives, the launch environment, the rendezvous,
// DistributedDataParallel, ZeroOptimizer and the sharded loaders, all on a group of one process (no mpirun needed).
#include <cstring>
#include <limits>
#include <map>
#include <string>

#include "dyngrad/distributed/ddp.h"
#include "dyngrad/distributed/process_group.h"
#include "dyngrad/distributed/rendezvous.h"
#include "dyngrad/distributed/zero.h"
#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;
using hostile::expect;

namespace {

dist::ProcessGroup one() { return dist::ProcessGroup::single({.timeout_seconds = 5}); }

// parse_launch_environment over a fixed set of variables.
std::map<std::string, std::string>& fake_env() {
    static std::map<std::string, std::string> env;
    return env;
}
const char* fake_getenv(const char* name) {
    const auto it = fake_env().find(name);
    return it == fake_env().end() ? nullptr : it->second.c_str();
}
void parse(std::map<std::string, std::string> env) {
    fake_env() = std::move(env);
    dist::parse_launch_environment(fake_getenv);
}

Tensor f32(Shape shape) {
    Generator gen(3);
    return Tensor::uniform(shape, -1, 1, gen);
}

Sequential tiny_model() {
    Generator gen(4);
    Sequential m;
    m.add(Linear(3, 2, true, gen));
    return m;
}

}  // namespace

static const bool added = hostile::add("dist", {
    // ---- collectives on a group of one ----
    expect<ValueError>("all_reduce of an undefined tensor", {"all_reduce", "undefined"}, [] {
        Tensor t;
        one().all_reduce(t);
    }),
    expect<DTypeError>("all_reduce(avg) of i64", {"all_reduce(avg)", "int64", "cannot be reduced"}, [] {
        Tensor t = Tensor::zeros({3}, DType::i64);
        one().all_reduce(t, dist::ReduceOp::Avg);
    }),
    expect<ValueError>("broadcast of an undefined tensor", {"broadcast", "undefined"}, [] {
        Tensor t;
        one().broadcast(t, 0);
    }),
    expect<IndexError>("broadcast from root 1 in a group of one", {"broadcast", "root 1", "group of 1"}, [] {
        Tensor t = f32({2});
        one().broadcast(t, 1);
    }),
    expect<IndexError>("broadcast from a negative root", {"broadcast", "root -1"}, [] {
        Tensor t = f32({2});
        one().broadcast(t, -1);
    }),
    expect<ShapeError>("all_gather into an output of the wrong shape", {"all_gather", "(2,3)", "expected (1,3)"}, [] {
        Tensor out = Tensor::empty({2, 3});
        one().all_gather(f32({3}), out);
    }),
    expect<DTypeError>("all_gather into an output of another dtype", {"all_gather", "float32", "float64"}, [] {
        Tensor out = Tensor::empty({1, 3}, DType::f64);
        one().all_gather(f32({3}), out);
    }),
    expect<ValueError>("all_gather into an undefined output", {"all_gather", "output", "undefined"}, [] {
        Tensor out;
        one().all_gather(f32({3}), out);
    }),
    expect<ValueError>("all_gather of an undefined input", {"all_gather", "input", "undefined"}, [] {
        one().all_gather(Tensor());
    }),
    expect<ValueError>("all_gather with input and output sharing storage", {"all_gather", "share storage"}, [] {
        Tensor in = f32({1, 3});
        Tensor out = in.reshaped({1, 1, 3});
        one().all_gather(in.reshaped({1, 3}), out);
    }),
    expect<ShapeError>("reduce_scatter of a 0-d tensor", {"reduce_scatter", "multiple of the world size"}, [] {
        one().reduce_scatter(Tensor::full({}, 1.0));
    }),
    expect<ShapeError>("reduce_scatter into an output of the wrong shape", {"reduce_scatter", "(4,2)", "expected (4,3)"}, [] {
        Tensor out = Tensor::empty({4, 2});
        one().reduce_scatter(f32({4, 3}), out);
    }),
    expect<DTypeError>("reduce_scatter(avg) of i64", {"reduce_scatter(avg)", "int64"}, [] {
        one().reduce_scatter(Tensor::zeros({2}, DType::i64), dist::ReduceOp::Avg);
    }),
    // ---- options and the launch environment ----
    expect<ValueError>("negative timeout", {"timeout", "-1"}, [] { dist::ProcessGroup::single({.timeout_seconds = -1}); }),
    expect<ValueError>("infinite timeout", {"timeout", "inf"}, [] {
        dist::ProcessGroup::single({.timeout_seconds = 1.0 / 0.0});
    }),
    expect<DeviceError>("a device index the machine lacks", {"cuda:64", "requested"}, [] {
        dist::ProcessGroup::single({.device = 64});
    }),
    expect<ValueError>("torchrun RANK not a number", {"RANK", "'one'"}, [] {
        parse({{"RANK", "one"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}});
    }),
    expect<ValueError>("torchrun RANK >= WORLD_SIZE", {"RANK", "'2'", "0..1"}, [] {
        parse({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}});
    }),
    expect<ValueError>("torchrun WORLD_SIZE 0", {"WORLD_SIZE", "'0'"}, [] {
        parse({{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}});
    }),
    expect<ValueError>("torchrun without MASTER_ADDR", {"MASTER_ADDR"}, [] {
        parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
    }),
    expect<ValueError>("torchrun MASTER_PORT out of range", {"MASTER_PORT", "'70000'"}, [] {
        parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}});
    }),
    expect<ValueError>("torchrun LOCAL_RANK negative", {"LOCAL_RANK", "'-1'"}, [] {
        parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    }),
    expect<ValueError>("DYNGRAD_RENDEZVOUS_PORT not a number", {"DYNGRAD_RENDEZVOUS_PORT"}, [] {
        parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"DYNGRAD_RENDEZVOUS_PORT", "x"}});
    }),
    expect<ValueError>("mpirun OMPI_COMM_WORLD_RANK beyond the size", {"OMPI_COMM_WORLD_RANK", "'5'"}, [] {
        parse({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "5"}});
    }),
    // ---- the rendezvous ----
    expect<ValueError>("rendezvous rank outside the world", {"rendezvous", "rank 3", "world size 2"}, [] {
        dist::rendezvous_exchange("127.0.0.1", 29500, 3, 2, {}, 1);
    }),
    expect<ValueError>("rendezvous port 0", {"rendezvous", "port 0"}, [] {
        dist::rendezvous_exchange("127.0.0.1", 0, 0, 2, {}, 1);
    }),
    expect<ValueError>("rendezvous timeout 0", {"rendezvous", "timeout 0"}, [] {
        dist::rendezvous_exchange("127.0.0.1", 29500, 0, 2, {}, 0);
    }),
    expect<DistributedError>("rendezvous: rank 1 of 2 never arrives", {"rendezvous (rank 0/2)", "timed out", "rank(s) 1"},
                             [] { dist::rendezvous_exchange("127.0.0.1", 29517, 0, 2, {'i', 'd'}, 0.3); }),
    expect<DistributedError>("rendezvous: rank 0 never listens", {"rendezvous (rank 1/2)", "timed out", "127.0.0.1:29518"},
                             [] { dist::rendezvous_exchange("127.0.0.1", 29518, 1, 2, {}, 0.3); }),
    expect<DistributedError>("rendezvous: MASTER_ADDR that does not resolve", {"rendezvous", "cannot resolve", "no-such-host.invalid"},
                             [] { dist::rendezvous_exchange("no-such-host.invalid", 29519, 1, 2, {}, 0.3); }),
    // ---- DistributedDataParallel ----
    expect<ValueError>("DDP over a model without parameters", {"DistributedDataParallel", "no trainable parameters"}, [] {
        dist::DistributedDataParallel ddp(Sequential(), one());
    }),
    expect<ValueError>("DDP over a model whose parameters are all frozen", {"no trainable parameters"}, [] {
        Sequential m = tiny_model();
        for (Parameter p : m.parameters()) p.set_requires_grad(false);
        dist::DistributedDataParallel ddp(m, one());
    }),
    expect<ValueError>("DDP bucket cap 0", {"bucket caps", "positive"}, [] {
        dist::DistributedDataParallel ddp(tiny_model(), one(), {.bucket_cap_mb = 0});
    }),
    expect<ValueError>("DDP negative first bucket cap", {"bucket caps", "-1"}, [] {
        dist::DistributedDataParallel ddp(tiny_model(), one(), {.first_bucket_cap_mb = -1});
    }),
    expect<ValueError>("DDP NaN bucket cap", {"bucket caps"}, [] {
        dist::DistributedDataParallel ddp(tiny_model(), one(), {.bucket_cap_mb = std::nan("")});
    }),
    expect<ValueError>("DDP negative check tolerance", {"check_tolerance", "-0.5"}, [] {
        dist::DistributedDataParallel ddp(tiny_model(), one(), {.check_tolerance = -0.5});
    }),
    expect<GraphError>("DDP backward of a loss that needs no gradient", {"backward", "does not require grad"}, [] {
        Sequential m = tiny_model();
        dist::DistributedDataParallel ddp(m, one());
        ComputeGraph graph;
        ddp.backward(graph, sum(graph.input(f32({2, 3}))));
    }),
    expect<GraphError>("DDP backward of a non-scalar loss", {"backward", "non-scalar"}, [] {
        Sequential m = tiny_model();
        dist::DistributedDataParallel ddp(m, one());
        ComputeGraph graph;
        ddp.backward(graph, m(graph.input(f32({2, 3}))));
    }),
    expect<ShapeError>("DDP check_gradients with a 0-d batch tensor", {"check_gradients", "0-d"}, [] {
        Sequential m = tiny_model();
        dist::DistributedDataParallel ddp(m, one());
        const auto loss = [&](ComputeGraph& g, std::span<const Tensor> b) { return sum(m(g.input(b[0]))); };
        ddp.forward_backward(std::vector<Tensor>{f32({2, 3})}, loss);
        ddp.check_gradients(std::vector<Tensor>{Tensor::full({}, 1.0)}, loss);
    }),
    // Calls out of order (issue 35).
    expect<ValueError>("DDP check_gradients before any backward", {"check_gradients", "no backward yet"}, [] {
        Sequential m = tiny_model();
        dist::DistributedDataParallel ddp(m, one());
        ddp.check_gradients(std::vector<Tensor>{f32({2, 3})},
                            [&](ComputeGraph& g, std::span<const Tensor> b) { return sum(m(g.input(b[0]))); });
    }),
    expect<ValueError>("DDP check_gradients after a backward inside no_sync()", {"check_gradients", "no_sync()"}, [] {
        Sequential m = tiny_model();
        dist::DistributedDataParallel ddp(m, one());
        const auto loss = [&](ComputeGraph& g, std::span<const Tensor> b) { return sum(m(g.input(b[0]))); };
        ddp.forward_backward(std::vector<Tensor>{f32({2, 3})}, loss);
        {
            auto guard = ddp.no_sync();
            ddp.forward_backward(std::vector<Tensor>{f32({2, 3})}, loss);
        }
        ddp.check_gradients(std::vector<Tensor>{f32({2, 3})}, loss);
    }),
    expect<ValueError>("DDP backward from its own readiness callback", {"DistributedDataParallel::backward", "own backward"}, [] {
        Sequential m = tiny_model(), other = tiny_model();
        dist::DistributedDataParallel ddp(m, one());
        ComputeGraph graph, inner;
        const Var inner_loss = sum(other(inner.input(f32({2, 3}))));  // another model's: the graph allows it
        BackwardOptions options;
        options.on_parameter_ready = [&](const Parameter&) { ddp.backward(inner, inner_loss); };
        ddp.backward(graph, sum(m(graph.input(f32({2, 3})))), options);
    }),
    expect<ValueError>("an exception from the user's readiness callback reaches the caller", {"user hook says no"}, [] {
        Sequential m = tiny_model();
        dist::DistributedDataParallel ddp(m, one());
        ComputeGraph graph;
        BackwardOptions options;
        options.on_parameter_ready = [](const Parameter&) { throw ValueError("user hook says no"); };
        ddp.backward(graph, sum(m(graph.input(f32({2, 3})))), options);
    }),
    // ---- ZeroOptimizer (distributed/zero.h) ----
    expect<ValueError>("ZeroOptimizer stage 0", {"ZeroOptimizer", "stage 0"}, [] {
        dist::ZeroOptimizer zero(tiny_model(), one(), {}, {.stage = 0});
    }),
    expect<ValueError>("ZeroOptimizer stage 3 over a Module (it takes units)", {"ZeroOptimizer", "stage 3", "units"}, [] {
        dist::ZeroOptimizer zero(tiny_model(), one(), {}, {.stage = 3});
    }),
    expect<ValueError>("ZeroOptimizer stage 3 with a unit without forward", {"ZeroOptimizer", "no forward"}, [] {
        dist::ZeroOptimizer zero(std::vector<dist::ZeroUnit>{{"body", tiny_model(), {}}}, one());
    }),
    expect<ValueError>("ZeroOptimizer over a frozen model", {"ZeroOptimizer", "no trainable parameters"}, [] {
        Sequential m = tiny_model();
        for (Parameter p : m.parameters()) p.set_requires_grad(false);
        dist::ZeroOptimizer zero(m, one());
    }),
    expect<ValueError>("ZeroOptimizer step before any backward", {"ZeroOptimizer::step", "no reduce_gradients"}, [] {
        dist::ZeroOptimizer zero(tiny_model(), one());
        zero.step();
    }),
    expect<ValueError>("ZeroOptimizer clip with the infinity norm", {"clip_grad_norm", "norm_type", "inf"}, [] {
        Sequential m = tiny_model();
        dist::ZeroOptimizer zero(m, one());
        ComputeGraph graph;
        zero.backward(graph, sum(m(graph.input(f32({2, 3})))));
        zero.clip_grad_norm(1.0, std::numeric_limits<double>::infinity());
    }),
    expect<ValueError>("ZeroOptimizer with a parameter frozen after wrapping", {"after wrapping", "now ["}, [] {
        Sequential m = tiny_model();
        dist::ZeroOptimizer zero(m, one());
        m.parameters().front().set_requires_grad(false);
        zero.reduce_gradients();
    }),
    expect<IoError>("ZeroOptimizer checkpoint from a folder that does not exist", {"load_checkpoint", "does not exist"}, [] {
        dist::ZeroOptimizer zero(tiny_model(), one());
        zero.load_checkpoint("/nonexistent-dyngrad-zero-checkpoint");
    }),
    // ---- sharded loaders ----
    expect<ValueError>("BatchLoader shard equal to num_shards", {"BatchLoader", "shard 2 of 2"}, [] {
        Dataset d{f32({4, 1, 2, 2}), Tensor::zeros({4}, DType::i64)};
        BatchLoader loader(d, {.batch_size = 2, .num_shards = 2, .shard = 2});
    }),
    expect<ValueError>("BatchLoader zero shards", {"BatchLoader", "0 shards"}, [] {
        Dataset d{f32({4, 1, 2, 2}), Tensor::zeros({4}, DType::i64)};
        BatchLoader loader(d, {.batch_size = 2, .num_shards = 0});
    }),
    expect<ValueError>("BatchLoader negative shard", {"BatchLoader", "shard -1"}, [] {
        Dataset d{f32({4, 1, 2, 2}), Tensor::zeros({4}, DType::i64)};
        BatchLoader loader(d, {.batch_size = 2, .num_shards = 2, .shard = -1});
    }),
    expect<ValueError>("DataLoader even shards with shard beyond num_shards", {"DataLoader", "shard 3 of 3"}, [] {
        auto data = std::make_shared<TensorDataset>(std::vector<Tensor>{f32({5, 2})});
        DataLoader loader(data, {.num_shards = 3, .shard = 3, .even_shards = true});
    }),
});
