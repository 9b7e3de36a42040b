// dyngrad-verify: the main job. Runs every op of the op table (ops/op_table.cpp) on every one of
// its cases through the checks and prints one row per check, then a summary:
//   finite_diff  float64 analytic gradients vs central differences on the CPU     (tolerance 1e-6)
//   f32_vs_f64   float32 CPU output and gradients vs float64                       (tolerance 1e-5)
//   gpu_vs_cpu   float32 on cuda:0 vs the float64 CPU replay, timed on both sides  (tolerance 1e-5)
//                only when a CUDA device is present
//   second_order float64 second-order gradients (create_graph) vs central differences (tolerance 1e-6), and
//   gpu_second_order  float32 ones on cuda:0 vs float64 on the CPU (1e-4): rows with a differentiable backward
//   gpu_bf16     bfloat16 on cuda:0 (inputs rounded to bf16) vs float64 on the CPU from the same rounded inputs
//   gpu_f16      the same in float16; tolerance reduced_precision_tolerance: 4 unit roundoffs of the dtype
//                (bf16 2^-8, f16 2^-11) times the op's conditioning (graph/gradcheck.h); only with a device,
//                followed by a table of the worst error per op and dtype
// Exit status: 0 when every check passed, 1 when any failed, 2 for a usage error.
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dyngrad/dyngrad.h"
#include "../cli/command_line.h"

namespace {

using namespace dyngrad;

constexpr std::uint64_t kDefaultSeed = 1234;
constexpr double kFiniteDiffTolerance = 1e-6;
constexpr double kFloat32Tolerance = 1e-5;
constexpr double kGpuTolerance = 1e-5;
constexpr double kSecondOrderTolerance = 1e-6;
// float32 second-order gradients: two backward passes of rounding, through compositions for the losses and norms
constexpr double kGpuSecondOrderTolerance = 1e-4;

const char* const kUsage =
    "usage: dyngrad-verify [--op NAME[,NAME...]]... [--dtype all|f32|bf16|f16] [--json FILE] [--seed N] [--list]\n"
    "                      [--help]\n"
    "\n"
    "Checks every op of the op table on each of its cases:\n"
    "  finite_diff  float64 gradients vs central differences (CPU), tolerance 1e-6\n"
    "  f32_vs_f64   float32 output and gradients vs float64 (CPU), tolerance 1e-5\n"
    "  gpu_vs_cpu   float32 on cuda:0 vs the float64 CPU replay, tolerance 1e-5 (with a CUDA device)\n"
    "  second_order float64 second-order gradients (create_graph) vs central differences, tolerance 1e-6;\n"
    "               gpu_second_order: float32 ones on cuda:0 vs float64 on the CPU, tolerance 1e-4 (ops with a\n"
    "               differentiable backward, docs/ops.md)\n"
    "  gpu_bf16     bfloat16 on cuda:0 vs float64 on the CPU from the same rounded inputs, tolerance 4 x 2^-8\n"
    "  gpu_f16      float16 likewise, tolerance 4 x 2^-11 (both with a CUDA device; skipped, and said so, without)\n"
    "\n"
    "  --dtype D    only the checks of one dtype: f32 (finite_diff, f32_vs_f64, gpu_vs_cpu, the second order), bf16 or f16\n"
    "               (default all)\n"
    "  --op NAME    only these ops (repeatable or comma-separated; --list shows the names)\n"
    "  --json FILE  also write every result and the summary to FILE as JSON\n"
    "  --seed N     seed of the random inputs (default 1234); each op/case/check draws from its own\n"
    "               generator, so a run filtered with --op reproduces the numbers of a full run\n"
    "  --list       list the ops, their cases, PyTorch references, keywords and autocast policies, then exit\n"
    "\n"
    "Exit status: 0 when every check passed, 1 when any failed, 2 for a usage error.\n";

using cli::UsageError;

// Which dtype columns run (--dtype).
enum class DTypeColumns { All, F32, BF16, F16 };

struct Options {
    std::set<std::string> ops;  // empty: every op
    DTypeColumns dtypes = DTypeColumns::All;
    std::string json_path;
    std::uint64_t seed = kDefaultSeed;
    bool list = false;
    bool help = false;
};

struct Row {
    CheckResult result;
    bool gpu = false;  // a gpu_vs_cpu row: carries timings
    DType dtype = DType::f32;  // gpu_bf16 / gpu_f16 rows: theirs
};

// ---- command line ----

// Rows of the op table that have cases (the leaf row has none).
std::vector<const OpDef*> checkable_ops() {
    std::vector<const OpDef*> ops;
    for (const OpDef& def : op_table())
        if (!def.cases().empty()) ops.push_back(&def);
    return ops;
}

std::string op_names() {
    std::string names;
    for (const OpDef* def : checkable_ops()) names += str(names.empty() ? "" : ", ", def->name);
    return names;
}

// Every comma-separated name must be a checkable op: an empty or unknown name is an error, never "all".
void add_op_names(Options& options, std::string_view list) {
    std::size_t start = 0;
    while (start <= list.size()) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        const std::string name(list.substr(start, comma - start));
        if (name.empty())
            throw UsageError(str("--op: empty op name in '", list, "'; valid ops: ", op_names()));
        const OpDef* def = find_op(name);
        if (!def || def->cases().empty()) throw UsageError(str("--op: unknown op '", name, "'; valid ops: ", op_names()));
        options.ops.insert(name);
        start = comma + 1;
    }
}

