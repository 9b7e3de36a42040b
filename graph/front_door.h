// One front door per op. Every op function is one template over its operand type: Var (recorded in the
// operands' graph, differentiable) or Tensor (eager: run at once through the same kernels, no graph, no
// gradient; graph/eager.h). Both go through apply_op, which runs the row's argument rule (OpDef::prepare: the
// defaults that depend on the inputs, such as rms_norm's eps or a bias given without a weight) and then records
// or runs the row. Python's dg.ops.<name> runs the same rule (python/src), so no default is written twice.
#pragma once
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <source_location>
#include <span>
#include <utility>
#include <vector>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

using Loc = std::source_location;

// The operand types of an op function.
template <typename T>
concept Operand = std::same_as<T, Var> || std::same_as<T, Tensor>;

// Records `op` over Var inputs in their graph, or runs it eagerly over Tensor inputs. An undefined input in the
// row's optional tail is left out once the row's argument rule had its chance to fill it; `given` names the
// attributes the caller set (the rule fills the others where they depend on the inputs).
Var apply_op(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs, std::source_location where,
             AttrSet given = {});
Tensor apply_op(OpType op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs, std::source_location where,
                AttrSet given = {});
// The same over a list built at run time (concat's operands).
Var apply_op(OpType op, const std::vector<Var>& inputs, const OpAttrs& attrs, std::source_location where,
             AttrSet given = {});
Tensor apply_op(OpType op, const std::vector<Tensor>& inputs, const OpAttrs& attrs, std::source_location where,
                AttrSet given = {});

// Records or runs `op` over exactly these operands, with no argument rule and nothing left out: for a form whose
// caller names every operand, so that an undefined one is the engine's error (ValueError/GraphError naming it).
Var apply_exact(OpType op, std::initializer_list<Var> inputs, const OpAttrs& attrs, std::source_location where);
Tensor apply_exact(OpType op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs, std::source_location where);

// `op`'s checks up to its shape rule (input count, devices, dtypes, OpDef::infer) on these values, recording and
// running nothing; throws what recording would. A composite that records a helper node (a reshape) before the op
// calls it first, so that a refused call leaves the graph as it was. Under autocast it checks nothing (the op
// would see autocast's casts, which only recording makes).
void check_op_call(OpType op, std::span<const Tensor> inputs, const OpAttrs& attrs, std::source_location where);

// Attributes with the named fields set and the others at their defaults:
// op_attrs(&OpAttrs::axis, axis, &OpAttrs::keepdim, keepdim).
inline void set_attrs(OpAttrs&) {}
template <typename Member, typename Value, typename... Rest>
void set_attrs(OpAttrs& attrs, Member OpAttrs::*field, Value&& value, Rest&&... rest) {
    attrs.*field = std::forward<Value>(value);
    set_attrs(attrs, std::forward<Rest>(rest)...);
}
template <typename... FieldsAndValues>
OpAttrs op_attrs(FieldsAndValues&&... fields_and_values) {
    OpAttrs attrs;
    set_attrs(attrs, std::forward<FieldsAndValues>(fields_and_values)...);
    return attrs;
}

// An operand's value: the Var's, or the Tensor itself (a composite's shape checks read it).
inline const Tensor& value_of(const Tensor& value) { return value; }
inline const Tensor& value_of(const Var& var) { return var.value(); }

// A tensor that takes part in a call as an operand of type T: itself eagerly, a constant of x's graph when
// recording (batch_norm's running statistics, which the forward updates in place).
inline const Tensor& as_operand(const Tensor& value, const Tensor& /*like*/, std::source_location /*where*/) {
    return value;
}
inline Var as_operand(const Tensor& value, const Var& like, std::source_location where) {
    return like.graph().constant(value, where);
}

// One call as a row's argument rule sees it, whatever holds its operands (Var, Tensor, Python's tensors).
class OpCall {
public:
    OpCall(OpAttrs& attrs, AttrSet given, std::source_location where) : attrs(attrs), given(given), where(where) {}
    OpCall(const OpCall&) = delete;
    OpCall& operator=(const OpCall&) = delete;
    virtual std::size_t size() const = 0;
    // Operand i's value; nullptr where the caller left it out.
    virtual const Tensor* value(std::size_t i) const = 0;
    // Gives a left-out operand a constant value (it gets no gradient).
    virtual void fill(std::size_t i, const Tensor& constant) = 0;
    bool gave(std::size_t field) const { return given.contains(field); }

    OpAttrs& attrs;
    const AttrSet given;
    const std::source_location where;  // the caller's site, for a rule's errors

protected:
    ~OpCall() = default;
};
// Runs `def`'s argument rule over `call` (nothing when the row has none), then checks that no operand before a
// present one is still left out: a TypeError-like ValueError naming the op and the operand.
void prepare_call(const OpDef& def, OpCall& call);

}  // namespace dyngrad
