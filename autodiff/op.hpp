/// \file
/// The op contract: what a struct must provide to be recorded on a tape, and the type-erased form
/// (OpKind) the tape calls it through. The tape knows no op; it only knows this contract.
///
/// An op is a struct in its own file under ops/ (see ops/scale.hpp for a small one):
///
/// \code
///   struct Scale {
///       static constexpr std::string_view name = "scale";
///       static constexpr Arity arity{1};
///       template <Scalar T> struct Settings { T c; };      // or `using Settings = NoSettings;`
///       static constexpr auto fields(auto& s) { return std::tuple{field("c", s.c)}; }
///       template <Scalar T>
///       static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) { return scale(in[0], s.c); }
///       template <Scalar T>
///       static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& out, Tensor<T>& saved);
///       template <Scalar T>
///       static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din);
///   };
/// \endcode
///
/// The struct is the op's only declaration: everything else about it derives from these members
/// (the re-run at other scalar types, saving and loading, pictures, the registry of autodiff/registry.hpp).
/// * arity: how many inputs it takes (Arity{1, max_arity} for a range, as concat's); the tape
///   refuses a record with another count, naming the op.
/// * Settings: the op's typed settings (a factor, flags, indices), stored with the node (in a
///   SettingsSlot) so the forward can be replayed. Either a plain struct or a template over the scalar type (a factor
///   such as 1/√d must be held in the tape's own precision). No settings: `using Settings = NoSettings;`.
/// * fields: the settings' fields by name (autodiff/settings.hpp), one generic function for const
///   and non-const settings of every type; omitted when the op has no settings. Saving, loading,
///   conversion to another scalar type and the settings' text all read it.
/// * record: records the op again from its settings and inputs through its public function (so a
///   loaded file's node passes the op's own checks, as a program's call does).
/// * forward: writes the output (resizing `out`) and whatever the VJP needs beyond the output and
///   the inputs into `saved` (left empty by most ops).
/// * vjp: writes into `din` (already shaped like input `which`) that input's contribution
///   dJ/d(input) given the upstream gradient at.G. The op writes; the tape adds (one accumulate
///   step, so a value used by several ops gets the sum of its branches). The tape only asks for
///   inputs that need a gradient.
/// * Optional, and only when the op declares them itself with `using hooks_of = <the op>;` (a
///   struct derived from an op, such as a test's deliberately broken variant, names a different
///   type and so inherits none of its base's hooks):
///     - `vjp_all(settings, at, grads)` in place of `vjp`: every input's contribution in one call,
///       for an op whose per-input VJPs share most of their work or run better together (matmul
///       runs its two side by side); grads[k] is nullptr when input k needs no gradient. An op
///       has exactly one of vjp and vjp_all.
///     - `update(settings, before, after, out_before, out) -> bool`: replays the op after some inputs
///       changed, from the recorded inputs and output, doing work only for what changed (the
///       checker's 50-digit replays). Returns false to decline (the replay then calls forward).
///       INVARIANT: the result equals `forward` on `after` to rounding in the last digit; the op
///       tables (tests/support.hpp, check_op_seeded) compare every op's replays with a fresh forward.
/// * Optional, and may be inherited (they report, they change no result):
///     - `cost(settings, in) -> OpCost`, the multiply-adds of forward and backward, for cost
///       reports (tests/test_cost.cpp);
///     - `branch(settings, in, k) -> std::uint32_t`, for an op whose value takes a data-dependent
///       branch (relu, abs, clamp, max): which one output element k took (a sign class, a region
///       of the clamp, the argmax's index). A re-run of a recorded tape at another precision that
///       takes another branch than the recording is reported node by node (check/recorded.hpp);
///     - `static constexpr HalfFormat input_format`, for an op that reads its inputs and its
///       upstream gradient rounded to a 16-bit format on a Tape<float> (matmul_bf16: bfloat16):
///       the precision estimate (check/audit.hpp) draws that rounding at random, as it draws every
///       result's last place, so its spread, and the recorded-tape check's bound on a float
///       gradient, see the 16-bit rounding. Other scalar types read their inputs as they are.
#pragma once

#include "autodiff/low_precision.hpp"
#include "autodiff/settings.hpp"
#include "autodiff/tensor.hpp"

#include <fmt/core.h>

#include <any>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>

