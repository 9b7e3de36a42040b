// Tensor: factories, shapes of rank 0..4, storage sharing, element access, dtype conversion,
// printing, the indexing methods, and the errors of bad arguments.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <random>
#include <source_location>
#include <sstream>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;
using dgtest::Approx;
using dgtest::ApproxVector;
using dgtest::MessageHas;

TEST_CASE("zeros, ones and full fill every element", "[tensor][factory]") {
    const Tensor z = Tensor::zeros({2, 3});
    CHECK(z.shape() == Shape{2, 3});
    CHECK(z.dtype() == DType::f32);
    CHECK(z.device() == Device::cpu());
    CHECK(z.numel() == 6);
    CHECK(z.nbytes() == 24);
    CHECK(z.to_vector() == std::vector<double>(6, 0.0));

    const Tensor o = Tensor::ones({4}, DType::f64);
    CHECK(o.dtype() == DType::f64);
    CHECK(o.nbytes() == 32);
    CHECK(o.to_vector() == std::vector<double>(4, 1.0));

    const Tensor f = Tensor::full({3, 1}, -2.5, DType::f64);
    CHECK(f.to_vector() == std::vector<double>(3, -2.5));

    const Tensor i = Tensor::full({2}, 7, DType::i64);
    CHECK(i.dtype() == DType::i64);
    CHECK(i.data<std::int64_t>()[1] == 7);
}

TEST_CASE("arange covers [start, stop) in steps", "[tensor][factory]") {
    CHECK(Tensor::arange(0, 5).to_vector() == std::vector<double>{0, 1, 2, 3, 4});
    CHECK(Tensor::arange(0, 5).shape() == Shape{5});
    CHECK(Tensor::arange(1, 2, 0.25, DType::f64).to_vector() == std::vector<double>{1, 1.25, 1.5, 1.75});
    CHECK(Tensor::arange(5, 0, -2).to_vector() == std::vector<double>{5, 3, 1});
    CHECK(Tensor::arange(3, 3).numel() == 0);
    CHECK(Tensor::arange(0, 4, 1, DType::i64).dtype() == DType::i64);
    CHECK_THROWS_AS(Tensor::arange(0, 1, 0), ValueError);
}

TEST_CASE("from_vector and of take their values in row-major order", "[tensor][factory]") {
    const Tensor d = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);
    CHECK(d.shape() == Shape{2, 3});
    CHECK(d.at({0, 2}) == 3);
    CHECK(d.at({1, 0}) == 4);

    const Tensor f = Tensor::from_vector(std::vector<float>{0.5f, 1.5f}, {2, 1});
    CHECK(f.dtype() == DType::f32);
    CHECK(f.at({1, 0}) == 1.5);

    const Tensor i = Tensor::from_vector(std::vector<std::int64_t>{3, -1, 4}, {3});
    CHECK(i.dtype() == DType::i64);
    CHECK(i.to_vector() == std::vector<double>{3, -1, 4});

    const Tensor o = Tensor::of({1, 2, 3});
    CHECK(o.shape() == Shape{3});
    CHECK(o.dtype() == DType::f32);
    CHECK(o.to_vector() == std::vector<double>{1, 2, 3});
    CHECK(Tensor::of({0.25}, DType::f64).dtype() == DType::f64);

    const Tensor scalar = Tensor::from_vector(std::vector<double>{42}, {});
    CHECK(scalar.rank() == 0);
    CHECK(scalar.item() == 42);
}