Options parse_args(int argc, char** argv) {
    const cli::Arguments args(argc, argv, {.flags = {"--list"}, .options = {"--op", "--json", "--seed", "--dtype"},
                                           .repeatable = {"--op"}});
    Options options;
    for (const std::string& list : args.values("--op")) add_op_names(options, list);
    if (const auto dtype = args.value("--dtype")) {
        if (*dtype == "all")
            options.dtypes = DTypeColumns::All;
        else if (*dtype == "f32")
            options.dtypes = DTypeColumns::F32;
        else if (*dtype == "bf16")
            options.dtypes = DTypeColumns::BF16;
        else if (*dtype == "f16")
            options.dtypes = DTypeColumns::F16;
        else
            throw UsageError(str("--dtype: expects all, f32, bf16 or f16, got '", *dtype, "'"));
    }
    if (const auto json = args.value("--json")) options.json_path = cli::output_file("--json", *json);
    if (const auto seed = args.value("--seed"))
        options.seed = static_cast<std::uint64_t>(cli::parse_int("--seed", *seed, 0));
    options.list = args.has("--list");
    options.help = args.help();
    return options;
}

// ---- running the checks ----

// Each (op, case, check) draws from its own generator: results do not depend on which ops run.
Generator generator_for(std::uint64_t seed, const OpDef& def, const OpCase& op_case, std::string_view check) {
    return Generator(seed_for_name(seed, str(def.name, '/', op_case.label, '/', check)));
}

