// Autocast (graph/autocast.h): the policy table, the per-thread guard state, the parameter-cast cache, and the
// hooks the engine calls before it records (or eagerly runs) an op while autocast is on.
#include "dyngrad/graph/autocast.h"

#include <atomic>
#include <map>
#include <string_view>

#include "dyngrad/core/environment.h"
#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

namespace {

// Why each op has its policy: docs/mixed_precision.md. Every row of the table states one (ops/op_table.cpp).
AutocastPolicy policy_of(OpType op) { return *op_def(op).autocast; }

constexpr bool castable(DType dtype) { return dtype == DType::f32 || is_reduced_precision(dtype); }

// Per thread: the guard's dtype, how many guards are alive, and the parameter-cast cache.
struct CacheKey {
    const ComputeGraph* graph;
    const void* parameter;  // Parameter::identity()
    DType dtype;
    bool grad;  // a cast recorded under NoGradGuard has no history: never reused with grad on
    auto operator<=>(const CacheKey&) const = default;
};
struct CacheEntry {
    Var cast;                   // the cast node (stale once its graph is cleared or destroyed)
    const void* storage;        // the parameter value's data when cast
    std::uint32_t version = 0;  // and its storage version
    // And the storage itself: another storage at the same address (memory freed and reused, e.g. by ZeRO-3's
    // forwards of one unit recorded into one graph, distributed/zero3.cpp) is not the value that was cast.
    std::weak_ptr<const Storage> reference;
};
struct ThreadState {
    std::optional<DType> dtype;
    int depth = 0;
    std::map<CacheKey, CacheEntry> cache;
    AutocastCacheStats stats;
};
thread_local ThreadState tls;

// More entries than any model has parameters: drop the stale ones (graphs cleared under one long guard).
constexpr std::size_t kCachePurgeSize = 4096;
void purge_stale() {
    for (auto it = tls.cache.begin(); it != tls.cache.end();)
        it = it->second.cast.is_live() ? std::next(it) : tls.cache.erase(it);
}

OpAttrs cast_attrs(DType dtype) {
    OpAttrs attrs;
    attrs.dtype = dtype;
    return attrs;
}

Var record_cast(const Var& x, DType dtype) {
    return x.graph().record(OpType::Cast, {x}, cast_attrs(dtype), std::source_location::current());
}

// DYNGRAD_AUTOCAST_PARAMETER_COPIES=0 turns the kept copies off (set_autocast_parameter_copies overrides it).
std::atomic<int> parameter_copies_override{-1};  // -1: the environment's
bool keeps_parameter_copies() {
    if (const int set = parameter_copies_override.load(std::memory_order_relaxed); set >= 0) return set != 0;
    static const bool from_environment = environment("DYNGRAD_AUTOCAST_PARAMETER_COPIES") != "0";
    return from_environment;
}

// x cast to `dtype`: a parameter leaf through the cache, anything else by a new cast node. A parameter that an
// optimizer updates keeps its cast across steps (Parameter::keep_reduced_copy); the optimizer's step rewrites
// it, and a later graph takes it as the cast's value when it is current: no cast kernel.
Var cast_input(const Var& x, const Tensor& value, DType dtype) {
    const ComputeNode& node = x.node();
    if (node.op != OpType::Leaf || !node.parameter.defined()) return record_cast(x, dtype);
    const CacheKey key{&x.graph(), node.parameter.identity(), dtype, grad_enabled()};
    const void* storage = value.raw_data();
    const std::uint32_t version = value.version();
    if (const auto found = tls.cache.find(key); found != tls.cache.end()) {
        const CacheEntry& entry = found->second;
        if (entry.cast.is_live() && entry.storage == storage && entry.version == version &&
            value.uses_storage(entry.reference)) {
            ++tls.stats.hits;
            return entry.cast;
        }
    }
    if (tls.cache.size() >= kCachePurgeSize) purge_stale();
    Var cast;
    Parameter parameter = node.parameter;  // shares the parameter's state
    const bool kept = keeps_parameter_copies() && value.dtype() == DType::f32 && parameter.has_updater();
    if (const Tensor copy = kept ? parameter.current_reduced_copy(dtype) : Tensor(); copy.defined()) {
        const Var inputs[] = {x};
        cast = x.graph().record_precomputed(OpType::Cast, inputs, cast_attrs(dtype), copy,
                                            std::source_location::current());
        ++tls.stats.copies_used;
    } else {
        cast = record_cast(x, dtype);
        if (kept) parameter.keep_reduced_copy(cast.value());
    }
    ++tls.stats.casts;
    tls.cache.insert_or_assign(key, CacheEntry{cast, storage, version, value.storage_reference()});
    return cast;
}

template <typename Values>
std::optional<DType> target_of(OpType op, const Values& values) {
    std::vector<DType> dtypes;
    dtypes.reserve(values.size());
    for (const Tensor& v : values) dtypes.push_back(v.dtype());
    return autocast_target(op, dtypes, *tls.dtype);
}

}  // namespace

