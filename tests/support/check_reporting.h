// Shared by the table-driven tests (test_gradcheck, test_reduced_precision): the seed base of their random
// inputs and the one-line description of a check result.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "dyngrad/dyngrad.h"

namespace dgtest {

// `fallback`, or DYNGRAD_TEST_SEED when set: read and printed at the first call, so that a failure can be
// reproduced; later calls return the same value (one test program, one seed base).
inline std::uint64_t seed_base(const char* test, std::uint64_t fallback) {
    static const std::uint64_t value = [&] {
        const char* env = std::getenv("DYNGRAD_TEST_SEED");
        const std::uint64_t chosen = env ? std::strtoull(env, nullptr, 10) : fallback;
        std::cout << test << ": seed base " << chosen
                  << " (each op uses seed_for_name(base, its name); set DYNGRAD_TEST_SEED to change)" << std::endl;
        return chosen;
    }();
    return value;
}

inline std::string describe_result(const dyngrad::CheckResult& r) {
    return dyngrad::str(r.check, " of ", r.op, " '", r.case_label, "' shapes ", r.shapes, ": max rel err ",
                        r.max_rel_err, " (tolerance ", r.tolerance, "), max abs err ", r.max_abs_err, ", ", r.detail);
}

}  // namespace dgtest
