// Fused multi-tensor optimizer steps: SGD (momentum, Nesterov, L2) and Adam / AdamW. The optimizers
// (nn/optim.cpp) hand over every CUDA parameter of one device at once; the tensors are cut into chunks
// of at most kStepChunk elements, the chunk table lives on the device (StepTable, nn/optim_internal.h),
// and one kernel launch updates every chunk of one dtype, kStepSlices blocks per chunk. Each chunk carries its
// parameter's scalars (its group's lr and weight decay, its own Adam step's bias corrections).
// In a captured step the table, and with it the hyper-parameters (lr, ...), is frozen into the graph.
// Each element is updated by the rule the CPU loop applies (SgdRule, AdamRule: nn/optim_internal.h); here are the
// chunking, the device-side scalars (lr, step counts, a deferred schedule advance) and the fused clip factor.
// Clipping: nn/clip.cu. GradScaler's passes are at the end.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/cuda/element_convert.cuh"
#include "dyngrad/nn/optim_internal.h"
#include "dyngrad/ops/vector_pack.cuh"

namespace dyngrad::cuda {

namespace {

// A table chunk holds up to kStepChunk elements, and kStepSlices blocks (blockIdx.y) share it, each a slice
// of kStepChunk / kStepSlices elements: 8 per thread. One block per chunk walked 128 elements per thread one
// after another, and the step's time was that chain of memory latencies: 56 µs of lenet5's 184 µs captured
// step on the H100 (ncu, dyngrad-perf --profile), for a few thousand parameters.
constexpr std::int64_t kStepChunk = std::int64_t{1} << 15;
constexpr unsigned kStepSlices = 16;
constexpr std::int64_t kStepSlice = kStepChunk / kStepSlices;
constexpr unsigned kThreads = 256;
static_assert(sizeof(StepChunk) % sizeof(std::int64_t) == 0, "the table is stored as int64 words");

// Where a launch's blocks find their chunk (blockIdx.x). Up to kInlineChunks chunks ride in the kernel's parameters
// (__grid_constant__: read in place, from the constant bank), so that no block waits on a read of the table before
// it can issue its first element's loads (a captured lenet5 step's 10 parameters are 11 chunks); more come from
// the device table (StepTable).
constexpr std::size_t kInlineChunks = 24;
struct InlineChunks {
    StepChunk chunks[kInlineChunks];
    __device__ const StepChunk& of_block() const { return chunks[blockIdx.x]; }
};
struct TableChunks {
    const StepChunk* table;
    __device__ const StepChunk& of_block() const { return table[blockIdx.x]; }
};
static_assert(sizeof(InlineChunks) + sizeof(StepState) <= 4000, "a kernel's parameters: at most 4 KiB");

// Whether this block's slice of its chunk holds elements. A small tensor's chunk has one or a few non-empty
// slices of the kStepSlices the grid gives every chunk; the empty blocks leave at once and take no part in
// the step count (StepChunk::blocks counts only the non-empty ones).
__device__ inline bool slice_is_empty(const StepChunk& c) {
    return static_cast<std::int64_t>(blockIdx.y) * kStepSlice >= c.n;
}

// The lr of group g under a deferred schedule advance (StepState::schedule): set_lr's override when there is
// one, else the schedule's lr at the advanced epoch. Not inlined, so that every caller (the updates, the last
// block that stores the lrs, the host read's kernel) computes the same bits.
// (By value: no kernel parameter's address is taken on the path without a schedule.)
__device__ __noinline__ double scheduled_lr(ScheduleAdvance a, const double* overrides, int group) {
    const double override_lr = overrides[group];
    if (override_lr >= 0) return override_lr;
    return schedule_lr(a.rule, a.base_lrs[group], *a.epoch + a.count);
}
__device__ inline double scheduled_lr(const StepState& s, int group) {
    return scheduled_lr(s.schedule, s.lr_overrides, group);
}

// The lr of group g's update in this step: the device lr, or the deferred schedule's.
__device__ inline double step_lr(const StepState& s, int group) {
    return s.schedule.count == 0 ? s.lrs[group] : scheduled_lr(s, group);
}

// A block's lr under a deferred schedule advance, stored as its group's device lr (StepState::lr_stored_groups):
// the value the advance would store, so the applying block need not evaluate it again. One thread of the block.
__device__ inline void store_scheduled_lr(const StepState& s, int group, double lr) {
    if (s.schedule.count != 0) s.lrs[group] = lr;
}

// Applies a deferred schedule advance (one thread, after every reader of the old epoch and overrides): the
// lrs this step used become the device lrs (the step's blocks stored those of StepState::lr_stored_groups,
// unless GradScaler skipped the step), the overrides are consumed, the epoch advances.
__device__ void apply_schedule_advance(const StepState& s) {
    const bool skipped = s.found_inf != nullptr && *s.found_inf != 0;
    for (int g = 0; g < s.groups; ++g) {
        const bool stored = !skipped && g < 64 && ((s.lr_stored_groups >> g) & 1u) != 0;
        if (!stored) s.lrs[g] = scheduled_lr(s, g);
    }
    for (int g = 0; g < s.groups; ++g) s.lr_overrides[g] = -1;
    *s.schedule.epoch += s.schedule.count;
}

// After a block's update (`updated`) or its skip: the last block of a parameter (all non-empty slices of its
// chunks) to finish advances its step count, and with a deferred schedule advance the last block of the
// launch applies it. Every block read the step count, epoch and overrides (before its first __syncthreads)
// before it arrived, so the writes never race a read; the arrival counters go back to 0 for the next launch.
__device__ void finish_block(const StepChunk& c, const StepState& s, bool updated) {
    __syncthreads();  // every thread of this block has read the count and the lr
    if (threadIdx.x != 0) return;
    const auto blocks = static_cast<unsigned long long>(c.blocks);
    if (updated && blocks == 1) {
        s.steps[c.parameter] += 1;
    } else if (updated) {
        __threadfence();
        if (atomicAdd(&s.arrivals[c.parameter], 1ull) + 1 == blocks) {
            s.steps[c.parameter] += 1;
            s.arrivals[c.parameter] = 0;
        }
    }
    if (!s.applies_schedule) return;
    __threadfence();
    if (atomicAdd(s.block_counter, 1u) + 1 == s.launch_blocks) {
        __threadfence();
        apply_schedule_advance(s);
        *s.block_counter = 0;
    }
}

// The block's lr under a deferred schedule: thread 0 evaluates it once (a cos or pow in double), the block
// shares it. Called by every thread of the block.
__device__ double block_scheduled_lr(const StepState& s, int group) {
    __shared__ double lr;
    if (threadIdx.x == 0) {
        lr = scheduled_lr(s, group);
        store_scheduled_lr(s, group, lr);
    }
    __syncthreads();
    return lr;
}

// Whether this block updates its slice: not when the slice is empty, nor when GradScaler skips the step (the
// block then still takes part in finishing it: a schedule's step is not skipped).
__device__ inline bool block_updates(const StepChunk& c, const StepState& s) {
    if (slice_is_empty(c)) return false;
    if (s.found_inf != nullptr && *s.found_inf != 0) {
        finish_block(c, s, false);
        return false;
    }
    return true;
}

// The parameter's kept 16-bit copy (StepChunk::copy), element i, from its new value w: the cast op's rounding.
template <typename T>
__device__ inline void store_copy(const StepChunk& c, std::int64_t i, T w) {
    if constexpr (std::is_same_v<T, float>) {
        if (c.copy_kind == kCopyF16) static_cast<__half*>(c.copy)[i] = convert_element<__half>(w);
        else static_cast<__nv_bfloat16*>(c.copy)[i] = convert_element<__nv_bfloat16>(w);
    }
}

// The rules' unscaling in a step gated by GradScaler: by its inverse scale (read on the device).
template <typename T>
__device__ inline Unscale<T> step_unscale(const StepState& s) {
    return s.inv_scale != nullptr ? Unscale<T>{static_cast<T>(*s.inv_scale), true} : Unscale<T>{};
}

// The block's chunk: param, grad, momentum buffer (null without momentum), all (n); scalars: momentum,
// weight_decay, nesterov; the lr from the device (group's slot). The thread's packs are loaded before the lr is
// waited for (a dependent read: the chunk's group), as adam_kernel does.
template <typename T, typename Chunks>
__global__ void sgd_kernel(const __grid_constant__ Chunks chunks, StepState s) {
    const StepChunk& c = chunks.of_block();
    if (!block_updates(c, s)) return;
    const double clip = s.clip != nullptr ? *s.clip : 1.0;
    const T clip_scale = static_cast<T>(clip);
    T* __restrict__ p = static_cast<T*>(c.param);
    T* __restrict__ g = static_cast<T*>(c.grad);
    T* __restrict__ buffer = static_cast<T*>(c.state1);
    const std::int64_t begin = blockIdx.y * kStepSlice;
    const std::int64_t end = std::min(c.n, begin + kStepSlice);
    // 16-byte packs (float4: 353 µs against 300 for PyTorch's multi-tensor SGD over the 67M parameters of the
    // MLP 4096, one float per load), then the slice's scalar tail. Slices start at multiples of kStepSlice
    // elements of 256-byte aligned buffers; the check keeps anything else on the scalar loop.
    using vector_pack::Pack;
    constexpr int W = Pack<T>::width;
    constexpr int kPacks = static_cast<int>(kStepSlice / W / kThreads);  // a thread's packs in a full slice
    static_assert(kStepSlice % (W * kThreads) == 0, "a slice is a whole number of packs per thread");
    const bool aligned = ((reinterpret_cast<std::uintptr_t>(p) | reinterpret_cast<std::uintptr_t>(g) |
                           reinterpret_cast<std::uintptr_t>(buffer)) % 16) == 0;
    const std::int64_t packs = aligned ? (end - begin) / W : 0;
    T* __restrict__ slice_p = p + begin;
    T* __restrict__ slice_g = g + begin;
    T* __restrict__ slice_buffer = buffer != nullptr ? buffer + begin : nullptr;
    Pack<T> w[kPacks], gi[kPacks], b[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
        const std::int64_t k = threadIdx.x + j * static_cast<std::int64_t>(kThreads);
        b[j] = Pack<T>{};
        if (k < packs) {
            w[j] = vector_pack::load_pack(static_cast<const T*>(slice_p), k);
            gi[j] = vector_pack::load_pack(static_cast<const T*>(slice_g), k);
            if (slice_buffer != nullptr) b[j] = vector_pack::load_pack(static_cast<const T*>(slice_buffer), k);
        }
    }
    const SgdRule<T> rule(s.schedule.count == 0 ? s.lrs[c.group] : block_scheduled_lr(s, c.group), c.scalars[0],
                          c.scalars[1], c.scalars[2] != 0, c.state1 != nullptr, step_unscale<T>(s));
    // One element: w, its gradient (written back when clipped) and momentum buffer value, in place.
    const auto update = [&](T& wi, T& gradient, T& bi) {
        if (clip != 1.0) gradient = gradient * clip_scale;  // clip_grad_norm's scaling pass, fused: the same product
        rule(wi, gradient, bi);
    };
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
        const std::int64_t k = threadIdx.x + j * static_cast<std::int64_t>(kThreads);
        if (k >= packs) break;
#pragma unroll
        for (int e = 0; e < W; ++e) update(w[j].v[e], gi[j].v[e], b[j].v[e]);
        vector_pack::store_pack(slice_p, k, w[j]);
        if (c.copy != nullptr)
#pragma unroll
            for (int e = 0; e < W; ++e) store_copy(c, begin + k * W + e, w[j].v[e]);
        if (clip != 1.0) vector_pack::store_pack(slice_g, k, gi[j]);
        if (slice_buffer != nullptr) vector_pack::store_pack(slice_buffer, k, b[j]);
    }
    for (std::int64_t i = begin + packs * W + threadIdx.x; i < end; i += blockDim.x) {
        T wi = p[i], gradient = g[i], bi = buffer != nullptr ? buffer[i] : T(0);
        update(wi, gradient, bi);
        p[i] = wi;
        if (c.copy != nullptr) store_copy(c, i, wi);
        if (clip != 1.0) g[i] = gradient;
        if (buffer != nullptr) buffer[i] = bi;
    }
    finish_block(c, s, true);
}

// The block's chunk: param, grad, m, v, all (n); scalars: beta1, beta2, eps, weight_decay, decoupled. The
// bias corrections come from the device step count, the lr from the device (adam_scalars, as on the CPU).
// Each thread updates at most kPerThread elements of its block's slice; it loads them all before waiting for
// the scalars, so that their latency hides the memory reads: for lenet's 61k parameters the step is latency,
// not bandwidth (ncu: 10 µs against SGD's 5.8). The three independent scalars (the lr, with a deferred schedule
// a double cos or pow; the two bias corrections, a double pow each) are evaluated at once by lane 0 of warps
// 0, 1 and 2 rather than one after another by thread 0; every thread combines them (adam_scalars_from, the
// same bits as adam_scalars).
constexpr int kPerThread = static_cast<int>(kStepSlice / kThreads);
static_assert(kStepSlice % kThreads == 0, "a slice is a whole number of elements per thread");

template <typename T, typename Chunks>
__global__ void adam_kernel(const __grid_constant__ Chunks chunks, StepState s) {
    const StepChunk& c = chunks.of_block();
    if (!block_updates(c, s)) return;
    static_assert(kThreads >= 3 * 32, "warps 0, 1 and 2 evaluate the scalars");
    __shared__ double shared_lr, shared_bias1, shared_bias2_sqrt;
    if (threadIdx.x == 0) {
        shared_lr = step_lr(s, c.group);
        store_scheduled_lr(s, c.group, shared_lr);
    } else if (threadIdx.x == 32) {
        shared_bias1 = adam_bias1(c.scalars[0], s.steps[c.parameter] + 1);
    } else if (threadIdx.x == 64) {
        shared_bias2_sqrt = adam_bias2_sqrt(c.scalars[1], s.steps[c.parameter] + 1);
    }
    // The group's settings, read before the wait like the elements.
    const double beta1_setting = c.scalars[0], beta2_setting = c.scalars[1], eps_setting = c.scalars[2],
                 weight_decay_setting = c.scalars[3];
    const bool decoupled = c.scalars[4] != 0;
    const Unscale<T> unscale = step_unscale<T>(s);
    const double clip = s.clip != nullptr ? *s.clip : 1.0;
    const T clip_scale = static_cast<T>(clip);
    T* __restrict__ p = static_cast<T*>(c.param);
    T* __restrict__ g = static_cast<T*>(c.grad);
    T* __restrict__ m = static_cast<T*>(c.state1);
    T* __restrict__ v = static_cast<T*>(c.state2);
    const std::int64_t begin = blockIdx.y * kStepSlice + threadIdx.x;
    const std::int64_t end = std::min(c.n, (blockIdx.y + 1) * kStepSlice);
    T w[kPerThread], d[kPerThread], m_old[kPerThread], v_old[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
        const std::int64_t i = begin + k * static_cast<std::int64_t>(kThreads);
        if (i < end) {
            w[k] = p[i];
            d[k] = g[i];
            m_old[k] = m[i];
            v_old[k] = v[i];
        }
    }
    __syncthreads();
    const AdamRule<T> rule(adam_scalars_from(shared_lr, beta1_setting, beta2_setting, eps_setting,
                                             weight_decay_setting, decoupled, shared_bias1, shared_bias2_sqrt),
                           unscale);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
        const std::int64_t i = begin + j * static_cast<std::int64_t>(kThreads);
        if (i >= end) break;
        T gj = d[j];
        if (clip != 1.0) {  // clip_grad_norm's scaling pass, fused: the same product, written back
            gj = gj * clip_scale;
            g[i] = gj;
        }
        T wj = w[j], mi = m_old[j], vi = v_old[j];
        rule(wj, gj, mi, vi);
        m[i] = mi;
        v[i] = vi;
        p[i] = wj;
        if (c.copy != nullptr) store_copy(c, i, wj);
    }
    finish_block(c, s, true);
}

