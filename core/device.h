// Where a tensor's storage lives.
#pragma once
#include <string>

namespace dyngrad {

enum class DeviceKind : unsigned char { cpu, cuda };

struct Device {
    DeviceKind kind = DeviceKind::cpu;
    int index = 0;

    static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
    static constexpr Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
    constexpr bool is_cpu() const { return kind == DeviceKind::cpu; }
    constexpr bool is_cuda() const { return kind == DeviceKind::cuda; }
    friend constexpr bool operator==(Device, Device) = default;
    // "cpu", "cuda:1"; a kind outside the enum (a corrupt or cast value) says so instead of posing as cuda.
    std::string to_string() const {
        if (is_cpu()) return "cpu";
        if (is_cuda()) return "cuda:" + std::to_string(index);
        return "invalid device kind " + std::to_string(static_cast<int>(kind));
    }
};

// True when this build of dyngrad has the CUDA backend compiled in.
bool cuda_compiled();
// Number of usable CUDA devices (0 when CUDA is not compiled in or no device/driver is present).
int cuda_device_count();

}  // namespace dyngrad
