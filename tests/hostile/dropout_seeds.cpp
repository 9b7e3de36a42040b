// Hostile inputs to dropout's seed-stream form, dropout(x, p, training, DropoutSeeds&) (the Dropout layer's path;
// on a GPU the draw is fused into the dropout kernel): bad drop probabilities in training and evaluation, inputs
// that are not floating point. Each refused call must also draw nothing: the stream's counter stays where it was
// (otherwise the case throws a std::runtime_error, which the catalogue counts as a failure).
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// dropout(x, p, training, seeds) in a graph, on an x of `dtype` (floating ones require grad), after `drawn`
// good draws from the same stream; rethrows the op's error once it has checked that the stream did not move.
void seeded_dropout(DType dtype, double p, bool training = true, int drawn = 0) {
    DropoutSeeds seeds(29);
    Generator gen(31);
    const Tensor x = Tensor::normal({3, 5}, 0.0, 1.0, gen).to(dtype);
    ComputeGraph graph;
    const Var xv = graph.input(x, "x", is_floating(dtype));
    const Var good = graph.input(Tensor::normal({2, 3}, 0.0, 1.0, gen), "good", true);
    for (int i = 0; i < drawn; ++i) dropout(good, 0.5, true, seeds);
    try {
        dropout(xv, p, training, seeds);
    } catch (const Error&) {
        if (seeds.draws() != static_cast<std::uint64_t>(drawn))
            throw std::runtime_error("a refused dropout call advanced its seed stream");
        throw;
    }
}

const bool added = hostile::add(
    "dropout seed stream",
    {
        hostile::expect<ValueError>("seed-stream dropout with p = 1", {"dropout", "p must be in [0, 1)", "1"},
                                    [] { seeded_dropout(DType::f32, 1.0); }),
        hostile::expect<ValueError>("seed-stream dropout with p = 1.5", {"dropout", "p must be in [0, 1)", "1.5"},
                                    [] { seeded_dropout(DType::f32, 1.5); }),
        hostile::expect<ValueError>("seed-stream dropout with p = -0.1", {"dropout", "p must be in [0, 1)", "-0.1"},
                                    [] { seeded_dropout(DType::f32, -0.1); }),
        hostile::expect<ValueError>("seed-stream dropout with p NaN", {"dropout", "p must be in [0, 1)", "nan"},
                                    [] { seeded_dropout(DType::f32, kNaN); }),
        hostile::expect<ValueError>("seed-stream dropout with p +inf", {"dropout", "p must be in [0, 1)", "inf"},
                                    [] { seeded_dropout(DType::f32, kInf); }),
        hostile::expect<ValueError>("seed-stream dropout with p -inf", {"dropout", "p must be in [0, 1)", "-inf"},
                                    [] { seeded_dropout(DType::f32, -kInf); }),
        hostile::expect<ValueError>("seed-stream dropout with p = 1 in evaluation", {"dropout", "p must be in [0, 1)"},
                                    [] { seeded_dropout(DType::f32, 1.0, false); }),
        hostile::expect<ValueError>("seed-stream dropout with p = 2 after three good draws",
                                    {"dropout", "p must be in [0, 1)", "2"},
                                    [] { seeded_dropout(DType::f32, 2.0, true, 3); }),
        hostile::expect<ValueError>("seed-stream f64 dropout with p = 1", {"dropout", "p must be in [0, 1)"},
                                    [] { seeded_dropout(DType::f64, 1.0); }),
        hostile::expect<ValueError>("seed-stream bf16 dropout with p NaN", {"dropout", "p must be in [0, 1)", "nan"},
                                    [] { seeded_dropout(DType::bf16, kNaN); }),
        hostile::expect<ValueError>("seed-stream f16 dropout with p = -0.5", {"dropout", "p must be in [0, 1)"},
                                    [] { seeded_dropout(DType::f16, -0.5); }),
        hostile::expect<DTypeError>("seed-stream dropout of an int64 x", {"dropout", "int64"},
                                    [] { seeded_dropout(DType::i64, 0.5); }),
        hostile::expect<DTypeError>("seed-stream dropout of an int64 x after two good draws", {"dropout", "int64"},
                                    [] { seeded_dropout(DType::i64, 0.5, true, 2); }),
        hostile::expect<DTypeError>("seed-stream dropout of an int64 x in evaluation", {"dropout", "int64"},
                                    [] { seeded_dropout(DType::i64, 0.5, false); }),
    });

}  // namespace