// One thread: out[g] = the lr of group g's next step (a host read), or with no `out` the deferred schedule
// advance applied (apply_schedule).
__global__ void schedule_kernel(StepState s, double* __restrict__ out) {
    if (out == nullptr) {
        apply_schedule_advance(s);
        return;
    }
    for (int g = 0; g < s.groups; ++g) out[g] = step_lr(s, g);
}

template <typename P>
P* advance(P* base, std::int64_t bytes) {
    using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
    return base == nullptr ? nullptr : reinterpret_cast<P*>(reinterpret_cast<Byte*>(base) + bytes);
}

// A run of consecutive table chunks that share a dtype.
struct Group {
    DType dtype;
    std::size_t first;
    std::size_t count;
    unsigned blocks;  // blocks whose slice holds elements (they take part in the step; the rest leave at once)
};

// Cuts the tensors into chunks grouped by dtype and calls launch(group, its chunks, their device copy, whether it
// is the last launch) for each non-empty group; the table is uploaded only when a group has more chunks than a
// launch's parameters hold (the device copy is null otherwise). Returns whether it launched any.
template <typename Launch>
bool for_each_group(StepTable& table, std::span<const StepOperands> tensors, Launch launch) {
    std::vector<std::size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return static_cast<int>(tensors[a].dtype) < static_cast<int>(tensors[b].dtype);
    });

    std::vector<StepChunk> chunks;
    std::vector<Group> groups;
    for (const std::size_t i : order) {
        const StepOperands& t = tensors[i];
        if (groups.empty() || groups.back().dtype != t.dtype) groups.push_back({t.dtype, chunks.size(), 0, 0});
        const auto width = static_cast<std::int64_t>(dtype_size(t.dtype));
        const std::int64_t parameter_blocks = (t.numel + kStepSlice - 1) / kStepSlice;  // non-empty slices
        for (std::int64_t offset = 0; offset < t.numel; offset += kStepChunk) {
            const std::int64_t bytes = offset * width;
            StepChunk chunk{advance(t.param, bytes), advance(t.grad, bytes), advance(t.state1, bytes),
                            advance(t.state2, bytes), std::min(kStepChunk, t.numel - offset), {}, t.group,
                            t.parameter, parameter_blocks,
                            t.dtype == DType::f32 ? advance(t.copy, offset * dtype_size(t.copy_dtype)) : nullptr,
                            t.copy_dtype == DType::f16 ? kCopyF16 : kCopyBf16};
            std::copy(t.scalars.begin(), t.scalars.end(), chunk.scalars);
            chunks.push_back(chunk);
            groups.back().blocks += static_cast<unsigned>((chunk.n + kStepSlice - 1) / kStepSlice);
        }
        groups.back().count = chunks.size() - groups.back().first;
    }
    if (chunks.empty()) return false;
    const bool inline_chunks =
        std::all_of(groups.begin(), groups.end(), [](const Group& g) { return g.count <= kInlineChunks; });
    const StepChunk* device_chunks = inline_chunks ? nullptr : table.upload(chunks);
    std::size_t last = 0;
    for (std::size_t g = 0; g < groups.size(); ++g)
        if (groups[g].count > 0) last = g;
    for (std::size_t g = 0; g < groups.size(); ++g)
        if (groups[g].count > 0)
            launch(groups[g], std::span<const StepChunk>(chunks).subspan(groups[g].first, groups[g].count),
                   device_chunks != nullptr ? device_chunks + groups[g].first : nullptr, g == last);
    return true;
}

