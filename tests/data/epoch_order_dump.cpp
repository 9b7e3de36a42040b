// Prints epoch_permutation(n, seed, epoch) (nn/dataset.h) for each triple of arguments, one line each:
// "n seed epoch: i0 i1 ...". tests/data/check_epoch_order.py compares the lines with bench/torch_reference.py's
// Python reimplementation, which gives PyTorch the same data order as dyngrad-train.
//   epoch_order_dump N SEED EPOCH [N SEED EPOCH ...]
#include <dyngrad/dyngrad.h>

#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) {
    if (argc < 4 || (argc - 1) % 3 != 0) {
        std::fprintf(stderr, "usage: epoch_order_dump N SEED EPOCH [N SEED EPOCH ...]\n");
        return 2;
    }
    try {
        for (int i = 1; i + 2 < argc; i += 3) {
            const std::int64_t n = std::stoll(argv[i]);
            const std::uint64_t seed = std::stoull(argv[i + 1]);
            const std::int64_t epoch = std::stoll(argv[i + 2]);
            std::printf("%s %s %s:", argv[i], argv[i + 1], argv[i + 2]);
            for (const std::int64_t index : dyngrad::epoch_permutation(n, seed, epoch))
                std::printf(" %lld", static_cast<long long>(index));
            std::printf("\n");
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "epoch_order_dump: %s\n", e.what());
        return 2;
    }
    return 0;
}
