// Token files in llm.c's format and the fixed vocabulary of dyngrad-tokens (nn/token_file.h).
#include "dyngrad/nn/token_file.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <utility>

#include "dyngrad/core/error.h"

namespace dyngrad {

namespace {

constexpr std::int64_t kHeaderBytes = kTokenFileHeaderInts * static_cast<std::int64_t>(sizeof(std::int32_t));

std::string quoted(const std::filesystem::path& path) { return str("token file '", path.string(), "'"); }

bool is_letter(char c) {
    const char lower = static_cast<char>(c | 0x20);
    return lower >= 'a' && lower <= 'z';
}

// The end of the run of letters starting at `from`.
std::size_t letters_end(const std::string& text, std::size_t from) {
    while (from < text.size() && is_letter(text[from])) ++from;
    return from;
}

}  // namespace

void write_token_file(const std::filesystem::path& path, const std::vector<std::int64_t>& tokens) {
    if (tokens.empty()) throw ValueError(str("write_token_file: ", quoted(path), ": no tokens to write"));
    if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
        throw ValueError(str("write_token_file: ", quoted(path), ": ", tokens.size(),
                             " tokens do not fit the header's int32 count"));
    std::vector<std::uint16_t> values(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] >= kTokenFileMaxVocabulary)
            throw ValueError(str("write_token_file: ", quoted(path), ": token ", tokens[i], " at position ", i,
                                 " is outside [0, ", kTokenFileMaxVocabulary, ") (uint16 tokens)"));
        values[i] = static_cast<std::uint16_t>(tokens[i]);
    }
    std::array<std::int32_t, kTokenFileHeaderInts> header{};
    header[0] = kTokenFileMagic;
    header[1] = kTokenFileVersion;
    header[2] = static_cast<std::int32_t>(tokens.size());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header.data()), kHeaderBytes);
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(std::uint16_t)));
    out.close();
    if (!out) throw IoError(str("write_token_file: cannot write ", quoted(path)));
}

std::vector<std::uint16_t> read_token_file(const std::filesystem::path& path, std::int64_t vocab_size) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(str("cannot open ", quoted(path)));
    in.seekg(0, std::ios::end);
    const auto bytes = static_cast<std::int64_t>(in.tellg());
    in.seekg(0, std::ios::beg);
    if (bytes < kHeaderBytes)
        throw IoError(str(quoted(path), " is truncated: ", bytes, " bytes, shorter than the ", kHeaderBytes,
                          "-byte header"));
    std::array<std::int32_t, kTokenFileHeaderInts> header{};
    in.read(reinterpret_cast<char*>(header.data()), kHeaderBytes);
    if (header[0] != kTokenFileMagic)
        throw IoError(str(quoted(path), ": bad magic ", header[0], " (expected ", kTokenFileMagic,
                          ": not a token file in llm.c's format)"));
    if (header[1] != kTokenFileVersion)
        throw IoError(str(quoted(path), ": unsupported version ", header[1], " (expected ", kTokenFileVersion, ")"));
    const std::int64_t count = header[2];
    if (count < 1) throw IoError(str(quoted(path), ": the header's token count is ", count, " (expected at least 1)"));
    const std::int64_t expected = kHeaderBytes + count * static_cast<std::int64_t>(sizeof(std::uint16_t));
    if (bytes != expected)
        throw IoError(str(quoted(path), bytes < expected ? " is truncated: " : " has bytes after its tokens: ", bytes,
                          " bytes, the header's ", count, " tokens make ", expected));
    std::vector<std::uint16_t> tokens(static_cast<std::size_t>(count));
    in.read(reinterpret_cast<char*>(tokens.data()), count * static_cast<std::int64_t>(sizeof(std::uint16_t)));
    if (!in) throw IoError(str("cannot read ", quoted(path)));
    if (vocab_size > 0) {
        const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                      [&](std::uint16_t t) { return static_cast<std::int64_t>(t) >= vocab_size; });
        if (bad != tokens.end())
            throw IndexError(str(quoted(path), ": token id ", *bad, " at position ", bad - tokens.begin(),
                                 " is outside the vocabulary of ", vocab_size));
    }
    return tokens;
}

TokenWindows::TokenWindows(const std::filesystem::path& path, std::int64_t vocab_size, std::int64_t batch,
                           std::int64_t context)
    : TokenWindows(read_token_file(path, vocab_size), quoted(path), batch, context) {}

TokenWindows::TokenWindows(std::vector<std::uint16_t> tokens, std::string name, std::int64_t batch,
                           std::int64_t context)
    : name_(std::move(name)), tokens_(std::move(tokens)), batch_(batch), context_(context) {
    if (batch < 1) throw ValueError(str("TokenWindows: batch must be positive, got ", batch));
    if (context < 1) throw ValueError(str("TokenWindows: context must be positive, got ", context));
    if (size() < context + 1)
        throw ValueError(str(name_, " holds ", size(), " tokens, fewer than one window of context + 1 = ",
                             context + 1));
}

std::vector<std::int64_t> TokenWindows::random_offsets(std::uint64_t seed, std::int64_t step) const {
    // A generator per step (std::seed_seq and mt19937_64 are fully specified: every platform draws the same).
    const auto s = static_cast<std::uint64_t>(step);
    std::seed_seq seeds{seed & 0xffffffffu, seed >> 32, s & 0xffffffffu, s >> 32};
    std::mt19937_64 engine(seeds);
    std::uniform_int_distribution<std::int64_t> start(0, size() - context_ - 1);
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(batch_));
    for (std::int64_t& offset : offsets) offset = start(engine);
    return offsets;
}

