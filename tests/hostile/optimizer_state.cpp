// Hostile inputs to the optimizers' state accessors (SGD::momentum_buffer, Adam::exp_avg / exp_avg_sq /
// step_count): an index past the parameter list is an IndexError naming the optimizer, the index and the count.
#include <cstddef>
#include <limits>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

std::vector<Parameter> two_parameters() {
    Generator gen(31);
    return {Parameter(Tensor::normal({3}, 0, 1, gen), "w"), Parameter(Tensor::normal({2, 2}, 0, 1, gen), "b")};
}

constexpr std::size_t kHuge = std::numeric_limits<std::size_t>::max();

const bool added = hostile::add(
    "optimizer state",
    {
        hostile::expect<IndexError>("SGD momentum_buffer one past the last parameter", {"SGD", "2", "2 parameters"},
                                    [] { SGD(two_parameters(), {.momentum = 0.9}).momentum_buffer(2); }),
        hostile::expect<IndexError>("SGD momentum_buffer at SIZE_MAX", {"SGD", "18446744073709551615"},
                                    [] { SGD(two_parameters()).momentum_buffer(kHuge); }),
        hostile::expect<IndexError>("SGD over no parameters, momentum_buffer(0)", {"SGD", "0 parameters"},
                                    [] { SGD(std::vector<Parameter>{}, {.momentum = 0.5}).momentum_buffer(0); }),
        hostile::expect<IndexError>("Adam exp_avg one past the last parameter", {"Adam", "2", "2 parameters"},
                                    [] { Adam(two_parameters()).exp_avg(2); }),
        hostile::expect<IndexError>("Adam exp_avg_sq far past the end", {"Adam", "1000"},
                                    [] { Adam(two_parameters()).exp_avg_sq(1000); }),
        hostile::expect<IndexError>("Adam step_count at SIZE_MAX", {"Adam", "18446744073709551615"},
                                    [] { Adam(two_parameters()).step_count(kHuge); }),
        hostile::expect<IndexError>("AdamW exp_avg one past the last parameter", {"AdamW", "2 parameters"},
                                    [] { AdamW(two_parameters(), {.weight_decay = 0.01}).exp_avg(2); }),
        hostile::expect<IndexError>("AdamW step_count over no parameters", {"AdamW", "0 parameters"},
                                    [] { AdamW(std::vector<Parameter>{}).step_count(0); }),
    });

}  // namespace