TEST_CASE("seeded random factories are reproducible and differ across seeds", "[tensor][factory]") {
    Generator a(7), b(7), c(8);
    const Tensor ua = Tensor::uniform({1000}, -1.0, 3.0, a, DType::f64);
    const Tensor ub = Tensor::uniform({1000}, -1.0, 3.0, b, DType::f64);
    const Tensor uc = Tensor::uniform({1000}, -1.0, 3.0, c, DType::f64);
    CHECK(ua.to_vector() == ub.to_vector());
    CHECK(ua.to_vector() != uc.to_vector());
    for (double v : ua.to_vector()) {
        REQUIRE(v >= -1.0);
        REQUIRE(v < 3.0);
    }

    const Tensor na = Tensor::normal({20000}, 2.0, 0.5, a, DType::f64);
    const Tensor nb = Tensor::normal({20000}, 2.0, 0.5, b, DType::f64);
    const Tensor nc = Tensor::normal({20000}, 2.0, 0.5, c, DType::f64);
    CHECK(na.to_vector() == nb.to_vector());
    CHECK(na.to_vector() != nc.to_vector());
    double mean = 0, square = 0;
    for (double v : na.to_vector()) mean += v;
    mean /= 20000;
    for (double v : na.to_vector()) square += (v - mean) * (v - mean);
    CHECK(mean == Approx(2.0).margin(0.02));
    CHECK(std::sqrt(square / 20000) == Approx(0.5).margin(0.02));

    // The same draws land in float32 rounded.
    Generator d(7);
    const Tensor u32 = Tensor::uniform({1000}, -1.0, 3.0, d);
    CHECK(u32.dtype() == DType::f32);
    CHECK_THAT(u32.to_vector(), ApproxVector(ua.to_vector(), 1e-6));

    CHECK_THROWS_AS(Tensor::uniform({2}, 1.0, 1.0, a), ValueError);
    CHECK_THROWS_AS(Tensor::normal({2}, 0.0, 0.0, a), ValueError);
}

TEST_CASE("shapes of rank 0 to 4", "[tensor][shape]") {
    const std::vector<Shape> shapes = {{}, {5}, {2, 3}, {2, 3, 4}, {2, 3, 4, 5}};
    for (const Shape& shape : shapes) {
        INFO("shape " << to_string(shape));
        const Tensor t = Tensor::ones(shape, DType::f64);
        CHECK(t.rank() == shape.size());
        CHECK(t.numel() == numel(shape));
        CHECK(t.to_vector().size() == static_cast<std::size_t>(numel(shape)));
        for (std::size_t axis = 0; axis < shape.size(); ++axis) {
            CHECK(t.size(static_cast<std::int64_t>(axis)) == shape[axis]);
            CHECK(t.size(static_cast<std::int64_t>(axis) - static_cast<std::int64_t>(shape.size())) == shape[axis]);
        }
        CHECK_THROWS_AS(t.size(static_cast<std::int64_t>(shape.size())), ShapeError);
    }
    const Tensor scalar = Tensor::full({}, 3.5, DType::f64);
    CHECK(scalar.numel() == 1);
    CHECK(scalar.item() == 3.5);
    CHECK(scalar.at({}) == 3.5);
    CHECK(to_string(Shape{}) == "()");
    CHECK(to_string(Shape{64, 784}) == "(64,784)");
    CHECK(contiguous_strides({2, 3, 4}) == std::vector<std::int64_t>{12, 4, 1});
    CHECK(broadcast_shapes({4, 1}, {1, 6}) == Shape{4, 6});
    CHECK(broadcast_shapes({2, 3, 4, 5}, {1, 3, 1, 1}) == Shape{2, 3, 4, 5});
    CHECK(broadcast_shapes({7}, {}) == Shape{7});
    CHECK_THROWS_MATCHES(broadcast_shapes({3, 4}, {5}), ShapeError, MessageHas({"(3,4)", "(5)"}));
    CHECK(normalize_axis(-1, 3) == 2);
    CHECK_THROWS_AS(normalize_axis(3, 3), ShapeError);
    CHECK_THROWS_AS(normalize_axis(-4, 3), ShapeError);
}

