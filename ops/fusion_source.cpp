// Source generation of the fusion compiler (ops/fusion_source.h, docs/fusion.md). Over 600 lines: the forward, row-
// reduction and backward kernels are written by one text model (KernelText) around one prelude, kept in one file.
#include "dyngrad/ops/fusion_source.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/ops/elementwise_math.h"
#include "dyngrad/ops/fusion_text.h"
#include "dyngrad/ops/reduce_geometry.h"

namespace dyngrad::fusion {

using namespace text;

namespace {


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
// A member's result as its unfused kernel stores it: rounded to its dtype, and never contracted with the next
// formula (the unfused kernels cannot do that either). An empty asm stops NVVM but not ptxas, which fused a
// dropout's multiply with the next add into an FMA when the product was not stored (H200, 2026-12-01); an add of
// -0 with an explicit rounding mode (x + -0 is x, signed zeros and NaN included) is an instruction ptxas may not
// contract, so the product is rounded before anything reads it.
__device__ __forceinline__ float dg_as_float32(float x) { asm volatile("add.rn.f32 %0, %0, 0f80000000;" : "+f"(x)); return x; }
__device__ __forceinline__ double dg_as_float64(double x) {
    asm volatile("add.rn.f64 %0, %0, 0d8000000000000000;" : "+d"(x));
    return x;
}
__device__ __forceinline__ float dg_as_bfloat16(float x) { return dg_load(dg_to_bf16(x)); }
__device__ __forceinline__ float dg_as_float16(float x) { return dg_load(dg_to_f16(x)); }
__device__ __forceinline__ float dg_store_float32(float x) { return x; }
__device__ __forceinline__ double dg_store_float64(double x) { return x; }
__device__ __forceinline__ dg_bf16 dg_store_bfloat16(float x) { return dg_to_bf16(x); }
__device__ __forceinline__ dg_f16 dg_store_float16(float x) { return dg_to_f16(x); }
)dgsrc";

// The body of a kernel with reductions (FusionGroup::reductions): a block of 256 threads per row (grid-stride over
// rows) makes group.passes loops over its row. Loop k computes the pointwise members of passes up to k for each
// element (recomputing earlier passes' members from the inputs rather than reading them back), stores those of
// pass k, and adds the values its reductions sum into one partial sum per thread; a fixed tree over the block's 256
// partial sums in shared memory then gives each row's sum (a fixed order: every run gives the same bits), which
// every thread holds for the next loop, with the row members computed from it. One loop and one reduction read by
// no member is a group that ends in a sum or mean.
std::string row_program_body(const ComputeGraph& graph, const FusionGroup& group, const KernelText& text,
                             const std::map<NodeId, std::string>& formula_of, const std::vector<NodeId>& outputs,
                             const std::function<std::string(NodeId)>& value_name) {
    const std::vector<int> passes = member_passes(graph, group);
    const RowReduction& rows = group.reductions.front();
    const std::string& compute = text.compute;
    const auto is_row_member = [&](NodeId id) {
        return std::find(group.row_members.begin(), group.row_members.end(), id) != group.row_members.end();
    };
    const auto output_index = [&](NodeId id) -> int {
        const auto found = std::find(outputs.begin(), outputs.end(), id);
        return found == outputs.end() ? -1 : static_cast<int>(found - outputs.begin());
    };
    std::ostringstream src;
    src << "    constexpr long long rows = " << rows.rows << "LL;\n";
    src << "    constexpr long long row_length = " << rows.row_length << "LL;\n";
    src << "    __shared__ " << compute << " partial[256];\n";
    src << "    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {\n";
    for (NodeId m : group.members)  // one value per row, for the loops after the one that computes it
        if (group.reduction_of(m) != nullptr || is_row_member(m)) src << "        " << compute << " t" << m << " = " << compute << "(0);\n";
    // The row members of pass k (after loop k - 1's reductions), and thread 0's stores of the row values made then.
    const auto row_values = [&](int pass) {
        std::vector<NodeId> made;
        for (const RowReduction& r : group.reductions)
            if (passes[static_cast<std::size_t>(std::find(group.members.begin(), group.members.end(), r.node) - group.members.begin())] + 1 == pass)
                made.push_back(r.node);
        bool any = false;
        for (std::size_t k = 0; k < group.members.size(); ++k) {
            if (!is_row_member(group.members[k]) || passes[k] != pass) continue;
            if (!any) {
                src << "        {\n            const long long i = row * row_length;  // a row value's inputs: the row's first element\n";
                std::ostringstream loads;
                text.load_lines(loads, false, "            ");
                src << loads.str();
                any = true;
            }
            src << "            t" << group.members[k] << " = " << formula_of.at(group.members[k]) << "\n";
            made.push_back(group.members[k]);
        }
        if (any) src << "        }\n";
        std::string stores;
        for (NodeId id : made)
            if (const int j = output_index(id); j >= 0)
                stores += str("            out", j, "[row] = dg_store_", dtype_name(graph.node(id).value.dtype()), "(t", id, ");\n");
        if (!stores.empty()) src << "        if (threadIdx.x == 0) {\n" << stores << "        }\n";
    };
    row_values(0);
    for (int pass = 0; pass < group.passes; ++pass) {
        std::vector<const RowReduction*> summed;
        for (std::size_t k = 0; k < group.members.size(); ++k)
            if (const RowReduction* r = group.reduction_of(group.members[k]); r != nullptr && passes[k] == pass) summed.push_back(r);
        src << "        {  // pass " << pass << "\n";
        for (const RowReduction* r : summed) src << "            " << compute << " acc" << r->node << " = " << compute << "(0);\n";
        src << "            for (long long c = threadIdx.x; c < row_length; c += 256) {\n";
        src << "                const long long i = row * row_length + c;\n";
        std::ostringstream loads;
        text.load_lines(loads, false, "                ");
        src << loads.str();
        for (std::size_t k = 0; k < group.members.size(); ++k) {
            const NodeId m = group.members[k];
            if (group.reduction_of(m) != nullptr || is_row_member(m) || passes[k] > pass) continue;
            src << "                const " << compute << " t" << m << " = " << formula_of.at(m) << "\n";
            if (const int j = output_index(m); j >= 0 && passes[k] == pass)
                src << "                out" << j << "[i] = dg_store_" << dtype_name(graph.node(m).value.dtype()) << "(t" << m << ");\n";
        }
        for (const RowReduction* r : summed) src << "                acc" << r->node << " = acc" << r->node << " + " << value_name(r->input) << ";\n";
        src << "            }\n";
        for (const RowReduction* r : summed) {
            src << "            partial[threadIdx.x] = acc" << r->node << ";\n";
            src << "            __syncthreads();\n";
            src << "            for (int half = 128; half > 0; half >>= 1) {\n";
            src << "                if (threadIdx.x < half) partial[threadIdx.x] = partial[threadIdx.x] + partial[threadIdx.x + half];\n";
            src << "                __syncthreads();\n";
            src << "            }\n";
            const std::string total = r->mean ? str("partial[0] / ", compute, "(", r->row_length, "LL)") : "partial[0]";
            src << "            t" << r->node << " = " << rounding(graph.node(r->node).value.dtype()) << "(" << total
                << ");  // " << (r->mean ? "mean" : "sum") << " #" << r->node << "\n";
            src << "            __syncthreads();  // partial[] is reused\n";
        }
        src << "        }\n";
        row_values(pass + 1);
    }
    src << "    }\n}\n";
    return src.str();
}

}  // namespace

