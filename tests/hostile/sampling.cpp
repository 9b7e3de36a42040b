// Hostile inputs to sorting and sampling (ops/sampling.h): multinomial's invalid weights (NaN, inf, negative, a
// zero row, too few non-zero weights without replacement) and sizes, topk's k, and non-float inputs. Each error
// names the op and what is wrong; a bad row is named by its index.
#include <cstdint>
#include <limits>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor rows(std::vector<double> values, std::int64_t columns) {
    const auto count = static_cast<std::int64_t>(values.size());
    return Tensor::from_vector(values, {count / columns, columns}, DType::f32);
}
Tensor draws(const Tensor& probs, std::int64_t n, bool replacement) {
    return multinomial(probs, n, replacement, std::uint64_t{29});
}

const bool added = hostile::add(
    "sampling",
    {
        hostile::expect<ValueError>("multinomial NaN weight", {"multinomial", "NaN weight", "row 1", "column 0"},
                                    [] { draws(rows({1, 2, kNaN, 1}, 2), 1, true); }),
        hostile::expect<ValueError>("multinomial infinite weight", {"multinomial", "infinite weight", "row 0"},
                                    [] { draws(rows({kInf, 2}, 2), 1, true); }),
        hostile::expect<ValueError>("multinomial negative weight", {"multinomial", "negative weight", "column 1"},
                                    [] { draws(rows({1, -1e-30}, 2), 1, true); }),
        hostile::expect<ValueError>("multinomial all-zero row", {"multinomial", "row 2", "summing to 0"},
                                    [] { draws(rows({1, 0, 0, 1, 0, 0}, 2), 1, true); }),
        hostile::expect<ValueError>("multinomial too few non-zero weights without replacement",
                                    {"multinomial", "fewer non-zero weights"},
                                    [] { draws(rows({1, 0, 0, 3}, 4), 3, false); }),
        hostile::expect<ValueError>("multinomial more samples than categories without replacement",
                                    {"multinomial", "num_samples = 5 > 4"}, [] { draws(rows({1, 1, 1, 1}, 4), 5, false); }),
        hostile::expect<ValueError>("multinomial zero samples", {"multinomial", "num_samples must be positive"},
                                    [] { draws(rows({1, 1}, 2), 0, true); }),
        hostile::expect<ValueError>("multinomial INT64_MIN samples", {"multinomial", "num_samples"},
                                    [] { draws(rows({1, 1}, 2), std::numeric_limits<std::int64_t>::min(), true); }),
        hostile::expect<ShapeError>("multinomial INT64_MAX samples with replacement", {"multinomial"},
                                    [] { draws(rows({1, 1, 1, 1}, 2), std::numeric_limits<std::int64_t>::max(), true); }),
        hostile::expect<ShapeError>("multinomial of rank 3", {"multinomial", "(C) or (N, C)"},
                                    [] { draws(Tensor::ones({2, 2, 2}), 1, true); }),
        hostile::expect<ShapeError>("multinomial of no categories", {"multinomial", "no categories"},
                                    [] { draws(Tensor::ones({3, 0}), 1, true); }),
        hostile::expect<DTypeError>("multinomial of int64 weights", {"multinomial", "int64"},
                                    [] { draws(Tensor::from_vector(std::vector<std::int64_t>{1, 2}, {2}), 1, true); }),
        hostile::expect<ValueError>("topk k above the axis size", {"topk_indices", "k = 4"},
                                    [] { topk(Tensor::ones({2, 3}), 4); }),
        hostile::expect<ValueError>("topk negative k", {"topk_indices", "k = -1"}, [] { topk(Tensor::ones({2, 3}), -1); }),
        hostile::expect<ShapeError>("argsort axis out of range", {"argsort", "axis 2"},
                                    [] { argsort(Tensor::ones({2, 3}), 2); }),
        hostile::expect<DTypeError>("cumsum of int64", {"cumsum", "int64"},
                                    [] { cumsum(Tensor::from_vector(std::vector<std::int64_t>{1, 2}, {2}), 0); }),
    });

}  // namespace
