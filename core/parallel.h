// The CPU backend's threads. Kernels split their work into chunks fixed by the problem's sizes alone, never
// by the thread count, and run the chunks on up to cpu_threads() threads; every output element (and every
// partial sum) is computed by one chunk in a fixed order, so results are bitwise the same for any thread
// count (docs/architecture.md, "CPU threads"). The threads (a blocking pool) live in core/parallel.cpp.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace dyngrad {

// Threads the CPU kernels use. Default: the environment variable DYNGRAD_CPU_THREADS (a positive integer,
// read at the first use; ValueError from every CPU kernel otherwise), else the cores this process may run on.
int cpu_threads();
// Sets the CPU kernels' thread count for the whole process (n >= 1; ValueError otherwise).
void set_cpu_threads(int n);

namespace detail {
void run_chunks(std::int64_t chunks, void (*body)(void*, std::int64_t), void* context);
}  // namespace detail

// Calls fn(chunk) for every chunk in [0, chunks), each on one thread, on up to cpu_threads() threads
// (in turn inside another chunk, or while another thread's job holds the pool). The first exception thrown
// is rethrown once the chunks have run (those not yet started are skipped).
template <typename Fn> void parallel_chunks(std::int64_t chunks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    detail::run_chunks(chunks, [](void* f, std::int64_t c) { (*static_cast<F*>(f))(c); },
                       const_cast<void*>(static_cast<const void*>(&fn)));
}

// Work below this many units (elements, multiply-adds) stays in one chunk: waking a thread costs microseconds.
inline constexpr std::int64_t kMinChunkWork = std::int64_t{1} << 18;
inline constexpr std::int64_t kMaxChunks = 64;

// How many chunks `items` items of `work_per_item` units each are cut into: at least kMinChunkWork units
// and `min_items` items per chunk, at most kMaxChunks chunks. A function of the sizes alone.
inline std::int64_t chunk_count(std::int64_t items, std::int64_t work_per_item, std::int64_t min_items = 1) {
    if (items <= 0) return 0;
    const std::int64_t by_work = std::max<std::int64_t>(items * std::max<std::int64_t>(work_per_item, 1) / kMinChunkWork, 1);
    const std::int64_t by_items = std::max<std::int64_t>(items / std::max<std::int64_t>(min_items, 1), 1);
    return std::min({by_work, by_items, kMaxChunks});
}

// Chunk c of `chunks` over [0, items): [begin, end), boundaries at multiples of `align` except the last.
struct ChunkRange {
    std::int64_t begin = 0, end = 0;
    std::int64_t size() const { return end - begin; }
};
inline ChunkRange chunk_range(std::int64_t items, std::int64_t chunks, std::int64_t c, std::int64_t align = 1) {
    const std::int64_t units = (items + align - 1) / align;
    const auto boundary = [&](std::int64_t k) { return std::min(items, units * k / chunks * align); };
    return {boundary(c), boundary(c + 1)};
}

}  // namespace dyngrad
