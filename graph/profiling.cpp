// NVTX ranges of op dispatches (graph/profiling.h). NVTX v3 is header-only (CUDA toolkit, <nvtx3/...>):
// with no profiler attached each push/pop returns at once.
#include "dyngrad/graph/profiling.h"

#include <cstdio>

#if DYNGRAD_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

#include "dyngrad/core/environment.h"

namespace dyngrad {

namespace detail {

// DYNGRAD_NVTX is read once, while the library loads.
std::atomic<bool> g_profiling_ranges{environment("DYNGRAD_NVTX") == "1"};

void push_profiling_range(bool backward, const char* op, std::uint64_t node) {
#if DYNGRAD_WITH_CUDA
    char name[128];
    std::snprintf(name, sizeof name, "%s %s #%llu", backward ? "bwd" : "fwd", op,
                  static_cast<unsigned long long>(node));
    nvtxRangePushA(name);
#else
    static_cast<void>(backward);
    static_cast<void>(op);
    static_cast<void>(node);
#endif
}

void pop_profiling_range() {
#if DYNGRAD_WITH_CUDA
    nvtxRangePop();
#endif
}

}  // namespace detail

void set_profiling_ranges(bool enabled) { detail::g_profiling_ranges.store(enabled, std::memory_order_relaxed); }
bool profiling_ranges() { return detail::g_profiling_ranges.load(std::memory_order_relaxed); }

}  // namespace dyngrad
