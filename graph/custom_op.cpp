#include "dyngrad/graph/custom_op.h"

#include <deque>
#include <mutex>

namespace dyngrad {

namespace {

struct Registered {
    std::string name;  // owns the characters OpDef::name points at
    OpDef def;
};

// A deque keeps addresses stable as ops are added, so OpDef references stay valid.
std::deque<Registered>& custom_op_registry() {
    static std::deque<Registered> ops;
    return ops;
}
std::mutex& custom_op_registry_mutex() {
    static std::mutex m;
    return m;
}

}  // namespace

CustomOp CustomOp::define(const CustomOpSpec& spec) {
    if (spec.name.empty()) throw ValueError("CustomOp::define: the op needs a name");
    if (spec.arity < 1) throw ValueError(str("CustomOp '", spec.name, "': arity must be >= 1, got ", spec.arity));
    if (!spec.infer || !spec.cpu.forward || !spec.cpu.backward)
        throw ValueError(str("CustomOp '", spec.name, "': needs a shape rule and a CPU forward and backward"));
    if (static_cast<bool>(spec.cuda.forward) != static_cast<bool>(spec.cuda.backward))
        throw ValueError(str("CustomOp '", spec.name, "': give both CUDA forward and backward, or neither"));
    std::lock_guard lock(custom_op_registry_mutex());
    auto& ops = custom_op_registry();
    ops.push_back(Registered{spec.name, OpDef{}});
    Registered& r = ops.back();
    // Reads no attribute but its id (custom_id, set by operator()); autocast treats it as the trampoline row does.
    r.def = OpDef{OpType::Custom, r.name.c_str(), spec.arity, spec.infer, spec.cpu, spec.cuda,
                  spec.cases ? spec.cases : +[]() { return std::vector<OpCase>{}; }, kNoAttrs, AutocastPolicy::Follow,
                  nullptr};
    r.def.differentiable_backward = spec.differentiable_backward;
    return CustomOp(static_cast<std::uint32_t>(ops.size() - 1));
}

Var CustomOp::operator()(const std::vector<Var>& inputs, OpAttrs attrs, std::source_location where) const {
    if (inputs.empty() || !inputs.front().defined())
        throw GraphError(str("custom op '", def().name, "' at ", describe_site(where), ": needs defined inputs"));
    attrs.custom_id = id_;
    return inputs.front().graph().record(OpType::Custom, inputs, attrs, where);
}

const OpDef& CustomOp::def() const { return custom_op_def(id_); }

const OpDef& custom_op_def(std::uint32_t custom_id) {
    std::lock_guard lock(custom_op_registry_mutex());
    const auto& ops = custom_op_registry();
    if (custom_id >= ops.size()) throw GraphError(str("no custom op with id ", custom_id));
    return ops[custom_id].def;
}

std::uint32_t custom_op_id(const OpDef& def) {
    std::lock_guard lock(custom_op_registry_mutex());
    const auto& ops = custom_op_registry();
    for (std::size_t i = 0; i < ops.size(); ++i)
        if (&ops[i].def == &def) return static_cast<std::uint32_t>(i);
    throw GraphError(str("op '", def.name, "' is not a registered custom op"));
}

}  // namespace dyngrad