// StepState::lr_stored_groups: the groups (< 64) with elements in this step, each of which has a non-empty block.
std::uint64_t groups_with_elements(std::span<const StepOperands> tensors) {
    std::uint64_t groups = 0;
    for (const StepOperands& t : tensors)
        if (t.numel > 0 && t.group >= 0 && t.group < 64) groups |= std::uint64_t{1} << t.group;
    return groups;
}

// The state one launch reads: with a deferred schedule advance, the last launch's last block applies it.
StepState launch_state(const StepState& state, std::span<const StepOperands> tensors, const Group& group, bool last,
                       DeviceContext& ctx) {
    StepState s = state;
    s.applies_schedule = last && state.schedule.count > 0;
    s.lr_stored_groups = state.schedule.count > 0 ? groups_with_elements(tensors) : 0;
    s.launch_blocks = group.blocks;
    s.block_counter = ctx.block_counter;
    return s;
}

}  // namespace

// ---- StepTable ----

StepTable::StepTable(int device) : device_(device), copied_{StreamEvent(device), StreamEvent(device)} {}

StepTable::~StepTable() {
    for (std::size_t slot = 0; slot < pinned_.size(); ++slot) {
        if (pinned_[slot] == nullptr) continue;
        // A queued copy may still read the slot. A failed wait means the device is lost; freeing is
        // then all that is left to do, and a destructor must not throw.
        try {
            copied_[slot].wait();
        } catch (const Error&) {
        }
        free_pinned(pinned_[slot]);
    }
}

