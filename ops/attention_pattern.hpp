/// \file
/// AttentionPattern: which keys each query row of an attention block sees, and the bias added to
/// each score it sees. The one description of masking and positional bias for both attention
/// kernels, so that they cannot disagree by construction:
///   * the fused op (ops/fused_attention.hpp) holds it as its settings and reads first_key,
///     end_key and bias tile by tile;
///   * the composed path (models/multihead.hpp, models/masks.hpp) turns it into its 0/1 mask and
///     its bias tensor with mask() and bias(), which call the same three functions;
///   * a saved tape stores it as the fused op's settings (its `fields`).
/// models/multihead.hpp builds it once from MultiHeadOptions (MultiHeadOptions::pattern).
///
/// Positions: query row i sits at absolute position p = query_offset + i, key j at position j.
///   causal:          row i sees keys j <= p; otherwise every key.
///   window w:        (causal only) row i sees keys p − w < j <= p: its own position and the w − 1
///                    before it, w keys in all (Hugging Face's sliding window; Mistral's reference
///                    code keeps w + 1).
///   alibi_heads H:   head h's score S_ij gains −m_h·|p − j| (ops/alibi.hpp), causal or not: the bias
///                    reads the query's absolute position in both cases.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/settings.hpp"
#include "autodiff/tensor.hpp"
#include "ops/alibi.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <tuple>
#include <vector>

namespace tapegrad {

struct AttentionPattern {
    bool causal = false;
    std::size_t query_offset = 0;  ///< absolute position of query row 0 (keys cached before it)
    std::size_t window = 0;        ///< causal sliding window of this many keys (0: none)
    std::size_t alibi_heads = 0;   ///< ALiBi's bias over this many heads (0: none)

    static constexpr auto fields(auto& s) {
        return std::tuple{field("causal", s.causal), field("query_offset", s.query_offset), field("window", s.window),
                          field("alibi_heads", s.alibi_heads)};
    }

    /// The absolute position of query row i.
    std::size_t position(std::size_t i) const { return query_offset + i; }
    /// The first key row i sees.
    std::size_t first_key(std::size_t i) const {
        return window != 0 && position(i) + 1 > window ? position(i) + 1 - window : 0;
    }
    /// One past the last key row i sees, of key_count keys. Both bounds grow with i by at most one,
    /// so the keys a block of rows sees are one interval, and so are the rows that see a key.
    std::size_t end_key(std::size_t i, std::size_t key_count) const {
        return causal ? std::min(key_count, position(i) + 1) : key_count;
    }
    bool has_bias() const { return alibi_heads != 0; }
    /// ALiBi's slope per head (empty without ALiBi).
    std::vector<double> slopes() const { return has_bias() ? alibi_slopes(alibi_heads) : std::vector<double>{}; }
    /// The bias on the score of query row i and key j under a head of slope m (from slopes()).
    double bias(double slope, std::size_t i, std::size_t j) const { return alibi_entry(slope, position(i), j); }

    /// The pattern's own rules, for a block of query_count queries and key_count keys: an offset in
    /// range, a window only with the causal mask and with the queries within the keys (so every row
    /// sees its own position).
    void check(std::string_view where, std::size_t query_count, std::size_t key_count) const {
        if (query_offset > std::size_t(std::numeric_limits<std::int64_t>::max() / 2)) {
            throw value_error(fmt::format("{}: query_offset {} is out of range", where, query_offset));
        }
        if (window != 0 && (!causal || query_offset + query_count > key_count)) {
            throw usage_error(fmt::format("{}: a sliding window (window {}) needs the causal mask and queries within "
                                          "the keys (query_offset {} + Tq {} <= Tk {}; causal {})",
                                          where, window, query_offset, query_count, key_count, causal));
        }
    }

    /// [Tq × Tk]: 1 where row i sees key j (first_key(i) <= j < end_key(i, Tk)), else 0.
    Tensor<double> mask(std::size_t query_count, std::size_t key_count) const {
        Tensor<double> M(Shape{query_count, key_count}, 0.0);
        for (std::size_t i = 0; i < query_count; ++i) {
            for (std::size_t j = first_key(i); j < end_key(i, key_count); ++j) M(i, j) = 1.0;
        }
        return M;
    }

    /// [H, Tq, Tk]: bias(m_h, i, j) for every head, row and key (alibi_heads must be set).
    Tensor<double> bias(std::size_t query_count, std::size_t key_count) const {
        if (!has_bias()) throw usage_error("AttentionPattern::bias: the pattern has no bias (alibi_heads 0)");
        const std::vector<double> m = slopes();
        Tensor<double> B(Shape{alibi_heads, query_count, key_count});
        for (std::size_t h = 0; h < alibi_heads; ++h)
            for (std::size_t i = 0; i < query_count; ++i)
                for (std::size_t j = 0; j < key_count; ++j) B[(h * query_count + i) * key_count + j] = bias(m[h], i, j);
        return B;
    }
};

}  // namespace tapegrad
