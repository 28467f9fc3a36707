/// \file
/// The compiled part of models/masks.hpp: the causal, sliding-window and padding masks and ALiBi's
/// bias, kept out of the header so that a program including the models does not compile them again.
#include "models/masks.hpp"

#include <fmt/core.h>

namespace tapegrad {

namespace detail {

void check_block(std::string_view where, std::size_t query_count, std::size_t key_count, std::size_t query_offset) {
    if (query_count == 0 || key_count == 0) {
        throw shape_error(
            fmt::format("{}: {} queries and {} keys; both must be at least one", where, query_count, key_count));
    }
    if (query_offset + query_count > key_count) {
        throw shape_error(fmt::format(
            "{}: queries at absolute positions {}..{} (query_offset {}) need keys up to position {}, but there "
            "are only {} keys",
            where, query_offset, query_offset + query_count - 1, query_offset, query_offset + query_count - 1,
            key_count));
    }
}

}  // namespace detail

Tensor<double> causal_mask(std::size_t query_count, std::size_t key_count, std::size_t query_offset,
                           std::size_t window) {
    detail::check_block("causal_mask", query_count, key_count, query_offset);
    return AttentionPattern{.causal = true, .query_offset = query_offset, .window = window}.mask(query_count,
                                                                                                 key_count);
}

Tensor<double> alibi_bias(std::size_t heads, std::size_t query_count, std::size_t key_count, std::size_t query_offset) {
    if (heads == 0) throw shape_error("alibi_bias: heads must be at least 1");
    return AttentionPattern{.query_offset = query_offset, .alibi_heads = heads}.bias(query_count, key_count);
}

Tensor<double> padding_mask(std::span<const std::size_t> lengths, std::size_t query_count, std::size_t key_count,
                            std::size_t query_offset, bool causal, std::size_t heads) {
    detail::check_block("padding_mask", query_count, key_count, query_offset);
    if (lengths.empty()) throw shape_error("padding_mask: no sequence lengths given");
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        if (lengths[b] == 0) {
            throw value_error(
                fmt::format("padding_mask: sequence {} has length 0; every sequence needs at least one token", b));
        }
        if (lengths[b] > key_count) {
            throw value_error(fmt::format("padding_mask: sequence {} has length {} but there are only {} key positions",
                                          b, lengths[b], key_count));
        }
    }
    const std::size_t B = lengths.size(), H = heads == 0 ? 1 : heads;
    Tensor<double> M(heads == 0 ? Shape{B, query_count, key_count} : Shape{B, heads, query_count, key_count}, 0.0);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < query_count; ++i) {
                const std::size_t position = query_offset + i;
                if (position >= lengths[b]) continue;  // a padded query row: hidden entirely
                double* row = M.data().data() + ((b * H + h) * query_count + i) * key_count;
                const std::size_t visible = causal ? position + 1 : lengths[b];
                for (std::size_t j = 0; j < visible; ++j) row[j] = 1.0;
            }
    return M;
}

}  // namespace tapegrad
