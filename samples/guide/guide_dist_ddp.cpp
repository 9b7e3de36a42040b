#include <cstdio>
#include <vector>

#include "dyngrad/distributed/ddp.h"
#include "dyngrad/distributed/process_group.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    // mpirun -np 2 ./guide_dist_ddp, torchrun --nproc-per-node 2 ./guide_dist_ddp, or alone (a group of one).
    dist::ProcessGroup group = dist::ProcessGroup::init();
    const int rank = group.rank(), world = group.world_size();

    Generator data(5);  // every rank makes the same data set and trains on its shard of it
    const Tensor x = Tensor::uniform({256, 4}, -1.0, 1.0, data);
    const Tensor y = matmul(x, Tensor::uniform({4, 1}, -1.0, 1.0, data));
    const std::int64_t shard = 256 / world;
    const Tensor xs = x.narrow(0, rank * shard, shard), ys = y.narrow(0, rank * shard, shard);

    Generator gen(100 + static_cast<std::uint64_t>(rank));  // different initial weights on each rank ...
    Sequential model;
    model.add(Linear(4, 16, true, gen, Activation::Relu)).add(Linear(16, 1, true, gen));
    dist::DistributedDataParallel ddp(model, group);  // ... until DDP broadcasts rank 0's
    Adam adam(model.parameters(), {.lr = 1e-2});

    double first = 0, last = 0;
    for (int step = 0; step < 100; ++step) {
        ComputeGraph graph;
        const Var loss = mse_loss(model(graph.input(xs)), graph.input(ys));
        adam.zero_grad();
        ddp.backward(graph, loss);  // the backward, with the gradients averaged across ranks as they finish
        adam.step();                // the same averaged gradients: the replicas stay identical
        (step == 0 ? first : last) = loss.item();
    }

    // Every rank must hold the same parameters: their sum, all-reduced, is world × this rank's.
    double own = 0;
    for (const Parameter& p : model.parameters())
        for (const double v : p.value().to_vector()) own += v;
    Tensor total = Tensor::of({own}, DType::f64);
    group.all_reduce(total, dist::ReduceOp::Sum);
    const bool replicas_agree = total.item() == own * world;
    std::printf("rank %d of %d: loss %.4f -> %.4f, replicas agree: %d\n", rank, world, first, last, replicas_agree);
    return last < 0.2 * first && replicas_agree ? 0 : 1;
}
