/// \file
/// exp: the exponential, elementwise, Y = e^A, for positive quantities kept in log space (a learned
/// scale or rate e^s) and for unnormalised weights.
///   A [...] -> Y [...]
/// VJP: dA = G ∘ Y, since d e^a/da = e^a: the saved output is the derivative.
/// e^(−inf) = 0 (exp after mask) and underflow to 0 are results, not errors. An output that
/// overflows to +inf (a > 709.78 in double, a > 88.7 in float; 50 digits reach far higher) raises
/// value_error naming the value and its index: an infinite value would only turn into NaN later.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <limits>

namespace tapegrad {

struct Exp {
    static constexpr std::string_view name = "exp";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return exp(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::exp;
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) {
            Y[k] = exp(A[k]);
            if (Y[k] == std::numeric_limits<T>::infinity()) {
                throw value_error(fmt::format("exp: value {} at {} of shape {} overflows: e^{} is +inf",
                                              to_double(A[k]), index_string(A.shape(), k), A.shape().to_string(),
                                              to_double(A[k])));
            }
        }
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& Y = at.out;
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * Y[k];
    }
};

template <Scalar T>
Var<T> exp(const Var<T>& A) {
    checks::non_empty(Exp::name, "A", A);
    return A.tape().template record<Exp>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> exp<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
