// Independent references: every case of every op-table row against PyTorch in float64. The goldens
// (tests/goldens/<op>.safetensors) hold each case's inputs, the output weight w, PyTorch's output y and
// the gradients of L = Σ w·y (bench/make_goldens.py, whose header gives the commands that make them).
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
    "make it with bench/make_goldens.py (its header gives the commands: dyngrad-export-cases, then the script)";

// Cases where dyngrad disagrees with PyTorch for a reason the lead has accepted, (op, label) -> reason.
// A listed case that agrees fails too, so the list cannot go stale.
const std::map<std::pair<std::string, std::string>, std::string> kKnownFailures = {};

struct Worst {
    double error = 0;
    std::string where;
};

// Compares one tensor; returns its relative-norm error and reports the case when it is over the bound.
double compare(const std::string& where, const Tensor& actual, const Tensor& golden) {
    const double error = relative_norm_error(actual, golden);
    INFO(where << ": relative-norm error " << error << " (max abs " << max_abs_error(actual, golden)
               << "), dyngrad " << describe(actual) << ", golden " << describe(golden));
    CHECK(error <= kTolerance);
    return error;
}

const Tensor* find_tensor(const TensorMap& tensors, const std::string& name) {
    const auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
}

}  // namespace

TEST_CASE("every op-table case agrees with PyTorch's float64 output and gradients", "[golden]") {
    int ops = 0, cases = 0;
    Worst worst_output, worst_grad;
    for (const OpDef& def : op_table()) {
        const std::vector<OpCase> op_cases = def.cases();
        if (op_cases.empty()) continue;
        ++ops;
        const std::filesystem::path path = kGoldenDir / str(def.name, ".safetensors");
        if (!std::filesystem::exists(path)) {
            FAIL_CHECK("op '" << def.name << "' has no golden " << path.string() << ": " << kRegenerate);
            continue;
        }
        SafetensorsMetadata metadata;
        const TensorMap golden = load_safetensors(path, &metadata);
        CHECK(metadata["op"] == def.name);
        INFO("op " << def.name << ": golden " << path.string() << " (" << metadata["reference"] << ")");
        if (metadata["count"] != std::to_string(op_cases.size())) {
            FAIL_CHECK("the golden has " << metadata["count"] << " cases, the op table " << op_cases.size()
                                         << ": " << kRegenerate);
            continue;
        }
        Worst op_worst;
        for (std::size_t k = 0; k < op_cases.size(); ++k) {
            const OpCase& c = op_cases[k];
            const std::string prefix = str(k, ".");
            INFO("case " << k << " '" << c.label << "'");
            if (metadata[prefix + "label"] != c.label) {
                FAIL_CHECK("the golden's case " << k << " is '" << metadata[prefix + "label"] << "': " << kRegenerate);
                continue;
            }
            std::vector<Tensor> inputs;
            for (std::size_t i = 0; const Tensor* x = find_tensor(golden, str(prefix, "x", i)); ++i)
                inputs.push_back(x->clone());
            const Tensor* w = find_tensor(golden, prefix + "w");
            const Tensor* y = find_tensor(golden, prefix + "y");
            REQUIRE(w);
            REQUIRE(y);
            bool shapes_match = inputs.size() == c.shapes.size();
            for (std::size_t i = 0; shapes_match && i < inputs.size(); ++i) shapes_match = inputs[i].shape() == c.shapes[i];
            if (!shapes_match) {
                FAIL_CHECK("the golden's input shapes differ from the case's: " << kRegenerate);
                continue;
            }
            ++cases;
            const OpRun run = run_op(def, c, inputs, *w);
            const auto known = kKnownFailures.find({def.name, c.label});
            double case_worst = 0;
            const auto track = [&](Worst& worst, const std::string& what, double error) {
                case_worst = std::max(case_worst, error);
                if (error >= worst.error) worst = {error, str(def.name, " / ", c.label, " / ", what)};
                if (error >= op_worst.error) op_worst = {error, str(c.label, " / ", what)};
            };
            if (known != kKnownFailures.end()) {
                // Compared without CHECK: the case must still disagree, or the entry is obsolete.
                case_worst = relative_norm_error(run.output, *y);
                for (std::size_t i = 0; i < inputs.size(); ++i)
                    if (const Tensor* g = find_tensor(golden, str(prefix, "g", i)); g && run.grads[i].defined())
                        case_worst = std::max(case_worst, relative_norm_error(run.grads[i], *g));
                std::cout << "known failure " << def.name << " / " << c.label << ": error " << case_worst << " ("
                          << known->second << ")\n";
                CHECK_FALSE(case_worst <= kTolerance);
                continue;
            }
            track(worst_output, "output", compare("output", run.output, *y));
            for (std::size_t i = 0; i < inputs.size(); ++i) {
                const Tensor* g = find_tensor(golden, str(prefix, "g", i));
                const bool checked = gradient_checked(c, i, inputs[i]);
                INFO("input " << i);
                CHECK(checked == (g != nullptr));  // the golden differentiates exactly the checked inputs
                if (!checked || !g) continue;
                REQUIRE(run.grads[i].defined());
                track(worst_grad, str("d input", i), compare(str("d input", i), run.grads[i], *g));
            }
            // batch_norm updates its running statistics (inputs 3, 4) in place; PyTorch's updates are stored too.
            for (std::size_t i = 0; i < inputs.size(); ++i)
                if (const Tensor* after = find_tensor(golden, str(prefix, "after", i)))
                    track(worst_output, str("input", i, " after"), compare(str("input", i, " after"), inputs[i], *after));
            if (case_worst > kTolerance) std::cout << "FAIL " << def.name << " / " << c.label << ": " << case_worst << "\n";
        }
        std::cout << "golden " << def.name << ": " << op_cases.size() << " cases, worst " << op_worst.error << " ("
                  << op_worst.where << ")\n";
    }
    std::cout << "golden: " << ops << " ops, " << cases << " cases; worst output " << worst_output.error << " ("
              << worst_output.where << "), worst gradient " << worst_grad.error << " (" << worst_grad.where << ")\n";
    CHECK(ops > 0);
}

// Every golden file belongs to a row of the op table: a renamed or removed op leaves no stale golden behind.
TEST_CASE("every golden file names an op-table row", "[golden]") {
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(kGoldenDir)) {
        if (entry.path().extension() != ".safetensors") continue;
        ++files;
        const std::string name = entry.path().stem().string();
        const OpDef* def = find_op(name);
        INFO("golden " << entry.path().string());
        CHECK((def && !def->cases().empty()));
    }
    CHECK(files > 0);
}
