// The one piece of networking distributed/ does itself: when the processes were not started by MPI (torchrun's
// variables), rank 0 hands a small blob (the ncclUniqueId) to every other rank over TCP. Nothing else goes
// through it; NCCL carries the collectives.
#pragma once
#include <string>
#include <vector>

namespace dyngrad::dist {

// Rank 0 listens on `port` (all interfaces), accepts world − 1 peers, checks each one's rank and world
// size, and sends each `blob`; the others connect to `master_addr`:`port` (retrying until rank 0 listens)
// and return the blob they receive (rank 0 returns its own). DistributedError when a peer is missing after
// `timeout_seconds` (naming the ranks that never came), for a bad handshake (another world size, a rank twice),
// or for a socket error; ValueError for bad arguments.
std::vector<char> rendezvous_exchange(const std::string& master_addr, int port, int rank, int world,
                                      const std::vector<char>& blob, double timeout_seconds);

}  // namespace dyngrad::dist
