/// \file
/// sqrt: the square root, elementwise, Y = √A, for A ≥ 0 (norms, standard deviations).
///   A [...] -> Y [...]
/// VJP: dA = G / (2Y), since d√a/da = 1/(2√a) = 1/(2y): the saved output is all it needs.
/// A negative value raises value_error naming the value and its index (its root is NaN).
/// At A = 0 the value is 0 but the derivative 1/(2√a) is infinite: the VJP raises value_error
/// there when the upstream gradient is non-zero (the gradient does not exist; an infinite one would
/// only turn into NaN later), and gives 0 when it is zero (J does not depend on that entry through
/// this op, so nothing flows).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Sqrt {
    static constexpr std::string_view name = "sqrt";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return sqrt(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::sqrt;
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) {
            if (A[k] < T(0)) {
                throw value_error(fmt::format("sqrt: value {} at {} of shape {} is negative", to_double(A[k]),
                                              index_string(A.shape(), k), A.shape().to_string()));
            }
            Y[k] = sqrt(A[k]);
        }
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& Y = at.out;
        for (std::size_t k = 0; k < at.G.size(); ++k) {
            if (Y[k] != T(0)) {
                dA[k] = at.G[k] / (2 * Y[k]);
            } else if (at.G[k] == T(0)) {
                dA[k] = T(0);
            } else {
                throw value_error(fmt::format("sqrt: the derivative 1/(2√a) is infinite at value 0 at {} of shape {}",
                                              index_string(Y.shape(), k), Y.shape().to_string()));
            }
        }
    }
};

template <Scalar T>
Var<T> sqrt(const Var<T>& A) {
    checks::non_empty(Sqrt::name, "A", A);
    return A.tape().template record<Sqrt>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> sqrt<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
