// Regularisation: dropout and its seed stream. CPU: ops/dropout.cpp. GPU: ops/dropout.cu. The mask formula
// both backends share: ops/dropout_mask.h.
#pragma once
#include <cstdint>
#include <source_location>

#include "dyngrad/graph/front_door.h"

namespace dyngrad {

// training: zeroes each element with probability p in [0, 1) and scales the survivors by 1/(1 − p);
// the mask is a function of (seed, element index) alone, the same on every backend (ops/dropout_mask.h).
// eval (or p = 0): the identity. One front door over Var (recorded) and Tensor (eager); graph/front_door.h.
template <Operand T>
T dropout(const T& x, double p, bool training, std::uint64_t seed, Loc where = Loc::current()) {
    return apply_op(OpType::Dropout, {x},
                    op_attrs(&OpAttrs::scalar, p, &OpAttrs::training, training, &OpAttrs::seed, seed), where);
}
// The same with the mask seed read from `seed`, a one-element int64 tensor on x's device (its bits are the
// seed), where the kernels read it: a captured step whose seed tensor is rewritten on the device draws fresh
// masks on every replay, and the node (its seed input) records the seed each replay used, so the CPU replay
// (verify) and the backward reproduce the mask. DTypeError/ShapeError for another seed tensor.
// A seed given undefined is the engine's error, as any undefined input.
template <Operand T>
T dropout(const T& x, double p, bool training, const T& seed, Loc where = Loc::current()) {
    const OpAttrs attrs = op_attrs(&OpAttrs::scalar, p, &OpAttrs::training, training);
    if (!seed.defined()) return apply_exact(OpType::Dropout, {x, seed}, attrs, where);
    return apply_op(OpType::Dropout, {x, seed}, attrs, where);
}

// A stream of dropout mask seeds whose draw counter lives on the device that draws the masks: next(device)
// returns a fresh one-element int64 tensor on `device` holding the seed of draw n = ++counter,
// math::dropout_draw_seed(seed, n) (ops/dropout_mask.h). On a GPU the counter is advanced by a kernel, so a
// captured step draws new seeds on every replay: exactly those the same number of eager draws gets. The
// counter moves to the device of the first draw there (a host-to-device copy: not inside a captured step,
// GraphError). Copies of a handle share the stream.
class DropoutSeeds;

// The Dropout layer's form: draws the next seed of `seeds` on x's device and applies its mask, recording the
// seed-tensor form above (the node's seed input holds the drawn seed). On a GPU the draw is fused into the
// dropout kernel: no launch of its own (the one-thread kernel of DropoutSeeds::next is left for empty x, the
// identity, and a dropout that a fused group computes: graph/fusion_replay.h). The draw and the masks are exactly
// those of next() followed by the seed-tensor form. A call the op refuses (ValueError for p outside [0, 1),
// DTypeError for a non-float x) draws nothing.
Var dropout(const Var& x, double p, bool training, DropoutSeeds& seeds,
            std::source_location where = std::source_location::current());

class DropoutSeeds {
public:
    explicit DropoutSeeds(std::uint64_t seed);
    Tensor next(Device device);
    std::uint64_t seed() const { return seed_; }
    // Draws so far (a host read of the device counter: a host synchronisation).
    std::uint64_t draws() const;
    // The counter tensor (int64, one element), for CapturedStep's guard state.
    const Tensor& counter() const { return counter_; }

private:
    friend Var dropout(const Var& x, double p, bool training, DropoutSeeds& seeds, std::source_location where);
    std::uint64_t seed_;
    Tensor counter_;
};

}  // namespace dyngrad
