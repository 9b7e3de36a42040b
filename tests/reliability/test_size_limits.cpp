// Issue 11, classes 3, 8 and the core messages of 10: size arithmetic that overflows int64, conversions of
// doubles to integers and sizes, non-finite hyperparameters, host allocations that cannot succeed, and
// messages about undefined tensors, invalid devices and read_idx's rank. Each bad input must be a typed
// error naming what was computed; each valid extreme must give the right answer.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include "catch.h"
#include "dyngrad/core/checked.h"
#include "dyngrad/dyngrad.h"
#include "size_limits.h"
#include "test_support.h"

using namespace dyngrad;
using dgtest::kInf;
using dgtest::kNaN;
using dgtest::randn;
using namespace dgtest::size_limits;
using dgtest::MessageHas;

// ---- class 3: the helper itself ----

TEST_CASE("checked arithmetic names the quantity and the operands", "[trust][sizes]") {
    CHECK(checked_add(kMax - 1, 1, "x") == kMax);
    CHECK(checked_mul(k2p32, k2p32 / 2 - 1, "x") == k2p32 * (k2p32 / 2 - 1));
    CHECK_THROWS_MATCHES(checked_add(kMax, 1, "conv2d: padded height"), ShapeError,
                         MessageHas({"conv2d: padded height", "9223372036854775807 + 1", "overflows"}));
    CHECK_THROWS_MATCHES(checked_mul(k2p32, k2p32, "numel"), ShapeError, MessageHas({"4294967296 * 4294967296"}));
    CHECK_THROWS_AS(checked_sub(-kMax, 2, "x"), ShapeError);
    CHECK(checked_numel({3, 0, k2p40}, "s") == 0);
    CHECK(checked_numel({}, "s") == 1);
    CHECK_THROWS_MATCHES(checked_numel({0, k2p40, k2p40}, "s"), ShapeError, MessageHas({"(0,1099511627776,"}));
    CHECK_THROWS_AS(checked_numel({2, -1}, "s"), ValueError);
    CHECK_THROWS_AS(checked_bytes(k2p61, 4, "s"), ShapeError);
    CHECK(checked_to_int64(-3.75, "v") == -3);
    CHECK(checked_to_int64(-9223372036854775808.0, "v") == std::numeric_limits<std::int64_t>::min());
    CHECK_THROWS_AS(checked_to_int64(9223372036854775808.0, "v"), ValueError);
    CHECK_THROWS_AS(checked_narrow<int>(k2p32, "cuDNN dim"), ShapeError);
    CHECK(checked_narrow<int>(-5, "cuDNN dim") == -5);
}

// ---- class 3: tensors ----

TEST_CASE("tensor factories refuse shapes whose element or byte count overflows", "[trust][sizes]") {
    // 2^32 · 2^32 wraps to 0: before, these were 0-element tensors of a (2^32,2^32) shape.
    CHECK_THROWS_MATCHES(Tensor::empty({k2p32, k2p32}), ShapeError, MessageHas({"(4294967296,4294967296)"}));
    CHECK_THROWS_AS(Tensor::zeros({k2p32, 2, k2p32}, DType::f64), ShapeError);
    CHECK_THROWS_AS(Tensor::from_vector(std::vector<double>{}, {k2p32, k2p32}), ShapeError);
    CHECK_THROWS_AS(Tensor::from_vector(std::vector<std::int64_t>{}, {k2p32, k2p32}), ShapeError);
    // A zero dimension does not make the other dims' product safe: their strides overflow.
    CHECK_THROWS_AS(Tensor::empty({0, k2p40, k2p40}), ShapeError);
    // 2^61 float32 elements are 2^63 bytes.
    CHECK_THROWS_MATCHES(Tensor::empty({k2p61}), ShapeError, MessageHas({"bytes"}));
    // Within range: a huge but empty tensor is fine.
    const Tensor empty = Tensor::empty({0, k2p61});
    CHECK(empty.numel() == 0);
    CHECK(empty.nbytes() == 0);
}

TEST_CASE("random factories refuse negative and overflowing shapes", "[trust][sizes]") {
    Generator gen(3);
    // Before: std::vector(size_t(-3)) threw std::length_error.
    CHECK_THROWS_MATCHES(Tensor::uniform({-3}, 0, 1, gen), ValueError, MessageHas({"(-3)", "negative"}));
    CHECK_THROWS_AS(Tensor::normal({2, -1}, 0, 1, gen), ValueError);
    CHECK_THROWS_AS(Tensor::uniform({k2p32, k2p32}, 0, 1, gen), ShapeError);
    CHECK_THROWS_AS(Tensor::normal({k2p32, k2p32}, 0, 1, gen), ShapeError);
}

