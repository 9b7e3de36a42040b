// The CPU thread setting and the chunk runner (core/parallel.h). The only file that uses OpenMP: without
// it (a compiler with no OpenMP) every chunk runs on the calling thread, with the same results.
#include "dyngrad/core/parallel.h"

#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "dyngrad/core/error.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dyngrad {

namespace {

constexpr int kUnset = 0;
constexpr int kBadEnvironment = -1;
std::atomic<int> g_threads{kUnset};

int available_cores() {
#ifdef _OPENMP
    return std::max(omp_get_num_procs(), 1);  // the affinity mask: what this process may run on
#else
    return std::max(static_cast<int>(std::thread::hardware_concurrency()), 1);
#endif
}

// DYNGRAD_CPU_THREADS, or the cores; kBadEnvironment for a value that is not a positive integer.
int initial_threads() {
    const char* text = std::getenv("DYNGRAD_CPU_THREADS");
    if (!text) return available_cores();
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || n < 1 || n > 1 << 16) return kBadEnvironment;
    return static_cast<int>(n);
}

}  // namespace

int cpu_threads() {
    int n = g_threads.load(std::memory_order_relaxed);
    if (n == kUnset) {
        int expected = kUnset;
        g_threads.compare_exchange_strong(expected, initial_threads(), std::memory_order_relaxed);
        n = g_threads.load(std::memory_order_relaxed);
    }
    if (n == kBadEnvironment) {
        const char* text = std::getenv("DYNGRAD_CPU_THREADS");
        throw ValueError(str("DYNGRAD_CPU_THREADS must be a positive integer, got '", text ? text : "", "'",
                             " (set_cpu_threads(n) overrides it)"));
    }
    return n;
}

void set_cpu_threads(int n) {
    if (n < 1) throw ValueError(str("set_cpu_threads: the thread count must be >= 1, got ", n));
    g_threads.store(n, std::memory_order_relaxed);
}

bool cpu_parallel_available() {
#ifdef _OPENMP
    return true;
#else
    return false;
#endif
}

namespace detail {

void run_chunks(std::int64_t chunks, void (*body)(void*, std::int64_t), void* context) {
    if (chunks <= 0) return;
#ifdef _OPENMP
    const int threads = static_cast<int>(std::min<std::int64_t>(cpu_threads(), chunks));
    if (threads > 1 && !omp_in_parallel()) {
        // An exception must not leave an OpenMP region: keep the first, skip the chunks not yet started.
        std::exception_ptr error;
        std::mutex error_mutex;
        std::atomic<bool> failed{false};
#pragma omp parallel for num_threads(threads) schedule(static)
        for (std::int64_t c = 0; c < chunks; ++c) {
            if (failed.load(std::memory_order_relaxed)) continue;
            try {
                body(context, c);
            } catch (...) {
                const std::lock_guard<std::mutex> lock(error_mutex);
                if (!error) error = std::current_exception();
                failed.store(true, std::memory_order_relaxed);
            }
        }
        if (error) std::rethrow_exception(error);
        return;
    }
#else
    cpu_threads();  // the same ValueError for a bad DYNGRAD_CPU_THREADS as with OpenMP
#endif
    for (std::int64_t c = 0; c < chunks; ++c) body(context, c);
}

}  // namespace detail

}  // namespace dyngrad
