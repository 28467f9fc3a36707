/// \file
/// logsumexp: the smooth maximum along one axis, Y = log Σ_j exp(X[..., j, ...]) (the log of a
/// softmax's denominator, a log-likelihood's normaliser).
///   X [d0, ..., d(r−1)], rank 1..4, axis a in [−r, r) -> Y with d_a removed (a rank-1 X gives a
///   scalar) or kept as 1 (keepdims); lanes and shapes as in ops/axis.hpp.
/// Stable: with m = max_j X[o, j, i] per lane, Y = m + log Σ_j exp(X[o, j, i] − m). Every exponent
/// is ≤ 0 (no overflow) and one is 0 (the sum is ≥ 1, so the log never sees an underflowed 0):
/// elements of ±1e4 and beyond give finite, correctly rounded results, where the naive formula gives
/// inf or log 0. A lane of −inf only (every position hidden) has Y = log 0 = −inf and passes no
/// gradient; +inf or NaN elements are refused with value_error, as softmax refuses them.
/// VJP: dX[o, j, i] = G[o, i]·W[o, j, i], W = softmax of X along the axis (saved by forward).
///   ∂Y/∂X_j = exp(X_j) / Σ_k exp(X_k) = W_j: the derivative of log Z is Z'/Z, and the only
///   term of Z = Σ_k exp(X_k) that moves with X_j is exp(X_j). The shift m changes nothing:
///   m + log Σ exp(X_j − m) equals log Σ exp(X_j) for every m, so its derivative with respect
///   to m is zero and m may be held constant (even where the maximum is tied). Then
///   dX[o', j, i'] = Σ_{o,i} G[o, i]·δ_oo'·δ_ii'·W[o', j, i'] = G[o', i']·W[o', j, i'].
/// W is kept as exp(X_j − m)/Σ: recomputing it in the VJP as exp(X_j − Y) would lose the digits
/// of Y's rounding (ulp(1e4) ≈ 2e-12 in double) in every weight.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "ops/axis.hpp"
#include "autodiff/tape.hpp"

#include <limits>

namespace tapegrad {

struct LogSumExp {
    static constexpr std::string_view name = "logsumexp";
    static constexpr Arity arity{1};

    using Settings = reduction::Settings;
    static constexpr auto fields(auto& s) { return reduction::fields(s); }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return logsumexp(in[0], reduction::axis_argument(s.axis), s.keepdims);
    }

    /// The lane's largest element; refuses +inf and NaN.
    template <Scalar T>
    static T lane_max(const Tensor<T>& X, const axes::View& lanes, std::size_t first) {
        T largest = -std::numeric_limits<T>::infinity();
        for (std::size_t j = 0; j < lanes.dim; ++j) {
            const std::size_t k = first + j * lanes.stride();
            if (is_nan(X[k]) || X[k] == std::numeric_limits<T>::infinity()) {
                throw value_error(fmt::format("logsumexp: element {} at {} of shape {}; elements must be finite or -inf",
                                              to_double(X[k]), index_string(X.shape(), k), X.shape().to_string()));
            }
            if (shift_prefers(X[k], largest)) largest = X[k];  // (a shift: autodiff/dual.hpp)
        }
        return largest;
    }

    /// out = Y = m + log Σ exp(X − m); W = the softmax weights along the axis.
    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& out, Tensor<T>& W) {
        using std::exp;
        using std::log;
        const Tensor<T>& X = *in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        out.resize(reduction::reduced_shape(X.shape(), s));
        W.resize(X.shape());
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            const T largest = lane_max(X, lanes, first);
            if (largest == -std::numeric_limits<T>::infinity()) {  // every element −inf: log 0
                out[lane] = largest;
                for (std::size_t j = 0; j < lanes.dim; ++j) W[first + j * lanes.stride()] = T(0);
                continue;
            }
            T total(0);
            for (std::size_t j = 0; j < lanes.dim; ++j) {
                const std::size_t k = first + j * lanes.stride();
                W[k] = exp(X[k] - largest);
                total += W[k];
            }
            out[lane] = largest + log(total);
            const T inverse = T(1) / total;
            for (std::size_t j = 0; j < lanes.dim; ++j) W[first + j * lanes.stride()] *= inverse;
        }
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& W = at.saved;
        const axes::View lanes = axes::around(dX.shape(), s.axis);
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            for (std::size_t j = 0; j < lanes.dim; ++j) {
                const std::size_t k = first + j * lanes.stride();
                dX[k] = at.G[lane] * W[k];
            }
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        return {2 * in[0]->size(), in[0]->size()};
    }
};

/// log Σ exp along `axis` (in [−rank, rank)), computed stably; keepdims keeps the axis as a
/// dimension of size 1.
template <Scalar T>
Var<T> logsumexp(const Var<T>& X, int axis, bool keepdims = false) {
    const reduction::Settings s = reduction::checked(LogSumExp::name, X, axis, keepdims);
    return X.tape().template record<LogSumExp>({X}, s);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> logsumexp<T>(const Var<T>&, int, bool);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