TEST_CASE("reshape targets whose product wraps are refused", "[trust][sizes]") {
    const Tensor t = randn({6}, 11);
    // 6·7·kInverseOf7 wraps to 6: before, the reshape succeeded with a shape of 2^66 + 6 elements.
    CHECK_THROWS_MATCHES(t.reshaped({6, 7, kInverseOf7}), ShapeError, MessageHas({"(6,7,7905747460161236407)"}));
    ComputeGraph g;
    const Var x = g.input(t, "x");
    CHECK_THROWS_MATCHES(reshape(x, {6, 7, kInverseOf7}), ShapeError, MessageHas({"reshape", "(6,7,"}));
    CHECK_THROWS_MATCHES(reshape(x, {7, kInverseOf7, -1}), ShapeError, MessageHas({"reshape"}));
    // A huge dimension next to a zero one.
    const Var empty = g.input(Tensor::zeros({0}), "empty");
    CHECK_THROWS_AS(reshape(empty, {k2p40, k2p40, 0}), ShapeError);
    CHECK(reshape(x, {3, -1}).shape() == Shape{3, 2});
}

TEST_CASE("narrow with start near INT64_MAX errors instead of wrapping", "[trust][sizes]") {
    ComputeGraph g;
    const Var x = g.input(randn({5}, 12), "x");
    // start + length wrapped to a negative end that passed the range check, and read outside the tensor.
    CHECK_THROWS_MATCHES(narrow(x, 0, kMax, 2), IndexError, MessageHas({"narrow", "9223372036854775807", "5"}));
    CHECK_THROWS_AS(narrow(x, 0, kMax - 1, 3), IndexError);
    CHECK_THROWS_AS(narrow(x, 0, 2, kMax), IndexError);
    CHECK(narrow(x, 0, 5, 0).shape() == Shape{0});
    const std::vector<double> all = x.value().to_vector();
    CHECK(narrow(x, 0, 1, 4).value().to_vector() == std::vector<double>(all.begin() + 1, all.end()));
}

TEST_CASE("concat sizes that overflow are refused", "[trust][sizes]") {
    ComputeGraph g;
    const Var a = g.input(Tensor::zeros({0, k2p62}), "a");
    // Four 2^62 sum to 2^64, which wrapped to 0: a silent (0,0) result.
    CHECK_THROWS_MATCHES(concat({a, a, a, a}, 1), ShapeError, MessageHas({"concat"}));
    CHECK_THROWS_AS(concat({a, a}, 1), ShapeError);
    CHECK(concat({a, a}, 0).shape() == Shape{0, k2p62});
}

TEST_CASE("matmul and broadcasting refuse outputs with too many elements", "[trust][sizes]") {
    ComputeGraph g;
    const Var a = g.input(Tensor::zeros({k2p32, 0}), "a");
    const Var b = g.input(Tensor::zeros({0, k2p32}), "b");
    // (2^32,0)@(0,2^32) is (2^32,2^32): its element count wrapped to 0.
    CHECK_THROWS_MATCHES(matmul(a, b), ShapeError, MessageHas({"matmul", "(4294967296,0)"}));
    const Var c = g.input(Tensor::zeros({k2p40, 1, 0}), "c");
    const Var d = g.input(Tensor::zeros({1, k2p40, 0}), "d");
    CHECK_THROWS_MATCHES(add(c, d), ShapeError, MessageHas({"add", "(1099511627776,1,0)"}));
    CHECK_THROWS_AS(broadcast_shapes({k2p40, 1, 0}, {1, k2p40, 0}), ShapeError);
}

