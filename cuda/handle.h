// Internal (CUDA translation units only): UniqueHandle, the one owner of every handle and descriptor kind the
// CUDA runtime and libraries hand out (streams, events, graphs, cuBLAS/cuBLASLt/cuDNN handles and descriptors).
#pragma once
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>

namespace dyngrad::cuda {

// Owns a handle released by `destroy`. Non-copyable; a move nulls the source. The destructor never throws:
// it has no one to report a failed release to (typically the runtime unloading at process exit), so it
// drops the status, and clears a CUDA runtime error so that a later launch check does not pick it up.
// T is a pointer-like handle, or a small struct with an explicit operator bool that is false when empty.
template <typename T, auto destroy>
class UniqueHandle {
public:
    UniqueHandle() = default;
    explicit UniqueHandle(T handle) : handle_(handle) {}
    ~UniqueHandle() { reset(); }
    UniqueHandle(UniqueHandle&& other) noexcept : handle_(std::exchange(other.handle_, T{})) {}
    UniqueHandle& operator=(UniqueHandle&& other) noexcept {
        if (this != &other) {
            reset();
            handle_ = std::exchange(other.handle_, T{});
        }
        return *this;
    }
    UniqueHandle(const UniqueHandle&) = delete;
    UniqueHandle& operator=(const UniqueHandle&) = delete;

    T get() const { return handle_; }
    explicit operator bool() const { return static_cast<bool>(handle_); }
    // Gives up ownership without releasing.
    T release() noexcept { return std::exchange(handle_, T{}); }
    void reset() noexcept {
        if (handle_) {
            if constexpr (std::is_same_v<decltype(destroy(handle_)), cudaError_t>) {
                if (destroy(handle_) != cudaSuccess) static_cast<void>(cudaGetLastError());
            } else {
                static_cast<void>(destroy(handle_));
            }
        }
        handle_ = T{};
    }

private:
    T handle_{};
};

// The one way a handle is created and owned: `create(&raw)` makes it and checks its own status (each library
// has its check macro), and the owner takes it. ContextOwner::ContextOwner creates every kind through it.
template <typename Owner, typename Create>
Owner make_owned(Create&& create) {
    decltype(Owner().get()) raw{};
    create(&raw);
    return Owner(raw);
}

using StreamHandle = UniqueHandle<cudaStream_t, cudaStreamDestroy>;
using EventHandle = UniqueHandle<cudaEvent_t, cudaEventDestroy>;
using GraphHandle = UniqueHandle<cudaGraph_t, cudaGraphDestroy>;

}  // namespace dyngrad::cuda
