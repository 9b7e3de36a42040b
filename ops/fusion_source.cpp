// Source generation of the fusion compiler (ops/fusion_source.h, docs/fusion.md).
#include "dyngrad/ops/fusion_source.h"

#include <algorithm>
#include <sstream>

#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/ops/elementwise_math.h"

namespace dyngrad::fusion {

namespace {

constexpr std::size_t kScalarField = attr_field_index("scalar");
constexpr std::size_t kClampMinField = attr_field_index("clamp_min");
constexpr std::size_t kClampMaxField = attr_field_index("clamp_max");

// What every generated source starts with: DG_HOST_DEVICE for the device, the math functions the formulas call
// unqualified (float and double overloads, as <cmath>'s std:: ones that the unfused kernels call), the embedded
// formulas, and the element types with their conversions. bf16 and f16 are their bits, converted as
// cuda_bf16.h/cuda_fp16.h convert them (round to nearest even), so NVRTC needs no toolkit header.
constexpr std::string_view kPreludeHead = R"dgsrc(#define DG_HOST_DEVICE __device__ __forceinline__
namespace dyngrad { namespace math {
#define DG_FUSION_MATH1(name, fname) \
    __device__ __forceinline__ float name(float x) { return ::fname(x); } \
    __device__ __forceinline__ double name(double x) { return ::name(x); }
DG_FUSION_MATH1(cos, cosf) DG_FUSION_MATH1(erfc, erfcf) DG_FUSION_MATH1(exp, expf) DG_FUSION_MATH1(expm1, expm1f)
DG_FUSION_MATH1(log, logf) DG_FUSION_MATH1(log1p, log1pf) DG_FUSION_MATH1(sin, sinf) DG_FUSION_MATH1(sqrt, sqrtf)
DG_FUSION_MATH1(tanh, tanhf)
#undef DG_FUSION_MATH1
__device__ __forceinline__ float pow(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double pow(double x, double y) { return ::pow(x, y); }
)dgsrc";

constexpr std::string_view kPreludeTail = R"dgsrc(} }  // namespace dyngrad::math

struct dg_bf16 { unsigned short bits; };
struct dg_f16 { unsigned short bits; };
template <typename T, int N> struct alignas(sizeof(T) * N) dg_vec { T v[N]; };

__device__ __forceinline__ float dg_load(float v) { return v; }
__device__ __forceinline__ double dg_load(double v) { return v; }
__device__ __forceinline__ float dg_load(dg_bf16 v) { return __uint_as_float(static_cast<unsigned int>(v.bits) << 16); }
__device__ __forceinline__ float dg_load(dg_f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
__device__ __forceinline__ dg_bf16 dg_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<unsigned short>((u >> 16) | 0x40u)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return {static_cast<unsigned short>(u >> 16)};
}
__device__ __forceinline__ dg_f16 dg_to_f16(float f) {
    dg_f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
// A member's result as its unfused kernel stores it: rounded to its dtype, and opaque to the compiler so that no
// multiply of one formula contracts with an add of the next (the unfused kernels cannot do that either).
__device__ __forceinline__ float dg_as_float32(float x) { asm volatile("" : "+f"(x)); return x; }
__device__ __forceinline__ double dg_as_float64(double x) { asm volatile("" : "+d"(x)); return x; }
__device__ __forceinline__ float dg_as_bfloat16(float x) { return dg_load(dg_to_bf16(x)); }
__device__ __forceinline__ float dg_as_float16(float x) { return dg_load(dg_to_f16(x)); }
__device__ __forceinline__ float dg_store_float32(float x) { return x; }
__device__ __forceinline__ double dg_store_float64(double x) { return x; }
__device__ __forceinline__ dg_bf16 dg_store_bfloat16(float x) { return dg_to_bf16(x); }
__device__ __forceinline__ dg_f16 dg_store_float16(float x) { return dg_to_f16(x); }
)dgsrc";

const char* element_type(DType dtype) {
    switch (dtype) {
        case DType::f32: return "float";
        case DType::f64: return "double";
        case DType::bf16: return "dg_bf16";
        case DType::f16: return "dg_f16";
        default: break;
    }
    throw DTypeError(str("fusion: no generated-kernel element type for ", dtype_name(dtype)));
}

// The element of an input of shape `in` that output element i reads under NumPy broadcasting, as an expression
// of i: "i" when the input has the whole index space, "0" for a single element, else quotients and remainders
// over the dimensions left after merging neighbours that are contiguous in the input.
std::string index_expression(const Shape& in, const Shape& out) {
    const std::size_t rank = out.size();
    std::vector<std::int64_t> sizes, strides;  // the output's dimensions (size > 1) and the input's strides in them
    std::int64_t in_stride = 1;
    std::vector<std::int64_t> stride_of(rank, 0);
    for (std::size_t k = rank; k-- > 0;) {
        const std::size_t offset = rank - k;  // from the right
        const std::int64_t in_size = offset <= in.size() ? in[in.size() - offset] : 1;
        stride_of[k] = in_size == 1 ? 0 : in_stride;
        in_stride *= in_size;
    }
    for (std::size_t k = 0; k < rank; ++k) {
        if (out[k] == 1) continue;
        if (!sizes.empty() && strides.back() == stride_of[k] * out[k]) {  // contiguous with the previous dimension
            sizes.back() *= out[k];
            strides.back() = stride_of[k];
        } else {
            sizes.push_back(out[k]);
            strides.push_back(stride_of[k]);
        }
    }
    std::string expression;
    std::int64_t inner = 1;  // product of the sizes right of dimension d
    for (std::size_t d = sizes.size(); d-- > 0;) {
        if (strides[d] != 0) {
            std::string term = inner == 1 ? "i" : str("(i / ", inner, "LL)");
            if (d != 0) term = str("(", term, " % ", sizes[d], "LL)");
            if (strides[d] != 1) term = str(term, " * ", strides[d], "LL");
            expression = expression.empty() ? term : str(term, " + ", expression);
        }
        inner *= sizes[d];
    }
    return expression.empty() ? "0" : expression;
}

bool reads_scalars(const OpDef& def) {
    return def.attrs.contains(kScalarField) || def.attrs.contains(kClampMinField) ||
           def.attrs.contains(kClampMaxField);
}

struct Writer {
    const ComputeGraph& graph;
    const FusionGroup& group;
    FusedKernelSource& out;
    std::string compute;                  // "float" or "double"
    std::vector<std::string> input_index; // per input: its index expression ("i": the whole index space)

