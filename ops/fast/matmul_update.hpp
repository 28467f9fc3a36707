/// \file
/// Speed only: matmul's replay update (the `update` hook of autodiff/op.hpp), kept out of
/// ops/matmul.hpp so that the op file reads as its formula, forward and VJP.
///
/// The checker perturbs one coordinate at a time and replays the graph in 50-digit arithmetic; a
/// full product per replay would be most of its time. From
///   C' = A'·B' = A·B + ΔA·B' + A·ΔB       (ΔA = A' − A, ΔB = B' − B; exact algebra),
/// each changed entry ΔA_ip adds ΔA_ip·B'_pj to row i of C (n madds) and each ΔB_pj adds
/// A_ip·ΔB_pj to column j (m madds), instead of m·k·n for the whole product.
/// Invariant (autodiff/op.hpp): the result equals MatMul::forward on the new inputs to rounding in
/// the last digit of C, far below what the checker resolves (the op tables compare replays with a fresh forward: tests/support.hpp).
/// Declines (returns false) when the changes are dense enough that the full product is cheaper.
#pragma once

#include "autodiff/op.hpp"

#include <span>
#include <vector>

namespace tapegrad::fast {

/// `d` is MatMul::Dims: batch, m, k, n, and whether one B is shared by the batch.
template <class Dims, Scalar T>
bool matmul_update(const Dims& d, Inputs<T> before, Inputs<T> after, const Tensor<T>& C, Tensor<T>& C_new) {
    struct Change {
        std::size_t flat;
        T delta;
    };
    thread_local std::vector<Change> changes;
    const std::size_t full = d.batch * d.m * d.k * d.n;
    std::size_t work = 0, a_changes = 0;
    changes.clear();
    for (std::size_t which = 0; which < 2; ++which) {
        if (before[which] == after[which]) continue;
        const std::span<const T> old_values = before[which]->data(), new_values = after[which]->data();
        const std::size_t per_change = which == 0 ? d.n : d.m;
        for (std::size_t f = 0; f < old_values.size(); ++f) {
            if (new_values[f] == old_values[f]) continue;
            work += per_change;
            if (2 * work > full) return false;
            changes.push_back({f, T(new_values[f] - old_values[f])});
        }
        if (which == 0) a_changes = changes.size();
    }
    C_new = C;
    const T* A = before[0]->data().data();  // the recorded A (in A·ΔB)
    const T* B = after[1]->data().data();   // the new B (in ΔA·B')
    T* out = C_new.data().data();
    for (std::size_t c = 0; c < changes.size(); ++c) {
        const Change& change = changes[c];
        if (c < a_changes) {  // ΔA_ip: row i of C += ΔA_ip · row p of B'
            const std::size_t b = change.flat / (d.m * d.k), i = change.flat / d.k % d.m, p = change.flat % d.k;
            const T* b_row = B + (d.shared_b ? 0 : b * d.k * d.n) + p * d.n;
            T* c_row = out + b * d.m * d.n + i * d.n;
            for (std::size_t j = 0; j < d.n; ++j) c_row[j] += change.delta * b_row[j];
        } else {  // ΔB_pj: column j of C += column p of A · ΔB_pj
            const std::size_t b = change.flat / (d.k * d.n), p = change.flat / d.n % d.k, j = change.flat % d.n;
            for (std::size_t i = 0; i < d.m; ++i) out[b * d.m * d.n + i * d.n + j] += A[b * d.m * d.k + i * d.k + p] * change.delta;
        }
    }
    return true;
}

}  // namespace tapegrad::fast