TEST_CASE("conv2d output sizes with extreme attributes", "[trust][sizes][conv]") {
    ComputeGraph g;
    const Tensor xt = randn({1, 1, 5, 5}, 21, DType::f64);
    const Tensor wt = randn({1, 1, 3, 3}, 22, DType::f64);
    const Var x = g.input(xt, "x");
    const Var w = g.input(wt, "w");
    SECTION("stride INT64_MAX: one output pixel, the top-left window") {
        const Var y = conv2d(x, w, {.stride = {kMax, kMax}});
        REQUIRE(y.shape() == Shape{1, 1, 1, 1});
        double expected = 0;
        for (std::int64_t r = 0; r < 3; ++r)
            for (std::int64_t s = 0; s < 3; ++s) expected += xt.at({0, 0, r, s}) * wt.at({0, 0, r, s});
        CHECK(y.value().item() == dgtest::Approx(expected).epsilon(1e-12));
        // With padding the one window starts in the padding.
        const Var yp = conv2d(x, w, {.stride = {kMax, kMax}, .padding = {2, 2}});
        REQUIRE(yp.shape() == Shape{1, 1, 1, 1});
        CHECK(yp.value().item() == dgtest::Approx(xt.at({0, 0, 0, 0}) * wt.at({0, 0, 2, 2})).epsilon(1e-12));
    }
    SECTION("dilation INT64_MAX with a kernel of extent 1 is the same as dilation 1") {
        const Var w1 = g.input(randn({1, 1, 1, 3}, 23, DType::f64), "w1");
        const Var a = conv2d(x, w1, {.dilation = {kMax, 1}});
        const Var b = conv2d(x, w1);
        REQUIRE(a.shape() == b.shape());
        CHECK(a.value().to_vector() == b.value().to_vector());
    }
    SECTION("dilation that overflows the window is an error, not a wrapped window") {
        // kMax·2 + 1 wrapped to -1, "fitting" any input: the output was (1,1,7,3).
        CHECK_THROWS_MATCHES(conv2d(x, w, {.dilation = {kMax, 1}}), ShapeError, MessageHas({"conv2d", "height"}));
    }
    SECTION("padding so large that the output cannot be counted") {
        const Var empty = g.input(Tensor::zeros({0, 1, 5, 5}, DType::f64), "empty");
        // (0,1,2^62+3,3): 0 elements, but 3·(2^62+3) overflows (before: std::length_error from the im2col buffer).
        CHECK_THROWS_MATCHES(conv2d(empty, w, {.padding = {k2p61, 0}}), ShapeError, MessageHas({"conv2d"}));
        CHECK_THROWS_AS(conv2d(x, w, {.padding = {kMax, 0}}), ShapeError);
    }
    SECTION("huge padding with a huge stride: exact output size and values") {
        // (5 + 2·2^61 − 3) / 2^62 + 1 = 2 rows; row 0 lies in the padding, row 1 is 2^62 further.
        const Var y = conv2d(x, w, {.stride = {k2p62, 1}, .padding = {k2p61, 0}});
        CHECK(y.shape() == Shape{1, 1, 2, 3});
        for (double v : y.value().to_vector()) CHECK(v == 0);
    }
}

TEST_CASE("pooling with extreme attributes", "[trust][sizes][pool]") {
    ComputeGraph g;
    const Tensor xt = randn({1, 2, 5, 5}, 31, DType::f64);
    const Var x = g.input(xt, "x", true);
    SECTION("stride INT64_MAX: one output pixel") {
        const Var y = max_pool2d(x, {2, 2}, {kMax, kMax});
        REQUIRE(y.shape() == Shape{1, 2, 1, 1});
        for (std::int64_t c = 0; c < 2; ++c)
            CHECK(y.value().at({0, c, 0, 0}) == std::max({xt.at({0, c, 0, 0}), xt.at({0, c, 0, 1}),
                                                          xt.at({0, c, 1, 0}), xt.at({0, c, 1, 1})}));
    }
    SECTION("a 2^40 x 2^40 average window: 2^80 does not wrap to 0") {
        // Padding 2^39 on each side makes the window fit around the one input element; with count-include-pad
        // the mean is x / 2^80 (before: kh·kw wrapped to 0 and the output was inf).
        const Var one = g.input(randn({1, 1, 1, 1}, 32, DType::f64), "one", true);
        const Var y = avg_pool2d(one, {k2p40, k2p40}, {0, 0}, {k2p40 / 2, k2p40 / 2});
        REQUIRE(y.shape() == Shape{1, 1, 1, 1});
        const double scale = std::ldexp(1.0, -80);
        CHECK(y.value().item() == dgtest::Approx(one.value().item() * scale).epsilon(1e-12));
        g.backward(sum(y));
        CHECK(one.grad().item() == dgtest::Approx(scale).epsilon(1e-12));
    }
    SECTION("kernel INT64_MAX with padding kernel/2: exact, no wrapped padded size") {
        const Var y = max_pool2d(x, {kMax, 1}, {0, 1}, {kMax / 2, 0});
        // (5 + 2·(2^62 − 1) − (2^63 − 1)) / (2^63 − 1) + 1 = 1
        REQUIRE(y.shape() == Shape{1, 2, 1, 5});
        for (std::int64_t c = 0; c < 2; ++c)
            for (std::int64_t q = 0; q < 5; ++q) {
                double m = xt.at({0, c, 0, q});
                for (std::int64_t h = 1; h < 5; ++h) m = std::max(m, xt.at({0, c, h, q}));
                CHECK(y.value().at({0, c, 0, q}) == m);
            }
    }
}

