// dyngrad-export-cases: writes every op-table case's float64 inputs and a random output weight w, so
// that bench/make_goldens.py can compute the independent reference (PyTorch, float64) of tests/test_golden.cpp.
//
//   dyngrad-export-cases DIR [--seed N]
//
// One file DIR/<op>.safetensors per op-table row with cases. Tensors "<k>.x<i>" (input i of case k; labels
// stay int64) and "<k>.w" (the weight of L = Σ w·y, the output's shape); metadata "op" (the row's name) and
// "cases", a JSON array with one object per case: label, the inputs whose gradient is checked ("grad"), and
// every attribute of OpAttrs that a case can set (the reference picks the ones its op reads; the later optional
// ones only where set: optional_attrs); and, for
// readers without a JSON parser, "count" (number of cases) and "<k>.label".
// Exit status: 0 on success, 1 when a file cannot be written, 2 for a usage error.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
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

// 17 significant digits: every double survives the round trip through the text.
std::string number(double value) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.17g", value);
    return buffer;
}

// Attributes added later are written only where a case sets them (the reference reads them with a default),
// so adding one leaves the goldens of every other op unchanged.
const char* reduction_name(Reduction reduction);

std::string optional_attrs(const OpAttrs& a) {
    std::string out;
    if (a.clamp_min) out += str(", \"clamp_min\": ", number(*a.clamp_min));
    if (a.clamp_max) out += str(", \"clamp_max\": ", number(*a.clamp_max));
    if (a.gelu_approximation == GeluApproximation::Tanh) out += ", \"gelu_approximate\": \"tanh\"";
    if (a.padding_idx >= 0) out += str(", \"padding_idx\": ", a.padding_idx);
    if (a.reduction != Reduction::Mean) out += str(", \"reduction\": ", quoted(reduction_name(a.reduction)));
    if (a.ignore_index != -100) out += str(", \"ignore_index\": ", a.ignore_index);
    if (a.label_smoothing != 0) out += str(", \"label_smoothing\": ", number(a.label_smoothing));
    if (a.is_causal) out += ", \"is_causal\": true";
    if (a.attention_scale) out += str(", \"attention_scale\": ", number(*a.attention_scale));
    if (a.dtype != DType::f32) out += str(", \"dtype\": ", quoted(std::string(dtype_name(a.dtype))));
    if (a.descending) out += ", \"descending\": true";
    if (a.replacement) out += ", \"replacement\": true";
    return out;
}

template <typename Range>
std::string int_list(const Range& values) {
    std::string out = "[";
    for (const auto v : values) out += str(out.size() > 1 ? ", " : "", v);
    return out + "]";
}

const char* reduction_name(Reduction reduction) {
    switch (reduction) {
        case Reduction::Mean: return "mean";
        case Reduction::Sum: return "sum";
        case Reduction::None: return "none";
    }
    return "?";
}

std::string attrs_json(const OpAttrs& a) {
    std::ostringstream out;
    out << "{\"scalar\": " << number(a.scalar) << ", \"axes\": " << int_list(a.axes) << ", \"axis\": " << a.axis
        << ", \"start\": " << a.start << ", \"length\": " << a.length
        << ", \"keepdim\": " << (a.keepdim ? "true" : "false") << ", \"shape\": " << int_list(a.shape)
        << ", \"kernel\": " << int_list(a.kernel) << ", \"stride\": " << int_list(a.stride)
        << ", \"padding\": " << int_list(a.padding) << ", \"dilation\": " << int_list(a.dilation)
        << ", \"groups\": " << a.groups << ", \"training\": " << (a.training ? "true" : "false")
        << ", \"eps\": " << number(a.eps) << ", \"momentum\": " << number(a.momentum)
        << ", \"seed\": " << quoted(std::to_string(a.seed))  // a string: JSON numbers lose 64-bit integers
        << ", \"activation\": " << quoted(a.activation == Activation::Relu ? "relu" : "none")
        << ", \"rnn_mode\": " << quoted(rnn_mode_name(a.rnn_mode)) << ", \"hidden_size\": " << a.hidden_size
        << ", \"num_layers\": " << a.num_layers << ", \"bidirectional\": " << (a.bidirectional ? "true" : "false")
        << optional_attrs(a) << "}";
    return out.str();
}

void export_op(const OpDef& def, const std::filesystem::path& dir, std::uint64_t seed) {
    TensorMap tensors;
    SafetensorsMetadata metadata{{"op", def.name}};
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
        metadata[str(k, ".label")] = c.label;
        cases += str(k ? ",\n " : "", "{\"label\": ", quoted(c.label), ", \"grad\": ", grad,
                     "], \"attrs\": ", attrs_json(c.attrs), "}");
    }
    metadata["cases"] = cases + "]";
    metadata["count"] = std::to_string(op_cases.size());
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
