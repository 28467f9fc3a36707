/// \file
/// log1p: ln(1 + a), elementwise, Y = log1p(A), for A > −1: the logarithm of a quantity close to 1
/// written as its small excess a (log-likelihoods of probabilities near 1, softplus's
/// ln(1 + e^(−|x|)), a log-space learning-rate ratio), as torch.log1p and std::log1p.
///   A [...] -> Y [...]
/// VJP: dA = G / (1 + A), since d ln(1 + a)/da = 1/(1 + a).
/// Why an op and not log(shift(A, 1)): for |a| below the precision's unit roundoff u, 1 + a rounds
/// to 1 and ln gives 0, every digit of the answer a − a²/2 + … lost (at a = 1e-10 in double,
/// log(1 + a) keeps 7 of 16 digits); log1p computes it from a itself (std::log1p, and at 50 digits
/// Boost.Math's series), so Y is correct to the precision's last digits for every a > −1. The VJP's
/// 1 + a loses nothing that matters: its relative error is u whatever a.
/// A value ≤ −1 (or NaN) raises value_error naming the value and its index: ln 0 = −inf, and below
/// −1 the result is NaN. log1p(+inf) = +inf is allowed; its derivative there is 0.
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/tape.hpp"
#include "ops/checks.hpp"

#include <cmath>

namespace tapegrad {

struct Log1p {
    static constexpr std::string_view name = "log1p";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return log1p(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::log1p;
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) {
            if (!(A[k] > T(-1))) {
                throw value_error(fmt::format("log1p: value {} at {} of shape {} is not above -1", to_double(A[k]),
                                              index_string(A.shape(), k), A.shape().to_string()));
            }
            Y[k] = log1p(A[k]);
        }
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] / T(1 + A[k]);
    }
};

template <Scalar T>
Var<T> log1p(const Var<T>& A) {
    checks::non_empty(Log1p::name, "A", A);
    return A.tape().template record<Log1p>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> log1p<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
