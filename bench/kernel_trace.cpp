// bench/kernel_trace.h: CUPTI's activity API (buffers handed to CUPTI, records read when it returns them).
#include "kernel_trace.h"

#include <dyngrad/core/error.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string_view>
#include <cstdlib>
#include <memory>
#include <mutex>

#if DYNGRAD_BENCH_CUPTI
#include <cupti.h>
#endif

namespace dyngrad::bench {

// The parameter list repeats the template's arguments: cut.
std::string readable_kernel_name(const char* mangled) {
    if (mangled == nullptr) return "?";
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                           &std::free);
    std::string name = status == 0 && demangled ? demangled.get() : mangled;
    // Cut at the '(' that opens the parameter list: the first one at template depth 0 that is not a namespace's.
    static constexpr std::string_view kAnonymous = "(anonymous namespace)";
    int depth = 0;
    for (std::size_t i = 0; i < name.size(); ++i) {
        if (name.compare(i, kAnonymous.size(), kAnonymous) == 0) i += kAnonymous.size() - 1;
        else if (name[i] == '<') ++depth;
        else if (name[i] == '>') --depth;
        else if (name[i] == '(' && depth == 0 && i > 0) {
            name.resize(i);
            break;
        }
    }
    if (name.rfind("void ", 0) == 0) name.erase(0, 5);
    return name;
}

namespace {

double median(std::vector<double> values) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

}  // namespace

StepKernelTimes summarize(const std::vector<std::vector<DeviceActivity>>& steps) {
    StepKernelTimes out;
    out.steps = steps.size();
    std::vector<double> kernels, memsets, memcpys, kernel_us, busy_us, span_us;
    for (const auto& step : steps) {
        double k = 0, s = 0, c = 0, sum = 0, busy = 0;
        std::uint64_t first = UINT64_MAX, last = 0, covered_to = 0;
        for (const DeviceActivity& a : step) {  // sorted by start: the union is one sweep
            k += a.kind == DeviceActivity::Kind::kernel;
            s += a.kind == DeviceActivity::Kind::memset;
            c += a.kind == DeviceActivity::Kind::memcpy;
            if (a.kind == DeviceActivity::Kind::kernel) sum += static_cast<double>(a.end_ns - a.start_ns) * 1e-3;
            first = std::min(first, a.start_ns);
            last = std::max(last, a.end_ns);
            const std::uint64_t from = std::max(a.start_ns, covered_to);
            if (a.end_ns > from) busy += static_cast<double>(a.end_ns - from) * 1e-3;
            covered_to = std::max(covered_to, a.end_ns);
        }
        kernels.push_back(k);
        memsets.push_back(s);
        memcpys.push_back(c);
        kernel_us.push_back(sum);
        busy_us.push_back(busy);
        span_us.push_back(step.empty() ? 0 : static_cast<double>(last - first) * 1e-3);
    }
    out.kernels = median(kernels);
    out.memsets = median(memsets);
    out.memcpys = median(memcpys);
    out.kernel_us = median(kernel_us);
    out.busy_us = median(busy_us);
    out.span_us = median(span_us);
    std::map<std::string, StepKernelTimes::NameTotal> totals;
    for (const auto& step : steps)
        for (const DeviceActivity& a : step) {
            StepKernelTimes::NameTotal& t = totals[a.name];
            t.count += 1;
            t.us += static_cast<double>(a.end_ns - a.start_ns) * 1e-3;
        }
    for (auto& [name, t] : totals) {
        t.name = name;
        t.count /= static_cast<double>(steps.size());
        t.us /= static_cast<double>(steps.size());
        out.by_name.push_back(t);
    }
    std::sort(out.by_name.begin(), out.by_name.end(), [](const auto& a, const auto& b) { return a.us > b.us; });
    // Per kernel only when every step ran the same kernels. Kernels on side lanes may start in another order from
    // one step to the next, so a kernel is matched by its name and how many of that name came before it.
    if (steps.empty()) return out;
    const auto sorted_names = [](const std::vector<DeviceActivity>& step) {
        std::vector<std::string> n;
        for (const auto& a : step)
            if (a.kind == DeviceActivity::Kind::kernel) n.push_back(a.name);
        std::sort(n.begin(), n.end());
        return n;
    };
    const std::vector<std::string> reference = sorted_names(steps.front());
    if (!std::all_of(steps.begin(), steps.end(), [&](const auto& s) { return sorted_names(s) == reference; }))
        return out;
    // The k-th kernel named `name` of a step (in start order): its duration.
    const auto duration_of = [](const std::vector<DeviceActivity>& step, const std::string& name, std::size_t k) {
        for (const auto& a : step)
            if (a.kind == DeviceActivity::Kind::kernel && a.name == name && k-- == 0)
                return static_cast<double>(a.end_ns - a.start_ns) * 1e-3;
        return 0.0;  // unreachable: the steps hold the same kernels
    };
    std::map<std::string, std::size_t> seen;
    for (const auto& a : steps.front()) {
        if (a.kind != DeviceActivity::Kind::kernel) continue;
        const std::size_t k = seen[a.name]++;
        std::vector<double> us;
        for (const auto& step : steps) us.push_back(duration_of(step, a.name, k));
        out.per_kernel_us.emplace_back(a.name, median(us));
    }
    return out;
}

