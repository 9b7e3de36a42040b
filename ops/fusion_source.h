// Source generation of the fusion compiler (issue 33, docs/fusion.md): one CUDA C++ kernel for a group of the
// grouping pass (graph/fusion_plan.h), written over the same scalar formulas as the ops' own kernels: the part of
// ops/elementwise_math.h between its fusion-source markers is embedded in the library at build time
// (cmake/embed_source.cmake) and pasted into every generated source, so NVRTC needs no header file at run time.
//
// The kernel: a grid-stride loop over 64-bit indices; 16-byte vector loads and stores of the tensors that have
// the group's full shape when every such pointer is aligned (checked in the kernel), elementwise otherwise and
// for the tail; bf16/f16 loaded to f32, f32 arithmetic, every member's result rounded to its own dtype (as its
// unfused kernel stores it) and kept apart from the next formula (no contraction across ops), so a fused kernel
// computes what the unfused kernels compute. Shapes are constants of the source: another shape is another source,
// another hash, another kernel.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dyngrad/graph/fusion_plan.h"

namespace dyngrad::fusion {

// A unary member's scalars, as the kernel takes them (math::UnaryScalars of the compute type): the launch passes
// attributes as arguments, so a changed scalar (a loss scale, a slope) reuses the compiled kernel.
struct ScalarArgument {
    NodeId node;
};

struct FusedKernelSource {
    std::string name;    // "dg_fused_<16 hex digits of the source's hash>": extern "C", so NVRTC keeps it
    std::string source;  // the whole translation unit
    // The kernel's parameters in order: one pointer per input, one per output, one per scalar argument (members
    // that read OpAttrs::scalar or clamp's bounds: UnaryScalars; dropout: DropoutScalars, its p and attribute seed).
    std::vector<NodeId> inputs;
    std::vector<NodeId> outputs;
    std::vector<ScalarArgument> scalars;
    int vector_width = 1;     // elements per vector access (16 bytes of the widest full-shape tensor)
    std::int64_t numel = 0;   // the index space (a row-reduction kernel: its rows x 256, the threads it launches)
    std::uint64_t hash = 0;   // of `source` (cuda::fnv1a64)
};

// The kernel of `group` of a plan made for `graph` (its signature: the values' shapes and dtypes are read from it).
FusedKernelSource generate_fused_source(const ComputeGraph& graph, const FusionGroup& group);

// The kernel of a group's backward chain as one backward pass runs it (graph/fusion_plan.h, BackwardLaunch): per
// element, the incoming gradients, then the members in reverse creation order, each input's part dy * f'(...)
// rounded to that input's dtype and summed where several members read one value, as the unfused backward
// kernels and the sweep's accumulation store them; one gradient per external input, in the group's shape (the
// sweep sums a broadcast one to its input's shape).
struct FusedBackwardSource {
    std::string name;    // empty when the kernel would store nothing (every result an incoming gradient)
    std::string source;
    // The kernel's parameters in order: the saved values, the incoming gradients, the stores, the scalars.
    std::vector<NodeId> saved;
    std::vector<NodeId> gradients_in;  // members whose gradient is loaded
    std::vector<NodeId> stores;        // the first external input each store is for
    std::vector<ScalarArgument> scalars;
    // Per external input of the launch (its gradients_out order): its gradient is store `store`, or, unchanged
    // (a chain of adds), the incoming gradient `gradient_in`; the other is -1. `contributions`: how many members'
    // gradients it sums.
    // A row program's backward (BackwardLaunch::program): `row_summed` results were summed over their rows in the
    // kernel (their order of additions is the kernel's), and with `magnitudes` each also has a store of its rows'
    // sums of the terms' magnitudes (`magnitude_store`: DYNGRAD_CHECK_FUSIONS=1's bound on the sum).
    struct Result {
        NodeId input;
        int store = -1;
        int gradient_in = -1;
        int contributions = 0;
        bool row_summed = false;
        int magnitude_store = -1;
    };
    std::vector<Result> results;
    std::vector<Shape> store_shapes;  // per store: the group's shape, or a row program's kept shape (one per row)
    std::vector<DType> store_dtypes;  // per store: its input's dtype; a magnitude store's the compute type
    int vector_width = 1;
    std::int64_t numel = 0;  // the threads it launches (a row program: its rows x 256)
    std::uint64_t hash = 0;
};
// A launch with `program` set (program_backward_launch) is a row program's backward: generate_row_backward_source.
FusedBackwardSource generate_backward_source(const ComputeGraph& graph, const FusionGroup& group,
                                             const BackwardLaunch& launch, bool magnitudes = false);
// The backward of a row program (docs/fusion.md, "Backward row programs"): a block of 256 threads per row runs the
// forward's passes in reverse. Loop k (from the last pass down) recomputes, per element, the gradients of every
// pointwise member of passes k and later from the incoming gradients, the saved values and the row values'
// gradients already complete, and sums over the row the parts that go to the row values that pass k reads (the
// reductions of pass k - 1 and the row members of pass k); the row members' own backward then runs once per row.
// Loop 0 stores the gradients of the inputs; an input of the rows' kept shape gets its row sums.
FusedBackwardSource generate_row_backward_source(const ComputeGraph& graph, const FusionGroup& group,
                                                 const BackwardLaunch& launch, bool magnitudes);

// `group` with every member as an output (ConsumedOutside): the captured-step hook's kernels write every member,
// since the unfused backward kernels may read any member's value (graph/fusion_replay.h).
FusionGroup with_every_member_written(const FusionGroup& group);

// One translation unit holding every kernel of `sources` (generated sources, each with the same prelude and
// formulas): the prelude once, then each kernel, so NVRTC parses the shared part once for a whole plan. Each kernel
// keeps its own name (the hash of its own source). ValueError for an empty list or a text that is not a generated
// source.
std::string combined_source(std::span<const std::string> sources);

// The embedded text of ops/elementwise_math.h between its markers (what every generated source contains).
std::string_view elementwise_math_source();
// The same of ops/dropout_mask.h (dropout's keep mask), after it in every generated source.
std::string_view dropout_mask_source();

}  // namespace dyngrad::fusion
