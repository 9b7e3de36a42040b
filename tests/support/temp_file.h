// A file name in the temporary directory, unique per process and call, removed when the object goes.
#pragma once
#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>

namespace dgtest {

struct TempFile {
    std::filesystem::path path;
    // `prefix` names the test file (e.g. "capturable"), `name` the file's role.
    TempFile(const std::string& prefix, const std::string& name) {
        static int counter = 0;
        path = std::filesystem::temp_directory_path() / ("dyngrad_" + prefix + "_" + std::to_string(::getpid()) + "_" +
                                                         std::to_string(counter++) + "_" + name);
    }
    ~TempFile() {
        std::error_code ignored;
        std::filesystem::remove(path, ignored);
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
};

}  // namespace dgtest
