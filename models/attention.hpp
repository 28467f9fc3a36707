// Single-head attention composed only from ops, so its gradient is the tape's chain of the ops'
// VJPs and is checked end to end (it has no VJP of its own):
//   Q = X·W_Q, K = X·W_K, V = X·W_V         X [T×D], W_Q, W_K [D×d], W_V [D×r]
//   S = Q·Kᵀ/√d,  A = softmax(S),  O = A·V   S, A [T×T], O [T×r]
// Every intermediate stays reachable (and named on the tape) for inspection and tests.
#pragma once

#include "ops/matmul.hpp"
#include "ops/scale.hpp"
#include "ops/softmax.hpp"
#include "ops/transpose.hpp"

#include <fmt/format.h>

namespace tapegrad {

template <Scalar T>
struct AttentionResult {
    Var<T> Q, K, V;  // projections (the inputs themselves when attention starts from Q, K, V)
    Var<T> S;        // scores Q·Kᵀ/√d
    Var<T> A;        // weights softmax(S), one distribution per query row
    Var<T> O;        // output A·V
};

namespace detail {

template <Scalar T>
void check_qkv(std::string_view where, const Var<T>& Q, const Var<T>& K, const Var<T>& V) {
    checks::matrix(where, "Q", Q);
    checks::matrix(where, "K", K);
    checks::matrix(where, "V", V);
    const Shape &q = Q.shape(), &k = K.shape(), &v = V.shape();
    if (!q.same_batch(k) || !k.same_batch(v)) {
        throw shape_error(fmt::format("{}: Q {}, K {} and V {} need the same leading dimensions", where, q.to_string(),
                                      k.to_string(), v.to_string()));
    }
    if (q.cols() != k.cols()) {
        throw shape_error(fmt::format("{}: queries and keys need one width d: Q is {}, K is {}", where, q.to_string(),
                                      k.to_string()));
    }
    if (k.rows() != v.rows()) {
        throw shape_error(fmt::format("{}: one value per key: K is {}, V is {}", where, k.to_string(), v.to_string()));
    }
}

}  // namespace detail

// Attention from given queries, keys and values: Q [..., T, d], K [..., T', d], V [..., T', r].
template <Scalar T>
AttentionResult<T> attention_from_qkv(const Var<T>& Q, const Var<T>& K, const Var<T>& V) {
    detail::check_qkv("attention", Q, K, V);
    const std::size_t d = Q.shape().cols();
    const Var<T> S = scale(matmul(Q, transpose(K)), inv_sqrt<T>(d)).named("S");
    const Var<T> A = softmax(S).named("A");
    const Var<T> O = matmul(A, V).named("O");
    return {Q, K, V, S, A, O};
}

// Attention with its three projections from one input X.
template <Scalar T>
AttentionResult<T> attention(const Var<T>& X, const Var<T>& W_Q, const Var<T>& W_K, const Var<T>& W_V) {
    checks::matrix("attention", "X", X);
    const std::size_t D = X.shape().cols();
    for (const auto& [name, W] : {std::pair{"W_Q", W_Q}, std::pair{"W_K", W_K}, std::pair{"W_V", W_V}}) {
        checks::matrix("attention", name, W);
        if (W.shape().rows() != D) {
            throw shape_error(fmt::format("attention: {} is {} but X is {}: {} needs {} rows", name,
                                          W.shape().to_string(), X.shape().to_string(), name, D));
        }
    }
    if (W_Q.shape().cols() != W_K.shape().cols()) {
        throw shape_error(fmt::format("attention: W_Q is {} and W_K is {}: queries and keys need one width d",
                                      W_Q.shape().to_string(), W_K.shape().to_string()));
    }
    const Var<T> Q = matmul(X, W_Q).named("Q");
    const Var<T> K = matmul(X, W_K).named("K");
    const Var<T> V = matmul(X, W_V).named("V");
    return attention_from_qkv(Q, K, V);
}

}  // namespace tapegrad
