// Independent references: every case of every op-table row against PyTorch in float64. The goldens
// (tests/goldens/<op>.safetensors) hold each case's inputs, the output weight w, PyTorch's output y and
// the gradients of L = Σ w·y (tools/make_goldens.py, whose header gives the commands that make them).
// Finite differences and the GPU comparison only test dyngrad against itself; a formula wrong in the
// same way on both backends, forward and derivative alike, fails here.
//
// A row without a golden, a golden whose cases no longer match the table (label, count, shapes), and
// any output or gradient further than kTolerance (relative norm) from PyTorch's fail the test.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <utility>

#include "catch.h"
#include "dyngrad/dyngrad.h"

using namespace dyngrad;

namespace {

// float64 on both sides with the same inputs: only rounding differs (observed worst: see docs/verification.md).
constexpr double kTolerance = 1e-10;

const std::filesystem::path kGoldenDir = DYNGRAD_GOLDEN_DIR;
constexpr const char* kRegenerate =
    "make it with tools/make_goldens.py (its header gives the commands: dyngrad-export-cases, then the script)";

// Cases where dyngrad disagrees with PyTorch for a reason the lead has accepted, (op, label) -> reason.
// A listed case that agrees fails too, so the list cannot go stale.
const std::map<std::pair<std::string, std::string>, std::string> kKnownFailures = {};

bool known_failure(const OpDef& def, const OpCase& c) { return kKnownFailures.contains({def.name, c.label}); }

// One case of one op with PyTorch's results; grads[i] / after[i] undefined where the golden has none.
struct GoldenCase {
    const OpDef* def = nullptr;
    OpCase op_case;
    std::vector<Tensor> inputs;
    Tensor w, y;
    std::vector<Tensor> grads;  // dL/d input i
    std::vector<Tensor> after;  // batch_norm: the running statistics after the forward
    std::string where() const { return str(def->name, " / ", op_case.label); }
};

Tensor tensor_or_undefined(const TensorMap& tensors, const std::string& name) {
    const auto it = tensors.find(name);
    return it == tensors.end() ? Tensor() : it->second;
}

// Every case of every op-table row, checked against the table: a missing or stale golden fails here.
std::vector<GoldenCase> load_goldens() {
    std::vector<GoldenCase> loaded;
    for (const OpDef& def : op_table()) {
        const std::vector<OpCase> op_cases = def.cases();
        if (op_cases.empty()) continue;
        const std::filesystem::path path = kGoldenDir / str(def.name, ".safetensors");
        if (!std::filesystem::exists(path)) {
            FAIL_CHECK("op '" << def.name << "' has no golden " << path.string() << ": " << kRegenerate);
            continue;
        }
        SafetensorsMetadata metadata;
        const TensorMap golden = load_safetensors(path, &metadata);
        INFO("op " << def.name << ": golden " << path.string());
        CHECK(metadata["op"] == def.name);
        if (metadata["count"] != std::to_string(op_cases.size())) {
            FAIL_CHECK("the golden has " << metadata["count"] << " cases, the op table " << op_cases.size() << ": "
                                         << kRegenerate);
            continue;
        }
        for (std::size_t k = 0; k < op_cases.size(); ++k) {
            GoldenCase g;
            g.def = &def;
            g.op_case = op_cases[k];
            const std::string prefix = str(k, ".");
            INFO("case " << k << " '" << g.op_case.label << "'");
            if (metadata[prefix + "label"] != g.op_case.label) {
                FAIL_CHECK("the golden's case " << k << " is '" << metadata[prefix + "label"] << "': " << kRegenerate);
                continue;
            }
            for (std::size_t i = 0; golden.contains(str(prefix, "x", i)); ++i) {
                g.inputs.push_back(golden.at(str(prefix, "x", i)));
                g.grads.push_back(tensor_or_undefined(golden, str(prefix, "g", i)));
                g.after.push_back(tensor_or_undefined(golden, str(prefix, "after", i)));
            }
            g.w = tensor_or_undefined(golden, prefix + "w");
            g.y = tensor_or_undefined(golden, prefix + "y");
            bool shapes_match = g.inputs.size() == g.op_case.shapes.size() && g.w.defined() && g.y.defined();
            for (std::size_t i = 0; shapes_match && i < g.inputs.size(); ++i)
                shapes_match = g.inputs[i].shape() == g.op_case.shapes[i];
            if (!shapes_match) {
                FAIL_CHECK("the golden's tensors differ from the case's inputs: " << kRegenerate);
                continue;
            }
            loaded.push_back(std::move(g));
        }
    }
    return loaded;
}

const std::vector<GoldenCase>& goldens() {
    static const std::vector<GoldenCase> loaded = load_goldens();
    return loaded;
}

std::vector<Tensor> fresh_inputs(const GoldenCase& g) {
    std::vector<Tensor> inputs;
    for (const Tensor& x : g.inputs) inputs.push_back(x.clone());  // batch_norm writes its running statistics
    return inputs;
}

// run_op with only the inputs in `wants_grad` requiring grad.
OpRun run_with(const GoldenCase& g, const std::vector<Tensor>& inputs, const std::vector<bool>& wants_grad) {
    ComputeGraph graph;
    std::vector<Var> vars;
    for (std::size_t i = 0; i < inputs.size(); ++i) vars.push_back(graph.input(inputs[i], str("input", i), wants_grad[i]));
    Var y = graph.record(g.def->op, vars, g.op_case.attrs, std::source_location::current());
    OpRun run{y.value(), {}};
    graph.backward(y, g.w);
    for (const Var& v : vars) run.grads.push_back(v.requires_grad() ? v.grad() : Tensor());
    return run;
}

struct Worst {
    double error = 0;
    std::string where;
    void fold(double e, const std::string& what) {
        if (e >= error) *this = {e, what};
    }
};

// Relative-norm error of one tensor, with a CHECK naming the case when it is over the bound.
double compare(const std::string& what, const Tensor& actual, const Tensor& golden) {
    const double error = relative_norm_error(actual, golden);
    INFO(what << ": relative-norm error " << error << " (max abs " << max_abs_error(actual, golden) << "), dyngrad "
              << describe(actual) << ", golden " << describe(golden));
    CHECK(error <= kTolerance);
    return error;
}

}  // namespace

