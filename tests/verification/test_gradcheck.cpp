// Table-driven gradient checks: every case of every op-table row passes the float64 finite-difference
// check and the float32-vs-float64 check on the CPU. A new row is picked up here without a new test.
//
// Inputs are random but reproducible: each op draws from seed_for_name(base, op name), so an op's inputs
// do not depend on its position in the table. The base is printed;
// DYNGRAD_TEST_SEED=<n> replaces it to try other inputs.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>

#include "catch.h"
#include "dyngrad/dyngrad.h"
#include "check_reporting.h"
#include "input_subsets.h"

using namespace dyngrad;

namespace {

constexpr double kFiniteDifferenceTolerance = 1e-6;
constexpr double kFloat32Tolerance = 1e-5;

std::uint64_t seed_base() { return dgtest::seed_base("test_gradcheck", 20240611); }

using dgtest::describe_result;

}  // namespace

TEST_CASE("every op-table case passes finite differences and the float32 check", "[gradcheck]") {
    for (const OpDef& def : op_table()) {
        for (const OpCase& op_case : def.cases()) {
            DYNAMIC_SECTION(def.name << ": " << op_case.label) {
                const std::uint64_t seed = seed_for_name(seed_base(), def.name);
                INFO("op " << def.name << ", case '" << op_case.label << "', seed " << seed);

                Generator fd_gen(seed);
                const CheckResult fd = finite_difference_check(def, op_case, fd_gen, kFiniteDifferenceTolerance);
                INFO(describe_result(fd));
                CHECK(fd.pass);
                CHECK(fd.check == "finite_diff");

                Generator f32_gen(seed);
                const CheckResult single = float32_check(def, op_case, f32_gen, kFloat32Tolerance);
                INFO(describe_result(single));
                CHECK(single.pass);
                CHECK(single.check == "f32_vs_f64");
            }
        }
    }
}

TEST_CASE("the op table covers every op with cases and CPU kernels", "[gradcheck][table]") {
    const std::span<const OpDef> table = op_table();
    REQUIRE(table.size() == kOpTypeCount);
    std::size_t with_cases = 0;
    std::set<std::string> names;
    for (std::size_t index = 0; index < table.size(); ++index) {
        const OpDef& def = table[index];
        INFO("row " << index << " '" << def.name << "'");
        CHECK(static_cast<std::size_t>(def.op) == index);
        CHECK(names.insert(def.name).second);
        const std::vector<OpCase> cases = def.cases();
        if (def.op == OpType::Leaf || def.op == OpType::Custom) {
            // Leaves have no op; custom ops carry their own definitions (tests/verification/test_verify.cpp).
            CHECK(std::string(def.name) == (def.op == OpType::Leaf ? "leaf" : "custom"));
            CHECK(cases.empty());
            continue;
        }
        CHECK_FALSE(cases.empty());
        CHECK((def.arity >= 1 || def.arity == kVariadic));
        CHECK(def.infer != nullptr);
        CHECK(def.cpu.forward != nullptr);
        // A non-differentiable row (comparisons, argmax) has forward kernels only, and cases that check no gradient.
        CHECK((def.cpu.backward != nullptr) == def.differentiable);
        if (cuda_compiled()) {
            CHECK(def.cuda.forward != nullptr);
            CHECK((def.cuda.backward != nullptr) == def.differentiable);
        }
        if (!def.differentiable)
            for (const OpCase& op_case : cases)
                for (std::size_t i = 0; i < op_case.shapes.size(); ++i)
                    CHECK((i < op_case.domains.size() && op_case.domains[i] == InputDomain::Constant));
        for (const OpCase& op_case : cases) {
            INFO("case '" << op_case.label << "'");
            CHECK(takes_input_count(def, static_cast<int>(op_case.shapes.size())));
            CHECK((op_case.domains.empty() || op_case.domains.size() == op_case.shapes.size()));
        }
        if (!cases.empty()) ++with_cases;
    }
    CHECK(with_cases >= 30);
}

TEST_CASE("find_op and op_def look rows up", "[gradcheck][table]") {
    for (const OpDef& def : op_table()) {
        INFO(def.name);
        CHECK(find_op(def.name) == &def);
        CHECK(&op_def(def.op) == &def);
    }
    REQUIRE(find_op("relu") != nullptr);
    CHECK(find_op("relu")->op == OpType::Relu);
    CHECK(find_op("cross_entropy")->arity == 3);  // the class weights are optional
    CHECK(find_op("cross_entropy")->optional_inputs == 1);
    CHECK(find_op("linear")->arity == 3);
    CHECK(find_op("no_such_op") == nullptr);
    CHECK(find_op("") == nullptr);
    CHECK(find_op("Relu") == nullptr);
}