namespace tapegrad {

/// The input tensors of one op, in order.
template <Scalar T>
using Inputs = std::span<const Tensor<T>* const>;

/// What a VJP reads, by name (so no two tensors can be swapped by position).
template <Scalar T>
struct VjpArgs {
    Inputs<T> in;            ///< the op's inputs, in order
    const Tensor<T>& out;    ///< its output
    const Tensor<T>& saved;  ///< what forward saved beyond the output (empty for most ops)
    const Tensor<T>& G;      ///< the upstream gradient dJ/d(out), shaped like out
};

/// The settings of an op that has none.
struct NoSettings {};

/// How many inputs an op takes: exactly `min` (Arity{2}), or from `min` to `max`.
struct Arity {
    std::size_t min, max;
    constexpr explicit Arity(std::size_t exactly) : min(exactly), max(exactly) {}
    constexpr Arity(std::size_t at_least, std::size_t at_most) : min(at_least), max(at_most) {}
    constexpr bool admits(std::size_t n) const { return n >= min && n <= max; }
    /// "2 inputs", "1 to 8 inputs", for messages.
    std::string text() const {
        return min == max ? fmt::format("{} input{}", min, min == 1 ? "" : "s") : fmt::format("{} to {} inputs", min, max);
    }
};

/// Work one op does, for cost accounting: multiply-adds of its forward and of its VJPs.
struct OpCost {
    std::uint64_t forward_madds = 0;
    std::uint64_t backward_madds = 0;
};

namespace detail {
template <class Op, class T>
struct settings_of {
    using type = NoSettings;
};
template <class Op, class T>
    requires requires { typename Op::Settings; }
struct settings_of<Op, T> {
    using type = typename Op::Settings;
};
template <class Op, class T>
    requires requires { typename Op::template Settings<T>; }
struct settings_of<Op, T> {
    using type = typename Op::template Settings<T>;
};
}  // namespace detail

/// Op's settings type for scalar type T.
template <class Op, class T>
using SettingsOf = typename detail::settings_of<Op, T>::type;

/// True when Op itself (not a base it derives from) declares its optional hooks.
template <class Op>
concept DeclaresHooks = requires { typename Op::hooks_of; } && std::same_as<typename Op::hooks_of, Op>;

template <class Op, class T>
concept HasPerInputVjp = requires(const SettingsOf<Op, T>& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din) {
    Op::template vjp<T>(s, at, which, din);
};

template <class Op, class T>
concept HasAllInputsVjp = DeclaresHooks<Op> &&
                          requires(const SettingsOf<Op, T>& s, const VjpArgs<T>& at, std::span<Tensor<T>* const> g) {
                              Op::template vjp_all<T>(s, at, g);
                          };

template <class Op, class T>
concept HasUpdate = DeclaresHooks<Op> && requires(const SettingsOf<Op, T>& s, Inputs<T> in, const Tensor<T>& t,
                                                  Tensor<T>& out) {
    { Op::template update<T>(s, in, in, t, out) } -> std::same_as<bool>;
};

/// What an op struct provides, for scalar type T: a name, a forward, and exactly one backward.
template <class Op, class T>
concept TapeOp = Scalar<T> && std::copy_constructible<SettingsOf<Op, T>> &&
                 requires(const SettingsOf<Op, T>& s, Inputs<T> in, Tensor<T>& out) {
                     { Op::name } -> std::convertible_to<std::string_view>;
                     Op::template forward<T>(s, in, out, out);
                 } && (HasPerInputVjp<Op, T> != HasAllInputsVjp<Op, T>);

/// One node's settings. Small trivially copyable settings (a factor, flags, offsets: most ops)
/// live inline, so recording an op allocates nothing and reading its settings is one pointer;
/// others (index lists, a 50-digit factor) live in a std::any, assigned in place when a reused
/// tape records the same op again. Settings without data (NoSettings) are not stored at all. The
/// op kind that stores a node's settings is the one that reads them back, so both sides know
/// the type.
class SettingsSlot {
public:
    template <class S>
    void store(S&& settings) {
        using Held = std::decay_t<S>;
        if constexpr (stateless<Held>) {
            return;
        } else if constexpr (fits_inline<Held>) {
            std::construct_at(reinterpret_cast<Held*>(inline_.data()), std::forward<S>(settings));
        } else if (Held* held = std::any_cast<Held>(&elsewhere_)) {
            *held = std::forward<S>(settings);
        } else {
            elsewhere_ = std::forward<S>(settings);
        }
    }

    template <class S>
    const S& get() const {
        if constexpr (stateless<S>) {
            static const S none{};
            return none;
        } else if constexpr (fits_inline<S>) {
            return *std::launder(reinterpret_cast<const S*>(inline_.data()));
        } else {
            return *std::any_cast<S>(&elsewhere_);
        }
    }

private:
    template <class S>
    static constexpr bool stateless = std::is_empty_v<S> && std::is_default_constructible_v<S>;
    static constexpr std::size_t inline_bytes = 48;
    template <class S>
    static constexpr bool fits_inline = sizeof(S) <= inline_bytes && alignof(S) <= alignof(std::max_align_t) &&
                                        std::is_trivially_copyable_v<S> && std::is_trivially_destructible_v<S>;

