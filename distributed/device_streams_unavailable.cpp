// CPU-only builds: no CUDA tensor reaches these (the group rejects them first); they throw DeviceError.
#include "dyngrad/core/error.h"
#include "dyngrad/distributed/device_streams.h"

namespace dyngrad::dist {
namespace {
[[noreturn]] void unavailable() { throw DeviceError("distributed data parallel: this build has no CUDA backend"); }
}  // namespace
void destroy_comm_streams(CommStreams*) noexcept {}
CommStreamsHandle make_comm_streams(int, std::size_t) { unavailable(); }
void* comm_stream(CommStreams&) { unavailable(); }
void hand_bucket_to_comm(CommStreams&, std::size_t) { unavailable(); }
void hand_bucket_back(CommStreams&, std::size_t) { unavailable(); }
void device_copy(void*, const void*, std::size_t, int) { unavailable(); }
void device_zero(void*, std::size_t, int) { unavailable(); }
}  // namespace dyngrad::dist
