// Hostile inputs to the CPU thread setting (core/parallel.h).
#include <limits>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {
const bool added = hostile::add(
    "threads",
    {
        hostile::expect<ValueError>("set_cpu_threads(0)", {"set_cpu_threads", ">= 1", "0"}, [] { set_cpu_threads(0); }),
        hostile::expect<ValueError>("set_cpu_threads(-3)", {"set_cpu_threads", "-3"}, [] { set_cpu_threads(-3); }),
        hostile::expect<ValueError>("set_cpu_threads(INT_MIN)", {"set_cpu_threads", "-2147483648"},
                                    [] { set_cpu_threads(std::numeric_limits<int>::min()); }),
    });
}  // namespace
