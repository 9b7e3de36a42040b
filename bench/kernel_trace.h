// Per-kernel device times of whole training steps, from CUPTI's activity trace (the records torch.profiler reads
// for PyTorch): dyngrad-perf --kernel-times. Nsight Systems is not on the lent machines and ncu times each kernel
// alone (serialised, caches flushed), which says nothing about the gaps between the kernels of a replayed graph;
// the trace keeps both. Built with CUPTI when CMake finds it (CUDA::cupti); otherwise kernel_trace_available()
// is false and starting a trace throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dyngrad::bench {

// One kernel, memset or copy that ran on the device.
struct DeviceActivity {
    enum class Kind { kernel, memset, memcpy };
    Kind kind = Kind::kernel;
    std::string name;  // demangled, without the parameter list ("memset" / "memcpy" for the others)
    std::uint64_t start_ns = 0, end_ns = 0;
    std::uint32_t stream = 0;
};

bool kernel_trace_available();

// A kernel's symbol as a reader wants it: "_Z6kernelIfLi4EEvPfi" -> "kernel<float, 4>" (demangled, no return type,
// no parameter list); names that are not C++ symbols ("nvjet_sm90_tst_…", Triton's) unchanged.
std::string readable_kernel_name(const char* mangled);

// The trace: start() before the steps, mark() after each one (the device synchronised), stop() collects.
// One trace at a time in a process (CUPTI's activity buffers are process-wide).
class KernelTrace {
public:
    KernelTrace();  // enables the trace; throws dyngrad::Error where CUPTI is absent or refuses
    ~KernelTrace();
    KernelTrace(const KernelTrace&) = delete;
    KernelTrace& operator=(const KernelTrace&) = delete;

    // A boundary between two steps, on the clock of the activity records (call it with the device idle).
    void mark();
    // Flushes CUPTI's buffers and splits the activities by the marks: element i holds what ran between mark i-1
    // (the start for i = 0) and mark i, sorted by start. Activities after the last mark are dropped.
    std::vector<std::vector<DeviceActivity>> stop();

private:
    std::vector<std::uint64_t> marks_;
    bool running_ = false;
};

// What the steps of one trace spent, each figure the median over the steps.
struct StepKernelTimes {
    std::size_t steps = 0;
    double kernels = 0, memsets = 0, memcpys = 0;  // per step
    double kernel_us = 0;                           // the sum of the kernels' durations
    double busy_us = 0;                             // the union of all activities' intervals (side lanes overlap)
    double span_us = 0;                             // first start to last end
    double idle_us() const { return span_us - busy_us; }
    // Per position in the step (the steps must launch the same sequence; else empty): name and median duration.
    std::vector<std::pair<std::string, double>> per_kernel_us;
    // Per name (kernels; memsets and copies as "memset" and "memcpy"), most time first: how many ran and their
    // summed duration, each the mean per step (steps may differ in sequence: side lanes, collectives).
    struct NameTotal {
        std::string name;
        double count = 0;
        double us = 0;
    };
    std::vector<NameTotal> by_name;
};

StepKernelTimes summarize(const std::vector<std::vector<DeviceActivity>>& steps);

// "kernels NAME MODE: N per step, X us of kernel time, busy B us, span S us, idle I us (median of R steps)", and
// with `verbose` one line per kernel: its median duration and name. The first line's words match
// bench/torch_reference.py --kernel-counts, so the two outputs line up.
void print_kernel_times(const std::string& workload, const std::string& mode, const StepKernelTimes& times,
                        bool verbose);
// The first `most` names of times.by_name, one line each: "    by name: <us per step> us  <count per step>x  <name>".
void print_kernels_by_name(const StepKernelTimes& times, std::size_t most);

}  // namespace dyngrad::bench
