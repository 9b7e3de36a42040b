// The front door of every op function (graph/front_door.h): the row's argument rule, then record or eager.
#include "dyngrad/graph/front_door.h"

#include <array>
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
    FrontDoorCall(std::initializer_list<T> inputs, std::size_t required, OpAttrs& attrs, AttrSet given,
                  std::source_location where)
        : OpCall(attrs, given), operands_(inputs), required_(required), where_(where) {}
    std::size_t size() const override { return operands_.size(); }
    const Tensor* value(std::size_t i) const override {
        if (!operands_[i].defined()) return nullptr;
        if constexpr (std::same_as<T, Var>) return &operands_[i].value();
        else return &operands_[i];
    }
    void fill(std::size_t i, const Tensor& constant) override {
        if constexpr (std::same_as<T, Var>) operands_[i] = graph().constant(constant, where_);
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
    std::source_location where_;
};

// Whether the call can go straight to the engine: no rule to run, nothing left out (the engine then names an
// undefined input itself).
template <typename T>
bool direct(const OpDef& def, std::initializer_list<T> inputs) {
    if (def.prepare != nullptr) return false;
    if (def.optional_inputs == 0) return true;
    for (const T& v : inputs)
        if (!v.defined()) return false;
    return true;
}

}  // namespace

Var apply_op(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs, std::source_location where,
             AttrSet given) {
    const OpDef& def = op_def(op);
    if (direct(def, inputs)) return inputs.begin()->graph().record(op, inputs, attrs, where);
    OpAttrs prepared = attrs;
    FrontDoorCall<Var> call(inputs, required_inputs(def, inputs.size()), prepared, given, where);
    prepare_call(def, call);
    const std::vector<Var> operands = call.operands();
    return operands.front().graph().record(op, operands, prepared, where);
}

Tensor apply_op(OpType op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs, std::source_location where,
                AttrSet given) {
    const OpDef& def = op_def(op);
    if (direct(def, inputs)) return eager(op, inputs, attrs, where);
    OpAttrs prepared = attrs;
    FrontDoorCall<Tensor> call(inputs, required_inputs(def, inputs.size()), prepared, given, where);
    prepare_call(def, call);
    const std::vector<Tensor> operands = call.operands();
    return eager(op, operands, prepared, where);
}

}  // namespace dyngrad