void print_kernel_times(const std::string& workload, const std::string& mode, const StepKernelTimes& t, bool verbose) {
    std::printf("kernels %s %s: %.0f per step, %.1f us of kernel time, busy %.1f us, span %.1f us, idle %.1f us "
                "(%.0f memsets, %.0f copies; median of %zu steps)\n",
                workload.c_str(), mode.c_str(), t.kernels, t.kernel_us, t.busy_us, t.span_us, t.idle_us(), t.memsets,
                t.memcpys, t.steps);
    if (verbose) {
        if (t.per_kernel_us.empty() && t.kernels > 0)
            std::printf("    (the steps launched different kernel sequences: no per-kernel medians)\n");
        for (const auto& [name, us] : t.per_kernel_us) std::printf("    %8.2f us  %.110s\n", us, name.c_str());
    }
    std::fflush(stdout);
}

void print_kernels_by_name(const StepKernelTimes& t, std::size_t most) {
    for (std::size_t i = 0; i < t.by_name.size() && i < most; ++i)
        std::printf("    by name: %9.2f us %6.1fx  %.110s\n", t.by_name[i].us, t.by_name[i].count, t.by_name[i].name.c_str());
    std::fflush(stdout);
}

#if DYNGRAD_BENCH_CUPTI

namespace {

#define CUPTI_CHECK(expr)                                                                               \
    do {                                                                                                \
        const CUptiResult cupti_status = (expr);                                                        \
        if (cupti_status != CUPTI_SUCCESS) {                                                            \
            const char* message = nullptr;                                                              \
            cuptiGetResultString(cupti_status, &message);                                               \
            throw Error(str("CUPTI: ", #expr, " failed: ", message ? message : "unknown error", " (",   \
                            static_cast<int>(cupti_status), ")"));                                      \
        }                                                                                               \
    } while (0)

constexpr std::size_t kBufferBytes = 8u << 20;

std::mutex& records_mutex() {
    static std::mutex m;
    return m;
}
std::vector<DeviceActivity>& records() {
    static std::vector<DeviceActivity> r;
    return r;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
    *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
    std::vector<DeviceActivity> got;
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            got.push_back({DeviceActivity::Kind::kernel, readable_kernel_name(k->name), k->start, k->end, k->streamId});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
            got.push_back({DeviceActivity::Kind::memset, "memset", m->start, m->end, m->streamId});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
            got.push_back({DeviceActivity::Kind::memcpy, "memcpy", m->start, m->end, m->streamId});
        }
    }
    std::free(buffer);
    const std::lock_guard lock(records_mutex());
    records().insert(records().end(), got.begin(), got.end());
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                         CUPTI_ACTIVITY_KIND_MEMCPY};

}  // namespace

bool kernel_trace_available() { return true; }

KernelTrace::KernelTrace() {
    {
        const std::lock_guard lock(records_mutex());
        records().clear();
    }
    static const bool registered = [] {
        CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
        return true;
    }();
    (void)registered;
    for (const CUpti_ActivityKind kind : kKinds) CUPTI_CHECK(cuptiActivityEnable(kind));
    running_ = true;
    mark();  // the start
}

KernelTrace::~KernelTrace() {
    if (!running_) return;
    for (const CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);  // best effort: no throw here
    cuptiActivityFlushAll(1);
}

void KernelTrace::mark() {
    std::uint64_t now = 0;
    CUPTI_CHECK(cuptiGetTimestamp(&now));
    marks_.push_back(now);
}

std::vector<std::vector<DeviceActivity>> KernelTrace::stop() {
    if (!running_) throw Error("KernelTrace::stop: not running");
    CUPTI_CHECK(cuptiActivityFlushAll(1));
    for (const CUpti_ActivityKind kind : kKinds) CUPTI_CHECK(cuptiActivityDisable(kind));
    running_ = false;
    std::vector<DeviceActivity> all;
    {
        const std::lock_guard lock(records_mutex());
        all.swap(records());
    }
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    std::vector<std::vector<DeviceActivity>> steps(marks_.size() > 0 ? marks_.size() - 1 : 0);
    for (DeviceActivity& a : all) {
        // Step i: started after mark i (marks_[0] is the start) and before mark i + 1.
        const auto after = std::upper_bound(marks_.begin(), marks_.end(), a.start_ns);
        if (after == marks_.begin() || after == marks_.end()) continue;
        steps[static_cast<std::size_t>(after - marks_.begin() - 1)].push_back(std::move(a));
    }
    return steps;
}

#else

bool kernel_trace_available() { return false; }

KernelTrace::KernelTrace() {
    throw Error("dyngrad-perf was built without CUPTI (CMake found no CUDA::cupti): no kernel trace");
}
KernelTrace::~KernelTrace() = default;
void KernelTrace::mark() {}
std::vector<std::vector<DeviceActivity>> KernelTrace::stop() { return {}; }

#endif

}  // namespace dyngrad::bench
