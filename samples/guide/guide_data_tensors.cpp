#include <algorithm>
#include <iostream>
#include <memory>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

// A user data set: sample i is a token sequence of length 1 + i % 4 (int64) and its length as the target.
class Sequences : public SampleDataset {
public:
    std::int64_t size() const override { return 10; }
    std::vector<Tensor> get(std::int64_t index) const override {
        const std::int64_t length = 1 + index % 4;
        return {Tensor::full({length}, double(index + 1), DType::i64), Tensor::full({}, double(length))};
    }
};

// Sequences differ in length, so the default collate (stack_samples) would refuse them: pad with 0 instead.
std::vector<Tensor> pad_sequences(const std::vector<std::vector<Tensor>>& samples) {
    std::int64_t longest = 0;
    for (const auto& sample : samples) longest = std::max(longest, sample[0].size(0));
    Tensor tokens = Tensor::zeros({std::int64_t(samples.size()), longest}, DType::i64);
    Tensor targets = Tensor::zeros({std::int64_t(samples.size())});
    for (std::size_t b = 0; b < samples.size(); ++b) {
        for (std::int64_t t = 0; t < samples[b][0].size(0); ++t)
            tokens.set({std::int64_t(b), t}, samples[b][0].at({t}));
        targets.set({std::int64_t(b)}, samples[b][1].item());
    }
    return {tokens, targets};
}

int main() {
    // Regression: features and float targets as a TensorDataset; sample i is row i of each.
    Generator gen(2);
    const Tensor x = Tensor::normal({100, 3}, 0.0, 1.0, gen);
    const Tensor y = sum(x, {1}, /*keepdim=*/true) * 0.5;  // (100, 1)
    DataLoader loader(std::make_shared<TensorDataset>(std::vector<Tensor>{x, y}),
                      {.batch_size = 32, .shuffle = true, .seed = 4, .prefetch = 2});  // a worker prepares 2 batches ahead
    Linear model(3, 1, true, gen);
    SGD sgd(model.parameters(), {.lr = 0.1});
    double first = 0, last = 0;
    std::int64_t seen = 0;
    for (std::int64_t epoch = 0; epoch < 20; ++epoch) {
        loader.start_epoch(epoch);  // a new shuffle each epoch, the same for the same seed
        std::vector<Tensor> batch;  // {features (B, 3), targets (B, 1)}; the last batch has 4 rows
        while (loader.next(batch)) {
            ComputeGraph graph;
            Var loss = mse_loss(model(graph.input(batch[0])), graph.input(batch[1]));
            sgd.zero_grad();
            graph.backward(loss);
            sgd.step();
            last = loss.item();
            if (epoch == 0 && seen == 0) first = last;
            if (epoch == 0) seen += batch[0].size(0);
        }
    }
    std::cout << loader.batches_per_epoch() << " batches an epoch, " << seen << " samples in epoch 0, loss "
              << first << " -> " << last << "\n";

    // Sequences through the custom collate, in order, with no worker thread.
    DataLoader sequences(std::make_shared<Sequences>(),
                         {.batch_size = 4, .shuffle = false, .prefetch = 0, .collate = pad_sequences});
    std::vector<Tensor> batch;
    sequences.next(batch);
    std::cout << "tokens " << batch[0] << "\nlengths " << batch[1] << "\n";

    bool ok = seen == 100 && loader.batches_per_epoch() == 4 && last < 0.01 * first &&
              batch[0].shape() == Shape{4, 4} && batch[0].at({2, 2}) == 3.0 && batch[0].at({0, 1}) == 0.0 &&
              equal(batch[1], Tensor::of({1, 2, 3, 4}));
    std::cout << (ok ? "ok" : "MISMATCH") << "\n";
    return ok ? 0 : 1;
}
