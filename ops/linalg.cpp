// Matrix products: user functions, shape rules and the CPU kernels (Eigen GEMM on row-major maps).
// Layout ops: ops/layout.cpp. GPU: ops/linalg.cu.
#include "dyngrad/ops/linalg.h"

#include <utility>

#include <Eigen/Core>

#include "dyngrad/core/checked.h"
#include "dyngrad/ops/cpu_parallel.h"
#include "dyngrad/ops/differentiable_backward.h"
#include "dyngrad/ops/eigen_maps.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/kernels.h"
#include "dyngrad/ops/linalg_geometry.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/reduce.h"

namespace dyngrad {

namespace {

// Linear takes x (*, in) as libtorch does: the leading dims become the rows of the 2-D op and come back
// afterwards (x (in) is one row, y (out)). Reshapes share storage and are differentiable, so the kernels, the
// op table's cases and the goldens stay 2-D. A rank-0 x or a weight that is not 2-D reaches the op unchanged
// and gets its shape error. When recording, `check_rows` runs the 2-D op's checks on the rows' shape first
// (check_op_call), so a refused call records no reshape.
template <class V, class Rows, class CheckRows>
V over_rows(const V& x, const V& weight, Rows&& linear_2d, CheckRows&& check_rows, std::source_location where) {
    const Shape& shape = x.shape();
    if (shape.size() == 2 || shape.empty() || weight.shape().size() != 2) return linear_2d(x);
    Shape lead(shape.begin(), shape.end() - 1);
    const Shape rows{numel(lead), shape.back()};
    if constexpr (std::same_as<V, Var>) check_rows(value_of(x).reshaped(rows));
    const V y = linear_2d(reshape(x, rows, where));
    lead.push_back(weight.shape()[0]);
    return reshape(y, lead, where);
}

}  // namespace

// No Linear node without a bias: the composite records existing ops and needs no kernel of its own.
template <Operand T>
T linear(const T& x, const T& weight, const T& bias, Activation activation, std::source_location where) {
    if (!bias.defined()) {
        const T y = over_rows(x, weight, [&](const T& rows) {
            return matmul(rows, transpose(weight, -2, -1, where), where);
        }, [&](const Tensor& rows) {
            // matmul(rows, weightᵀ)'s rule reads only shapes and dtypes: a (in, out) handle of the weight stands in.
            const Tensor& w = value_of(weight);
            const Tensor operands[] = {rows, w.reshaped({w.size(1), w.size(0)})};
            check_op_call(OpType::Matmul, operands, {}, where);
        }, where);
        return activation == Activation::Relu ? relu(y, where) : y;
    }
    OpAttrs attrs;
    attrs.activation = activation;
    return over_rows(x, weight, [&](const T& rows) { return apply_op(OpType::Linear, {rows, weight, bias}, attrs, where); },
                     [&](const Tensor& rows) {
                         const Tensor operands[] = {rows, value_of(weight), value_of(bias)};
                         check_op_call(OpType::Linear, operands, attrs, where);
                     }, where);
}
template Var linear(const Var&, const Var&, const Var&, Activation, std::source_location);
template Tensor linear(const Tensor&, const Tensor&, const Tensor&, Activation, std::source_location);

// a (…,M,K)  b (…,K,N):  da = dy·bᵀ,  db = aᵀ·dy
std::vector<Var> matmul_differentiable_backward(const DiffBackwardArgs& args) {
    const Var& g = args.grad_output;
    std::vector<Var> grads(2);
    if (args.needs_grad[0]) grads[0] = matmul(g, transpose(args.inputs[1]));
    if (args.needs_grad[1]) grads[1] = matmul(transpose(args.inputs[0]), g);
    return grads;
}

// x (N,in)  w (out,in)  b (out):  dz = dy (masked where the fused ReLU's output is 0),  dx = dz·w,  dw = dzᵀ·x,
// db = Σ_rows dz
std::vector<Var> linear_differentiable_backward(const DiffBackwardArgs& args) {
    Var dz = args.grad_output;
    if (args.attrs.activation == Activation::Relu) dz = mul(dz, args.output.graph().constant(args.output.value() > 0.0));
    std::vector<Var> grads(3);
    if (args.needs_grad[0]) grads[0] = matmul(dz, args.inputs[1]);
    if (args.needs_grad[1]) grads[1] = matmul(transpose(dz), args.inputs[0]);
    if (args.needs_grad[2]) grads[2] = sum(dz, {0});
    return grads;
}

namespace infer {

OutputSpec matmul(OpType, std::span<const Tensor> inputs, const OpAttrs&) {
    const Tensor& a = inputs[0];
    const Tensor& b = inputs[1];
    require_float(a, "a");
    require_same_dtype(a, "a", b, "b");
    if (a.rank() != b.rank() || (a.rank() != 2 && a.rank() != 3))
        throw ShapeError(str("expects two 2-D or two 3-D operands, got ", to_string(a.shape()), " and ",
                             to_string(b.shape())));
    const std::size_t r = a.rank();
    if (a.shape()[r - 1] != b.shape()[r - 2])
        throw ShapeError(str("inner dims ", a.shape()[r - 1], " vs ", b.shape()[r - 2]));
    if (r == 3 && a.shape()[0] != b.shape()[0])
        throw ShapeError(str("batch dims ", a.shape()[0], " vs ", b.shape()[0]));
    Shape out = r == 2 ? Shape{a.shape()[0], b.shape()[1]} : Shape{a.shape()[0], a.shape()[1], b.shape()[2]};
    // With an empty inner dim the operands hold nothing, yet (M,N) can have more elements than int64 counts.
    checked_numel(out, "output");
    return {std::move(out), a.dtype()};
}

OutputSpec linear(OpType, std::span<const Tensor> inputs, const OpAttrs& attrs) {
    if (attrs.activation != Activation::None && attrs.activation != Activation::Relu)
        throw ValueError(str("unknown activation ", static_cast<int>(attrs.activation)));
    const Tensor& x = inputs[0];
    const Tensor& weight = inputs[1];
    const Tensor& bias = inputs[2];
    require_float(x, "x");
    require_same_dtype(x, "x", weight, "weight");
    require_same_dtype(x, "x", bias, "bias");
    if (x.rank() != 2 || weight.rank() != 2 || bias.rank() != 1)
        throw ShapeError(str("expects x (N,in), weight (out,in), bias (out), got ", to_string(x.shape()), ", ",
                             to_string(weight.shape()), ", ", to_string(bias.shape())));
    if (x.shape()[1] != weight.shape()[1])
        throw ShapeError(str("in features ", x.shape()[1], " vs ", weight.shape()[1]));
    if (bias.shape()[0] != weight.shape()[0])
        throw ShapeError(str("bias of ", bias.shape()[0], " for ", weight.shape()[0], " out features"));
    return {{x.shape()[0], weight.shape()[0]}, x.dtype()};
}

}  // namespace infer

namespace cpu {

// a (M,K)  b (K,N)  y (M,N);  batched: a (B,M,K)  b (B,K,N)  y (B,M,N)
Tensor matmul_forward(const ForwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Tensor& b = args.inputs[1];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, a.device());
    const MatmulDims d = matmul_dims(a, b);
    dispatch_floating(y.dtype(), "matmul", [&]<typename T>() {
        for (std::int64_t i = 0; i < d.batch; ++i) {
            const ConstMatrixMap<T> A(a.data<T>() + i * d.m * d.k, d.m, d.k);
            const ConstMatrixMap<T> B(b.data<T>() + i * d.k * d.n, d.k, d.n);
            MatrixMap<T> Y(y.data<T>() + i * d.m * d.n, d.m, d.n);
            parallel_gemm(Y, A, B);
        }
    });
    return y;
}

// dy (M,N) -> da = dy·bᵀ (M,K), db = aᵀ·dy (K,N); per batch when batched
std::vector<Tensor> matmul_backward(const BackwardArgs& args) {
    const Tensor& a = args.inputs[0];
    const Tensor& b = args.inputs[1];
    const Tensor& dy = args.grad_output;
    std::vector<Tensor> grads(2);
    if (args.needs_grad[0]) grads[0] = Tensor::empty(a.shape(), a.dtype(), a.device());
    if (args.needs_grad[1]) grads[1] = Tensor::empty(b.shape(), b.dtype(), b.device());
    const MatmulDims d = matmul_dims(a, b);
    dispatch_floating(a.dtype(), "matmul backward", [&]<typename T>() {
        for (std::int64_t i = 0; i < d.batch; ++i) {
            const ConstMatrixMap<T> A(a.data<T>() + i * d.m * d.k, d.m, d.k);
            const ConstMatrixMap<T> B(b.data<T>() + i * d.k * d.n, d.k, d.n);
            const ConstMatrixMap<T> dY(dy.data<T>() + i * d.m * d.n, d.m, d.n);
            if (grads[0].defined()) {
                MatrixMap<T> dA(grads[0].data<T>() + i * d.m * d.k, d.m, d.k);
                parallel_gemm(dA, dY, B.transpose());
            }
            if (grads[1].defined()) {
                MatrixMap<T> dB(grads[1].data<T>() + i * d.k * d.n, d.k, d.n);
                parallel_gemm(dB, A.transpose(), dY);
            }
        }
    });
    return grads;
}

// x (N,in)  w (out,in)  b (out)  y (N,out) = act(x·wᵀ + b), act per attrs.activation (None or ReLU)
Tensor linear_forward(const ForwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& w = args.inputs[1];
    const Tensor& b = args.inputs[2];
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype, x.device());
    dispatch_floating(y.dtype(), "linear", [&]<typename T>() {
        const ConstMatrixMap<T> X(x.data<T>(), x.size(0), x.size(1));
        const ConstMatrixMap<T> W(w.data<T>(), w.size(0), w.size(1));
        const Eigen::Map<const RowVector<T>> bias(b.data<T>(), b.size(0));
        MatrixMap<T> Y(y.data<T>(), y.size(0), y.size(1));
        parallel_gemm(Y, X, W.transpose());
        Y.rowwise() += bias;
        // ReluOp's formula (ops/elementwise_math.h): NaN propagates, as in the relu op.
        if (args.attrs.activation == Activation::Relu) Y = Y.unaryExpr([](T v) { return math::ReluOp::forward(v, T(0)); });
    });
    return y;
}

