/// \file
/// matmul: the matrix product C = A·B, per matrix of a batch.
///   A [..., m, k] · B [..., k, n] -> C [..., m, n]   (same leading dimensions), or
///   A [..., m, k] · B [k, n]      -> C [..., m, n]   (one B shared by the batch: X·W_Q)
/// VJP (G = dJ/dC):
///   dA = G·Bᵀ
///   dB = Aᵀ·G          (summed over the batch when B is shared)
/// From C_ij = Σ_p A_ip B_pj: ∂J/∂A_ip = Σ_j G_ij B_pj and ∂J/∂B_pj = Σ_i A_ip G_ij.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/dual_kernels.hpp"
#include "autodiff/tape.hpp"
#include "ops/fast/matmul_update.hpp"

#include <span>
#include <vector>

namespace tapegrad {

struct MatMul {
    static constexpr std::string_view name = "matmul";
    static constexpr Arity arity{2};
    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return matmul(in[0], in[1]);
    }
    using hooks_of = MatMul;  ///< declares `update` below

    /// A shared B folds the batch into the rows of A: one (batch·m)×k by k×n product.
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
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& C, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        const Tensor<T>& B = *in[1];
        const Dims d = dims(A, B);
        C.resize(A.shape().with_matrix(A.rows(), B.cols()));
        for (std::size_t b = 0; b < d.batch; ++b) {
            kernels::gemm(kernels::Form::ab, d.m, d.n, d.k, A.data().data() + b * d.m * d.k,
                          B.data().data() + b * d.k * d.n, C.data().data() + b * d.m * d.n, false);
        }
    }

    /// Both inputs' contributions. When one of the two products is too small or too narrow to be
    /// split over the threads by itself (kernels::split_of; in attention at T = 1024, dW = Xᵀ·dQ
    /// of each projection is 64×64) and both are large enough to pay for a hand-over, they run
    /// side by side (dA = G·Bᵀ and dB = Aᵀ·G are both m·k·n multiply-adds). Each is still computed
    /// as gemm computes it alone, so the result does not depend on it.
    template <Scalar T>
    static void vjp_all(const Settings& s, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        const Dims d = dims(*at.in[0], *at.in[1]);
        using kernels::Split, kernels::split_of;
        if (grads[0] != nullptr && grads[1] != nullptr && d.batch * d.m * d.k * d.n >= kernels::side_by_side_madds &&
            (split_of(d.m, d.k, d.n) == Split::none || split_of(d.k, d.n, d.m) == Split::none)) {
            parallel_for(2, [&](std::size_t which, unsigned) { input_gradient(s, at, which, *grads[which]); });
            return;
        }
        for (std::size_t which = 0; which < 2; ++which) {
            if (grads[which] != nullptr) input_gradient(s, at, which, *grads[which]);
        }
    }
    /// Input `which`'s contribution: dA = G·Bᵀ (which = 0) or dB = Aᵀ·G (which = 1).
    template <Scalar T>
    static void input_gradient(const Settings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        const Tensor<T>& A = *at.in[0];
        const Tensor<T>& B = *at.in[1];
        const Dims d = dims(A, B);
        for (std::size_t b = 0; b < d.batch; ++b) {
            const T* g = at.G.data().data() + b * d.m * d.n;
            if (which == 0) {  // dA = G·Bᵀ
                kernels::gemm(kernels::Form::abT, d.m, d.k, d.n, g, B.data().data() + b * d.k * d.n,
                              grad.data().data() + b * d.m * d.k, false);
            } else {  // dB = Aᵀ·G
                kernels::gemm(kernels::Form::aTb, d.k, d.n, d.m, A.data().data() + b * d.m * d.k, g,
                              grad.data().data() + b * d.k * d.n, false);
            }
        }
    }

    /// Speed hook (autodiff/op.hpp): a replay adds only what the changed entries change
    /// (C' = C + ΔA·B' + A·ΔB, see ops/fast/matmul_update.hpp).
    template <Scalar T>
    static bool update(const Settings&, Inputs<T> before, Inputs<T> after, const Tensor<T>& C, Tensor<T>& C_new) {
        return fast::matmul_update(dims(*before[0], *before[1]), before, after, C, C_new);
    }

    /// matmul's arguments, checked for `op` (matmul or matmul_bf16).
    template <Scalar T>
    static void check_shapes(std::string_view op, const Var<T>& A, const Var<T>& B) {
        checks::matrix(op, "A", A);
        checks::matrix(op, "B", B);
        const Shape& a = A.shape();
        const Shape& b = B.shape();
        if (a.cols() != b.rows()) {
            throw shape_error(
                fmt::format("{}: inner dimensions differ: A is {}, B is {}", op, a.to_string(), b.to_string()));
        }
        if (!(b.rank() == 2 || a.same_batch(b))) {
            throw shape_error(
                fmt::format("{}: batch dimensions differ: A is {}, B is {}", op, a.to_string(), b.to_string()));
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        const Dims d = dims(*in[0], *in[1]);
        const std::uint64_t product = std::uint64_t(d.batch) * d.m * d.k * d.n;
        return {product, 2 * product};
    }
};

template <Scalar T>
Var<T> matmul_bf16(const Var<T>& A, const Var<T>& B);  // ops/matmul_bf16.hpp

/// A·B; on a float tape whose products are bfloat16 (Tape::set_product_precision), matmul_bf16.
template <Scalar T>
Var<T> matmul(const Var<T>& A, const Var<T>& B) {
    if constexpr (std::is_same_v<T, float>) {  // (an invalid A is refused by the checks below)
        if (A.valid() && A.tape().product_precision() == ProductPrecision::bfloat16) return matmul_bf16(A, B);
    }
    MatMul::check_shapes(MatMul::name, A, B);
    return A.tape().template record<MatMul>({A, B});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> matmul<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
