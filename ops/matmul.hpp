// matmul: the matrix product C = A·B, per matrix of a batch.
//   A [..., m, k] · B [..., k, n] -> C [..., m, n]   (same leading dimensions), or
//   A [..., m, k] · B [k, n]      -> C [..., m, n]   (one B shared by the batch: X·W_Q)
// VJP (G = dJ/dC):
//   dA = G·Bᵀ
//   dB = Aᵀ·G          (summed over the batch when B is shared)
// From C_ij = Σ_p A_ip B_pj: ∂J/∂A_ip = Σ_j G_ij B_pj and ∂J/∂B_pj = Σ_i A_ip G_ij.
#pragma once

#include "autodiff/checks.hpp"
#include "autodiff/kernels.hpp"
#include "autodiff/tape.hpp"

#include <vector>

namespace tapegrad {

struct MatMul {
    static constexpr std::string_view name = "matmul";

    // A shared B folds the batch into the rows of A: one (batch·m)×k by k×n product.
    struct Dims {
        std::size_t batch, m, k, n;
        bool shared_b;
    };
    template <Scalar T>
    static Dims dims(const Tensor<T>& a, const Tensor<T>& b) {
        const bool shared_b = b.rank() == 2 && a.rank() > 2;
        const std::size_t batch = shared_b ? 1 : a.shape().batch();
        const std::size_t m = shared_b ? a.shape().batch() * a.rows() : a.rows();
        return {batch, m, a.cols(), b.cols(), shared_b};
    }

    template <Scalar T>
    static void forward(Inputs<T> in, const OpAttrs<T>&, Tensor<T>& C, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        const Tensor<T>& B = *in[1];
        const Dims d = dims(A, B);
        C.resize(A.shape().with_matrix(A.rows(), B.cols()));
        for (std::size_t b = 0; b < d.batch; ++b) {
            kernels::gemm(kernels::Form::ab, d.m, d.n, d.k, A.data().data() + b * d.m * d.k,
                          B.data().data() + b * d.k * d.n, C.data().data() + b * d.m * d.n, false);
        }
    }

    template <Scalar T>
    static void vjp(Inputs<T> in, const OpAttrs<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>& G,
                    std::size_t which, Tensor<T>& grad) {
        const Tensor<T>& A = *in[0];
        const Tensor<T>& B = *in[1];
        const Dims d = dims(A, B);
        for (std::size_t b = 0; b < d.batch; ++b) {
            const T* g = G.data().data() + b * d.m * d.n;
            if (which == 0) {  // dA = G·Bᵀ
                kernels::gemm(kernels::Form::abT, d.m, d.k, d.n, g, B.data().data() + b * d.k * d.n,
                              grad.data().data() + b * d.m * d.k, false);
            } else {  // dB = Aᵀ·G
                kernels::gemm(kernels::Form::aTb, d.k, d.n, d.m, A.data().data() + b * d.m * d.k, g,
                              grad.data().data() + b * d.k * d.n, false);
            }
        }
    }

    // Replay after a small change (the checker perturbs one coordinate at a time). From
    //   C' = A'·B' = A·B + ΔA·B' + A·ΔB       (ΔA = A' − A, ΔB = B' − B; exact algebra),
    // each changed entry ΔA_ip adds ΔA_ip·B'_pj to row i of C (n madds) and each ΔB_pj adds
    // A_ip·ΔB_pj to column j (m madds), instead of m·k·n for the whole product. Rounding differs
    // from `forward` only in the last digit of C, far below what the checker resolves.
    // Declines (returns false) when the changes are dense enough that the full product is cheaper.
    template <Scalar T>
    static bool update(Inputs<T> before, Inputs<T> after, const OpAttrs<T>&, const Tensor<T>& C, Tensor<T>& C_new) {
        struct Change {
            std::size_t flat;
            T delta;
        };
        thread_local std::vector<Change> changes;
        const Dims d = dims(*before[0], *before[1]);
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
                for (std::size_t i = 0; i < d.m; ++i)
                    out[b * d.m * d.n + i * d.n + j] += A[b * d.m * d.k + i * d.k + p] * change.delta;
            }
        }
        return true;
    }

    template <Scalar T>
    static OpCost cost(Inputs<T> in, const OpAttrs<T>&) {
        const Dims d = dims(*in[0], *in[1]);
        const std::uint64_t product = std::uint64_t(d.batch) * d.m * d.k * d.n;
        return {product, 2 * product};
    }
};

template <Scalar T>
Var<T> matmul(const Var<T>& A, const Var<T>& B) {
    checks::matrix(MatMul::name, "A", A);
    checks::matrix(MatMul::name, "B", B);
    const Shape& a = A.shape();
    const Shape& b = B.shape();
    if (a.cols() != b.rows()) {
        throw shape_error(fmt::format("matmul: inner dimensions differ: A is {}, B is {}", a.to_string(),
                                      b.to_string()));
    }
    if (!(b.rank() == 2 || a.same_batch(b))) {
        throw shape_error(fmt::format("matmul: batch dimensions differ: A is {}, B is {}", a.to_string(),
                                      b.to_string()));
    }
    return A.tape().template record<MatMul>({A, B});
}

}  // namespace tapegrad
