// causal_attention(query, key, value, query_offset, dropout): the spec's exercise, composed from
// ops so its gradient is the chain of their hand-derived VJPs (it has no VJP of its own).
//   Q [..., Tq, d], K [..., Tk, d], V [..., Tk, r] (same leading dimensions)
//   S = Q·Kᵀ/√d,  S' = mask(S, M),  A = softmax(S'),  A' = dropout(A),  O = A'·V  -> O [..., Tq, r]
// Query i sits at absolute position query_offset + i and sees key j only when
// j <= query_offset + i (models/masks.hpp), so a block of new queries attends over a longer key
// history: the key-value cache case. The spec's stub refuses query_offset != 0; this implements it.
// Returns the output and the attention probabilities A *before* dropout, as the spec's exercise
// does. Dropout (optional) draws its keep-mask from the caller's explicit seeded generator.
// masked_attention is the same computation with any 0/1 mask (padding, see models/masks.hpp).
#pragma once

#include "models/attention.hpp"
#include "models/masks.hpp"
#include "ops/dropout.hpp"
#include "ops/mask.hpp"
#include "ops/matmul.hpp"
#include "ops/scale.hpp"
#include "ops/softmax.hpp"
#include "ops/transpose.hpp"

#include <fmt/format.h>

#include <functional>
#include <optional>
#include <random>

namespace tapegrad {

// Dropout on the attention weights: probability p in [0, 1) and the generator the keep-mask is
// drawn from (advanced by each call).
struct DropoutSettings {
    double p = 0.0;
    std::reference_wrapper<std::mt19937_64> generator;
};

template <Scalar T>
struct CausalAttentionResult {
    Var<T> O;  // output A'·V
    Var<T> A;  // attention probabilities before dropout (rows of hidden queries are all zero)
    Var<T> S;  // scaled scores Q·Kᵀ/√d before masking
    Var<T> A_dropped;  // the weights actually applied to V (A itself without dropout)
};

// Attention with an explicit 0/1 mask M ([Tq × Tk] shared by the batch, or one per matrix of S).
template <Scalar T>
CausalAttentionResult<T> masked_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, const Tensor<double>& M,
                                          std::optional<DropoutSettings> dropout = std::nullopt) {
    detail::check_qkv("masked_attention", Q, K, V);
    Tape<T>& tape = Q.tape();
    const std::size_t d = Q.shape().cols();
    const Var<T> S = scale(matmul(Q, transpose(K)), inv_sqrt<T>(d)).named("S");
    const Var<T> visible = tape.constant(tensor_cast<T>(M), "attention mask");
    const Var<T> A = softmax(mask(S, visible)).named("A");
    Var<T> A_dropped = A;
    if (dropout) A_dropped = tapegrad::dropout(A, dropout->p, dropout->generator.get()).named("A dropped");
    const Var<T> O = matmul(A_dropped, V).named("O");
    return {O, A, S, A_dropped};
}

// The spec's causal_attention, with query_offset implemented.
template <Scalar T>
CausalAttentionResult<T> causal_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V,
                                          std::size_t query_offset = 0,
                                          std::optional<DropoutSettings> dropout = std::nullopt) {
    detail::check_qkv("causal_attention", Q, K, V);
    return masked_attention(Q, K, V, causal_mask(Q.shape().rows(), K.shape().rows(), query_offset), dropout);
}

}  // namespace tapegrad
