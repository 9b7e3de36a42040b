// The text model of the fusion compiler's generated kernels (ops/fusion_source.cpp, ops/fusion_row_backward.cpp):
// element types, broadcast index expressions, one kernel's loads, formulas and stores (KernelText), the rounding and
// scalar helpers, and each member's part of a gradient. Internal to ops/.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dyngrad/cuda/nvrtc_compiler.h"
#include "dyngrad/graph/fusion_plan.h"
#include "dyngrad/ops/reduce_geometry.h"

namespace dyngrad::fusion::text {

inline constexpr std::size_t kScalarField = attr_field_index("scalar");
inline constexpr std::size_t kClampMinField = attr_field_index("clamp_min");
inline constexpr std::size_t kClampMaxField = attr_field_index("clamp_max");

inline const char* element_type(DType dtype) {
    switch (dtype) {
        case DType::f32: return "float";
        case DType::f64: return "double";
        case DType::bf16: return "dg_bf16";
        case DType::f16: return "dg_f16";
        case DType::i64: return "long long";  // a dropout's seed input
        default: break;
    }
    throw DTypeError(str("fusion: no generated-kernel element type for ", dtype_name(dtype)));
}

// The element of an input of shape `in` that output element i reads under NumPy broadcasting, as an expression
// of i: "i" when the input has the whole index space, "0" for a single element, else quotients and remainders
// over the dimensions left after merging neighbours that are contiguous in the input.
inline std::string index_expression(const Shape& in, const Shape& out) {
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

inline bool reads_scalars(const OpDef& def) {
    return def.attrs.contains(kScalarField) || def.attrs.contains(kClampMinField) ||
           def.attrs.contains(kClampMaxField);
}

// One elementwise kernel's text: its loads, the formulas between them and its stores. The scaffolding (parameters,
// the grid-stride loop, the 16-byte vector path and the tail) is the same for a group's forward and its backward.
struct KernelText {
    struct Load {
        DType dtype;
        std::string index;  // the element it reads for output element i ("i": the whole index space)
        std::string name;   // the compute-type value the formulas read it as
    };
    struct Store {
        DType dtype;
        std::string value;  // a compute-type expression of the formulas' values
    };
    // A kernel with reductions (a block per row, RowPrograms below) writes its own body; `loads`, `stores` and
    // `scalars` are then only its parameters.
    std::optional<std::string> row_body;
    std::string comment;  // the first line: what the kernel computes
    std::string compute;  // "float" or "double"
    std::int64_t numel = 0;
    std::vector<Load> loads;
    std::vector<Store> stores;
    std::vector<std::string> scalars;  // the types of the scalar parameters s0 ... (UnaryScalars, DropoutScalars)
    std::vector<std::string> formulas;  // statements after the loads, in order

    int vector_width() const {
        if (row_body) return 1;  // the row loops read element by element
        std::size_t widest = 0;  // bytes of the widest element accessed over the whole index space
        for (const Load& load : loads)
            if (load.index == "i") widest = std::max(widest, dtype_size(load.dtype));
        for (const Store& store : stores) widest = std::max(widest, dtype_size(store.dtype));
        return widest == 0 ? 1 : static_cast<int>(16 / widest);
    }

    void element(std::ostringstream& src, bool vector, const char* indent) const {
        load_lines(src, vector, indent);
        for (const std::string& formula : formulas) src << indent << formula << "\n";
        for (std::size_t j = 0; j < stores.size(); ++j) {
            const std::string value = str("dg_store_", dtype_name(stores[j].dtype), "(", stores[j].value, ")");
            if (vector) src << indent << "w" << j << ".v[k] = " << value << ";\n";
            else src << indent << "out" << j << "[i] = " << value << ";\n";
        }
    }

    // Each input's element for output element i, as the compute-type value the formulas read.
    void load_lines(std::ostringstream& src, bool vector, const char* indent) const {
        for (std::size_t j = 0; j < loads.size(); ++j) {
            if (loads[j].dtype == DType::i64) {  // a dropout's seed: its bits (one element, never vectorised)
                src << indent << "const unsigned long long " << loads[j].name << " = static_cast<unsigned long long>(in"
                    << j << "[" << loads[j].index << "]);\n";
                continue;
            }
            src << indent << "const " << compute << " " << loads[j].name << " = dg_load("
                << (vector && loads[j].index == "i" ? str("l", j, ".v[k]") : str("in", j, "[", loads[j].index, "]"))
                << ");\n";
        }
    }

    // The translation unit, the kernel named `DG_KERNEL_NAME` (named by the hash of the text afterwards).
    std::string write() const;
};

// Names the kernel by the hash of its text.
template <typename Source>
void finish(Source& out, std::string text) {
    out.hash = cuda::fnv1a64(text);
    out.name = "dg_fused_" + cuda::hex64(out.hash);
    const std::string placeholder = "DG_KERNEL_NAME";
    text.replace(text.find(placeholder), placeholder.size(), out.name);
    out.source = std::move(text);
}

inline std::string rounding(DType dtype) { return str("dg_as_", dtype_name(dtype)); }

// A sum's or mean's output shape with its reduced axes kept as 1 (keepdim's shape), for the broadcast index of its
// gradient over its input's shape.
inline Shape kept_dims_shape(const ComputeGraph& graph, const ComputeNode& reduction) {
    const Shape& in = graph.node(reduction.inputs[0].id).value.shape();
    const std::vector<bool> reduced = reduced_axes(in, reduction.attrs.axes);
    Shape out = in;
    for (std::size_t k = 0; k < out.size(); ++k)
        if (reduced[k]) out[k] = 1;
    return out;
}

inline std::string unary_scalars_type(const std::string& compute) { return str("dyngrad::math::UnaryScalars<", compute, ">"); }

inline constexpr const char* kDropoutScalarsType = "dyngrad::math::DropoutScalars";

// dropout's y = x · mask in the compute type (math::dropout_apply, as ops/dropout.cu computes it) for element i,
// the mask seed read from the seed input's value `seed` or, without one, from the scalars s<k>.
inline std::string dropout_formula(const std::string& x, const std::string& seed, std::size_t k) {
    return str("dyngrad::math::dropout_apply(", x, ", ", seed.empty() ? str("s", k, ".seed") : seed,
               ", static_cast<unsigned long long>(i), s", k, ".p)");
}

inline std::string unary_functor(const PointwiseFormula& formula, const OpAttrs& attrs) {
    const bool tanh = formula.tanh_functor != nullptr && attrs.gelu_approximation == GeluApproximation::Tanh;
    return str("dyngrad::math::", tanh ? formula.tanh_functor : formula.functor);
}

// Member `m`'s part `dy * d m / d input j` of the gradient of its input j (a Var of `graph`), rounded to the input's
// dtype (dy itself where the unfused backward passes dy on: add, sub's first operand, a cast to the same dtype), as
// an expression `declare` names (declare(value, why) returns a fresh name). `value_of` names a saved value; `scalars`
// the member's UnaryScalars argument, `dropout_scalars` the index of its DropoutScalars parameter.
std::string derivative_part(const ComputeGraph& graph, NodeId m, std::size_t j, const std::string& dy,
                            const std::string& compute, const std::string& scalars, std::size_t dropout_scalars,
                            const std::function<std::string(NodeId)>& value_of,
                            const std::function<std::string(const std::string&, const std::string&)>& declare);

}  // namespace dyngrad::fusion::text
