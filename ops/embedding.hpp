/// \file
/// embedding: gathers rows of a table by index (token and position embeddings; also picks the
/// rows of a batch, e.g. the last position of each sequence).
///   table [..., D] viewed as R rows of width D (R = size / D), indices i_0 .. i_{n−1} in [0, R)
///   -> Y [n, D]             (Settings{indices, sequences = 0})
///   -> Y [B, n/B, D]         (Settings{indices, sequences = B}: the same rows, shaped as B sequences)
///   Y_r = table_{i_r}
/// VJP: d table_v = Σ_{r : i_r = v} G_r  (scatter-add of the rows of G back to the rows they came
/// from). Each Y_r is a copy of one table row with slope 1, so a row used twice receives the sum of
/// both upstream rows, and a row never used receives zero. The indices are integers, not inputs:
/// they have no gradient.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <cstdint>
#include <span>
#include <vector>

namespace tapegrad {

struct Embedding {
    static constexpr std::string_view name = "embedding";
    static constexpr Arity arity{1};

    struct Settings {
        std::vector<std::size_t> indices;  ///< table rows, in output order (checked < rows when recorded)
        std::size_t sequences = 0;         ///< 0: output [n, D]; B: output [B, n/B, D]
    };
    static constexpr auto fields(auto& s) {
        return std::tuple{field("indices", s.indices), field("sequences", s.sequences)};
    }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return s.sequences == 0 ? embedding(in[0], std::span(s.indices)) : embedding(in[0], std::span(s.indices), s.sequences);
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& table = *in[0];
        const std::size_t D = table.cols();
        const std::size_t n = s.indices.size();
        Y.resize(s.sequences == 0 ? Shape{n, D} : Shape{s.sequences, n / s.sequences, D});
        for (std::size_t r = 0; r < n; ++r) {
            std::copy_n(table.data().data() + s.indices[r] * D, D, Y.data().data() + r * D);
        }
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dtable) {
        const std::size_t D = at.in[0]->cols();
        dtable.fill(T(0));
        for (std::size_t r = 0; r < s.indices.size(); ++r) {
            const T* upstream = at.G.data().data() + r * D;
            T* target = dtable.data().data() + s.indices[r] * D;
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
    for (std::size_t r = 0; r < indices.size(); ++r) {
        if (indices[r] >= rows) {
            throw value_error(fmt::format("embedding: index {} at position {} is out of range for a table of {} rows "
                                          "(shape {})",
                                          indices[r], r, rows, table.shape().to_string()));
        }
    }
    return table.tape().template record<Embedding>(
        {table}, Embedding::Settings{std::vector<std::size_t>(indices.begin(), indices.end()), batch});
}

}  // namespace detail

/// Rows `indices` of `table`, as an [n × D] matrix.
template <Scalar T>
Var<T> embedding(const Var<T>& table, std::span<const std::size_t> indices) {
    return detail::record_embedding(table, indices, 0);
}

/// Rows `indices` of `table` as `batch` sequences: [batch × (n / batch) × D]. The indices are
/// sequence-major (all of sequence 0, then sequence 1, ...).
template <Scalar T>
Var<T> embedding(const Var<T>& table, std::span<const std::size_t> indices, std::size_t batch) {
    if (batch == 0 || indices.size() % batch != 0) {
        throw shape_error(fmt::format("embedding: {} indices do not split into {} sequences of equal length",
                                      indices.size(), batch));
    }
    return detail::record_embedding(table, indices, batch);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> embedding<T>(const Var<T>&, std::span<const std::size_t>); \
    TAPEGRAD_INSTANCE Var<T> embedding<T>(const Var<T>&, std::span<const std::size_t>, std::size_t);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
