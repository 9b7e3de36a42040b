// The text of a corpus: a regular file, or the regular files of a directory (symbolic links and the strfile
// indexes *.dat and *.u8 of the fortunes package skipped) in byte order of their names, concatenated. Shared by
// char_gpt and dyngrad-tokens (bench/torch_gpt.py reads a directory by the same rule).
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dyngrad/core/error.h"

struct TextFiles {
    std::string text;
    std::int64_t files = 0;

    explicit TextFiles(const std::filesystem::path& path) {
        namespace fs = std::filesystem;
        std::vector<fs::path> paths;
        if (fs::is_directory(path)) {
            for (const fs::directory_entry& entry : fs::directory_iterator(path)) {
                const std::string name = entry.path().filename().string();
                if (entry.is_symlink() || !entry.is_regular_file() || name.ends_with(".dat") || name.ends_with(".u8"))
                    continue;
                paths.push_back(entry.path());
            }
            std::sort(paths.begin(), paths.end(), [](const fs::path& a, const fs::path& b) {
                return a.filename().string() < b.filename().string();
            });
        } else {
            paths.push_back(path);
        }
        for (const fs::path& file : paths) {
            std::ifstream in(file, std::ios::binary);
            if (!in) throw dyngrad::IoError(dyngrad::str("cannot read '", file.string(), "'"));
            text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        }
        files = static_cast<std::int64_t>(paths.size());
    }
};
