// ZeroOptimizer's sharded checkpoints (distributed/zero.h): one file per rank with that rank's AdamW state (the inner
// optimizer's own save_state, shard-sized), and the full model written last by rank 0 as the commit record (its
// metadata names the world size whose rank files are complete). Loading reshards onto any world size.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/core/error.h"
#include "dyngrad/core/safetensors.h"
#include "dyngrad/distributed/zero_impl.h"

namespace dyngrad::dist {

namespace {

constexpr const char* kWorldKey = "dyngrad.zero.world";
constexpr const char* kLayoutKey = "dyngrad.zero.layout";
constexpr const char* kStageKey = "dyngrad.zero.stage";

std::filesystem::path rank_file(const std::filesystem::path& folder, int rank, int world) {
    return folder / str("zero-rank", rank, "-of-", world, ".safetensors");
}

std::string state_key(std::size_t flat, const char* name) { return str("@optimizer.state.", flat, ".", name); }

}  // namespace

void ZeroOptimizer::save_checkpoint(const std::filesystem::path& folder) const {
    const State& st = *state_;
    const int world = group_.world_size(), rank = group_.rank();
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);  // every rank: the folder may be per-host
    if (ec) throw IoError(str("ZeroOptimizer::save_checkpoint (rank ", rank, "/", world, "): cannot create '",
                              folder.string(), "': ", ec.message()));
    TensorMap tensors;
    SafetensorsMetadata metadata;
    st.adam->save_state(tensors, metadata);
    metadata[kWorldKey] = std::to_string(world);
    metadata[kLayoutKey] = zero_layout(st);
    metadata[kStageKey] = std::to_string(zero_.stage);
    save_safetensors(rank_file(folder, rank, world), tensors, metadata);  // temporary file, renamed when complete
    ProcessGroup group = group_;
    group.barrier();  // every rank file is in place before the model file commits the checkpoint
    const AllUnitsGathered full(*state_);  // stage 3: the model file holds the full parameters
    if (rank == 0) {
        SafetensorsMetadata model_metadata{{kWorldKey, std::to_string(world)}, {kLayoutKey, zero_layout(st)}};
        save_safetensors(folder / "model.safetensors", named_tensors(module_), model_metadata);
        // Rank files of another world size from an earlier save into this folder are stale now.
        for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
            const std::string name = entry.path().filename().string();
            if (name.starts_with("zero-rank") && !name.ends_with(str("-of-", world, ".safetensors")))
                std::filesystem::remove(entry.path(), ec);
        }
    }
    group.barrier();
}

