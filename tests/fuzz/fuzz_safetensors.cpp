// libFuzzer target: load_safetensors (core/safetensors.h) on arbitrary bytes. A file it accepts must
// survive a round trip: saved and loaded again, the same names, dtypes, shapes, bytes and metadata
// (else __builtin_trap()). Anything but a dyngrad::Error, a crash, a sanitizer finding or a leak fails.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "dyngrad/core/error.h"
#include "dyngrad/core/safetensors.h"
#include "fuzz_file.h"

namespace {

bool same(const dyngrad::TensorMap& a, const dyngrad::TensorMap& b) {
    if (a.size() != b.size()) return false;
    for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
        const dyngrad::Tensor& x = i->second;
        const dyngrad::Tensor& y = j->second;
        if (i->first != j->first || x.dtype() != y.dtype() || x.shape() != y.shape()) return false;
        if (x.nbytes() > 0 && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0) return false;
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static dgfuzz::ScratchFile input("dyngrad-fuzz-safetensors");
    static dgfuzz::ScratchFile copy("dyngrad-fuzz-safetensors-copy");
    dyngrad::TensorMap tensors;
    dyngrad::SafetensorsMetadata metadata;
    try {
        tensors = dyngrad::load_safetensors(input.write(data, size), &metadata);
    } catch (const dyngrad::Error&) {
        return 0;  // a malformed file, reported as it must be
    }
    dyngrad::SafetensorsMetadata metadata_again;
    dyngrad::save_safetensors(copy.path(), tensors, metadata);
    const dyngrad::TensorMap again = dyngrad::load_safetensors(copy.path(), &metadata_again);
    if (!same(tensors, again) || metadata != metadata_again) __builtin_trap();
    return 0;
}
