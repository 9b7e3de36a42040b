// Two ranks of data parallelism through the installed headers and libraries only (find_package COMPONENTS dist):
// an all-reduce of rank-dependent values, then one DistributedDataParallel backward of a Linear layer whose ranks
// see different inputs; every rank must end with the same averaged gradient, (g0 + g1) / 2, computed here from
// each rank's own single-process gradient. Prints one line per rank and exits non-zero on any mismatch.
#include <dyngrad/distributed/ddp.h>
#include <dyngrad/distributed/process_group.h>
#include <dyngrad/dyngrad.h>

#include <cmath>
#include <cstdio>
#include <vector>

using namespace dyngrad;

namespace {

Linear make_layer() {
    Generator gen(7);
    Linear layer(3, 2, true, gen);
    layer.to(DType::f64);
    return layer;
}

// The gradient of sum(linear(x)^2) for this rank's x, with one Linear layer of fixed weights.
std::vector<double> local_gradient(const Tensor& x) {
    Linear layer = make_layer();
    ComputeGraph graph;
    Var y = layer(graph.input(x));
    graph.backward(sum(y * y));
    return layer.weight.grad().to_vector();
}

}  // namespace

int main() {
    try {
        dist::ProcessGroup group = dist::ProcessGroup::init();
        const int rank = group.rank();
        if (group.world_size() != 2) {
            std::fprintf(stderr, "dist consumer: run me on 2 ranks (mpirun -np 2), not %d\n", group.world_size());
            return 1;
        }
        Tensor t = Tensor::of({1.0 + rank, 10.0 * (rank + 1)}, DType::f64);
        group.all_reduce(t, dist::ReduceOp::Sum);
        const std::vector<double> summed = t.to_vector();
        if (summed[0] != 3.0 || summed[1] != 30.0) {
            std::fprintf(stderr, "rank %d: all_reduce gave %g %g, expected 3 30\n", rank, summed[0], summed[1]);
            return 1;
        }

        Generator data(100);
        const Tensor x0 = Tensor::uniform({4, 3}, -1.0, 1.0, data, DType::f64);
        const Tensor x1 = Tensor::uniform({4, 3}, -1.0, 1.0, data, DType::f64);
        const std::vector<double> g0 = local_gradient(x0);
        const std::vector<double> g1 = local_gradient(x1);

        Linear layer = make_layer();
        dist::DistributedDataParallel ddp(layer, group);
        ComputeGraph graph;
        Var y = layer(graph.input(rank == 0 ? x0 : x1));
        ddp.backward(graph, sum(y * y));
        const std::vector<double> averaged = layer.weight.grad().to_vector();
        for (std::size_t i = 0; i < averaged.size(); ++i) {
            const double expected = (g0[i] + g1[i]) / 2;
            if (std::fabs(averaged[i] - expected) > 1e-12 * (1 + std::fabs(expected))) {
                std::fprintf(stderr, "rank %d: averaged dweight[%zu] = %.17g, expected %.17g\n", rank, i, averaged[i],
                             expected);
                return 1;
            }
        }
        std::printf("dist consumer rank %d of 2: all_reduce and DDP gradient ok\n", rank);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dist consumer: %s\n", e.what());
        return 1;
    }
}