AutocastPolicy autocast_policy(OpType op) { return policy_of(op); }

std::string_view autocast_policy_name(AutocastPolicy policy) {
    switch (policy) {
        case AutocastPolicy::Reduced: return "reduced";
        case AutocastPolicy::Float32: return "float32";
        case AutocastPolicy::Follow: return "follow";
    }
    return "unknown";
}

std::optional<DType> autocast_target(OpType op, std::span<const DType> input_dtypes, DType autocast_dtype) {
    if (!is_reduced_precision(autocast_dtype))
        throw DTypeError(str("autocast: the autocast dtype must be bfloat16 or float16, got ",
                             dtype_name(autocast_dtype)));
    if (op == OpType::Cast) return std::nullopt;  // the casts autocast records
    std::optional<DType> target;
    switch (policy_of(op)) {
        case AutocastPolicy::Reduced: target = autocast_dtype; break;
        case AutocastPolicy::Float32: target = DType::f32; break;
        case AutocastPolicy::Follow: {
            // Mixed floating dtypes promote to the widest, which for {f32, bf16, f16} is f32 unless all agree.
            std::optional<DType> first;
            for (const DType d : input_dtypes) {
                if (!castable(d)) continue;
                if (!first) first = d;
                else if (d != *first) target = DType::f32;
            }
            break;
        }
    }
    if (!target) return std::nullopt;
    for (const DType d : input_dtypes)
        if (castable(d) && d != *target) return target;
    return std::nullopt;
}

AutocastGuard::AutocastGuard(DType dtype) : previous_(tls.dtype) {
    if (dtype != DType::f32 && !is_reduced_precision(dtype))
        throw DTypeError(str("AutocastGuard: expects bfloat16 or float16 (or float32 to turn autocast off), got ",
                             dtype_name(dtype)));
    tls.dtype = dtype == DType::f32 ? std::nullopt : std::optional<DType>(dtype);
    ++tls.depth;
}

AutocastGuard::~AutocastGuard() {
    tls.dtype = previous_;
    if (--tls.depth == 0) {
        tls.cache.clear();
        tls.stats = {};
    }
}

namespace {
std::atomic<int> batched_casts_override{-1};  // -1: the environment's
std::atomic<std::int64_t> batched_casts_done{0};
std::atomic<std::int64_t> batched_cast_batches{0};
}  // namespace

void set_batched_gradient_casts(bool batch) { batched_casts_override.store(batch ? 1 : 0); }
bool batched_gradient_casts() {
    if (const int set = batched_casts_override.load(std::memory_order_relaxed); set >= 0) return set != 0;
    static const bool from_environment = environment("DYNGRAD_BATCH_GRADIENT_CASTS") != "0";
    return from_environment;
}
BatchedGradientCastStats batched_gradient_cast_stats() {
    return {batched_casts_done.load(std::memory_order_relaxed), batched_cast_batches.load(std::memory_order_relaxed)};
}
namespace detail {
void count_batched_gradient_casts(std::int64_t casts) {
    batched_casts_done.fetch_add(casts, std::memory_order_relaxed);
    batched_cast_batches.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

std::optional<DType> autocast_dtype() { return tls.dtype; }
void set_autocast_parameter_copies(bool keep) { parameter_copies_override.store(keep ? 1 : 0); }
bool autocast_parameter_copies() { return keeps_parameter_copies(); }
AutocastCacheStats autocast_cache_stats() { return tls.stats; }

namespace detail {

std::optional<std::vector<Var>> autocast_inputs(OpType op, std::span<const Var> inputs,
                                                std::span<const Tensor> values) {
    const std::optional<DType> target = target_of(op, values);
    if (!target) return std::nullopt;
    std::vector<Var> cast(inputs.begin(), inputs.end());
    for (std::size_t i = 0; i < cast.size(); ++i)
        if (castable(values[i].dtype()) && values[i].dtype() != *target)
            cast[i] = cast_input(inputs[i], values[i], *target);
    return cast;
}

std::optional<std::vector<Tensor>> autocast_tensors(OpType op, std::span<const Tensor> inputs) {
    const std::optional<DType> target = target_of(op, inputs);
    if (!target) return std::nullopt;
    std::vector<Tensor> cast(inputs.begin(), inputs.end());
    for (Tensor& t : cast)
        if (castable(t.dtype()) && t.dtype() != *target) t = eager(OpType::Cast, {t}, cast_attrs(*target));
    return cast;
}

}  // namespace detail

}  // namespace dyngrad
