// Internal (CUDA translation units only): the one plan-cache policy of the CUDA backend. Every op family
// that builds library plans (cuDNN convolution, pooling and RNN descriptors with their chosen algorithms,
// cuBLASLt matmul descriptors with their heuristic's algorithm) keeps them in plan_cache<Key, Plan>(), so
// an op builds them once per key and its later calls only look them up.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace dyngrad::cuda {

// Plans by key (a struct with a defaulted operator<=> over everything the plan depends on). A plan is
// immutable once built, or guards its own lazily filled parts; callers hold a shared_ptr, so eviction never
// frees a plan in use. When the cache is full it is emptied: workloads cycle through few shapes, and a
// rebuild costs one first call.
template <typename Key, typename Plan>
class PlanCache {
public:
    static constexpr std::size_t kCapacity = 256;

    // The plan for `key`; on a miss `make()` builds it (host-side descriptor setup, under the lock).
    template <typename Make>
    std::shared_ptr<Plan> get(const Key& key, Make&& make) {
        const std::lock_guard lock(mutex_);
        if (const auto found = plans_.find(key); found != plans_.end()) return found->second;
        if (plans_.size() >= kCapacity) plans_.clear();
        std::shared_ptr<Plan> plan = make();
        plans_.emplace(key, plan);
        return plan;
    }

private:
    std::mutex mutex_;
    std::map<Key, std::shared_ptr<Plan>> plans_;
};

// The process's cache of `Plan`s by `Key`. Leaked on purpose: plans hold library descriptors, which must not
// be destroyed while the libraries unload at process exit (see the release of the contexts in cuda/context.cu).
// So a plan must own no device memory: nothing would ever return it (the exit release empties only the block
// cache and the capture pools), and memory allocated while a step is captured belongs to that step's pool.
// Device buffers an op needs go in per-call Workspaces (e.g. cuDNN RNN's sequence lengths, ops/rnn.cu).
template <typename Key, typename Plan>
PlanCache<Key, Plan>& plan_cache() {
    static auto& cache = *new PlanCache<Key, Plan>();
    return cache;
}

}  // namespace dyngrad::cuda
