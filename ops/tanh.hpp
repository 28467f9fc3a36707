/// \file
/// tanh: the hyperbolic tangent, elementwise, Y = tanh(A) (a bounded nonlinearity, values in (−1, 1)).
///   A [...] -> Y [...]
/// VJP: dA = G ∘ tanh'(A), tanh'(a) = 1/cosh²(a) = 4e^(−2|a|) / (1 + e^(−2|a|))² (even in a).
/// Not as 1 − Y²: where tanh saturates Y rounds to ±1 and 1 − Y² to 0, losing every digit of the
/// derivative (in float from |a| ≈ 9 on), while e^(−2|a|) keeps them all (as sigmoid's VJP;
/// check/audit.hpp measures such losses). tanh(±inf) = ±1 with derivative 0, never NaN.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Tanh {
    static constexpr std::string_view name = "tanh";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return tanh(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::tanh;
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = tanh(A[k]);
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        using std::abs;
        using std::exp;
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < at.G.size(); ++k) {
            const T e = exp(-2 * abs(A[k]));
            dA[k] = at.G[k] * (4 * e / ((1 + e) * (1 + e)));
        }
    }
};

template <Scalar T>
Var<T> tanh(const Var<T>& A) {
    checks::non_empty(Tanh::name, "A", A);
    return A.tape().template record<Tanh>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> tanh<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
