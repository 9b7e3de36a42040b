// The backward of a row program as one generated kernel (ops/fusion_source.h, generate_row_backward_source;
// docs/fusion.md "Backward row programs"): the forward's passes in reverse, the gradients of the row values summed
// over their rows in the kernel.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "dyngrad/ops/fusion_source.h"
#include "dyngrad/ops/fusion_text.h"

namespace dyngrad::fusion {

using namespace text;

namespace {

// The block's fixed tree over 256 partial sums (as the forward's row sums): every thread reads the row's total.
void tree_sum(std::ostringstream& src, const std::string& partial_value, const std::string& use_total) {
    src << "            partial[threadIdx.x] = " << partial_value << ";\n";
    src << "            __syncthreads();\n";
    src << "            for (int half = 128; half > 0; half >>= 1) {\n";
    src << "                if (threadIdx.x < half) partial[threadIdx.x] = partial[threadIdx.x] + partial[threadIdx.x + half];\n";
    src << "                __syncthreads();\n";
    src << "            }\n";
    src << "            " << use_total << "\n";
    src << "            __syncthreads();  // partial[] is reused\n";
}

}  // namespace

FusedBackwardSource generate_row_backward_source(const ComputeGraph& graph, const FusionGroup& group,
                                                 const BackwardLaunch& launch, bool magnitudes) {
    if (!group.row_program || group.reductions.empty())
        throw Error("fusion: a row program's backward was asked of a group that is no row program");
    if (launch.members.empty()) throw Error("fusion: a backward chain without members has no kernel");
    FusedBackwardSource out;
    out.saved = launch.saved_reads;
    out.gradients_in = launch.gradients_in;
    out.numel = group.reductions.front().rows * 256;  // a block per row
    KernelText text;
    text.compute = group.double_precision ? "double" : "float";
    const std::string& compute = text.compute;
    text.comment = "the backward of the row program";
    for (auto it = launch.members.rbegin(); it != launch.members.rend(); ++it)
        text.comment += str(" ", op_def(graph.node(*it).op).name, "#", *it);
    text.comment += str(", over ", to_string(group.shape), " in rows of ", group.reductions.front().row_length);

    std::map<NodeId, int> pass;
    {
        const std::vector<int> passes = member_passes(graph, group);
        for (std::size_t k = 0; k < group.members.size(); ++k) pass[group.members[k]] = passes[k];
    }
    const auto is_reduction = [&](NodeId id) { return group.reduction_of(id) != nullptr; };
    const auto is_row_member = [&](NodeId id) {
        return std::find(group.row_members.begin(), group.row_members.end(), id) != group.row_members.end();
    };
    const auto is_row_value = [&](NodeId id) { return is_reduction(id) || is_row_member(id); };
    // The loop that sums a row value's gradient: the first pass that reads it (every reader is there or later).
    const auto birth = [&](NodeId v) { return is_reduction(v) ? pass.at(v) + 1 : pass.at(v); };
    const std::set<NodeId> members(launch.members.begin(), launch.members.end());
    const std::set<NodeId> externals(launch.gradients_out.begin(), launch.gradients_out.end());
    const std::set<NodeId> saved(launch.saved_reads.begin(), launch.saved_reads.end());
    const auto row_target = [&](NodeId e) { return graph.node(e).value.shape() == group.row_shape; };
    // A row value (a reduction without its kept axes too) is read per row.
    const auto index_of = [&](NodeId id) {
        return index_expression(members.contains(id) && is_row_value(id) ? group.row_shape : graph.node(id).value.shape(),
                                group.shape);
    };
    for (NodeId id : launch.saved_reads)
        text.loads.push_back({graph.node(id).value.dtype(), index_of(id), str("x", id)});
    for (NodeId m : launch.gradients_in) text.loads.push_back({graph.node(m).value.dtype(), index_of(m), str("d", m)});
    const auto value_of = [&](NodeId id) {
        if (!saved.contains(id)) throw Error(str("fusion: the row program's backward reads node #", id, ", not saved"));
        return str("x", id);
    };

    // Each member's scalar parameters, once (every loop that recomputes its gradient passes the same).
    std::map<NodeId, std::string> unary_scalars;
    std::map<NodeId, std::size_t> dropout_scalars;
    for (NodeId m : launch.members) {
        const ComputeNode& node = graph.node(m);
        const OpDef& def = op_def(node.op);
        if (def.pointwise == nullptr) continue;
        const bool gives = std::any_of(node.inputs.begin(), node.inputs.end(), [&](const NodeInput& input) {
            return members.contains(input.id) || externals.contains(input.id);
        });
        if (!gives) continue;
        if (def.pointwise->form == PointwiseFormula::Form::Unary && reads_scalars(def)) {
            unary_scalars[m] = str("s", out.scalars.size());
            out.scalars.push_back({m});
            text.scalars.push_back(unary_scalars_type(compute));
        }
        if (def.pointwise->form == PointwiseFormula::Form::Dropout) {
            dropout_scalars[m] = text.scalars.size();
            out.scalars.push_back({m});
            text.scalars.push_back(kDropoutScalarsType);
        }
    }
    const auto scalars_of = [&](NodeId m) {
        const auto found = unary_scalars.find(m);
        return found == unary_scalars.end() ? str(unary_scalars_type(compute), "{}") : found->second;
    };
    const auto dropout_of = [&](NodeId m) {
        const auto found = dropout_scalars.find(m);
        return found == dropout_scalars.end() ? std::size_t{0} : found->second;
    };

    // The stores: per external input its gradient (the group's shape; a row target one per row), and with
    // `magnitudes` its rows' sums of the terms' magnitudes.
    std::map<NodeId, int> store_of, magnitude_of;
    for (NodeId e : launch.gradients_out) {
        store_of[e] = static_cast<int>(text.stores.size());
        text.stores.push_back({graph.node(e).value.dtype(), ""});
        out.stores.push_back(e);
        out.store_shapes.push_back(row_target(e) ? group.row_shape : group.shape);
        out.store_dtypes.push_back(graph.node(e).value.dtype());
        if (magnitudes && row_target(e)) {
            magnitude_of[e] = static_cast<int>(text.stores.size());
            text.stores.push_back({group.double_precision ? DType::f64 : DType::f32, ""});
            out.stores.push_back(e);
            out.store_shapes.push_back(group.row_shape);
            out.store_dtypes.push_back(group.double_precision ? DType::f64 : DType::f32);
        }
    }
    std::map<NodeId, int> contributions;

    const RowReduction& rows = group.reductions.front();
    std::ostringstream src;
    src << "    constexpr long long rows = " << rows.rows << "LL;\n";
    src << "    constexpr long long row_length = " << rows.row_length << "LL;\n";
    src << "    __shared__ " << compute << " partial[256];\n";
    src << "    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {\n";
    for (NodeId m : launch.members)  // the row values' gradients, complete before the loops that read them
        if (is_row_value(m)) src << "        " << compute << " gr" << m << " = " << compute << "(0);\n";
    for (NodeId e : launch.gradients_out)
        if (row_target(e)) {
            src << "        " << compute << " ge" << e << " = " << compute << "(0);\n";
            if (magnitudes) src << "        " << compute << " gm" << e << " = " << compute << "(0);\n";
        }
    const auto row_loads = [&] {
        std::ostringstream loads;
        text.load_lines(loads, false, "            ");
        return str("            const long long i = row * row_length;  // a row value's operands: the row's first element\n",
                   loads.str());
    };
    {
        std::string incoming;
        for (NodeId m : launch.gradients_in)
            if (is_row_value(m)) incoming += str("            gr", m, " = d", m, ";\n");
        if (!incoming.empty()) src << "        {\n" << row_loads() << incoming << "        }\n";
    }
    const std::string zero = str(compute, "(0)");
    const auto magnitude = [&](const std::string& value) {
        return str(group.double_precision ? "fabs(" : "fabsf(", value, ")");
    };
    for (int j = group.passes - 1; j >= 0; --j) {
        std::vector<std::string> lines;  // the loop body after its loads
        std::size_t fresh = 0;
        const auto declare = [&](const std::string& value, const std::string& why) {
            const std::string name = str("g", fresh++);
            lines.push_back(str("const ", compute, " ", name, " = ", value, ";  // ", why));
            return name;
        };
        std::map<NodeId, std::string> gradient;  // per element, in this loop
        const auto accumulate = [&](NodeId target, const std::string& contribution, DType dtype) {
            if (j == 0) ++contributions[target];
            auto [slot, first] = gradient.try_emplace(target, contribution);
            if (!first)
                slot->second = declare(str(rounding(dtype), "(", slot->second, " + ", contribution, ")"),
                                       str("sum into #", target));
        };
        std::vector<NodeId> summed;  // the row values whose readers' parts this loop sums, and the row targets
        for (NodeId m : launch.members)
            if (is_row_value(m) && birth(m) == j) summed.push_back(m);
        std::vector<NodeId> targets;
        if (j == 0)
            for (NodeId e : launch.gradients_out)
                if (row_target(e)) targets.push_back(e);
        std::set<NodeId> touched;  // the row sums this loop adds to (the others need no tree)
        // Where a part goes: a member's gradient here, a row sum, a store of loop 0, or nowhere in this loop.
        const auto give = [&](NodeId target, const std::string& contribution) {
            const DType dtype = graph.node(target).value.dtype();
            if (members.contains(target)) {
                if (is_row_value(target)) {
                    if (birth(target) != j) return;
                    touched.insert(target);
                    lines.push_back(str("acc", target, " = acc", target, " + ", contribution, ";"));
                } else if (pass.at(target) >= j) {
                    accumulate(target, contribution, dtype);
                }
            } else if (externals.contains(target) && j == 0) {
                if (row_target(target)) {
                    touched.insert(target);
                    ++contributions[target];
                    lines.push_back(str("acc", target, " = acc", target, " + ", contribution, ";"));
                    if (magnitudes) lines.push_back(str("mag", target, " = mag", target, " + ", magnitude(contribution), ";"));
                } else {
                    accumulate(target, contribution, dtype);
                }
            }
        };
        for (NodeId m : launch.gradients_in)
            if (!is_row_value(m) && pass.at(m) >= j) gradient[m] = str("d", m);
        for (NodeId m : launch.members) {
            if (is_row_member(m) || pass.at(m) < j) continue;
            const ComputeNode& node = graph.node(m);
            if (is_reduction(m)) {  // reduce_backward's expand: its gradient (complete) on every element
                const NodeId target = node.inputs[0].id;
                std::string part = str("gr", m);
                if (node.op == OpType::Mean)
                    part = declare(str(rounding(graph.node(target).value.dtype()), "(gr", m, " * (", compute, "(1) / ",
                                       compute, "(", group.reduction_of(m)->row_length, "LL)))"),
                                   str("mean #", m, " -> #", target));
                give(target, part);
                continue;
            }
            const auto found = gradient.find(m);
            if (found == gradient.end())
                throw Error(str("fusion: no gradient reaches ", op_def(node.op).name, " #", m, " in pass ", j,
                                " of its row program's backward"));
            const std::string dy = found->second;
            for (std::size_t k = 0; k < node.inputs.size(); ++k) {
                const NodeId target = node.inputs[k].id;
                if (!members.contains(target) && !externals.contains(target)) continue;
                if (members.contains(target) && !is_row_value(target) && pass.at(target) < j) continue;
                if (members.contains(target) && is_row_value(target) && birth(target) != j) continue;
                if (externals.contains(target) && j != 0) continue;
                give(target, derivative_part(graph, m, k, dy, compute, scalars_of(m), dropout_of(m), value_of, declare));
            }
        }
        std::erase_if(summed, [&](NodeId v) { return !touched.contains(v); });
        std::erase_if(targets, [&](NodeId e) { return !touched.contains(e); });
        src << "        {  // backward pass " << j << "\n";
        for (NodeId v : summed) src << "            " << compute << " acc" << v << " = " << compute << "(0);\n";
        for (NodeId e : targets) {
            src << "            " << compute << " acc" << e << " = " << compute << "(0);\n";
            if (magnitudes) src << "            " << compute << " mag" << e << " = " << compute << "(0);\n";
        }
        src << "            for (long long c = threadIdx.x; c < row_length; c += 256) {\n";
        src << "                const long long i = row * row_length + c;\n";
        std::ostringstream loads;
        text.load_lines(loads, false, "                ");
        src << loads.str();
        for (const std::string& line : lines) src << "                " << line << "\n";
        if (j == 0)
            for (NodeId e : launch.gradients_out) {
                if (row_target(e)) continue;
                const auto g = gradient.find(e);
                src << "                out" << store_of.at(e) << "[i] = dg_store_" << dtype_name(graph.node(e).value.dtype())
                    << "(" << (g == gradient.end() ? zero : g->second) << ");\n";
            }
        src << "            }\n";
        for (NodeId v : summed)
            tree_sum(src, str("acc", v),
                     str("gr", v, " = ", rounding(graph.node(v).value.dtype()), "(gr", v, " + partial[0]);  // #", v,
                         "'s gradient"));
        for (NodeId e : targets) {
            tree_sum(src, str("acc", e),
                     str("ge", e, " = ", rounding(graph.node(e).value.dtype()), "(ge", e, " + partial[0]);  // #", e,
                         "'s gradient"));
            if (magnitudes) tree_sum(src, str("mag", e), str("gm", e, " = gm", e, " + partial[0];"));
        }
        // The row members of pass j, newest first: once per row, from their gradients complete now.
        std::vector<std::string> row_lines;
        std::size_t row_fresh = 0;
        const auto row_declare = [&](const std::string& value, const std::string& why) {
            const std::string name = str("h", row_fresh++);
            row_lines.push_back(str("const ", compute, " ", name, " = ", value, ";  // ", why));
            return name;
        };
        for (NodeId q : launch.members) {
            if (!is_row_member(q) || pass.at(q) != j) continue;
            const ComputeNode& node = graph.node(q);
            for (std::size_t k = 0; k < node.inputs.size(); ++k) {
                const NodeId target = node.inputs[k].id;
                if (!members.contains(target) && !externals.contains(target)) continue;
                const std::string part =
                    derivative_part(graph, q, k, str("gr", q), compute, scalars_of(q), dropout_of(q), value_of, row_declare);
                const std::string rounded = rounding(graph.node(target).value.dtype());
                if (members.contains(target)) {
                    row_lines.push_back(str("gr", target, " = ", rounded, "(gr", target, " + ", part, ");"));
                } else {
                    ++contributions[target];
                    row_lines.push_back(str("ge", target, " = ", rounded, "(ge", target, " + ", part, ");"));
                    if (magnitudes) row_lines.push_back(str("gm", target, " = gm", target, " + ", magnitude(part), ";"));
                }
            }
        }
        if (!row_lines.empty()) {
            src << "            {\n" << row_loads();
            for (const std::string& line : row_lines) src << "            " << line << "\n";
            src << "            }\n";
        }
        src << "        }\n";
    }
    std::string row_stores;
    for (NodeId e : launch.gradients_out) {
        if (!row_target(e)) continue;
        row_stores += str("            out", store_of.at(e), "[row] = dg_store_", dtype_name(graph.node(e).value.dtype()),
                          "(ge", e, ");\n");
        if (magnitudes)
            row_stores += str("            out", magnitude_of.at(e), "[row] = gm", e, ";\n");
    }
    if (!row_stores.empty()) src << "        if (threadIdx.x == 0) {\n" << row_stores << "        }\n";
    src << "    }\n}\n";
    text.row_body = src.str();
    for (NodeId e : launch.gradients_out) {
        FusedBackwardSource::Result result{e};
        result.store = store_of.at(e);
        result.contributions = contributions[e];
        result.row_summed = row_target(e);
        if (magnitudes && row_target(e)) result.magnitude_store = magnitude_of.at(e);
        out.results.push_back(result);
    }
    out.vector_width = 1;
    finish(out, text.write());
    return out;
}

}  // namespace dyngrad::fusion