TEST_CASE("case inputs follow their domains", "[gradcheck][inputs]") {
    const OpCase op_case{"domains", {{50, 7}, {50}, {40}, {40}}, {},
                         {InputDomain::Any, InputDomain::Labels, InputDomain::Positive, InputDomain::AwayFromZero}};
    Generator gen(seed_base());
    const std::vector<Tensor> inputs = make_case_inputs(op_case, DType::f64, gen);
    REQUIRE(inputs.size() == 4);
    CHECK(inputs[0].dtype() == DType::f64);
    CHECK(inputs[1].dtype() == DType::i64);
    for (double label : inputs[1].to_vector()) {
        CHECK(label >= 0);
        CHECK(label < 7);
    }
    for (double v : inputs[2].to_vector()) {
        CHECK(v >= 0.5);
        CHECK(v <= 2.0);
    }
    for (double v : inputs[3].to_vector()) CHECK(std::abs(v) >= 0.2);

    Generator again(seed_base());
    CHECK(make_case_inputs(op_case, DType::f64, again)[0].to_vector() == inputs[0].to_vector());
}

TEST_CASE("error measures", "[gradcheck][measures]") {
    const Tensor reference = Tensor::of({3, 4}, DType::f64);
    CHECK(relative_norm_error(reference, reference) == 0);
    CHECK(relative_norm_error(Tensor::of({3, 5}, DType::f64), reference) == dgtest::Approx(0.2));
    CHECK(max_abs_error(Tensor::of({3, 5}, DType::f64), reference) == dgtest::Approx(1.0));
    const Tensor nan = Tensor::of({std::nan(""), 4}, DType::f64);
    CHECK(std::isinf(relative_norm_error(nan, reference)));
    CHECK(std::isinf(relative_norm_error(reference, nan)));
    CHECK(std::isinf(max_abs_error(nan, reference)));
    CHECK(std::isinf(relative_norm_error(Tensor::of({3}, DType::f64), reference)));
}

// A backward kernel receives needs_grad per input; one that skips work an input it must still serve depends
// on (or writes a gradient where none was asked) would pass the all-inputs checks above. For every case with
// at least two differentiable inputs, each non-empty proper subset of them requires grad in turn.
TEST_CASE("every op-table case gives an input subset the all-inputs gradients", "[gradcheck][subsets]") {
    // The same float64 kernels on the same inputs: a subset may change which products are formed, never
    // their values beyond rounding (a few ulps of the gradient's norm); a kernel that drops or adds a term
    // is off by O(1) relatively.
    constexpr double kSubsetTolerance = 1e-13;
    const std::span<const OpDef> table = op_table();
    std::size_t cases_run = 0;
    for (std::size_t index = 0; index < table.size(); ++index) {
        const OpDef& def = table[index];
        for (const OpCase& op_case : def.cases()) {
            Generator gen(seed_base() + index);
            const std::vector<Tensor> inputs = make_case_inputs(op_case, DType::f64, gen);
            const std::vector<std::size_t> differentiable = dgtest::differentiable_inputs(op_case, inputs);
            if (differentiable.size() < 2) continue;
            ++cases_run;
            DYNAMIC_SECTION(def.name << ": " << op_case.label) {
                INFO("op " << def.name << ", case '" << op_case.label << "', seed " << seed_base() + index);
                const Tensor probe = run_op(def, op_case, inputs, Tensor()).output;
                const Tensor weights = Tensor::normal(probe.shape(), 0.0, 1.0, gen, DType::f64);
                const dgtest::SubsetPlan plan = dgtest::plan_grad_subsets(def, op_case, inputs, differentiable, weights);
                for (const std::size_t i : differentiable) REQUIRE(plan.reference.has_grad[i]);
                for (const std::vector<bool>& wants : plan.others) {
                    std::string which;
                    for (const std::size_t i : differentiable)
                        if (wants[i]) which += str(which.empty() ? "" : ",", "input", i);
                    INFO("inputs requiring grad: " << which);
                    const dgtest::SubsetRun run = dgtest::run_with_grad_subset(def, op_case, inputs, wants, weights);
                    for (const std::size_t i : differentiable) {
                        INFO("input " << i);
                        CHECK(run.requires_grad[i] == wants[i]);
                        CHECK(run.has_grad[i] == wants[i]);
                        if (wants[i] && run.has_grad[i])
                            CHECK(relative_norm_error(run.grads[i], plan.reference.grads[i]) <= kSubsetTolerance);
                    }
                }
            }
        }
    }
    CHECK(cases_run >= 40);  // every binary op, linear, conv2d, batch_norm, concat, rnn, mse_loss
}