TEST_CASE("empty tensors have zero elements", "[tensor][shape]") {
    const Tensor e = Tensor::zeros({0, 3});
    CHECK(e.numel() == 0);
    CHECK(e.nbytes() == 0);
    CHECK(e.to_vector().empty());
    CHECK(e.clone().shape() == Shape{0, 3});
    CHECK(e.reshaped({3, 0}).shape() == Shape{3, 0});
}

TEST_CASE("copies share storage, clone does not", "[tensor][storage]") {
    Tensor a = Tensor::of({1, 2, 3}, DType::f64);
    CHECK(a.owns_storage_exclusively());
    Tensor b = a;
    CHECK(b.shares_storage_with(a));
    CHECK_FALSE(a.owns_storage_exclusively());
    b.set({1}, 20);
    CHECK(a.at({1}) == 20);
    CHECK(a.raw_data() == b.raw_data());

    Tensor c = a.clone();
    CHECK_FALSE(c.shares_storage_with(a));
    CHECK(c.to_vector() == a.to_vector());
    c.set({0}, -5);
    CHECK(a.at({0}) == 1);

    // to() onto the same device or dtype returns a handle to the same storage.
    CHECK(a.to(Device::cpu()).shares_storage_with(a));
    CHECK(a.to(DType::f64).shares_storage_with(a));
    CHECK_FALSE(a.to(DType::f32).shares_storage_with(a));

    Tensor d = Tensor::zeros({3}, DType::f64);
    d.copy_from(a);
    CHECK(d.to_vector() == std::vector<double>{1, 20, 3});
    CHECK_FALSE(d.shares_storage_with(a));
    d.fill(9);
    CHECK(d.to_vector() == std::vector<double>{9, 9, 9});
    CHECK(a.at({0}) == 1);
    CHECK_THROWS_AS(d.copy_from(Tensor::zeros({4}, DType::f64)), ShapeError);
    CHECK_THROWS_AS(d.copy_from(Tensor::zeros({3}, DType::f32)), ShapeError);
}

TEST_CASE("reshaped shares storage under a new shape of the same numel", "[tensor][storage]") {
    const Tensor a = Tensor::arange(0, 12, 1, DType::f64);
    const Tensor r = a.reshaped({3, 4});
    CHECK(r.shape() == Shape{3, 4});
    CHECK(r.shares_storage_with(a));
    CHECK(r.at({2, 1}) == 9);
    CHECK(a.shape() == Shape{12});
    CHECK(a.reshaped({2, 3, 2}).at({1, 2, 0}) == 10);
    CHECK(a.reshaped({12, 1, 1, 1}).rank() == 4);
    CHECK(Tensor::full({1}, 2.0).reshaped({}).rank() == 0);
    CHECK_THROWS_MATCHES(a.reshaped({5, 2}), ShapeError, MessageHas({"(12)", "(5,2)"}));
    CHECK_THROWS_AS(a.reshaped({-3, -4}), ValueError);
}

TEST_CASE("at, set and item", "[tensor][access]") {
    Tensor t = Tensor::zeros({2, 3, 4}, DType::f64);
    t.set({1, 2, 3}, 6.25);
    CHECK(t.at({1, 2, 3}) == 6.25);
    CHECK(t.data<double>()[23] == 6.25);
    t.set({0, 0, 1}, -1);
    CHECK(t.to_vector()[1] == -1);

    Tensor f = Tensor::zeros({2}, DType::f32);
    f.set({1}, 0.1);
    CHECK(f.at({1}) == Approx(0.1).epsilon(1e-7));
    CHECK(f.data<float>()[1] == 0.1f);

    Tensor i = Tensor::zeros({2}, DType::i64);
    i.set({0}, 5);
    CHECK(i.at({0}) == 5);

    CHECK(Tensor::full({1, 1}, 4.0).item() == 4);
    CHECK_THROWS_AS(t.item(), ShapeError);
}

