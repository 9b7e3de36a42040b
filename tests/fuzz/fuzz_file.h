// Fuzz targets' helper: the readers under test take a path, so each input is written to a scratch file
// first (one per process, removed at exit).
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <unistd.h>

namespace dgfuzz {

class ScratchFile {
public:
    explicit ScratchFile(const std::string& stem)
        : path_(std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()))) {}
    ~ScratchFile() {
        std::error_code ignored;
        std::filesystem::remove(path_, ignored);
    }
    ScratchFile(const ScratchFile&) = delete;
    ScratchFile& operator=(const ScratchFile&) = delete;

    // Replaces the file's contents with `size` bytes; returns its path.
    const std::filesystem::path& write(const std::uint8_t* data, std::size_t size) {
        std::ofstream out(path_, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
        return path_;
    }
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

}  // namespace dgfuzz
