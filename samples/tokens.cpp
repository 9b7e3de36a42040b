// dyngrad-tokens: writes token files in llm.c's format (nn/token_file.h) from any text, so that char_gpt
// --model gpt2, llm.c's train_gpt2cu and bench/torch_gpt2.py train on the same tokens; and decodes them back.
// Nothing is downloaded: the vocabulary is the 256 bytes, or those plus the most frequent words of a reference
// text (by default the fortunes that Debian's `fortunes` package installs).
//
//   dyngrad-tokens --out train.bin [--val-out val.bin --val-fraction 0.1] [--text PATH]
//                  [--vocab bytes|words] [--words N] [--reference PATH]
//   dyngrad-tokens --decode train.bin --out text.txt [--vocab ... --words N --reference PATH]
//
// --text and --reference: a file, or a directory read by char_gpt's rule (samples/text_files.h). With --val-out,
// the last --val-fraction of the tokens go there and the rest to --out. The last line printed is
// `vocab_size=V`, the vocabulary to give the trainers (char_gpt --vocab V).
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "../cli/command_line.h"
#include "dyngrad/dyngrad.h"
#include "text_files.h"

using namespace dyngrad;

namespace {

constexpr const char* kFortunes = "/usr/share/games/fortunes";

const char* const kUsage =
    "usage: dyngrad-tokens --out FILE [--val-out FILE] [--val-fraction X] [--text PATH]\n"
    "                      [--vocab bytes|words] [--words N] [--reference PATH]\n"
    "       dyngrad-tokens --decode FILE --out FILE [--vocab bytes|words] [--words N] [--reference PATH]\n"
    "  --text PATH         the text to encode: a file or a directory (default /usr/share/games/fortunes)\n"
    "  --out FILE          the token file (llm.c's format); with --decode, the text\n"
    "  --val-out FILE      the last --val-fraction (default 0.1) of the tokens, as a second token file\n"
    "  --vocab NAME        bytes (256 tokens, default) | words: the bytes, then the --words most frequent words\n"
    "  --words N           words of the words vocabulary (default 8192; at most 65280)\n"
    "  --reference PATH    the text the words are counted on (default /usr/share/games/fortunes)\n"
    "  --decode FILE       write the text of a token file instead\n";

struct Options {
    std::string text = kFortunes, out, val_out, decode, reference = kFortunes;
    double val_fraction = 0.1;
    bool words = false;
    std::int64_t word_count = 8192;
};

Options parse_options(int argc, char** argv) {
    const cli::Arguments args(argc, argv,
                              {.options = {"--text", "--out", "--val-out", "--val-fraction", "--vocab", "--words",
                                           "--reference", "--decode"}});
    if (args.help()) {
        std::fputs(kUsage, stdout);
        std::exit(0);
    }
    Options o;
    const auto given = [&](const char* name) { return args.value(name); };
    const auto readable = [](const char* option, std::string_view path) {
        cli::existing_path(option, path, "file or directory");
        return std::string(path);
    };
    const auto out = given("--out");
    if (!out) throw cli::UsageError("--out is required");
    o.out = cli::output_file("--out", *out);
    if (auto v = given("--decode")) o.decode = cli::existing_file("--decode", *v);
    if (!o.decode.empty() && (given("--text") || given("--val-out") || given("--val-fraction")))
        throw cli::UsageError("--decode reads a token file: --text, --val-out and --val-fraction do not apply");
    // Combinations first: a usage mistake is named before any path is looked at.
    o.words = cli::parse_choice("--vocab", given("--vocab").value_or("bytes"), {"bytes", "words"}) == "words";
    if (!o.words && (given("--words") || given("--reference")))
        throw cli::UsageError("--words and --reference are for --vocab words");
    if (auto v = given("--text")) o.text = *v;
    if (o.decode.empty()) o.text = readable("--text", o.text);
    if (auto v = given("--val-out")) o.val_out = cli::output_file("--val-out", *v);
    if (auto v = given("--val-fraction")) {
        if (o.val_out.empty()) throw cli::UsageError("--val-fraction needs --val-out");
        o.val_fraction = cli::parse_real("--val-fraction", *v, 0, 1, /*min_exclusive=*/true);
        if (o.val_fraction >= 1) throw cli::UsageError(str("--val-fraction: ", *v, " leaves no training tokens"));
    }
    if (auto v = given("--words")) o.word_count = cli::parse_int("--words", *v, 0, kTokenFileMaxVocabulary - 256);
    if (auto v = given("--reference")) o.reference = *v;
    if (o.words) o.reference = readable("--reference", o.reference);
    return o;
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) throw IoError(str("dyngrad-tokens: cannot write '", path, "'"));
}

int run(const Options& o) {
    const TokenVocabulary vocabulary =
        o.words ? TokenVocabulary::words(TextFiles(o.reference).text, o.word_count) : TokenVocabulary::bytes();
    if (!o.decode.empty()) {
        const std::vector<std::uint16_t> stored = read_token_file(o.decode, vocabulary.size());
        const std::string text = vocabulary.decode({stored.begin(), stored.end()});
        write_text(o.out, text);
        std::printf("dyngrad-tokens: %zu tokens of %s -> %zu bytes in %s\n", stored.size(), o.decode.c_str(),
                    text.size(), o.out.c_str());
        return 0;
    }
    const TextFiles text(o.text);
    const std::vector<std::int64_t> tokens = vocabulary.encode(text.text);
    const auto validation = o.val_out.empty() ? std::size_t{0}
                                              : static_cast<std::size_t>(static_cast<double>(tokens.size()) * o.val_fraction);
    const auto split = tokens.end() - static_cast<std::ptrdiff_t>(validation);
    if (split == tokens.begin() || (!o.val_out.empty() && validation == 0))
        throw ValueError(str("dyngrad-tokens: '", o.text, "' makes ", tokens.size(),
                             " tokens: too few to split into training and validation files"));
    write_token_file(o.out, {tokens.begin(), split});
    std::printf("dyngrad-tokens: %zu bytes from %lld files in %s -> %zu tokens in %s", text.text.size(),
                static_cast<long long>(text.files), o.text.c_str(), tokens.size() - validation, o.out.c_str());
    if (!o.val_out.empty()) {
        write_token_file(o.val_out, {split, tokens.end()});
        std::printf(" and %zu in %s", validation, o.val_out.c_str());
    }
    std::printf("\nvocab_size=%lld\n", static_cast<long long>(vocabulary.size()));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return cli::run_program("dyngrad-tokens", kUsage, [&] { return parse_options(argc, argv); }, run);
}