TEST_CASE("to(DType) converts values and round-trips", "[tensor][dtype]") {
    const Tensor d = Tensor::of({1.5, -2.25, 1e-3, 3e5}, DType::f64);
    const Tensor f = d.to(DType::f32);
    CHECK(f.dtype() == DType::f32);
    CHECK(f.shape() == d.shape());
    CHECK(f.to(DType::f64).to_vector() == std::vector<double>{1.5, -2.25, static_cast<float>(1e-3), 3e5});

    // float32 → float64 → float32 is exact.
    const Tensor back = f.to(DType::f64).to(DType::f32);
    CHECK(back.to_vector() == f.to_vector());

    // Conversion to int64 truncates toward zero; back to float is exact for small integers.
    const Tensor i = Tensor::of({2.7, -2.7, 0, 41}, DType::f64).to(DType::i64);
    CHECK(i.dtype() == DType::i64);
    CHECK(i.to_vector() == std::vector<double>{2, -2, 0, 41});
    CHECK(i.to(DType::f32).to_vector() == std::vector<double>{2, -2, 0, 41});

    const Tensor m = Tensor::arange(0, 6, 1, DType::f64).reshaped({2, 3}).to(DType::f32);
    CHECK(m.shape() == Shape{2, 3});
    CHECK(m.at({1, 2}) == 5);
}

TEST_CASE("dtype names and sizes", "[tensor][dtype]") {
    CHECK(dtype_name(DType::f32) == "float32");
    CHECK(dtype_name(DType::f64) == "float64");
    CHECK(dtype_name(DType::i64) == "int64");
    CHECK(dtype_size(DType::f32) == 4);
    CHECK(dtype_size(DType::f64) == 8);
    CHECK(dtype_size(DType::i64) == 8);
    CHECK(is_floating(DType::f32));
    CHECK_FALSE(is_floating(DType::i64));
    CHECK(Device::cpu().to_string() == "cpu");
    CHECK(Device::cuda(1).to_string() == "cuda:1");
}

TEST_CASE("printing shows values, and dtype and device where not the default", "[tensor][print]") {
    // The full format (PyTorch's nested printing) is tests/core/test_inplace_mask.cpp's.
    const Tensor t = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6.5}, {2, 3});
    std::ostringstream out;
    out << t;
    const std::string text = out.str();
    INFO(text);
    CHECK_THAT(text, dgtest::Contains("6.5000"));
    CHECK(describe(t) == "(2,3) float32 cpu");

    std::ostringstream big;
    big << Tensor::zeros({100, 100}, DType::f64);
    CHECK_THAT(big.str(), dgtest::Contains("dtype=dyngrad.float64"));
    CHECK_THAT(big.str(), dgtest::Contains("..."));

    std::ostringstream none;
    none << Tensor();
    CHECK_THAT(none.str(), dgtest::Contains("undefined"));

    std::ostringstream labels;
    labels << Tensor::from_vector(std::vector<std::int64_t>{3, 1}, {2});
    CHECK_THAT(labels.str(), dgtest::Contains("[3, 1]"));
}

