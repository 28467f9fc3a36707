/// \file
/// sigmoid: the logistic function, elementwise, Y = σ(A) = 1 / (1 + e^(−A)) (gates, probabilities
/// of binary events; values in (0, 1)).
///   A [...] -> Y [...]
/// VJP: dA = G ∘ σ'(A), σ'(a) = e^(−a) / (1 + e^(−a))² = e^(−|a|) / (1 + e^(−|a|))² (even in a).
/// Not as Y ∘ (1 − Y): where σ saturates Y rounds to 1 and 1 − Y to 0, so that form loses every
/// digit of the derivative (in float from |a| ≈ 17 on: e^(−17) is below float's unit roundoff),
/// while e^(−|a|) keeps them all (the precision audit's fault control, tests/test_audit.cpp).
/// Stable for any |a|: e^(−|a|) is the only exponential taken, so it never overflows:
///   a ≥ 0: σ(a) = 1 / (1 + e^(−a)),    a < 0: σ(a) = e^a / (1 + e^a).
/// In double σ(±1e4) is exactly 1 and 0 with derivative 0, never NaN; σ(±inf) = 1, 0.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Sigmoid {
    static constexpr std::string_view name = "sigmoid";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return sigmoid(in[0]);
    }

    template <Scalar T>
    static T logistic(const T& a) {
        using std::exp;
        if (a >= T(0)) return T(1) / (1 + T(exp(-a)));
        const T e = exp(a);
        return e / (1 + e);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = logistic(A[k]);
    }

    /// σ'(a) = e^(−|a|) / (1 + e^(−|a|))² (silu's VJP takes it too).
    template <Scalar T>
    static T slope(const T& a) {
        using std::abs;
        using std::exp;
        const T e = exp(-abs(a));
        return T(e / ((1 + e) * (1 + e)));
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * slope(A[k]);
    }
};

template <Scalar T>
Var<T> sigmoid(const Var<T>& A) {
    checks::non_empty(Sigmoid::name, "A", A);
    return A.tape().template record<Sigmoid>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> sigmoid<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
