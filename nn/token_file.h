// Token files in llm.c's format, so dyngrad and llm.c train on the same bytes, and a fixed vocabulary to
// write them from any text (the dyngrad-tokens tool, samples/tokens.cpp).
//
// The format (llm.c's dev/data/data_common.py and llmc/dataloader.h): a header of 256 little-endian int32 —
// [0] the magic 20240520, [1] the version 1, [2] the token count N, the rest zero — then N uint16 tokens. The
// file is exactly 1024 + 2·N bytes long.
//
// Batches are windows of T + 1 tokens: inputs are the first T, targets the last T (the next token of each).
// TokenWindows serves B random windows per step (training: offsets drawn from (seed, step), so a resumed run
// draws what the uninterrupted one would) or llm.c's sequential batches (validation: batch k is the B·T + 1
// tokens from k·B·T, cut into B rows of T).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

#include "dyngrad/core/device.h"
#include "dyngrad/core/tensor.h"

namespace dyngrad {

constexpr std::int32_t kTokenFileMagic = 20240520;
constexpr std::int32_t kTokenFileVersion = 1;
constexpr std::int64_t kTokenFileHeaderInts = 256;
constexpr std::int64_t kTokenFileMaxVocabulary = 65536;  // uint16 tokens

// Writes `tokens` (each in [0, 65536), at least one, at most 2^31 − 1) as a token file. ValueError naming the
// file and the first token out of range; IoError naming the file when it cannot be written.
void write_token_file(const std::filesystem::path& path, const std::vector<std::int64_t>& tokens);

// Reads a whole token file. IoError naming the file for: a file that cannot be opened, one shorter than the
// header, a wrong magic or version (the value found), a token count below 1, and a size other than
// 1024 + 2·count (a truncated file, or bytes after the tokens). With vocab_size > 0, IndexError naming the file,
// the token id, its position and the vocabulary for the first token ≥ vocab_size.
std::vector<std::uint16_t> read_token_file(const std::filesystem::path& path, std::int64_t vocab_size = 0);

struct TokenBatch {
    Tensor inputs;   // (B,T) int64
    Tensor targets;  // (B,T) int64: the token after each input
};

class TokenWindows {
public:
    // Reads `path` (read_token_file's errors, checked against vocab_size). ValueError for batch or context
    // below 1, and naming the file when it holds fewer than context + 1 tokens (not one window).
    TokenWindows(const std::filesystem::path& path, std::int64_t vocab_size, std::int64_t batch,
                 std::int64_t context);
    // Tokens already in memory; `name` stands for the file in error messages (e.g. "the validation split").
    TokenWindows(std::vector<std::uint16_t> tokens, std::string name, std::int64_t batch, std::int64_t context);

    // B window offsets, uniform in [0, size() − T − 1], from (seed, step) alone.
    std::vector<std::int64_t> random_offsets(std::uint64_t seed, std::int64_t step) const;
    TokenBatch random(std::uint64_t seed, std::int64_t step, Device device = Device::cpu()) const;
    // The windows at these offsets; IndexError naming the file for an offset outside [0, size() − T − 1].
    TokenBatch at(const std::vector<std::int64_t>& offsets, Device device = Device::cpu()) const;
    // llm.c's sequential batches: (size() − 1) / (B·T) of them (0 when the file is shorter than B·T + 1 tokens).
    std::int64_t sequential_batches() const;
    // Batch `index` of them; IndexError naming the file outside [0, sequential_batches()).
    TokenBatch sequential(std::int64_t index, Device device = Device::cpu()) const;

    std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
    std::int64_t batch() const { return batch_; }
    std::int64_t context() const { return context_; }
    const std::string& name() const { return name_; }  // "token file '<path>'" or the name given

private:
    TokenBatch windows(const std::vector<std::int64_t>& offsets, std::int64_t length, Device device) const;

    std::string name_;
    std::vector<std::uint16_t> tokens_;
    std::int64_t batch_, context_;
};

// A fixed vocabulary: token b < 256 is the byte b; with words, tokens 256, 257, ... are the most frequent words
// of a reference text, most frequent first (ties in byte order). A word is a maximal run of ASCII letters, with
// the one space before it when there is one (" the", GPT-2's convention), of two bytes or more. Encoding takes a
// whole word (with its space, else without it) when the vocabulary has it, and bytes otherwise, so decode(encode(s))
// is s for every byte string s.
class TokenVocabulary {
public:
    static TokenVocabulary bytes();
    // At most `words` words of `reference` (fewer when it has fewer distinct ones). ValueError for a negative
    // count or one that would take the vocabulary past 65536 tokens.
    static TokenVocabulary words(const std::string& reference, std::int64_t words);

    std::int64_t size() const { return static_cast<std::int64_t>(pieces_.size()); }
    const std::string& piece(std::int64_t token) const;  // IndexError out of range
    std::vector<std::int64_t> encode(const std::string& text) const;
    std::string decode(const std::vector<std::int64_t>& tokens) const;  // IndexError naming a token out of range

private:
    std::vector<std::string> pieces_;
    std::unordered_map<std::string, std::int64_t> words_;
};

}  // namespace dyngrad
