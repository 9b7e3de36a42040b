// Hostile command lines, in process: the parser every sample and bench program uses (cli/command_line.h).
// The programs themselves are run with bad arguments by CTest (dyngrad_bad_arguments_test in
// tests/CMakeLists.txt, cases in bench/ and samples/CMakeLists.txt).
#include <string>
#include <string_view>
#include <vector>

#include "../../cli/command_line.h"
#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;
using cli::UsageError;

namespace {

// Parses `words` (without the program name) against a train-like specification.
void parse(std::vector<std::string> words) {
    std::vector<char*> argv{const_cast<char*>("program")};
    for (std::string& w : words) argv.push_back(w.data());
    const cli::Arguments args(static_cast<int>(argv.size()), argv.data(),
                              {.flags = {"--resident"}, .options = {"--lr", "--op", "--data"}, .repeatable = {"--op"}});
}

hostile::Case bad_real(std::string text, std::vector<std::string> keys, double min = 0, double max = 1e6,
                       bool min_exclusive = false) {
    return hostile::expect<UsageError>(str("--lr '", text, "'"), std::move(keys),
                                       [=] { cli::parse_real("--lr", text, min, max, min_exclusive); });
}
hostile::Case bad_int(std::string text, std::vector<std::string> keys, std::int64_t min = 1, std::int64_t max = 1000) {
    return hostile::expect<UsageError>(str("--epochs '", text, "'"), std::move(keys),
                                       [=] { cli::parse_int("--epochs", text, min, max); });
}
hostile::Case bad_device(std::string text, std::vector<std::string> keys, std::string note = "") {
    keys.insert(keys.begin(), "--device");
    return hostile::expect<UsageError>(str("--device ", text, note), std::move(keys),
                                       [=] { cli::parse_device("--device", text); });
}
// A path option and the check its program makes of it.
struct PathOption {
    const char* name;
    std::string (*check)(std::string_view option, std::string_view text);
};
constexpr PathOption kData{"--data", cli::existing_directory}, kLoad{"--load", cli::existing_file},
    kCsv{"--csv", cli::output_file};
hostile::Case bad_path(PathOption option, std::string what, std::string path, std::vector<std::string> keys) {
    keys.insert(keys.begin(), option.name);
    return hostile::expect<UsageError>(str(option.name, " ", what), std::move(keys),
                                       [=] { option.check(option.name, path); });
}
hostile::Case bad_words(std::string label, std::vector<std::string> words, std::vector<std::string> keys) {
    return hostile::expect<UsageError>(std::move(label), std::move(keys), [=] { parse(words); });
}

const bool added = hostile::add(
    "command_lines",
    {
        // numbers: parsed in full, finite, in range
        bad_real("inf", {"--lr", "inf is not a finite number"}),
        bad_real("-inf", {"--lr", "not a finite number"}),
        bad_real("nan", {"--lr", "nan is not a finite number"}),
        bad_real("1e400", {"--lr", "'1e400' is not a number"}),
        bad_real("", {"--lr", "'' is not a number"}),
        bad_real("0.1x", {"--lr", "'0.1x' is not a number"}),
        bad_real(" 0.1", {"--lr", "is not a number"}),
        bad_real("0,1", {"--lr", "'0,1' is not a number"}),
        bad_real("-0.5", {"--lr", "-0.5 is out of range [0"}),
        bad_real("2e6", {"--lr", "2e6 is out of range"}),
        bad_real("0", {"--lr", "0 is out of range (0"}, 0, 1, true),
        bad_int("0", {"--epochs", "0 is out of range [1, 1000]"}),
        bad_int("-3", {"--epochs", "-3 is out of range"}),
        bad_int("1001", {"--epochs", "1001 is out of range"}),
        bad_int("2.5", {"--epochs", "'2.5' is not an integer"}),
        bad_int("1e3", {"--epochs", "'1e3' is not an integer"}),
        bad_int("", {"--epochs", "'' is not an integer"}),
        bad_int("ten", {"--epochs", "'ten' is not an integer"}),
        bad_int("99999999999999999999", {"--epochs", "is not an integer of 64 bits"}),
        bad_int("0x10", {"--epochs", "'0x10' is not an integer"}),
        // names and devices
        hostile::expect<UsageError>("--model resnet", {"--model", "'resnet' is not one of lenet | mlp"},
                                    [] { cli::parse_choice("--model", "resnet", {"lenet", "mlp"}); }),
        hostile::expect<UsageError>("--model with the wrong case", {"--model", "'LeNet'"},
                                    [] { cli::parse_choice("--model", "LeNet", {"lenet", "mlp"}); }),
        hostile::expect<UsageError>("--model empty", {"--model", "'' is not one of"},
                                    [] { cli::parse_choice("--model", "", {"lenet", "mlp"}); }),
        bad_device("gpu", {"'gpu' is not cpu, cuda or cuda:N"}),
        bad_device("cuda:-1", {"-1 is out of range"}),
        bad_device("cuda:x", {"'x' is not an integer"}),
        bad_device("cuda:4096", {"4096 is out of range"}),
        bad_device("cuda:1000", {"cuda:1000 is not available"}, " (no such device)"),
        hostile::expect<UsageError>("--device cuda:0 where only cpu is allowed", {"--device", "'cuda:0' is not one of"},
                                    [] { cli::parse_device("--device", "cuda:0", {"cpu", "cuda"}); }),
        // paths
        bad_path(kData, "naming a regular file", "/proc/self/exe", {"is a regular file, not a directory"}),
        bad_path(kData, "naming nothing", "/nonexistent-dyngrad", {"'/nonexistent-dyngrad' does not exist"}),
        bad_path(kData, "empty", "", {"empty path"}),
        bad_path(kData, "naming a device file", "/dev/null", {"'/dev/null' is not a directory"}),
        bad_path(kLoad, "naming a directory", "/tmp", {"'/tmp' is not a regular file"}),
        bad_path(kLoad, "naming nothing", "/nonexistent-dyngrad.safetensors", {"does not exist"}),
        bad_path(kLoad, "empty", "", {"empty path"}),
        bad_path(kCsv, "naming a directory", "/tmp", {"'/tmp' is a directory, not a file"}),
        bad_path(kCsv, "in a missing directory", "/nonexistent-dyngrad/curve.csv",
                 {"the directory of", "does not exist"}),
        bad_path(kCsv, "empty", "", {"empty path"}),
        // the shape of the command line
        bad_words("unknown option", {"--learning-rate", "0.1"}, {"unknown option '--learning-rate'"}),
        bad_words("single-dash option", {"-lr", "0.1"}, {"unexpected argument '-lr'"}),
        bad_words("positional argument", {"lenet"}, {"unexpected argument 'lenet'"}),
        bad_words("missing value at the end", {"--lr"}, {"--lr needs a value"}),
        bad_words("value that is the next option", {"--data", "--lr", "0.1"},
                  {"--data needs a value, but is followed by the option '--lr'"}),
        bad_words("option given twice", {"--lr", "0.1", "--lr", "0.2"}, {"--lr is given more than once"}),
        bad_words("option given twice, once inline", {"--lr=0.1", "--lr", "0.2"}, {"--lr is given more than once"}),
        bad_words("flag given twice", {"--resident", "--resident"}, {"--resident is given more than once"}),
        bad_words("flag with a value", {"--resident=yes"}, {"--resident takes no value, got 'yes'"}),
        bad_words("help with a value", {"--help=1"}, {"--help takes no value"}),
        bad_words("unknown option written inline", {"--epoch=3"}, {"unknown option '--epoch'"}),
        bad_words("bare double dash", {"--"}, {"unknown option '--'"}),
    });

}  // namespace
