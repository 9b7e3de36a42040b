// PyTorch's tensor printing (torch/_tensor_str.py with its default print options: precision 4, threshold 1000,
// edgeitems 3, linewidth 80), shared by the C++ operator<< and Python's repr, so a user comparing dyngrad's
// output with PyTorch's sees the same digits, widths, nesting and summarisation.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "dyngrad/core/error.h"
#include "dyngrad/core/tensor.h"

namespace dyngrad {
namespace {

constexpr int kPrecision = 4;
constexpr std::int64_t kThreshold = 1000;  // more elements than this: summarised
constexpr std::int64_t kEdgeItems = 3;
constexpr std::size_t kLineWidth = 80;

std::string printf_string(const char* format, double value) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, format, kPrecision, value);
    return buffer;
}

// torch's _Formatter: one width and mode for every element printed (computed over the summarised values).
struct Formatter {
    bool floating = true;
    bool int_mode = true;
    bool sci_mode = false;
    std::size_t width = 1;

    Formatter(const std::vector<double>& values, bool is_floating) : floating(is_floating) {
        if (!floating) {
            for (double v : values) width = std::max(width, std::to_string(static_cast<std::int64_t>(v)).size());
            return;
        }
        double lo = INFINITY, hi = 0;
        bool any = false;
        for (double v : values) {
            if (!std::isfinite(v) || v == 0) continue;  // torch: nonzero finite values only
            any = true;
            lo = std::min(lo, std::fabs(v));
            hi = std::max(hi, std::fabs(v));
            if (v != std::ceil(v)) int_mode = false;
        }
        if (!any) return;
        sci_mode = hi / lo > 1000.0 || hi > 1.0e8 || (!int_mode && lo < 1.0e-4);
        for (double v : values) {
            if (!std::isfinite(v) || v == 0) continue;
            const std::size_t w = sci_mode ? printf_string("%.*e", v).size()
                                  : int_mode ? printf_string("%.0f", v).size() + 1  // the "." it gets
                                             : printf_string("%.*f", v).size();
            width = std::max(width, w);
        }
    }

    std::string format(double v) const {
        std::string s;
        if (!floating) s = std::to_string(static_cast<std::int64_t>(v));
        else if (std::isnan(v)) s = "nan";  // not printf's "-nan"
        else if (sci_mode) s = printf_string("%.*e", v);
        else if (int_mode) s = printf_string("%.0f", v) + (std::isinf(v) ? "" : ".");
        else s = printf_string("%.*f", v);
        return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
    }
};

struct Printer {
    const std::vector<double>& values;
    const Shape& shape;
    std::vector<std::int64_t> strides;
    bool summarize;

    // The indices of axis `axis` that are printed (all, or the first and last kEdgeItems with a gap, -1).
    std::vector<std::int64_t> picks(std::size_t axis) const {
        const std::int64_t n = shape[axis];
        std::vector<std::int64_t> out;
        if (summarize && n > 2 * kEdgeItems) {
            for (std::int64_t i = 0; i < kEdgeItems; ++i) out.push_back(i);
            out.push_back(-1);
            for (std::int64_t i = n - kEdgeItems; i < n; ++i) out.push_back(i);
        } else {
            for (std::int64_t i = 0; i < n; ++i) out.push_back(i);
        }
        return out;
    }

    void collect(std::size_t axis, std::int64_t offset, std::vector<double>& out) const {
        if (axis == shape.size()) return out.push_back(values[static_cast<std::size_t>(offset)]);
        for (std::int64_t i : picks(axis))
            if (i >= 0) collect(axis + 1, offset + i * strides[axis], out);
    }

    std::string str(std::size_t axis, std::int64_t offset, std::size_t indent, const Formatter& f) const {
        if (axis == shape.size()) return f.format(values[static_cast<std::size_t>(offset)]);
        const std::size_t rest = shape.size() - axis;
        std::vector<std::string> items;
        if (rest == 1) {  // torch's _vector_str: wrapped at the line width
            for (std::int64_t i : picks(axis))
                items.push_back(i < 0 ? " ..." : f.format(values[static_cast<std::size_t>(offset + i * strides[axis])]));
            const std::size_t per_line = std::max<std::size_t>(1, (kLineWidth - std::min(indent, kLineWidth)) / (f.width + 2));
            std::string out = "[";
            for (std::size_t i = 0; i < items.size(); ++i) {
                if (i % per_line == 0 && i) out.append(",\n").append(indent + 1, ' ');
                else if (i) out += ", ";
                out += items[i];
            }
            return out + "]";
        }
        for (std::int64_t i : picks(axis))
            items.push_back(i < 0 ? "..." : str(axis + 1, offset + i * strides[axis], indent + 1, f));
        std::string separator(1, ',');  // appended, not "," + ...: GCC 12 warns (-Wrestrict) on that form
        separator.append(rest - 1, '\n').append(indent + 1, ' ');
        std::string out = "[";
        for (std::size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
        return out + "]";
    }
};

}  // namespace

std::string format_tensor(const Tensor& t, const std::vector<std::string>& extra) {
    if (!t.defined()) return "tensor(undefined)";
    constexpr std::size_t kIndent = 7;  // len("tensor(")
    std::vector<std::string> suffixes;
    std::string body;
    if (t.numel() == 0) {
        body = "[]";
        if (t.rank() != 1) {
            std::string size = "size=(";
            for (std::size_t i = 0; i < t.rank(); ++i) size += (i ? ", " : "") + std::to_string(t.shape()[i]);
            suffixes.push_back(size + ")");
        }
    } else {
        const std::vector<double> values = t.to_vector();  // through the host for a device tensor (a sync)
        Printer p{values, t.shape(), std::vector<std::int64_t>(t.rank(), 1), t.numel() > kThreshold};
        for (std::size_t i = t.rank(); i-- > 1;) p.strides[i - 1] = p.strides[i] * t.shape()[i];
        std::vector<double> shown;
        p.collect(0, 0, shown);
        const Formatter f(shown, t.dtype() != DType::i64);
        body = p.str(0, 0, kIndent, f);
    }
    if (!t.device().is_cpu()) suffixes.push_back("device='" + t.device().to_string() + "'");
    // torch shows the dtype unless it is the default float or int64 (and always for an empty tensor's non-float)
    if (t.numel() == 0 ? t.dtype() != DType::f32 : (t.dtype() != DType::f32 && t.dtype() != DType::i64))
        suffixes.push_back("dtype=dyngrad." + std::string(dtype_name(t.dtype())));
    std::string out = "tensor(" + body;
    for (const std::string& s : suffixes) out += ", " + s;
    for (const std::string& s : extra) out += ", " + s;
    return out + ")";
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) { return out << format_tensor(t); }

}  // namespace dyngrad
