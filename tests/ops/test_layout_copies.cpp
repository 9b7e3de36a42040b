// The layout copies behind the GPT's attention heads (issue 16, branch gpt-perf): collapsed strided walks,
// permute/expand through them on the CPU, narrow's backward adding into the gradient so far in place, and the
// engine's accumulation adding into whichever gradient it owns alone.
#include <cstdint>
#include <cstring>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/backend.h"
#include "dyngrad/ops/layout_geometry.h"
#include "dyngrad/ops/strided.h"

using namespace dyngrad;

namespace {

// Every element's offset of a walk, without collapsing (the reference order).
std::vector<std::int64_t> offsets_of(const StridedWalk<1>& walk, std::int64_t n) {
    std::vector<std::int64_t> out(static_cast<std::size_t>(n));
    std::int64_t offset[1];
    for (std::int64_t i = 0; i < n; ++i) {
        walk.offsets(i, offset);
        out[static_cast<std::size_t>(i)] = offset[0];
    }
    return out;
}

std::int64_t walk_numel(const StridedWalk<1>& walk) {
    std::int64_t n = 1;
    for (int d = 0; d < walk.rank; ++d) n *= walk.sizes[d];
    return n;
}

// A random permutation of 0..rank-1.
std::vector<std::int64_t> random_permutation(std::size_t rank, Generator& gen) {
    std::vector<std::int64_t> perm(rank);
    for (std::size_t i = 0; i < rank; ++i) perm[i] = static_cast<std::int64_t>(i);
    for (std::size_t i = rank; i-- > 1;) std::swap(perm[i], perm[gen.engine()() % (i + 1)]);
    return perm;
}

Shape random_shape(std::size_t rank, Generator& gen) {
    Shape shape(rank);
    for (auto& s : shape) s = static_cast<std::int64_t>(1 + gen.engine()() % 5);
    return shape;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// y[i] = x[offset of i] element by element: what permute and expand mean.
Tensor reference_copy(const Tensor& x, const Shape& out, const StridedWalk<1>& walk) {
    Tensor y = Tensor::empty(out, x.dtype());
    const std::size_t size = dtype_size(x.dtype());
    const std::vector<std::int64_t> offsets = offsets_of(walk, y.numel());
    for (std::size_t i = 0; i < offsets.size(); ++i)
        std::memcpy(static_cast<char*>(y.raw_data()) + i * size,
                    static_cast<const char*>(x.raw_data()) + static_cast<std::size_t>(offsets[i]) * size, size);
    return y;
}

}  // namespace

TEST_CASE("a collapsed walk visits the same offsets in the same order with fewer dims", "[layout][strided]") {
    SECTION("the GPT's head permute (B,T,3,H,D) -> (3,B,H,T,D) keeps runs of D") {
        const StridedWalk<1> walk = permute_walk({4, 6, 3, 2, 8}, {2, 0, 3, 1, 4});
        const StridedWalk<1> c = collapsed(walk);
        CHECK(c.rank == 5);
        CHECK(c.sizes[4] == 8);
        CHECK(c.strides[0][4] == 1);
        CHECK(offsets_of(c, walk_numel(c)) == offsets_of(walk, walk_numel(walk)));
    }
    SECTION("the merge permute (B,H,T,D) -> (B,T,H,D)") {
        const StridedWalk<1> walk = permute_walk({2, 3, 5, 4}, {0, 2, 1, 3});
        const StridedWalk<1> c = collapsed(walk);
        CHECK(c.rank == 4);
        CHECK(offsets_of(c, walk_numel(c)) == offsets_of(walk, walk_numel(walk)));
    }
    SECTION("an identity permute is one run") {
        const StridedWalk<1> c = collapsed(permute_walk({3, 4, 5}, {0, 1, 2}));
        CHECK(c.rank == 1);
        CHECK(c.sizes[0] == 60);
        CHECK(c.strides[0][0] == 1);
    }
    SECTION("an expand of (N,1) to (M,N,K) keeps its broadcast dims apart from the read one") {
        const Shape operands[1] = {{5, 1}};
        const StridedWalk<1> walk = broadcast_walk<1>({3, 5, 7}, operands);
        const StridedWalk<1> c = collapsed(walk);
        CHECK(c.rank == 3);
        CHECK(offsets_of(c, walk_numel(c)) == offsets_of(walk, walk_numel(walk)));
    }
    SECTION("random permutes and broadcasts, size-1 dims included") {
        Generator gen(1601);
        for (int trial = 0; trial < 200; ++trial) {
            const std::size_t rank = 1 + gen.engine()() % 6;
            const Shape x = random_shape(rank, gen);
            const std::vector<std::int64_t> dims = random_permutation(rank, gen);
            const StridedWalk<1> walk = permute_walk(x, permutation_of(dims, rank));
            const StridedWalk<1> c = collapsed(walk);
            INFO("x " << to_string(x) << " dims " << to_string(dims));
            CHECK(c.rank <= walk.rank);
            CHECK(offsets_of(c, walk_numel(c)) == offsets_of(walk, walk_numel(walk)));

            Shape small = x;  // x with random axes made 1, broadcast back to x's shape with a new leading axis
            for (auto& s : small)
                if (gen.engine()() % 2) s = 1;
            const Shape operands[1] = {small};
            Shape out = x;
            out.insert(out.begin(), 3);
            const StridedWalk<1> bw = broadcast_walk<1>(out, operands);
            CHECK(offsets_of(collapsed(bw), walk_numel(bw)) == offsets_of(bw, walk_numel(bw)));
        }
    }
}

TEST_CASE("permute and expand copy every dtype exactly through the collapsed walk", "[layout][strided]") {
    Generator gen(1602);
    for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
        for (int trial = 0; trial < 40; ++trial) {
            const std::size_t rank = 1 + gen.engine()() % 5;
            const Shape shape = random_shape(rank, gen);
            const Tensor x = Tensor::normal(shape, 0.0, 1.0, gen, dtype);
            const std::vector<std::int64_t> dims = random_permutation(rank, gen);
            const Tensor y = permute(x, dims);
            INFO(dtype_name(dtype) << " x " << to_string(shape) << " dims " << to_string(dims));
            CHECK(same_bytes(y, reference_copy(x, y.shape(), permute_walk(shape, permutation_of(dims, rank)))));

            Shape small = shape;
            for (auto& s : small)
                if (gen.engine()() % 2) s = 1;
            const Tensor b = Tensor::normal(small, 0.0, 1.0, gen, dtype);
            Shape target = shape;
            target.insert(target.begin(), 2);
            const Shape operands[1] = {small};
            CHECK(same_bytes(expand(b, target), reference_copy(b, target, broadcast_walk<1>(target, operands))));
        }
    }
    // Empty tensors copy nothing and keep their shapes.
    CHECK(permute(Tensor::empty({0, 3, 2}), {2, 0, 1}).shape() == Shape{2, 0, 3});
    CHECK(expand(Tensor::empty({0, 1}), {4, 0, 5}).shape() == Shape{4, 0, 5});
}