std::string text::KernelText::write() const {
    std::ostringstream src;
    src << "// Generated by dyngrad's fusion compiler (ops/fusion_source.cpp): " << comment << ".\n"
        << kPreludeHead << elementwise_math_source() << dropout_mask_source() << kPreludeTail;
    src << "\nextern \"C\" __global__ void __launch_bounds__(256) DG_KERNEL_NAME(";
    auto param = [&, first = true](const std::string& text) mutable {
        src << (first ? "\n    " : ",\n    ") << text;
        first = false;
    };
    for (std::size_t j = 0; j < loads.size(); ++j)
        param(str("const ", element_type(loads[j].dtype), "* __restrict__ in", j));
    for (std::size_t j = 0; j < stores.size(); ++j)
        param(str(element_type(stores[j].dtype), "* __restrict__ out", j));
    for (std::size_t k = 0; k < scalars.size(); ++k) param(str(scalars[k], " s", k));
    src << ") {\n";
    if (row_body) {
        src << *row_body;
        return src.str();
    }
    src << "    constexpr long long n = " << numel << "LL;\n";
    src << "    const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
    src << "    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;\n";
    src << "    long long tail = 0;\n";
    const int width = vector_width();
    if (width > 1) {
        std::string aligned;
        const auto add_alignment = [&](const std::string& pointer, DType dtype) {
            aligned += str(aligned.empty() ? "" : " | ", "(reinterpret_cast<unsigned long long>(", pointer, ") % ",
                           width * dtype_size(dtype), "ULL)");
        };
        for (std::size_t j = 0; j < loads.size(); ++j)
            if (loads[j].index == "i") add_alignment(str("in", j), loads[j].dtype);
        for (std::size_t j = 0; j < stores.size(); ++j) add_alignment(str("out", j), stores[j].dtype);
        src << "    if ((" << aligned << ") == 0) {  // " << width << " elements per access\n";
        src << "        constexpr long long vectors = n / " << width << ";\n";
        src << "        for (long long vi = first; vi < vectors; vi += step) {\n";
        src << "            const long long base = vi * " << width << ";\n";
        for (std::size_t j = 0; j < loads.size(); ++j) {
            if (loads[j].index != "i") continue;
            const char* type = element_type(loads[j].dtype);
            src << "            const dg_vec<" << type << ", " << width << "> l" << j
                << " = *reinterpret_cast<const dg_vec<" << type << ", " << width << ">*>(in" << j << " + base);\n";
        }
        for (std::size_t j = 0; j < stores.size(); ++j)
            src << "            dg_vec<" << element_type(stores[j].dtype) << ", " << width << "> w" << j << ";\n";
        src << "#pragma unroll\n";
        src << "            for (int k = 0; k < " << width << "; ++k) {\n";
        src << "                const long long i = base + k;\n";
        src << "                (void)i;\n";
        element(src, true, "                ");
        src << "            }\n";
        for (std::size_t j = 0; j < stores.size(); ++j) {
            const char* type = element_type(stores[j].dtype);
            src << "            *reinterpret_cast<dg_vec<" << type << ", " << width << ">*>(out" << j
                << " + base) = w" << j << ";\n";
        }
        src << "        }\n";
        src << "        tail = vectors * " << width << ";\n";
        src << "    }\n";
    }
    src << "    for (long long i = tail + first; i < n; i += step) {\n";
    element(src, false, "        ");
    src << "    }\n}\n";
    return src.str();
}

