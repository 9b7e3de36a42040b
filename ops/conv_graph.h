// Internal (CUDA translation units only): conv2d's passes on cuDNN's graph (backend) API, ops/conv_graph.cu. The
// legacy API that ops/conv.cu searches cannot reach cuDNN's newer engines (on the H200, bf16 backward data: the
// legacy candidates timed 97-139 µs where the graph API's sm90 implicit-GEMM dgrad engine, PyTorch's choice, ran
// 13 µs), so conv.cu's per-shape search times the graph API's engine configs beside its algorithms and keeps the
// fastest of either (ConvGraphMode, ops/conv.h).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dyngrad/cuda/context.h"
#include "dyngrad/ops/conv.h"

namespace dyngrad::cuda {

enum class ConvPass { forward, backward_data, backward_filter };

// One convolution as ops/conv.cu's plan key has it (stride and dilation already normalised for cuDNN), with the
// precision policy of its plan. Tensors are contiguous NCHW.
struct ConvGraphProblem {
    std::array<std::int64_t, 4> x{}, w{}, y{};  // w (K, C/groups, R, S): cuDNN reads the group count off C / (C/groups)
    std::array<std::int64_t, 2> stride{}, padding{}, dilation{};
    DType dtype = DType::f32;
    bool fma_only = false;       // float32 without TF32: no tensor-core engines
    bool no_transforms = false;  // no FFT or Winograd engines
    bool deterministic = false;  // no engines with the nondeterministic note
    std::size_t workspace_limit = 0;
    std::string description;     // the plan's key, for the log
};

// A pass's three operands by their shapes' role: forward reads x, w and writes y; backward data reads w, y (dy) and
// writes x (dx); backward filter reads x, y (dy) and writes w (dw). Device pointers; the one written is the output.
struct ConvGraphOperands {
    void* x = nullptr;
    void* w = nullptr;
    void* y = nullptr;
};

// One pass's finalized execution plan (opaque; ops/conv_graph.cu), immutable but for its variant packs.
class ConvGraphPlan;

struct ConvGraphChoice {
    std::shared_ptr<ConvGraphPlan> plan;  // null: no graph engine config may run this pass (the log says why)
    double ms = -1;                       // its second timing
    std::size_t workspace_bytes = 0;
    std::size_t log_index = 0;            // its entry's index in the log search_conv_graph appended to
};

// Whether the graph API is tried for the problem: bfloat16 and float16, and float32 only where TF32 is allowed. At
// full float32 precision an engine without the tensor-core note still computed like TF32 on the H200 (lenet5 conv1's
// weight gradient 5.5e-4 off the float64 reference, the legacy FMA algorithms ~1e-6), so that stays on the legacy API.
bool conv_graph_allowed(const ConvGraphProblem& problem);

// Builds the pass's operation graph, asks cuDNN's heuristics (mode A, then the fallback list) for engine configs,
// finalizes up to 8 that the precision policy allows and times each on `operands` with `scratch` (problem.
// workspace_limit bytes, the legacy search's) as its workspace: run twice, the second timed with events on ctx's
// stream; the output operand is scratch too. Appends one entry per candidate to `log` (verdicts "slower" or why
// refused; the caller marks the one it takes "chosen") and returns the fastest. "Not supported" and other cuDNN
// failures are logged and leave the choice empty: the legacy API runs. Host waits: outside capture only.
ConvGraphChoice search_conv_graph(DeviceContext& ctx, const ConvGraphProblem& problem, ConvPass pass,
                                  const ConvGraphOperands& operands, void* scratch, std::vector<ConvSearchEntry>& log);

// Whether `operands` meet the 16-byte alignment the graph's tensors declare (a view may start off it; then the caller
// runs its legacy algorithm). Workspaces come from the device pool, whose blocks are aligned further.
bool conv_graph_aligned(const ConvGraphOperands& operands);

// Runs the pass on ctx's cuDNN handle (and so its stream): the variant pack for these pointers (a few recent ones
// are kept; a new set builds one, host-side only), then cudnnBackendExecute. `workspace` holds at least the
// choice's workspace_bytes. No allocation, no sync: capturable.
void run_conv_graph(ConvGraphPlan& plan, DeviceContext& ctx, const ConvGraphOperands& operands, void* workspace);

}  // namespace dyngrad::cuda
