// Shared by test_gradcheck's and test_gpu's [subsets] tests: an op-table case run with only some of its
// differentiable inputs requiring grad.
#pragma once
#include <cstddef>
#include <source_location>
#include <vector>

#include "dyngrad/dyngrad.h"

namespace dgtest {

// The inputs of a case whose gradient the checks compare (graph/gradcheck.h: float, not Labels or Constant).
inline std::vector<std::size_t> differentiable_inputs(const dyngrad::OpCase& op_case,
                                                      const std::vector<dyngrad::Tensor>& inputs) {
    std::vector<std::size_t> found;
    for (std::size_t i = 0; i < inputs.size(); ++i)
        if (dyngrad::gradient_checked(op_case, i, inputs[i])) found.push_back(i);
    return found;
}

// wants[i] per input for every non-empty subset of `differentiable` (the full set last).
inline std::vector<std::vector<bool>> grad_subsets(std::size_t input_count,
                                                   const std::vector<std::size_t>& differentiable) {
    std::vector<std::vector<bool>> subsets;
    for (std::size_t mask = 1; mask < (std::size_t{1} << differentiable.size()); ++mask) {
        std::vector<bool> wants(input_count, false);
        for (std::size_t bit = 0; bit < differentiable.size(); ++bit)
            if (mask >> bit & 1) wants[differentiable[bit]] = true;
        subsets.push_back(std::move(wants));
    }
    return subsets;
}

// The op applied to `inputs` (on their device) with input i requiring grad exactly when wants[i], back-
// propagating `weights`: each input's gradient (undefined where it got none), whether it reported requiring
// grad, and whether it has a gradient.
struct SubsetRun {
    std::vector<dyngrad::Tensor> grads;
    std::vector<bool> requires_grad;
    std::vector<bool> has_grad;
};
inline SubsetRun run_with_grad_subset(const dyngrad::OpDef& def, const dyngrad::OpCase& op_case,
                                      const std::vector<dyngrad::Tensor>& inputs, const std::vector<bool>& wants,
                                      const dyngrad::Tensor& weights) {
    dyngrad::ComputeGraph graph;
    std::vector<dyngrad::Var> vars;
    for (std::size_t i = 0; i < inputs.size(); ++i)
        vars.push_back(graph.input(inputs[i], dyngrad::str("input", i), wants[i]));
    const dyngrad::Var y = graph.record(def.op, vars, op_case.attrs, std::source_location::current());
    graph.backward(y, weights);
    SubsetRun run;
    for (const dyngrad::Var& v : vars) {
        run.requires_grad.push_back(v.requires_grad());
        try {
            run.grads.push_back(v.grad());
            run.has_grad.push_back(true);
        } catch (const dyngrad::GraphError&) {  // the documented answer for a node without a gradient
            run.grads.emplace_back();
            run.has_grad.push_back(false);
        }
    }
    return run;
}

// The run with every differentiable input requiring grad (the reference) and the other subsets to compare
// with it (grad_subsets less the full set).
struct SubsetPlan {
    SubsetRun reference;
    std::vector<std::vector<bool>> others;
};
inline SubsetPlan plan_grad_subsets(const dyngrad::OpDef& def, const dyngrad::OpCase& op_case,
                                    const std::vector<dyngrad::Tensor>& inputs,
                                    const std::vector<std::size_t>& differentiable, const dyngrad::Tensor& weights) {
    std::vector<std::vector<bool>> subsets = grad_subsets(inputs.size(), differentiable);
    SubsetRun reference = run_with_grad_subset(def, op_case, inputs, subsets.back(), weights);
    subsets.pop_back();
    return {std::move(reference), std::move(subsets)};
}

}  // namespace dgtest
