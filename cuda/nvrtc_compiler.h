// The fusion compiler's back end (issue 33, docs/fusion.md): NVRTC compiles a generated kernel's source
// (ops/fusion_source.h) for one device architecture, and a disk cache keeps the result, keyed by a hash of the
// source, the architecture, the NVRTC version and the options. Built into the library with the CUDA backend only
// (it links CUDA::nvrtc; NVRTC needs no GPU, so tests/fusion/test_fusion_nvrtc.cpp compiles this file on CPU machines
// that have the toolkit). Knows strings and files, nothing of graphs or ops.
//
// Cache directory: $DYNGRAD_FUSION_CACHE_DIR, else $XDG_CACHE_HOME/dyngrad/fusion, else $HOME/.cache/dyngrad/fusion.
// Writes are atomic (a temporary file, then rename); a directory that cannot be created or written, or a full
// disk, makes the compiler compile in memory and log it once per directory: never a failed step.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dyngrad/core/error.h"

namespace dyngrad::cuda {

// FNV-1a, 64 bits: the generated source's hash (its kernel's name) and the cache's key.
inline std::uint64_t fnv1a64(std::string_view text, std::uint64_t basis = 0xcbf29ce484222325ull) {
    std::uint64_t hash = basis;
    for (unsigned char c : text) {
        hash ^= c;
        hash *= 0x100000001b3ull;
    }
    return hash;
}

// A hash as 16 hex digits (kernel names, cache file names).
inline std::string hex64(std::uint64_t value) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
    return text;
}

// NVRTC refused a generated source (a bug of the generator, or an architecture NVRTC does not know). The
// caller runs the group's unfused kernels instead (try_compile_fused_kernel records the fallback).
class FusionCompileError : public CudaError {
public:
    FusionCompileError(const std::string& message, std::string kernel, std::string log)
        : CudaError(message), kernel_(std::move(kernel)), log_(std::move(log)) {}
    const std::string& kernel() const { return kernel_; }
    const std::string& log() const { return log_; }  // NVRTC's program log

private:
    std::string kernel_;
    std::string log_;
};

enum class ImageKind : unsigned char { Cubin, Ptx };

struct FusedKernelCompileOptions {
    int arch = 90;                       // compute capability major*10 + minor: sm_90
    ImageKind kind = ImageKind::Cubin;   // a cubin loads without the driver's JIT; PTX for inspection and tests
    std::string cache_dir;               // empty: default_fusion_cache_dir()
    bool use_cache = true;
};

struct CompiledKernel {
    std::string kernel;    // the entry point's name
    std::string image;     // cubin or PTX bytes (cuModuleLoadData takes either)
    ImageKind kind = ImageKind::Cubin;
    bool from_cache = false;
    double compile_ms = 0.0;  // NVRTC time (0 for a cache hit): the issue asks for cold and warm compile times
};

// One thing the compiler decided not to do as asked, for the caller and for tests (library code logs here instead
// of printing; DYNGRAD_PRINT_FUSIONS=1 also prints each entry to stderr).
struct FusionLogEntry {
    // GraphDiffers: a graph (captured or eager) turned out to differ from the one its fusion plan was made from; the
    // plan was let go there (the members recorded so far got their values, the rest ran unfused), or, when it
    // differed only outside the groups, the backward chains were not used (graph/fusion_replay.h).
    // CheckMismatch: DYNGRAD_CHECK_FUSIONS=1 found a generated kernel that disagrees with its unfused kernels (the
    // captured step runs the unfused ones for that group; graph/fusion_replay.h).
    enum class Kind : unsigned char { CompileFallback, CacheUnwritable, CacheReadFailed, CheckMismatch, GraphDiffers } kind;
    std::string kernel;  // empty when not about one kernel
    std::string reason;
};
std::vector<FusionLogEntry> fusion_log();
void clear_fusion_log();
// Adds an entry (printed too with DYNGRAD_PRINT_FUSIONS=1): for the layers above that decide against a kernel.
void log_fusion(FusionLogEntry entry);

// The cache directory the environment names ("" when neither DYNGRAD_FUSION_CACHE_DIR, XDG_CACHE_HOME nor HOME
// is set: compile in memory).
std::string default_fusion_cache_dir();

// "13.0": the version of the NVRTC linked in (part of every cache key).
std::string nvrtc_version();

// Compiles (or reads from the cache) kernel `kernel` of `source`. Throws FusionCompileError when NVRTC rejects the
// source; cache trouble never throws.
CompiledKernel compile_fused_kernel(std::string_view source, const std::string& kernel,
                                    const FusedKernelCompileOptions& options = {});

// compile_fused_kernel, or nullopt after logging a CompileFallback entry with NVRTC's reason: the caller then runs
// the unfused kernels (a fusion never changes a result, it only saves launches).
std::optional<CompiledKernel> try_compile_fused_kernel(std::string_view source, const std::string& kernel,
                                                       const FusedKernelCompileOptions& options = {});

}  // namespace dyngrad::cuda