TEST_CASE("bad arguments throw typed errors", "[tensor][errors]") {
    Tensor t = Tensor::zeros({2, 3});
    SECTION("out-of-range index") {
        CHECK_THROWS_MATCHES(t.at({2, 0}), IndexError, MessageHas({"2", "(2,3)"}));
        CHECK_THROWS_AS(t.at({0, -1}), IndexError);
        CHECK_THROWS_AS(t.set({0, 3}, 1.0), IndexError);
        CHECK_THROWS_AS(t.at({0}), IndexError);
        CHECK_THROWS_AS(t.at({0, 0, 0}), IndexError);
    }
    SECTION("from_vector size mismatch") {
        CHECK_THROWS_MATCHES(Tensor::from_vector(std::vector<double>{1, 2, 3}, {2, 2}), ValueError,
                             MessageHas({"3", "(2,2)"}));
        CHECK_THROWS_AS(Tensor::from_vector(std::vector<float>{1}, {2}), ValueError);
        CHECK_THROWS_AS(Tensor::from_vector(std::vector<std::int64_t>{1, 2}, {3}), ValueError);
    }
    SECTION("negative dims") {
        CHECK_THROWS_MATCHES(Tensor::zeros({2, -1}), ValueError, MessageHas({"(2,-1)", "negative"}));
        CHECK_THROWS_AS(Tensor::empty({-5}), ValueError);
        CHECK_THROWS_AS(Tensor::full({-1, -1}, 1.0), ValueError);
        CHECK_THROWS_AS(Tensor::from_vector(std::vector<double>{1, 2}, {-1, -2}), ValueError);
    }
    SECTION("data<T>() with the wrong T") {
        CHECK_THROWS_MATCHES(t.data<double>(), DTypeError, MessageHas({"float32", "float64"}));
        CHECK_THROWS_AS(t.data<std::int64_t>(), DTypeError);
        CHECK_NOTHROW(t.data<float>());
    }
    SECTION("undefined tensor") {
        const Tensor u;
        CHECK_FALSE(u.defined());
        CHECK(u.numel() == 0);
        CHECK_THROWS_AS(u.raw_data(), ValueError);
        CHECK_THROWS_AS(u.to(DType::f64), ValueError);
        CHECK_THROWS_AS(u.to(Device::cpu()), ValueError);
    }
}

TEST_CASE("a CUDA tensor in a CPU-only build is a DeviceError", "[tensor][errors][device]") {
    if (cuda_compiled()) DG_SKIP("only meaningful in a build without the CUDA backend");
    CHECK(cuda_device_count() == 0);
    CHECK_THROWS_MATCHES(Tensor::zeros({2}, DType::f32, Device::cuda(0)), DeviceError, MessageHas({"cuda:0"}));
    CHECK_THROWS_AS(Tensor::empty({2}, DType::f32, Device::cuda(0)), DeviceError);
    CHECK_THROWS_AS(Tensor::of({1, 2}).to(Device::cuda(0)), DeviceError);
    CHECK_THROWS_AS(Tensor::from_vector(std::vector<double>{1}, {1}, DType::f32, Device::cuda(0)), DeviceError);
    CHECK_THROWS_AS(cuda::memory_stats(0), DeviceError);
    CHECK_THROWS_AS(cuda::synchronize(0), DeviceError);
}

namespace {

// Random values of `dtype` (integers in [-50, 50] for int64), so that every element of a window is told apart.
Tensor random_tensor(const Shape& shape, DType dtype, Generator& gen) {
    std::vector<double> values = Tensor::normal(shape, 0.0, 20.0, gen, DType::f64).to_vector();
    if (dtype == DType::i64)
        for (double& v : values) v = std::clamp(std::round(v), -50.0, 50.0);
    return Tensor::from_vector(values, shape, dtype);
}

// The multi-index of flat (row-major) element `flat` of `shape`.
std::vector<std::int64_t> index_of(std::int64_t flat, const Shape& shape) {
    std::vector<std::int64_t> index(shape.size());
    for (std::size_t i = shape.size(); i-- > 0;) {
        index[i] = flat % shape[i];
        flat /= shape[i];
    }
    return index;
}

// The dynamic type and text of what `call` throws ("no error" when it returns).
template <typename Call>
std::string error_of(Call call) {
    try {
        call();
    } catch (const std::exception& e) {
        return std::string(typeid(e).name()) + ": " + e.what();
    }
    return "no error";
}

}  // namespace