std::vector<Row> run_checks(const OpDef& def, const OpCase& op_case, std::uint64_t seed, bool gpu,
                            DTypeColumns dtypes) {
    std::vector<Row> rows;
    if (dtypes == DTypeColumns::All || dtypes == DTypeColumns::F32) {
        Generator fd_gen = generator_for(seed, def, op_case, "finite_diff");
        rows.push_back({finite_difference_check(def, op_case, fd_gen, kFiniteDiffTolerance), false});
        Generator f32_gen = generator_for(seed, def, op_case, "f32_vs_f64");
        rows.push_back({float32_check(def, op_case, f32_gen, kFloat32Tolerance), false});
        if (gpu) {
            Generator gpu_gen = generator_for(seed, def, op_case, "gpu_vs_cpu");
            rows.push_back({gpu_vs_cpu_check(def, op_case, gpu_gen, kGpuTolerance), true});
        }
        if (def.differentiable_backward != nullptr) {  // second order: rows with a differentiable backward
            Generator second_gen = generator_for(seed, def, op_case, "second_order");
            rows.push_back({higher_order_check(def, op_case, second_gen, 2, kSecondOrderTolerance), false});
            if (gpu) {
                Generator gpu_second_gen = generator_for(seed, def, op_case, "gpu_second_order");
                rows.push_back({gpu_second_order_check(def, op_case, gpu_second_gen, kGpuSecondOrderTolerance,
                                                       Device::cuda(0)),
                                false});
            }
        }
    }
    if (!gpu) return rows;  // the reduced-precision columns are GPU columns (the header says they are skipped)
    for (const DType dtype : {DType::bf16, DType::f16}) {
        if (dtypes != DTypeColumns::All && dtypes != (dtype == DType::bf16 ? DTypeColumns::BF16 : DTypeColumns::F16))
            continue;
        const char* check = dtype == DType::bf16 ? "gpu_bf16" : "gpu_f16";
        Generator gen = generator_for(seed, def, op_case, check);
        CheckResult r = reduced_precision_check(def, op_case, gen, dtype, reduced_precision_tolerance(def, dtype),
                                                Device::cuda(0));
        r.check = check;
        rows.push_back({std::move(r), false, dtype});
    }
    return rows;
}

// ---- the table ----

void print_header(bool gpu) {
    std::printf("%-13s %-20s %-20s %-11s %11s", "op", "case", "shapes", "check", "max_rel_err");
    if (gpu) std::printf(" %10s %10s %8s", "gpu ms", "cpu ms", "speedup");
    std::printf("  result\n");
}

void print_row(const Row& row, bool gpu) {
    const CheckResult& r = row.result;
    std::printf("%-13s %-20s %-20s %-11s %11.2e", r.op.c_str(), r.case_label.c_str(), r.shapes.c_str(),
                r.check.c_str(), r.max_rel_err);
    if (gpu && row.gpu)
        std::printf(" %10.3f %10.3f %7.1fx", r.gpu_ms, r.cpu_ms, r.gpu_ms > 0 ? r.cpu_ms / r.gpu_ms : 0.0);
    else if (gpu)
        std::printf(" %10s %10s %8s", "", "", "");
    std::printf("  %s\n", r.pass ? "PASS" : "FAIL");
    if (!r.pass && !r.detail.empty()) std::printf("    %s\n", r.detail.c_str());
    std::fflush(stdout);
}

// ---- the summary ----

struct Worst {
    std::string check;
    const CheckResult* result = nullptr;
};

struct GpuSummary {
    int rows = 0;
    double avg_rel_err = 0, max_rel_err = 0, max_abs_err = 0;
    double gpu_ms = 0, cpu_ms = 0;
    double speedup() const { return gpu_ms > 0 ? cpu_ms / gpu_ms : 0.0; }
};

struct Summary {
    int ops = 0;
    int checks = 0;
    int passed = 0;
    std::vector<Worst> worst;  // one per check type, in order of first appearance
    GpuSummary gpu;
    double seconds = 0;
    int failed() const { return checks - passed; }
};

Summary summarize(const std::vector<Row>& rows, int ops, double seconds) {
    Summary s;
    s.ops = ops;
    s.seconds = seconds;
    for (const Row& row : rows) {
        const CheckResult& r = row.result;
        ++s.checks;
        s.passed += r.pass ? 1 : 0;
        auto it = std::find_if(s.worst.begin(), s.worst.end(), [&](const Worst& w) { return w.check == r.check; });
        if (it == s.worst.end()) it = s.worst.insert(s.worst.end(), Worst{r.check, &r});
        // `!(a <= b)` also picks a NaN error as the worst.
        if (!(r.max_rel_err <= it->result->max_rel_err)) it->result = &r;
        if (!row.gpu) continue;
        GpuSummary& g = s.gpu;
        ++g.rows;
        g.avg_rel_err += r.max_rel_err;
        g.max_rel_err = std::max(g.max_rel_err, r.max_rel_err);
        g.max_abs_err = std::max(g.max_abs_err, r.max_abs_err);
        g.gpu_ms += r.gpu_ms;
        g.cpu_ms += r.cpu_ms;
    }
    if (s.gpu.rows > 0) s.gpu.avg_rel_err /= s.gpu.rows;
    return s;
}