void ZeroOptimizer::load_checkpoint(const std::filesystem::path& folder) {
    State& st = *state_;
    drop_prefetched(st);  // gathered from the shards this replaces
    const int world = group_.world_size(), rank = group_.rank();
    const std::string who = str("ZeroOptimizer::load_checkpoint (rank ", rank, "/", world, ")");
    const std::filesystem::path model_path = folder / "model.safetensors";
    if (!std::filesystem::exists(model_path))
        throw IoError(str(who, ": '", model_path.string(), "' does not exist (not a ZeroOptimizer checkpoint folder, "
                              "or its save did not complete)"));
    SafetensorsMetadata model_metadata;
    const TensorMap model = load_safetensors(model_path, &model_metadata);
    const auto world_entry = model_metadata.find(kWorldKey);
    long long old_world = 0;
    if (world_entry == model_metadata.end() || (old_world = std::atoll(world_entry->second.c_str())) < 1)
        throw IoError(str(who, ": '", model_path.string(), "' has no valid '", kWorldKey,
                          "' entry: not written by ZeroOptimizer::save_checkpoint"));
    const std::string layout = zero_layout(st);
    if (model_metadata[kLayoutKey] != layout)
        throw ValueError(str(who, ": the checkpoint in '", folder.string(),
                             "' is of another model (its trainable parameters, by name, dtype and shape, differ): "
                             "checkpoint [", model_metadata[kLayoutKey], "], this model [", layout, "]"));

    // The old rank files this rank's new shards overlap (rank 0's always: settings and step counts).
    std::map<int, std::pair<TensorMap, SafetensorsMetadata>> old;
    const auto read = [&](int k) -> const TensorMap& {
        auto found = old.find(k);
        if (found != old.end()) return found->second.first;
        const std::filesystem::path path = rank_file(folder, k, static_cast<int>(old_world));
        if (!std::filesystem::exists(path))
            throw IoError(str(who, ": '", path.string(), "' is missing (the checkpoint was saved on ", old_world,
                              " ranks; every rank file is needed to reshard)"));
        SafetensorsMetadata metadata;
        TensorMap tensors = load_safetensors(path, &metadata);
        if (metadata[kWorldKey] != std::to_string(old_world) || metadata[kLayoutKey] != layout)
            throw IoError(str(who, ": '", path.string(), "' belongs to another checkpoint (world ", metadata[kWorldKey],
                              ", or another model) than '", model_path.string(), "'"));
        return old.emplace(k, std::make_pair(std::move(tensors), std::move(metadata))).first->second.first;
    };
    // Every rank file must be there, also those this rank does not read: an incomplete checkpoint is refused on
    // every rank alike.
    for (int k = 0; k < old_world; ++k)
        if (!std::filesystem::exists(rank_file(folder, k, static_cast<int>(old_world))))
            throw IoError(str(who, ": '", rank_file(folder, k, static_cast<int>(old_world)).string(),
                              "' is missing (the checkpoint was saved on ", old_world, " ranks)"));
    TensorMap state = read(0);
    const SafetensorsMetadata base_metadata = old.at(0).second;
    for (std::size_t f = 0; f < st.flats.size(); ++f) {
        const auto& flat = st.flats[f];
        const std::int64_t old_shard = (flat.numel + old_world - 1) / old_world;
        const std::size_t size = dtype_size(flat.dtype);
        for (const char* name : {"exp_avg", "exp_avg_sq"}) {
            const std::string key = state_key(f, name);
            if (!state.contains(key)) continue;  // no step yet: no moments anywhere
            Tensor mine = Tensor::zeros({flat.shard}, flat.dtype);
            // New shard [rank·S, rank·S + S) ∩ [0, Ψ): copy from the old shards [k·S', k·S' + S') it meets.
            const std::int64_t begin = rank * flat.shard, end = std::min(flat.numel, begin + flat.shard);
            for (std::int64_t at = begin; at < end;) {
                const int k = static_cast<int>(at / old_shard);
                const std::int64_t stop = std::min(end, (k + 1) * old_shard);
                const TensorMap& file = read(k);
                const auto found = file.find(key);
                if (found == file.end() || found->second.dtype() != flat.dtype || found->second.numel() != old_shard)
                    throw IoError(str(who, ": '", rank_file(folder, k, static_cast<int>(old_world)).string(), "' has no ",
                                      dtype_name(flat.dtype), " (", old_shard, ") entry '", key, "'"));
                std::memcpy(static_cast<char*>(mine.raw_data()) + (at - begin) * size,
                            static_cast<const char*>(found->second.raw_data()) + (at - k * old_shard) * size,
                            static_cast<std::size_t>(stop - at) * size);
                at = stop;
            }
            state[key] = mine;
        }
    }
    // Everything is checked before anything changes: the optimizer's staging, then the model's load.
    std::function<void()> apply = st.adam->stage_state(state, base_metadata, folder.string());
    const AllUnitsGathered full(st);  // stage 3: full parameters to load into, and to take the shards from
    load_parameters(module_, model, model_path.string());
    apply();
    // The shards' values from the loaded model, written into the shard parameters' own storage (the optimizer
    // and its device tables keep their addresses).
    for (auto& flat : st.flats) {
        const std::size_t size = dtype_size(flat.dtype);
        Tensor host = Tensor::zeros({flat.shard}, flat.dtype);
        for (const auto& m : flat.members) {
            const std::int64_t b = std::max(m.offset, rank * flat.shard);
            const std::int64_t e = std::min(m.offset + m.parameter.value().numel(), (rank + 1) * flat.shard);
            if (b >= e) continue;
            const Tensor from = m.parameter.value().to(Device::cpu());
            std::memcpy(static_cast<char*>(host.raw_data()) + (b - rank * flat.shard) * size,
                        static_cast<const char*>(from.raw_data()) + (b - m.offset) * size,
                        static_cast<std::size_t>(e - b) * size);
        }
        Tensor& target = flat.shard_param.value();
        const Tensor there = host.to(st.device);
        if (st.device.is_cuda()) device_memory::copy(const_cast<void*>(target.raw_data()), st.device, there.raw_data(), st.device, there.nbytes());
        else std::memcpy(const_cast<void*>(target.raw_data()), there.raw_data(), there.nbytes());
        target.bump_version();
    }
    st.reduced = false;
    st.unscaled = false;
}

}  // namespace dyngrad::dist