// Tensor's indexing methods (core/tensor_indexing.cpp) on random shapes, axes and windows in every dtype: each
// element against its source element read with at(), and against the layout functions (the eager ops).
TEST_CASE("select and narrow copy their window; squeeze, unsqueeze and flatten are views", "[tensor][indexing]") {
    Generator gen(20261129);
    const auto draw = [&](std::int64_t low, std::int64_t high) {
        return std::uniform_int_distribution<std::int64_t>(low, high)(gen.engine());
    };
    for (const DType dtype : {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16}) {
        for (int trial = 0; trial < 24; ++trial) {
            Shape shape;
            const std::int64_t rank = 1 + trial % 4;
            for (std::int64_t i = 0; i < rank; ++i) shape.push_back(draw(trial % 5 == 4 ? 0 : 1, 5));
            const Tensor x = random_tensor(shape, dtype, gen);
            const std::int64_t axis = draw(-rank, rank - 1);
            const auto a = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
            const std::int64_t n = shape[a];
            INFO(dtype_name(dtype) << " " << to_string(shape) << " axis " << axis);

            const std::int64_t start = draw(0, n), length = draw(0, n - start);
            INFO("narrow start " << start << " length " << length);
            const Tensor window = x.narrow(axis, start, length);
            Shape window_shape = shape;
            window_shape[a] = length;
            REQUIRE(window.shape() == window_shape);
            CHECK(window.dtype() == dtype);
            CHECK_FALSE(window.shares_storage_with(x));
            for (std::int64_t k = 0; k < window.numel(); ++k) {
                std::vector<std::int64_t> at = index_of(k, window_shape);
                const double value = window.at(at);
                at[a] += start;
                CHECK(value == x.at(at));
            }
            CHECK(equal(window, narrow(x, axis, start, length)));

            if (n > 0) {
                const std::int64_t index = draw(-n, n - 1);
                INFO("select index " << index);
                const Tensor row = x.select(axis, index);
                Shape row_shape = shape;
                row_shape.erase(row_shape.begin() + static_cast<std::ptrdiff_t>(a));
                REQUIRE(row.shape() == row_shape);
                CHECK_FALSE(row.shares_storage_with(x));
                for (std::int64_t k = 0; k < row.numel(); ++k) {
                    std::vector<std::int64_t> at = index_of(k, row_shape);
                    const double value = row.at(at);
                    at.insert(at.begin() + static_cast<std::ptrdiff_t>(a), index < 0 ? index + n : index);
                    CHECK(value == x.at(at));
                }
                CHECK(equal(row, select(x, axis, index)));
            }

            const std::int64_t new_axis = draw(-rank - 1, rank);
            const Tensor unsqueezed = x.unsqueeze(new_axis);
            CHECK(unsqueezed.shares_storage_with(x));
            CHECK(unsqueezed.shape() == unsqueeze(x, new_axis).shape());
            CHECK(unsqueezed.size(new_axis) == 1);
            const Tensor squeezed = unsqueezed.squeeze(new_axis);
            CHECK(squeezed.shares_storage_with(x));
            CHECK(squeezed.shape() == shape);
            const std::int64_t first = draw(0, rank - 1), last = draw(first, rank - 1);
            const Tensor flat = x.flatten(first, last - rank);  // the end axis counted from the end
            CHECK(flat.shares_storage_with(x));
            CHECK(flat.shape() == flatten(x, first, last).shape());
            CHECK(flat.rank() == static_cast<std::size_t>(rank - (last - first)));
        }
    }
}

