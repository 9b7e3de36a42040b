// Builds without NCCL (no CUDA backend, or nccl.h / libnccl not found): a group has no communicator, and CUDA
// tensors get DeviceError from the group before any of these is reached. DistributedDataParallel's communication
// stream serves only NCCL all-reduces: a model on a GPU gets an empty CommStreams (a single process needs none).
#include "dyngrad/core/error.h"
#include "dyngrad/distributed/group_impl.h"

namespace dyngrad::dist {

namespace {
[[noreturn]] void unavailable(const std::string& what) { throw_not_built(what, "NCCL"); }
}  // namespace

void destroy_nccl(NcclComm*) noexcept {}
bool nccl_compiled() { return false; }
std::vector<char> nccl_unique_id() { unavailable("nccl_unique_id"); }
NcclHandle nccl_create(const std::vector<char>&, int, int, int, double) { unavailable("nccl_create"); }
void nccl_all_reduce(NcclComm&, const void*, void*, std::size_t, DType, ReduceOp, void*, const std::string& what) {
    unavailable(what);
}
void nccl_broadcast(NcclComm&, void*, std::size_t, DType, int, void*, const std::string& what) { unavailable(what); }
void nccl_all_gather(NcclComm&, const void*, void*, std::size_t, DType, void*, const std::string& what) {
    unavailable(what);
}
void nccl_reduce_scatter(NcclComm&, const void*, void*, std::size_t, DType, ReduceOp, void*, const std::string& what) {
    unavailable(what);
}

struct CommStreams {};
void destroy_comm_streams(CommStreams* s) noexcept { delete s; }
CommStreamsHandle make_comm_streams(int, std::size_t) { return CommStreamsHandle(new CommStreams); }
void* comm_stream(CommStreams&) { unavailable("DistributedDataParallel's communication stream"); }
void hand_bucket_to_comm(CommStreams&, std::size_t) { unavailable("DistributedDataParallel's bucket hand-off"); }
void hand_bucket_back(CommStreams&, std::size_t) { unavailable("DistributedDataParallel's bucket hand-back"); }

}  // namespace dyngrad::dist
