// libFuzzer target: the IDX reader (core/idx.h) on arbitrary bytes, plain or gzip. The first byte picks
// the rank the caller expects; the rest is the file. Anything but a dyngrad::Error (IoError) or a valid
// array whose size matches its dims fails the run, as do crashes, sanitizer findings and leaks.
#include <cstddef>
#include <cstdint>

#include "dyngrad/core/error.h"
#include "dyngrad/core/idx.h"
#include "dyngrad/core/shape.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static dgfuzz::ScratchFile file("dyngrad-fuzz-idx");
    if (size == 0) return 0;
    const int rank = data[0] % 5;
    const auto& path = file.write(data + 1, size - 1);
    try {
        const dyngrad::IdxArray array = dyngrad::read_idx(path.string(), rank);
        if (static_cast<int>(array.dims.size()) != rank ||
            static_cast<std::size_t>(dyngrad::numel(array.dims)) != array.data.size())
            __builtin_trap();
    } catch (const dyngrad::Error&) {
        // a malformed file, reported as it must be
    }
    return 0;
}
