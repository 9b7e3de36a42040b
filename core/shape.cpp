#include "dyngrad/core/shape.h"

#include "dyngrad/core/checked.h"
#include "dyngrad/core/error.h"

namespace dyngrad {

std::int64_t numel(const Shape& shape) { return checked_numel(shape, "numel"); }

std::string to_string(const Shape& shape) {
    std::string out = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) out += ",";
        out += std::to_string(shape[i]);
    }
    return out + ")";
}

std::vector<std::int64_t> contiguous_strides(const Shape& shape) {
    std::vector<std::int64_t> strides(shape.size());
    std::int64_t stride = 1;
    for (std::size_t i = shape.size(); i-- > 0;) {
        strides[i] = stride;
        stride = checked_mul(stride, shape[i], "contiguous_strides");
    }
    return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
    const std::size_t rank = std::max(a.size(), b.size());
    Shape out(rank);
    for (std::size_t i = 0; i < rank; ++i) {
        const std::int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
        const std::int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
        if (da != db && da != 1 && db != 1)
            throw ShapeError(str("shapes ", to_string(a), " and ", to_string(b), " do not broadcast"));
        out[i] = da == 1 ? db : da;
    }
    // Two empty inputs can broadcast to a shape whose non-zero dims no int64 can count.
    if (try_numel(out) < 0)
        checked_numel(out, str("shapes ", to_string(a), " and ", to_string(b), " broadcast to ", to_string(out)));
    return out;
}

int normalize_axis(std::int64_t axis, std::size_t rank) {
    const auto r = static_cast<std::int64_t>(rank);
    if (axis < -r || axis >= r)
        throw ShapeError(str("axis ", axis, " is out of range for rank ", rank));
    return static_cast<int>(axis < 0 ? axis + r : axis);
}

}  // namespace dyngrad
