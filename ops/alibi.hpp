/// \file
/// ALiBi's slopes and bias entries (Press, Smith and Lewis 2022), shared by the fused attention
/// op (ops/fused_attention.hpp, which adds them tile by tile) and the composed path's bias tensor
/// (models/masks.hpp's alibi_bias): one definition, so the two paths add the same numbers.
///   b_{h,i,j} = −m_h·|p − j|, p = query_offset + i (the query's absolute position), in double.
/// Under the causal mask only j ≤ p is seen, where this is the paper's −m_h·(p − j).
#pragma once

#include "autodiff/error.hpp"

#include <cmath>
#include <cstddef>
#include <vector>

namespace tapegrad {

/// Head h's slope m_h: for H a power of two m_h = 2^(−8(h+1)/H); otherwise, as the paper's code
/// and BLOOM's, the slopes of the largest power of two n < H followed by every other slope of 2n
/// (2^(−8·1/(2n)), 2^(−8·3/(2n)), ...).
inline std::vector<double> alibi_slopes(std::size_t heads) {
    if (heads == 0) throw shape_error("alibi_slopes: heads must be at least 1");
    std::size_t n = 1;
    while (2 * n <= heads) n *= 2;
    std::vector<double> slopes;
    for (std::size_t h = 1; h <= n; ++h)
        slopes.push_back(std::exp2(-8.0 * static_cast<double>(h) / static_cast<double>(n)));
    for (std::size_t k = 1; slopes.size() < heads; k += 2)
        slopes.push_back(std::exp2(-8.0 * static_cast<double>(k) / static_cast<double>(2 * n)));
    return slopes;
}

/// One entry of the bias: −slope·|position − key|, in double (each tape type converts it once).
inline double alibi_entry(double slope, std::size_t position, std::size_t key) {
    return -slope * std::abs(static_cast<double>(position) - static_cast<double>(key));
}

}  // namespace tapegrad