const StepChunk* StepTable::upload(const std::vector<StepChunk>& chunks) {
    // In a captured step (cuda/capture.h) the kernels of every replay read the table this capture built,
    // while eager steps may rewrite table_: the capture gets a copy of its own for the graph's lifetime.
    if (capturing(device_))
        return static_cast<const StepChunk*>(capture_constant(chunks.data(), chunks.size() * sizeof(StepChunk)));
    if (chunks == uploaded_) return static_cast<const StepChunk*>(table_.raw_data());
    uploaded_.clear();  // until the new upload is queued, the device table matches nothing
    if (chunks.size() > pinned_capacity_) {
        // Rare: the table grew. Both slots may still be read by queued copies.
        const std::size_t capacity = std::max(chunks.size(), 2 * pinned_capacity_);
        pinned_capacity_ = 0;
        for (std::size_t slot = 0; slot < pinned_.size(); ++slot) {
            copied_[slot].wait();
            free_pinned(std::exchange(pinned_[slot], nullptr));
        }
        for (void*& slot : pinned_) slot = allocate_pinned(capacity * sizeof(StepChunk));
        table_ = Tensor::empty({static_cast<std::int64_t>(capacity * sizeof(StepChunk) / sizeof(std::int64_t))},
                               DType::i64, Device::cuda(device_));
        pinned_capacity_ = capacity;
    }
    const std::size_t bytes = chunks.size() * sizeof(StepChunk);
    copied_[next_slot_].wait();  // the copy that last read this slot, two uploads ago
    std::memcpy(pinned_[next_slot_], chunks.data(), bytes);
    copy_to_device_async(table_.raw_data(), device_, pinned_[next_slot_], bytes);
    copied_[next_slot_].record();
    next_slot_ ^= 1;
    uploaded_ = chunks;
    return static_cast<const StepChunk*>(table_.raw_data());
}

