#include <cstdint>
#include <iostream>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    // A data set in memory: images (N,C,H,W) float32 and labels (N) int64, here synthetic.
    constexpr std::int64_t n = 100;
    Generator gen(10);
    std::vector<std::int64_t> labels(n);
    for (std::int64_t i = 0; i < n; ++i) labels[i] = i % 10;
    const Dataset data{Tensor::normal({n, 1, 4, 4}, 0.0, 1.0, gen), Tensor::from_vector(labels, {n})};

    Linear model(16, 10, true, gen);
    SGD sgd(model.parameters(), {.lr = 0.1});
    BatchLoader loader(data, {.batch_size = 32, .shuffle = true, .seed = 7});  // .device = Device::cuda(0) for a GPU
    for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
        loader.start_epoch(epoch);  // the order is a permutation drawn from (seed, epoch)
        std::vector<int> seen(n, 0);
        std::int64_t rows = 0;
        Batch batch;
        while (loader.next(batch)) {
            ComputeGraph graph;
            Var loss = cross_entropy(model(flatten(graph.input(batch.images))), graph.input(batch.labels));
            sgd.zero_grad();
            graph.backward(loss);
            sgd.step();
            rows += batch.size();
        }
        for (std::int64_t i : loader.order()) ++seen[i];
        std::cout << "epoch " << epoch << ": " << loader.batches_per_epoch() << " batches, " << rows
                  << " samples, last batch " << batch.size() << ", first sample " << loader.order()[0] << "\n";
        for (int count : seen)
            if (count != 1) return 1;  // every sample exactly once per epoch
        if (rows != n || batch.size() != n % 32) return 1;
    }
    // The order is reproducible from the seed alone, the same with every compiler and library.
    return loader.order() == epoch_permutation(n, 7, 1) ? 0 : 1;
}