    alignas(std::max_align_t) std::array<std::byte, inline_bytes> inline_{};
    std::any elsewhere_;
};

/// The type-erased form of an op, built once per (op, scalar type) from the op's struct.
template <Scalar T>
struct OpKind {
    std::string_view name;
    /// The op's struct, the same for every scalar type: what finds the op's siblings at the other
    /// types when a recorded tape is re-run (autodiff/rerun.hpp).
    const std::type_info* op;
    void (*forward)(const SettingsSlot& settings, Inputs<T> in, Tensor<T>& out, Tensor<T>& saved);
    /// Every input's contribution; grads[k] is nullptr when input k needs none. For an op that
    /// writes per-input VJPs this is generated: one vjp call per requested input.
    void (*vjp_all)(const SettingsSlot& settings, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads);
    /// nullptr when the op has no update hook.
    bool (*update)(const SettingsSlot& settings, Inputs<T> before, Inputs<T> after, const Tensor<T>& out_before,
                   Tensor<T>& out);
    OpCost (*cost)(const SettingsSlot& settings, Inputs<T> in);
    /// nullptr when the op takes no data-dependent branch.
    std::uint32_t (*branch)(const SettingsSlot& settings, Inputs<T> in, std::size_t k);
    /// The settings as text (`c=0.125`; empty for an op without settings), from the op's fields.
    std::string (*describe)(const SettingsSlot& settings);
    /// The 16-bit format a float tape's node reads its inputs and upstream gradient in; nullptr
    /// for an op without `input_format` and on every tape but a Tape<float>.
    const HalfFormat* input_format;
};

/// The branch a sign test takes (relu's and abs's): 0 below zero, 1 at zero, 2 above.
template <Scalar T>
std::uint32_t sign_class(const T& x) {
    return x < T(0) ? 0u : x > T(0) ? 2u : 1u;
}

namespace detail {

template <class Op, Scalar T>
void vjp_all_of(const SettingsSlot& settings, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
    const auto& s = settings.get<SettingsOf<Op, T>>();
    if constexpr (HasAllInputsVjp<Op, T>) {
        Op::template vjp_all<T>(s, at, grads);
    } else {
        for (std::size_t which = 0; which < grads.size(); ++which) {
            if (grads[which] != nullptr) Op::template vjp<T>(s, at, which, *grads[which]);
        }
    }
}

template <class Op, Scalar T>
constexpr auto update_of() {
    using Update = bool (*)(const SettingsSlot&, Inputs<T>, Inputs<T>, const Tensor<T>&, Tensor<T>&);
    if constexpr (HasUpdate<Op, T>) {
        return Update{[](const SettingsSlot& settings, Inputs<T> before, Inputs<T> after, const Tensor<T>& out_before,
                         Tensor<T>& out) {
            return Op::template update<T>(settings.get<SettingsOf<Op, T>>(), before, after, out_before, out);
        }};
    } else {
        return Update{nullptr};
    }
}

template <class Op, Scalar T>
constexpr auto branch_of() {
    using Branch = std::uint32_t (*)(const SettingsSlot&, Inputs<T>, std::size_t);
    if constexpr (requires(const SettingsOf<Op, T>& s, Inputs<T> in) { Op::template branch<T>(s, in, std::size_t{}); }) {
        return Branch{[](const SettingsSlot& settings, Inputs<T> in, std::size_t k) -> std::uint32_t {
            return Op::template branch<T>(settings.get<SettingsOf<Op, T>>(), in, k);
        }};
    } else {
        return Branch{nullptr};
    }
}
template <class Op, Scalar T>
constexpr const HalfFormat* input_format_of() {
    if constexpr (std::is_same_v<T, float> && requires { Op::input_format; }) {
        return &Op::input_format;
    } else {
        return nullptr;
    }
}
}  // namespace detail

template <class Op, Scalar T>
    requires TapeOp<Op, T>
inline constexpr OpKind<T> op_kind_of{
    Op::name,
    &typeid(Op),
    [](const SettingsSlot& settings, Inputs<T> in, Tensor<T>& out, Tensor<T>& saved) {
        Op::template forward<T>(settings.get<SettingsOf<Op, T>>(), in, out, saved);
    },
    &detail::vjp_all_of<Op, T>,
    detail::update_of<Op, T>(),
    [](const SettingsSlot& settings, Inputs<T> in) -> OpCost {
        if constexpr (requires(const SettingsOf<Op, T>& s) { Op::template cost<T>(s, in); }) {
            return Op::template cost<T>(settings.get<SettingsOf<Op, T>>(), in);
        } else {
            return OpCost{};
        }
    },
    detail::branch_of<Op, T>(),
    [](const SettingsSlot& settings) -> std::string {
        return settings_text(settings_value_of<Op>(settings.get<SettingsOf<Op, T>>()));
    },
    detail::input_format_of<Op, T>(),
};

/// A list of op structs, as a type: the library's is `LibraryOps` (ops/all.hpp), from which the
/// re-run registry, the tape file and the tests' coverage checks are made.
template <class... Ops>
struct OpList {
    static constexpr std::size_t size = sizeof...(Ops);
    /// Each op's name (`Op::name`), in the list's order.
    static constexpr std::array<std::string_view, sizeof...(Ops)> names{Ops::name...};
};

}  // namespace tapegrad