// ---- steps ----

namespace {

// One launch per dtype group of the kernel kernel_of(type_identity<T>, type_identity<Chunks>) returns for element
// type T and chunk source Chunks (sgd_kernel, adam_kernel).
template <typename KernelOf>
bool fused_step(StepTable& table, std::span<const StepOperands> tensors, const StepState& state, const char* who,
                KernelOf kernel_of) {
    DeviceContext& ctx = context(table.device());
    return for_each_group(table, tensors, [&](const Group& group, std::span<const StepChunk> chunks,
                                              const StepChunk* device_chunks, bool last) {
        const StepState s = launch_state(state, tensors, group, last, ctx);
        const dim3 grid(static_cast<unsigned>(group.count), kStepSlices);
        dispatch_floating(group.dtype, who, [&]<typename T>() {
            if (device_chunks != nullptr) {
                const auto kernel = kernel_of(std::type_identity<T>{}, std::type_identity<TableChunks>{});
                kernel<<<grid, kThreads, 0, ctx.stream>>>(TableChunks{device_chunks}, s);
            } else {
                InlineChunks inline_chunks{};
                std::copy(chunks.begin(), chunks.end(), inline_chunks.chunks);
                const auto kernel = kernel_of(std::type_identity<T>{}, std::type_identity<InlineChunks>{});
                kernel<<<grid, kThreads, 0, ctx.stream>>>(inline_chunks, s);
            }
            DG_CUDA_CHECK_LAUNCH();
        });
    });
}

}  // namespace