// One line per fused op and pass: how many shapes were checked against the unfused composition, the worst
// error relative to the composition's largest magnitude, and whether all agreed.
void print_fusion_checks(const std::vector<FusionCheckResult>& results) {
    struct Line {
        int count = 0, failed = 0;
        double worst = 0;
    };
    std::map<std::string, Line> lines;
    for (const FusionCheckResult& r : results) {
        const std::string pass = r.pass.starts_with("backward") ? "backward" : r.pass;
        Line& line = lines[str(r.op, " ", pass, r.key.find("cuda") != std::string::npos ? " (GPU)" : "")];
        ++line.count;
        line.failed += r.passed ? 0 : 1;
        line.worst = std::max(line.worst, r.max_abs_error / std::max(r.scale, 1e-30));
    }
    std::printf("\nfused kernels vs their unfused compositions (graph/fusion_check.h):\n");
    if (lines.empty()) std::printf("  none ran\n");
    for (const auto& [name, line] : lines)
        std::printf("  %-32s %3d checks, worst %.2e relative: %s\n", name.c_str(), line.count, line.worst,
                    line.failed == 0 ? "agree" : "DISAGREE");
}

void print_summary(const Summary& s) {
    std::printf("\n%d ops, %d checks: %d passed, %d failed (%.1f s)\n", s.ops, s.checks, s.passed, s.failed(),
                s.seconds);
    for (const Worst& w : s.worst)
        std::printf("  worst %-11s %.2e  (%s / %s)\n", w.check.c_str(), w.result->max_rel_err,
                    w.result->op.c_str(), w.result->case_label.c_str());
    const GpuSummary& g = s.gpu;
    if (g.rows > 0) {
        std::printf("GPU vs CPU over %d checks: average difference %.2e, max difference %.2e (relative norm), "
                    "max abs %.2e\n",
                    g.rows, g.avg_rel_err, g.max_rel_err, g.max_abs_err);
        std::printf("GPU %.3f ms, CPU (float64 replay) %.3f ms: overall speedup %.1fx\n", g.gpu_ms, g.cpu_ms,
                    g.speedup());
    }
    std::printf("%s\n", s.failed() == 0 ? "ALL PASS" : "FAILED");
}

// The worst error per op in each reduced dtype (gpu_bf16 / gpu_f16 rows), in units of the tolerance too.
void print_reduced_table(const std::vector<Row>& rows) {
    struct Cell {
        double err = -1, tolerance = 0;
    };
    std::vector<std::pair<std::string, std::array<Cell, 2>>> table;
    for (const Row& row : rows) {
        if (!is_reduced_precision(row.dtype)) continue;
        auto it = std::find_if(table.begin(), table.end(), [&](const auto& e) { return e.first == row.result.op; });
        if (it == table.end()) it = table.insert(table.end(), {row.result.op, {}});
        Cell& cell = it->second[row.dtype == DType::bf16 ? 0 : 1];
        if (!(row.result.max_rel_err <= cell.err)) cell.err = row.result.max_rel_err;
        cell.tolerance = row.result.tolerance;
    }
    if (table.empty()) return;
    std::printf("\nreduced precision on the GPU: worst relative-norm error per op (output and gradients)\n");
    std::printf("%-32s %11s %11s %11s %11s\n", "op", "bf16 err", "bf16 tol", "f16 err", "f16 tol");
    for (const auto& [op, cells] : table) {
        std::printf("%-32s", op.c_str());
        for (const Cell& c : cells) {
            if (c.err < 0)
                std::printf(" %11s %11s", "-", "-");
            else
                std::printf(" %11.2e %11.2e", c.err, c.tolerance);
        }
        std::printf("\n");
    }
}

