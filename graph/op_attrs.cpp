// The attribute field table's text forms (graph/op_def.h): error text, the fused-kernel check's keys, the golden
// export's JSON. One visit over the member's type: a new field of an existing kind needs nothing here.
#include <cstdio>
#include <type_traits>

#include "dyngrad/core/error.h"
#include "dyngrad/graph/op_def.h"

namespace dyngrad {

namespace {

constexpr bool dtype_names_match() {
    for (std::size_t i = 0; i < std::size(kDTypeNames); ++i)
        if (kDTypeNames[i] != dtype_name(static_cast<DType>(i))) return false;
    return true;
}
static_assert(dtype_names_match(), "kDTypeNames (graph/op_def.h) follows core/dtype.h's dtype_name");

// 17 significant digits: every double survives the round trip through the text.
std::string number(double value) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.17g", value);
    return buffer;
}

std::string quoted(std::string_view text, bool json) {
    if (!json) return std::string(text);
    std::string out = "\"";
    for (const char c : text) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

template <typename Range>
std::string int_list(const Range& values) {
    std::string out = "[";
    for (const auto v : values) out += str(out.size() > 1 ? ", " : "", v);
    return out + "]";
}

}  // namespace

std::string attr_value_text(const AttrField& field, const OpAttrs& attrs, bool json) {
    return std::visit(
        [&](auto member) -> std::string {
            const auto& value = attrs.*member;
            using T = std::remove_cvref_t<decltype(value)>;
            if constexpr (std::is_same_v<T, double>) return number(value);
            else if constexpr (std::is_same_v<T, std::optional<double>>) return value ? number(*value) : json ? "null" : "none";
            else if constexpr (std::is_same_v<T, bool>) return value ? "true" : "false";
            else if constexpr (std::is_same_v<T, std::uint64_t>) return quoted(std::to_string(value), json);
            else if constexpr (std::is_integral_v<T>) return std::to_string(value);
            else if constexpr (std::is_enum_v<T>) {
                const auto names = choice_names(value);
                const auto index = static_cast<std::size_t>(value);
                return quoted(index < names.size() ? names[index] : std::string_view("?"), json);
            } else return int_list(value);  // int lists and pairs
        },
        field.member);
}

std::string attrs_text(const OpDef& def, const OpAttrs& attrs) {
    std::string out;
    for (std::size_t i = 0; i < kAttrFieldCount; ++i)
        if (def.attrs.contains(i))
            out += str(out.empty() ? "" : ", ", kAttrFields[i].name, "=", attr_value_text(kAttrFields[i], attrs, false));
    return out;
}

std::string attr_keywords_text(const OpDef& def) {
    std::string out;
    for (std::size_t i = 0; i < kAttrFieldCount; ++i) {
        const auto& keywords = kAttrFields[i].keywords;
        if (!def.attrs.contains(i) || keywords[0].empty()) continue;
        out += str(out.empty() ? "" : ", ", keywords[0]);
        if (!keywords[1].empty()) out += str(" (", keywords[1], ")");
    }
    return out.empty() ? "none" : out;
}

const AttrField* find_attr_keyword(std::string_view keyword) {
    if (keyword.empty()) return nullptr;
    for (const AttrField& field : kAttrFields)
        for (const std::string_view k : field.keywords)
            if (k == keyword) return &field;
    return nullptr;
}

}  // namespace dyngrad
