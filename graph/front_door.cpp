// The front door of every op function (graph/front_door.h): the row's argument rule, then record or eager.
#include "dyngrad/graph/front_door.h"

#include <array>
#include <vector>

namespace dyngrad {

void prepare_call(const OpDef& def, OpCall& call) {
    if (def.prepare != nullptr) def.prepare(call);
    std::size_t present = call.size();
    while (present > 0 && call.value(present - 1) == nullptr) --present;
    for (std::size_t i = 0; i < present; ++i)
        if (call.value(i) == nullptr)
            throw ValueError(str(def.name, ": input ", i, " is left out but input ", present - 1,
                                 " is given; only trailing optional inputs may be left out"));
}

namespace {

// The operands of one C++ call, defined or not, with room for what the argument rule fills in.
template <typename T>
class FrontDoorCall final : public OpCall {
public:
    FrontDoorCall(std::initializer_list<T> inputs, OpAttrs& attrs, AttrSet given, std::source_location where)
        : OpCall(attrs, given), operands_(inputs), where_(where) {}
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
    // The operands up to the last one present.
    std::vector<T> operands() {
        std::size_t present = operands_.size();
        while (present > 0 && !operands_[present - 1].defined()) --present;
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
    FrontDoorCall<Var> call(inputs, prepared, given, where);
    prepare_call(def, call);
    const std::vector<Var> operands = call.operands();
    return operands.front().graph().record(op, operands, prepared, where);
}

Tensor apply_op(OpType op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs, std::source_location where,
                AttrSet given) {
    const OpDef& def = op_def(op);
    if (direct(def, inputs)) return eager(op, inputs, attrs, where);
    OpAttrs prepared = attrs;
    FrontDoorCall<Tensor> call(inputs, prepared, given, where);
    prepare_call(def, call);
    const std::vector<Tensor> operands = call.operands();
    return eager(op, operands, prepared, where);
}

}  // namespace dyngrad
