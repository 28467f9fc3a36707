/// \file
/// Multi-head attention composed from ops (its gradient is the chain of the ops' VJPs):
///   Q = X_q·W_Q, K = X_kv·W_K, V = X_kv·W_V            X [B, T, D] (or [T, D]); W_Q, W_K [D × H·dh], W_V [D × H·dv]
///   Q_h, K_h, V_h = split_heads(...)                     [B, H, T, dh]: heads become batch matrices
///   O_h = softmax(mask(Q_h·K_hᵀ/√dh))·V_h                per head, scaled by the head width dh
///                                                        (masked_attention, models/attention.hpp)
///   Y = merge_heads(O_h)·W_O                              W_O [H·dv × D_out] -> Y [B, Tq, D_out]
/// Options: causal masking with a query offset (queries X_q are the block at absolute positions
/// query_offset.., keys and values X_kv the whole history), per-sequence lengths (padding, see
/// models/masks.hpp: padded keys are never attended to, padded query rows output exactly zero),
/// dropout on the weights with an explicit generator, and the per-head kernel: `composed` (the
/// ops above) or `fused` (ops/fused_attention.hpp, one op for the whole softmax(QKᵀ/√d)V, which
/// supports causal masking and the offset only).
#pragma once

#include "models/attention.hpp"
#include "models/masks.hpp"
#include "ops/fused_attention.hpp"
#include "ops/matmul.hpp"
#include "ops/merge_heads.hpp"
#include "ops/split_heads.hpp"

#include <fmt/core.h>

#include <optional>
#include <vector>

namespace tapegrad {

/// How each head's softmax(Q·Kᵀ/√d)·V is computed.
enum class AttentionKernel {
    composed,  ///< matmul, scale, mask, softmax, dropout, matmul: every intermediate on the tape
    fused,     ///< one fused_attention op (causal + query_offset only; no padding, no dropout)
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
    bool causal = true;
    std::size_t query_offset = 0;          ///< absolute position of the first query (key-value cache)
    std::vector<std::size_t> lengths{};    ///< per-sequence lengths; empty = no padding
    std::optional<DropoutSettings> dropout{};
    AttentionKernel kernel = AttentionKernel::composed;
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
    const std::size_t D = xq.cols(), H = options.heads;
    if (H == 0) throw shape_error(fmt::format("{}: heads must be at least 1", where));
    for (const auto& [name, W] : {std::pair{"W_Q", w.W_Q}, std::pair{"W_K", w.W_K}, std::pair{"W_V", w.W_V}}) {
        checks::matrix(where, name, W);
        if (W.shape().rank() != 2 || W.shape().rows() != D || W.shape().cols() % H != 0) {
            throw shape_error(fmt::format("{}: {} is {}; it must be [{} × a multiple of {} heads]", where, name,
                                          W.shape().to_string(), D, H));
        }
    }
    if (w.W_Q.shape().cols() != w.W_K.shape().cols()) {
        throw shape_error(fmt::format("{}: W_Q {} and W_K {} need one width", where, w.W_Q.shape().to_string(),
                                      w.W_K.shape().to_string()));
    }
    checks::matrix(where, "W_O", w.W_O);
    if (w.W_O.shape().rank() != 2 || w.W_O.shape().rows() != w.W_V.shape().cols()) {
        throw shape_error(fmt::format("{}: W_O is {}; it needs {} rows (the merged heads' width, W_V is {})", where,
                                      w.W_O.shape().to_string(), w.W_V.shape().cols(), w.W_V.shape().to_string()));
    }
    if (!options.lengths.empty() && (xq.rank() != 3 || options.lengths.size() != xq[0])) {
        throw shape_error(fmt::format("{}: {} sequence lengths for X_query {}; give one length per sequence of a "
                                      "[B, T, D] batch",
                                      where, options.lengths.size(), xq.to_string()));
    }
    if (options.kernel == AttentionKernel::fused) {
        if (!options.lengths.empty()) {
            throw usage_error(fmt::format("{}: the fused kernel supports causal masking and query_offset only; "
                                          "padding (lengths) needs AttentionKernel::composed",
                                          where));
        }
        if (options.dropout) {
            throw usage_error(fmt::format("{}: the fused kernel supports causal masking and query_offset only; "
                                          "dropout needs AttentionKernel::composed",
                                          where));
        }
    }
}

}  // namespace detail

/// Queries from X_query, keys and values from X_memory (the history, for the key-value cache case).
template <Scalar T>
MultiHeadResult<T> multihead_attention(const Var<T>& X_query, const Var<T>& X_memory, const MultiHeadWeights<T>& w,
                                       const MultiHeadOptions& options) {
    detail::check_multihead(X_query, X_memory, w, options);
    const std::size_t H = options.heads;
    const std::size_t Tq = X_query.shape().rows(), Tk = X_memory.shape().rows();
    // Positions matter only to causality and padding; plain attention takes any Tq and Tk.
    if (options.causal || !options.lengths.empty()) {
        detail::check_block("multihead_attention", Tq, Tk, options.query_offset);
    }

    const Var<T> Q = split_heads(matmul(X_query, w.W_Q), H).named("Q heads");
    const Var<T> K = split_heads(matmul(X_memory, w.W_K), H).named("K heads");
    const Var<T> V = split_heads(matmul(X_memory, w.W_V), H).named("V heads");

    MultiHeadResult<T> result{Q, K, V, {}, {}, {}};
    if (options.kernel == AttentionKernel::fused) {
        result.O = fused_attention(Q, K, V, options.causal, options.causal ? options.query_offset : 0);
    } else {
        const Tensor<double> M =
            !options.lengths.empty()
                ? padding_mask(options.lengths, Tq, Tk, options.query_offset, options.causal, H)
                : (options.causal ? causal_mask(Tq, Tk, options.query_offset) : Tensor<double>(Shape{Tq, Tk}, 1.0));
        const AttentionResult<T> heads = masked_attention(Q, K, V, M, options.dropout);
        result.A = heads.A;
        result.O = heads.O;
    }
    result.Y = matmul(merge_heads(result.O), w.W_O).named("Y");
    return result;
}

/// Self-attention: queries, keys and values all from X.
template <Scalar T>
MultiHeadResult<T> multihead_attention(const Var<T>& X, const MultiHeadWeights<T>& w, const MultiHeadOptions& options) {
    return multihead_attention(X, X, w, options);
}

}  // namespace tapegrad
