// NVTX ranges around every op's forward and backward dispatch, so Nsight Systems shows the engine's
// timeline: "fwd conv2d #12" and "bwd conv2d #12" (op name, node id) around the kernels they launch.
//
// Off by default; DYNGRAD_NVTX=1 in the environment turns them on when the library loads, and
// set_profiling_ranges() at any time. Switched off, a dispatch pays one predictable branch; in a build
// without CUDA the ranges compile to nothing.
#pragma once
#include <atomic>
#include <cstdint>

namespace dyngrad {

void set_profiling_ranges(bool enabled);
bool profiling_ranges();

namespace detail {
extern std::atomic<bool> g_profiling_ranges;
void push_profiling_range(bool backward, const char* op, std::uint64_t node);
void pop_profiling_range();
}  // namespace detail

// Internal (graph/graph.cpp): one op's forward or backward as an NVTX range, pushed when ranges are on.
class ProfilingRange {
public:
    enum class Pass : bool { Forward, Backward };

    ProfilingRange([[maybe_unused]] Pass pass, [[maybe_unused]] const char* op,
                   [[maybe_unused]] std::uint64_t node) {
#if DYNGRAD_WITH_CUDA
        if (detail::g_profiling_ranges.load(std::memory_order_relaxed)) [[unlikely]] {
            detail::push_profiling_range(pass == Pass::Backward, op, node);
            pushed_ = true;
        }
#endif
    }
    ~ProfilingRange() {
        if (pushed_) [[unlikely]] detail::pop_profiling_range();
    }
    ProfilingRange(const ProfilingRange&) = delete;
    ProfilingRange& operator=(const ProfilingRange&) = delete;

private:
    bool pushed_ = false;  // balances the pop even when ranges are switched off in between
};

}  // namespace dyngrad
