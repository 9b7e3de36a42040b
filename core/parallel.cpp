// The CPU thread setting and the chunk runner (core/parallel.h): a pool of threads that block on a
// condition variable between jobs. Blocking, not spinning, because these machines are often shared: OpenMP's
// spin-waiting workers (libgomp's default) made a 2-thread LeNet epoch 3x slower than 1 thread on a loaded
// 2-core machine, where the blocking pool is not slower (docs/performance.md, "CPU threads").
#include "dyngrad/core/parallel.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "dyngrad/core/error.h"

namespace dyngrad {

namespace {

constexpr int kUnset = 0;
constexpr int kBadEnvironment = -1;
std::atomic<int> g_threads{kUnset};

// DYNGRAD_CPU_THREADS, or the cores; kBadEnvironment for a value that is not a positive integer.
int initial_threads() {
    const char* text = std::getenv("DYNGRAD_CPU_THREADS");
    if (!text) return std::max(static_cast<int>(std::thread::hardware_concurrency()), 1);
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || n < 1 || n > 1 << 16) return kBadEnvironment;
    return static_cast<int>(n);
}

using Body = void (*)(void*, std::int64_t);

// Set while a thread runs chunks: a chunk that starts chunks of its own runs them in turn.
thread_local bool t_in_chunk = false;

// One job at a time: the caller and up to threads - 1 workers take chunk indices from a shared counter.
// Which thread runs which chunk varies; what a chunk computes does not.
class ChunkPool {
public:
    // false when another job holds the pool (the caller then runs its chunks itself).
    bool try_run(std::int64_t chunks, Body body, void* context, int threads) {
        if (busy_.exchange(true, std::memory_order_acquire)) return false;
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            while (static_cast<int>(workers_.size()) < threads - 1) {
                const int index = static_cast<int>(workers_.size());
                workers_.emplace_back([this, index] { worker_loop(index); });
            }
            body_ = body;
            context_ = context;
            chunks_ = chunks;
            next_.store(0, std::memory_order_relaxed);
            failed_.store(false, std::memory_order_relaxed);
            error_ = nullptr;
            participants_ = threads - 1;
            active_ = threads - 1;
            ++generation_;
        }
        wake_.notify_all();
        work();
        std::exception_ptr error;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            done_.wait(lock, [this] { return active_ == 0; });
            error = error_;
        }
        busy_.store(false, std::memory_order_release);
        if (error) std::rethrow_exception(error);
        return true;
    }

private:
    // Takes chunks until none is left; after a failure the rest are skipped. Exceptions stay inside.
    void work() {
        t_in_chunk = true;
        for (;;) {
            const std::int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
            if (c >= chunks_) break;
            if (failed_.load(std::memory_order_relaxed)) continue;
            try {
                body_(context_, c);
            } catch (...) {
                const std::lock_guard<std::mutex> lock(mutex_);
                if (!error_) error_ = std::current_exception();
                failed_.store(true, std::memory_order_relaxed);
            }
        }
        t_in_chunk = false;
    }

    void worker_loop(int index) {
        std::uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] { return generation_ != seen; });
            seen = generation_;
            if (index >= participants_) continue;  // this job wants fewer threads
            lock.unlock();
            work();
            lock.lock();
            if (--active_ == 0) done_.notify_one();
        }
    }

    std::atomic<bool> busy_{false};
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> workers_;
    // The current job (written under mutex_ before the workers are woken).
    std::uint64_t generation_ = 0;
    Body body_ = nullptr;
    void* context_ = nullptr;
    std::int64_t chunks_ = 0;
    int participants_ = 0;
    int active_ = 0;  // participating workers that have not finished the job
    std::atomic<std::int64_t> next_{0};
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;
};

// Never destroyed: its workers wait until the process ends, and no kernel can outlive it.
ChunkPool& pool() {
    static ChunkPool* const instance = new ChunkPool;
    return *instance;
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

namespace detail {

void run_chunks(std::int64_t chunks, void (*body)(void*, std::int64_t), void* context) {
    if (chunks <= 0) return;
    const int threads = static_cast<int>(std::min<std::int64_t>(cpu_threads(), chunks));
    if (threads > 1 && !t_in_chunk && pool().try_run(chunks, body, context, threads)) return;
    // One thread, a nested call, or the pool busy with another graph's job: the same chunks in turn.
    const bool outer = !t_in_chunk;
    t_in_chunk = true;
    try {
        for (std::int64_t c = 0; c < chunks; ++c) body(context, c);
    } catch (...) {
        if (outer) t_in_chunk = false;
        throw;
    }
    if (outer) t_in_chunk = false;
}

}  // namespace detail

}  // namespace dyngrad