// dy (N,out) -> dz = ReluOp::masked_gradient(y, dy) with the fused ReLU (dy otherwise), dx = dz·w (N,in), dw = dzᵀ·x (out,in), db = column sums of dz (out)
std::vector<Tensor> linear_backward(const BackwardArgs& args) {
    const Tensor& x = args.inputs[0];
    const Tensor& w = args.inputs[1];
    const Tensor& b = args.inputs[2];
    const Tensor& dy = args.grad_output;
    std::vector<Tensor> grads(3);
    dispatch_floating(x.dtype(), "linear backward", [&]<typename T>() {
        const ConstMatrixMap<T> X(x.data<T>(), x.size(0), x.size(1));
        const ConstMatrixMap<T> W(w.data<T>(), w.size(0), w.size(1));
        MatrixRM<T> masked;
        const T* dz = dy.data<T>();
        if (args.attrs.activation == Activation::Relu) {
            const ConstMatrixMap<T> Y(args.output.data<T>(), dy.size(0), dy.size(1));
            masked = Y.binaryExpr(ConstMatrixMap<T>(dz, dy.size(0), dy.size(1)),
                                  [](T yv, T g) { return math::ReluOp::masked_gradient(yv, g); });
            dz = masked.data();
        }
        const ConstMatrixMap<T> dZ(dz, dy.size(0), dy.size(1));
        if (args.needs_grad[0]) {
            grads[0] = Tensor::empty(x.shape(), x.dtype(), x.device());
            parallel_gemm(MatrixMap<T>(grads[0].data<T>(), x.size(0), x.size(1)), dZ, W);
        }
        if (args.needs_grad[1]) {
            grads[1] = Tensor::empty(w.shape(), w.dtype(), w.device());
            parallel_gemm(MatrixMap<T>(grads[1].data<T>(), w.size(0), w.size(1)), dZ.transpose(), X);
        }
        if (args.needs_grad[2]) {
            grads[2] = Tensor::empty(b.shape(), b.dtype(), b.device());
            // No rows: dy has no storage, and Eigen's column blocks of a null map would offset a null pointer (UBSan,
            // the fuzzer's input in tests/fuzz/corpus/fuzz_graph/): the sums are zeros.
            if (dy.size(0) == 0)
                Eigen::Map<RowVector<T>>(grads[2].data<T>(), b.size(0)).setZero();
            else
                Eigen::Map<RowVector<T>>(grads[2].data<T>(), b.size(0)) = dZ.colwise().sum();
        }
    });
    return grads;
}

}  // namespace cpu

}  // namespace dyngrad
