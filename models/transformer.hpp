/// \file
/// A decoder-only transformer (GPT-2's shape, as nanoGPT writes it) composed from ops; its gradient
/// is the tape's chain of the ops' VJPs (no VJP of its own), checked end to end at 50 digits
/// (tests/test_transformer.cpp).
///   tokens t [B, T] (sequence-major), positions p = offset + 0 .. offset + T − 1
///   X_0 = E[t] + P[p]                                         E [V × D] tokens, P [T_max × D] positions
///   for each of the L blocks (pre-norm, residual):
///     X ← X + multihead_attention(ln1(X))                     causal; W_Q, W_K, W_V, W_O [D × D], no biases
///     X ← X + gelu(ln2(X)·W_1 + b_1)·W_2 + b_2                W_1 [D × 4D], b_1 [4D], W_2 [4D × D], b_2 [D]
///   logits = ln_f(X)·Eᵀ                                       tied: E is the output projection too
///   J = cross_entropy(logits, next tokens)                    mean over the B·T predictions
/// ln(x) = layer_norm(x; gain, bias) over D with ε inside the root (ops/layer_norm.hpp, ε = 1e-5);
/// gelu in the tanh form by default (ops/gelu.hpp). Multi-head attention scales by 1/√(D/H). E
/// feeds the embedding gather and the output matmul: the tape sums both branches (and the checker
/// attributes each). Dropout on the attention weights is off unless asked for (with an explicit
/// generator). The attention is the one multi-head composition (models/multihead.hpp), composed
/// or fused kernel.
/// Generation: a Memory holds, per block, the rows attention reads keys and values from (the
/// block's ln1 outputs so far); a call with a Memory attends over those rows plus its own, with
/// query_offset = the number already held, and appends its rows. K and V are these rows'
/// projections, recomputed by multihead_attention (2·D² per row per block, small next to a step;
/// one attention composition rather than a second one over cached K and V).
/// Initialisation (GPT-2): every matrix and both embeddings N(0, 0.02²), the residual outputs W_O
/// and W_2 N(0, (0.02/√(2L))²), gains 1, biases 0; drawn by a portable Box–Muller from mt19937_64
/// seeded by config.seed, in the order of parameter_names(), row-major within each tensor.
/// The functions that are not templates are compiled in the library (src/models/transformer.cpp).
#pragma once

#include "models/multihead.hpp"
#include "ops/add.hpp"
#include "ops/add_bias.hpp"
#include "ops/concat.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/embedding.hpp"
#include "ops/gelu.hpp"
#include "ops/layer_norm.hpp"
#include "ops/matmul.hpp"
#include "ops/transpose.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

struct TransformerConfig {
    std::size_t vocabulary = 12;  ///< V
    std::size_t context = 8;      ///< T_max: positions learned, longest sequence
    std::size_t width = 16;       ///< D
    std::size_t heads = 2;        ///< D must be a multiple
    std::size_t layers = 2;       ///< L
    std::size_t mlp_factor = 4;   ///< MLP width mlp_factor·D
    GeluForm gelu = GeluForm::tanh;
    LayerNormSettings layer_norm{};  ///< ε = 1e-5
    AttentionKernel kernel = AttentionKernel::composed;
    std::uint64_t seed = 1;       ///< initialisation

    /// E, P, 12 per block, the final gain and bias.
    std::size_t parameter_count() const { return 4 + 12 * layers; }
};

void check_transformer_config(const TransformerConfig& c);

/// Names in the one parameter order (files, the checker's leaves, the optimizer's state).
std::vector<std::string> parameter_names(const TransformerConfig& c);

/// Shapes in the same order.
std::vector<Shape> parameter_shapes(const TransformerConfig& c);

