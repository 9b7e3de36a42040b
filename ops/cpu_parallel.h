// Internal (CPU kernels only): the matrix product and elementwise loops of the CPU backend, split into
// chunks fixed by the sizes (core/parallel.h) and run on cpu_threads() threads. Each chunk is computed by
// Eigen's single-threaded code (EIGEN_DONT_PARALLELIZE), so a result never depends on the thread count.
#pragma once
#include <cstdint>

#include "dyngrad/core/parallel.h"

namespace dyngrad::cpu {

// GEMM panels: at least this many rows (or columns) each, so that re-packing the other operand once per
// panel costs at most a few per cent; boundaries on multiples of it keep panels SIMD-aligned.
inline constexpr std::int64_t kGemmPanel = 32;

// y (M,N) = a (M,K) · b (K,N), or y += a · b with `accumulate`. y, a, b: Eigen matrix expressions with
// direct access (maps, their transposes and blocks). Split into panels of y's rows, or of its columns when
// it is wider than tall; each panel is one single-threaded Eigen product.
template <typename Y, typename A, typename B>
void parallel_gemm(Y&& y, const A& a, const B& b, bool accumulate = false) {
    const std::int64_t m = y.rows(), n = y.cols(), k = a.cols();
    const bool by_rows = m >= n;
    const std::int64_t extent = by_rows ? m : n;
    const std::int64_t chunks = chunk_count(extent, (by_rows ? n : m) * std::max<std::int64_t>(k, 1), kGemmPanel);
    parallel_chunks(chunks, [&](std::int64_t c) {
        const ChunkRange r = chunk_range(extent, chunks, c, kGemmPanel);
        if (r.size() == 0) return;
        if (by_rows) {
            auto panel = y.middleRows(r.begin, r.size());
            if (accumulate)
                panel.noalias() += a.middleRows(r.begin, r.size()) * b;
            else
                panel.noalias() = a.middleRows(r.begin, r.size()) * b;
        } else {
            auto panel = y.middleCols(r.begin, r.size());
            if (accumulate)
                panel.noalias() += a * b.middleCols(r.begin, r.size());
            else
                panel.noalias() = a * b.middleCols(r.begin, r.size());
        }
    });
}

// Elementwise work over n independent elements: fn(begin, end) on fixed ranges, in parallel when large.
// Ranges start on multiples of 64 elements (whole cache lines, aligned SIMD packets).
template <typename Fn> void parallel_elements(std::int64_t n, Fn&& fn) {
    constexpr std::int64_t kAlign = 64;
    const std::int64_t chunks = chunk_count(n, 1, kAlign);
    if (chunks <= 1) {
        if (n > 0) fn(std::int64_t{0}, n);
        return;
    }
    parallel_chunks(chunks, [&](std::int64_t c) {
        const ChunkRange r = chunk_range(n, chunks, c, kAlign);
        if (r.size() > 0) fn(r.begin, r.end);
    });
}

}  // namespace dyngrad::cpu
