// The torchrun-style rendezvous on its own (tests/distributed/multihost_netns.sh): reads torchrun's variables (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT), has rank 0 hand a fresh random blob to every rank through
// dist::rendezvous_exchange — what ProcessGroup::from_env carries NCCL's id with, which a CPU-only machine cannot
// create — and prints a hash of what it received. Exit 0 and "rank R/W blob H" on success; exit 3 and the typed
// error ("rank R/W DistributedError: ...") when the rendezvous fails (a missing peer after DYNGRAD_DIST_TIMEOUT).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "dyngrad/core/error.h"
#include "dyngrad/distributed/process_group.h"
#include "dyngrad/distributed/rendezvous.h"

using namespace dyngrad;

int main() {
    const dist::LaunchEnvironment env =
        dist::parse_launch_environment([](const char* name) -> const char* { return std::getenv(name); });
    std::vector<char> blob;
    if (env.rank == 0) {
        std::random_device random;
        for (int i = 0; i < 128; ++i) blob.push_back(static_cast<char>(random()));
    }
    try {
        const std::vector<char> got = dist::rendezvous_exchange(env.master_addr, env.master_port, env.rank,
                                                                env.world_size, blob, dist::resolve_timeout(0));
        std::uint64_t h = 1469598103934665603ull;
        for (char c : got) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
        std::printf("rank %d/%d blob %016llx (%zu bytes)\n", env.rank, env.world_size, static_cast<unsigned long long>(h),
                    got.size());
        return 0;
    } catch (const DistributedError& e) {
        std::printf("rank %d/%d DistributedError: %s\n", env.rank, env.world_size, e.what());
        return 3;
    }
}