TEST_CASE("narrow's backward adds dy into the window of the gradient so far, in place", "[layout][narrow]") {
    Generator gen(1603);
    const OpDef& def = op_def(OpType::Narrow);
    REQUIRE(def.cpu.accumulates_in_place);
    for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
        const Tensor x = Tensor::normal({3, 4, 5}, 0.0, 1.0, gen, dtype);
        OpAttrs attrs;
        attrs.axis = 1;
        attrs.start = 1;
        attrs.length = 2;
        const Tensor dy = Tensor::normal({3, 2, 5}, 0.0, 1.0, gen, dtype);
        const Tensor so_far = Tensor::normal({3, 4, 5}, 0.0, 1.0, gen, dtype);
        const Tensor before = so_far.clone();
        const Tensor inputs[1] = {x};
        const Tensor grads_so_far[1] = {so_far};
        const bool needs[1] = {true};
        const std::vector<Tensor> grads = def.cpu.backward(
            BackwardArgs{OpType::Narrow, inputs, Tensor(), dy, attrs, {}, needs, grads_so_far});
        REQUIRE(grads.size() == 1);
        CHECK(grads[0].raw_data() == so_far.raw_data());  // the same buffer, not a zero-filled one
        // Expected: before + dy in the window, before elsewhere (bf16: summed in f32, rounded once).
        const Tensor b = before.to(DType::f64), d = dy.to(DType::f64), g = grads[0].to(DType::f64);
        for (std::int64_t i = 0; i < 3; ++i)
            for (std::int64_t j = 0; j < 4; ++j)
                for (std::int64_t k = 0; k < 5; ++k) {
                    const bool inside = j >= 1 && j < 3;
                    const double dy_here = inside ? d.at({i, j - 1, k}) : 0.0;
                    // f64 adds in f64; f32 and bf16 in f32 (bf16 then rounded once)
                    const double sum = dtype == DType::f64
                                           ? b.at({i, j, k}) + dy_here
                                           : static_cast<double>(static_cast<float>(b.at({i, j, k})) +
                                                                 static_cast<float>(dy_here));
                    const double expected =
                        Tensor::from_vector(std::vector<double>{sum}, {1}, DType::f64).to(dtype).to(DType::f64).item();
                    CHECK(g.at({i, j, k}) == expected);
                }
    }
}