namespace detail {

/// N(0, 1) by Box–Muller from two 53-bit uniforms: the same numbers from any standard library.
double draw_standard_normal(std::mt19937_64& generator);

enum class InitialValue { one, zero, normal };

/// What a parameter starts as, from its name (see the header comment).
InitialValue initial_value(const std::string& name);

/// GPT-2's initialisation of the named parameters (shared with models/llama.hpp): gains 1, biases
/// 0, every other tensor N(0, 0.02²), those whose name ends in one of `residual_outputs`
/// N(0, (0.02/√(2L))²); drawn from mt19937_64(seed) in the names' order, row-major within each.
std::vector<Tensor<double>> gpt2_initialisation(const std::vector<std::string>& names, const std::vector<Shape>& shapes,
                                                std::uint64_t seed, std::size_t layers,
                                                std::initializer_list<std::string_view> residual_outputs);

/// Each of `values` recorded as a leaf of `tape`, named by `names` (a model's parameter order).
template <Scalar T>
std::vector<Var<T>> record_named_leaves(Tape<T>& tape, std::span<const Tensor<double>> values,
                                        const std::vector<std::string>& names) {
    std::vector<Var<T>> leaves;
    for (std::size_t i = 0; i < values.size() && i < names.size(); ++i) {
        leaves.push_back(tape.leaf(tensor_cast<T>(values[i]), names[i]));
    }
    return leaves;
}

/// B sequences of one length in `tokens`, at positions first.. within the model's context; the
/// errors name the model.
void check_token_block(std::string_view model, std::size_t context, std::span<const std::size_t> tokens,
                       std::size_t batch, std::size_t first);

}  // namespace detail

/// GPT-2's initialisation, seeded by config.seed.
std::vector<Tensor<double>> initial_parameters(const TransformerConfig& c);

template <Scalar T>
struct BlockVars {
    Var<T> ln1_gain, ln1_bias;
    MultiHeadWeights<T> attention;
    Var<T> ln2_gain, ln2_bias, W_1, b_1, W_2, b_2;
};

/// The parameters as leaves of one tape, named, in parameter_names() order.
template <Scalar T>
struct TransformerVars {
    Var<T> E, P;
    std::vector<BlockVars<T>> blocks;
    Var<T> final_gain, final_bias;

    static TransformerVars from(std::span<const Var<T>> leaves, const TransformerConfig& c) {
        if (leaves.size() != c.parameter_count()) {
            throw usage_error(fmt::format("transformer: {} parameters given, the config needs {}", leaves.size(),
                                          c.parameter_count()));
        }
        TransformerVars v{leaves[0], leaves[1], {}, leaves[leaves.size() - 2], leaves[leaves.size() - 1]};
        for (std::size_t l = 0; l < c.layers; ++l) {
            const Var<T>* b = leaves.data() + 2 + 12 * l;
            v.blocks.push_back({b[0], b[1], {b[2], b[3], b[4], b[5]}, b[6], b[7], b[8], b[9], b[10], b[11]});
        }
        return v;
    }

    /// The leaves back in parameter_names() order (the inverse of `from`).
    std::vector<Var<T>> all() const {
        std::vector<Var<T>> leaves = {E, P};
        for (const BlockVars<T>& b : blocks) {
            leaves.insert(leaves.end(), {b.ln1_gain, b.ln1_bias, b.attention.W_Q, b.attention.W_K, b.attention.W_V,
                                         b.attention.W_O, b.ln2_gain, b.ln2_bias, b.W_1, b.b_1, b.W_2, b.b_2});
        }
        leaves.push_back(final_gain);
        leaves.push_back(final_bias);
        return leaves;
    }

    /// Records `values` as leaves of `tape` (named as parameter_names()).
    static TransformerVars record(Tape<T>& tape, std::span<const Tensor<double>> values, const TransformerConfig& c) {
        return from(detail::record_named_leaves(tape, values, parameter_names(c)), c);
    }
};

/// Per block, the rows its attention has read so far ([B, t, D]), for generation.
template <Scalar T>
struct TransformerMemory {
    std::vector<Tensor<T>> rows;  ///< one per block; empty before the first call
    std::size_t length = 0;       ///< t, the positions held
};

