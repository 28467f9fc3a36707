/// \file
/// cross_entropy: the mean negative log-likelihood of integer targets under next-token logits,
/// the training loss (it replaces the spec's fixed probe G with a real objective).
///   logits [..., V] viewed as N rows of V classes (N = size / V), targets t_0 .. t_{N−1} in [0, V)
///   (Settings::targets)  ->  J [] (a scalar)
///   J = (1/N) Σ_r (log Σ_c exp(z_rc) − z_{r t_r})
/// The log-sum-exp subtracts each row's maximum first (log_partition, shared with
/// ops/log_softmax.hpp), so logits of ±1e4 give the exact finite loss instead of inf − inf.
/// The softmax probabilities P are saved for the VJP.
/// VJP (G is the scalar upstream gradient):
///   dz_rc = G·(P_rc − [c = t_r]) / N
/// because ∂/∂z_rc log Σ exp(z_r·) = P_rc (the softmax), and ∂z_{r t_r}/∂z_rc = [c = t_r].
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "ops/log_softmax.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace tapegrad {

struct CrossEntropy {
    static constexpr std::string_view name = "cross_entropy";
    static constexpr Arity arity{1};

    struct Settings {
        std::vector<std::size_t> targets;  ///< one class per row (checked < V when recorded)
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("targets", s.targets)}; }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return cross_entropy(in[0], std::span(s.targets));
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& J, Tensor<T>& P) {
        const Tensor<T>& z = *in[0];
        const std::size_t V = z.cols(), N = z.size() / V;
        P.resize(z.shape());
        T total(0);
        for (std::size_t r = 0; r < N; ++r) {
            T* probabilities = P.data().data() + r * V;
            const LogPartition<T> part = log_partition(name, z, r, probabilities);
            for (std::size_t c = 0; c < V; ++c) probabilities[c] /= part.Z;
            // −log P_{r t} = log Z + max − z_t, written so that no large terms cancel.
            total += part.log_Z - (z[r * V + s.targets[r]] - part.max);
        }
        J.resize(Shape{});
        J[0] = total / T(N);
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dz) {
        const Tensor<T>& P = at.saved;
        const std::size_t V = at.in[0]->cols(), N = at.in[0]->size() / V;
        const T factor = at.G[0] / T(N);
        for (std::size_t k = 0; k < P.size(); ++k) dz[k] = factor * P[k];
        for (std::size_t r = 0; r < N; ++r) dz[r * V + s.targets[r]] -= factor;
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        return {in[0]->size(), in[0]->size()};
    }
};

/// Mean cross-entropy of `targets` (one per row of `logits`, each in [0, V)).
template <Scalar T>
Var<T> cross_entropy(const Var<T>& logits, std::span<const std::size_t> targets) {
    checks::non_empty(CrossEntropy::name, "logits", logits);
    if (logits.shape().rank() == 0) throw shape_error("cross_entropy: logits must have a class dimension, got a scalar");
    const std::size_t V = logits.shape().cols(), N = logits.shape().size() / V;
    if (targets.size() != N) {
        throw shape_error(fmt::format("cross_entropy: {} targets for logits of shape {} ({} rows)", targets.size(),
                                      logits.shape().to_string(), N));
    }
    for (std::size_t r = 0; r < N; ++r) {
        if (targets[r] >= V) {
            throw value_error(fmt::format("cross_entropy: target {} in row {} is out of range for {} classes (logits {})",
                                          targets[r], r, V, logits.shape().to_string()));
        }
    }
    return logits.tape().template record<CrossEntropy>(
        {logits}, CrossEntropy::Settings{std::vector<std::size_t>(targets.begin(), targets.end())});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> cross_entropy<T>(const Var<T>&, std::span<const std::size_t>);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
