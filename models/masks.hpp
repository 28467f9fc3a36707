/// \file
/// Mask builders for attention: which keys each query may see, as 0/1 tensors for ops/mask.hpp.
///
/// Causal with a query offset (the key-value cache case): query i of a block sits at absolute
/// position query_offset + i and sees key j only when j <= query_offset + i. A block of new
/// queries can so attend over the whole key history, and the full pass equals the same sequence
/// fed in blocks.
///
/// Padding (batched sequences of different lengths, padded at the end to a common T):
///   * a padded key (j >= length) is never visible to any query;
///   * a padded query row (absolute position >= length) sees nothing: its row is hidden entirely,
///     so softmax gives it all-zero weights, its attention output is exactly zero, and no gradient
///     flows through it (see ops/softmax.hpp). Padded rows are defined, never NaN; a loss should
///     simply not read them.
///   * a length of zero is rejected (a sequence with no tokens has nothing to attend to), as is a
///     length above the key count.
///
/// A sliding window: causal, and a query sees only the last w positions up to its own (w keys).
/// ALiBi (Press et al.): no positions in the inputs; an additive bias −m_h·(distance) on each head's
/// scores, with a slope m_h per head (ops/alibi.hpp's alibi_slopes; alibi_bias here).
/// Causality, the window and ALiBi are one AttentionPattern (ops/attention_pattern.hpp), which the
/// fused kernel reads as well: causal_mask and alibi_bias are its mask() and bias().
/// The functions that are not templates are compiled in the library (src/models/masks.cpp).
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/tensor.hpp"
#include "ops/attention_pattern.hpp"

#include <fmt/core.h>

#include <span>
#include <string_view>
#include <vector>

namespace tapegrad {

namespace detail {

void check_block(std::string_view where, std::size_t query_count, std::size_t key_count, std::size_t query_offset);

}  // namespace detail

/// [Tq × Tk]: M_ij = 1 when key j <= query_offset + i (AttentionPattern::mask of a causal pattern).
/// With a sliding window of w keys (`window` 0: none), query i at absolute position
/// p = query_offset + i sees only keys p − w < j ≤ p: itself and the w − 1 before it.
Tensor<double> causal_mask(std::size_t query_count, std::size_t key_count, std::size_t query_offset = 0,
                           std::size_t window = 0);

/// ALiBi's bias [H, Tq, Tk]: b_{h,i,j} = −m_h·|p − j|, p = query_offset + i: 0 for the query's own
/// position, the more negative the farther the key (causal attention sees only j ≤ p, where this is
/// the paper's −m_h·(p − j); without the causal mask, later keys are penalised alike).
/// AttentionPattern::bias of a pattern with ALiBi over `heads` heads.
Tensor<double> alibi_bias(std::size_t heads, std::size_t query_count, std::size_t key_count,
                          std::size_t query_offset = 0);

/// Padding (and optionally causality) for a batch: [B × Tq × Tk], or [B × H × Tq × Tk] (the same
/// pattern repeated for each of `heads` heads) when heads > 0. lengths[b] is the length of
/// sequence b in absolute positions (its first lengths[b] keys are real).
Tensor<double> padding_mask(std::span<const std::size_t> lengths, std::size_t query_count, std::size_t key_count,
                            std::size_t query_offset = 0, bool causal = false, std::size_t heads = 0);

}  // namespace tapegrad
