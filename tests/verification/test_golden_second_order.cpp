// PyTorch's double backward as an independent reference for every op-table row with a differentiable backward:
// the goldens (tests/goldens/<op>.safetensors, tools/make_goldens.py) hold, per case, directions v_i and
// h_i = dS/dx_i with S = Σ_i <dL/dx_i, v_i>, L = Σ w·y, computed by torch.autograd.grad(..., create_graph=True) and
// a second grad in float64. dyngrad computes the same with grad(create_graph) (graph/higher_order.h) and is compared
// by relative norm.
//
// While no golden holds any second-order reference, the executable says so and exits 77 (CTest: skipped). Once any
// does, every case that has them is compared, and a differentiable case whose golden has none (the golden is older
// than the row's differentiable backward, or make_goldens.py found no PyTorch double backward) fails, named.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

// float64 on both sides; a second derivative goes through compositions (the fused ops) on dyngrad's side.
constexpr double kTolerance = 1e-8;
const std::filesystem::path kGoldenDir = DYNGRAD_GOLDEN_DIR;

struct SecondOrderCase {
    const OpDef* def = nullptr;
    OpCase op_case;
    std::vector<Tensor> inputs, directions, expected;  // directions/expected undefined for unchecked inputs
    Tensor w;
};

// The cases of every row with a differentiable backward whose golden holds second-order references; `missing`
// collects "op / label" of those whose golden holds none.
std::vector<SecondOrderCase> load(std::vector<std::string>& missing) {
    std::vector<SecondOrderCase> out;
    for (const OpDef& def : op_table()) {
        const std::vector<OpCase> op_cases = def.cases();
        if (def.differentiable_backward == nullptr || op_cases.empty()) continue;
        const std::filesystem::path path = kGoldenDir / str(def.name, ".safetensors");
        if (!std::filesystem::exists(path)) {  // test_golden fails for this; here it is only missing
            missing.push_back(str(def.name, " (no golden file)"));
            continue;
        }
        SafetensorsMetadata metadata;
        const TensorMap golden = load_safetensors(path, &metadata);
        if (metadata["count"] != std::to_string(op_cases.size())) {
            missing.push_back(str(def.name, " (stale golden: ", metadata["count"], " cases)"));
            continue;
        }
        for (std::size_t k = 0; k < op_cases.size(); ++k) {
            SecondOrderCase c{&def, op_cases[k], {}, {}, {}, {}};
            bool any = false;
            for (std::size_t i = 0; golden.contains(str(k, ".x", i)); ++i) {
                c.inputs.push_back(golden.at(str(k, ".x", i)));
                const std::string v = str(k, ".v", i), h = str(k, ".h", i);
                c.directions.push_back(golden.contains(v) ? golden.at(v) : Tensor());
                c.expected.push_back(golden.contains(h) ? golden.at(h) : Tensor());
                any = any || golden.contains(h);
            }
            if (!any || metadata[str(k, ".label")] != c.op_case.label || !golden.contains(str(k, ".w"))) {
                missing.push_back(str(def.name, " / ", c.op_case.label));
                continue;
            }
            c.w = golden.at(str(k, ".w"));
            out.push_back(std::move(c));
        }
    }
    return out;
}

std::vector<std::string>& missing_cases() {
    static std::vector<std::string> missing;
    return missing;
}
const std::vector<SecondOrderCase>& cases() {
    static const std::vector<SecondOrderCase> loaded = load(missing_cases());
    return loaded;
}

}  // namespace

TEST_CASE("every differentiable op-table case agrees with PyTorch's float64 double backward", "[golden][second_order]") {
    double worst = 0;
    std::string worst_where;
    for (const SecondOrderCase& c : cases()) {
        const std::string where = str(c.def->name, " / ", c.op_case.label);
        INFO(where);
        ComputeGraph graph;
        std::vector<Var> vars, checked, directions;
        std::vector<std::size_t> checked_index;
        for (std::size_t i = 0; i < c.inputs.size(); ++i) {
            const bool wanted = c.expected[i].defined() && c.directions[i].defined();
            vars.push_back(graph.input(c.inputs[i].clone(), str("x", i), wanted));  // batch_norm writes its statistics
            if (!wanted) continue;
            checked.push_back(vars.back());
            directions.push_back(graph.constant(c.directions[i]));
            checked_index.push_back(i);
        }
        REQUIRE_FALSE(checked.empty());
        const Var y = graph.record(c.def->op, vars, c.op_case.attrs, std::source_location::current());
        const Var weight = graph.constant(c.w);
        const std::vector<Var> outputs{y}, weights{weight};
        const std::vector<Var> first = grad(outputs, checked, weights, {.create_graph = true, .allow_unused = true});
        Var s;
        for (std::size_t j = 0; j < first.size(); ++j) {
            if (!first[j].defined() || !first[j].requires_grad()) continue;  // constant: contributes nothing
            const Var term = sum(mul(first[j], directions[j]));
            s = s.defined() ? add(s, term) : term;
        }
        for (std::size_t j = 0; j < checked.size(); ++j) {
            const Tensor& expected = c.expected[checked_index[j]];
            Tensor actual = Tensor::zeros(expected.shape(), expected.dtype());
            if (s.defined()) {
                const Var h = grad(std::vector<Var>{s}, std::vector<Var>{checked[j]}, {}, {.retain_graph = true,
                                   .allow_unused = true})[0];
                if (h.defined()) actual = h.value();
            }
            const double error = relative_norm_error(actual, expected);
            INFO("input " << checked_index[j] << ": relative-norm error " << error << " (max abs "
                          << max_abs_error(actual, expected) << "), dyngrad " << describe(actual) << ", PyTorch "
                          << describe(expected));
            CHECK(error <= kTolerance);
            if (error >= worst) {
                worst = error;
                worst_where = str(where, ", input ", checked_index[j]);
            }
        }
    }
    std::cout << "second order against PyTorch: " << cases().size() << " cases, worst relative-norm error " << worst
              << " (" << worst_where << ")\n";
}

TEST_CASE("every op-table case with a differentiable backward has a second-order golden", "[golden][second_order]") {
    CHECK(!cases().empty());  // loads the goldens, filling missing_cases()
    for (const std::string& m : missing_cases())
        FAIL_CHECK("no second-order golden for " << m << ": regenerate with tools/make_goldens.py (its header)");
}

int main(int argc, char* argv[]) {
    if (cases().empty()) {
        std::cout << "test_golden_second_order: no golden in " << kGoldenDir.string() << " holds second-order "
                  << "references (\"<k>.h<i>\"); make them with tools/make_goldens.py (its header gives the commands; "
                  << "PyTorch is on the GPU machine): skipped\n";
        return 77;
    }
    return dgtest::run_session(argc, argv);
}
