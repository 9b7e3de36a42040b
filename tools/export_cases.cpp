// dyngrad-export-cases: writes every op-table case's float64 inputs and a random output weight w, so
// that tools/make_goldens.py can compute the independent reference (PyTorch, float64) of tests/verification/test_golden.cpp.
//
//   dyngrad-export-cases DIR [--seed N]
//
// One file DIR/<op>.safetensors per op-table row with cases. Tensors "<k>.x<i>" (input i of case k; labels
// stay int64) and "<k>.w" (the weight of L = Σ w·y, the output's shape); metadata "op" (the row's name), "torch"
// (the row's PyTorch expression) and "cases", a JSON array with one object per case: label, the inputs whose
// gradient is checked ("grad"), and "attrs": every attribute the op reads (its row's list from the field table
// of graph/op_def.h), by field name: numbers, booleans, int lists, choice names as strings, an absent optional as
// null, the uint64 seed as a string; and, for readers without a JSON parser, "count" (number of cases) and
// "<k>.label". Rows with a differentiable backward (graph/higher_order.h) also get "<k>.v<i>", a direction per
// checked input for the second-order references (metadata "second_order": "true").
// Exit status: 0 on success, 1 when a file cannot be written, 2 for a usage error.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>

#include "dyngrad/dyngrad.h"

namespace {

using namespace dyngrad;

constexpr std::uint64_t kDefaultSeed = 20261122;

// FNV-1a: the same on every platform, so each case's inputs depend only on the seed and its names.
std::uint64_t fnv1a(std::string_view text) {
    std::uint64_t hash = 14695981039346656037ull;
    for (const char c : text) {
        hash ^= static_cast<unsigned char>(c);
        hash *= 1099511628211ull;
    }
    return hash;
}

std::string quoted(std::string_view text) {
    std::string out = "\"";
    for (const char c : text) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

// Every attribute the op reads (its row's field list, graph/op_def.h), each by its field's name and kind.
std::string attrs_json(const OpDef& def, const OpAttrs& a) {
    std::string out;
    for (std::size_t i = 0; i < kAttrFieldCount; ++i)
        if (def.attrs.contains(i))
            out += str(out.empty() ? "" : ", ", quoted(kAttrFields[i].name), ": ", attr_value_text(kAttrFields[i], a, true));
    return "{" + out + "}";
}

void export_op(const OpDef& def, const std::filesystem::path& dir, std::uint64_t seed) {
    TensorMap tensors;
    SafetensorsMetadata metadata{{"op", def.name}, {"torch", def.torch ? def.torch : ""}};
    std::string cases = "[";
    const std::vector<OpCase> op_cases = def.cases();
    for (std::size_t k = 0; k < op_cases.size(); ++k) {
        const OpCase& c = op_cases[k];
        Generator gen(seed ^ fnv1a(str(def.name, "/", c.label)));
        const std::vector<Tensor> inputs = make_case_inputs(c, DType::f64, gen);
        const Tensor output = run_op(def, c, inputs, Tensor()).output;
        std::string grad = "[";
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            tensors[str(k, ".x", i)] = inputs[i];
            grad += str(i ? ", " : "", gradient_checked(c, i, inputs[i]) ? "true" : "false");
        }
        tensors[str(k, ".w")] = Tensor::normal(output.shape(), 0.0, 1.0, gen, DType::f64);
        // Second order (rows with a differentiable backward): a direction v_i per checked input, drawn after w so
        // that the first-order tensors stay as they were; make_goldens.py differentiates S = Σ_i <dL/dx_i, v_i>.
        if (def.differentiable_backward != nullptr)
            for (std::size_t i = 0; i < inputs.size(); ++i)
                if (gradient_checked(c, i, inputs[i]))
                    tensors[str(k, ".v", i)] = Tensor::normal(inputs[i].shape(), 0.0, 1.0, gen, DType::f64);
        metadata[str(k, ".label")] = c.label;
        cases += str(k ? ",\n " : "", "{\"label\": ", quoted(c.label), ", \"grad\": ", grad,
                     "], \"attrs\": ", attrs_json(def, c.attrs), "}");
    }
    metadata["cases"] = cases + "]";
    metadata["count"] = std::to_string(op_cases.size());
    metadata["second_order"] = def.differentiable_backward != nullptr ? "true" : "false";
    save_safetensors(dir / str(def.name, ".safetensors"), tensors, metadata);
}

}  // namespace

int main(int argc, char** argv) {
    std::filesystem::path dir;
    std::uint64_t seed = kDefaultSeed;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--seed" && i + 1 < argc) {
            const std::string_view text = argv[++i];
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seed);
            if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
                std::cerr << "dyngrad-export-cases: --seed needs a non-negative integer, got '" << text << "'\n";
                return 2;
            }
        } else if (dir.empty() && !arg.empty() && !arg.starts_with("-")) {
            dir = arg;
        } else {
            std::cerr << "usage: dyngrad-export-cases DIR [--seed N]\n";
            return 2;
        }
    }
    if (dir.empty()) {
        std::cerr << "usage: dyngrad-export-cases DIR [--seed N]\n";
        return 2;
    }
    try {
        std::filesystem::create_directories(dir);
        int ops = 0, cases = 0;
        for (const OpDef& def : op_table()) {
            if (def.cases().empty()) continue;
            export_op(def, dir, seed);
            ++ops;
            cases += static_cast<int>(def.cases().size());
        }
        std::cout << "exported " << ops << " ops, " << cases << " cases to " << dir.string() << "\n";
    } catch (const std::exception& e) {
        std::cerr << "dyngrad-export-cases: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
