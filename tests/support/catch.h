// Catch2 2.x / 3.x compatibility for the tests: one include, one set of names.
// DYNGRAD_CATCH2_V3 (1 or 0) comes from tests/CMakeLists.txt, which found one of the two.
#pragma once
#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

#if DYNGRAD_CATCH2_V3
#include <catch2/catch_approx.hpp>
#include <catch2/generators/catch_generators.hpp>  // GENERATE (part of catch.hpp in Catch2 2)
#include <catch2/catch_message.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <catch2/matchers/catch_matchers_vector.hpp>
#else
#include <catch2/catch.hpp>
#endif

namespace dgtest {

// Ends the running test case as skipped, visibly: Catch2 2.13 has no SKIP(), so the reason goes out as a
// WARN, which both Catch2 versions print in every run ("SKIPPED: <why>" under the case's name), where a bare
// `return` would pass in silence (e.g. a GPU case on CPU-only CI).
#define DG_SKIP(why)                 \
    do {                             \
        WARN("SKIPPED: " << why);    \
        return;                      \
    } while (0)

#if DYNGRAD_CATCH2_V3
using Catch::Approx;
template <typename T> using MatcherBase = Catch::Matchers::MatcherBase<T>;
inline auto Contains(const std::string& text) { return Catch::Matchers::ContainsSubstring(text); }
#else
using Catch::Detail::Approx;
template <typename T> using MatcherBase = Catch::Matchers::Impl::MatcherBase<T>;
inline auto Contains(const std::string& text) { return Catch::Matchers::Contains(text); }
#endif

// Element-wise approximate equality of two vectors (relative 100·float epsilon, plus `margin`).
// The matcher keeps a reference to `expected`: use it inside one CHECK_THAT.
inline auto ApproxVector(const std::vector<double>& expected, double margin = 1e-12) {
    auto matcher = Catch::Matchers::Approx(expected);
    matcher.margin(margin);
    return matcher;
}

// Matches an exception whose what() contains every one of `parts`; for REQUIRE_THROWS_MATCHES, which
// checks the exception type itself and prints the message on failure.
class MessageHas : public MatcherBase<std::exception> {
public:
    MessageHas(std::initializer_list<std::string> parts) : parts_(parts) {}
    bool match(const std::exception& error) const override {
        const std::string message = error.what();
        for (const std::string& part : parts_)
            if (message.find(part) == std::string::npos) return false;
        return true;
    }
    std::string describe() const override {
        std::string out = "has a message containing";
        for (const std::string& part : parts_) out += " \"" + part + "\"";
        return out;
    }

private:
    std::vector<std::string> parts_;
};

// Runs the Catch session: the main of every test executable, or the end of a custom main (test_gpu).
int run_session(int argc, char* argv[]);
// The main of a GPU test executable: without a CUDA device (or in a CPU-only build) it prints
// "dyngrad: no CUDA device: WHAT skipped" and returns 77 (the executables' CTest SKIP_RETURN_CODE), else runs
// the session.
int run_gpu_session(int argc, char* argv[], const char* what);

}  // namespace dgtest

// Catch2 2.x puts Approx in the global namespace and 3.x does not: one name for tests built with either (the
// GPU machine has 3.x, CI 2.x), so a bare Approx cannot compile here and fail there.
using dgtest::Approx;
