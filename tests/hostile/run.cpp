// Runs every case of the hostile-input catalogue (hostile.h) and prints the tally that
// docs/reliability.md quotes: "N bad inputs tried: N typed as expected, 0 wrong type, 0 untyped, 0 non-std, 0 silent".
#include <iostream>
#include <map>

#include "catch.h"
#include "hostile.h"

namespace hostile {
std::vector<Case>& registry() {
    static std::vector<Case> cases;
    return cases;
}
}  // namespace hostile

TEST_CASE("hostile inputs give the typed error they name", "[errors][hostile]") {
    const auto& cases = hostile::registry();
    REQUIRE(!cases.empty());
    std::map<std::string, int> tally;
    std::map<std::string, int> per_area;
    for (const hostile::Case& c : cases) {
        std::string outcome;
        std::string detail;
        try {
            c.call();
            outcome = "silent";
        } catch (const dyngrad::Error& e) {
            detail = e.what();
            if (!c.has_expected_type(e)) {
                outcome = "wrong type";
            } else {
                outcome = "typed as expected";
                for (const std::string& key : c.keys)
                    if (detail.find(key) == std::string::npos) outcome = "message misses a key";
            }
        } catch (const std::exception& e) {
            outcome = "untyped";
            detail = e.what();
        } catch (...) {
            outcome = "non-std";
        }
        ++tally[outcome];
        ++per_area[c.area];
        INFO("[" << c.area << "] " << c.label << " (expects " << c.expected << "): " << outcome << "; " << detail);
        CHECK(outcome == "typed as expected");
    }
    std::cout << cases.size() << " bad inputs tried:";
    for (const auto& [outcome, count] : tally) std::cout << " " << count << " " << outcome << ";";
    std::cout << "\nper area:";
    for (const auto& [area, count] : per_area) std::cout << " " << area << " " << count << ";";
    std::cout << "\n";
}
