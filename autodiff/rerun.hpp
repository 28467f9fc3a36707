/// \file
/// Re-running a recorded tape at another scalar type: the graph a program recorded on a Tape<double>
/// or Tape<float>, as it stands (leaves, constants, every node's op and settings), recorded again
/// on a tape of double, long double, mp50 or the duals of double and mp50 (long double serves the
/// precision audit of a double tape, check/audit.hpp: 11 bits finer than double at a small fraction
/// of mp50's cost, where it holds the exact part of each contributor run). Leaves and constants
/// convert exactly (float and double are exact in mp50), and each op's settings convert from their
/// recorded values (a factor 1/√d rounded to float stays that float), so the function re-run is
/// the function the recorded tape computed, in the new arithmetic. Data-dependent choices (a max
/// tie, a kink, a clamp bound) are taken again by the op's forward in the new precision.
///
/// An op re-runs through its siblings: the same struct's entry at each target type, one function
/// per (recorded type, target type) that records the op with its settings converted. The
/// library's ops have theirs compiled in the library (src/instances/registry.cpp); a user's op
/// gets them with one line, anywhere before a re-run (a test fixture, main, or beside the op):
///
///     inline const bool my_op_registered = tapegrad::register_op<MyOp>();   // autodiff/registry.hpp
///
/// which also registers its saved form; register_siblings<MyOp>() registers the siblings alone (a
/// test's deliberately broken variant, which is checked but never saved).
///
/// (an op whose settings are a template over the scalar type converts them through its `fields`,
/// autodiff/settings.hpp: each field holding the scalar is converted, the others copied;
/// tapegrad::register_op<MyOp>() registers the siblings too, with saving and loading).
/// Re-running a tape that holds an op without siblings raises usage_error
/// naming the op and the type it was asked for.
#pragma once

#include "autodiff/dual.hpp"
#include "autodiff/mp50.hpp"
#include "autodiff/error.hpp"
#include "autodiff/op.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace tapegrad {

/// One sibling: records the op of a node recorded at scalar type S (its settings in `settings`) on
/// the tape of `inputs`, at type U.
template <Scalar S, Scalar U>
struct Sibling {
    Var<U> (*record)(const SettingsSlot& settings, std::span<const Var<U>> inputs) = nullptr;
};

/// The siblings of an op recorded at S: one per type it can be re-run at.
template <Scalar S>
using SiblingsFrom = std::tuple<Sibling<S, double>, Sibling<S, long double>, Sibling<S, mp50>, Sibling<S, Dual<double>>,
                                Sibling<S, Dual<mp50>>>;

/// An op's siblings: one per (recorded type, target type), for tapes recorded at float or double.
struct OpSiblings {
    decltype(std::tuple_cat(SiblingsFrom<float>{}, SiblingsFrom<double>{})) entries;

    template <Scalar S, Scalar U>
    const Sibling<S, U>& get() const {
        return std::get<Sibling<S, U>>(entries);
    }
};

namespace detail {

/// The registry of siblings, by op struct (compiled in the library: src/instances/registry.cpp,
/// which also holds the library's ops, so they are there whenever the registry is).
void add_siblings(const std::type_info& op, const OpSiblings& siblings);
const OpSiblings* find_siblings(const std::type_info& op);

/// Settings of op `Op` recorded at scalar type S, at type U: from the op's fields
/// (autodiff/settings.hpp), each field that holds the scalar converted (exactly, from float or
/// double to a finer type), every other field copied.
template <class Op, Scalar S, Scalar U>
SettingsOf<Op, U> settings_as(const SettingsOf<Op, S>& from) {
    if constexpr (std::is_same_v<SettingsOf<Op, S>, SettingsOf<Op, U>>) {
        return from;
    } else {
        SettingsOf<Op, U> to{};
        auto target = fields_of<Op>(to);
        const auto source = fields_of<Op>(from);
        static_assert(std::tuple_size_v<decltype(target)> == std::tuple_size_v<decltype(source)>,
                      "an op's fields name the same members at every scalar type");
        [&]<std::size_t... k>(std::index_sequence<k...>) {
            ((std::get<k>(target).value = convert_field<U>(std::get<k>(source).value)), ...);
        }(std::make_index_sequence<std::tuple_size_v<decltype(target)>>{});
        return to;
    }
}

template <class Op, Scalar S, Scalar U>
Var<U> record_sibling(const SettingsSlot& settings, std::span<const Var<U>> inputs) {
    Tape<U>& tape = inputs[0].tape();
    return tape.template record<Op>(inputs, settings_as<Op, S, U>(settings.get<SettingsOf<Op, S>>()));
}

template <class Op, Scalar S, Scalar U>
void fill(Sibling<S, U>& sibling) {
    sibling.record = &record_sibling<Op, S, U>;
}

/// A scalar type's name, for messages.
template <Scalar T>
constexpr std::string_view scalar_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, long double>) return "long double";
    else if constexpr (std::is_same_v<T, mp50>) return "mp50";
    else if constexpr (std::is_same_v<T, Dual<double>>) return "Dual<double>";
    else if constexpr (std::is_same_v<T, Dual<mp50>>) return "Dual<mp50>";
    else return "another scalar type";
}

