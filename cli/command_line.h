// The command lines of the sample and bench programs (dyngrad-train, dyngrad-verify, dyngrad-soak, ...):
// one parser, so that every program checks every argument the same way and before any work starts.
//   - `--name value` or `--name=value`; a flag takes no value; `-h` is `--help`
//   - an unknown option, a positional argument, a missing value (also a value that is the next option,
//     as in `--data --lr 0.1`) and an option given twice (unless the program allows repeats) are errors
//   - numbers are parsed in full ("1e-3" yes, "0.1x" and "" no), must be finite and in their range;
//     names must be one of a known list; paths must be of the right kind (a directory, an existing file,
//     a file that can be created)
// Each mistake throws UsageError naming the argument; main prints it with the usage and exits with 2.
//
//   const cli::Arguments args(argc, argv, {.flags = {"--list"}, .options = {"--seed", "--json"}});
//   const std::int64_t seed = cli::parse_int("--seed", args.value("--seed").value_or("0"), 0);
#pragma once
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <dyngrad/dyngrad.h>

namespace dyngrad::cli {

// A command-line mistake: the program prints it with its usage and exits with status 2. A ValueError, so
// the hostile-input catalogue (tests/hostile/command_lines.cpp) can hold the parser's cases.
class UsageError : public ValueError {
    using ValueError::ValueError;
};

struct Spec {
    std::vector<std::string_view> flags = {};       // take no value ("--help" is always known)
    std::vector<std::string_view> options = {};     // take one value each
    std::vector<std::string_view> repeatable = {};  // options that may be given more than once
};

class Arguments {
public:
    Arguments(int argc, char** argv, const Spec& spec) {
        const auto known = [](const std::vector<std::string_view>& list, std::string_view name) {
            for (std::string_view entry : list)
                if (entry == name) return true;
            return false;
        };
        for (int i = 1; i < argc; ++i) {
            std::string name = argv[i];
            if (name == "-h") name = "--help";
            if (!name.starts_with("--"))
                throw UsageError(str("unexpected argument '", name, "' (options start with --)"));
            std::optional<std::string> inline_value;
            if (const auto eq = name.find('='); eq != std::string::npos) {
                inline_value = name.substr(eq + 1);
                name.resize(eq);
            }
            const bool is_flag = name == "--help" || known(spec.flags, name);
            if (!is_flag && !known(spec.options, name)) throw UsageError(str("unknown option '", name, "'"));
            if (values_.count(name) && !known(spec.repeatable, name))
                throw UsageError(str(name, " is given more than once"));
            if (is_flag) {
                if (inline_value) throw UsageError(str(name, " takes no value, got '", *inline_value, "'"));
                values_[name].emplace_back();
                continue;
            }
            if (!inline_value) {
                if (i + 1 >= argc) throw UsageError(str(name, " needs a value"));
                const std::string next = argv[i + 1];
                if (next.starts_with("--"))
                    throw UsageError(str(name, " needs a value, but is followed by the option '", next, "'"));
                inline_value = next;
                ++i;
            }
            values_[name].push_back(*inline_value);
        }
    }

    bool has(std::string_view name) const { return values_.count(std::string(name)) != 0; }
    bool help() const { return has("--help"); }
    // The option's value, or nothing when it was not given.
    std::optional<std::string> value(std::string_view name) const {
        const auto it = values_.find(std::string(name));
        if (it == values_.end()) return std::nullopt;
        return it->second.back();
    }
    // Every value of a repeatable option, in order.
    std::vector<std::string> values(std::string_view name) const {
        const auto it = values_.find(std::string(name));
        return it == values_.end() ? std::vector<std::string>{} : it->second;
    }

private:
    std::map<std::string, std::vector<std::string>> values_;
};

// An integer in [min, max], the whole text.
inline std::int64_t parse_int(std::string_view option, std::string_view text, std::int64_t min,
                              std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size())
        throw UsageError(str(option, ": '", text, "' is not an integer",
                             error == std::errc::result_out_of_range ? " of 64 bits" : ""));
    if (value < min || value > max)
        throw UsageError(str(option, ": ", value, " is out of range [", min, ", ",
                             max == std::numeric_limits<std::int64_t>::max() ? std::string("...") : std::to_string(max),
                             "]"));
    return value;
}

// "32,64,96": comma-separated integers, each in [min, max] (parse_int).
inline std::vector<std::int64_t> parse_int_list(std::string_view option, std::string_view text, std::int64_t min,
                                                std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
    std::vector<std::int64_t> values;
    std::size_t start = 0;
    while (start <= text.size()) {
        const std::size_t comma = std::min(text.find(',', start), text.size());
        values.push_back(parse_int(option, text.substr(start, comma - start), min, max));
        start = comma + 1;
    }
    return values;
}

