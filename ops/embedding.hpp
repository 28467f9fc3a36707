// embedding: gathers rows of a table by index (token and position embeddings; also picks the
// rows of a batch, e.g. the last position of each sequence).
//   table [..., D] viewed as R rows of width D (R = size / D), indices i_0 .. i_{n−1} in [0, R)
//   -> Y [n, D]             (attrs.ints = {0, i_0, ..., i_{n−1}})
//   -> Y [B, n/B, D]         (attrs.ints = {B, i_0, ...}: the same rows, shaped as B sequences)
//   Y_r = table_{i_r}
// VJP: d table_v = Σ_{r : i_r = v} G_r  (scatter-add of the rows of G back to the rows they came
// from). Each Y_r is a copy of one table row with slope 1, so a row used twice receives the sum of
// both upstream rows, and a row never used receives zero. The indices are integers, not inputs:
// they have no gradient.
#pragma once

#include "autodiff/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <span>
#include <vector>

namespace tapegrad {

struct Embedding {
    static constexpr std::string_view name = "embedding";

    template <Scalar T>
    static void forward(Inputs<T> in, const OpAttrs<T>& attrs, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& table = *in[0];
        const std::size_t D = table.cols();
        const std::size_t n = attrs.ints.size() - 1;
        const auto batch = static_cast<std::size_t>(attrs.ints[0]);
        Y.resize(batch == 0 ? Shape{n, D} : Shape{batch, n / batch, D});
        for (std::size_t r = 0; r < n; ++r) {
            const auto row = static_cast<std::size_t>(attrs.ints[r + 1]);
            std::copy_n(table.data().data() + row * D, D, Y.data().data() + r * D);
        }
    }

    template <Scalar T>
    static void vjp(Inputs<T> in, const OpAttrs<T>& attrs, const Tensor<T>&, const Tensor<T>&, const Tensor<T>& G,
                    std::size_t, Tensor<T>& dtable) {
        const std::size_t D = in[0]->cols();
        dtable.fill(T(0));
        for (std::size_t r = 0; r + 1 < attrs.ints.size(); ++r) {
            const auto row = static_cast<std::size_t>(attrs.ints[r + 1]);
            const T* upstream = G.data().data() + r * D;
            T* target = dtable.data().data() + row * D;
            for (std::size_t c = 0; c < D; ++c) target[c] += upstream[c];
        }
    }
};

namespace detail {

template <Scalar T>
Var<T> record_embedding(const Var<T>& table, std::span<const std::size_t> indices, std::size_t batch) {
    checks::non_empty(Embedding::name, "table", table);
    if (table.shape().rank() == 0) throw shape_error("embedding: table must have at least one dimension, got a scalar");
    if (indices.empty()) throw shape_error("embedding: no indices given");
    const std::size_t rows = table.shape().size() / table.shape().cols();
    OpAttrs<T> attrs;
    attrs.ints.reserve(indices.size() + 1);
    attrs.ints.push_back(static_cast<std::int64_t>(batch));
    for (std::size_t r = 0; r < indices.size(); ++r) {
        if (indices[r] >= rows) {
            throw value_error(fmt::format("embedding: index {} at position {} is out of range for a table of {} rows "
                                          "(shape {})",
                                          indices[r], r, rows, table.shape().to_string()));
        }
        attrs.ints.push_back(static_cast<std::int64_t>(indices[r]));
    }
    return table.tape().template record<Embedding>({table}, std::move(attrs));
}

}  // namespace detail

// Rows `indices` of `table`, as an [n × D] matrix.
template <Scalar T>
Var<T> embedding(const Var<T>& table, std::span<const std::size_t> indices) {
    return detail::record_embedding(table, indices, 0);
}

// Rows `indices` of `table` as `batch` sequences: [batch × (n / batch) × D]. The indices are
// sequence-major (all of sequence 0, then sequence 1, ...).
template <Scalar T>
Var<T> embedding(const Var<T>& table, std::span<const std::size_t> indices, std::size_t batch) {
    if (batch == 0 || indices.size() % batch != 0) {
        throw shape_error(fmt::format("embedding: {} indices do not split into {} sequences of equal length",
                                      indices.size(), batch));
    }
    return detail::record_embedding(table, indices, batch);
}

}  // namespace tapegrad