bool sgd_step(StepTable& table, std::span<const StepOperands> tensors, const StepState& state) {
    return fused_step(table, tensors, state, "SGD",
                      []<typename T, typename Chunks>(std::type_identity<T>, std::type_identity<Chunks>) {
                          return &sgd_kernel<T, Chunks>;
                      });
}

bool adam_step(StepTable& table, std::span<const StepOperands> tensors, const StepState& state) {
    return fused_step(table, tensors, state, "Adam",
                      []<typename T, typename Chunks>(std::type_identity<T>, std::type_identity<Chunks>) {
                          return &adam_kernel<T, Chunks>;
                      });
}

void refuse_in_capture(int device, const char* what, const char* why) { throw_if_capturing(device, what, why); }

void apply_schedule(int device, const StepState& state) {
    DeviceContext& ctx = context(device);
    schedule_kernel<<<1, 1, 0, ctx.stream>>>(state, nullptr);
    DG_CUDA_CHECK_LAUNCH();
}

void next_lrs(int device, const StepState& state, double* out) {
    DeviceContext& ctx = context(device);
    schedule_kernel<<<1, 1, 0, ctx.stream>>>(state, out);
    DG_CUDA_CHECK_LAUNCH();
}

// ---- GradScaler (nn/optim.h; the host side and the CPU rules: nn/optim.cpp): the inf check with optional unscaling
// over batches of gradients, and the scale update, queued with no host synchronisation (capturable). The fused
// steps above read the flags (StepState::inv_scale, found_inf). ----

