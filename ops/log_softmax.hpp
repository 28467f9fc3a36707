/// \file
/// log_softmax: the log-probabilities of each row (the last dimension), Y_ij = S_ij − log Σ_k exp(S_ik)
/// (a classifier's log-likelihoods; cross_entropy shares its row normaliser, log_partition below).
///   S [..., n] -> Y [..., n]; exp(Y) of each row sums to one.
/// Stable: with m = max_k S_ik, Y_ij = (S_ij − m) − log Σ_k exp(S_ik − m); every exponent is ≤ 0
/// and one is 0, so scores of ±1e4 give finite, correctly rounded log-probabilities. Scores must
/// be finite (value_error otherwise, naming the op, the value and where it is).
/// forward saves the probabilities P = softmax(S) (computed as exp(S − m)/Z, not as exp(Y): that
/// would carry the rounding of Y's large terms into every weight, see ops/logsumexp.hpp).
/// VJP: dS_ij = G_ij − P_ij·Σ_k G_ik
///   because ∂Y_ik/∂S_ij = δ_jk − P_ij (the derivative of log Z is the softmax). Dropping the P
///   term gives G itself, whose rows need not sum to zero although Y is invariant to a row shift.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <cstddef>

namespace tapegrad {

/// One row's normaliser: its maximum m and log Z, Z = Σ_k exp(S_k − m); writes exp(S_k − m) into
/// `shifted_exp`. Refuses a non-finite score, naming `op` (log_softmax and cross_entropy share it).
template <Scalar T>
struct LogPartition {
    T max, Z, log_Z;
};

template <Scalar T>
LogPartition<T> log_partition(std::string_view op, const Tensor<T>& S, std::size_t row, T* shifted_exp) {
    using std::exp;
    using std::log;
    const std::size_t n = S.cols();
    const T* scores = S.data().data() + row * n;
    T largest = scores[0];
    for (std::size_t k = 0; k < n; ++k) {
        if (!is_finite(scores[k])) {
            throw value_error(fmt::format("{}: score {} at {} of shape {}; scores must be finite", op,
                                          to_double(scores[k]), index_string(S.shape(), row * n + k),
                                          S.shape().to_string()));
        }
        if (shift_prefers(scores[k], largest)) largest = scores[k];  // (a shift: autodiff/dual.hpp)
    }
    T Z(0);
    for (std::size_t k = 0; k < n; ++k) {
        shifted_exp[k] = exp(T(scores[k] - largest));
        Z += shifted_exp[k];
    }
    return {largest, Z, T(log(Z))};
}

struct LogSoftmax {
    static constexpr std::string_view name = "log_softmax";
    static constexpr Arity arity{1};
    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return log_softmax(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>& P) {
        const Tensor<T>& S = *in[0];
        const std::size_t n = S.cols(), rows = S.size() / n;
        Y.resize(S.shape());
        P.resize(S.shape());
        for (std::size_t r = 0; r < rows; ++r) {
            T* p = P.data().data() + r * n;
            const LogPartition<T> part = log_partition(name, S, r, p);
            for (std::size_t k = 0; k < n; ++k) {
                Y[r * n + k] = (S[r * n + k] - part.max) - part.log_Z;
                p[k] /= part.Z;
            }
        }
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dS) {
        const Tensor<T>& P = at.saved;
        const std::size_t n = P.cols(), rows = P.size() / n;
        for (std::size_t r = 0; r < rows; ++r) {
            T total(0);
            for (std::size_t k = 0; k < n; ++k) total += at.G[r * n + k];
            for (std::size_t k = 0; k < n; ++k) dS[r * n + k] = at.G[r * n + k] - P[r * n + k] * total;
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        return {in[0]->size(), 2 * in[0]->size()};
    }
};

template <Scalar T>
Var<T> log_softmax(const Var<T>& S) {
    checks::non_empty(LogSoftmax::name, "S", S);
    if (S.shape().rank() == 0) throw shape_error("log_softmax: S must have at least one dimension, got a scalar");
    return S.tape().template record<LogSoftmax>({S});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> log_softmax<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
