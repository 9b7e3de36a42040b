// Regularisation: dropout. The user functions, the seed stream (DropoutSeeds), the shape rule, the CPU forward
// (Eigen) and the one backward of every backend. GPU forward: ops/dropout.cu. The mask is a pure function of
// (seed, element index), ops/dropout_mask.h, so both backends drop the same elements and the backward
// recomputes it instead of saving it.
#include "dyngrad/ops/dropout.h"

#include <Eigen/Core>
#include <vector>

#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/dropout_mask.h"
#include "dyngrad/ops/kernels.h"

namespace dyngrad {

// ---- user functions: the DropoutSeeds form (the front doors are in ops/dropout.h) ----
// A refused call (the op's checks) draws nothing: the counter advances only once the node is recorded.
Var dropout(const Var& x, double p, bool training, DropoutSeeds& seeds, std::source_location where) {
    const Device device = x.device();
    if (seeds.counter_.device() != device) seeds.counter_ = seeds.counter_.to(device);  // as next()
#if DYNGRAD_WITH_CUDA
    if (device.is_cuda()) {
        Tensor slot = Tensor::empty({1}, DType::i64, device);  // written by the dropout kernel
        cuda::FusedSeedDraw draw{seeds.counter_.data<std::int64_t>(), seeds.seed_, slot.data<std::int64_t>()};
        struct Install {  // for this record only, also when it throws
            cuda::FusedSeedDraw* previous;
            ~Install() { cuda::set_fused_seed_draw(previous); }
        } const install{cuda::set_fused_seed_draw(&draw)};
        Var y = dropout(x, p, training, x.graph().constant(slot, where), where);
        // No dropout kernel took the draw (the identity, an empty x): its own kernel, so every call draws one.
        if (!draw.consumed) cuda::next_dropout_seed(seeds.counter_, seeds.seed_, slot);
        return y;
    }
#endif
    std::int64_t& draws = seeds.counter_.data<std::int64_t>()[0];
    const auto seed = math::dropout_draw_seed(seeds.seed_, static_cast<std::uint64_t>(draws + 1));
    Var y = dropout(x, p, training,
                    x.graph().constant(Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(seed)}, {1}),
                                       where),
                    where);
    ++draws;
    return y;
}

DropoutSeeds::DropoutSeeds(std::uint64_t seed)
    : seed_(seed), counter_(Tensor::zeros({1}, DType::i64)) {}

Tensor DropoutSeeds::next(Device device) {
    if (counter_.device() != device) counter_ = counter_.to(device);  // the only host-to-device copy
    Tensor out = Tensor::empty({1}, DType::i64, device);
    if (device.is_cpu()) {
        auto& n = counter_.data<std::int64_t>()[0];
        n += 1;
        out.data<std::int64_t>()[0] =
            static_cast<std::int64_t>(math::dropout_draw_seed(seed_, static_cast<std::uint64_t>(n)));
        return out;
    }
#if DYNGRAD_WITH_CUDA
    cuda::next_dropout_seed(counter_, seed_, out);
#endif
    return out;
}

std::uint64_t DropoutSeeds::draws() const {
    return static_cast<std::uint64_t>(counter_.to(Device::cpu()).data<std::int64_t>()[0]);
}

namespace infer {

OutputSpec dropout(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    const Tensor& x = inputs[0];
    require_float(x, "x");
    if (!(attrs.scalar >= 0 && attrs.scalar < 1)) throw ValueError(str("p must be in [0, 1), got ", attrs.scalar));
    if (inputs.size() > 1) {
        const Tensor& seed = inputs[1];
        if (seed.dtype() != DType::i64)
            throw DTypeError(str("dropout's seed must be an int64 tensor, got ", dtype_name(seed.dtype())));
        if (seed.numel() != 1)
            throw ShapeError(str("dropout's seed must hold one element, got shape ", to_string(seed.shape())));
    }
    return {x.shape(), x.dtype()};
}

}  // namespace infer

namespace cpu {

namespace {

template <typename T> using Column = Eigen::Array<T, Eigen::Dynamic, 1>;

// The mask seed: the seed input's bits when given, else the attribute.
std::uint64_t mask_seed(std::span<const Tensor> inputs, const OpAttrs& attrs) {
    return inputs.size() > 1 ? static_cast<std::uint64_t>(inputs[1].data<std::int64_t>()[0]) : attrs.seed;
}

// Each element scaled by its mask value: 1/(1 − p) where kept, 0 where dropped.
template <typename T>
auto dropout_mask(const OpAttrs& attrs, std::uint64_t seed, std::int64_t n) {
    const double p = attrs.scalar;
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    return Column<T>::NullaryExpr(n, [seed, p, scale](Eigen::Index i) {
        return math::dropout_keep(seed, static_cast<std::uint64_t>(i), p) ? scale : T(0);
    });
}

}  // namespace

// x (any shape) [seed (int64, one element)] -> y like x: x · mask, mask = 1/(1 − p) or 0 per element (identity
// in eval or at p = 0). The backward runs it on dy.
Tensor dropout_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    dispatch_floating(x.dtype(), "dropout", [&]<typename T>() {
        const std::int64_t n = x.numel();
        const Eigen::Map<const Column<T>> X(x.data<T>(), n);
        Eigen::Map<Column<T>> Y(y.data<T>(), n);
        if (math::dropout_is_identity(args.attrs.training, args.attrs.scalar))
            Y = X;
        else
            Y = X * dropout_mask<T>(args.attrs, mask_seed(args.inputs, args.attrs), n);
    });
    return y;
}

}  // namespace cpu

// dy -> dx = dy · mask, the forward's mask recomputed from (seed, index): the forward itself applied to dy (with
// the node's seed input, so a captured replay's backward uses the seed its forward read), on dy's backend.
std::vector<Tensor> dropout_backward(const BackwardArgs& args) {
    std::vector<Tensor> grads(args.inputs.size());  // none for the seed
    if (!args.needs_grad[0]) return grads;
    const Tensor& dy = args.grad_output;
    if (math::dropout_is_identity(args.attrs.training, args.attrs.scalar)) {
        grads[0] = dy;
        return grads;
    }
    std::vector<Tensor> forward_inputs(args.inputs.begin(), args.inputs.end());
    forward_inputs[0] = dy;
    grads[0] = backend_forward(OpType::Dropout, forward_inputs, args.attrs, {dy.shape(), dy.dtype()});
    return grads;
}

// The differentiable backward: the same mask (recomputed from the node's seed) applied to dy, as a recorded
// dropout node — linear in dy, so its own backward is the same mask again, to any order.
std::vector<Var> dropout_differentiable_backward(const DiffBackwardArgs& args) {
    std::vector<Var> grads(args.inputs.size());  // none for the seed
    if (!args.needs_grad[0]) return grads;
    const Var& g = args.grad_output;
    if (math::dropout_is_identity(args.attrs.training, args.attrs.scalar)) {
        grads[0] = g;
        return grads;
    }
    std::vector<Var> inputs(args.inputs.begin(), args.inputs.end());
    inputs[0] = g;
    grads[0] = g.graph().record(OpType::Dropout, inputs, args.attrs, std::source_location::current());
    return grads;
}

}  // namespace dyngrad
