// Generated kernels on the GPU against the unfused kernels (docs/fusion.md, "What must run on the GPU"): a graph
// recorded on the device runs its ops' own kernels; each fused group's generated kernel then runs on the same
// inputs and its outputs are compared with the values the unfused kernels stored. The CUDA build only (the loader
// uses the driver API); without a device the executable exits 77 (CTest: skipped).
#include <cmath>
#include <random>
#include <vector>

#include "catch.h"
#include "dyngrad/cuda/fused_kernel.h"
#include "dyngrad/dyngrad.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/fusion_source.h"

using namespace dyngrad;
using namespace dyngrad::fusion;

namespace {

const Device kGpu = Device::cuda(0);

Tensor random(const Shape& shape, DType dtype, Generator& gen) {
    return Tensor::uniform(shape, -2.0, 2.0, gen).to(dtype).to(kGpu);
}

// Runs the generated kernel of `group` on the values the graph holds and returns its outputs, in the order of
// FusedKernelSource::outputs.
std::vector<Tensor> run_generated(const ComputeGraph& graph, const FusionGroup& group) {
    const FusedKernelSource source = generate_fused_source(graph, group);
    const cuda::CompiledKernel compiled = cuda::compile_fused_kernel(
        source.source, source.name, {.arch = cuda::device_arch(0), .kind = cuda::ImageKind::Cubin, .cache_dir = {},
                                     .use_cache = false});
    const cuda::FusedKernel kernel(compiled, 0);
    std::vector<void*> pointers;
    for (NodeId id : source.inputs) pointers.push_back(graph.node(id).value.raw_data());
    std::vector<Tensor> outputs;
    for (NodeId id : source.outputs) {
        const Tensor& value = graph.node(id).value;
        outputs.push_back(Tensor::empty(value.shape(), value.dtype(), kGpu));
        pointers.push_back(outputs.back().raw_data());
    }
    std::vector<math::UnaryScalars<float>> float_scalars;
    std::vector<math::UnaryScalars<double>> double_scalars;
    float_scalars.reserve(source.scalars.size());
    double_scalars.reserve(source.scalars.size());
    std::vector<void*> arguments;
    for (void*& pointer : pointers) arguments.push_back(&pointer);
    for (const ScalarArgument& scalar : source.scalars) {
        const OpAttrs& attrs = graph.node(scalar.node).attrs;
        if (group.double_precision) arguments.push_back(&double_scalars.emplace_back(math::unary_scalars<double>(attrs)));
        else arguments.push_back(&float_scalars.emplace_back(math::unary_scalars<float>(attrs)));
    }
    kernel.launch(source.numel, arguments);
    return outputs;
}

// Compares every output of every group with the unfused kernels' value: equal within `ulps` units in the last
// place of the output's dtype; reports how many elements differ at all.
void check_plan(const ComputeGraph& graph, double ulps) {
    const FusionPlan plan = plan_fusion(graph);
    INFO(plan.describe(graph));
    REQUIRE_FALSE(plan.groups.empty());
    for (const FusionGroup& group : plan.groups) {
        const std::vector<Tensor> outputs = run_generated(graph, group);
        for (std::size_t j = 0; j < outputs.size(); ++j) {
            const Tensor& expected_value = graph.node(group.outputs[j].node).value;
            const std::vector<double> got = outputs[j].to(Device::cpu()).to(DType::f64).to_vector();
            const std::vector<double> expected = expected_value.to(Device::cpu()).to(DType::f64).to_vector();
            REQUIRE(got.size() == expected.size());
            const DType dtype = expected_value.dtype();
            const double epsilon = dtype == DType::bf16 ? 0x1p-7 : dtype == DType::f16 ? 0x1p-10
                                   : dtype == DType::f32 ? 0x1p-23 : 0x1p-52;
            std::size_t differing = 0, beyond = 0;
            for (std::size_t i = 0; i < got.size(); ++i) {
                if (got[i] == expected[i] || (std::isnan(got[i]) && std::isnan(expected[i]))) continue;
                ++differing;
                if (std::abs(got[i] - expected[i]) > ulps * epsilon * std::max(1.0, std::abs(expected[i]))) ++beyond;
            }
            WARN("group output #" << group.outputs[j].node << " (" << dtype_name(dtype) << "): " << differing << " of "
                                   << got.size() << " elements differ from the unfused kernels");
            CHECK(beyond == 0);
        }
    }
}

}  // namespace

int main(int argc, char* argv[]) { return dgtest::run_gpu_session(argc, argv, "generated-kernel GPU tests"); }

TEST_CASE("generated kernel of bias add + ReLU equals the unfused kernels", "[gpu][fusion]") {
    Generator gen(std::random_device{}());
    for (std::int64_t batch : {1, 3, 64, 4097}) {  // vector path, tail, misaligned shapes
        ComputeGraph graph;
        const Var x = graph.input(random({batch, 256}, DType::f32, gen), "x");
        const Var w = graph.input(random({256, 96}, DType::f32, gen), "w", true);
        const Var b = graph.input(random({96}, DType::f32, gen), "b", true);
        const Var h = relu(add(matmul(x, w), b));
        REQUIRE(h.defined());
        check_plan(graph, 0.0);  // add and relu are exact: bitwise
    }
}

TEST_CASE("generated kernels of reduced-precision chains with casts and scalar arguments", "[gpu][fusion]") {
    Generator gen(std::random_device{}());
    for (DType dtype : {DType::bf16, DType::f16}) {
        ComputeGraph graph;
        const Var x = graph.input(random({33, 70}, dtype, gen), "x", true);
        const Var b = graph.input(random({70}, dtype, gen), "b", true);
        const Var y = to_dtype(gelu(add(x, b), GeluApproximation::Tanh), DType::f32);
        const Var z = to_dtype(mul_scalar(sigmoid(clamp(y, -1.5, 1.5)), 0.75), dtype);
        REQUIRE(z.defined());
        check_plan(graph, 1.0);
    }
    ComputeGraph graph;
    const Var x = graph.input(random({17, 9}, DType::f64, gen), "x", true);
    const Var z = softplus(leaky_relu(mul(exp(x), x), 0.2));
    REQUIRE(z.defined());
    check_plan(graph, 4.0);
}
