/// \file
/// softmax: normalises each row (the last dimension) into weights, A_ij = exp(S_ij) / Σ_k exp(S_ik).
///   S [..., m, n] -> A [..., m, n]; each row of A is non-negative and sums to one.
/// The row maximum is subtracted first, so scores of ±1e4 and beyond never overflow.
/// Hidden positions carry -inf (see ops/mask.hpp) and get weight exactly 0. A row hidden
/// entirely has no distribution to normalise: its weights are defined as all zero (so it reads
/// nothing and passes no gradient), never NaN. +inf or NaN scores are refused with value_error.
/// VJP, from the saved output A (G = dJ/dA):
///   dS_ij = A_ij (G_ij − Σ_k G_ik A_ik)
/// because ∂A_ij/∂S_ik = A_ij(δ_jk − A_ik): δ_jk from the numerator, −A_ij A_ik from the shared
/// denominator Z. Dropping the denominator path would give A ∘ G, whose rows no longer sum to 0.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/tape.hpp"
#include "ops/fast/softmax_rows.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>

namespace tapegrad {

struct Softmax {
    static constexpr std::string_view name = "softmax";
    static constexpr Arity arity{1};
    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return softmax(in[0]);
    }
    using hooks_of = Softmax;  ///< declares `update` below

    /// The largest score of row r, refusing NaN and +inf.
    template <Scalar T>
    static T checked_row_max(const Tensor<T>& S, std::size_t r) {
        const std::size_t n = S.cols();
        const T* scores = S.data().data() + r * n;
        if constexpr (has_compiled_kernels<T>) {
            if (n > fast::inline_row_size) {
                const T row_max = fast::row_max_vectorised(scores, n);  // NaN if any score is NaN
                if (is_finite(row_max)) return row_max;                 // so no NaN and no +inf here
            }
        }
        T row_max = -std::numeric_limits<T>::infinity();
        for (std::size_t j = 0; j < n; ++j) {
            if (is_nan(scores[j]) || scores[j] == std::numeric_limits<T>::infinity()) {
                throw value_error(fmt::format("softmax: score {} at {} of shape {}; scores must be finite or -inf",
                                              to_double(scores[j]), index_string(S.shape(), r * n + j),
                                              S.shape().to_string()));
            }
            if (shift_prefers(scores[j], row_max)) row_max = scores[j];  // (a shift: autodiff/dual.hpp)
        }
        return row_max;
    }

    /// One row: weights = exp(scores − max) / Σ exp(scores − max).
    template <Scalar T>
    static void normalise_row(const Tensor<T>& S, std::size_t r, T* weights) {
        using std::exp;
        const std::size_t n = S.cols();
        const T* scores = S.data().data() + r * n;
        const T row_max = checked_row_max(S, r);
        if (row_max == -std::numeric_limits<T>::infinity()) {  // every position hidden
            for (std::size_t j = 0; j < n; ++j) weights[j] = T(0);
            return;
        }
        if constexpr (has_compiled_kernels<T>) {
            fast::softmax_row_vectorised(scores, n, row_max, weights);  // same formula, vectorised
            return;
        } else if constexpr (fast::dual_of_compiled<T>) {
            if (n > fast::inline_row_size) {
                fast::softmax_row_dual(scores, n, row_max.value(), weights);  // value and tangent planes, vectorised
                return;
            }
        }
        T total(0);
        for (std::size_t j = 0; j < n; ++j) {
            weights[j] = exp(scores[j] - row_max);
            total += weights[j];
        }
        // One division and n products: a 50-digit division costs several products.
        const T inverse = T(1) / total;
        for (std::size_t j = 0; j < n; ++j) weights[j] *= inverse;
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& A, Tensor<T>&) {
        const Tensor<T>& S = *in[0];
        A.resize(S.shape());
        const std::size_t n = S.cols(), rows = S.size() / n;
        parallel_chunks(rows, row_grain(n), [&](std::size_t first, std::size_t last) {
            for (std::size_t r = first; r < last; ++r) normalise_row(S, r, A.data().data() + r * n);
        });
    }

    /// Rows per chunk over the library's threads: about 16K elements (an exp each), so a chunk is
    /// tens of microseconds; each row is computed as one thread computes it.
    static std::size_t row_grain(std::size_t n) { return std::max<std::size_t>(1, (std::size_t{1} << 14) / n); }

    /// Speed hook (autodiff/op.hpp): a row of A depends only on its row of S, so an unchanged row
    /// keeps its recorded weights (bit for bit what forward computes) and a row moved by a tiny δ is
    /// rescaled by e^δ without exp (ops/fast/softmax_rows.hpp); anything else is normalised again.
    template <Scalar T>
    static bool update(const Settings&, Inputs<T> before, Inputs<T> after, const Tensor<T>& A, Tensor<T>& A_new) {
        const Tensor<T>& S_old = *before[0];
        const Tensor<T>& S = *after[0];
        A_new.resize(S.shape());
        const std::size_t n = S.cols(), rows = S.size() / n;
        for (std::size_t r = 0; r < rows; ++r) {
            const T* s_old = S_old.data().data() + r * n;
            const T* s_new = S.data().data() + r * n;
            T* a_new = A_new.data().data() + r * n;
            if (std::equal(s_new, s_new + n, s_old)) {
                std::copy_n(A.data().data() + r * n, n, a_new);
            } else if (!fast::softmax_row_update(s_old, s_new, A.data().data() + r * n, n, a_new)) {
                normalise_row(S, r, a_new);
            }
        }
        return true;
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dS) {
        const Tensor<T>& A = at.out;
        const Tensor<T>& G = at.G;
        const std::size_t n = A.cols(), rows = A.size() / n;
        parallel_chunks(rows, row_grain(n), [&](std::size_t first, std::size_t last) {
            for (std::size_t r = first; r < last; ++r) {
                vjp_row(A.data().data() + r * n, G.data().data() + r * n, n, dS.data().data() + r * n);
            }
        });
    }

    /// dS_ij = A_ij (G_ij − Σ_k G_ik A_ik) for one row.
    template <Scalar T>
    static void vjp_row(const T* weights, const T* upstream, std::size_t n, T* out) {
        if constexpr (has_compiled_kernels<T>) {
            if (n > fast::inline_row_size) {
                fast::softmax_vjp_row_vectorised(weights, upstream, n, out);  // the same formula, vectorised
                return;
            }
        } else if constexpr (fast::dual_of_compiled<T>) {
            if (n > fast::inline_row_size) {
                fast::softmax_vjp_row_dual(weights, upstream, n, out);  // its derivative along ε, vectorised
                return;
            }
        }
        T mean(0);  // Σ_k G_ik A_ik: the weighted mean of the upstream gradient
        for (std::size_t k = 0; k < n; ++k) mean += upstream[k] * weights[k];
        for (std::size_t j = 0; j < n; ++j) out[j] = weights[j] * (upstream[j] - mean);
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        return {in[0]->size(), 2 * in[0]->size()};
    }
};

template <Scalar T>
Var<T> softmax(const Var<T>& S) {
    checks::non_empty(Softmax::name, "S", S);
    if (S.shape().rank() == 0) throw shape_error("softmax: S must have at least one dimension, got a scalar");
    return S.tape().template record<Softmax>({S});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> softmax<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