TEST_CASE("extreme strides and dilations on the GPU agree with the CPU", "[trust][sizes][gpu]") {
    if (cuda_device_count() == 0) return;  // CPU-only machine: the CPU cases above cover the shape rules
    const Tensor xt = randn({2, 3, 6, 7}, 35);
    const Tensor wt = randn({4, 3, 3, 1}, 36);
    const auto run = [&](Device device) {
        ComputeGraph g;
        const Var x = g.input(xt.to(device), "x");
        const Var w = g.input(wt.to(device), "w");
        // stride INT64_MAX: one output row (cuDNN takes int strides); dilation INT64_MAX on a kernel of width 1.
        const Var c = conv2d(x, w, {.stride = {kMax, 1}, .padding = {1, 0}, .dilation = {1, kMax}});
        const Var p = max_pool2d(x, {2, 3}, {kMax, kMax});
        const Var a = avg_pool2d(x, {3, 2}, {kMax, 1}, {1, 1});
        return std::vector<std::vector<double>>{c.value().to_vector(), p.value().to_vector(), a.value().to_vector()};
    };
    const auto cpu = run(Device::cpu());
    const auto gpu = run(Device::cuda(0));
    for (std::size_t i = 0; i < cpu.size(); ++i) {
        REQUIRE(cpu[i].size() == gpu[i].size());
        for (std::size_t k = 0; k < cpu[i].size(); ++k) CHECK(gpu[i][k] == dgtest::Approx(cpu[i][k]).epsilon(1e-5).margin(1e-6));
    }
}

TEST_CASE("recurrent weight sizes that overflow are refused", "[trust][sizes][rnn]") {
    // 4·2^32·(1 + 2^32) wrapped to 2^34: a plausible size for an impossible weight.
    CHECK_THROWS_MATCHES(rnn_weight_size(RnnMode::Lstm, {.hidden_size = k2p32}, 1), ShapeError,
                         MessageHas({"lstm", "weight"}));
    CHECK_THROWS_AS(rnn_weight_layout(RnnMode::Gru, {.hidden_size = k2p32, .num_layers = 2}, 3), ShapeError);
    CHECK_THROWS_AS(rnn_weight_size(RnnMode::RnnTanh, {.hidden_size = 1, .num_layers = kMax}, 3), ShapeError);
    Generator gen(41);
    CHECK_THROWS_AS(LSTM(1, {.hidden_size = k2p32}, gen), ShapeError);
    CHECK(rnn_weight_size(RnnMode::Lstm, {.hidden_size = 3, .num_layers = 2, .bidirectional = true}, 5) ==
          2 * 4 * 3 * (5 + 3) + 2 * 4 * 3 * (6 + 3) + 4 * 2 * 4 * 3);
}

TEST_CASE("layers with sizes whose weights cannot exist", "[trust][sizes]") {
    Generator gen(42);
    // kaiming_uniform({2^32, 2^32}) made a 0-element weight of that shape.
    CHECK_THROWS_AS(Linear(k2p32, k2p32, true, gen), ShapeError);
    CHECK_THROWS_AS(Conv2d(k2p32, k2p32, {k2p32, 1}, {}, true, gen), ShapeError);
    CHECK_THROWS_AS(compute_fans({2, k2p32, k2p32, 1}), ShapeError);
}