std::string text::derivative_part(const ComputeGraph& graph, NodeId m, std::size_t j, const std::string& dy,
                                  const std::string& compute, const std::string& scalars, std::size_t dropout_scalars,
                                  const std::function<std::string(NodeId)>& value_of,
                                  const std::function<std::string(const std::string&, const std::string&)>& declare) {
    const ComputeNode& node = graph.node(m);
    const OpDef& def = op_def(node.op);
    const PointwiseFormula& formula = *def.pointwise;
    const NodeId target = node.inputs[j].id;
    const DType dtype = graph.node(target).value.dtype();
    const std::string zero = str(compute, "(0)");
    const std::string why = str(def.name, " #", m, " -> #", target);
    std::string contribution;
    const bool identity = (node.op == OpType::Add) || (node.op == OpType::Sub && j == 0) ||
                          (formula.form == PointwiseFormula::Form::Cast && dtype == node.value.dtype());
    const auto routed = [&](std::size_t condition, bool when_true) {  // where's and masked_fill's
        return declare(str(rounding(dtype), "(", value_of(node.inputs[condition].id), " != ", zero, " ? ",
                           when_true ? dy : zero, " : ", when_true ? zero : dy, ")"),
                       why);
    };
    if (identity) {
        contribution = dy;  // the unfused backward passes dy itself (an alias)
    } else if (formula.form == PointwiseFormula::Form::Where) {
        contribution = j == 0 ? declare(zero, why + " (the condition's gradient is zero)") : routed(0, j == 1);
    } else if (formula.form == PointwiseFormula::Form::MaskedFill) {
        contribution = j == 1 ? declare(zero, why + " (the mask's gradient is zero)") : routed(1, false);
    } else if (formula.form == PointwiseFormula::Form::Cast) {
        contribution = declare(str(rounding(dtype), "(", dy, ")"), why);
    } else if (formula.form == PointwiseFormula::Form::Dropout) {  // the same mask on dy (dropout_backward)
        const std::string seed = node.inputs.size() > 1 ? value_of(node.inputs[1].id) : "";
        contribution = declare(str(rounding(dtype), "(", dropout_formula(dy, seed, dropout_scalars), ")"), why);
    } else if (formula.form == PointwiseFormula::Form::Unary) {
        const std::string x = formula.derivative_reads_inputs ? value_of(target) : zero;
        const std::string y = formula.derivative_reads_output ? value_of(m) : x;
        contribution = declare(str(rounding(dtype), "(", dy, " * dyngrad::math::apply_derivative<",
                                   unary_functor(formula, node.attrs), ">(", x, ", ", y, ", ", scalars, "))"),
                               why);
    } else {
        const std::string a = formula.derivative_reads_inputs ? value_of(node.inputs[0].id) : zero;
        const std::string b = formula.derivative_reads_inputs ? value_of(node.inputs[1].id) : zero;
        contribution = declare(str(rounding(dtype), "(", dy, " * dyngrad::math::", formula.functor,
                                   j == 0 ? "::d_a(" : "::d_b(", a, ", ", b, "))"),
                               why);
    }
    return contribution;
}

