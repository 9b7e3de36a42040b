// Internal (distributed/zero.cpp, distributed/zero_checkpoint.cpp): the shards behind a ZeroOptimizer (distributed/zero.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/distributed/ddp.h"
#include "dyngrad/distributed/group_impl.h"
#include "dyngrad/distributed/zero.h"

namespace dyngrad::dist {

// Stage 3 without recomputation (distributed/zero3.cpp): the graph a unit's recorded forwards share, and one
// recorded forward (owned by its node in the caller's graph).
struct UnitSession;
struct UnitInstance;

struct ZeroOptimizer::State {
    struct Member {
        std::string name;
        Parameter parameter;
        std::int64_t offset = 0;  // elements into the flat buffer
        Shape shape;              // the parameter's (stage 3 frees its value between uses)
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
        Tensor values;           // stages 1/2: the (W·S) parameters end to end; members' values and the shard view it
        Tensor gathered;         // stage 3: the all-gathered (W·S) buffer the members' values view while gathered
        bool accumulating = false;  // stage 3: shard_param's gradient is this step's (later reductions add to it)
    };
    // Stage 3: one unit, its flats (indices into `flats`), its key in the unit op's registry (distributed/zero3.cpp).
    struct Unit {
        std::string name;
        Module module;
        std::function<Var(const Var&)> forward;
        std::vector<std::size_t> flats;
        std::int64_t key = 0;
        bool gathered = false;
        Tensor pending;  // the forward's output, from the op's shape rule to its forward kernel
        std::shared_ptr<UnitInstance> pending_instance;  // its recorded forward (without recompute), likewise
        Parameter anchor;  // 0 elements: makes the unit's node require grad (distributed/zero3.cpp, forward)
        // Per entry of `flats`: the elements [begin, end) of the flat that hold the members autocast cast to
        // `dtype` in the unit's last recorded forward (begin == end: none). The next forward under that autocast
        // dtype converts the span in one kernel into a 16-bit buffer whose windows become those members' kept
        // copies (Parameter::keep_reduced_copy): one cast per unit instead of one per parameter.
        struct CastSpan {
            DType dtype = DType::f32;
            std::int64_t begin = 0, end = 0;
        };
        std::vector<CastSpan> cast_spans;
        bool stochastic = false;               // ZeroUnit::stochastic
        std::weak_ptr<UnitSession> session;   // the graph this unit's next forward records into, while it lives
    };
    Device device = Device::cpu();
    std::vector<Flat> flats;
    std::vector<const void*> identities;  // the trainable parameters at construction, registration order
    std::unique_ptr<AdamW> adam;          // over the shard parameters, one per flat
    std::unique_ptr<DistributedDataParallel> ddp;  // ZeroOptions::overlap: the bucketed, overlapped all-reduce
    bool reduced = false;                 // reduce_gradients() ran since the last step
    bool unscaled = false;                // unscale(GradScaler&) ran (found_inf summed) for this step
    // Stage 3
    std::vector<Unit> units;
    ProcessGroup group = ProcessGroup::single();  // the units' collectives (the op's kernels reach the state, not the optimizer)
    std::int64_t gathered_bytes = 0;      // gathered parameters held now
    std::int64_t gathered_peak_bytes = 0;
    bool recompute = false;               // ZeroOptions::recompute
    std::vector<std::weak_ptr<UnitInstance>> instances;  // the recorded forwards alive (memory() walks them)
    // ZeroOptions::prefetch (W > 1): per unit, the buffers a forward prefetch all-gathered for its next gather; on
    // CUDA the communication stream and one event pair per unit (group_impl.h) that order the prefetches.
    bool prefetch = false;
    std::vector<std::vector<Tensor>> prefetched;
    CommStreamsHandle streams;
};

// Helpers shared by the stages (distributed/zero.cpp).
// Appends parameter `p` to the flat of its dtype among flats[first_flat...] (a new flat when there is none).
void add_member(ZeroOptimizer::State& state, std::size_t first_flat, const std::string& name, const Parameter& p);
// Per flat: S = ceil(Ψ_d / W), this rank's shard of the members' values, its Parameter; then the AdamW over them.
// Stage 1/2 (members_view_values): the members' values and this rank's shard become views of one persistent
// (W·S) buffer per flat (Flat::values), so the all-gather after the step writes the parameters in place.
void make_shards(ZeroOptimizer::State& state, int rank, int world, const AdamOptions& options, bool members_view_values);
// Host memcpy or device copy of `bytes` (nothing for 0 bytes or dst == src); DDP's buckets use it too.
void copy_bytes(void* dst, const void* src, std::size_t bytes, Device device);
char* bytes_of(const Tensor& t);
// Host memcpys or one batched device copy (core/device_memory.h) of byte ranges on `device`.
void copy_ranges(std::span<const device_memory::CopyRange> ranges, Device device);
// Each gradient's bytes at its element offset into the flat buffer `full` (its dtype): one batched copy.
struct GradientPlace {
    Tensor grad;
    std::int64_t offset = 0;
};
void gradients_into_flat(const Tensor& full, const std::vector<GradientPlace>& grads, Device device);
// Copies the part of member `m` (elements [m.offset, m.offset + numel) of the flat buffer) that falls into
// rank `rank`'s shard [rank·S, rank·S + S) between the member's tensor and the shard's tensor.
void copy_overlap(const ZeroOptimizer::State::Member& m, const Tensor& member_tensor, const Tensor& shard_tensor,
                  std::int64_t shard, int rank, bool into_shard, Device device);
// A view of `length` elements at `offset` of `flat`, shaped `shape`, that keeps `flat` alive.
Tensor view_of(const Tensor& flat, std::int64_t offset, const Shape& shape);

// Stage 3 (distributed/zero3.cpp): gathers / frees a unit's parameters (collective / local), gathers every unit, and
// takes the units out of the op's registry (the destructor).
void gather_unit(ZeroOptimizer::State& state, ZeroOptimizer::State::Unit& unit);
void release_unit(ZeroOptimizer::State& state, ZeroOptimizer::State::Unit& unit);
void unregister_units(ZeroOptimizer::State& state) noexcept;
// Stage 3: forgets the forward prefetches not used yet (the shards are about to change: step, load_checkpoint).
void drop_prefetched(ZeroOptimizer::State& state) noexcept;
// Stage 3: what the recorded forwards alive hold (ZeroMemory's kept_* fields).
void kept_bytes(const ZeroOptimizer::State& state, ZeroMemory& memory);
// Stage 3: every unit gathered for the scope (a collective; checkpoints read and write the full model). Nothing
// without units.
struct AllUnitsGathered {
    explicit AllUnitsGathered(ZeroOptimizer::State& state);
    ~AllUnitsGathered();
    AllUnitsGathered(const AllUnitsGathered&) = delete;
    AllUnitsGathered& operator=(const AllUnitsGathered&) = delete;
    ZeroOptimizer::State& state;
};

// "<name> f32 (4,3)" per trainable parameter, hashed: the layout a checkpoint must match.
std::string zero_layout(const ZeroOptimizer::State& state);

}  // namespace dyngrad::dist