TEST_CASE("safetensors headers whose shapes overflow are file errors", "[trust][sizes][io]") {
    const auto path = std::filesystem::temp_directory_path() / ("dyngrad_trust_sizes_" + std::to_string(::getpid()) +
                                                                ".safetensors");
    // (0, 2^62, 4): 0 bytes, but its strides overflow.
    const std::string header = R"({"t":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})";
    {
        std::ofstream out(path, std::ios::binary);
        const std::uint64_t length = header.size();
        out.write(reinterpret_cast<const char*>(&length), sizeof length);
        out << header;
    }
    CHECK_THROWS_MATCHES(load_safetensors(path), IoError, MessageHas({"'t'", "(0,4611686018427387904,4)"}));
    std::filesystem::remove(path);
}

// ---- class 8: conversions and scalars ----

TEST_CASE("float to int64 conversions refuse NaN, infinities and out-of-range values", "[trust][conversions]") {
    for (const double bad : {kNaN, kInf, -kInf, 1e19, -1e19}) {
        INFO(bad);
        CHECK_THROWS_MATCHES(Tensor::full({2}, bad, DType::i64), ValueError, MessageHas({"full", "int64"}));
        CHECK_THROWS_AS(Tensor::from_vector(std::vector<double>{1, bad}, {2}, DType::i64), ValueError);
        Tensor t = Tensor::zeros({2}, DType::i64);
        CHECK_THROWS_AS(t.set({1}, bad), ValueError);
        CHECK_THROWS_AS(t.fill(bad), ValueError);
        CHECK(t.to_vector() == std::vector<double>{0, 0});
        const Tensor f = Tensor::from_vector(std::vector<double>{2.5, bad}, {2}, DType::f64);
        CHECK_THROWS_AS(f.to(DType::i64), ValueError);
    }
    CHECK_THROWS_MATCHES(Tensor::full({1}, kNaN, DType::i64), ValueError, MessageHas({"nan"}));
    CHECK_THROWS_MATCHES(Tensor::from_vector(std::vector<double>{-kInf}, {1}, DType::f32).to(DType::i64), ValueError,
                         MessageHas({"-inf"}));
    // In range: truncation toward zero, as in PyTorch.
    const Tensor ok = Tensor::from_vector(std::vector<double>{-2.75, 3.5, -9.2e18}, {3}, DType::f64).to(DType::i64);
    CHECK(ok.at({0}) == -2);
    CHECK(ok.at({1}) == 3);
    CHECK(ok.at({2}) == -9.2e18);
}

TEST_CASE("arange refuses non-finite bounds and steps", "[trust][conversions]") {
    CHECK_THROWS_MATCHES(Tensor::arange(0, 1, kNaN), ValueError, MessageHas({"arange", "nan"}));
    CHECK_THROWS_MATCHES(Tensor::arange(0, kInf), ValueError, MessageHas({"arange", "inf"}));
    CHECK_THROWS_AS(Tensor::arange(-kInf, 0), ValueError);
    CHECK_THROWS_AS(Tensor::arange(kNaN, 1), ValueError);
    CHECK_THROWS_AS(Tensor::arange(0, 1e300, 1e-300), ValueError);
    CHECK(Tensor::arange(0, -1).numel() == 0);
    CHECK(Tensor::arange(0.5, 3, 1, DType::f64).to_vector() == std::vector<double>{0.5, 1.5, 2.5});
}

TEST_CASE("host allocations that cannot succeed are OutOfMemory naming the bytes", "[trust][conversions][oom]") {
    // 2^60 floats: 2^62 bytes fit int64 but no machine; before: std::bad_alloc.
    CHECK_THROWS_MATCHES(Tensor::empty({std::int64_t{1} << 60}), OutOfMemory,
                         MessageHas({"4611686018427387904 bytes", "cpu"}));
    // 10^18 steps: before, std::vector threw std::bad_alloc (or std::length_error beyond its max_size).
    CHECK_THROWS_AS(Tensor::arange(0, 1e18), OutOfMemory);
    // The library is still usable.
    CHECK(Tensor::ones({3}).to_vector() == std::vector<double>{1, 1, 1});
}

