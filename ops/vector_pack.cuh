// 16-byte vector access for contiguous elementwise CUDA kernels (float4 / double2 width, 8 bf16/f16): a kernel
// walks whole packs with one load/store each, then the scalar tail. Shared by ops/elementwise.cu,
// ops/dropout.cu, ops/linalg.cu (the fused ReLU) and ops/loss.cu (the class losses' backward). Pool allocations are 256-byte aligned and tensors are never offset views, so the vector path
// always applies; pack_count() still checks, and gives 0 packs (the scalar loop) for anything unaligned.
// Device code: include it from .cu files only.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "dyngrad/cuda/context.h"

namespace dyngrad::cuda::vector_pack {

// 16 bytes of T moved as one vector load/store.
template <typename T>
struct alignas(16) Pack {
    static constexpr int width = 16 / sizeof(T);
    T v[width];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p, std::int64_t pack) {
    return reinterpret_cast<const Pack<T>*>(p)[pack];
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, std::int64_t pack, const Pack<T>& value) {
    reinterpret_cast<Pack<T>*>(p)[pack] = value;
}

// The grid-stride walk of a vectorized elementwise kernel over n elements: on_pack(p) for each of the `packs`
// whole packs of `width` elements, then on_element(i) for each element past them.
template <typename OnPack, typename OnElement>
__device__ __forceinline__ void for_each_pack(std::int64_t n, std::int64_t packs, int width, OnPack on_pack,
                                              OnElement on_element) {
    for (std::int64_t p = thread_index(); p < packs; p += thread_count()) on_pack(p);
    for (std::int64_t i = packs * width + thread_index(); i < n; i += thread_count()) on_element(i);
}

// Whole packs the vector loop covers: n / width when every pointer is 16-byte aligned, else 0.
template <typename T>
std::int64_t pack_count(std::int64_t n, std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
        if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return 0;
    return n / Pack<T>::width;
}

// Blocks of `threads` for a vectorized grid-stride launch: one thread per pack, or per element without packs.
inline unsigned vector_blocks(const DeviceContext& ctx, std::int64_t n, std::int64_t packs, unsigned threads) {
    return grid_size(ctx, packs > 0 ? packs : n, threads);
}

}  // namespace dyngrad::cuda::vector_pack
