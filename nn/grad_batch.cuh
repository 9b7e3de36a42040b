// Internal: the batched passes over many gradients that clipping (nn/clip.cu) and loss scaling (nn/amp.cu)
// share: a batch of gradients of one dtype passed by value as a kernel argument, a flat grid of fixed slices
// over it, and the host loop that cuts the gradients into batches.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>

#include "dyngrad/core/error.h"
#include "dyngrad/nn/grad_passes.h"

namespace dyngrad::cuda {

// A block's slice: kBatchSlice elements, kBatchPerThread (8) per thread, as an optimizer step's slice.
constexpr unsigned kBatchThreads = 256;
constexpr std::int64_t kBatchSlice = 2048;
constexpr int kBatchPerThread = static_cast<int>(kBatchSlice / kBatchThreads);
static_assert(kBatchSlice % kBatchThreads == 0, "a slice is a whole number of elements per thread");

// Up to kGradBatch gradients of one dtype, passed by value as a kernel argument (no table to upload, so
// nothing waits on the host and a captured step keeps its own copy). Every pass over them is one launch of a
// flat grid: kBatchSlice elements (8 per thread) per block, tensor after tensor; first_block is the prefix
// sum of the tensors' block counts, and a block finds its tensor by a binary search of it. The norm's
// partial sums used to run one block per 32K-element chunk: 128 dependent loads per thread and, for the
// GPT's 10.8M parameters, 64 blocks per launch in 6 launches (ncu: 28 µs for lenet's 61k parameters, 400 µs
// for the GPT, where the bytes need 20 µs).
constexpr int kGradBatch = 120;  // 120 · 24 bytes: the argument stays under the 4 KB of every CUDA version
struct GradBatch {
    void* data[kGradBatch];
    std::int64_t n[kGradBatch];
    std::int64_t first_block[kGradBatch + 1];  // first_block[count]: the launch's blocks
    std::int64_t first_partial;  // index of this launch's first block in the norm's partial sums
    int count;
};

struct BlockSlice {
    int tensor;
    std::int64_t begin;  // this thread's first element
    std::int64_t end;    // the slice's end
};

// The tensor and slice of this block: the last tensor whose first block is at most blockIdx.x (tensors
// without elements are never put in a batch, so that is the tensor holding the block).
__device__ inline BlockSlice block_slice(const GradBatch& batch) {
    const auto block = static_cast<std::int64_t>(blockIdx.x);
    int low = 0, high = batch.count - 1;
    while (low < high) {
        const int middle = (low + high + 1) / 2;
        if (batch.first_block[middle] <= block) low = middle;
        else high = middle - 1;
    }
    const std::int64_t slice_start = (block - batch.first_block[low]) * kBatchSlice;
    return {low, slice_start + threadIdx.x, std::min(batch.n[low], slice_start + kBatchSlice)};
}

// A launch's grid stays well inside gridDim.x's 2^31 − 1 blocks.
constexpr std::int64_t kMaxBatchBlocks = std::int64_t{1} << 30;

// DTypeError unless every gradient is f32 or f64 (the batched kernels' types): called before anything is queued,
// so a refused call changes no state (a bf16/f16 gradient would otherwise be skipped).
inline void require_batch_dtypes(std::span<const GradOperand> grads, const char* what) {
    for (const GradOperand& g : grads)
        if (g.dtype != DType::f32 && g.dtype != DType::f64)
            throw DTypeError(str(what, ": gradients must be float32 or float64 on the GPU, got ", dtype_name(g.dtype)));
}

// Calls launch(dtype, batch, blocks) over batches of up to kGradBatch gradients of one dtype (a gradient
// larger than kMaxBatchBlocks slices is cut into several entries); returns the blocks launched in all, which
// is the number of partial sums the norm writes.
template <typename Launch>
std::int64_t for_each_batch(std::span<const GradOperand> grads, const char* what, Launch launch) {
    require_batch_dtypes(grads, what);
    std::int64_t blocks_so_far = 0;
    for (const DType dtype : {DType::f32, DType::f64}) {
        GradBatch batch{};
        const auto flush = [&] {
            if (batch.count == 0) return;
            const std::int64_t blocks = batch.first_block[batch.count];
            launch(dtype, batch, static_cast<unsigned>(blocks));
            blocks_so_far += blocks;
            batch.count = 0;
            batch.first_block[0] = 0;
        };
        for (const GradOperand& g : grads) {
            if (g.dtype != dtype) continue;
            const auto width = static_cast<std::int64_t>(dtype_size(dtype));
            for (std::int64_t offset = 0; offset < g.numel;) {
                if (batch.count == 0) batch.first_partial = blocks_so_far;
                const std::int64_t room = kMaxBatchBlocks - batch.first_block[batch.count];
                const std::int64_t n = std::min(g.numel - offset, room * kBatchSlice);
                batch.data[batch.count] = static_cast<char*>(g.data) + offset * width;
                batch.n[batch.count] = n;
                batch.first_block[batch.count + 1] = batch.first_block[batch.count] + (n + kBatchSlice - 1) / kBatchSlice;
                offset += n;
                if (++batch.count == kGradBatch || batch.first_block[batch.count] == kMaxBatchBlocks) flush();
            }
        }
        flush();
    }
    return blocks_so_far;
}


}  // namespace dyngrad::cuda
