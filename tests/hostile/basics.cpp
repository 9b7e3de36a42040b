// Hostile inputs to tensor factories and graph basics that were already typed before the trust issue.
#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {
const bool added = hostile::add(
    "basics",
    {
        hostile::expect<ValueError>("from_vector with fewer values than the shape holds", {"3", "(2,2)"},
                                    [] { Tensor::from_vector(std::vector<double>{1, 2, 3}, {2, 2}); }),
        hostile::expect<ShapeError>("add of shapes that do not broadcast", {"add", "(3,4)", "(5)"},
                                    [] {
                                        Generator gen(7);
                                        ComputeGraph g;
                                        add(g.input(Tensor::normal({3, 4}, 0, 1, gen)),
                                            g.input(Tensor::normal({5}, 0, 1, gen)));
                                    }),
        hostile::expect<GraphError>("backward from a non-scalar without a gradient", {"backward", "non-scalar"},
                                    [] {
                                        Generator gen(8);
                                        ComputeGraph g;
                                        Var x = g.input(Tensor::normal({3}, 0, 1, gen), "x", true);
                                        g.backward(exp(x));
                                    }),
    });
}  // namespace