// A finite number in [min, max] (above min only, when min_exclusive), the whole text.
inline double parse_real(std::string_view option, std::string_view text, double min, double max,
                         bool min_exclusive = false) {
    double value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size())
        throw UsageError(str(option, ": '", text, "' is not a number"));
    if (!std::isfinite(value)) throw UsageError(str(option, ": ", text, " is not a finite number"));
    if (value < min || value > max || (min_exclusive && value == min))
        throw UsageError(str(option, ": ", text, " is out of range ", min_exclusive ? "(" : "[", min, ", ", max, "]"));
    return value;
}

// `text` when it is one of `names`.
inline std::string parse_choice(std::string_view option, std::string_view text,
                                std::initializer_list<std::string_view> names) {
    std::string list;
    for (std::string_view name : names) {
        if (text == name) return std::string(text);
        list += str(list.empty() ? "" : " | ", name);
    }
    throw UsageError(str(option, ": '", text, "' is not one of ", list));
}

// cpu, cuda or cuda:N (or only `allowed`, when given), and a CUDA device this machine has.
inline Device parse_device(std::string_view option, std::string_view text,
                           std::initializer_list<std::string_view> allowed = {}) {
    if (allowed.size() != 0) parse_choice(option, text, allowed);
    Device device = Device::cpu();
    if (text == "cuda") device = Device::cuda(0);
    else if (text.starts_with("cuda:")) device = Device::cuda(static_cast<int>(parse_int(option, text.substr(5), 0, 1023)));
    else if (text != "cpu") throw UsageError(str(option, ": '", text, "' is not cpu, cuda or cuda:N"));
    if (device.is_cuda() && device.index >= cuda_device_count())
        throw UsageError(str(option, ": ", text, " is not available: this machine has ", cuda_device_count(),
                             " CUDA device(s)", DYNGRAD_WITH_CUDA ? "" : " (dyngrad was built without CUDA)"));
    return device;
}

// The status of an existing path; `kind` ("directory", "file") words the message for an empty one.
inline std::filesystem::file_status existing_path(std::string_view option, std::string_view text, const char* kind) {
    if (text.empty()) throw UsageError(str(option, ": needs a ", kind, ", got an empty path"));
    std::error_code error;
    const std::filesystem::file_status status = std::filesystem::status(std::filesystem::path(text), error);
    if (status.type() == std::filesystem::file_type::not_found)
        throw UsageError(str(option, ": '", text, "' does not exist"));
    return status;
}

// A directory that exists.
inline std::string existing_directory(std::string_view option, std::string_view text) {
    const std::filesystem::file_status status = existing_path(option, text, "directory");
    if (!std::filesystem::is_directory(status))
        throw UsageError(str(option, ": '", text, "' is ",
                             std::filesystem::is_regular_file(status) ? "a regular file, " : "", "not a directory"));
    return std::string(text);
}

// A regular file that exists.
inline std::string existing_file(std::string_view option, std::string_view text) {
    if (!std::filesystem::is_regular_file(existing_path(option, text, "file")))
        throw UsageError(str(option, ": '", text, "' is not a regular file"));
    return std::string(text);
}

// A file the program may create or overwrite: not a directory, in a directory that exists.
inline std::string output_file(std::string_view option, std::string_view text) {
    namespace fs = std::filesystem;
    if (text.empty()) throw UsageError(str(option, ": needs a file name, got an empty path"));
    const fs::path path(text);
    std::error_code error;
    if (fs::is_directory(path, error)) throw UsageError(str(option, ": '", text, "' is a directory, not a file"));
    const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
    if (!fs::is_directory(parent, error))
        throw UsageError(str(option, ": the directory of '", text, "' (", parent.string(), ") does not exist"));
    return std::string(text);
}

// A program's main(): parse() returns its options (a UsageError: the message and `usage` on stderr, status 2),
// then run(options) returns the status (an exception: its message on a line of its own, status 1).
template <typename Parse, typename Run>
int run_program(const char* program, const char* usage, Parse parse, Run run) {
    decltype(parse()) options;
    try {
        options = parse();
    } catch (const UsageError& e) {
        std::fprintf(stderr, "%s: %s\n%s", program, e.what(), usage);
        return 2;
    }
    try {
        return run(options);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "\n%s: %s\n", program, e.what());
        return 1;
    }
}

// A program's main() that parses its options as it goes: run() returns the status. A UsageError: "PROGRAM: message"
// and `usage_note` (e.g. " (--help shows the usage)") on stderr, status 2; any other exception: "PROGRAM: message",
// status `error_status`.
template <typename Run>
int guarded_main(const char* program, Run run, const char* usage_note = "", int error_status = 1) {
    try {
        return run();
    } catch (const UsageError& e) {
        std::fprintf(stderr, "%s: %s%s\n", program, e.what(), usage_note);
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        return error_status;
    }
}

// A GPU bench's check before it measures: without a CUDA device it says so and returns true (the bench then
// exits 77, which CTest and the scripts read as skipped).
inline bool no_cuda_device(const char* program) {
    if (cuda_device_count() > 0) return false;
    std::printf("%s: no CUDA device; nothing to measure\n", program);
    return true;
}

}  // namespace dyngrad::cli
