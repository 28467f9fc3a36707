/// \file
/// Multi-head attention composed from ops (its gradient is the chain of the ops' VJPs):
///   Q = X_q·W_Q, K = X_kv·W_K, V = X_kv·W_V            X [B, T, D] (or [T, D]); W_Q [D × H·dh],
///                                                        W_K [D × H_kv·dh], W_V [D × H_kv·dv]
///   Q_h, K_h, V_h = split_heads(...)                     [B, H, T, dh]: heads become batch matrices
///   (rope: Q_h, K_h rotated at their absolute positions, ops/rope.hpp; grouped-query attention,
///    H_kv < H: K_h, V_h repeated for each group of H/H_kv query heads, ops/repeat_heads.hpp)
///   O_h = softmax(mask(Q_h·K_hᵀ/√dh))·V_h                per head, scaled by the head width dh
///                                                        (masked_attention, models/attention.hpp)
///   Y = merge_heads(O_h)·W_O                              W_O [H·dv × D_out] -> Y [B, Tq, D_out]
/// Options: causal masking with a query offset (queries X_q are the block at absolute positions
/// query_offset.., keys and values X_kv the whole history), per-sequence lengths (padding, see
/// models/masks.hpp: padded keys are never attended to, padded query rows output exactly zero),
/// dropout on the weights with an explicit generator, rotary positions (rope), key/value heads
/// fewer than query heads (kv_heads), a causal sliding window and ALiBi's biases (models/masks.hpp,
/// ops/alibi.hpp), and the per-head kernel: `composed` (the ops above) or `fused`
/// (ops/fused_attention.hpp, one op for the whole softmax(QKᵀ/√d + bias)V, which supports causal
/// masking, the offset, the window and ALiBi; not padding or dropout).
/// A key/value cache (generation): self-attention over X's rows appended to the keys and values
/// (rotated) of the positions before them; only X's rows are projected.
#pragma once

#include "models/attention.hpp"
#include "models/masks.hpp"
#include "ops/concat.hpp"
#include "ops/fused_attention.hpp"
#include "ops/matmul.hpp"
#include "ops/merge_heads.hpp"
#include "ops/repeat_heads.hpp"
#include "ops/rope.hpp"
#include "ops/split_heads.hpp"

#include <fmt/core.h>

#include <optional>
#include <vector>

namespace tapegrad {

/// How each head's softmax(Q·Kᵀ/√d)·V is computed.
enum class AttentionKernel {
    composed,  ///< matmul, scale, mask, softmax, dropout, matmul: every intermediate on the tape
    fused,     ///< one fused_attention op (causal, query_offset, window, ALiBi; no padding, no dropout)
};

constexpr std::string_view attention_kernel_name(AttentionKernel kernel) {
    return kernel == AttentionKernel::fused ? "fused" : "composed";
}

/// The kernel a command line names ("composed" or "fused").
inline AttentionKernel attention_kernel_from(std::string_view name) {
    for (const AttentionKernel kernel : {AttentionKernel::composed, AttentionKernel::fused}) {
        if (name == attention_kernel_name(kernel)) return kernel;
    }
    throw usage_error(fmt::format("attention kernel must be 'composed' or 'fused', not '{}'", name));
}

struct MultiHeadOptions {
    std::size_t heads = 1;
    std::size_t kv_heads = 0;              ///< key/value heads, dividing heads (0: as many as heads)
    bool causal = true;
    std::size_t query_offset = 0;          ///< absolute position of the first query (key-value cache)
    std::vector<std::size_t> lengths{};    ///< per-sequence lengths; empty = no padding
    std::optional<DropoutSettings> dropout{};
    AttentionKernel kernel = AttentionKernel::composed;
    /// Rotary positions on Q (its rows at query_offset..) and K (the memory's rows at 0..); the
    /// settings' own first_position is not read.
    std::optional<RopeSettings> rope{};
    std::size_t window = 0;  ///< causal sliding window of this many keys (w keys up to the query's own; 0: none)
    bool alibi = false;      ///< ALiBi's per-head linear bias on the scores (models/masks.hpp)

