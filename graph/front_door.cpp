// The front door of every op function (graph/front_door.h): the row's argument rule, then record or eager.
#include "dyngrad/graph/front_door.h"

#include <iterator>
#include <vector>

namespace dyngrad {

namespace {
// How many of a call's first inputs the row requires (all of them for a variadic row).
std::size_t required_inputs(const OpDef& def, std::size_t given) {
    return def.arity == kVariadic ? given : static_cast<std::size_t>(def.arity - def.optional_inputs);
}
}  // namespace

void prepare_call(const OpDef& def, OpCall& call) {
    if (def.prepare != nullptr) def.prepare(call);
    const std::size_t required = required_inputs(def, call.size());
    std::size_t present = call.size();
    while (present > required && call.value(present - 1) == nullptr) --present;
    // An undefined required input goes on to the engine, which names it as for any op.
    for (std::size_t i = required; i < present; ++i)
        if (call.value(i) == nullptr)
            throw ValueError(str(def.name, ": input ", i, " is left out but input ", present - 1,
                                 " is given; only trailing optional inputs may be left out"));
}

namespace {

// The operands of one C++ call, defined or not, with room for what the argument rule fills in.
template <typename T>
class FrontDoorCall final : public OpCall {
public:
    FrontDoorCall(std::span<const T> inputs, std::size_t required, OpAttrs& attrs, AttrSet given,
                  std::source_location where)
        : OpCall(attrs, given, where), operands_(inputs.begin(), inputs.end()), required_(required) {}
    std::size_t size() const override { return operands_.size(); }
    const Tensor* value(std::size_t i) const override {
        if (!operands_[i].defined()) return nullptr;
        if constexpr (std::same_as<T, Var>) return &operands_[i].value();
        else return &operands_[i];
    }
    void fill(std::size_t i, const Tensor& constant) override {
        if constexpr (std::same_as<T, Var>) operands_[i] = graph().constant(constant, where);
        else operands_[i] = constant;
    }
    // The operands up to the last one present (the required ones in any case).
    std::vector<T> operands() {
        std::size_t present = operands_.size();
        while (present > required_ && !operands_[present - 1].defined()) --present;
        operands_.resize(present);
        return std::move(operands_);
    }

private:
    ComputeGraph& graph() const {
        for (const T& v : operands_)
            if (v.defined()) return v.graph();
        return operands_.front().graph();  // throws: an undefined Var has no graph
    }
    std::vector<T> operands_;
    std::size_t required_;
};

// Whether the call can go straight to the engine: no rule to run, nothing left out (the engine then names an
// undefined input itself).
template <typename T>
bool direct(const OpDef& def, std::span<const T> inputs) {
    if (def.prepare != nullptr) return false;
    if (def.optional_inputs == 0) return true;
    for (const T& v : inputs)
        if (!v.defined()) return false;
    return true;
}

// Records over Var operands in their graph, or runs over Tensor operands at once.
Var run(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs, std::source_location where) {
    return inputs.begin()->graph().record(op, inputs, attrs, where);
}
Var run(OpType op, const std::vector<Var>& inputs, const OpAttrs& attrs, std::source_location where) {
    if (inputs.empty()) throw ValueError(str(op_def(op).name, ": needs at least one input"));
    return inputs.front().graph().record(op, inputs, attrs, where);
}
Tensor run(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs, std::source_location where) {
    return eager(op, inputs, attrs, where);
}

// The front door: straight to run() when there is nothing to prepare, else the row's rule first.
template <typename T, typename Inputs>
T apply_inputs(OpType op, const Inputs& inputs, const OpAttrs& attrs, std::source_location where, AttrSet given) {
    const OpDef& def = op_def(op);
    const std::span<const T> operands(std::data(inputs), inputs.size());
    if (direct(def, operands)) return run(op, inputs, attrs, where);
    OpAttrs prepared = attrs;
    FrontDoorCall<T> call(operands, required_inputs(def, operands.size()), prepared, given, where);
    prepare_call(def, call);
    return run(op, call.operands(), prepared, where);
}

}  // namespace

Var apply_op(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs, std::source_location where,
             AttrSet given) {
    return apply_inputs<Var>(op, inputs, attrs, where, given);
}
Tensor apply_op(OpType op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs, std::source_location where,
                AttrSet given) {
    return apply_inputs<Tensor>(op, inputs, attrs, where, given);
}
Var apply_op(OpType op, const std::vector<Var>& inputs, const OpAttrs& attrs, std::source_location where,
             AttrSet given) {
    return apply_inputs<Var>(op, inputs, attrs, where, given);
}
Tensor apply_op(OpType op, const std::vector<Tensor>& inputs, const OpAttrs& attrs, std::source_location where,
                AttrSet given) {
    return apply_inputs<Tensor>(op, inputs, attrs, where, given);
}


Var apply_exact(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs, std::source_location where) {
    return run(op, inputs, attrs, where);
}
Tensor apply_exact(OpType op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs, std::source_location where) {
    return run(op, inputs, attrs, where);
}

}  // namespace dyngrad
