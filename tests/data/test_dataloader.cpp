// DataLoader over any tensors (nn/dataset.h): TensorDataset with float regression targets, a user
// SampleDataset of sequences, collate, drop_last and shards, the prefetch thread against the caller's thread,
// and errors from the worker reaching the caller. CUDA devices when present.
#include <algorithm>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::MessageHas;

namespace {

// A user data set: sample i is a sequence (T) of int64 tokens i, i+1, ... and a float target i / 10.
class Sequences : public SampleDataset {
public:
    Sequences(std::int64_t n, std::int64_t length) : n_(n), length_(length) {}
    std::int64_t size() const override { return n_; }
    std::vector<Tensor> get(std::int64_t i) const override {
        if (i == fail_at) throw IndexError(str("Sequences: sample ", i, " is unreadable"));
        std::vector<std::int64_t> tokens;
        for (std::int64_t t = 0; t < length_; ++t) tokens.push_back(i + t);
        return {Tensor::from_vector(tokens, {length_}), Tensor::full({}, static_cast<double>(i) / 10)};
    }
    std::int64_t fail_at = -1;

private:
    std::int64_t n_, length_;
};

// All batches of one epoch, on the CPU.
std::vector<std::vector<Tensor>> epoch_of(DataLoader& loader) {
    std::vector<std::vector<Tensor>> out;
    std::vector<Tensor> batch;
    while (loader.next(batch)) {
        for (Tensor& t : batch) t = t.to(Device::cpu());
        out.push_back(batch);
    }
    return out;
}

bool same_batches(const std::vector<std::vector<Tensor>>& a, const std::vector<std::vector<Tensor>>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (a[i].size() != b[i].size()) return false;
        for (std::size_t f = 0; f < a[i].size(); ++f)
            if (a[i][f].shape() != b[i][f].shape() || a[i][f].to_vector() != b[i][f].to_vector()) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("DataLoader batches a TensorDataset with float targets in the seeded order", "[data][loader]") {
    Generator gen(8);
    const Tensor x = Tensor::uniform({37, 3}, -1, 1, gen);
    const Tensor y = Tensor::uniform({37, 2}, -1, 1, gen);  // regression targets
    auto data = std::make_shared<TensorDataset>(std::vector<Tensor>{x, y});
    for (const std::int64_t prefetch : {0, 1, 3}) {
        INFO("prefetch " << prefetch);
        DataLoader loader(data, {.batch_size = 8, .shuffle = true, .seed = 5, .prefetch = prefetch});
        CHECK(loader.batches_per_epoch() == 5);
        CHECK(loader.order() == epoch_permutation(37, 5, 0));
        const auto batches = epoch_of(loader);
        REQUIRE(batches.size() == 5);
        CHECK(batches[0][0].shape() == Shape{8, 3});
        CHECK(batches[0][1].shape() == Shape{8, 2});
        CHECK(batches[4][0].shape() == Shape{5, 3});  // the partial last batch
        // Row r of batch b is sample order[8b + r] of both tensors.
        for (std::size_t b = 0; b < batches.size(); ++b)
            for (std::int64_t r = 0; r < batches[b][0].size(0); ++r) {
                const std::int64_t i = loader.order()[b * 8 + static_cast<std::size_t>(r)];
                CHECK(batches[b][0].at({r, 2}) == x.at({i, 2}));
                CHECK(batches[b][1].at({r, 1}) == y.at({i, 1}));
            }
        loader.start_epoch(1);
        CHECK(loader.order() == epoch_permutation(37, 5, 1));
        const auto second = epoch_of(loader);
        CHECK_FALSE(same_batches(second, batches));
        loader.start_epoch(0);
        CHECK(same_batches(epoch_of(loader), batches));  // the same seed and epoch: the same batches
    }
}

TEST_CASE("DataLoader: the prefetch thread gives the batches the caller's thread gives", "[data][loader]") {
    auto data = std::make_shared<Sequences>(53, 6);
    DataLoader direct(data, {.batch_size = 4, .shuffle = true, .seed = 2, .prefetch = 0});
    DataLoader ahead(data, {.batch_size = 4, .shuffle = true, .seed = 2, .prefetch = 2});
    const auto a = epoch_of(direct), b = epoch_of(ahead);
    REQUIRE(a.size() == 14);
    CHECK(same_batches(a, b));
    CHECK(a[0][0].shape() == Shape{4, 6});
    CHECK(a[0][0].dtype() == DType::i64);
    CHECK(a[0][1].shape() == Shape{4});  // 0-d targets stack to (B)
    // Restarting mid-epoch drops what was prepared.
    std::vector<Tensor> batch;
    ahead.start_epoch(3);
    REQUIRE(ahead.next(batch));
    ahead.start_epoch(0);
    CHECK(same_batches(epoch_of(ahead), a));
}

TEST_CASE("DataLoader: drop_last, shards and a collate step", "[data][loader]") {
    auto data = std::make_shared<Sequences>(23, 2);
    SECTION("drop_last") {
        DataLoader loader(data, {.batch_size = 5, .shuffle = false, .drop_last = true});
        CHECK(loader.batches_per_epoch() == 4);
        for (const auto& batch : epoch_of(loader)) CHECK(batch[0].size(0) == 5);
    }
    SECTION("three shards cover every sample once") {
        std::multiset<std::int64_t> seen;
        for (std::int64_t shard = 0; shard < 3; ++shard) {
            DataLoader loader(data, {.batch_size = 4, .shuffle = true, .seed = 9, .num_shards = 3, .shard = shard});
            for (const std::int64_t i : loader.order()) seen.insert(i);
            CHECK(loader.order().size() == (shard < 2 ? 8u : 7u));
        }
        CHECK(seen.size() == 23);
        CHECK(std::set<std::int64_t>(seen.begin(), seen.end()).size() == 23);
    }
    SECTION("a collate that sums each batch's targets") {
        DataLoader loader(data, {.batch_size = 10,
                                 .shuffle = false,
                                 .collate = [](const std::vector<std::vector<Tensor>>& samples) {
                                     double total = 0;
                                     for (const auto& s : samples) total += s[1].item();
                                     return std::vector<Tensor>{Tensor::full({1}, total)};
                                 }});
        const auto batches = epoch_of(loader);
        REQUIRE(batches.size() == 3);
        CHECK(batches[0][0].item() == Approx(4.5));  // (0 + 1 + ... + 9) / 10
    }
}

TEST_CASE("DataLoader: errors of the data set reach next(); bad options are ValueErrors", "[data][loader]") {
    auto data = std::make_shared<Sequences>(20, 3);
    data->fail_at = 13;
    DataLoader loader(data, {.batch_size = 4, .shuffle = false, .prefetch = 2});
    std::vector<Tensor> batch;
    for (int b = 0; b < 3; ++b) REQUIRE(loader.next(batch));
    CHECK_THROWS_MATCHES(loader.next(batch), IndexError, MessageHas({"sample 13", "unreadable"}));
    CHECK_FALSE(loader.next(batch));  // the epoch ended there
    data->fail_at = -1;
    loader.start_epoch(1);
    CHECK(epoch_of(loader).size() == 5);

    CHECK_THROWS_AS(DataLoader(nullptr, {}), ValueError);
    CHECK_THROWS_AS(DataLoader(data, {.batch_size = 0}), ValueError);
    CHECK_THROWS_AS(DataLoader(data, {.num_shards = 2, .shard = 2}), ValueError);
    CHECK_THROWS_AS(DataLoader(data, {.prefetch = -1}), ValueError);
    CHECK_THROWS_AS(DataLoader(data, {.device = Device::cuda(64)}), DeviceError);
    CHECK_THROWS_MATCHES(stack_samples({{Tensor::zeros({2})}, {Tensor::zeros({3})}}), ShapeError,
                         MessageHas({"sample 1", "(3)", "(2)"}));
}

TEST_CASE("DataLoader on a GPU: prefetched batches copied on dyngrad's stream", "[data][loader][gpu]") {
    if (cuda_device_count() == 0) return;  // CPU-only machine
    Generator gen(12);
    const Tensor x = Tensor::uniform({301, 7}, -1, 1, gen), y = Tensor::uniform({301}, -1, 1, gen);
    auto data = std::make_shared<TensorDataset>(std::vector<Tensor>{x, y});
    DataLoader cpu(data, {.batch_size = 32, .shuffle = true, .seed = 1});
    DataLoader gpu(data, {.batch_size = 32, .shuffle = true, .seed = 1, .prefetch = 3, .device = Device::cuda(0)});
    std::vector<Tensor> batch;
    REQUIRE(gpu.next(batch));
    CHECK(batch[0].device() == Device::cuda(0));
    gpu.start_epoch(0);
    CHECK(same_batches(epoch_of(gpu), epoch_of(cpu)));
}