std::string_view elementwise_math_source() {
    static constexpr char text[] =
#include "elementwise_math_source.inc"
        ;
    return {text, sizeof(text) - 1};
}

std::string_view dropout_mask_source() {
    static constexpr char text[] =
#include "dropout_mask_source.inc"
        ;
    return {text, sizeof(text) - 1};
}

std::string combined_source(std::span<const std::string> sources) {
    static constexpr std::string_view kKernelStart = "\nextern \"C\" __global__";
    if (sources.empty()) throw ValueError("fusion: no kernel to put into a translation unit");
    std::string out;
    for (const std::string& source : sources) {
        const std::size_t start = source.find(kKernelStart);
        if (start == std::string::npos) throw ValueError("fusion: a source without a generated kernel");
        // Every generated source is its first line (what the kernel computes), the shared prelude, then the kernel.
        const std::size_t prelude = source.find('\n') + 1;
        if (prelude == 0 || source.compare(prelude, kPreludeHead.size(), kPreludeHead) != 0)
            throw ValueError("fusion: a source without the generated prelude");
        if (out.empty()) out = str("// One translation unit for a plan's kernels (ops/fusion_source.cpp).\n",
                                   source.substr(prelude, start - prelude));
        out.append(source, 0, prelude);  // the kernel's own first line, as a comment before it
        out.append(source, start, std::string::npos);
    }
    return out;
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
    KernelText text;
    text.compute = group.double_precision ? "double" : "float";
    text.numel = out.numel;
    text.comment = "one kernel for";
    for (NodeId m : group.members) text.comment += str(" ", op_def(graph.node(m).op).name, "#", m);
    text.comment += str(", over ", to_string(group.shape));
    const auto value_name = [&](NodeId id) {
        const auto input = std::find(out.inputs.begin(), out.inputs.end(), id);
        if (input != out.inputs.end()) return str("v", input - out.inputs.begin());
        return str("t", id);
    };
    for (std::size_t j = 0; j < out.inputs.size(); ++j) {
        const Tensor& value = graph.node(out.inputs[j]).value;
        text.loads.push_back({value.dtype(), index_expression(value.shape(), group.shape), str("v", j)});
    }
    std::map<NodeId, std::string> formula_of;  // each pointwise member's statement (its scalars taken once)
    for (NodeId m : group.members) {
        if (group.reduction_of(m) != nullptr) continue;  // summed by a row loop
        const ComputeNode& node = graph.node(m);
        const OpDef& def = op_def(node.op);
        const PointwiseFormula& formula = *def.pointwise;
        std::string value;
        switch (formula.form) {
            case PointwiseFormula::Form::Unary:
                value = str("dyngrad::math::apply_forward<", unary_functor(formula, node.attrs), ">(",
                            value_name(node.inputs[0].id), ", ",
                            reads_scalars(def) ? str("s", out.scalars.size()) : str(unary_scalars_type(text.compute), "{}"),
                            ")");
                if (reads_scalars(def)) {
                    out.scalars.push_back({m});
                    text.scalars.push_back(unary_scalars_type(text.compute));
                }
                break;
            case PointwiseFormula::Form::Binary:
                value = str("dyngrad::math::", formula.functor, "::forward(", value_name(node.inputs[0].id), ", ",
                            value_name(node.inputs[1].id), ")");
                break;
            case PointwiseFormula::Form::Cast:  // the rounding to the node's dtype is the cast
                value = value_name(node.inputs[0].id);
                break;
            case PointwiseFormula::Form::Where:
                value = str("(", value_name(node.inputs[0].id), " != ", text.compute, "(0) ? ",
                            value_name(node.inputs[1].id), " : ", value_name(node.inputs[2].id), ")");
                break;
            case PointwiseFormula::Form::MaskedFill:  // the scalar comes rounded to the node's dtype (member_scalar_bytes)
                value = str("(", value_name(node.inputs[1].id), " != ", text.compute, "(0) ? s", out.scalars.size(),
                            ".s : ", value_name(node.inputs[0].id), ")");
                out.scalars.push_back({m});
                text.scalars.push_back(unary_scalars_type(text.compute));
                break;
            case PointwiseFormula::Form::Dropout:
                value = dropout_formula(value_name(node.inputs[0].id),
                                        node.inputs.size() > 1 ? value_name(node.inputs[1].id) : "", text.scalars.size());
                out.scalars.push_back({m});
                text.scalars.push_back(kDropoutScalarsType);
                break;
        }
        formula_of[m] = str(rounding(node.value.dtype()), "(", value, ");  // ", def.name, " #", m);
    }
    for (NodeId m : out.outputs) text.stores.push_back({graph.node(m).value.dtype(), str("t", m)});
    if (!group.reductions.empty()) {
        text.row_body = row_program_body(graph, group, text, formula_of, out.outputs, value_name);
        out.numel = group.reductions.front().rows * 256;  // what the launch sizes its grid by: a block per row
    } else {
        for (NodeId m : group.members) text.formulas.push_back(str("const ", text.compute, " t", m, " = ", formula_of.at(m)));
    }
    out.vector_width = text.vector_width();
    finish(out, text.write());
    return out;
}

