#include <iostream>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

int main() {
    Generator gen(5);
    Linear fc1(64, 256, true, gen), fc2(256, 64, true, gen);
    const Tensor data = Tensor::normal({128, 64}, 0.0, 1.0, gen);
    const auto block = [&](const Var& h) { return add(h, fc2(dropout(gelu(fc1(h)), 0.1, true, 7))); };

    // The same step twice: plainly, and with the block checkpointed (its activations replayed in the backward).
    const auto step = [&](bool use_checkpoint, GraphMemory& kept) {
        for (Parameter p : fc1.parameters()) p.zero_grad();
        for (Parameter p : fc2.parameters()) p.zero_grad();
        ComputeGraph graph;
        const Var x = graph.input(data, "x", true);
        const Var y = use_checkpoint ? checkpoint(block, x) : block(x);
        const Var loss = mean(mul(y, y));
        kept = graph_memory(graph);  // what the graph holds between the forward and the backward
        graph.backward(loss);
        return fc1.weight.grad().to_vector();
    };
    GraphMemory plain, checkpointed;
    const bool same = step(false, plain) == step(true, checkpointed);
    std::cout << "kept after the forward: " << plain.bytes << " bytes plainly, " << checkpointed.bytes
              << " checkpointed; gradients " << (same ? "bitwise equal" : "DIFFER") << "\n";
    return same && checkpointed.bytes < plain.bytes ? 0 : 1;
}
