// Text as indices into its sorted set of distinct bytes: the vocabulary of the character-level samples
// (char_lstm, char_gpt; bench/torch_gpt.py builds the same one in Python).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

struct ByteTokens {
    std::vector<char> vocabulary;      // the distinct bytes of the text, in increasing (unsigned) order
    std::vector<std::int64_t> tokens;  // one per byte of the text: its index in vocabulary

    explicit ByteTokens(const std::string& text) {
        std::array<std::int64_t, 256> index{};
        index.fill(-1);
        for (const char c : text) index[static_cast<unsigned char>(c)] = 0;
        for (int b = 0; b < 256; ++b)
            if (index[b] == 0) {
                index[b] = static_cast<std::int64_t>(vocabulary.size());
                vocabulary.push_back(static_cast<char>(b));
            }
        tokens.reserve(text.size());
        for (const char c : text) tokens.push_back(index[static_cast<unsigned char>(c)]);
    }
};
