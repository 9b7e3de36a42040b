// The core pieces the Python front end stands on (python/): tensors over memory dyngrad does not own
// (Tensor::from_external, what DLPack imports wrap) and creation sites of another language (foreign_site,
// what Python callers' lines become).
#include <cstring>
#include <stdexcept>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

TEST_CASE("from_external shares the memory and releases it once, when the last handle goes") {
    Generator gen(7);
    const Tensor source = Tensor::normal({3, 4}, 0.0, 1.0, gen);
    std::vector<float> buffer(source.data<float>(), source.data<float>() + 12);
    int releases = 0;
    {
        Tensor t = Tensor::from_external(buffer.data(), {3, 4}, DType::f32, Device::cpu(), [&] { ++releases; });
        CHECK(t.external());
        CHECK(t.raw_data() == buffer.data());
        buffer[5] = 42.0f;  // the owner's write is the tensor's
        CHECK(t.at({1, 1}) == 42.0);
        t.set({2, 3}, -1.5);  // and the tensor's the owner's
        CHECK(buffer[11] == -1.5f);
        const Tensor copy = t;
        Tensor view = t.reshaped({12});
        t = Tensor();
        CHECK(releases == 0);  // copy and view still hold it
        ComputeGraph graph;  // ops read it like any tensor
        const Var x = graph.input(view, "x", true);
        graph.backward(sum(mul(x, x)));
        CHECK(x.grad().at({5}) == Approx(84.0));
    }
    CHECK(releases == 1);
    CHECK(!Tensor::ones({2}).external());
}

TEST_CASE("from_external refuses bad memory with a ValueError and still releases it") {
    alignas(8) unsigned char bytes[64] = {};
    int releases = 0;
    CHECK_THROWS_AS(Tensor::from_external(bytes + 1, {4}, DType::f32, Device::cpu(), [&] { ++releases; }), ValueError);
    CHECK(releases == 1);
    CHECK_THROWS_AS(Tensor::from_external(nullptr, {4}, DType::f64, Device::cpu(), [&] { ++releases; }), ValueError);
    CHECK(releases == 2);
    CHECK_THROWS_AS(Tensor::from_external(bytes, {-2}, DType::f32, Device::cpu(), [&] { ++releases; }), ValueError);
    CHECK(releases == 3);
    // No elements: a null pointer is fine (an empty NumPy array may have one).
    const Tensor empty = Tensor::from_external(nullptr, {0, 3}, DType::f32, Device::cpu(), [&] { ++releases; });
    CHECK(empty.numel() == 0);
}

TEST_CASE("a release function that throws does not end the process (issue 35)") {
    alignas(8) unsigned char bytes[64] = {};
    int releases = 0;
    {
        // Released when the last handle goes, from Storage's destructor: a throw there was std::terminate.
        const Tensor t = Tensor::from_external(bytes, {4}, DType::f32, Device::cpu(), [&] {
            ++releases;
            throw std::runtime_error("the producer is gone");
        });
        CHECK(t.numel() == 4);
    }
    CHECK(releases == 1);
    // Refused, with the release running while the ValueError unwinds.
    CHECK_THROWS_AS(Tensor::from_external(bytes + 2, {4}, DType::f32, Device::cpu(),
                                          [&] {
                                              ++releases;
                                              throw 42;
                                          }),
                    ValueError);
    CHECK(releases == 2);
}

TEST_CASE("foreign_site names another language's file and line in nodes and errors") {
    const std::source_location where = foreign_site("train.py", "step", 42);
    CHECK(std::strcmp(where.file_name(), "train.py") == 0);
    CHECK(where.line() == 42);
    CHECK(std::strcmp(where.function_name(), "step") == 0);
    // Interned: the same site gives the same strings, which outlive every user.
    CHECK(foreign_site("train.py", "step", 42).file_name() == where.file_name());
    CHECK(describe_site(where) == "train.py:42");

    Generator gen(3);
    ComputeGraph graph;
    const Var a = graph.input(Tensor::normal({2, 3}, 0.0, 1.0, gen), "a", true, foreign_site("model.py", "f", 7));
    const Var b = graph.input(Tensor::normal({2, 3}, 0.0, 1.0, gen), "b", true);
    try {
        matmul(a, b, foreign_site("model.py", "forward", 12));
        FAIL("matmul of (2,3) by (2,3) should have thrown");
    } catch (const ShapeError& e) {
        CHECK(std::string(e.what()).find("model.py:12") != std::string::npos);
    }
    const Var y = relu(a, foreign_site("model.py", "forward", 13));
    CHECK(graph.describe_node(y.id()).find("model.py:13") != std::string::npos);
    CHECK(graph.describe_node(a.id()).find("model.py:7") != std::string::npos);
}
