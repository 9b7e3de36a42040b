#include "dyngrad/core/source_site.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

namespace dyngrad {

namespace {

// libstdc++ and libc++ both implement source_location as one pointer to this record, which the
// compiler's __builtin_source_location() fills (its field names and order are fixed by the builtin).
struct SiteRecord {
    const char* file_name;
    const char* function_name;
    unsigned line;
    unsigned column;
};

#if (defined(__GLIBCXX__) || defined(_LIBCPP_VERSION)) && defined(__cpp_lib_source_location)
constexpr bool kPointerLayout = sizeof(std::source_location) == sizeof(const SiteRecord*);
#else
constexpr bool kPointerLayout = false;
#endif

struct StoredSite {
    std::string file;
    std::string function;
    SiteRecord record{};
};

std::mutex sites_mutex;
// Never shrinks: a node recorded with a site may outlive any user of it.
std::map<std::tuple<std::string, std::string, unsigned>, std::unique_ptr<StoredSite>, std::less<>> sites;

const SiteRecord* intern(std::string_view file, std::string_view function, unsigned line) {
    const std::lock_guard lock(sites_mutex);
    auto key = std::make_tuple(std::string(file), std::string(function), line);
    auto found = sites.find(key);
    if (found == sites.end()) {
        auto stored = std::make_unique<StoredSite>();
        stored->file = std::get<0>(key);
        stored->function = std::get<1>(key);
        found = sites.emplace(std::move(key), std::move(stored)).first;
        StoredSite& s = *found->second;
        s.record = {s.file.c_str(), s.function.c_str(), line, 0};
    }
    return &found->second->record;
}

}  // namespace

// Declared for users in graph/graph.h and for core in core/tensor_indexing.h; defined here, in the lowest layer that
// prints sites, so core's messages print them as the engine's do.
std::string describe_site(const std::source_location& where) {
    return std::filesystem::path(where.file_name()).filename().string() + ":" + std::to_string(where.line());
}

std::source_location foreign_site(std::string_view file, std::string_view function, unsigned line) {
    if constexpr (kPointerLayout) {
        const SiteRecord* record = intern(file, function, line);
        std::source_location where;
        std::memcpy(static_cast<void*>(&where), &record, sizeof record);
        // The layout assumption checked once per process: a library that stores it otherwise keeps C++ sites.
        static const bool layout_holds = [&] {
            return where.file_name() == record->file_name && where.line() == record->line;
        }();
        if (layout_holds) return where;
    }
#if !defined(__cpp_lib_source_location) && defined(__clang__)
    // clang 14's shim (tests/fuzz/source_location_clang14.h) takes the fields as arguments.
    const SiteRecord* record = intern(file, function, line);
    return std::source_location::current(record->file_name, record->function_name, record->line, 0);
#else
    return std::source_location::current();
#endif
}

}  // namespace dyngrad