// ---- JSON ----

std::string json_string(std::string_view text) {
    std::string out = "\"";
    for (const char c : text) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char escaped[8];
                    std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
                    out += escaped;
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

// Shortest text that reads back as the same double; JSON has no NaN or Inf, so those become null.
std::string json_number(double value) {
    if (!std::isfinite(value)) return "null";
    char text[32];
    const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
    return std::string(text, end);
}

const char* json_bool(bool value) { return value ? "true" : "false"; }

void write_result(std::ostream& out, const Row& row) {
    const CheckResult& r = row.result;
    out << "{\"op\": " << json_string(r.op) << ", \"case\": " << json_string(r.case_label)
        << ", \"shapes\": " << json_string(r.shapes) << ", \"check\": " << json_string(r.check)
        << ", \"max_rel_err\": " << json_number(r.max_rel_err) << ", \"max_abs_err\": " << json_number(r.max_abs_err)
        << ", \"tolerance\": " << json_number(r.tolerance) << ", \"pass\": " << json_bool(r.pass)
        << ", \"dtype\": " << json_string(dtype_name(is_reduced_precision(row.dtype) ? row.dtype : DType::f32));
    if (row.gpu)
        out << ", \"gpu_ms\": " << json_number(r.gpu_ms) << ", \"cpu_ms\": " << json_number(r.cpu_ms)
            << ", \"speedup\": " << json_number(r.gpu_ms > 0 ? r.cpu_ms / r.gpu_ms : 0.0);
    out << ", \"detail\": " << json_string(r.detail) << "}";
}

void write_summary(std::ostream& out, const Summary& s) {
    out << "{\"ops\": " << s.ops << ", \"checks\": " << s.checks << ", \"passed\": " << s.passed
        << ", \"failed\": " << s.failed() << ", \"pass\": " << json_bool(s.failed() == 0)
        << ", \"seconds\": " << json_number(s.seconds) << ",\n    \"worst\": {";
    for (std::size_t i = 0; i < s.worst.size(); ++i) {
        const CheckResult& r = *s.worst[i].result;
        out << (i ? ", " : "") << json_string(s.worst[i].check) << ": {\"max_rel_err\": " << json_number(r.max_rel_err)
            << ", \"op\": " << json_string(r.op) << ", \"case\": " << json_string(r.case_label) << "}";
    }
    out << "}";
    const GpuSummary& g = s.gpu;
    if (g.rows > 0)
        out << ",\n    \"gpu_vs_cpu\": {\"checks\": " << g.rows << ", \"avg_rel_err\": " << json_number(g.avg_rel_err)
            << ", \"max_rel_err\": " << json_number(g.max_rel_err) << ", \"max_abs_err\": "
            << json_number(g.max_abs_err) << ", \"gpu_ms\": " << json_number(g.gpu_ms)
            << ", \"cpu_ms\": " << json_number(g.cpu_ms) << ", \"speedup\": " << json_number(g.speedup()) << "}";
    out << "}";
}

struct RunInfo {
    std::string device;
    std::string cpu;
    bool cuda = false;
    std::uint64_t seed = 0;
};

void write_json(std::ostream& out, const RunInfo& info, const std::vector<Row>& rows, const Summary& s) {
    out << "{\n  \"device\": " << json_string(info.device) << ",\n  \"cpu\": " << json_string(info.cpu)
        << ",\n  \"dyngrad_version\": " << json_string(DYNGRAD_VERSION_STRING)
        << ",\n  \"cuda\": " << json_bool(info.cuda) << ",\n  \"seed\": " << info.seed << ",\n  \"results\": [";
    for (std::size_t i = 0; i < rows.size(); ++i) {
        out << (i ? ",\n    " : "\n    ");
        write_result(out, rows[i]);
    }
    out << "\n  ],\n  \"summary\": ";
    write_summary(out, s);
    out << "\n}\n";
}

// ---- devices ----

// The "model name" line of /proc/cpuinfo.
std::string cpu_name() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (!line.starts_with("model name")) continue;
        const auto colon = line.find(':');
        if (colon == std::string::npos) break;
        const auto start = line.find_first_not_of(" \t", colon + 1);
        return start == std::string::npos ? std::string("unknown CPU") : line.substr(start);
    }
    return "unknown CPU";
}