TokenBatch TokenWindows::random(std::uint64_t seed, std::int64_t step, Device device) const {
    return windows(random_offsets(seed, step), context_, device);
}

TokenBatch TokenWindows::at(const std::vector<std::int64_t>& offsets, Device device) const {
    const std::int64_t last = size() - context_ - 1;
    for (std::size_t i = 0; i < offsets.size(); ++i)
        if (offsets[i] < 0 || offsets[i] > last)
            throw IndexError(str(name_, ": window offset ", offsets[i], " (row ", i, ") is outside [0, ", last,
                                 "] (", size(), " tokens, windows of ", context_ + 1, ")"));
    return windows(offsets, context_, device);
}

std::int64_t TokenWindows::sequential_batches() const { return (size() - 1) / (batch_ * context_); }

TokenBatch TokenWindows::sequential(std::int64_t index, Device device) const {
    if (index < 0 || index >= sequential_batches())
        throw IndexError(str(name_, ": sequential batch ", index, " is outside [0, ", sequential_batches(),
                             ") (", size(), " tokens, batches of ", batch_, " x ", context_, ")"));
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(batch_));
    for (std::int64_t b = 0; b < batch_; ++b) offsets[static_cast<std::size_t>(b)] = (index * batch_ + b) * context_;
    return windows(offsets, context_, device);
}

TokenBatch TokenWindows::windows(const std::vector<std::int64_t>& offsets, std::int64_t length, Device device) const {
    const auto B = static_cast<std::int64_t>(offsets.size());
    std::vector<std::int64_t> inputs(static_cast<std::size_t>(B * length)), targets(inputs.size());
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < length; ++t) {
            const auto at = static_cast<std::size_t>(offsets[static_cast<std::size_t>(b)] + t);
            inputs[static_cast<std::size_t>(b * length + t)] = tokens_[at];
            targets[static_cast<std::size_t>(b * length + t)] = tokens_[at + 1];
        }
    return {Tensor::from_vector(inputs, {B, length}, device), Tensor::from_vector(targets, {B, length}, device)};
}

TokenVocabulary TokenVocabulary::bytes() {
    TokenVocabulary vocabulary;
    for (int b = 0; b < 256; ++b) vocabulary.pieces_.emplace_back(1, static_cast<char>(b));
    return vocabulary;
}

TokenVocabulary TokenVocabulary::words(const std::string& reference, std::int64_t words) {
    if (words < 0 || 256 + words > kTokenFileMaxVocabulary)
        throw ValueError(str("TokenVocabulary::words: the word count must be in [0, ", kTokenFileMaxVocabulary - 256,
                             "] (uint16 tokens after the 256 bytes), got ", words));
    std::map<std::string, std::int64_t> counts;  // ordered: ties fall in byte order below
    for (std::size_t i = 0; i < reference.size();) {
        if (!is_letter(reference[i])) {
            ++i;
            continue;
        }
        const std::size_t end = letters_end(reference, i);
        const std::size_t start = i > 0 && reference[i - 1] == ' ' ? i - 1 : i;
        if (end - start >= 2) ++counts[reference.substr(start, end - start)];
        i = end;
    }
    std::vector<std::pair<std::string, std::int64_t>> ranked(counts.begin(), counts.end());
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    TokenVocabulary vocabulary = bytes();
    const auto kept = std::min<std::size_t>(ranked.size(), static_cast<std::size_t>(words));
    for (std::size_t k = 0; k < kept; ++k) {
        vocabulary.words_.emplace(ranked[k].first, vocabulary.size());
        vocabulary.pieces_.push_back(ranked[k].first);
    }
    return vocabulary;
}

const std::string& TokenVocabulary::piece(std::int64_t token) const {
    if (token < 0 || token >= size())
        throw IndexError(str("TokenVocabulary: token ", token, " is outside the vocabulary of ", size()));
    return pieces_[static_cast<std::size_t>(token)];
}

std::vector<std::int64_t> TokenVocabulary::encode(const std::string& text) const {
    std::vector<std::int64_t> tokens;
    tokens.reserve(text.size());
    const auto bytes_of = [&](std::size_t from, std::size_t to) {
        for (std::size_t k = from; k < to; ++k) tokens.push_back(static_cast<unsigned char>(text[k]));
    };
    const auto word = [&](std::size_t from, std::size_t to) {
        const auto found = words_.find(text.substr(from, to - from));
        return found == words_.end() ? std::int64_t{-1} : found->second;
    };
    for (std::size_t i = 0; i < text.size();) {
        const std::size_t letters = text[i] == ' ' ? i + 1 : i;
        if (words_.empty() || letters >= text.size() || !is_letter(text[letters])) {
            bytes_of(i, i + 1);
            ++i;
            continue;
        }
        const std::size_t end = letters_end(text, letters);
        if (const std::int64_t whole = word(i, end); whole >= 0) {
            tokens.push_back(whole);
        } else if (const std::int64_t bare = letters > i ? word(letters, end) : -1; bare >= 0) {
            bytes_of(i, letters);
            tokens.push_back(bare);
        } else {
            bytes_of(i, end);
        }
        i = end;
    }
    return tokens;
}

std::string TokenVocabulary::decode(const std::vector<std::int64_t>& tokens) const {
    std::string text;
    for (const std::int64_t token : tokens) text += piece(token);
    return text;
}

}  // namespace dyngrad
