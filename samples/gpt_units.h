// ZeRO-3's units of a GPT (nn/transformer.h), shared by samples/char_gpt.cpp and bench/dist_bench.cpp: the
// embeddings, each block, the final LayerNorm with the head (GPT::operator() in pieces). The model's dropout must
// be 0: each unit's forward runs again in the backward (distributed/zero.h).
#pragma once
#include <cstddef>
#include <vector>

#include "dyngrad/distributed/zero.h"
#include "dyngrad/dyngrad.h"

namespace dyngrad {

inline std::vector<dist::ZeroUnit> gpt_units(const GPT& model) {
    std::vector<dist::ZeroUnit> units;
    Module embed;
    embed.register_module("token_embedding", model.token_embedding);
    embed.register_module("position_embedding", model.position_embedding);
    units.push_back({"embed", embed, [tokens = model.token_embedding, positions = model.position_embedding](
                                         const Var& x) { return positions(tokens(x)); }});
    for (std::size_t i = 0; i < model.blocks.size(); ++i)
        units.push_back({str("block", i), model.blocks[i], [block = model.blocks[i]](const Var& x) { return block(x); }});
    Module head;
    head.register_module("ln_f", model.ln_f);
    head.register_module("lm_head", model.lm_head);
    units.push_back({"head", head, [ln = model.ln_f, lm = model.lm_head](const Var& x) {
                         const Shape s = x.shape();
                         return reshape(lm(reshape(ln(x), {s[0] * s[1], s[2]})), {s[0], s[1], lm.weight.value().size(0)});
                     }});
    return units;
}

}  // namespace dyngrad
