/// \file
/// Single-head attention: the one place in tapegrad where attention is composed from ops. Its
/// gradient is the tape's chain of the ops' hand-derived VJPs (it has no VJP of its own), checked
/// end to end:
///   Q = X·W_Q, K = X·W_K, V = X·W_V              X [T×D], W_Q, W_K [D×d], W_V [D×r]
///   S = Q·Kᵀ/√d,  S' = mask(S [+ bias], M),  A = softmax(S'),  A' = dropout(A),  O = A'·V
///       Q [..., Tq, d], K [..., Tk, d], V [..., Tk, r] (same leading dimensions) -> O [..., Tq, r]
/// The mask and the dropout are optional. Without a mask no mask node is recorded, so plain
/// attention's graph (its node count, DOT picture and the checker's branch names) holds only the
/// projections, S, A and O.
///   * attention / attention_from_qkv: no mask, no dropout;
///   * masked_attention: any 0/1 mask M (padding, see models/masks.hpp), optional dropout;
///   * causal_attention: the spec's exercise, with its query_offset implemented: query i sits at
///     absolute position query_offset + i and sees key j only when j <= query_offset + i
///     (causal_mask in models/masks.hpp), so a block of new queries attends over a longer key
///     history, the key-value cache case. The spec's stub refuses query_offset != 0.
/// Every intermediate stays reachable (and named on the tape) for inspection and tests; A is the
/// attention probabilities *before* dropout, as the spec's exercise returns them. Dropout draws
/// its keep-mask from the caller's explicit seeded generator.
#pragma once

#include "autodiff/instances.hpp"
#include "models/masks.hpp"
#include "ops/add.hpp"
#include "ops/checks.hpp"
#include "ops/dropout.hpp"
#include "ops/mask.hpp"
#include "ops/matmul.hpp"
#include "ops/operators.hpp"
#include "ops/scale.hpp"
#include "ops/softmax.hpp"
#include "ops/transpose.hpp"

#include <fmt/core.h>

#include <array>
#include <functional>
#include <optional>
#include <random>
#include <string_view>

namespace tapegrad {

/// Dropout on the attention weights: probability p in [0, 1) and the generator the keep-mask is
/// drawn from (advanced by each call).
struct DropoutSettings {
    double p = 0.0;
    std::reference_wrapper<std::mt19937_64> generator;
};

template <Scalar T>
struct AttentionResult {
    Var<T> Q, K, V;    ///< projections (the inputs themselves when attention starts from Q, K, V)
    Var<T> S;          ///< scaled scores Q·Kᵀ/√d, before masking
    Var<T> A;          ///< weights softmax(S'), one distribution per query row, before dropout
                       /// (a row whose every key is hidden is all zero)
    Var<T> A_dropped;  ///< the weights actually applied to V (A itself without dropout)
    Var<T> O;          ///< output A'·V
};

namespace detail {

/// The composition itself. `visible` is the 0/1 mask ([Tq × Tk] shared by the batch, or one per
/// matrix of S); nullptr means every key is visible, and then no mask node is recorded. Callers
/// check Q, K and V first (checks::attention_inputs) under their own name, so an error names the
/// function the user called.
template <Scalar T>
AttentionResult<T> compose_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, const Tensor<double>* visible,
                                     const std::optional<DropoutSettings>& dropout, const Tensor<double>* bias = nullptr) {
    const std::size_t d = Q.shape().cols();
    const Var<T> S = (matmul(Q, transpose(K)) * inv_sqrt<T>(d)).named("S");  // records scale
    const Var<T> biased = bias ? add(S, Q.tape().constant(tensor_cast<T>(*bias), "attention bias")) : S;
    const Var<T> scores = visible ? mask(biased, Q.tape().constant(tensor_cast<T>(*visible), "attention mask")) : biased;
    const Var<T> A = softmax(scores).named("A");
    const Var<T> A_dropped =
        dropout ? tapegrad::dropout(A, dropout->p, dropout->generator.get()).named("A dropped") : A;
    const Var<T> O = matmul(A_dropped, V).named("O");
    return {Q, K, V, S, A, A_dropped, O};
}

/// Q = X·W_Q, K = X·W_K, V = X·W_V, after checking that the weights fit X and each other.
template <Scalar T>
std::array<Var<T>, 3> project_qkv(std::string_view where, const Var<T>& X, const Var<T>& W_Q, const Var<T>& W_K,
                                  const Var<T>& W_V) {
    checks::matrix(where, "X", X);
    const std::size_t D = X.shape().cols();
    for (const auto& [name, W] : {std::pair{"W_Q", W_Q}, std::pair{"W_K", W_K}, std::pair{"W_V", W_V}}) {
        checks::matrix(where, name, W);
        if (W.shape().rows() != D) {
            throw shape_error(fmt::format("{}: {} is {} but X is {}: {} needs {} rows", where, name,
                                          W.shape().to_string(), X.shape().to_string(), name, D));
        }
    }
    if (W_Q.shape().cols() != W_K.shape().cols()) {
        throw shape_error(fmt::format("{}: W_Q is {} and W_K is {}: queries and keys need one width d", where,
                                      W_Q.shape().to_string(), W_K.shape().to_string()));
    }
    return {matmul(X, W_Q).named("Q"), matmul(X, W_K).named("K"), matmul(X, W_V).named("V")};
}

}  // namespace detail

