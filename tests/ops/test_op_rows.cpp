// The op table's rows as the whole op (graph/op_def.h, ops/op_table.cpp): the attributes a row says its op reads,
// the field table every serialiser walks, the autocast policy and PyTorch expression each row states.
#include <set>
#include <string>
#include <type_traits>
#include <variant>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

// `field` moved away from its value in `a` (same kind, another value).
void perturb(OpAttrs& a, const AttrField& field) {
    std::visit(
        [&](auto member) {
            auto& v = a.*member;
            using T = std::remove_cvref_t<decltype(v)>;
            if constexpr (std::is_same_v<T, double>) v += 0.375;
            else if constexpr (std::is_same_v<T, std::optional<double>>) v = v ? std::nullopt : std::optional(0.25);
            else if constexpr (std::is_same_v<T, bool>) v = !v;
            else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) v = v.empty() ? T{0} : T{};
            else if constexpr (std::is_same_v<T, std::array<std::int64_t, 2>>) v = {v[0] + 1, v[1] + 1};
            else if constexpr (std::is_enum_v<T>)
                v = static_cast<T>((static_cast<std::size_t>(v) + 1) % choice_names(v).size());
            else v += 1;  // integers
        },
        field.member);
}

std::vector<Tensor> cloned(const std::vector<Tensor>& inputs) {
    std::vector<Tensor> out;
    for (const Tensor& t : inputs) out.push_back(t.clone());  // batch_norm writes its running statistics
    return out;
}

}  // namespace

// The converse (a field the row lists but the op ignores) is harmless: Python then accepts a keyword that does
// nothing. This direction is the one that loses a user's setting: a field the op reads that its row does not list
// would be refused from Python and left out of the golden export.
TEST_CASE("an attribute a row does not list changes nothing its op computes", "[op_rows]") {
    int runs = 0;
    for (const OpDef& def : op_table()) {
        for (const OpCase& c : def.cases()) {
            Generator gen(7);
            const std::vector<Tensor> inputs = make_case_inputs(c, DType::f64, gen);
            const Tensor probe = run_op(def, c, cloned(inputs), Tensor()).output;
            const Tensor w = Tensor::normal(probe.shape(), 0.0, 1.0, gen, probe.dtype());
            const OpRun reference = run_op(def, c, cloned(inputs), def.differentiable ? w : Tensor());
            for (std::size_t f = 0; f < kAttrFieldCount; ++f) {
                const AttrField& field = kAttrFields[f];
                if (def.attrs.contains(f) || field.name == "custom_id") continue;
                OpCase moved = c;
                perturb(moved.attrs, field);
                INFO(def.name << " / " << c.label << ": " << field.name << " moved to "
                              << attr_value_text(field, moved.attrs, false));
                OpRun run;
                try {
                    run = run_op(def, moved, cloned(inputs), def.differentiable ? w : Tensor());
                } catch (const Error& e) {  // a check of the field is a read of it: the row must list it
                    FAIL_CHECK("the op checks a field its row does not list: " << e.what());
                    continue;
                }
                CHECK(max_abs_error(run.output, reference.output) == 0.0);
                for (std::size_t i = 0; i < reference.grads.size(); ++i)
                    if (reference.grads[i].defined()) CHECK(max_abs_error(run.grads[i], reference.grads[i]) == 0.0);
                ++runs;
            }
        }
    }
    CHECK(runs > 1000);
}

TEST_CASE("every row states its autocast policy and, with cases, its PyTorch expression", "[op_rows]") {
    for (const OpDef& def : op_table()) {
        INFO(def.name);
        CHECK(def.autocast.has_value());  // also a static_assert in ops/op_table.cpp
        if (!def.cases().empty()) CHECK((def.torch != nullptr && std::string(def.torch).size() > 3));
    }
    // The policies the switch in graph/autocast.cpp gave before they moved into the rows (docs/mixed_precision.md),
    // and cumsum's, which PyTorch's autocast also runs in float32; linear_cross_entropy, the LM head's GEMM with
    // its loss: its GEMMs in the reduced dtype as linear's, its loss float32 (infer::linear_cross_entropy);
    // qkv_attention, scaled_dot_product_attention over a packed projection, as that op; gelu_mlp, two linears.
    const std::set<std::string> reduced = {"matmul", "linear", "conv2d", "scaled_dot_product_attention",
                                           "linear_cross_entropy", "qkv_attention", "gelu_mlp"};
    const std::set<std::string> float32 = {"softmax", "log_softmax", "cross_entropy", "mse_loss", "nll_loss",
                                           "binary_cross_entropy_with_logits", "l1_loss", "smooth_l1_loss",
                                           "batch_norm", "layer_norm", "rms_norm", "sum", "mean", "exp", "log", "pow",
                                           "softplus", "logsumexp", "cumsum"};
    for (const OpDef& def : op_table()) {
        INFO(def.name);
        const AutocastPolicy expected = reduced.contains(def.name)   ? AutocastPolicy::Reduced
                                        : float32.contains(def.name) ? AutocastPolicy::Float32
                                                                     : AutocastPolicy::Follow;
        CHECK(autocast_policy(def.op) == expected);
    }
}

TEST_CASE("the field table names each field once, and its keywords once", "[op_rows]") {
    std::set<std::string_view> names, keywords;
    for (const AttrField& field : kAttrFields) {
        INFO(field.name);
        CHECK(names.insert(field.name).second);
        for (const std::string_view k : field.keywords)
            if (!k.empty()) CHECK(keywords.insert(k).second);
    }
    CHECK(find_attr_keyword("dims") == &kAttrFields[attr_field_index("axes")]);
    CHECK(find_attr_keyword("eps_") == nullptr);
}

TEST_CASE("attribute text is the row's fields in table order", "[op_rows]") {
    OpAttrs a;
    a.axes = {0, -1};
    a.keepdim = true;
    a.eps = 0.5;  // not read by sum: left out
    CHECK(attrs_text(op_def(OpType::Sum), a) == "axes=[0, -1], keepdim=true");
    CHECK(attrs_text(op_def(OpType::Relu), a).empty());
    a.reduction = Reduction::Sum;
    CHECK(attrs_text(op_def(OpType::L1Loss), a) == "reduction=sum");
    CHECK(attr_keywords_text(op_def(OpType::Sum)) == "axes (dims), keepdim");
    CHECK(attr_keywords_text(op_def(OpType::Relu)) == "none");
    CHECK(attr_value_text(kAttrFields[attr_field_index("seed")], a, true) == "\"0\"");
    CHECK(attr_value_text(kAttrFields[attr_field_index("clamp_min")], a, true) == "null");
}