// The runtime API (cuda/runtime.h) has no device-name query yet: the GPU is named by its index.
std::string gpu_name() { return cuda::device_name(0); }

int run(const Options& options) {
    const std::vector<const OpDef*> ops = checkable_ops();
    if (options.list) {
        for (const OpDef* def : ops) {
            std::printf("%-13s", def->name);
            const std::vector<OpCase> cases = def->cases();
            for (std::size_t i = 0; i < cases.size(); ++i) std::printf("%s%s", i ? ", " : "  ", cases[i].label.c_str());
            // The row's PyTorch reference, its Python keywords and its autocast policy (graph/op_def.h).
            std::printf("\n%-13s  torch: %s\n%-13s  keywords: %s; autocast: %s\n", "", def->torch ? def->torch : "-", "",
                        attr_keywords_text(*def).c_str(), std::string(autocast_policy_name(*def->autocast)).c_str());
        }
        return 0;
    }

    // Open the JSON file first: a bad path fails before the checks run, not after.
    std::ofstream json;
    if (!options.json_path.empty()) {
        json.open(options.json_path);
        if (!json) throw UsageError(str("cannot write '", options.json_path, "'"));
    }

    RunInfo info;
    info.cuda = cuda_device_count() > 0;
    info.cpu = cpu_name();
    info.device = info.cuda ? gpu_name() : info.cpu;
    info.seed = options.seed;
    std::printf("dyngrad-verify %s  seed %llu\n", DYNGRAD_VERSION_STRING, static_cast<unsigned long long>(options.seed));
    if (info.cuda)
        std::printf("device: %s  cpu: %s\n", info.device.c_str(), info.cpu.c_str());
    else
        std::printf("device: %s  (no CUDA device: %s; gpu_vs_cpu, gpu_bf16 and gpu_f16 checks skipped)\n",
                    info.cpu.c_str(), cuda_compiled() ? "none found" : "CUDA backend not compiled in");
    std::printf("\n");

    // Every fused kernel's first use per shape is also compared with its unfused composition (a disagreement
    // fails the row whose check ran it); the summary lists them.
    set_fusion_check(true);
    const auto start = std::chrono::steady_clock::now();
    print_header(info.cuda);
    std::vector<Row> rows;
    int ops_run = 0;
    for (const OpDef* def : ops) {
        if (!options.ops.empty() && !options.ops.contains(def->name)) continue;
        ++ops_run;
        for (const OpCase& op_case : def->cases()) {
            for (Row& row : run_checks(*def, op_case, options.seed, info.cuda, options.dtypes)) {
                print_row(row, info.cuda);
                rows.push_back(std::move(row));
            }
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const Summary summary = summarize(rows, ops_run, seconds);
    print_fusion_checks(fusion_check_results());
    print_reduced_table(rows);
    if (!info.cuda && options.dtypes != DTypeColumns::F32)
        std::printf("\nreduced precision (gpu_bf16, gpu_f16): SKIPPED, no CUDA device\n");
    print_summary(summary);

    if (json.is_open()) {
        write_json(json, info, rows, summary);
        json.close();
        if (!json) throw std::runtime_error(str("writing '", options.json_path, "' failed"));
        std::printf("results written to %s\n", options.json_path.c_str());
    }
    return summary.failed() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options options = parse_args(argc, argv);
        if (options.help) {
            std::fputs(kUsage, stdout);
            return 0;
        }
        return run(options);
    } catch (const UsageError& e) {
        std::fprintf(stderr, "dyngrad-verify: %s\n(--help shows the usage)\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dyngrad-verify: error: %s\n", e.what());
        return 1;
    }
}