TEST_CASE("the indexing methods' errors are the layout functions', word for word", "[tensor][indexing][errors]") {
    Generator gen(20261130);
    const Tensor x = Tensor::normal({3, 4}, 0.0, 1.0, gen);
    const Tensor labels = random_tensor({3, 4}, DType::i64, gen);
    const std::source_location here = std::source_location::current();
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    const std::pair<std::int64_t, std::int64_t> narrow_windows[] = {{3, 2}, {-1, 2}, {0, -2}, {kMax, 1}, {5, 0}};
    for (const auto& [start, length] : narrow_windows) {
        INFO("narrow start " << start << " length " << length);
        const std::string method = error_of([&] { x.narrow(1, start, length, here); });
        CHECK(method == error_of([&] { narrow(x, 1, start, length, here); }));
        CHECK(method != "no error");
    }
    CHECK(error_of([&] { x.narrow(2, 0, 1, here); }) == error_of([&] { narrow(x, 2, 0, 1, here); }));
    const std::pair<std::int64_t, std::int64_t> select_calls[] = {{0, 3}, {1, -5}, {2, 0}, {-3, 0},
                                                                   {0, std::numeric_limits<std::int64_t>::min()}};
    for (const auto& [axis, index] : select_calls) {
        INFO("select axis " << axis << " index " << index);
        CHECK(error_of([&] { x.select(axis, index, here); }) == error_of([&] { select(x, axis, index, here); }));
        CHECK(error_of([&] { labels.select(axis, index, here); }) ==
              error_of([&] { select(labels, axis, index, here); }));
    }
    CHECK(error_of([&] { Tensor::full({}, 1.0).select(0, 0, here); }) ==
          error_of([&] { select(Tensor::full({}, 1.0), 0, 0, here); }));
    for (const std::int64_t axis : {0, 1, 2, -3}) {
        INFO("axis " << axis);
        CHECK(error_of([&] { x.squeeze(axis, here); }) == error_of([&] { squeeze(x, axis, here); }));
    }
    for (const std::int64_t axis : {3, -4}) {
        INFO("axis " << axis);
        CHECK(error_of([&] { x.unsqueeze(axis, here); }) == error_of([&] { unsqueeze(x, axis, here); }));
    }
    for (const auto& [first, last] : {std::pair<std::int64_t, std::int64_t>{1, 0}, {0, 2}, {-3, 1}}) {
        INFO("flatten " << first << ".." << last);
        CHECK(error_of([&] { x.flatten(first, last, here); }) == error_of([&] { flatten(x, first, last, here); }));
    }
    // The types and the parts of the texts users rely on.
    CHECK_THROWS_MATCHES(x.narrow(1, 3, 2), IndexError, MessageHas({"narrow (eager at", "[3, 5)", "axis 1", "size 4"}));
    CHECK_THROWS_MATCHES(x.narrow(1, kMax, 1), IndexError, MessageHas({"narrow (eager at", "+ 1)"}));
    CHECK_THROWS_MATCHES(x.narrow(0, 1, -2), ValueError, MessageHas({"narrow (eager at", "length -2"}));
    CHECK_THROWS_MATCHES(x.narrow(-3, 0, 1), ShapeError, MessageHas({"narrow (eager at", "(3,4) float32 cpu"}));
    CHECK_THROWS_MATCHES(labels.select(0, 3), IndexError, MessageHas({"select at", "index 3", "size 3", "int64"}));
    CHECK_THROWS_MATCHES(x.select(1, -5), IndexError, MessageHas({"select at", "index -5", "(valid: -4 to 3)"}));
    CHECK_THROWS_MATCHES(x.select(2, 0), ShapeError, MessageHas({"select at", "axis 2", "(3,4)"}));
    CHECK_THROWS_MATCHES(x.squeeze(1), ShapeError, MessageHas({"squeeze at", "axis 1", "size 4, not 1"}));
    CHECK_THROWS_MATCHES(x.unsqueeze(-4), ShapeError, MessageHas({"unsqueeze at", "axis -4", "(valid: -3 to 2)"}));
    CHECK_THROWS_MATCHES(x.flatten(1, 0), ShapeError, MessageHas({"flatten at", "start axis 1", "end axis 0"}));
    // An undefined tensor: the method named.
    const Tensor undefined;
    CHECK_THROWS_MATCHES(undefined.select(0, 0), ValueError, MessageHas({"select (eager at", "undefined"}));
    CHECK_THROWS_MATCHES(undefined.narrow(0, 0, 1), ValueError, MessageHas({"narrow (eager at", "undefined"}));
    CHECK_THROWS_MATCHES(undefined.squeeze(0), ValueError, MessageHas({"squeeze (eager at", "undefined"}));
    CHECK_THROWS_MATCHES(undefined.unsqueeze(0), ValueError, MessageHas({"unsqueeze (eager at", "undefined"}));
    CHECK_THROWS_MATCHES(undefined.flatten(), ValueError, MessageHas({"flatten (eager at", "undefined"}));
}

