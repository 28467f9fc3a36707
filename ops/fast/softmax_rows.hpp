/// \file
/// Speed only: softmax's vectorised row for float/double (compiled in the library per instruction-set
/// level, autodiff/cpu.hpp), its dual rows through the same kernels, and its replay update (the
/// `update` hook of autodiff/op.hpp), kept out of ops/softmax.hpp so that the op file reads as its
/// formula, forward and VJP.
/// Invariant (autodiff/op.hpp): both give what the generic row in Softmax::normalise_row gives, to
/// rounding in the last digit (the op tables compare replays with a fresh forward, tests/support.hpp; the op tables
/// hold the double row to the 50-digit one).
#pragma once

#include "autodiff/cpu.hpp"
#include "autodiff/dual.hpp"
#include "autodiff/op.hpp"
#include "autodiff/scalar.hpp"
#include "ops/fast/kernels.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <vector>

namespace tapegrad::fast {

/// weights = exp(scores − row_max) / Σ exp(scores − row_max) for one row of n finite-or-−inf scores
/// in float/double: Eigen's vectorised exp in the compiled kernels (within an ulp or two of
/// std::exp, several times faster); hidden positions get exactly 0.
template <class T>
void softmax_row_vectorised(const T* scores, std::size_t n, const T& row_max, T* weights) {
    op_kernels<T>().softmax_row(scores, n, row_max, weights);
}

/// Rows up to this length take the op's own loops for the max and the VJP: a call into the
/// library costs more than their few operations (T = 2 attention).
inline constexpr std::size_t inline_row_size = 16;

/// The largest of n ≥ 1 scores, vectorised; NaN when any score is NaN.
template <class T>
T row_max_vectorised(const T* scores, std::size_t n) {
    return op_kernels<T>().max_of(scores, n);
}

/// Softmax's VJP for one row, dS_j = A_j·(G_j − Σ_k G_k A_k), vectorised (the mean summed in a fixed
/// order of 16 running sums, so its rounding differs from the generic loop's by a few ulps).
template <class T>
void softmax_vjp_row_vectorised(const T* weights, const T* upstream, std::size_t n, T* dS) {
    op_kernels<T>().softmax_vjp_row(weights, upstream, n, dS);
}

/// Dual rows over float/double (forward mode and HVPs, autodiff/forward_mode.hpp): each row is split
/// into its value and tangent planes and goes through the real kernels above, instead of an element
/// loop that takes a scalar exp per dual (8% of a T = 64 HVP).
template <class T>
inline constexpr bool dual_of_compiled = false;
template <class T>
    requires is_dual_v<T>
inline constexpr bool dual_of_compiled<T> = has_compiled_kernels<typename T::value_type>;

/// Per-thread planes for dual rows, kept between calls (no allocation once warm).
template <class U>
U* row_planes(std::size_t count) {
    thread_local std::vector<U> planes;
    planes.resize(count);
    return planes.data();
}

/// Softmax of a dual row. Its Jacobian, ∂A_j/∂S_k = A_j(δ_jk − A_k), is symmetric, so its JVP is the
/// VJP formula applied to the tangent:
///   A_v = softmax(S_v),   A_t = A_v ∘ (S_t − ⟨A_v, S_t⟩).
/// A hidden score (−inf, tangent 0) gets A_v = 0 and A_t = 0, as in the dual element loop.
template <class U>
void softmax_row_dual(const Dual<U>* scores, std::size_t n, const U& row_max, Dual<U>* weights) {
    U* const S_v = row_planes<U>(4 * n);
    U* const S_t = S_v + n;
    U* const A_v = S_t + n;
    U* const A_t = A_v + n;
    engine_kernels<U>().deinterleave(pairs_of(scores), n, S_v, S_t);
    op_kernels<U>().softmax_row(S_v, n, row_max, A_v);
    op_kernels<U>().softmax_vjp_row(A_v, S_t, n, A_t);
    engine_kernels<U>().interleave(A_v, A_t, n, pairs_of(weights), false);
}

/// Softmax's VJP of a dual row: dS = A ∘ (G − ⟨A, G⟩) differentiated along ε, with m = ⟨A_v, G_v⟩:
///   dS_v = A_v ∘ (G_v − m)
///   dS_t = A_v ∘ (G_t − ⟨A_v, G_t⟩) + A_t ∘ (G_v − m) − A_v·⟨A_t, G_v⟩
/// (the product rule on each factor; the first term is the real VJP row applied to G_t).
template <class U>
void softmax_vjp_row_dual(const Dual<U>* A, const Dual<U>* G, std::size_t n, Dual<U>* dS) {
    U* const A_v = row_planes<U>(6 * n);
    U* const A_t = A_v + n;
    U* const G_v = A_t + n;
    U* const G_t = G_v + n;
    U* const dS_v = G_t + n;
    U* const dS_t = dS_v + n;
    engine_kernels<U>().deinterleave(pairs_of(A), n, A_v, A_t);
    engine_kernels<U>().deinterleave(pairs_of(G), n, G_v, G_t);
    op_kernels<U>().softmax_vjp_row(A_v, G_v, n, dS_v);
    op_kernels<U>().softmax_vjp_row(A_v, G_t, n, dS_t);
    U m(0), tangent_mean(0);  // ⟨A_v, G_v⟩ and ⟨A_t, G_v⟩
    for (std::size_t j = 0; j < n; ++j) {
        m += A_v[j] * G_v[j];
        tangent_mean += A_t[j] * G_v[j];
    }
    for (std::size_t j = 0; j < n; ++j) {
        dS[j] = Dual<U>(dS_v[j], dS_t[j] + A_t[j] * (G_v[j] - m) - A_v[j] * tangent_mean);
    }
}

/// Replay of one row after its scores moved (the checker perturbs one coordinate by h ≤ 1e-14 at
/// a time). A row whose scores moved by small δ_j = S'_ij − S_ij is updated without exp:
///   A'_ij = A_ij·e^δ_j / Σ_k A_ik·e^δ_k   (the max and Z cancel),
/// with e^δ from its Taylor series, summed until a term drops below 1e-55 (|δ| ≤ 1e-6, so at most
/// 9 terms; truncation < 1e-60). A 50-digit exp costs about a hundred products; this costs a few.
/// Returns false for larger moves, or moves to or from −inf: the caller then normalises the row.
template <Scalar T>
bool softmax_row_update(const T* s_old, const T* s_new, const T* a_old, std::size_t n, T* a_new) {
    using std::abs;
    static const std::array<T, 16> inverse = [] {
        std::array<T, 16> values{};
        for (std::size_t k = 1; k < values.size(); ++k) values[k] = T(1) / T(k);
        return values;
    }();
    const T small_move(1e-6), negligible(1e-55);
    T total(0);
    for (std::size_t j = 0; j < n; ++j) {
        if (s_new[j] == s_old[j]) {
            a_new[j] = a_old[j];
        } else if (is_finite(s_new[j]) && is_finite(s_old[j]) && T(abs(s_new[j] - s_old[j])) <= small_move) {
            const T delta = s_new[j] - s_old[j];
            T term(1), growth(1);  // e^δ = Σ δ^k / k!
            for (std::size_t k = 1; k < inverse.size() && T(abs(term)) >= negligible; ++k) {
                term *= delta;
                term *= inverse[k];
                growth += term;
            }
            a_new[j] = a_old[j] * growth;
        } else {
            return false;
        }
        total += a_new[j];
    }
    if (!(total > T(0))) return false;
    const T scale = T(1) / total;
    for (std::size_t j = 0; j < n; ++j) a_new[j] *= scale;
    return true;
}

}  // namespace tapegrad::fast
