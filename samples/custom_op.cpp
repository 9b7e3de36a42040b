// A user-defined op registered from user code: sum_of_squares(a, b) = a² + b² (elementwise), with its
// own forward and backward on the CPU and (when dyngrad has CUDA) as a CUDA kernel in
// custom_op_kernels.cu. SGD on two parameter vectors minimises L = Σ(a² + b²) towards 0; the loss is
// printed every 25 of 500 epochs, and the op is verified by the same replay machinery as built-in ops.
// dyngrad's SGD optimizer updates the parameters (on the GPU in one fused launch).
//   custom_op [--device cpu|cuda]
#include <dyngrad/dyngrad.h>

#include <cstdio>
#include <cstring>

#include "../cli/command_line.h"
#include "custom_op_kernels.h"

using namespace dyngrad;

namespace {

// Shape rule: a and b of one shape and one float dtype.
OutputSpec sum_of_squares_infer(OpType, std::span<const Tensor> in, const OpAttrs&) {
    if (in[0].shape() != in[1].shape())
        throw ShapeError(str("a ", to_string(in[0].shape()), " and b ", to_string(in[1].shape()), " differ"));
    if (in[0].dtype() != in[1].dtype() || !is_floating(in[0].dtype()))
        throw DTypeError(str("needs float a and b of one dtype, got ", dtype_name(in[0].dtype()), " and ",
                             dtype_name(in[1].dtype())));
    return {in[0].shape(), in[0].dtype()};
}

template <typename T>
Tensor forward_cpu_typed(const ForwardArgs& args) {
    Tensor y = Tensor::empty(args.out.shape, args.out.dtype);
    const T* a = args.inputs[0].data<T>();
    const T* b = args.inputs[1].data<T>();
    T* out = y.data<T>();
    for (std::int64_t i = 0; i < y.numel(); ++i) out[i] = a[i] * a[i] + b[i] * b[i];
    return y;
}

// da = 2a·dy, db = 2b·dy
template <typename T>
std::vector<Tensor> backward_cpu_typed(const BackwardArgs& args) {
    std::vector<Tensor> grads(2);
    const T* dy = args.grad_output.data<T>();
    for (int k = 0; k < 2; ++k) {
        if (!args.needs_grad[k]) continue;
        grads[k] = Tensor::empty(args.inputs[k].shape(), args.inputs[k].dtype());
        const T* x = args.inputs[k].data<T>();
        T* dx = grads[k].data<T>();
        for (std::int64_t i = 0; i < grads[k].numel(); ++i) dx[i] = T(2) * x[i] * dy[i];
    }
    return grads;
}

Tensor forward_cpu(const ForwardArgs& args) {
    return dispatch_floating(args.out.dtype, "sum_of_squares", [&]<typename T>() { return forward_cpu_typed<T>(args); });
}
std::vector<Tensor> backward_cpu(const BackwardArgs& args) {
    return dispatch_floating(args.grad_output.dtype(), "sum_of_squares",
                             [&]<typename T>() { return backward_cpu_typed<T>(args); });
}

std::vector<OpCase> sum_of_squares_cases() { return {{"vector", {{5}, {5}}, {}, {}}, {"matrix", {{3, 4}, {3, 4}}, {}, {}}}; }

const CustomOp& sum_of_squares() {
    static const CustomOp op = CustomOp::define({.name = "sum_of_squares",
                                                 .arity = 2,
                                                 .infer = sum_of_squares_infer,
                                                 .cpu = {forward_cpu, backward_cpu},
                                                 .cuda = custom_op_cuda_kernels(),
                                                 .cases = sum_of_squares_cases});
    return op;
}

}  // namespace

int main(int argc, char** argv) {
    return cli::guarded_main("custom_op", [&] {
        const cli::Arguments args(argc, argv, {.options = {"--device"}});
        if (args.help()) {
            std::puts("usage: custom_op [--device cpu|cuda]");
            return 0;
        }
        Device device = Device::cpu();
        if (auto v = args.value("--device")) device = cli::parse_device("--device", *v, {"cpu", "cuda"});
        if (device.is_cuda() && !custom_op_cuda_kernels().forward)
            throw DeviceError("--device cuda: this sample was built without CUDA");

        // The op's own gradient check, as for built-in ops.
        Generator gen(7);
        for (const OpCase& c : sum_of_squares().def().cases()) {
            const CheckResult r = finite_difference_check(sum_of_squares().def(), c, gen);
            std::printf("finite_diff %-8s max_rel_err %.2e %s\n", c.label.c_str(), r.max_rel_err, r.pass ? "PASS" : "FAIL");
            if (!r.pass) return 1;
        }

        Parameter a(Tensor::uniform({8}, -2, 2, gen).to(device), "a");
        Parameter b(Tensor::uniform({8}, -2, 2, gen).to(device), "b");
        SGD sgd({a, b}, {.lr = 0.01});
        constexpr int kEpochs = 500;
        double loss_value = 0;
        for (int epoch = 0; epoch < kEpochs; ++epoch) {
            ComputeGraph graph;
            Var loss = sum(sum_of_squares()({graph.parameter(a), graph.parameter(b)}));
            sgd.zero_grad();
            if (epoch == 0) {
                // Replay the recorded graph on the CPU in float64 and compare every value and gradient
                // (verify runs the backward itself).
                const VerifyReport report = verify(graph, loss);
                std::printf("verify (replay on CPU, float64): %s\n", report.summary().c_str());
                if (!report.pass) return 1;
            } else {
                graph.backward(loss);
            }
            sgd.step();
            loss_value = loss.item();
            if (epoch % 25 == 0 || epoch == kEpochs - 1) std::printf("epoch %3d  loss %.6g\n", epoch, loss_value);
        }
        std::printf("final loss %.3g on %s\n", loss_value, device.to_string().c_str());
        return loss_value < 1e-3 ? 0 : 1;
    }, " (--help shows the usage)");
}
