// The hostile-input catalogue: bad inputs to the public API, one table per area (tests/hostile/*.cpp),
// all run by one test (run.cpp) that counts them. Each case must throw the dyngrad error type it names,
// with a message holding every key; anything else is counted as a failure by kind:
//   wrong type (a dyngrad error of another type), untyped (a std::exception that is not dyngrad's),
//   non-std (anything else thrown) or silent (nothing thrown). A crash ends the process: CTest fails.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "dyngrad/core/error.h"

namespace hostile {

struct Case {
    std::string area;    // "engine", "sizes", ...
    std::string label;   // what the bad input is
    std::string expected;  // the error type's name, for the report
    std::function<bool(const dyngrad::Error&)> has_expected_type;
    std::vector<std::string> keys;  // words the message must contain
    std::function<void()> call;
};

std::vector<Case>& registry();

// A case expecting error type E: hostile::expect<dyngrad::ShapeError>("conv2d padding INT64_MAX", {"conv2d"}, [] {...})
template <typename E>
Case expect(std::string label, std::vector<std::string> keys, std::function<void()> call) {
    return Case{"", std::move(label), typeid(E).name(),
                [](const dyngrad::Error& e) { return dynamic_cast<const E*>(&e) != nullptr; }, std::move(keys),
                std::move(call)};
}

// Adds an area's cases at static-initialisation time: `static const bool added = hostile::add("sizes", {...});`
inline bool add(const std::string& area, std::vector<Case> cases) {
    for (Case& c : cases) {
        c.area = area;
        registry().push_back(std::move(c));
    }
    return true;
}

}  // namespace hostile
