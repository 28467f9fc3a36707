/// \file
/// An op's settings, field by field: the one declaration (`fields`, in the op's struct) from which
/// saving and loading (io/tape_file.hpp), conversion to another scalar type (autodiff/rerun.hpp),
/// and the settings' text in pictures and node descriptions (io/graphviz.hpp, Tape::info) derive.
///
///     template <Scalar T> struct Settings { T lo, hi; };
///     static constexpr auto fields(auto& s) { return std::tuple{field("lo", s.lo), field("hi", s.hi)}; }
///
/// `fields` is called on const and non-const settings of every scalar type alike, so it is a
/// generic function: each `field(name, member)` refers to the member, and a reader fills the
/// member through the same declaration a writer reads it through. A field's type is one of:
/// * an unsigned integer (a count, an axis, an offset), bool, or the tape's scalar (a factor);
/// * an enum whose names a `choices(E)` function beside it lists, indexed by the enum's value;
/// * std::vector<std::size_t> or Shape (indices, a shape);
/// * a struct whose own static `fields(auto& self)` lists its fields (nested, as FusedAttentionTiles);
/// * a proxy (a type with `using field_proxy_of = ...`; permute's axes, a fixed array and its count).
/// Anything else does not compile, with a message naming these kinds.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/scalar.hpp"
#include "autodiff/tensor.hpp"

#include <fmt/core.h>

#include <array>
#include <concepts>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

