// NVRTC and the disk cache of generated kernels (cuda/nvrtc_compiler.h, docs/fusion.md).
#include "dyngrad/cuda/nvrtc_compiler.h"

#include <nvrtc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>

#include "dyngrad/core/environment.h"

namespace dyngrad::cuda {

namespace {

[[noreturn]] void throw_nvrtc_error(nvrtcResult status, const char* expr, const char* file, int line) {
    throw CudaError(str("NVRTC call failed: ", expr, " at ", file, ":", line, ": ", nvrtcGetErrorString(status)));
}

#define DG_NVRTC_CHECK(expr)                                                            \
    do {                                                                                \
        const nvrtcResult dg_status_ = (expr);                                          \
        if (dg_status_ != NVRTC_SUCCESS) throw_nvrtc_error(dg_status_, #expr, __FILE__, __LINE__); \
    } while (0)

std::mutex log_mutex;
std::vector<FusionLogEntry> log_entries;
std::set<std::string> directories_reported;  // cache trouble is logged once per directory

void log_entry(FusionLogEntry entry) {
    if (environment_flag("DYNGRAD_PRINT_FUSIONS"))
        std::fprintf(stderr, "dyngrad fusion: %s%s%s\n", entry.kernel.c_str(), entry.kernel.empty() ? "" : ": ",
                     entry.reason.c_str());
    const std::lock_guard<std::mutex> lock(log_mutex);
    log_entries.push_back(std::move(entry));
}

void log_cache_trouble(FusionLogEntry::Kind kind, const std::string& directory, const std::string& reason) {
    {
        const std::lock_guard<std::mutex> lock(log_mutex);
        if (!directories_reported.insert(directory).second) return;
    }
    log_entry({kind, "", str("fusion cache ", directory, ": ", reason, "; compiling in memory")});
}

// What a cached image depends on: the source, the target, the compiler and its options.
std::string cache_key(std::string_view source, const std::string& options_text) {
    return str(source, '\0', options_text, '\0', nvrtc_version());
}

// The file's first line names its key by a second hash (another basis), so a collision of the file name's hash
// reads as a miss, never as another kernel.
std::string header_line(const std::string& key, std::size_t image_size) {
    return str("dyngrad-fusion 1 ", hex64(fnv1a64(key, 0x84222325cbf29ce4ull)), " ", image_size, "\n");
}

std::optional<std::string> read_cached(const std::filesystem::path& file, const std::string& key,
                                       const std::string& directory) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return std::nullopt;  // a miss
    std::string header;
    std::getline(in, header);
    std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (header + "\n" != header_line(key, image.size())) {
        log_cache_trouble(FusionLogEntry::Kind::CacheReadFailed, directory,
                          str(file.string(), " does not hold this kernel (truncated or another key)"));
        return std::nullopt;
    }
    return image;
}

void write_cached(const std::filesystem::path& file, const std::string& key, const std::string& image,
                  const std::string& directory) {
    static std::atomic<unsigned> counter{0};
    std::error_code error;
    std::filesystem::create_directories(file.parent_path(), error);
    if (error) {
        log_cache_trouble(FusionLogEntry::Kind::CacheUnwritable, directory, error.message());
        return;
    }
    const std::filesystem::path temporary =
        file.string() + str(".tmp.", ::getpid(), ".", counter.fetch_add(1, std::memory_order_relaxed));
    bool written = false;
    {
        std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
        if (out) {
            const std::string header = header_line(key, image.size());
            out.write(header.data(), static_cast<std::streamsize>(header.size()));
            out.write(image.data(), static_cast<std::streamsize>(image.size()));
            out.close();
            written = out.good();
        }
    }
    if (written) std::filesystem::rename(temporary, file, error);  // atomic: readers see all of it or nothing
    if (!written || error) {
        std::filesystem::remove(temporary, error);
        log_cache_trouble(FusionLogEntry::Kind::CacheUnwritable, directory,
                          written ? "cannot rename into it" : "cannot write (unwritable or full)");
    }
}

std::string program_log(nvrtcProgram program) {
    std::size_t size = 0;
    DG_NVRTC_CHECK(nvrtcGetProgramLogSize(program, &size));
    std::string log(size, '\0');
    if (size > 0) DG_NVRTC_CHECK(nvrtcGetProgramLog(program, log.data()));
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    return log;
}

struct Program {
    nvrtcProgram handle = nullptr;
    ~Program() {
        if (handle != nullptr) nvrtcDestroyProgram(&handle);  // a destructor does not throw
    }
};

std::string compile_image(std::string_view source, const std::string& kernel, const std::vector<std::string>& options,
                          ImageKind kind) {
    Program program;
    const std::string text(source);
    DG_NVRTC_CHECK(nvrtcCreateProgram(&program.handle, text.c_str(), (kernel + ".cu").c_str(), 0, nullptr, nullptr));
    std::vector<const char*> argv;
    for (const std::string& option : options) argv.push_back(option.c_str());
    const nvrtcResult status = nvrtcCompileProgram(program.handle, static_cast<int>(argv.size()), argv.data());
    if (status != NVRTC_SUCCESS) {
        std::string log = program_log(program.handle);
        throw FusionCompileError(str("NVRTC could not compile the generated kernel ", kernel, ": ",
                                     nvrtcGetErrorString(status), "\n", log),
                                 kernel, std::move(log));
    }
    std::size_t size = 0;
    std::string image;
    if (kind == ImageKind::Cubin) {
        DG_NVRTC_CHECK(nvrtcGetCUBINSize(program.handle, &size));
        image.resize(size);
        DG_NVRTC_CHECK(nvrtcGetCUBIN(program.handle, image.data()));
    } else {
        DG_NVRTC_CHECK(nvrtcGetPTXSize(program.handle, &size));
        image.resize(size);
        DG_NVRTC_CHECK(nvrtcGetPTX(program.handle, image.data()));
    }
    return image;
}

}  // namespace

std::vector<FusionLogEntry> fusion_log() {
    const std::lock_guard<std::mutex> lock(log_mutex);
    return log_entries;
}

void log_fusion(FusionLogEntry entry) { log_entry(std::move(entry)); }

void clear_fusion_log() {
    const std::lock_guard<std::mutex> lock(log_mutex);
    log_entries.clear();
    directories_reported.clear();
}

std::string default_fusion_cache_dir() {
    if (const std::string_view dir = environment("DYNGRAD_FUSION_CACHE_DIR"); !dir.empty()) return std::string(dir);
    if (const std::string_view xdg = environment("XDG_CACHE_HOME"); !xdg.empty()) return str(xdg, "/dyngrad/fusion");
    if (const std::string_view home = environment("HOME"); !home.empty()) return str(home, "/.cache/dyngrad/fusion");
    return "";
}

std::string nvrtc_version() {
    int major = 0, minor = 0;
    DG_NVRTC_CHECK(nvrtcVersion(&major, &minor));
    return str(major, ".", minor);
}

CompiledKernel compile_fused_kernel(std::string_view source, const std::string& kernel,
                                    const FusedKernelCompileOptions& options) {
    // The same arithmetic as nvcc's build of the unfused kernels: contraction within a formula as nvcc does
    // (--fmad=true is both compilers' default), no fast math.
    const std::vector<std::string> nvrtc_options = {
        str("--gpu-architecture=", options.kind == ImageKind::Cubin ? "sm_" : "compute_", options.arch),
        "--std=c++20", "--fmad=true"};
    std::string options_text;
    for (const std::string& option : nvrtc_options) options_text += option + " ";

    if (environment_flag("DYNGRAD_PRINT_FUSIONS"))
        std::fprintf(stderr, "dyngrad fusion: kernel %s\n%.*s\n", kernel.c_str(), static_cast<int>(source.size()),
                     source.data());
    CompiledKernel result;
    result.kernel = kernel;
    result.kind = options.kind;
    const std::string directory = options.cache_dir.empty() ? default_fusion_cache_dir() : options.cache_dir;
    const bool cached = options.use_cache && !directory.empty();
    const std::string key = cache_key(source, options_text);
    const std::filesystem::path file = std::filesystem::path(directory) /
                                       (hex64(fnv1a64(key)) + (options.kind == ImageKind::Cubin ? ".cubin" : ".ptx"));
    if (cached) {
        if (std::optional<std::string> image = read_cached(file, key, directory)) {
            result.image = std::move(*image);
            result.from_cache = true;
            return result;
        }
    }
    const auto start = std::chrono::steady_clock::now();
    result.image = compile_image(source, kernel, nvrtc_options, options.kind);
    result.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (cached) write_cached(file, key, result.image, directory);
    return result;
}

std::optional<CompiledKernel> try_compile_fused_kernel(std::string_view source, const std::string& kernel,
                                                       const FusedKernelCompileOptions& options) {
    try {
        return compile_fused_kernel(source, kernel, options);
    } catch (const FusionCompileError& error) {
        log_entry({FusionLogEntry::Kind::CompileFallback, kernel,
                   str("NVRTC rejected the generated source; running the unfused kernels: ", error.log())});
        return std::nullopt;
    }
}

}  // namespace dyngrad::cuda
