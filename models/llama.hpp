/// \file
/// A LLaMA-style decoder (LLaMA, Mistral's shape) composed from ops; its gradient is the tape's
/// chain of the ops' VJPs, checked end to end at 50 digits (tests/test_llama.cpp).
///   tokens t [B, T] (sequence-major), absolute positions p = first .. first + T − 1
///   X_0 = E[t]                                                 E [V × D]; no learned positions
///   for each of the L blocks (pre-norm, residual, no biases):
///     h = rms_norm(X; g_attn)
///     X ← X + multihead_attention(h)                           W_Q [D × H·dh], W_K, W_V [D × H_kv·dh],
///         Q, K rotated by rope at their absolute positions     W_O [H·dh × D]; causal;
///         K, V repeated for each group of H/H_kv query heads   (models/multihead.hpp)
///     h = rms_norm(X; g_mlp)
///     X ← X + (silu(h·W_gate) ∘ (h·W_up))·W_down               SwiGLU: W_gate, W_up [D × F], W_down [F × D]
///   logits = rms_norm(X; g_f)·W_out                            W_out [D × V], or Eᵀ when tied
/// rms_norm with ε inside the root (ops/rms_norm.hpp, ε = 1e-6 by default as LLaMA's norm_eps);
/// RoPE base 10000 in Meta's interleaved pairing by default (ops/rope.hpp), both configurable;
/// or ALiBi's biases instead of RoPE, and a causal sliding window (Mistral's), on either kernel
/// (models/multihead.hpp).
/// Generation: a LlamaCache holds, per block, the keys (already rotated) and values of every
/// position so far ([B, H_kv, S, dh]); a call with a cache projects only its own rows, appends
/// them, and attends over all (multihead_attention's key/value cache).
/// Initialisation (as the transformer's, GPT-2's): every matrix N(0, 0.02²), the residual outputs
/// W_O and W_down N(0, (0.02/√(2L))²), gains 1; a portable Box–Muller from mt19937_64 seeded by
/// config.seed, in parameter_names() order, row-major within each tensor.
/// The functions that are not templates are compiled in the library (src/models/llama.cpp).
#pragma once

#include "models/multihead.hpp"
#include "models/transformer.hpp"
#include "ops/add.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/embedding.hpp"
#include "ops/matmul.hpp"
#include "ops/mul.hpp"
#include "ops/rms_norm.hpp"
#include "ops/rope.hpp"
#include "ops/silu.hpp"
#include "ops/transpose.hpp"

#include <fmt/core.h>

#include <span>
#include <string>
#include <vector>

namespace tapegrad {

struct LlamaConfig {
    std::size_t vocabulary = 12;  ///< V
    std::size_t context = 16;     ///< longest sequence (positions are rotations, not parameters)
    std::size_t width = 16;       ///< D
    std::size_t heads = 4;        ///< H query heads; D/H = dh, the head width (even, for RoPE)
    std::size_t kv_heads = 2;     ///< H_kv key/value heads, dividing H (1: multi-query; H: multi-head)
    std::size_t layers = 2;       ///< L
    std::size_t hidden = 32;      ///< F, the SwiGLU MLP's width
    bool tied = false;            ///< logits through Eᵀ instead of a W_out of their own
    RmsNormSettings rms_norm{};   ///< ε = 1e-6
    double rope_base = 10000;
    RopePairing rope_pairing = RopePairing::interleaved;
    AttentionKernel kernel = AttentionKernel::composed;
    bool alibi = false;       ///< ALiBi's biases instead of RoPE
    std::size_t window = 0;   ///< causal sliding window of this many keys (Mistral's; 0: none)
    std::uint64_t seed = 1;  ///< initialisation

    std::size_t head_width() const { return width / heads; }
    /// E, 9 per block, the final gain, and W_out unless tied.
    std::size_t parameter_count() const { return 2 + 9 * layers + (tied ? 0 : 1); }
};

void check_llama_config(const LlamaConfig& c);

/// Names in the one parameter order (files, the checker's leaves, the optimizer's state).
std::vector<std::string> parameter_names(const LlamaConfig& c);

/// Shapes in the same order.
std::vector<Shape> parameter_shapes(const LlamaConfig& c);

/// The initialisation of the header comment, seeded by config.seed.
std::vector<Tensor<double>> initial_parameters(const LlamaConfig& c);

template <Scalar T>
struct LlamaBlockVars {
    Var<T> attn_gain;
    MultiHeadWeights<T> attention;
    Var<T> mlp_gain, W_gate, W_up, W_down;
};

/// The parameters as leaves of one tape, named, in parameter_names() order.
template <Scalar T>
struct LlamaVars {
    Var<T> E;
    std::vector<LlamaBlockVars<T>> blocks;
    Var<T> final_gain;
    Var<T> W_out;  ///< Eᵀ's stand-in when tied: unset

