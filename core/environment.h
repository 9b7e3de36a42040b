// The process's environment as the library's switches read it (DYNGRAD_* variables).
#pragma once
#include <cstdlib>
#include <string_view>

namespace dyngrad {

// The value of the environment variable `name`; "" when it is unset.
inline std::string_view environment(const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
}
// Whether a switch `name` is on: set to anything but "" or "0".
inline bool environment_flag(const char* name) { return environment(name) != "" && environment(name) != "0"; }

}  // namespace dyngrad
