// Fused multi-tensor optimizer steps: SGD (momentum, Nesterov, L2) and Adam / AdamW. The optimizers
// (nn/optim.cpp) hand over every CUDA parameter of one device at once; the tensors are cut into chunks
// of at most kStepChunk elements, the chunk table lives on the device (StepTable, nn/optim_kernels.h),
// and one kernel launch updates every chunk of one (dtype, Adam step) group, one block per chunk.
// In a captured step the hyper-parameters (lr, ...) are frozen into the graph's kernel arguments.
// The formulas and their order match the Eigen updates in nn/optim.cpp, which are the reference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/nn/optim_kernels.h"

namespace dyngrad::cuda {

namespace {

constexpr std::int64_t kStepChunk = std::int64_t{1} << 15;  // elements per block: 128 per thread
constexpr unsigned kThreads = 256;
static_assert(sizeof(StepChunk) % sizeof(std::int64_t) == 0, "the table is stored as int64 words");

using std::sqrt;

// The hyper-parameters as kernel arguments, in the element type.
template <typename T>
struct SgdArgs {
    T lr, momentum, weight_decay;
    bool nesterov;
};
template <typename T>
struct AdamArgs {
    T beta1, one_minus_beta1, beta2, one_minus_beta2, eps, l2, decay, step_size, bias2_sqrt;
};

// chunks[blockIdx.x]: param, grad, momentum buffer (null without momentum), all (n).
template <typename T>
__global__ void sgd_kernel(const StepChunk* __restrict__ chunks, SgdArgs<T> a) {
    const StepChunk c = chunks[blockIdx.x];
    T* __restrict__ p = static_cast<T*>(c.param);
    const T* __restrict__ g = static_cast<const T*>(c.grad);
    T* __restrict__ buffer = static_cast<T*>(c.state1);
    for (std::int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        const T w = p[i];
        T d = g[i];
        if (a.weight_decay != T(0)) d = d + a.weight_decay * w;
        if (buffer != nullptr) {
            const T b = a.momentum * buffer[i] + d;
            buffer[i] = b;
            d = a.nesterov ? d + a.momentum * b : b;
        }
        p[i] = w - a.lr * d;
    }
}

// chunks[blockIdx.x]: param, grad, m, v, all (n).
template <typename T>
__global__ void adam_kernel(const StepChunk* __restrict__ chunks, AdamArgs<T> a) {
    const StepChunk c = chunks[blockIdx.x];
    T* __restrict__ p = static_cast<T*>(c.param);
    const T* __restrict__ g = static_cast<const T*>(c.grad);
    T* __restrict__ m = static_cast<T*>(c.state1);
    T* __restrict__ v = static_cast<T*>(c.state2);
    for (std::int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
        T w = p[i];
        if (a.decay != T(1)) w = w * a.decay;
        T d = g[i];
        if (a.l2 != T(0)) d = d + a.l2 * w;
        const T mi = a.beta1 * m[i] + a.one_minus_beta1 * d;
        const T vi = a.beta2 * v[i] + a.one_minus_beta2 * (d * d);
        m[i] = mi;
        v[i] = vi;
        p[i] = w - a.step_size * mi / (sqrt(vi) / a.bias2_sqrt + a.eps);
    }
}

template <typename P>
P* advance(P* base, std::int64_t bytes) {
    using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
    return base == nullptr ? nullptr : reinterpret_cast<P*>(reinterpret_cast<Byte*>(base) + bytes);
}

// A run of consecutive table chunks that share a dtype and (for Adam) a step count.
struct Group {
    DType dtype;
    std::int64_t step;
    std::size_t first;
    std::size_t count;
};

// Cuts the tensors into chunks grouped by (dtype, step; step ignored unless by_step), uploads the
// table and calls launch(group, device chunks of the group) for each non-empty group.
template <typename Launch>
void for_each_group(StepTable& table, std::span<const StepOperands> tensors, bool by_step, Launch launch) {
    const auto key = [&](std::size_t i) {
        return std::pair(static_cast<int>(tensors[i].dtype), by_step ? tensors[i].step : 0);
    };
    std::vector<std::size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });

    std::vector<StepChunk> chunks;
    std::vector<Group> groups;
    for (const std::size_t i : order) {
        const StepOperands& t = tensors[i];
        if (groups.empty() || groups.back().dtype != t.dtype || (by_step && groups.back().step != t.step))
            groups.push_back({t.dtype, t.step, chunks.size(), 0});
        const auto width = static_cast<std::int64_t>(dtype_size(t.dtype));
        for (std::int64_t offset = 0; offset < t.numel; offset += kStepChunk) {
            const std::int64_t bytes = offset * width;
            chunks.push_back({advance(t.param, bytes), advance(t.grad, bytes), advance(t.state1, bytes),
                              advance(t.state2, bytes), std::min(kStepChunk, t.numel - offset)});
        }
        groups.back().count = chunks.size() - groups.back().first;
    }
    if (chunks.empty()) return;
    const StepChunk* device_chunks = table.upload(chunks);
    for (const Group& group : groups)
        if (group.count > 0) launch(group, device_chunks + group.first);
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

void sgd_step(StepTable& table, std::span<const StepOperands> tensors, const SgdHyper& hyper) {
    DeviceContext& ctx = context(table.device());
    for_each_group(table, tensors, false, [&](const Group& group, const StepChunk* chunks) {
        dispatch_floating(group.dtype, "SGD", [&]<typename T>() {
            const SgdArgs<T> args{static_cast<T>(hyper.lr), static_cast<T>(hyper.momentum),
                                  static_cast<T>(hyper.weight_decay), hyper.nesterov};
            sgd_kernel<T><<<static_cast<unsigned>(group.count), kThreads, 0, ctx.stream>>>(chunks, args);
            DG_CUDA_CHECK_LAUNCH();
        });
    });
}

void adam_step(StepTable& table, std::span<const StepOperands> tensors, const AdamHyper& hyper) {
    throw_if_capturing(table.device(), hyper.decoupled ? "AdamW::step()" : "Adam::step()",
                       "its bias corrections depend on the step count, which a replay cannot advance; capture "
                       "steps that use SGD, or run Adam steps eagerly");
    DeviceContext& ctx = context(table.device());
    for_each_group(table, tensors, true, [&](const Group& group, const StepChunk* chunks) {
        const AdamScalars s = adam_scalars(hyper, group.step);
        dispatch_floating(group.dtype, hyper.decoupled ? "AdamW" : "Adam", [&]<typename T>() {
            const AdamArgs<T> args{static_cast<T>(s.beta1), static_cast<T>(s.one_minus_beta1),
                                   static_cast<T>(s.beta2), static_cast<T>(s.one_minus_beta2),
                                   static_cast<T>(s.eps),   static_cast<T>(s.l2),
                                   static_cast<T>(s.decay), static_cast<T>(s.step_size),
                                   static_cast<T>(s.bias2_sqrt)};
            adam_kernel<T><<<static_cast<unsigned>(group.count), kThreads, 0, ctx.stream>>>(chunks, args);
            DG_CUDA_CHECK_LAUNCH();
        });
    });
}

}  // namespace dyngrad::cuda