    static LlamaVars from(std::span<const Var<T>> leaves, const LlamaConfig& c) {
        if (leaves.size() != c.parameter_count()) {
            throw usage_error(
                fmt::format("llama: {} parameters given, the config needs {}", leaves.size(), c.parameter_count()));
        }
        LlamaVars v{leaves[0], {}, leaves[1 + 9 * c.layers], c.tied ? Var<T>{} : leaves.back()};
        for (std::size_t l = 0; l < c.layers; ++l) {
            const Var<T>* b = leaves.data() + 1 + 9 * l;
            v.blocks.push_back({b[0], {b[1], b[2], b[3], b[4]}, b[5], b[6], b[7], b[8]});
        }
        return v;
    }

    /// The leaves back in parameter_names() order (the inverse of `from`).
    std::vector<Var<T>> all() const {
        std::vector<Var<T>> leaves = {E};
        for (const LlamaBlockVars<T>& b : blocks) {
            leaves.insert(leaves.end(), {b.attn_gain, b.attention.W_Q, b.attention.W_K, b.attention.W_V,
                                         b.attention.W_O, b.mlp_gain, b.W_gate, b.W_up, b.W_down});
        }
        leaves.push_back(final_gain);
        if (W_out.valid()) leaves.push_back(W_out);
        return leaves;
    }

    /// Records `values` as leaves of `tape` (named as parameter_names()).
    static LlamaVars record(Tape<T>& tape, std::span<const Tensor<double>> values, const LlamaConfig& c) {
        return from(detail::record_named_leaves(tape, values, parameter_names(c)), c);
    }
};

/// Per block, the rotated keys and the values of every position so far: generation's cache.
template <Scalar T>
struct LlamaCache {
    std::vector<KeyValueCache<T>> blocks;  ///< one per block; empty before the first call
    std::size_t length = 0;                ///< the positions held
};

namespace detail {

MultiHeadOptions llama_attention_options(const LlamaConfig& c, std::size_t first_position);

template <Scalar T>
Var<T> llama_block(const Var<T>& X, const LlamaBlockVars<T>& b, const LlamaConfig& c, std::size_t block,
                   std::size_t first_position, LlamaCache<T>* cache) {
    const Var<T> h = rms_norm(X, b.attn_gain, c.rms_norm).named("attn_norm");
    KeyValueCache<T>* own = nullptr;
    if (cache != nullptr) {
        if (cache->blocks.size() <= block) cache->blocks.resize(block + 1);
        own = &cache->blocks[block];
    }
    const Var<T> attended =
        add(X, multihead_attention(h, b.attention, llama_attention_options(c, first_position), own).Y);
    const Var<T> m = rms_norm(attended, b.mlp_gain, c.rms_norm).named("mlp_norm");
    const Var<T> gated = mul(silu(matmul(m, b.W_gate)), matmul(m, b.W_up)).named("swiglu");
    return add(attended, matmul(gated, b.W_down)).named(fmt::format("block{} out", block));
}

}  // namespace detail

/// logits [B, T, V] for `tokens` (B sequences of T, sequence-major), each row predicting the token
/// after its position. With a cache, the tokens continue the sequences it holds (and are added).
template <Scalar T>
Var<T> llama_logits(const LlamaVars<T>& p, const LlamaConfig& c, std::span<const std::size_t> tokens,
                    std::size_t batch, LlamaCache<T>* cache = nullptr) {
    const std::size_t first = cache ? cache->length : 0;
    detail::check_token_block("llama", c.context, tokens, batch, first);
    Var<T> X = embedding(p.E, tokens, batch).named("X_0");
    for (std::size_t l = 0; l < p.blocks.size(); ++l) X = detail::llama_block(X, p.blocks[l], c, l, first, cache);
    if (cache) cache->length += tokens.size() / batch;
    const Var<T> final_rows = rms_norm(X, p.final_gain, c.rms_norm).named("norm_f");
    return matmul(final_rows, c.tied ? transpose(p.E) : p.W_out).named("logits");
}

/// Mean next-token cross-entropy: targets[k] is the token after tokens[k].
template <Scalar T>
Var<T> llama_loss(const LlamaVars<T>& p, const LlamaConfig& c, std::span<const std::size_t> tokens,
                  std::span<const std::size_t> targets, std::size_t batch) {
    return cross_entropy(llama_logits(p, c, tokens, batch), targets);
}

}  // namespace tapegrad
