// Internal (distributed/): the CUDA pieces of DistributedDataParallel's overlap — a communication stream with an event
// pair per bucket, and stream-ordered copies on dyngrad's stream. distributed/device_streams.cpp (CUDA builds) or
// distributed/device_streams_unavailable.cpp.
#pragma once
#include <cstddef>
#include <memory>

#include "dyngrad/core/device.h"

namespace dyngrad::dist {

struct CommStreams;
void destroy_comm_streams(CommStreams* streams) noexcept;
struct CommStreamsDeleter {
    void operator()(CommStreams* s) const noexcept { destroy_comm_streams(s); }
};
using CommStreamsHandle = std::unique_ptr<CommStreams, CommStreamsDeleter>;

// A non-blocking stream on `device` and `buckets` (ready, done) event pairs.
CommStreamsHandle make_comm_streams(int device, std::size_t buckets);
void* comm_stream(CommStreams& s);  // the cudaStream_t
// dyngrad's stream records bucket b's ready event; the communication stream waits for it.
void hand_bucket_to_comm(CommStreams& s, std::size_t bucket);
// The communication stream records bucket b's done event; dyngrad's stream waits for it (the host does not).
void hand_bucket_back(CommStreams& s, std::size_t bucket);
// Asynchronous on dyngrad's stream of `device`.
void device_copy(void* dst, const void* src, std::size_t bytes, int device);
void device_zero(void* dst, std::size_t bytes, int device);
// `bytes` from src to dst on `device`: a host memcpy, or device_copy on a CUDA device; nothing when bytes is 0 or
// dst is src. Defined in distributed/zero.cpp (built with either backend); DDP's buckets and ZeRO's flats use it.
void copy_bytes(void* dst, const void* src, std::size_t bytes, Device device);

}  // namespace dyngrad::dist