TEST_CASE("optimizers and schedules refuse every non-finite hyperparameter", "[trust][conversions][optim]") {
    Parameter p(randn({3}, 51), "p");
    for (const double bad : {kInf, -kInf, kNaN}) {
        INFO(bad);
        CHECK_THROWS_MATCHES(SGD({p}, {.lr = bad}), ValueError, MessageHas({"lr"}));
        CHECK_THROWS_AS(SGD({p}, {.lr = 0.1, .momentum = bad}), ValueError);
        CHECK_THROWS_AS(SGD({p}, {.lr = 0.1, .weight_decay = bad}), ValueError);
        CHECK_THROWS_MATCHES(Adam({p}, {.lr = bad}), ValueError, MessageHas({"lr", "finite"}));
        CHECK_THROWS_AS(Adam({p}, {.eps = bad}), ValueError);
        CHECK_THROWS_AS(AdamW({p}, {.weight_decay = bad}), ValueError);
        CHECK_THROWS_AS(Adam({p}, {.beta1 = bad}), ValueError);
        SGD sgd({p}, {.lr = 0.1});
        CHECK_THROWS_AS(sgd.set_lr(bad), ValueError);
        CHECK(sgd.lr() == 0.1);
        CHECK_THROWS_MATCHES(StepLR(sgd, 2, bad), ValueError, MessageHas({"StepLR", "gamma"}));
        CHECK_THROWS_MATCHES(CosineAnnealingLR(sgd, 5, bad), ValueError, MessageHas({"CosineAnnealingLR", "eta_min"}));
    }
    // A schedule whose lr overflows to inf refuses the step instead of setting it.
    SGD sgd({p}, {.lr = 1e300});
    StepLR schedule(sgd, 1, 1e10);
    CHECK_THROWS_MATCHES(schedule.step(), ValueError, MessageHas({"lr", "inf"}));
    CHECK(sgd.lr() == 1e300);
}

TEST_CASE("epoch_permutation refuses a negative count", "[trust][conversions][data]") {
    // Before: std::vector(size_t(-1)) threw std::length_error.
    CHECK_THROWS_MATCHES(epoch_permutation(-1, 0, 0), ValueError, MessageHas({"epoch_permutation", "-1"}));
    CHECK_THROWS_AS(epoch_permutation(std::numeric_limits<std::int64_t>::min(), 7, 1), ValueError);
    CHECK(epoch_permutation(0, 7, 1).empty());
}

// ---- class 10 (core): messages that point at the right thing ----

TEST_CASE("an undefined tensor is described as undefined, not as shape ()", "[trust][messages]") {
    const Tensor undefined;
    CHECK_THROWS_MATCHES(undefined.item(), ValueError, MessageHas({"undefined"}));
    CHECK_THROWS_MATCHES(undefined.reshaped({1}), ValueError, MessageHas({"undefined"}));
    CHECK_THROWS_MATCHES(undefined.size(0), ValueError, MessageHas({"undefined"}));
    CHECK_THROWS_MATCHES(undefined.at({}), ValueError, MessageHas({"undefined"}));
    CHECK_THROWS_MATCHES(undefined.clone(), ValueError, MessageHas({"undefined"}));
    CHECK_THROWS_MATCHES(undefined.to_vector(), ValueError, MessageHas({"undefined"}));
    Tensor dst = Tensor::zeros({});
    CHECK_THROWS_MATCHES(dst.copy_from(undefined), ValueError, MessageHas({"undefined"}));
    for (const auto& call : {std::function<void()>([&] { undefined.item(); }),
                             std::function<void()>([&] { undefined.reshaped({1}); }),
                             std::function<void()>([&] { dst.copy_from(undefined); })}) {
        try {
            call();
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("shape ()") == std::string::npos);
            CHECK(std::string(e.what()).find(" ()") == std::string::npos);
        }
    }
}

TEST_CASE("an invalid device kind is reported as what it is", "[trust][messages]") {
    const Device bad{static_cast<DeviceKind>(7), 0};
    CHECK(bad.to_string() == "invalid device kind 7");
    CHECK_THROWS_MATCHES(Tensor::zeros({2}, DType::f32, bad), DeviceError, MessageHas({"invalid device kind 7"}));
    CHECK_THROWS_MATCHES(Tensor::zeros({2}).to(bad), DeviceError, MessageHas({"invalid device kind 7"}));
}

TEST_CASE("read_idx with a bad rank argument is a ValueError about the argument", "[trust][messages][data]") {
    // The file does not exist: the argument is checked first, so the message is about it, not the file.
    for (const int rank : {-1, 0, 256}) {
        INFO(rank);
        CHECK_THROWS_MATCHES(read_idx("/nonexistent/dir/train-images-idx3-ubyte", rank), ValueError,
                             MessageHas({"read_idx", "rank", std::to_string(rank), "1 to 255"}));
    }
}
