/// \file
/// clamp: limits every element to [lo, hi], elementwise, Y = min(max(A, lo), hi) (bounded
/// activations, keeping probabilities or log-variances in a safe range). lo and hi are constants
/// held in the tape's own precision; either may be infinite (a one-sided clamp).
///   A [...] -> Y [...]
/// VJP: dA = G ∘ [lo ≤ A ≤ hi]: Y = A inside the interval (derivative 1) and Y is a constant bound
/// outside it (derivative 0).
/// At exactly a = lo or a = hi there is a kink (the one-sided derivatives are 1 and 0). The VJP
/// passes the gradient there (1 on the bound, the closed interval, as PyTorch does), so a value
/// clamped to itself still learns; the central difference there gives 1/2, and the gradient checker
/// reports such coordinates as kinks rather than verified derivatives: check this op on inputs away
/// from its bounds. lo > hi, or a NaN bound, raises value_error.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <type_traits>

namespace tapegrad {

struct Clamp {
    static constexpr std::string_view name = "clamp";
    static constexpr Arity arity{1};

    /// The bounds in the tape's own precision.
    template <Scalar T>
    struct Settings {
        T lo, hi;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("lo", s.lo), field("hi", s.hi)}; }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return clamp(in[0], s.lo, s.hi);
    }

    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = A[k] < s.lo ? s.lo : A[k] > s.hi ? s.hi : A[k];
    }

    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = s.lo <= A[k] && A[k] <= s.hi ? at.G[k] : T(0);
    }

    /// The branch element k took (autodiff/op.hpp): below lo, at lo, between, at hi, above hi.
    template <Scalar T>
    static std::uint32_t branch(const Settings<T>& s, Inputs<T> in, std::size_t k) {
        const T& a = (*in[0])[k];
        return a < s.lo ? 0u : a == s.lo ? 1u : a < s.hi ? 2u : a == s.hi ? 3u : 4u;
    }
};

/// The bounds are not deduced, so clamp(X, -1, 1) works on any tape.
template <Scalar T>
Var<T> clamp(const Var<T>& A, const std::type_identity_t<T>& lo, const std::type_identity_t<T>& hi) {
    checks::non_empty(Clamp::name, "A", A);
    if (is_nan(lo) || is_nan(hi) || lo > hi) {
        throw value_error(fmt::format("clamp: the bounds lo = {} and hi = {} do not make an interval (need lo ≤ hi)",
                                      to_double(lo), to_double(hi)));
    }
    return A.tape().template record<Clamp>({A}, Clamp::Settings<T>{lo, hi});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> clamp<T>(const Var<T>&, const std::type_identity_t<T>&, const std::type_identity_t<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