TEST_CASE("every op-table case agrees with PyTorch's float64 output and gradients", "[golden]") {
    Worst worst_output, worst_grad;
    std::map<std::string, Worst> per_op;
    std::size_t ops = 0;
    for (const GoldenCase& g : goldens()) {
        INFO(g.where());
        ops += per_op.contains(g.def->name) ? 0 : 1;
        Worst& op_worst = per_op[g.def->name];
        std::vector<Tensor> inputs = fresh_inputs(g);
        const OpRun run = run_op(*g.def, g.op_case, inputs, g.w);
        // (error, what) for the output, every gradient and every updated running statistic.
        std::vector<std::pair<std::string, std::pair<const Tensor*, const Tensor*>>> compared = {
            {"output", {&run.output, &g.y}}};
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            const bool checked = gradient_checked(g.op_case, i, inputs[i]);
            INFO("input " << i);
            CHECK(checked == g.grads[i].defined());  // the golden differentiates exactly the checked inputs
            if (checked && g.grads[i].defined()) {
                REQUIRE(run.grads[i].defined());
                compared.push_back({str("d input", i), {&run.grads[i], &g.grads[i]}});
            }
            // batch_norm updates its running statistics (inputs 3, 4) in place; PyTorch's updates are stored too.
            if (g.after[i].defined()) compared.push_back({str("input", i, " after the forward"), {&inputs[i], &g.after[i]}});
        }
        if (known_failure(*g.def, g.op_case)) {
            // Compared without CHECK: the case must still disagree, or its entry is obsolete.
            double error = 0;
            for (const auto& [what, pair] : compared) error = std::max(error, relative_norm_error(*pair.first, *pair.second));
            std::cout << "known failure " << g.where() << ": error " << error << " ("
                      << kKnownFailures.at({g.def->name, g.op_case.label}) << ")\n";
            CHECK_FALSE(error <= kTolerance);
            continue;
        }
        double case_worst = 0;
        for (const auto& [what, pair] : compared) {
            const double error = compare(what, *pair.first, *pair.second);
            case_worst = std::max(case_worst, error);
            (what == "output" || what.ends_with("forward") ? worst_output : worst_grad).fold(error, str(g.where(), " / ", what));
            op_worst.fold(error, str(g.op_case.label, " / ", what));
        }
        if (case_worst > kTolerance) std::cout << "FAIL " << g.where() << ": relative-norm error " << case_worst << "\n";
    }
    for (const auto& [op, worst] : per_op) std::cout << "golden " << op << ": worst " << worst.error << " (" << worst.where << ")\n";
    std::cout << "golden: " << ops << " ops, " << goldens().size() << " cases; worst output " << worst_output.error << " ("
              << worst_output.where << "), worst gradient " << worst_grad.error << " (" << worst_grad.where << ")\n";
    CHECK(ops > 0);
}

// Each checked input alone requiring grad, and every checked input but one: the kernels' needs_grad branches
// must give the same gradients as when every input requires grad, and none for the others.
TEST_CASE("op-table cases with only some inputs requiring grad agree with PyTorch", "[golden]") {
    Worst worst;
    int runs = 0;
    for (const GoldenCase& g : goldens()) {
        if (known_failure(*g.def, g.op_case)) continue;
        std::vector<std::size_t> checked;
        for (std::size_t i = 0; i < g.inputs.size(); ++i)
            if (gradient_checked(g.op_case, i, g.inputs[i])) checked.push_back(i);
        if (checked.size() < 2) continue;
        std::vector<std::vector<bool>> subsets;
        for (const std::size_t i : checked) {
            std::vector<bool> only(g.inputs.size(), false), all_but(g.inputs.size(), false);
            only[i] = true;
            for (const std::size_t j : checked) all_but[j] = j != i;
            subsets.push_back(only);
            if (checked.size() > 2) subsets.push_back(all_but);  // with two inputs, "all but one" is "only the other"
        }
        for (const std::vector<bool>& wants_grad : subsets) {
            std::string mask;
            for (const bool r : wants_grad) mask += r ? '1' : '0';
            INFO(g.where() << ", inputs requiring grad " << mask);
            const OpRun run = run_with(g, fresh_inputs(g), wants_grad);
            ++runs;
            for (std::size_t i = 0; i < g.inputs.size(); ++i) {
                INFO("input " << i);
                CHECK(run.grads[i].defined() == wants_grad[i]);
                if (wants_grad[i] && run.grads[i].defined())
                    worst.fold(compare(str("d input", i), run.grads[i], g.grads[i]), str(g.where(), " ", mask, " d input", i));
            }
        }
    }
    std::cout << "golden, some inputs requiring grad: " << runs << " runs; worst gradient " << worst.error << " ("
              << worst.where << ")\n";
    CHECK(runs > 0);
}

// Every golden file belongs to a row of the op table: a renamed or removed op leaves no stale golden behind.
TEST_CASE("every golden file names an op-table row", "[golden]") {
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(kGoldenDir)) {
        if (entry.path().extension() != ".safetensors") continue;
        ++files;
        const OpDef* def = find_op(entry.path().stem().string());
        INFO("golden " << entry.path().string());
        CHECK((def && !def->cases().empty()));
    }
    CHECK(files > 0);
}
