// Forced into every translation unit of the fuzz build when the compiler is clang older than 15 (Debian
// 12's clang is 14): libstdc++ declares std::source_location, which dyngrad's API uses throughout, only
// when the compiler has __builtin_source_location, and clang gained it in version 15. This fills the gap
// with the builtins clang 14 has, behind the same interface; every file of such a build sees this one
// definition. Nothing else uses it.
#pragma once
#include <source_location>

#if !defined(__cpp_lib_source_location) && defined(__clang__)
#include <cstdint>

namespace std {

struct source_location {
    // The default arguments are evaluated where current() is called, or, when current() is itself a
    // default argument, at the call that uses that default.
    static constexpr source_location current(const char* file = __builtin_FILE(),
                                             const char* function = __builtin_FUNCTION(),
                                             uint_least32_t line = __builtin_LINE(),
                                             uint_least32_t column = __builtin_COLUMN()) noexcept {
        source_location here;
        here.file_ = file;
        here.function_ = function;
        here.line_ = line;
        here.column_ = column;
        return here;
    }
    constexpr source_location() noexcept = default;

    constexpr uint_least32_t line() const noexcept { return line_; }
    constexpr uint_least32_t column() const noexcept { return column_; }
    constexpr const char* file_name() const noexcept { return file_; }
    constexpr const char* function_name() const noexcept { return function_; }

private:
    const char* file_ = "";
    const char* function_ = "";
    uint_least32_t line_ = 0;
    uint_least32_t column_ = 0;
};

}  // namespace std
#endif