// The methods are core's copies and views, outside the op dispatch (docs/ops.md, Indexing): anomaly mode checks
// the layout functions' results, as every eager op's, and not the methods', as not clone()'s or reshaped()'s.
TEST_CASE("anomaly mode checks the layout functions' results, not the indexing methods'", "[tensor][indexing]") {
    Generator gen(20261131);
    Tensor x = Tensor::normal({4, 5}, 0.0, 1.0, gen);
    x.set({2, 3}, std::numeric_limits<double>::quiet_NaN());
    const AnomalyModeGuard anomaly;
    CHECK(std::isnan(x.select(0, 2).at({3})));
    CHECK(std::isnan(x.narrow(1, 3, 1).at({2, 0})));
    CHECK_NOTHROW(x.unsqueeze(0));
    CHECK_NOTHROW(x.flatten());
    CHECK_THROWS_MATCHES(select(x, 0, 2), NumericalError, MessageHas({"anomaly mode", "NaN"}));
    CHECK_THROWS_MATCHES(narrow(x, 1, 3, 1), NumericalError, MessageHas({"anomaly mode", "NaN"}));
}

// Storage::release_memory / restore_memory (core/tensor.h; ZeRO-3 frees a unit's gathered parameters this way while
// its recorded graph still holds them): reads in between are a typed error, through windows too; restoring gives
// memory the windows see; external memory and windows cannot be released.
TEST_CASE("a released storage refuses reads and writes until restored; windows follow it", "[tensor][release]") {
    std::mt19937_64 rng(std::random_device{}());
    std::vector<double> values(12);
    for (double& v : values) v = std::uniform_real_distribution<double>(-3, 3)(rng);
    const Tensor base = Tensor::from_vector(values, {3, 4}, DType::f64);
    const Tensor window = base.window(4, {2, 2});  // elements 4..7
    CHECK(window.to_vector() == std::vector<double>(values.begin() + 4, values.begin() + 8));
    CHECK(base.resident());
    base.release_memory();
    base.release_memory();  // a no-op when released
    CHECK_FALSE(base.resident());
    CHECK_FALSE(window.resident());
    CHECK(base.shape() == Shape{3, 4});  // the handle keeps its shape, dtype and device
    CHECK_THROWS_AS(base.to_vector(), ReleasedMemoryError);
    CHECK_THROWS_AS(base.data<double>(), ReleasedMemoryError);
    CHECK_THROWS_MATCHES(window.to_vector(), ReleasedMemoryError, dgtest::MessageHas({"released", "(2,2) float64"}));
    CHECK_THROWS_AS(Tensor::zeros({3, 4}, DType::f64).copy_from(base), ReleasedMemoryError);
    CHECK_THROWS_AS(Tensor(base).fill(1.0), ReleasedMemoryError);
    CHECK_THROWS_AS(window.release_memory(), ValueError);  // a window is released through its base
    base.restore_memory();
    CHECK(base.resident());
    Tensor(base).copy_from(Tensor::from_vector(values, {3, 4}, DType::f64));
    CHECK(window.to_vector() == std::vector<double>(values.begin() + 4, values.begin() + 8));
    CHECK(window.window(1, {2}).to_vector() == std::vector<double>(values.begin() + 5, values.begin() + 7));
    CHECK_THROWS_AS(base.window(9, {2, 2}), ValueError);  // past the end
    std::vector<float> host(4, 1.5f);
    const Tensor external = Tensor::from_external(host.data(), {4}, DType::f32, Device::cpu(), [] {});
    CHECK_THROWS_AS(external.release_memory(), ValueError);
    CHECK(external.to_vector() == std::vector<double>(4, 1.5));
}
