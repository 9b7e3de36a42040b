// The model check DistributedDataParallel and ZeroOptimizer run at construction (distributed/group_impl.h): every rank
// must hold the same parameters and buffers, checked with one gather of (count, hash).
#include <algorithm>
#include <cstring>

#include "dyngrad/core/error.h"
#include "dyngrad/distributed/group_impl.h"

namespace dyngrad::dist {

namespace {

std::uint64_t fnv1a(const std::string& text, std::uint64_t h = 1469598103934665603ull) {
    for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
    return h;
}

std::string entry_of(const std::string& name, const Tensor& t) {
    return str("'", name, "' ", to_string(t.shape()), " ", dtype_name(t.dtype()));
}

// An all_gather of a small CPU i64 tensor through whichever transport the group has.
Tensor gather_control(ProcessGroup& group, const Tensor& cpu) {
    if (group.has_mpi() || group.world_size() == 1) return group.all_gather(cpu);
    return group.all_gather(cpu.to(group.device())).to(Device::cpu());
}

Tensor pack_text(const std::string& text, std::int64_t words) {
    Tensor t = Tensor::zeros({words}, DType::i64);
    std::memcpy(t.raw_data(), text.data(), std::min(text.size(), static_cast<std::size_t>(words * 8 - 1)));
    return t;
}

std::string unpack_text(const Tensor& gathered, std::int64_t rank, std::int64_t words) {
    const char* p = static_cast<const char*>(gathered.raw_data()) + rank * words * 8;
    return std::string(p, strnlen(p, static_cast<std::size_t>(words * 8)));
}

void check_same_model(ProcessGroup& group, const std::vector<std::pair<std::string, Tensor>>& entries, const char* who) {
    std::vector<std::uint64_t> hashes;
    std::uint64_t all = 1469598103934665603ull;
    for (const auto& [name, t] : entries) {
        hashes.push_back(fnv1a(entry_of(name, t)));
        all = fnv1a(std::to_string(hashes.back()), all);
    }
    const auto world = group.world_size();
    Tensor summary = Tensor::zeros({2}, DType::i64);
    summary.data<std::int64_t>()[0] = static_cast<std::int64_t>(entries.size());
    summary.data<std::int64_t>()[1] = static_cast<std::int64_t>(all);
    const Tensor summaries = gather_control(group, summary);
    const std::int64_t* s = summaries.data<std::int64_t>();
    bool same = true;
    std::int64_t most = 0;
    for (int r = 0; r < world; ++r) {
        same = same && s[2 * r] == s[0] && s[2 * r + 1] == s[1];
        most = std::max(most, s[2 * r]);
    }
    if (same) return;
    // The first index where the ranks differ (a missing entry hashes as 0).
    Tensor mine = Tensor::zeros({std::max<std::int64_t>(most, 1)}, DType::i64);
    for (std::size_t i = 0; i < hashes.size(); ++i) mine.data<std::int64_t>()[i] = static_cast<std::int64_t>(hashes[i]);
    const Tensor every = gather_control(group, mine);
    const std::int64_t* h = every.data<std::int64_t>();
    std::int64_t first = 0;
    for (; first < most; ++first) {
        bool agree = true;
        for (int r = 1; r < world; ++r) agree = agree && h[r * mine.numel() + first] == h[first];
        if (!agree) break;
    }
    constexpr std::int64_t kWords = 32;  // 255 characters of description per rank
    const bool have = first < static_cast<std::int64_t>(entries.size());
    const std::string own = have ? entry_of(entries[static_cast<std::size_t>(first)].first,
                                            entries[static_cast<std::size_t>(first)].second)
                                 : std::string("(no such entry)");
    const Tensor names = gather_control(group, pack_text(have ? entries[static_cast<std::size_t>(first)].first : "", kWords));
    const Tensor texts = gather_control(group, pack_text(own, kWords));
    std::string each;
    bool same_name = true;
    for (int r = 0; r < world; ++r) {
        each += str(r ? "; " : "", "rank ", r, " (", s[2 * r], " entries): ", unpack_text(texts, r, kWords));
        same_name = same_name && unpack_text(names, r, kWords) == unpack_text(names, 0, kWords) &&
                    !unpack_text(names, r, kWords).empty();
    }
    const std::string message = str(who, " (rank ", group.rank(), "/", world,
                                    "): the model differs across ranks at parameter/buffer #", first, ": ", each);
    if (same_name) {
        // Same name: the shape or the dtype differs. Tell which from this rank's view of rank 0's text.
        const std::string zero = unpack_text(texts, 0, kWords);
        for (int r = 0; r < world; ++r) {
            const std::string other = unpack_text(texts, r, kWords);
            const auto dtype_of = [](const std::string& t) { return t.substr(t.rfind(' ') + 1); };
            if (dtype_of(other) != dtype_of(zero)) throw DTypeError(message);
        }
        throw ShapeError(message);
    }
    throw ValueError(message);
}

}  // namespace

void check_and_broadcast_model(ProcessGroup& group, const Module& module, const char* who) {
    std::vector<std::pair<std::string, Tensor>> entries;
    for (const auto& [name, p] : module.named_parameters()) entries.emplace_back(name, p.value());
    for (const auto& [name, t] : module.buffers()) entries.emplace_back(name, t);
    check_same_model(group, entries, who);
    for (auto& [name, t] : entries) group.broadcast(t, 0);
}

}  // namespace dyngrad::dist