namespace {

// One thread: inv_scale = 1/scale (in double, rounded to float, as PyTorch) and found_inf = 0.
__global__ void scaler_prepare_kernel(const float* __restrict__ scale, float* __restrict__ inv_scale,
                                      float* __restrict__ found_inf) {
    *inv_scale = static_cast<float>(1.0 / static_cast<double>(*scale));
    *found_inf = 0.0f;
}

// Block b: its slice of the batch; found_inf = 1 where grad·inv_scale is not finite (every writer writes 1,
// so the race is benign); with `unscale`, the products are written back.
template <typename T>
__global__ void scaler_check_kernel(GradBatch batch, const float* __restrict__ inv_scale, float* __restrict__ found_inf,
                                    bool unscale) {
    const BlockSlice slice = block_slice(batch);
    T* __restrict__ g = static_cast<T*>(batch.data[slice.tensor]);
    const T inv = static_cast<T>(*inv_scale);
    bool bad = false;
    for (std::int64_t i = slice.begin; i < slice.end; i += blockDim.x) {
        const T v = g[i] * inv;
        bad = bad || !isfinite(v);
        if (unscale) g[i] = v;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

__global__ void scaler_update_kernel(ScalerRule rule, float* __restrict__ scale, long long* __restrict__ tracker,
                                     long long* __restrict__ skips, const float* __restrict__ found_inf,
                                     DeviceErrorRecord* record) {
    if (*found_inf != 0.0f) {
        const float backed_off = static_cast<float>(static_cast<double>(*scale) * rule.backoff);
        *scale = backed_off;
        *tracker = 0;
        const long long skipped = *skips + 1;
        *skips = skipped;
        if (skipped >= rule.max_skips && static_cast<double>(backed_off) < rule.min_scale &&
            atomicCAS(&record->code, static_cast<int>(DeviceErrorCode::none),
                      static_cast<int>(DeviceErrorCode::loss_scale_collapsed)) == static_cast<int>(DeviceErrorCode::none)) {
            record->index = skipped;
            record->value = __float_as_int(backed_off);
            record->bound = 0;
        }
        return;
    }
    *skips = 0;
    const long long successful = *tracker + 1;
    if (successful == rule.interval) {
        const float grown = static_cast<float>(static_cast<double>(*scale) * rule.growth);
        if (isfinite(grown)) *scale = grown;
        *tracker = 0;
    } else {
        *tracker = successful;
    }
}

}  // namespace

void scaler_check(int device, std::span<const GradOperand> grads, const float* scale, float* inv_scale,
                  float* found_inf, bool unscale) {
    DeviceContext& ctx = context(device);
    require_batch_dtypes(grads, "GradScaler");  // before the prepare kernel resets found_inf
    scaler_prepare_kernel<<<1, 1, 0, ctx.stream>>>(scale, inv_scale, found_inf);
    DG_CUDA_CHECK_LAUNCH();
    for_each_batch(grads, "GradScaler", [&](DType dtype, const GradBatch& batch, unsigned grid) {
        dispatch_floating(dtype, "GradScaler", [&]<typename T>() {
            scaler_check_kernel<T><<<grid, kBatchThreads, 0, ctx.stream>>>(batch, inv_scale, found_inf, unscale);
            DG_CUDA_CHECK_LAUNCH();
        });
    });
}

void scaler_update(int device, const ScalerRule& rule, float* scale, long long* tracker, long long* skips,
                   const float* found_inf) {
    DeviceContext& ctx = context(device);
    scaler_update_kernel<<<1, 1, 0, ctx.stream>>>(rule, scale, tracker, skips, found_inf, ctx.error_record_device);
    DG_CUDA_CHECK_LAUNCH();
}

}  // namespace dyngrad::cuda