/// How one pass runs: attention-weight dropout (off unless given), and the memory to extend
/// (nullptr: a full pass over the tokens, positions from 0).
template <Scalar T>
struct TransformerRun {
    std::optional<DropoutSettings> dropout{};
    TransformerMemory<T>* memory = nullptr;
};

namespace detail {

template <Scalar T>
Var<T> transformer_input(const TransformerVars<T>& p, std::span<const std::size_t> tokens, std::size_t batch,
                         std::size_t offset) {
    const std::size_t T_new = tokens.size() / batch;
    std::vector<std::size_t> positions(tokens.size());
    for (std::size_t k = 0; k < positions.size(); ++k) positions[k] = offset + k % T_new;
    const Var<T> token_rows = embedding(p.E, tokens, batch);
    return add(token_rows, embedding(p.P, std::span<const std::size_t>(positions), batch)).named("X_0");
}

/// The rows attention reads: this call's own, after those in the memory (which then holds both).
template <Scalar T>
Var<T> attention_memory(const Var<T>& own, std::size_t block, TransformerMemory<T>* memory) {
    if (memory == nullptr) return own;
    if (memory->rows.size() <= block) {
        memory->rows.push_back(own.value());
        return own;
    }
    const Var<T> all = concat({own.tape().constant(memory->rows[block], "memory"), own}, 1);
    memory->rows[block] = all.value();
    return all;
}

template <Scalar T>
Var<T> transformer_block(const Var<T>& X, const BlockVars<T>& b, const TransformerConfig& c,
                         const TransformerRun<T>& run, std::size_t block, std::size_t offset) {
    const Var<T> a = layer_norm(X, b.ln1_gain, b.ln1_bias, c.layer_norm).named("ln1");
    MultiHeadOptions options;
    options.heads = c.heads;
    options.query_offset = offset;
    options.dropout = run.dropout;
    options.kernel = c.kernel;
    const Var<T> attended =
        add(X, multihead_attention(a, attention_memory(a, block, run.memory), b.attention, options).Y);
    const Var<T> m = layer_norm(attended, b.ln2_gain, b.ln2_bias, c.layer_norm).named("ln2");
    const Var<T> hidden = gelu(add_bias(matmul(m, b.W_1), b.b_1), c.gelu).named("mlp hidden");
    return add(attended, add_bias(matmul(hidden, b.W_2), b.b_2)).named(fmt::format("block{} out", block));
}


}  // namespace detail

/// logits [B, T, V] for `tokens` (B sequences of T, sequence-major), each row predicting the token
/// after its position. With run.memory, the tokens continue the sequences held there.
template <Scalar T>
Var<T> transformer_logits(const TransformerVars<T>& p, const TransformerConfig& c, std::span<const std::size_t> tokens,
                          std::size_t batch, const TransformerRun<T>& run = {}) {
    const std::size_t offset = run.memory ? run.memory->length : 0;
    detail::check_token_block("transformer", c.context, tokens, batch, offset);
    Var<T> X = detail::transformer_input(p, tokens, batch, offset);
    for (std::size_t l = 0; l < p.blocks.size(); ++l) X = detail::transformer_block(X, p.blocks[l], c, run, l, offset);
    if (run.memory) run.memory->length += tokens.size() / batch;
    const Var<T> final_rows = layer_norm(X, p.final_gain, p.final_bias, c.layer_norm).named("ln_f");
    return matmul(final_rows, transpose(p.E)).named("logits");
}

/// Mean next-token cross-entropy: targets[k] is the token after tokens[k].
template <Scalar T>
Var<T> transformer_loss(const TransformerVars<T>& p, const TransformerConfig& c, std::span<const std::size_t> tokens,
                        std::span<const std::size_t> targets, std::size_t batch, const TransformerRun<T>& run = {}) {
    return cross_entropy(transformer_logits(p, c, tokens, batch, run), targets);
}

}  // namespace tapegrad