/// Attention from given queries, keys and values: Q [..., T, d], K [..., T', d], V [..., T', r].
template <Scalar T>
AttentionResult<T> attention_from_qkv(const Var<T>& Q, const Var<T>& K, const Var<T>& V) {
    checks::attention_inputs("attention", Q, K, V);
    return detail::compose_attention(Q, K, V, nullptr, std::nullopt);
}

/// Attention with its three projections from one input X.
template <Scalar T>
AttentionResult<T> attention(const Var<T>& X, const Var<T>& W_Q, const Var<T>& W_K, const Var<T>& W_V) {
    const auto [Q, K, V] = detail::project_qkv("attention", X, W_Q, W_K, W_V);
    return attention_from_qkv(Q, K, V);
}

/// Attention with an explicit 0/1 mask M ([Tq × Tk] shared by the batch, or one per matrix of S),
/// and optionally an additive bias on the scores before the mask (ALiBi's, models/masks.hpp; any
/// shape that broadcasts with S [..., Tq, Tk]).
template <Scalar T>
AttentionResult<T> masked_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, const Tensor<double>& M,
                                    std::optional<DropoutSettings> dropout = std::nullopt,
                                    const Tensor<double>* bias = nullptr) {
    checks::attention_inputs("masked_attention", Q, K, V);
    return detail::compose_attention(Q, K, V, &M, dropout, bias);
}

/// The spec's causal_attention, with query_offset implemented.
template <Scalar T>
AttentionResult<T> causal_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, std::size_t query_offset = 0,
                                    std::optional<DropoutSettings> dropout = std::nullopt) {
    checks::attention_inputs("causal_attention", Q, K, V);
    const Tensor<double> M = causal_mask(Q.shape().rows(), K.shape().rows(), query_offset);
    return detail::compose_attention(Q, K, V, &M, dropout);
}

/// Causal self-attention with its three projections from one input X: query i sees keys j <= i.
template <Scalar T>
AttentionResult<T> causal_attention(const Var<T>& X, const Var<T>& W_Q, const Var<T>& W_K, const Var<T>& W_V) {
    const auto [Q, K, V] = detail::project_qkv("causal_attention", X, W_Q, W_K, W_V);
    return causal_attention(Q, K, V);
}

// Compiled once in the library for float, double, mp50 and the duals, as the ops are
// (autodiff/instances.hpp, src/instances/<type>.cpp): a program calling attention on those types
// does not compile the composition again (the quickstart's compile: 11 MB of GCC's memory).
#define TAPEGRAD_MODEL_INSTANCES(T)                                                                                    \
    TAPEGRAD_INSTANCE AttentionResult<T> attention_from_qkv<T>(const Var<T>&, const Var<T>&, const Var<T>&);           \
    TAPEGRAD_INSTANCE AttentionResult<T> attention<T>(const Var<T>&, const Var<T>&, const Var<T>&, const Var<T>&);     \
    TAPEGRAD_INSTANCE AttentionResult<T> masked_attention<T>(const Var<T>&, const Var<T>&, const Var<T>&,              \
                                                             const Tensor<double>&, std::optional<DropoutSettings>,    \
                                                             const Tensor<double>*);                                   \
    TAPEGRAD_INSTANCE AttentionResult<T> causal_attention<T>(const Var<T>&, const Var<T>&, const Var<T>&, std::size_t, \
                                                             std::optional<DropoutSettings>);                          \
    TAPEGRAD_INSTANCE AttentionResult<T> causal_attention<T>(const Var<T>&, const Var<T>&, const Var<T>&,              \
                                                             const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_MODEL_INSTANCES)
#undef TAPEGRAD_MODEL_INSTANCES

}  // namespace tapegrad
