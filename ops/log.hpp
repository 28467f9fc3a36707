/// \file
/// log: the natural logarithm, elementwise, Y = ln A, for A > 0 (log-likelihoods, log-space losses).
///   A [...] -> Y [...]
/// VJP: dA = G / A, since d ln a/da = 1/a (the input, not the output, is what the VJP needs).
/// A value ≤ 0 raises value_error naming the value and its index: ln 0 = −inf, and the logarithm
/// of a negative number is NaN. ln(+inf) = +inf is allowed; its derivative there is 0.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Log {
    static constexpr std::string_view name = "log";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return log(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::log;
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) {
            if (!(A[k] > T(0))) {
                throw value_error(fmt::format("log: value {} at {} of shape {} is not positive", to_double(A[k]),
                                              index_string(A.shape(), k), A.shape().to_string()));
            }
            Y[k] = log(A[k]);
        }
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] / A[k];
    }
};

template <Scalar T>
Var<T> log(const Var<T>& A) {
    checks::non_empty(Log::name, "A", A);
    return A.tape().template record<Log>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> log<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