    std::string value_name(NodeId id) const {
        const auto input = std::find(out.inputs.begin(), out.inputs.end(), id);
        if (input != out.inputs.end()) return str("v", input - out.inputs.begin());
        return str("t", id);
    }

    // The element body: loads (`vector`: full-shape inputs from the loaded vectors l<j>, lane k), the members'
    // formulas, the stores (`vector`: into the vectors w<j>).
    void element(std::ostringstream& src, bool vector, const char* indent) const {
        for (std::size_t j = 0; j < out.inputs.size(); ++j) {
            const bool whole = input_index[j] == "i";
            src << indent << "const " << compute << " v" << j << " = dg_load("
                << (vector && whole ? str("l", j, ".v[k]") : str("in", j, "[", input_index[j], "]")) << ");\n";
        }
        std::size_t scalar = 0;
        for (NodeId m : group.members) {
            const ComputeNode& node = graph.node(m);
            const OpDef& def = op_def(node.op);
            const PointwiseFormula& formula = *def.pointwise;
            const std::string round = str("dg_as_", dtype_name(node.value.dtype()));
            src << indent << "const " << compute << " t" << m << " = " << round << "(";
            switch (formula.form) {
                case PointwiseFormula::Form::Unary: {
                    const bool tanh = formula.tanh_functor != nullptr &&
                                      node.attrs.gelu_approximation == GeluApproximation::Tanh;
                    src << "dyngrad::math::apply_forward<dyngrad::math::"
                        << (tanh ? formula.tanh_functor : formula.functor) << ">(" << value_name(node.inputs[0].id)
                        << ", ";
                    if (reads_scalars(def)) src << "s" << scalar++;
                    else src << "dyngrad::math::UnaryScalars<" << compute << ">{}";
                    src << ")";
                    break;
                }
                case PointwiseFormula::Form::Binary:
                    src << "dyngrad::math::" << formula.functor << "::forward(" << value_name(node.inputs[0].id)
                        << ", " << value_name(node.inputs[1].id) << ")";
                    break;
                case PointwiseFormula::Form::Cast:  // the rounding to the node's dtype is the cast
                    src << value_name(node.inputs[0].id);
                    break;
            }
            src << ");  // " << def.name << " #" << m << "\n";
        }
        for (std::size_t j = 0; j < out.outputs.size(); ++j) {
            const NodeId m = out.outputs[j];
            const std::string value = str("dg_store_", dtype_name(graph.node(m).value.dtype()), "(t", m, ")");
            if (vector) src << indent << "w" << j << ".v[k] = " << value << ";\n";
            else src << indent << "out" << j << "[i] = " << value << ";\n";
        }
    }
};

}  // namespace

std::string_view elementwise_math_source() {
    static constexpr char text[] =
#include "elementwise_math_source.inc"
        ;
    return {text, sizeof(text) - 1};
}

FusionGroup with_every_member_written(const FusionGroup& group) {
    FusionGroup all = group;
    all.outputs.clear();
    for (NodeId m : group.members) all.outputs.push_back({m, Materialise::ConsumedOutside});
    return all;
}

FusedKernelSource generate_fused_source(const ComputeGraph& graph, const FusionGroup& group) {
    if (group.members.empty()) throw Error("fusion: a group without members has no kernel");
    FusedKernelSource out;
    out.inputs = group.inputs;
    for (const GroupOutput& output : group.outputs) out.outputs.push_back(output.node);
    out.numel = numel(group.shape);
    Writer writer{graph, group, out, group.double_precision ? "double" : "float", {}};
    std::size_t widest = 0;  // bytes of the widest element accessed over the whole index space
    for (NodeId id : out.inputs) {
        const Tensor& value = graph.node(id).value;
        writer.input_index.push_back(index_expression(value.shape(), group.shape));
        if (writer.input_index.back() == "i") widest = std::max(widest, dtype_size(value.dtype()));
    }
    for (NodeId id : out.outputs) widest = std::max(widest, dtype_size(graph.node(id).value.dtype()));
    for (NodeId m : group.members)
        if (reads_scalars(op_def(graph.node(m).op))) out.scalars.push_back({m});
    out.vector_width = widest == 0 ? 1 : static_cast<int>(16 / widest);

    std::ostringstream src;
    src << "// Generated by dyngrad's fusion compiler (ops/fusion_source.cpp): one kernel for";
    for (NodeId m : group.members) src << " " << op_def(graph.node(m).op).name << "#" << m;
    src << ", over " << to_string(group.shape) << ".\n" << kPreludeHead << elementwise_math_source() << kPreludeTail;
    src << "\nextern \"C\" __global__ void __launch_bounds__(256) DG_KERNEL_NAME(";
    auto param = [&, first = true](const std::string& text) mutable {
        src << (first ? "\n    " : ",\n    ") << text;
        first = false;
    };
    for (std::size_t j = 0; j < out.inputs.size(); ++j)
        param(str("const ", element_type(graph.node(out.inputs[j]).value.dtype()), "* __restrict__ in", j));
    for (std::size_t j = 0; j < out.outputs.size(); ++j)
        param(str(element_type(graph.node(out.outputs[j]).value.dtype()), "* __restrict__ out", j));
    for (std::size_t k = 0; k < out.scalars.size(); ++k)
        param(str("dyngrad::math::UnaryScalars<", writer.compute, "> s", k));
    src << ") {\n";
    src << "    constexpr long long n = " << out.numel << "LL;\n";
    src << "    const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
    src << "    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;\n";
    src << "    long long tail = 0;\n";
    if (out.vector_width > 1) {
        const int width = out.vector_width;
        std::string aligned;
        const auto add_alignment = [&](const std::string& pointer, DType dtype) {
            aligned += str(aligned.empty() ? "" : " | ", "(reinterpret_cast<unsigned long long>(", pointer, ") % ",
                           width * dtype_size(dtype), "ULL)");
        };
        for (std::size_t j = 0; j < out.inputs.size(); ++j)
            if (writer.input_index[j] == "i") add_alignment(str("in", j), graph.node(out.inputs[j]).value.dtype());
        for (std::size_t j = 0; j < out.outputs.size(); ++j)
            add_alignment(str("out", j), graph.node(out.outputs[j]).value.dtype());
        src << "    if ((" << aligned << ") == 0) {  // " << width << " elements per access\n";
        src << "        constexpr long long vectors = n / " << width << ";\n";
        src << "        for (long long vi = first; vi < vectors; vi += step) {\n";
        src << "            const long long base = vi * " << width << ";\n";
        for (std::size_t j = 0; j < out.inputs.size(); ++j) {
            if (writer.input_index[j] != "i") continue;
            const char* type = element_type(graph.node(out.inputs[j]).value.dtype());
            src << "            const dg_vec<" << type << ", " << width << "> l" << j << " = *reinterpret_cast<const dg_vec<"
                << type << ", " << width << ">*>(in" << j << " + base);\n";
        }
        for (std::size_t j = 0; j < out.outputs.size(); ++j)
            src << "            dg_vec<" << element_type(graph.node(out.outputs[j]).value.dtype()) << ", " << width
                << "> w" << j << ";\n";
        src << "#pragma unroll\n";
        src << "            for (int k = 0; k < " << width << "; ++k) {\n";
        src << "                const long long i = base + k;\n";
        src << "                (void)i;\n";
        writer.element(src, true, "                ");
        src << "            }\n";
        for (std::size_t j = 0; j < out.outputs.size(); ++j) {
            const char* type = element_type(graph.node(out.outputs[j]).value.dtype());
            src << "            *reinterpret_cast<dg_vec<" << type << ", " << width << ">*>(out" << j
                << " + base) = w" << j << ";\n";
        }
        src << "        }\n";
        src << "        tail = vectors * " << width << ";\n";
        src << "    }\n";
    }
    src << "    for (long long i = tail + first; i < n; i += step) {\n";
    writer.element(src, false, "        ");
    src << "    }\n}\n";

    std::string text = src.str();
    out.hash = cuda::fnv1a64(text);
    out.name = "dg_fused_" + cuda::hex64(out.hash);
    const std::string placeholder = "DG_KERNEL_NAME";
    text.replace(text.find(placeholder), placeholder.size(), out.name);
    out.source = std::move(text);
    return out;
}

}  // namespace dyngrad::fusion
