// What the fusion compiler's CPU tests share: fresh random inputs on the CPU, node ids of Vars, a group's outputs.
#pragma once
#include <initializer_list>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_plan.h"

namespace fusion_test {

inline dyngrad::Tensor random(const dyngrad::Shape& shape, dyngrad::Generator& gen) {
    return dyngrad::Tensor::uniform(shape, -1.0, 1.0, gen);
}

inline std::vector<dyngrad::NodeId> ids(std::initializer_list<dyngrad::Var> vars) {
    std::vector<dyngrad::NodeId> out;
    for (const dyngrad::Var& v : vars) out.push_back(v.id());
    return out;
}

inline std::vector<dyngrad::NodeId> output_nodes(const dyngrad::fusion::FusionGroup& group) {
    std::vector<dyngrad::NodeId> out;
    for (const dyngrad::fusion::GroupOutput& o : group.outputs) out.push_back(o.node);
    return out;
}

}  // namespace fusion_test
