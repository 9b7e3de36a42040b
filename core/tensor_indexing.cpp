// Tensor's indexing methods (core/tensor.h) and their rules (core/tensor_indexing.h). squeeze, unsqueeze and
// flatten are views (reshaped); select and narrow copy a window of rows: `outer` blocks of length·inner
// elements, one memcpy per block on the CPU and one strided copy on a device (core/device_memory.h). Their errors
// read as the layout ops' eager calls did ("narrow (eager at f.cpp:3) with inputs ...").
#include "dyngrad/core/tensor_indexing.h"

#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "dyngrad/core/device_memory.h"
#include "dyngrad/core/error.h"

namespace dyngrad {

namespace {

// `axis` of a rank-`rank` shape, negative from the end; ShapeError naming the call and the operand otherwise.
int axis_of(const char* op, const Tensor& x, std::int64_t axis, std::size_t rank, std::source_location where) {
    const auto r = static_cast<std::int64_t>(rank);
    if (axis < -r || axis >= r)
        throw ShapeError(str(op, " at ", describe_site(where), ": axis ", axis, " is out of range for ", describe(x),
                             " (valid: ", -r, " to ", r - 1, ")"));
    return static_cast<int>(axis < 0 ? axis + r : axis);
}

// "narrow (eager at f.cpp:3)": the prefix the eager op call gave these errors.
std::string eager_call(const char* op, std::source_location where) {
    return str(op, " (eager at ", describe_site(where), ")");
}

void require_operand(const Tensor& x, const char* op, std::source_location where) {
    if (!x.defined()) throw ValueError(str(eager_call(op, where), ": input 0 is an undefined tensor"));
}

// `rows` blocks of `block` bytes on `device`: block r from `from` + r·src_pitch to `to` + r·dst_pitch.
void copy_blocks(Device device, void* to, std::size_t dst_pitch, const void* from, std::size_t src_pitch,
                 std::size_t block, std::size_t rows) {
    if (block == 0 || rows == 0) return;
    if (device.is_cpu()) {
        for (std::size_t r = 0; r < rows; ++r)
            std::memcpy(static_cast<unsigned char*>(to) + r * dst_pitch,
                        static_cast<const unsigned char*>(from) + r * src_pitch, block);
        return;
    }
    device_memory::copy_blocks(to, dst_pitch, from, src_pitch, block, rows, device.index);
}

}  // namespace

namespace indexing {

std::pair<int, std::int64_t> select_at(const Tensor& x, std::int64_t axis, std::int64_t index,
                                       std::source_location where) {
    const int a = axis_of("select", x, axis, x.rank(), where);
    const std::int64_t n = x.shape()[a];
    if (index < -n || index >= n)
        throw IndexError(str("select at ", describe_site(where), ": index ", index, " is out of range for axis ", axis,
                             " of size ", n, " of ", describe(x), " (valid: ", -n, " to ", n - 1, ")"));
    return {a, index < 0 ? index + n : index};
}

Shape without_axis(const Shape& shape, int axis) {
    Shape out = shape;
    out.erase(out.begin() + axis);
    return out;
}

Shape squeezed_shape(const Tensor& x, std::int64_t axis, std::source_location where) {
    const int a = axis_of("squeeze", x, axis, x.rank(), where);
    if (x.shape()[a] != 1)
        throw ShapeError(str("squeeze at ", describe_site(where), ": axis ", axis, " of ", describe(x), " has size ",
                             x.shape()[a], ", not 1"));
    return without_axis(x.shape(), a);
}

Shape unsqueezed_shape(const Tensor& x, std::int64_t axis, std::source_location where) {
    const int a = axis_of("unsqueeze", x, axis, x.rank() + 1, where);
    Shape out = x.shape();
    out.insert(out.begin() + a, 1);
    return out;
}

Shape flattened_shape(const Tensor& x, std::int64_t start_axis, std::int64_t end_axis, std::source_location where) {
    const Shape shape = x.rank() == 0 ? Shape{1} : x.shape();
    const int start = axis_of("flatten", x, start_axis, shape.size(), where);
    const int end = axis_of("flatten", x, end_axis, shape.size(), where);
    if (start > end)
        throw ShapeError(str("flatten at ", describe_site(where), ": start axis ", start_axis, " comes after end axis ",
                             end_axis, " of ", describe(x)));
    Shape out(shape.begin(), shape.begin() + start);
    out.push_back(numel(Shape(shape.begin() + start, shape.begin() + end + 1)));
    out.insert(out.end(), shape.begin() + end + 1, shape.end());
    return out;
}

Shape narrowed_shape(const Shape& x, std::int64_t axis, std::int64_t start, std::int64_t length) {
    const int a = normalize_axis(axis, x.size());
    if (length < 0) throw ValueError(str("length ", length, " is negative"));
    const std::int64_t size = x[a];
    // start > size - length rather than start + length > size, which wraps for a start near INT64_MAX.
    if (start < 0 || start > size - length) {
        const bool end_fits = start <= std::numeric_limits<std::int64_t>::max() - length;
        const std::string end = end_fits ? str(start + length) : str(start, " + ", length);
        throw IndexError(str("indices [", start, ", ", end, ") are outside axis ", a, " of size ", size));
    }
    Shape out = x;
    out[a] = length;
    return out;
}

}  // namespace indexing

Tensor Tensor::narrow(std::int64_t axis, std::int64_t start, std::int64_t length, std::source_location where) const {
    require_operand(*this, "narrow", where);
    Shape shape;
    try {
        shape = indexing::narrowed_shape(shape_, axis, start, length);
    } catch (const std::exception&) {
        rethrow_with_context(str(eager_call("narrow", where), " with inputs ", describe(*this)));
    }
    // x (outer, size, inner)[:, start:start+length, :] -> y (outer, length, inner): `outer` blocks of bytes.
    const int a = normalize_axis(axis, rank());
    const std::int64_t outer = dyngrad::numel(Shape(shape_.begin(), shape_.begin() + a));
    const std::int64_t inner = dyngrad::numel(Shape(shape_.begin() + a + 1, shape_.end()));
    const std::size_t element = dtype_size(dtype_), row = static_cast<std::size_t>(inner) * element;
    const std::size_t window = static_cast<std::size_t>(length) * row;
    Tensor y = Tensor::empty(shape, dtype_, device());
    const auto* from = static_cast<const unsigned char*>(raw_data()) + static_cast<std::size_t>(start) * row;
    copy_blocks(device(), y.raw_data(), window, from, static_cast<std::size_t>(shape_[a]) * row, window,
                static_cast<std::size_t>(outer));
    return y;
}

Tensor Tensor::select(std::int64_t axis, std::int64_t index, std::source_location where) const {
    require_operand(*this, "select", where);
    const auto [a, i] = indexing::select_at(*this, axis, index, where);
    return narrow(a, i, 1, where).reshaped(indexing::without_axis(shape_, a));
}

Tensor Tensor::squeeze(std::int64_t axis, std::source_location where) const {
    require_operand(*this, "squeeze", where);
    return reshaped(indexing::squeezed_shape(*this, axis, where));
}

Tensor Tensor::unsqueeze(std::int64_t axis, std::source_location where) const {
    require_operand(*this, "unsqueeze", where);
    return reshaped(indexing::unsqueezed_shape(*this, axis, where));
}

Tensor Tensor::flatten(std::int64_t start_axis, std::int64_t end_axis, std::source_location where) const {
    require_operand(*this, "flatten", where);
    return reshaped(indexing::flattened_shape(*this, start_axis, end_axis, where));
}

}  // namespace dyngrad