    std::size_t key_value_heads() const { return kv_heads == 0 ? heads : kv_heads; }
    /// Which keys each query sees and the bias on its scores: the one translation of the options
    /// that both kernels read (the composed path's mask and bias tensors, the fused op's settings).
    /// Padding (lengths) is the composed kernel's alone and is not part of it.
    AttentionPattern pattern() const {
        return {.causal = causal, .query_offset = query_offset, .window = window, .alibi_heads = alibi ? heads : 0};
    }
};

/// The keys (rotated, when the attention uses rope) and values of the positions so far, per
/// head: [B, H_kv, S, dh] and [B, H_kv, S, dv] (empty before the first call).
template <Scalar T>
struct KeyValueCache {
    Tensor<T> K, V;
    std::size_t length = 0;  ///< S
};

template <Scalar T>
struct MultiHeadWeights {
    Var<T> W_Q, W_K, W_V, W_O;  ///< W_Q and W_K may be one Var (tied): the gradient sums both paths
};

template <Scalar T>
struct MultiHeadResult {
    Var<T> Q, K, V;  ///< per-head projections [B, H, T, dh]
    Var<T> A;        ///< per-head weights before dropout [B, H, Tq, Tk] (composed kernel only)
    Var<T> O;        ///< per-head outputs [B, H, Tq, dv]
    Var<T> Y;        ///< merged and projected output [B, Tq, D_out]
};

namespace detail {

template <Scalar T>
void check_multihead(const Var<T>& X_query, const Var<T>& X_memory, const MultiHeadWeights<T>& w,
                     const MultiHeadOptions& options) {
    constexpr std::string_view where = "multihead_attention";
    checks::matrix(where, "X_query", X_query);
    checks::matrix(where, "X_memory", X_memory);
    const Shape &xq = X_query.shape(), &xm = X_memory.shape();
    if (xq.rank() > 3 || !xq.same_batch(xm)) {
        throw shape_error(fmt::format("{}: X_query {} and X_memory {} must both be [T, D] or [B, T, D] with one B",
                                      where, xq.to_string(), xm.to_string()));
    }
    if (xq.cols() != xm.cols()) {
        throw shape_error(fmt::format("{}: X_query {} and X_memory {} need one model width D", where, xq.to_string(),
                                      xm.to_string()));
    }
    const std::size_t D = xq.cols(), H = options.heads, H_kv = options.key_value_heads();
    if (H == 0) throw shape_error(fmt::format("{}: heads must be at least 1", where));
    if (H % H_kv != 0) {
        throw shape_error(fmt::format("{}: {} key/value heads do not divide {} query heads", where, H_kv, H));
    }
    for (const auto& [name, W, n] : {std::tuple{"W_Q", w.W_Q, H}, std::tuple{"W_K", w.W_K, H_kv},
                                     std::tuple{"W_V", w.W_V, H_kv}}) {
        checks::matrix(where, name, W);
        if (W.shape().rank() != 2 || W.shape().rows() != D || W.shape().cols() % n != 0) {
            throw shape_error(fmt::format("{}: {} is {}; it must be [{} × a multiple of {} heads]", where, name,
                                          W.shape().to_string(), D, n));
        }
    }
    if (w.W_Q.shape().cols() / H != w.W_K.shape().cols() / H_kv) {
        throw shape_error(fmt::format("{}: W_Q {} over {} heads and W_K {} over {} heads need one head width", where,
                                      w.W_Q.shape().to_string(), H, w.W_K.shape().to_string(), H_kv));
    }
    checks::matrix(where, "W_O", w.W_O);
    const std::size_t merged = w.W_V.shape().cols() / H_kv * H;  // H heads of W_V's head width
    if (w.W_O.shape().rank() != 2 || w.W_O.shape().rows() != merged) {
        throw shape_error(fmt::format("{}: W_O is {}; it needs {} rows (the merged heads' width, W_V is {})", where,
                                      w.W_O.shape().to_string(), merged, w.W_V.shape().to_string()));
    }
    if (!options.lengths.empty() && (xq.rank() != 3 || options.lengths.size() != xq[0])) {
        throw shape_error(fmt::format("{}: {} sequence lengths for X_query {}; give one length per sequence of a "
                                      "[B, T, D] batch",
                                      where, options.lengths.size(), xq.to_string()));
    }
    if (options.window != 0 && (!options.causal || !options.lengths.empty())) {
        throw usage_error(fmt::format("{}: a sliding window (window {}) is causal, without padding lengths", where,
                                      options.window));
    }
    if (options.kernel == AttentionKernel::fused) {
        if (!options.lengths.empty()) {
            throw usage_error(fmt::format("{}: the fused kernel supports causal masking, query_offset, sliding "
                                          "windows and ALiBi; padding (lengths) needs AttentionKernel::composed",
                                          where));
        }
        if (options.dropout) {
            throw usage_error(fmt::format("{}: the fused kernel supports causal masking, query_offset, sliding "
                                          "windows and ALiBi; dropout needs AttentionKernel::composed",
                                          where));
        }
    }
}

/// The memory's key or value heads: projected, split into the key/value heads, keys rotated at the
/// absolute positions first.. when the attention uses rope.
template <Scalar T>
Var<T> key_value_heads(const Var<T>& X, const Var<T>& W, const MultiHeadOptions& options, std::size_t first,
                       bool keys) {
    Var<T> heads = split_heads(matmul(X, W), options.key_value_heads());
    if (keys && options.rope) heads = rope(heads, {options.rope->base, options.rope->pairing, first});
    return heads.named(keys ? "K heads" : "V heads");
}

/// The cached rows followed by `own` along time, which the cache then holds.
template <Scalar T>
Var<T> after_cached(const Var<T>& own, Tensor<T>& cached) {
    if (cached.size() == 0) {
        cached = own.value();
        return own;
    }
    const Var<T> all = concat({own.tape().constant(cached, "key/value cache"), own}, -2);
    cached = all.value();
    return all;
}

/// Each query head's softmax(Q·Kᵀ/√d)·V, through the kernel the options name; K and V already
/// hold a head per query head.
template <Scalar T>
void attend_per_head(const Var<T>& Q, const Var<T>& K, const Var<T>& V, const MultiHeadOptions& options,
                     MultiHeadResult<T>& result) {
    const AttentionPattern pattern = options.pattern();
    if (options.kernel == AttentionKernel::fused) {
        result.O = fused_attention(Q, K, V, {.pattern = pattern});
        return;
    }
    const std::size_t Tq = Q.shape().rows(), Tk = K.shape().rows();
    pattern.check("multihead_attention", Tq, Tk);
    const Tensor<double> M = options.lengths.empty() ? pattern.mask(Tq, Tk)
                                                     : padding_mask(options.lengths, Tq, Tk, options.query_offset,
                                                                    options.causal, options.heads);
    const std::optional<Tensor<double>> bias = pattern.has_bias() ? std::optional(pattern.bias(Tq, Tk)) : std::nullopt;
    const AttentionResult<T> heads = masked_attention(Q, K, V, M, options.dropout, bias ? &*bias : nullptr);
    result.A = heads.A;
    result.O = heads.O;
}

template <Scalar T>
MultiHeadResult<T> attend(const Var<T>& X_query, const Var<T>& X_memory, const MultiHeadWeights<T>& w,
                          const MultiHeadOptions& options, KeyValueCache<T>* cache) {
    check_multihead(X_query, X_memory, w, options);
    const std::size_t H = options.heads, H_kv = options.key_value_heads(), first_key = cache ? cache->length : 0;
    if (cache && options.query_offset != cache->length) {
        throw usage_error(fmt::format("multihead_attention: query_offset {} but the key/value cache holds {} positions",
                                      options.query_offset, cache->length));
    }
    Var<T> Q = split_heads(matmul(X_query, w.W_Q), H);
    if (options.rope) Q = rope(Q, {options.rope->base, options.rope->pairing, options.query_offset});
    Var<T> K = key_value_heads(X_memory, w.W_K, options, first_key, true);
    Var<T> V = key_value_heads(X_memory, w.W_V, options, first_key, false);
    if (cache) {
        K = after_cached(K, cache->K);
        V = after_cached(V, cache->V);
        cache->length = K.shape().rows();
    }
    // Positions matter only to causality and padding; plain attention takes any Tq and Tk.
    if (options.causal || !options.lengths.empty()) {
        check_block("multihead_attention", Q.shape().rows(), K.shape().rows(), options.query_offset);
    }
    MultiHeadResult<T> result{Q.named("Q heads"), K, V, {}, {}, {}};
    const Var<T> K_all = H_kv == H ? K : repeat_heads(K, H / H_kv), V_all = H_kv == H ? V : repeat_heads(V, H / H_kv);
    attend_per_head(result.Q, K_all, V_all, options, result);
    result.Y = matmul(merge_heads(result.O), w.W_O).named("Y");
    return result;
}

}  // namespace detail

/// Queries from X_query, keys and values from X_memory (the history, for the key-value cache case).
template <Scalar T>
MultiHeadResult<T> multihead_attention(const Var<T>& X_query, const Var<T>& X_memory, const MultiHeadWeights<T>& w,
                                       const MultiHeadOptions& options) {
    return detail::attend<T>(X_query, X_memory, w, options, nullptr);
}

/// Self-attention: queries, keys and values all from X. With a cache, keys and values are those it
/// holds followed by X's own (whose positions start at options.query_offset, which must be the
/// cache's length), and the cache then holds them all.
template <Scalar T>
MultiHeadResult<T> multihead_attention(const Var<T>& X, const MultiHeadWeights<T>& w, const MultiHeadOptions& options,
                                       KeyValueCache<T>* cache = nullptr) {
    return detail::attend(X, X, w, options, cache);
}

}  // namespace tapegrad
