/// \file
/// The ops a program knows: the library's (every struct of LibraryOps, ops/all.hpp, registered
/// before main) and each op of its own it registers with one line,
///
///     inline const bool softplus_registered = tapegrad::register_op<my_ops::Softplus>();
///
/// which gives a user's op everything a library op has, all derived from its struct
/// (autodiff/op.hpp: name, arity, Settings, fields, record, forward, VJP): the re-run of a recorded
/// tape at double, long double, mp50 and the duals (autodiff/rerun.hpp), so the recorded-tape
/// check, the op tables of tapegrad_testing.hpp and the precision audit take it; and saving and
/// loading (io/tape_file.hpp), where its nodes are written as `"op": "user:<name>"`, so a user's op
/// never collides with a library op of the same name. A program that loads a tape holding a user op
/// it has not registered is refused, naming the op.
///
/// Tools load a user's ops from a shared library (tapegrad-check and tapegrad-audit: --ops FILE):
/// load_ops opens it and calls its entry point, which registers them,
///
///     extern "C" void tapegrad_register_ops() { tapegrad::register_op<my_ops::Softplus>(); }
///
/// Link such a library with tapegrad::tapegrad_shared, the library the tools use, so that both
/// register into the same registry (examples/my_op_project builds one).
#pragma once

#include "autodiff/op.hpp"
#include "autodiff/rerun.hpp"
#include "autodiff/settings.hpp"
#include "autodiff/tape.hpp"

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

namespace tapegrad {

/// Where a registered op comes from: a file names a user's op `user:<name>`.
enum class OpOrigin { library, user };

/// The prefix of a user's op's name in a saved tape.
inline constexpr std::string_view user_op_prefix = "user:";

/// An op as a saved tape holds it, at scalar type T (float or double): how many inputs it takes,
/// its settings as field values and back, and how to record it again from them.
template <Scalar T>
struct SavedForm {
    Arity arity{0};
    SettingsValue (*encode)(const SettingsSlot& settings) = nullptr;
    /// Default settings as field values: the names and kinds a file's settings must have.
    SettingsValue (*schema)() = nullptr;
    /// Stores settings decoded from field values (usage_error naming a field that does not fit).
    void (*decode)(const SettingsValue& value, SettingsSlot& into) = nullptr;
    /// Records the op through its public function (the op's own checks, as for a program).
    Var<T> (*record)(const SettingsSlot& settings, std::span<const Var<T>> inputs) = nullptr;
};

/// A registered op that can be saved: its name in files, its struct, its forms at float and double.
struct SavedOp {
    std::string file_name;  ///< the op's name, `user:`-prefixed for a user's op
    OpOrigin origin;
    const std::type_info* op;
    SavedForm<float> at_float;
    SavedForm<double> at_double;

    template <Scalar T>
    const SavedForm<T>& form() const {
        if constexpr (std::is_same_v<T, float>) return at_float;
        else return at_double;
    }
};

/// What an op struct declares to be registered (and so saved, loaded and re-run): the op contract
/// of autodiff/op.hpp with `arity`, `record`, and `fields` when its settings hold data.
namespace detail {
// A bool rather than the concepts themselves: GCC 12 mis-substitutes TapeOp's parameters when it is
// named inside another concept's definition.
template <class Op>
inline constexpr bool tape_op_at_file_types = TapeOp<Op, float> && TapeOp<Op, double>;
}  // namespace detail

template <class Op>
concept RegistrableOp = detail::tape_op_at_file_types<Op> && requires {
    { Op::arity } -> std::convertible_to<Arity>;
} && requires(const SettingsOf<Op, double>& s, std::span<const Var<double>> in) {
    { Op::template record<double>(s, in) } -> std::same_as<Var<double>>;
};

namespace detail {

/// The registry of saved forms (compiled in the library: src/instances/registry.cpp, which
/// registers every op of LibraryOps). add_saved_op throws usage_error when another struct has
/// already registered the same file name.
void add_saved_op(SavedOp op);
const SavedOp* find_saved_op(const std::type_info& op);
const SavedOp* find_saved_op(std::string_view file_name);

template <class Op, Scalar T>
SavedForm<T> saved_form_of() {
    using S = SettingsOf<Op, T>;
    return {Arity(Op::arity),
            [](const SettingsSlot& slot) { return settings_value_of<Op>(slot.get<S>()); },
            [] { return settings_value_of<Op>(S{}); },
            [](const SettingsValue& value, SettingsSlot& into) {
                S s{};
                assign_settings<Op>(s, value);
                into.store(std::move(s));
            },
            [](const SettingsSlot& slot, std::span<const Var<T>> in) -> Var<T> {
                return Op::template record<T>(slot.get<S>(), in);
            }};
}

template <class Op>
SavedOp saved_op_of(OpOrigin origin) {
    const std::string name(Op::name);
    return {origin == OpOrigin::library ? name : std::string(user_op_prefix) + name, origin, &typeid(Op),
            saved_form_of<Op, float>(), saved_form_of<Op, double>()};
}

}  // namespace detail

/// Registers a user's op: its siblings (the re-run at other scalar types) and its saved form
/// (`user:<name>` in files). Registering the same struct again replaces its entries; another
/// struct under the same name is refused (usage_error naming both). Returns true, so that a
/// namespace-scope `inline const bool` can do it.
template <class Op>
bool register_op() {
    static_assert(RegistrableOp<Op>,
                  "register_op<Op>: the op struct declares name, arity, Settings (and fields when they hold data), "
                  "forward, a VJP and record (autodiff/op.hpp)");
    register_siblings<Op>();
    detail::add_saved_op(detail::saved_op_of<Op>(OpOrigin::user));
    return true;
}

/// Loads a shared library of a user's ops and calls its entry point `tapegrad_register_ops`
/// (extern "C", no arguments), which registers them. io_error when the file cannot be loaded;
/// usage_error when it has no entry point or its entry point registers no op here (the program and
/// the library must share one libtapegrad.so: a program linked with the static tapegrad keeps a
/// registry of its own). The library stays loaded for the program's life. Returns the file names
/// of the ops it registered (`user:<name>`).
std::vector<std::string> load_ops(const std::string& shared_library);

}  // namespace tapegrad