TEST_CASE("the q, k, v slices of one tensor get their gradients in one buffer", "[layout][narrow]") {
    Generator gen(1604);
    for (const DType dtype : {DType::f32, DType::f64}) {
        ComputeGraph graph;
        const Tensor value = Tensor::normal({3, 2, 4, 5}, 0.0, 1.0, gen, dtype);
        const Var heads = graph.input(value, "heads", true);
        const Tensor wq = Tensor::normal({2, 4, 5}, 0.0, 1.0, gen, dtype);
        const Tensor wk = Tensor::normal({2, 4, 5}, 0.0, 1.0, gen, dtype);
        const Tensor wv = Tensor::normal({2, 4, 5}, 0.0, 1.0, gen, dtype);
        const Var q = select(heads, 0, 0), k = select(heads, 0, 1), v = select(heads, 0, 2);
        const Var loss = sum(add(add(mul(q, graph.constant(wq)), mul(k, graph.constant(wk))), mul(v, graph.constant(wv))));
        graph.backward(loss);
        INFO(dtype_name(dtype));
        CHECK(same_bytes(heads.grad(), concat({wq.reshaped({1, 2, 4, 5}), wk.reshaped({1, 2, 4, 5}),
                                               wv.reshaped({1, 2, 4, 5})},
                                              0)));
    }
}

TEST_CASE("accumulation adds into the gradient it owns alone instead of copying a shared one", "[graph][accumulate]") {
    Generator gen(1605);
    Tensor shared = Tensor::normal({4, 6}, 0.0, 1.0, gen);
    const Tensor other_handle = shared;  // e.g. add's backward handing one dy to both of its inputs
    const Tensor kept = shared.clone();
    Tensor fresh = Tensor::normal({4, 6}, 0.0, 1.0, gen);
    const void* fresh_storage = fresh.raw_data();
    const Tensor fresh_value = fresh.clone();
    Tensor slot = shared;
    accumulate_into(slot, std::move(fresh));
    CHECK(slot.raw_data() == fresh_storage);  // no clone of the shared gradient
    CHECK(same_bytes(other_handle, kept));    // and the shared one is left as it was
    for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = 0; j < 6; ++j)
            CHECK(slot.at({i, j}) == static_cast<float>(kept.at({i, j})) + static_cast<float>(fresh_value.at({i, j})));
}
