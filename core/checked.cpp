#include "dyngrad/core/checked.h"

#include <limits>
#include <string>

#include "dyngrad/core/error.h"

namespace dyngrad {

namespace detail {

void throw_overflow(std::string_view what, std::int64_t a, char op, std::int64_t b) {
    throw ShapeError(str(what, ": ", a, " ", op, " ", b, " overflows int64"));
}

void throw_not_integral(std::string_view what, double value, std::string_view target) {
    throw ValueError(str(what, ": ", value, " is not representable as ", target));
}

void throw_narrowing(std::string_view what, std::int64_t value, std::int64_t low, std::int64_t high) {
    throw ShapeError(str(what, ": ", value, " lies outside [", low, ", ", high, "]"));
}

}  // namespace detail

std::int64_t try_numel(const Shape& shape) noexcept {
    std::int64_t nonzero_product = 1;
    bool empty = false;
    for (const std::int64_t d : shape) {
        if (d < 0) return -1;
        if (d == 0) {
            empty = true;
            continue;
        }
        if (__builtin_mul_overflow(nonzero_product, d, &nonzero_product)) return -1;
    }
    return empty ? 0 : nonzero_product;
}

std::int64_t checked_numel(const Shape& shape, std::string_view what) {
    const std::int64_t n = try_numel(shape);
    if (n >= 0) [[likely]] return n;
    for (const std::int64_t d : shape)
        if (d < 0) throw ValueError(str(what, ": shape ", to_string(shape), " has a negative dimension"));
    throw ShapeError(str(what, ": shape ", to_string(shape), " has more elements than int64 can count"));
}

Shape resolve_reshape(const Shape& from, std::int64_t numel, const Shape& target, std::string_view what) {
    const std::string prefix = what.empty() ? std::string() : str(what, ": ");
    Shape shape = target;
    std::size_t inferred = shape.size();
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1) {
            if (inferred != shape.size())
                throw ValueError(str(prefix, "target ", to_string(target), " has more than one -1"));
            inferred = i;
        } else if (shape[i] < 0) {
            throw ValueError(str(prefix, "target ", to_string(target), " has a negative dimension"));
        }
    }
    // The product of the known dims, checked: a target such as (6,7,7905747460161236407) wraps to 6.
    Shape known_dims = shape;
    if (inferred != shape.size()) known_dims[inferred] = 1;
    const std::int64_t known = checked_numel(known_dims, what.empty() ? std::string_view("target") : what);
    if (inferred != shape.size()) {
        if (known == 0 || numel % known != 0)
            throw ShapeError(str(prefix, "cannot reshape ", to_string(from), " (", numel, " elements) to ",
                                 to_string(target)));
        shape[inferred] = numel / known;
    } else if (known != numel) {
        throw ShapeError(str(prefix, "cannot reshape ", to_string(from), " (", numel, " elements) to ",
                             to_string(shape), " (", known, " elements)"));
    }
    return shape;
}

std::size_t checked_bytes(std::int64_t numel, std::size_t width, std::string_view what) {
    std::int64_t bytes;
    if (numel < 0 || __builtin_mul_overflow(numel, static_cast<std::int64_t>(width), &bytes))
        throw ShapeError(str(what, ": ", numel, " elements of ", width, " bytes overflow int64"));
    return static_cast<std::size_t>(bytes);
}

namespace {
std::string int128_to_string(__int128 value) {
    // Digits in reverse, then the sign; only values far from the 128-bit limits reach here.
    std::string text;
    for (__int128 rest = value < 0 ? -value : value; text.empty() || rest != 0; rest /= 10)
        text.push_back(static_cast<char>('0' + static_cast<int>(rest % 10)));
    if (value < 0) text.push_back('-');
    return {text.rbegin(), text.rend()};
}
}  // namespace

std::int64_t sliding_window_output(std::int64_t size, std::int64_t kernel, std::int64_t stride, std::int64_t padding,
                                   std::int64_t dilation, std::string_view axis) {
    // 128-bit intermediates: every operand is below 2^63, so window and padded input stay below 2^127.
    const __int128 window = static_cast<__int128>(dilation) * (kernel - 1) + 1;
    const __int128 padded = static_cast<__int128>(size) + 2 * static_cast<__int128>(padding);
    if (window > padded)
        throw ShapeError(str(axis, ": window ", int128_to_string(window),
                             dilation != 1 ? str(" (kernel ", kernel, ", dilation ", dilation, ")") : std::string(),
                             " is larger than the padded input ", int128_to_string(padded)));
    std::int64_t unused;
    if (__builtin_add_overflow(size, padding, &unused))
        throw ShapeError(str(axis, ": size ", size, " + padding ", padding, " overflows int64"));
    const __int128 out = (padded - window) / stride + 1;
    if (out > std::numeric_limits<std::int64_t>::max())
        throw ShapeError(str(axis, ": ", int128_to_string(out), " outputs (size ", size, ", padding ", padding, ", window ",
                             int128_to_string(window), ", stride ", stride, ") overflow int64"));
    return static_cast<std::int64_t>(out);
}

std::int64_t checked_to_int64(double value, std::string_view what) {
    // [-2^63, 2^63) holds exactly the doubles whose truncation fits int64; NaN fails both comparisons.
    constexpr double kTwo63 = 9223372036854775808.0;
    if (!(value >= -kTwo63 && value < kTwo63)) [[unlikely]] detail::throw_not_integral(what, value, "int64");
    return static_cast<std::int64_t>(value);
}

}  // namespace dyngrad
