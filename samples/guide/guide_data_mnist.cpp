#include <filesystem>
#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    if (!std::filesystem::exists(kDefaultMnistDirectory)) {
        std::cout << "Fashion-MNIST is not installed in " << kDefaultMnistDirectory << ": skipped\n";
        return 77;  // CTest reports the test as skipped
    }
    const MnistData mnist = load_mnist();  // or load_mnist("path/to/any/MNIST-format/directory")
    std::cout << "train " << describe(mnist.train.images) << ", test " << describe(mnist.test.images)
              << ", pixels normalised with mean " << mnist.normalization.mean << " and stddev "
              << mnist.normalization.stddev << "\n";

    BatchLoader loader(mnist.train.head(1000), {.batch_size = 64});
    Batch batch;
    loader.next(batch);
    std::cout << "first batch: images " << describe(batch.images) << ", labels " << describe(batch.labels) << "\n";
    return mnist.train.size() == 60000 && batch.images.shape() == Shape{64, 1, 28, 28} ? 0 : 1;
}