namespace tapegrad {

/// One named field of an op's settings: `Ref` is a reference to the member (or a proxy object).
template <class Ref>
struct Field {
    std::string_view name;
    Ref value;
};

/// A field that refers to `member` (const or not, as the settings it was taken from).
template <class V>
constexpr Field<V&> field(std::string_view name, V& member) {
    return {name, member};
}

/// A field read and written through a proxy object (which holds references to the members).
template <class Proxy>
    requires requires { typename Proxy::field_proxy_of; }
constexpr Field<Proxy> field(std::string_view name, Proxy proxy) {
    return {name, proxy};
}

struct SettingsEntry;

/// A choice among named values (an enum's value, by its index in its names).
struct SettingsChoice {
    std::size_t index;
    std::span<const std::string_view> names;
};

/// A field's value apart from its C++ type: a count, a flag, a float32 or float64 number, a
/// choice, a list of counts, or nested fields. What the file writes and reads, and what prints.
using SettingsValue = std::variant<std::size_t, bool, float, double, SettingsChoice, std::vector<std::size_t>,
                                   std::vector<SettingsEntry>>;

struct SettingsEntry {
    std::string_view name;
    SettingsValue value;
};

/// The kinds of SettingsValue, by its index, for messages.
inline constexpr std::array<std::string_view, 7> settings_kind_names{
    "a non-negative integer", "true or false", "a float32 number", "a float64 number", "one of its names",
    "an array of non-negative integers", "an object of fields"};

static_assert(settings_kind_names.size() == std::variant_size_v<SettingsValue>, "a name for each kind");

/// The fields of settings `s` of op `Op` (none when the op declares no `fields`).
template <class Op, class S>
constexpr auto fields_of(S& s) {
    if constexpr (requires { Op::fields(s); }) {
        return Op::fields(s);
    } else {
        static_assert(std::is_empty_v<std::remove_const_t<S>>,
                      "an op whose settings hold data declares them: static constexpr auto fields(auto& s) "
                      "{ return std::tuple{field(\"name\", s.member), ...}; } (autodiff/settings.hpp)");
        return std::tuple{};
    }
}

namespace detail {

template <class V>
concept HasNestedFields = requires(V& v) { V::fields(v); };

template <class V>
concept HasChoices = std::is_enum_v<V> && requires(V v) {
    { choices(v) } -> std::convertible_to<std::span<const std::string_view>>;
};

template <class V>
constexpr bool unsupported_field = false;

}  // namespace detail

template <class V>
SettingsValue settings_value(const V& v);

namespace detail {
/// A tuple of fields (an op's or a nested struct's `fields`) as nested field values.
template <class Fields>
SettingsValue entries_of(const Fields& fields) {
    std::vector<SettingsEntry> entries;
    std::apply([&](const auto&... f) { (entries.push_back({f.name, settings_value(f.value)}), ...); }, fields);
    return entries;
}
}  // namespace detail

/// A field's value as a SettingsValue. A scalar other than float or double (a re-run's mp50, a
/// dual number) is given as the double nearest it: such settings are printed, never saved.
template <class V>
SettingsValue settings_value(const V& v) {
    if constexpr (std::same_as<V, bool>) {
        return v;
    } else if constexpr (std::unsigned_integral<V>) {
        return std::size_t(v);
    } else if constexpr (std::same_as<V, float> || std::same_as<V, double>) {
        return v;
    } else if constexpr (Scalar<V>) {
        return to_double(v);
    } else if constexpr (detail::HasChoices<V>) {
        return SettingsChoice{std::size_t(v), choices(v)};
    } else if constexpr (std::same_as<V, std::vector<std::size_t>>) {
        return v;
    } else if constexpr (std::same_as<V, Shape>) {
        return std::vector<std::size_t>(v.dims().begin(), v.dims().end());
    } else if constexpr (requires { typename V::field_proxy_of; }) {
        return v.value();
    } else if constexpr (detail::HasNestedFields<V>) {
        return detail::entries_of(V::fields(v));
    } else {
        static_assert(detail::unsupported_field<V>,
                      "a settings field is an unsigned integer, bool, the scalar, an enum with choices(E), "
                      "std::vector<std::size_t>, Shape, a struct with its own fields, or a proxy "
                      "(autodiff/settings.hpp)");
    }
}

/// Settings `s` of op `Op` as nested fields.
template <class Op, class S>
SettingsValue settings_value_of(const S& s) {
    return detail::entries_of(fields_of<Op>(s));
}

namespace detail {

/// The value of kind A held by `value`, or usage_error naming the field and both kinds.
template <class A>
const A& value_as(const SettingsValue& value, std::string_view name) {
    if (const A* held = std::get_if<A>(&value)) return *held;
    throw usage_error(fmt::format("settings field '{}': {} given where {} is wanted", name,
                                  settings_kind_names[value.index()],
                                  settings_kind_names[SettingsValue(std::in_place_type<A>).index()]));
}

}  // namespace detail

template <class V>
void assign_entry(V& v, const std::vector<SettingsEntry>& entries, std::string_view name);

namespace detail {
/// Sets each field of a tuple of fields from the entry of its name in nested field values `value`.
template <class Fields>
void assign_fields(const Fields& fields, const SettingsValue& value, std::string_view name) {
    const auto& entries = value_as<std::vector<SettingsEntry>>(value, name);
    std::apply([&](auto... f) { (assign_entry(f.value, entries, f.name), ...); }, fields);
}
}  // namespace detail

/// Sets field `v` from `value` (of the kind settings_value gives for V), or throws usage_error naming
/// the field (a wrong kind, an integer too large for V, a choice out of range, an invalid shape).
template <class V>
void assign_setting(V& v, const SettingsValue& value, std::string_view name) {
    if constexpr (std::same_as<V, bool>) {
        v = detail::value_as<bool>(value, name);
    } else if constexpr (std::unsigned_integral<V>) {
        const std::size_t n = detail::value_as<std::size_t>(value, name);
        if (n > std::numeric_limits<V>::max()) throw usage_error(fmt::format("settings field '{}': {} is too large", name, n));
        v = V(n);
    } else if constexpr (std::same_as<V, float> || std::same_as<V, double>) {
        v = detail::value_as<V>(value, name);
    } else if constexpr (detail::HasChoices<V>) {
        const std::size_t index = detail::value_as<SettingsChoice>(value, name).index;
        if (index >= choices(V{}).size()) throw usage_error(fmt::format("settings field '{}': choice {} is out of range", name, index));
        v = V(index);
    } else if constexpr (std::same_as<V, std::vector<std::size_t>>) {
        v = detail::value_as<std::vector<std::size_t>>(value, name);
    } else if constexpr (std::same_as<V, Shape>) {
        const auto& dims = detail::value_as<std::vector<std::size_t>>(value, name);
        if (dims.size() > max_rank) throw usage_error(fmt::format("settings field '{}': rank {} is above the maximum {}", name, dims.size(), max_rank));
        v = Shape(std::span<const std::size_t>(dims));
    } else if constexpr (requires { typename V::field_proxy_of; }) {
        v.assign(detail::value_as<std::vector<std::size_t>>(value, name), name);
    } else if constexpr (detail::HasNestedFields<V>) {
        detail::assign_fields(V::fields(v), value, name);
    } else {
        static_assert(detail::unsupported_field<V>, "see settings_value");
    }
}

/// Sets the field named `name` from the entry of that name in `entries`, or throws naming it.
template <class V>
void assign_entry(V& v, const std::vector<SettingsEntry>& entries, std::string_view name) {
    for (const SettingsEntry& entry : entries) {
        if (entry.name == name) return assign_setting(v, entry.value, name);
    }
    throw usage_error(fmt::format("settings field '{}' is missing", name));
}

/// Sets settings `s` of op `Op` from nested fields (each field by name; extra entries are the
/// caller's to refuse, as the tape file does).
template <class Op, class S>
void assign_settings(S& s, const SettingsValue& value) {
    detail::assign_fields(fields_of<Op>(s), value, "settings");
}

/// One field at another scalar type (a re-run's settings, autodiff/rerun.hpp): a scalar converted
/// (exactly, from float or double to a finer type), anything else as it is.
template <Scalar U, class V>
auto convert_field(const V& v) {
    if constexpr (Scalar<V> && !std::same_as<V, bool> && !std::integral<V>) {
        return U(v);
    } else {
        return v;
    }
}

/// A settings value as text, for pictures and descriptions: `c=0.125, axis=1`, a list of more than
/// eight counts shortened to its first eight and its length.
/// Compiled in the library (src/autodiff/settings.cpp): every op's description calls it, and a
/// program including the ops would otherwise compile the visit of every kind and its formatting.
std::string settings_text(const SettingsValue& value);

}  // namespace tapegrad
