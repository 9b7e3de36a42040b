// Internal (dist/zero.cpp, dist/zero_checkpoint.cpp): the shards behind a ZeroOptimizer (dist/zero.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dyngrad/dist/ddp.h"
#include "dyngrad/dist/zero.h"

namespace dyngrad::dist {

struct ZeroOptimizer::State {
    struct Member {
        std::string name;
        Parameter parameter;
        std::int64_t offset = 0;  // elements into the flat buffer
    };
    // One per dtype: the trainable parameters of that dtype end to end, padded to world · shard elements.
    struct Flat {
        DType dtype = DType::f32;
        std::vector<Member> members;
        std::int64_t numel = 0;  // Ψ_d, unpadded
        std::int64_t shard = 0;  // S = ceil(Ψ_d / W)
        Parameter shard_param;   // this rank's S elements; its gradient is the averaged gradient's shard
        Tensor full_grad;        // stage 1: the averaged flat gradient (the model's gradients are views of it);
                                 // undefined with overlap (DDP's buckets averaged the model's gradients)
    };
    Device device = Device::cpu();
    std::vector<Flat> flats;
    std::vector<const void*> identities;  // the trainable parameters at construction, registration order
    std::unique_ptr<AdamW> adam;          // over the shard parameters, one per flat
    std::unique_ptr<DistributedDataParallel> ddp;  // ZeroOptions::overlap: the bucketed, overlapped all-reduce
    bool reduced = false;                 // reduce_gradients() ran since the last step
    bool unscaled = false;                // unscale(GradScaler&) ran (found_inf summed) for this step
};

// "<name> f32 (4,3)" per trainable parameter, hashed: the layout a checkpoint must match.
std::string zero_layout(const ZeroOptimizer::State& state);

}  // namespace dyngrad::dist
