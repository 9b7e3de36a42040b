#include "dyngrad/graph/fusion_check.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <set>

#include "dyngrad/core/environment.h"
#include "dyngrad/graph/backend.h"

namespace dyngrad {
namespace {

std::atomic<bool> g_enabled{environment("DYNGRAD_CHECK_FUSIONS") == "1"};

struct FusionCheckRegistry {
    std::mutex mutex;
    std::set<std::string> checked;  // "forward|key", "backward|key"
    std::vector<FusionCheckResult> results;
};
FusionCheckRegistry& fusion_check_registry() {
    static FusionCheckRegistry r;
    return r;
}

// Fused and unfused paths sum in different orders (an epilogue adds the bias to the GEMM's accumulator, the
// unfused path to its rounded output; cuBLASLt may split K differently): a few units of the dtype's rounding,
// relative to the largest magnitude. A wrong formula is off by O(1) of that scale.
double tolerance_for(DType dtype) {
    switch (dtype) {
        case DType::f64: return 1e-10;
        case DType::f32: return 2e-5;
        case DType::bf16: return 3e-2;
        case DType::f16: return 4e-3;
        case DType::i64: break;
    }
    return 0;
}

std::string key_of(const OpDef& def, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    std::string key = str(def.name, " on ", inputs.front().device().to_string());
    for (const Tensor& t : inputs) key += str(" ", to_string(t.shape()), dtype_name(t.dtype()));
    return key + str(" ", attrs_text(def, attrs));  // every attribute the op reads (its row's field list)
}

// True the first time `pass|key` is seen (the caller then checks it).
bool first_use(const std::string& pass, const std::string& key) {
    FusionCheckRegistry& r = fusion_check_registry();
    const std::lock_guard lock(r.mutex);
    return r.checked.insert(pass + "|" + key).second;
}

void compare(const OpDef& def, const std::string& key, const std::string& pass, const Tensor& fused,
             const Tensor& unfused) {
    FusionCheckResult result{def.name, key, pass, 0, 0, tolerance_for(fused.dtype()), false};
    if (fused.shape() != unfused.shape())
        throw NumericalError(str("fused-kernel check: ", def.name, " ", pass, " for ", key, ": fused shape ",
                                 to_string(fused.shape()), ", unfused ", to_string(unfused.shape())));
    const std::vector<double> a = fused.to_vector();
    const std::vector<double> b = unfused.to_vector();
    bool finite = true;
    for (std::size_t i = 0; i < a.size(); ++i) {
        result.max_abs_error = std::max(result.max_abs_error, std::fabs(a[i] - b[i]));
        result.scale = std::max(result.scale, std::fabs(b[i]));
        finite = finite && std::isfinite(a[i]) == std::isfinite(b[i]);
    }
    result.passed = finite && result.max_abs_error <= result.tolerance * std::max(result.scale, 1e-30);
    {
        FusionCheckRegistry& r = fusion_check_registry();
        const std::lock_guard lock(r.mutex);
        r.results.push_back(result);
    }
    if (!result.passed)
        throw NumericalError(str("fused-kernel check: ", def.name, " ", pass, " for ", key,
                                 " disagrees with its unfused composition: max |fused - unfused| = ",
                                 result.max_abs_error, " against max |unfused| = ", result.scale,
                                 " (tolerance ", result.tolerance, " relative)", finite ? "" : "; non-finite values differ"));
}

}  // namespace

void set_fusion_check(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool fusion_check_enabled() { return g_enabled.load(std::memory_order_relaxed); }

std::vector<FusionCheckResult> fusion_check_results() {
    FusionCheckRegistry& r = fusion_check_registry();
    const std::lock_guard lock(r.mutex);
    return r.results;
}

void clear_fusion_check_results() {
    FusionCheckRegistry& r = fusion_check_registry();
    const std::lock_guard lock(r.mutex);
    r.results.clear();
    r.checked.clear();
}

namespace detail {

void check_fused_forward(const OpDef& def, OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs,
                         const Tensor& output) {
    if (inputs.empty()) return;
    const UnfusedComposition* unfused = def.unfused;
    if (unfused == nullptr || (unfused->applies && !unfused->applies(inputs, attrs))) return;
    const std::string key = key_of(def, inputs, attrs);
    if (!first_use("forward", key)) return;
    const NoGradGuard no_history;
    ComputeGraph graph;
    std::vector<Var> leaves;
    for (const Tensor& t : inputs) leaves.push_back(graph.input(t));
    compare(def, key, "forward", output, unfused->compose(leaves, attrs).value());
}

void check_fused_backward(const OpDef& def, OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs,
                          const Tensor& grad_output, std::span<const Tensor> grads, std::span<const bool> needs_grad) {
    if (inputs.empty()) return;
    const UnfusedComposition* unfused = def.unfused;
    if (unfused == nullptr || (unfused->applies && !unfused->applies(inputs, attrs))) return;
    const std::string key = key_of(def, inputs, attrs);
    if (!first_use("backward", key)) return;
    struct Recording {
        bool previous = exchange_grad_enabled(true);
        ~Recording() { exchange_grad_enabled(previous); }
    } recording;
    ComputeGraph graph;
    std::vector<Var> leaves;
    for (std::size_t i = 0; i < inputs.size(); ++i) leaves.push_back(graph.input(inputs[i], "", needs_grad[i]));
    const Var out = unfused->compose(leaves, attrs);
    graph.backward(out, grad_output);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (!needs_grad[i]) continue;
        // A kernel may return a broadcast-shaped gradient; the engine reduces it after this hook.
        const Tensor fused = grads[i].shape() == inputs[i].shape() ? grads[i] : sum_to(grads[i], inputs[i].shape());
        compare(def, key, str("backward input ", i), fused, leaves[i].grad());
    }
}

}  // namespace detail
}  // namespace dyngrad