FusedBackwardSource generate_backward_source(const ComputeGraph& graph, const FusionGroup& group,
                                             const BackwardLaunch& launch, bool magnitudes) {
    if (launch.program) return generate_row_backward_source(graph, group, launch, magnitudes);
    if (launch.members.empty()) throw Error("fusion: a backward chain without members has no kernel");
    FusedBackwardSource out;
    out.saved = launch.saved_reads;
    out.gradients_in = launch.gradients_in;
    out.numel = numel(group.shape);
    KernelText text;
    text.compute = group.double_precision ? "double" : "float";
    text.numel = out.numel;
    text.comment = "the backward of";
    for (auto it = launch.members.rbegin(); it != launch.members.rend(); ++it)
        text.comment += str(" ", op_def(graph.node(*it).op).name, "#", *it);
    text.comment += str(", over ", to_string(group.shape));
    const std::set<NodeId> members(launch.members.begin(), launch.members.end());
    const std::set<NodeId> externals(launch.gradients_out.begin(), launch.gradients_out.end());
    const std::set<NodeId> saved(launch.saved_reads.begin(), launch.saved_reads.end());
    for (NodeId id : launch.saved_reads) {
        const Tensor& value = graph.node(id).value;
        text.loads.push_back({value.dtype(), index_expression(value.shape(), group.shape), str("x", id)});
    }
    std::map<NodeId, std::string> gradient;  // the variable holding a node's gradient so far
    std::map<NodeId, int> contributions;
    for (NodeId m : launch.gradients_in) {  // a taken-over sum's or mean's broadcast back over its reduced axes
        const ComputeNode& node = graph.node(m);
        text.loads.push_back({node.value.dtype(),
                              node.value.shape() == group.shape ? "i" : index_expression(kept_dims_shape(graph, node), group.shape),
                              str("d", m)});
        gradient[m] = str("d", m);
    }
    const std::string zero = str(text.compute, "(0)");
    const auto value_of = [&](NodeId id) {
        if (!saved.contains(id)) throw Error(str("fusion: the backward chain reads node #", id, ", not saved"));
        return str("x", id);
    };
    std::size_t fresh = 0;
    const auto declare = [&](const std::string& value, const std::string& why) {
        const std::string name = str("g", fresh++);
        text.formulas.push_back(str("const ", text.compute, " ", name, " = ", value, ";  // ", why));
        return name;
    };
    // Gradients from several readers add up in the sweep's order (readers newest first, inputs in order), each sum
    // rounded as the unfused accumulation stores it.
    const auto accumulate = [&](NodeId target, const std::string& contribution, DType dtype) {
        ++contributions[target];
        auto [slot, first] = gradient.try_emplace(target, contribution);
        if (!first)
            slot->second = declare(str(rounding(dtype), "(", slot->second, " + ", contribution, ")"),
                                   str("sum into #", target));
    };
    for (NodeId m : launch.members) {
        const ComputeNode& node = graph.node(m);
        const OpDef& def = op_def(node.op);
        const auto found = gradient.find(m);
        if (found == gradient.end())
            throw Error(str("fusion: no gradient reaches ", def.name, " #", m, " in its backward chain"));
        const std::string dy = found->second;
        if (def.pointwise == nullptr) {  // a sum or mean taken over: reduce_backward's expand, dy * 1 or dy * (1/count)
            if (node.op != OpType::Sum && node.op != OpType::Mean)
                throw Error(str("fusion: ", def.name, " #", m, " is neither pointwise nor a sum or mean"));
            const NodeId target = node.inputs[0].id;
            const DType dtype = graph.node(target).value.dtype();
            std::string contribution = dy;  // sum: the expand's dy * 1 is dy
            if (node.op == OpType::Mean) {
                const Shape& in = graph.node(target).value.shape();
                const std::int64_t count = reduced_count(in, reduced_axes(in, node.attrs.axes));
                contribution = declare(str(rounding(dtype), "(", dy, " * (", text.compute, "(1) / ", text.compute, "(",
                                           count, "LL)))"),
                                       str(def.name, " #", m, " -> #", target));
            }
            accumulate(target, contribution, dtype);
            continue;
        }
        const PointwiseFormula& formula = *def.pointwise;
        const bool gives = std::any_of(node.inputs.begin(), node.inputs.end(), [&](const NodeInput& input) {
            return members.contains(input.id) || externals.contains(input.id);
        });
        std::string scalars = str(unary_scalars_type(text.compute), "{}");
        if (gives && formula.form == PointwiseFormula::Form::Unary && reads_scalars(def)) {
            scalars = str("s", out.scalars.size());
            out.scalars.push_back({m});
            text.scalars.push_back(unary_scalars_type(text.compute));
        }
        std::size_t dropout_scalars = 0;
        if (gives && formula.form == PointwiseFormula::Form::Dropout) {
            dropout_scalars = text.scalars.size();
            out.scalars.push_back({m});
            text.scalars.push_back(kDropoutScalarsType);
        }
        for (std::size_t j = 0; j < node.inputs.size(); ++j) {
            const NodeId target = node.inputs[j].id;
            if (!members.contains(target) && !externals.contains(target)) continue;
            const DType dtype = graph.node(target).value.dtype();
            const std::string contribution =
                derivative_part(graph, m, j, dy, text.compute, scalars, dropout_scalars, value_of, declare);
            accumulate(target, contribution, dtype);
        }
    }
    for (NodeId e : launch.gradients_out) {
        const std::string& value = gradient.at(e);
        const DType dtype = graph.node(e).value.dtype();
        FusedBackwardSource::Result result{e};
        result.contributions = contributions[e];
        // Passed through unchanged only in the group's shape: a taken-over reduction's gradient is stored broadcast.
        for (std::size_t k = 0; k < out.gradients_in.size(); ++k) {
            const Tensor& incoming = graph.node(out.gradients_in[k]).value;
            if (value == str("d", out.gradients_in[k]) && incoming.dtype() == dtype && incoming.shape() == group.shape)
                result.gradient_in = static_cast<int>(k);
        }
        if (result.gradient_in < 0) {
            for (std::size_t k = 0; k < text.stores.size(); ++k)
                if (text.stores[k].value == value && text.stores[k].dtype == dtype) result.store = static_cast<int>(k);
            if (result.store < 0) {
                result.store = static_cast<int>(text.stores.size());
                text.stores.push_back({dtype, value});
                out.stores.push_back(e);
                out.store_shapes.push_back(group.shape);
                out.store_dtypes.push_back(dtype);
            }
        }
        out.results.push_back(result);
    }
    out.vector_width = text.vector_width();
    if (!text.stores.empty()) finish(out, text.write());
    return out;
}

}  // namespace dyngrad::fusion