/// The value of a recorded leaf or constant at type U: exact for float and double sources.
template <Scalar U, Scalar S>
Tensor<U> tensor_as(const Tensor<S>& value) {
    Tensor<U> out(value.shape());
    for (std::size_t k = 0; k < value.size(); ++k) out[k] = U(value[k]);
    return out;
}

}  // namespace detail

/// Op's siblings at every target type of `Table` (instantiates Op's forward and VJP at each): the
/// library's OpSiblings, or another table with `entries`, a tuple of Siblings (the interval ones of
/// autodiff/interval_rerun.hpp).
template <class Op, class Table = OpSiblings>
Table siblings_of() {
    Table siblings{};
    std::apply([](auto&... sibling) { (detail::fill<Op>(sibling), ...); }, siblings.entries);
    return siblings;
}

/// Registers Op's siblings (again: replaces them). Returns true, so that a namespace-scope
/// `inline const bool` can do it.
template <class Op>
bool register_siblings() {
    detail::add_siblings(typeid(Op), siblings_of<Op>());
    return true;
}

/// The leaves of `tape` up to `output` that need a gradient (its inputs and parameters, not its
/// constants), in recorded order: the indices a re-run maps onto new leaves.
template <Scalar S>
std::vector<std::uint32_t> gradient_leaves(const Tape<S>& tape, const Var<S>& output) {
    if (!tape.holds(output)) throw usage_error("gradient_leaves: the output does not belong to this tape");
    std::vector<std::uint32_t> leaves;
    for (std::uint32_t i = 0; i <= output.index(); ++i) {
        const auto node = tape.recorded(i);
        if (node.kind == nullptr && node.requires_grad) leaves.push_back(i);
    }
    return leaves;
}

/// Where a re-run finds each op's sibling for (S → U): a lookup by op struct (nullptr when the op
/// has none), and, for the refusal of an op without one, U's name and how a user registers them.
/// The library registry above serves every type of SiblingsFrom; certified gradients keep their
/// interval siblings in a registry of their own (autodiff/interval_rerun.hpp), so that the core
/// library compiles no interval code.
template <Scalar S, Scalar U>
struct SiblingSource {
    const Sibling<S, U>* (*find)(const std::type_info& op) = nullptr;
    std::string_view target;
    std::string_view how_to_register;
};

/// The library registry's siblings (register_siblings, register_op).
template <Scalar S, Scalar U>
SiblingSource<S, U> registered_siblings() {
    return {[](const std::type_info& op) -> const Sibling<S, U>* {
                const OpSiblings* siblings = detail::find_siblings(op);
                return siblings == nullptr ? nullptr : &siblings->template get<S, U>();
            },
            detail::scalar_name<U>(), "tapegrad::register_siblings<its struct>() (autodiff/rerun.hpp)"};
}

/// Records the graph of `source` up to `output` again on `target` (the tape of `leaves`, which stand
/// for gradient_leaves(source, output), in that order) and returns the re-run output. Constants are
/// recorded on `target` with their recorded values and labels; every node keeps its label. When
/// `nodes` is given, it receives the re-run value of every recorded node (index i for node i). Each
/// op records through its sibling from `siblings` (the library registry unless told).
template <Scalar S, Scalar U>
Var<U> rerun(const Tape<S>& source, const Var<S>& output, std::span<const Var<U>> leaves,
             std::vector<Var<U>>* nodes = nullptr, SiblingSource<S, U> siblings = registered_siblings<S, U>()) {
    const std::vector<std::uint32_t> leaf_nodes = gradient_leaves(source, output);
    if (leaves.size() != leaf_nodes.size() || leaves.empty()) {
        throw usage_error(fmt::format("rerun: the recorded graph has {} leaves that need a gradient, {} given",
                                      leaf_nodes.size(), leaves.size()));
    }
    Tape<U>& target = leaves[0].tape();
    std::vector<Var<U>> mapped(output.index() + 1);
    std::size_t next_leaf = 0;
    for (std::uint32_t i = 0; i <= output.index(); ++i) {
        const auto node = source.recorded(i);
        if (node.kind == nullptr) {
            mapped[i] = node.requires_grad ? leaves[next_leaf++]
                                           : target.constant(detail::tensor_as<U>(node.value), node.label);
            continue;
        }
        const Sibling<S, U>* sibling = siblings.find(*node.kind->op);
        if (sibling == nullptr || sibling->record == nullptr) {
            throw usage_error(
                fmt::format("rerun: op '{}' (node {}) has no siblings to re-run it at {}; register them "
                            "with {}",
                            node.kind->name, i, siblings.target, siblings.how_to_register));
        }
        if (node.inputs.empty()) {  // a sibling records on its first input's tape
            throw usage_error(fmt::format("rerun: op '{}' (node {}) has no inputs; only ops of at least one input "
                                          "re-run", node.kind->name, i));
        }
        std::vector<Var<U>> inputs;
        for (const std::uint32_t input : node.inputs) inputs.push_back(mapped[input]);
        mapped[i] = sibling->record(node.settings, inputs);
        if (!node.label.empty()) mapped[i].named(node.label);
    }
    const Var<U> out = mapped[output.index()];
    if (nodes != nullptr) *nodes = std::move(mapped);
    return out;
}

}  // namespace tapegrad
